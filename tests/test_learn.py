"""bench learn's parts (the permuted-reward control, gains, targets), the demo's warm-start cache key, the tiny model
presets and the CPU thread policy. The experiment itself runs with `python -m t2s bench learn` (minutes, not a test)."""

from __future__ import annotations

import os
import shutil

import pytest

from t2s.bench import learn
from t2s.settings import RECIPES_DIR

ROOT = RECIPES_DIR.parent


def test_control_permutes_rewards_within_the_call_and_keeps_everything_else():
    seen = {}

    def dense(prompts, completions, completion_ids=None, **kwargs):
        seen.update(kwargs)
        return [float(i) for i in range(len(prompts))]

    permuted = learn.permuted_rewards(dense, seed=0)
    assert permuted.__name__ == "dense"  # TRL logs rewards under the function's name
    first = permuted(prompts=list("abcdefgh"), completions=list("abcdefgh"), outcome="x")
    second = permuted(prompts=list("abcdefgh"), completions=list("abcdefgh"), outcome="x")
    assert sorted(first) == sorted(second) == [float(i) for i in range(8)]  # the same rewards, moved
    assert first != [float(i) for i in range(8)] and first != second  # a new permutation at every step
    assert seen == {"outcome": "x"}
    again = learn.permuted_rewards(dense, seed=0)
    assert again(prompts=list("abcdefgh"), completions=list("abcdefgh")) == first  # seeded


def test_gain_compares_the_last_five_steps_with_the_first_five():
    values = [0.1] * 5 + [0.3] * 20 + [0.5] * 5
    assert learn.gain(values) == pytest.approx(0.4)
    assert learn.window_mean(values, last=False) == pytest.approx(0.1)


def test_learn_real_gains_average_one_pass_over_its_questions_at_each_end():
    recipe = RECIPES_DIR / "learn_real.yaml"  # 8 rollouts × 8 a micro-batch × 2 accumulated: 2 questions a step
    assert learn.cycle_window(recipe, 16, 32) == 8  # each end holds every GRPO question once
    assert learn.cycle_window(recipe, 32, 32) == 16
    assert learn.cycle_window(recipe, 15, 32) == 7  # TRL's sampler leaves out a last step the pass fills in part
    assert learn.cycle_window(recipe, 16, 10) == 5  # never more than half the run
    assert learn.cycle_window(recipe, 1, 2, ("--num_generations", "2", "--per_device_train_batch_size", "2",
                                             "--gradient_accumulation_steps", "1", "--steps_per_generation", "1")) == 1
    assert learn.cycle_window(recipe, 16, 32, ("--gradient_accumulation_steps", "4")) == 4
    values = [0.0] * 8 + [0.5] * 16 + [1.0] * 8
    assert learn.gain(values, 8) == pytest.approx(1.0) and learn.gain(values) == pytest.approx(1.0)
    assert learn.gain([0.0] * 4 + [1.0] * 4, 4) == pytest.approx(1.0) and learn.gain([0.0] * 4 + [1.0] * 4, 5) < 1
    # 20 steps of passes of 8: the last whole pass is steps 9-16, not the last 8 steps (which straddle two passes)
    assert learn.pass_gain([0.0] * 8 + [1.0] * 8 + [5.0] * 4, 8) == pytest.approx(1.0)


def test_missed_targets_name_each_one():
    assert learn.missed_targets(0.3, 0.0, 0.3, 600) == []
    missed = learn.missed_targets(0.1, 0.0, 0.05, 1000)
    assert len(missed) == 4
    assert missed[0].startswith("grpo_gain 0.100 < 0.15") and missed[1].startswith("grpo_gain - control_gain")
    assert missed[2].startswith("start_equiv 0.050 outside") and missed[3] == "seconds 1000 > 900"
    assert learn.missed_targets(0.2, 0.1, 0.3, 100) == ["grpo_gain - control_gain 0.100 < 0.15"]


def test_bench_learn_rejects_too_few_steps(capsys):
    from t2s.commands import main

    assert main(["bench", "learn", "--steps", "6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: --steps must be at least 10")


def test_plot_writes_both_curves(tmp_path):
    steps = [{"step": i + 1, "tier/equivalent": i / 10, "reward": i / 5} for i in range(6)]
    learn.plot_curves(tmp_path / "learn.png", {"grpo": steps, "control": steps[::-1]}, "test")
    assert (tmp_path / "learn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_warm_start_key_follows_what_determines_it(tmp_path, monkeypatch):
    import t2s.settings as settings
    from t2s.commands.demo import warm_start_key

    first = warm_start_key()
    assert warm_start_key() == first and len(first) == 16
    recipes = tmp_path / "recipes"
    shutil.copytree(settings.RECIPES_DIR, recipes)
    monkeypatch.setattr(settings, "RECIPES_DIR", recipes)
    assert warm_start_key() == first  # the same files, found elsewhere
    path = recipes / "demo_sft.yaml"
    path.write_text(path.read_text().replace("max_steps: ", "max_steps: 1"))
    assert warm_start_key() != first


def test_attention_preset_is_four_full_attention_layers_with_demo_words(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from t2s.training.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "attn", preset="attention")
    config = AutoConfig.from_pretrained(folder)
    assert config.layer_types == ["full_attention"] * 4 and config.hidden_size == 128
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.tokenize(" bikes") == ["Ġbikes"]
    # the demo's system prompt is learnt too: short prompts make the warm start and each GRPO step cheap
    system = (RECIPES_DIR / "demo_system_prompt.txt").read_text()
    assert len(tokenizer.tokenize(system)) < 2 * len(system.split())
    assert build_tiny_model(tmp_path / "attn", preset="attention") == folder  # reused
    with pytest.raises(ValueError, match="Error: unknown tiny model preset 'wide'"):
        build_tiny_model(tmp_path / "wide", preset="wide")


def test_cpu_threads_take_every_usable_core_unless_told(monkeypatch):
    import torch

    from t2s.training import cpu_threads

    monkeypatch.delenv("T2S_TORCH_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 8)
    assert cpu_threads.torch_threads() == 8
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 1)
    assert cpu_threads.torch_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads.torch_threads() == 3
    monkeypatch.setenv("T2S_TORCH_THREADS", "2")
    assert cpu_threads.torch_threads() == 2
    before = torch.get_num_threads()
    try:
        assert cpu_threads.configure_cpu_threads(on_cpu=True) == 2 and torch.get_num_threads() == 2
        assert cpu_threads.configure_cpu_threads(on_cpu=False) is None
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_every_command_asks_openmp_to_sleep_while_it_waits_unless_told(given, tmp_path):
    """``t2s.commands.main`` sets ``OMP_WAIT_POLICY=PASSIVE`` before the command imports torch (where it takes effect),
    for evaluation and ``ask`` as for training; a policy the user chose stays."""
    import subprocess
    import sys

    argv = ["score", "--predictions", str(tmp_path / "missing.json"), "--data", "data/demo", "--output",
            str(tmp_path / "out")]
    probe = f"import os\nfrom t2s.commands import main\nprint(main({argv!r}), os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env |= {"OMP_WAIT_POLICY": given} if given else {}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", given or "PASSIVE"], done.stdout + done.stderr[-2000:]
    assert "Error:" in done.stderr


def test_the_demo_warm_start_says_what_it_does(tmp_path):
    """The demo's warm start is never silent: what it plays, then its SFT steps a tenth of the run at a time."""
    lines = []
    learn.warm_start(tmp_path / "warm", seed=0, report=lines.append, overrides=(  # its tiny model built here
        "--model_name_or_path", str(tmp_path / "tiny"), "--max_steps", "4", "--per_device_train_batch_size", "4",
        "--near_misses", "1"))
    assert lines[0] == "warm start: playing the gold and near-miss trajectories of demo.yaml's questions"
    assert lines[1].startswith("warm start: ") and lines[1].endswith("; SFT for 4 steps") and "near misses" in lines[1]
    steps = [line.split(",")[0] for line in lines[2:]]
    assert steps == [f"warm start: SFT: step {k}/4" for k in (1, 2, 3, 4)], lines
    assert (tmp_path / "warm" / "t2s_sft.json").is_file()
