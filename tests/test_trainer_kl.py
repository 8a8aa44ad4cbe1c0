"""The proportional KL controller (DESIGN §8): direction, bounds, per-step logging, and resume."""

from __future__ import annotations

import json

import pytest

from _train_script import build_trainer
from t2s.training.checkpoints import KL_STATE_FILE
from t2s.training.loss_math import kl_controller_update

BOUNDS = dict(target=0.005, horizon=10000.0, beta_min=1e-4, beta_max=1.0)


def test_update_moves_beta_toward_the_target():
    assert kl_controller_update(0.01, 0.010, 144, **BOUNDS) > 0.01  # KL above target: more penalty
    assert kl_controller_update(0.01, 0.001, 144, **BOUNDS) < 0.01  # below: less
    assert kl_controller_update(0.01, 0.005, 144, **BOUNDS) == 0.01  # on target: unchanged


def test_update_clips_the_error_and_scales_with_episodes():
    # KL 100× the target still moves beta by at most 0.2 · n / horizon.
    assert kl_controller_update(0.01, 0.5, 144, **BOUNDS) == pytest.approx(0.01 * (1 + 0.2 * 144 / 10000))
    assert kl_controller_update(0.01, 0.0, 144, **BOUNDS) == pytest.approx(0.01 * (1 - 0.2 * 144 / 10000))
    assert kl_controller_update(0.01, 0.0055, 144, **BOUNDS) == pytest.approx(0.01 * (1 + 0.1 * 144 / 10000))


def test_update_respects_bounds_and_never_reaches_zero():
    beta = 0.01
    for _ in range(10000):
        beta = kl_controller_update(beta, 0.0, 10000, **BOUNDS)
    assert beta == BOUNDS["beta_min"] > 0
    for _ in range(10000):
        beta = kl_controller_update(beta, 1.0, 10000, **BOUNDS)
    assert beta == BOUNDS["beta_max"]
    assert kl_controller_update(0.01, float("nan"), 144, **BOUNDS) == 0.01


def _betas(trainer) -> list[float]:
    return [entry["beta"] for entry in trainer.state.log_history if "beta" in entry]


@pytest.mark.slow
def test_controller_raises_beta_when_kl_is_above_target(tiny_model_dir, tmp_path):
    # horizon 8 = the episodes per step, so each step moves beta by the clipped error (±20%).
    trainer, _ = build_trainer(tiny_model_dir, tmp_path, max_steps=3, learning_rate=1e-2, target_kl=1e-9,
                               kl_horizon=8, beta=0.01, beta_max=0.0115)
    trainer.train()
    kls = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    assert kls[0] == 0.0 and all(k > 1e-9 for k in kls[1:])  # step 1: policy == reference
    assert _betas(trainer) == pytest.approx([0.008, 0.0096, 0.0115])  # down, up, then capped at beta_max
    assert trainer.beta == pytest.approx(0.0115)


@pytest.mark.slow
def test_controller_lowers_beta_when_kl_is_below_target_down_to_beta_min(tiny_model_dir, tmp_path):
    trainer, _ = build_trainer(tiny_model_dir, tmp_path, max_steps=3, target_kl=10.0, kl_horizon=8, beta=0.01,
                               beta_min=0.007)
    trainer.train()
    assert _betas(trainer) == pytest.approx([0.008, 0.007, 0.007])


@pytest.mark.slow
def test_resume_restores_beta_and_continues_with_the_same_data(tiny_model_dir, tmp_path):
    common = dict(n_rows=8, max_steps=4, learning_rate=1e-2, target_kl=1e-9, kl_horizon=8, beta=0.01,
                  save_strategy="steps", save_steps=2)
    full, full_runner = build_trainer(tiny_model_dir, tmp_path / "full", **common)
    full.train()
    saved = json.loads((tmp_path / "full" / "checkpoint-2" / KL_STATE_FILE).read_text())
    assert saved["beta"] == pytest.approx(_betas(full)[1]) and saved["global_step"] == 2

    # A second run, interrupted after step 2 in effect: it starts from the first run's checkpoint.
    resumed, resumed_runner = build_trainer(tiny_model_dir, tmp_path / "resumed", **common)
    assert resumed.beta == 0.01
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    # the history up to step 2 comes from the checkpoint; steps 3 and 4 were trained by this run
    assert [entry["step"] for entry in resumed.state.log_history if "beta" in entry] == [1, 2, 3, 4]
    assert _betas(resumed) == pytest.approx(_betas(full), rel=1e-9)
    assert resumed.beta == pytest.approx(full.beta, rel=1e-9)
    # steps 3 and 4 see exactly the questions the uninterrupted run saw there: none redone, none skipped
    assert resumed_runner.seen == full_runner.seen[2:]


def _write_complete_checkpoint(folder, step: int) -> None:
    """The files HF Trainer resumes from, with placeholder contents."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    torch.save({}, folder / "optimizer.pt")
    torch.save({}, folder / "scheduler.pt")


def test_resume_from_checkpoint_latest_picks_the_newest_checkpoint(tmp_path):
    from _train_script import make_config
    from t2s.training.configs import ConfigError
    from t2s.training.pipeline import resume_checkpoint

    for step in (2, 10, 4):
        _write_complete_checkpoint(tmp_path / f"checkpoint-{step}", step)
    assert resume_checkpoint(make_config(tmp_path, resume_from_checkpoint="latest")).endswith("checkpoint-10")
    with pytest.raises(ConfigError, match=r"holds a training run \(checkpoint-10, checkpoint-4, checkpoint-2\)"):
        resume_checkpoint(make_config(tmp_path))  # a fresh run would write over them
    assert resume_checkpoint(make_config(tmp_path / "fresh")) is None
    with pytest.raises(ConfigError, match="not found"):
        resume_checkpoint(make_config(tmp_path, resume_from_checkpoint=str(tmp_path / "checkpoint-99")))
    with pytest.raises(ConfigError, match="no checkpoint"):
        resume_checkpoint(make_config(tmp_path / "empty", resume_from_checkpoint="latest"))
