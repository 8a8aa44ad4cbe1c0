"""What a training step logs besides TRL's own metrics: the sampler/trainer logprob gap and the time split."""

from __future__ import annotations

import pytest

from _train_script import build_trainer
from t2s.rollout import driver as rollout_module
from t2s.rollout.driver import BusyClock
from t2s.training.trainer import TIME_METRICS


def _logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_busy_clock_counts_overlapping_spans_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(rollout_module.time, "perf_counter", lambda: now[0])
    clock = BusyClock()
    first = clock.span("generation")
    first.__enter__()  # generation busy from t=0
    now[0] = 1.0
    second = clock.span("generation")
    second.__enter__()  # overlaps the first: not counted twice
    now[0] = 3.0
    first.__exit__(None, None, None)
    now[0] = 4.0
    second.__exit__(None, None, None)  # busy 0..4
    now[0] = 10.0
    with clock.span("generation"):  # 10..12
        now[0] = 12.0
    with clock.span("environment"):
        now[0] = 12.5
    assert clock.seconds["generation"] == 6.0
    assert clock.seconds["environment"] == 0.5


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0.0, 0.3])
def test_logp_gap_is_zero_for_the_policy_and_shows_a_perturbed_sampler(tiny_model_dir, tmp_path, shift):
    from _train_script import ScriptedEpisodes
    from transformers import AutoTokenizer

    runner = ScriptedEpisodes(AutoTokenizer.from_pretrained(tiny_model_dir), logprob_shift=shift)
    trainer, _ = build_trainer(tiny_model_dir, tmp_path, runner=runner, max_steps=2)
    trainer.train()
    means, maxima = _logged(trainer, "sampling/logp_gap/mean"), _logged(trainer, "sampling/logp_gap/max")
    assert len(means) == len(maxima) == 2
    if shift == 0.0:  # the scripted sampler is the fp32 policy itself
        assert all(0.0 <= m < 1e-5 for m in means + maxima)
    else:  # step 1: the policy is still the sampler's, so the gap is the shift; step 2 has moved a little
        assert means[0] == pytest.approx(shift, abs=1e-5) and maxima[0] == pytest.approx(shift, abs=1e-5)
        assert all(m > 0.1 for m in means)
    # the scripted runner is not the real rollout: it reports no generation/environment split
    for key in ("time/rollout", "time/reward", "time/forward_backward"):
        assert len(_logged(trainer, key)) == 2 and all(t > 0 for t in _logged(trainer, key)), key
    assert not _logged(trainer, "time/generation") and set(TIME_METRICS) >= {"time/generation", "time/environment"}
