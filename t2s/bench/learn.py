"""`python -m t2s bench learn`: the CPU proof that training learns, GRPO against a permuted-reward control.

1. **Warm start** (``recipes/demo_sft.yaml``, TRL's SFTTrainer): the tiny Qwen3.5 with four full-attention layers, on
   gold answers plus runnable wrong ones (other questions' SQL on the same database) at weight 0.6, all played by
   ``recipes/demo.yaml``'s own environment. The policy then answers part of the questions right and fails the others
   with valid near misses.
2. **GRPO** (``recipes/demo.yaml``): the real ``Text2SQLGRPOTrainer``, rollout, tools, dense reward and the published
   loss, unchanged, for ``--steps`` steps of 8 questions × 8 rollouts, on 8 of the warm start's 16 questions, so that
   every step sees each of them.
3. **Control**: the same run from the same warm start and seed, except that each step's rewards are permuted across
   its episodes (seeded) before advantages are computed. That breaks the episode-reward link and nothing else.

The experiment's parts (``warm_start``, ``grpo_run``, ``permuted_rewards``, ``plot_curves``) live here too: ``make
demo`` (``t2s demo``) runs the same experiment made shorter.

It prints a per-step table of both runs (reward, equivalence rate, KL, β), writes ``learn.png`` with both curves, and
ends with ``learn: grpo_gain=G control_gain=C start_equiv=S seconds=T``: a gain is the mean equivalence rate over the
last 5 steps minus the first 5; ``start_equiv`` is the GRPO run's first-5-step rate; T the wall time of it all. It exits
non-zero, naming each target missed: ``grpo_gain >= 0.15``, ``grpo_gain - control_gain >= 0.15``,
``0.1 <= start_equiv <= 0.6``, ``seconds <= 900``. ``--rollout-backend vllm_colocate`` generates the GRPO episodes
with the real vLLM engine colocated in the trainer (the production path) instead of transformers ``generate``; the
time target is then reported but not a target (a CPU engine beside the trainer is not what it is measured for).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

STEPS = 30
WINDOW = 5  # steps averaged at each end for a gain
VLLM_MAX_MODEL_LEN = 1024  # the colocated engine's context: the demo recipe's episodes hold 640 tokens
TARGETS = {"grpo_gain": 0.15, "margin": 0.15, "start_low": 0.1, "start_high": 0.6, "seconds": 900.0}


# ---------------------------------------------------------------------------------------------------- the parts


def window_mean(values: list[float], last: bool, window: int = WINDOW) -> float:
    part = values[-window:] if last else values[:window]
    return sum(part) / max(1, len(part))


def gain(values: list[float], window: int = WINDOW) -> float:
    """Mean of the last ``window`` values (default 5) minus the mean of the first ``window``."""
    return window_mean(values, True, window) - window_mean(values, False, window)


def cycle_window(recipe: Path, questions: int, steps: int, overrides: tuple[str, ...] = ()) -> int:
    """The steps of one pass over ``questions`` under ``recipe`` with ``overrides`` (at most half of ``steps``): a gain
    over such windows (``pass_gain``) compares each question's first visit with its last, so their difficulty leaves
    the difference. TRL's sampler draws the questions in a new order each pass, as many whole steps as they fill (a
    last step they would fill only in part is left out)."""
    from t2s.training.configs import parse_recipe

    _, args, _ = parse_recipe(["--config", str(recipe), *overrides])
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps // args.num_generations
    return max(1, min(steps // 2, questions // max(1, per_step)))


def pass_gain(values: list[float], window: int) -> float:
    """``gain`` over the first pass and the last whole one (steps past the last whole pass are left out)."""
    return gain(values[: len(values) // window * window], window)


def missed_targets(grpo_gain: float, control_gain: float, start: float, seconds: float) -> list[str]:
    missed = []
    if grpo_gain < TARGETS["grpo_gain"]:
        missed.append(f"grpo_gain {grpo_gain:.3f} < {TARGETS['grpo_gain']}")
    if grpo_gain - control_gain < TARGETS["margin"]:
        missed.append(f"grpo_gain - control_gain {grpo_gain - control_gain:.3f} < {TARGETS['margin']}")
    if not TARGETS["start_low"] <= start <= TARGETS["start_high"]:
        missed.append(f"start_equiv {start:.3f} outside [{TARGETS['start_low']}, {TARGETS['start_high']}]")
    if seconds > TARGETS["seconds"]:
        missed.append(f"seconds {seconds:.0f} > {TARGETS['seconds']:.0f}")
    return missed


# ---------------------------------------------------------------------------------------------------- the experiment


SFT_RECIPE = "demo_sft.yaml"
RL_RECIPE = "demo.yaml"
# GRPO plays 8 of the 16 questions the warm start learnt, so every step sees each of them. With all 16 (each question
# every other step) seed 1 gained about 0.1 in 20 steps; with 8 it gained 0.35 in 30.
GRPO_OVERRIDES = ("--max_train_rows", "8")


def warm_start(output_dir: Path, seed: int, overrides: tuple[str, ...] = (), report=None, *,
               recipe: Path | None = None) -> Path:
    """Train ``recipe`` (default ``recipes/demo_sft.yaml``) into ``output_dir``; returns the folder. ``report(line)``,
    when given, hears what is being done: the trajectories played, then the SFT steps a tenth of the run at a time."""
    from t2s.settings import RECIPES_DIR
    from t2s.training.pipeline import free_finished_run
    from t2s.training.progress import step_counter
    from t2s.training.warm_start import build_sft_trainer, fit, parse_sft_recipe

    sft_args, config, model_args = parse_sft_recipe([
        "--config", str(recipe or RECIPES_DIR / SFT_RECIPE), "--output_dir", str(output_dir), "--seed", str(seed),
        "--disable_tqdm", "true", "--logging_steps", "1000", *overrides,
    ])
    if report:
        kinds = "gold and near-miss" if sft_args.near_misses else "gold"
        report(f"warm start: playing the {kinds} trajectories of {Path(sft_args.rl_recipe).name}'s questions")
    callbacks = [step_counter(report, "warm start: SFT")] if report else None
    trainer, counts = build_sft_trainer(sft_args, config, model_args, callbacks=callbacks)
    if report:
        report(f"warm start: {counts['examples']} examples from {counts['questions']} questions (gold "
               f"{counts.get('gold', 0)}, near misses {counts.get('near_misses', 0)}); "
               "SFT for " + (f"{config.max_steps} steps" if config.max_steps > 0
                             else f"{config.num_train_epochs:g} epoch(s)"))
    _quiet(trainer)
    fit(trainer, counts)
    del trainer
    free_finished_run()
    return output_dir


def permuted_rewards(reward_func, seed: int):
    """``reward_func`` with its rewards permuted across the call's episodes (a seeded permutation per call)."""
    rng = random.Random(seed)

    def permuted(*args, **kwargs):
        rewards = list(reward_func(*args, **kwargs))
        rng.shuffle(rewards)
        return rewards

    permuted.__name__ = getattr(reward_func, "__name__", "reward")
    return permuted


def grpo_run(model_dir: Path, output_dir: Path, *, steps: int, seed: int, control: bool = False, callbacks=(),
             overrides: tuple[str, ...] = GRPO_OVERRIDES, recipe: Path | None = None):
    """``recipe`` (default ``recipes/demo.yaml``, on 8 of its questions: ``GRPO_OVERRIDES``) from ``model_dir`` for
    ``steps`` steps, ``overrides`` on top; returns the trainer (trained and saved).

    With ``control``, every reward function's output is permuted across the step's episodes before TRL computes
    advantages; everything else, the logged tiers included, is the real run's.
    """
    from t2s.training.configs import parse_recipe
    from t2s.settings import RECIPES_DIR
    from t2s.training.pipeline import build_trainer, fit

    script_args, training_args, model_args = parse_recipe([
        "--config", str(recipe or RECIPES_DIR / RL_RECIPE), "--model_name_or_path", str(model_dir),
        "--output_dir", str(output_dir), "--max_steps", str(steps), "--seed", str(seed), "--disable_tqdm", "true",
        *overrides,
    ])
    trainer, counts = build_trainer(script_args, training_args, model_args, callbacks=list(callbacks))
    _quiet(trainer)
    if control:
        trainer.reward_funcs = [permuted_rewards(f, seed) for f in trainer.reward_funcs]
    return fit(trainer, counts)


def content_key(groups, extra: tuple[str, ...] = ()) -> str:
    """A hash of what a cached artefact depends on: ``groups`` of (root, files) (each file's path below its root and
    its bytes), ``extra`` strings, the versions of the libraries that train it, and whether the CPU has bfloat16
    instructions (without them a bf16 recipe runs in float32: t2s.backends.cpu_precision)."""
    import hashlib
    from importlib.metadata import version

    from t2s.backends.cpu_precision import native_bf16

    digest = hashlib.sha256()
    for root, files in groups:
        for path in files:
            digest.update(str(Path(path).relative_to(root)).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    for text in extra:
        digest.update(text.encode() + b"\0")
    for package in ("torch", "transformers", "trl", "tokenizers"):
        digest.update(f"{package}=={version(package)}".encode())
    digest.update(f"cpu_bf16={native_bf16()}".encode())
    return digest.hexdigest()[:16]


def _quiet(trainer) -> None:
    from transformers import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)


def plot_curves(path: Path, runs: dict[str, list[dict]], title: str) -> None:
    """Equivalence rate and mean reward per step of each run, side by side, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, steps in runs.items():
        xs = [s["step"] for s in steps]
        axes[0].plot(xs, [s.get("tier/equivalent", 0.0) for s in steps], marker="o", ms=3, label=name)
        axes[1].plot(xs, [s.get("reward", 0.0) for s in steps], marker="o", ms=3, label=name)
    axes[0].set(xlabel="step", ylabel="equivalence rate", ylim=(0, 1))
    axes[1].set(xlabel="step", ylabel="mean reward")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- the command


def step_table(runs: dict[str, list[dict]]):
    from rich.table import Table

    table = Table(title="bench learn: per step")
    table.add_column("step", justify="right")
    for name in runs:
        for column in ("reward", "equiv", "kl", "beta"):
            table.add_column(f"{name} {column}", justify="right")
    length = max(len(steps) for steps in runs.values())
    for i in range(length):
        cells = [str(i + 1)]
        for steps in runs.values():
            entry = steps[i] if i < len(steps) else {}
            cells += [_fmt(entry.get("reward"), "{:.3f}"), _fmt(entry.get("tier/equivalent"), "{:.3f}"),
                      _fmt(entry.get("kl"), "{:.2e}"), _fmt(entry.get("beta"), "{:.6f}")]
        table.add_row(*cells)
    return table


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def run(*, steps=STEPS, seed=0, output="runs/bench-learn", rollout_backend="transformers") -> int:
    from t2s.training.cpu_threads import configure_cpu_threads
    from t2s.settings import workspace
    from t2s.ui.console import console as make_console, print_table
    from t2s.settings import offline_environment

    started = time.perf_counter()
    if steps < 2 * WINDOW:
        print(f"Error: --steps must be at least {2 * WINDOW} (gains compare the first and last {WINDOW} steps).",
              file=sys.stderr)
        return 2
    configure_cpu_threads(on_cpu=True)  # before torch is imported
    offline_environment()
    from t2s.training.pipeline import free_finished_run
    from t2s.training.progress import quiet_libraries, step_printer

    quiet_libraries()
    console = make_console()  # printed paths are never wrapped
    output = workspace() / output  # an absolute output stays as it is
    console.print(f"warm start ({SFT_RECIPE}) ...", highlight=False)
    model_dir = warm_start(output / "warmstart", seed)
    console.print(f"warm start done at {time.perf_counter() - started:.0f} s", highlight=False)
    runs: dict[str, list[dict]] = {}
    backend = ("--rollout_backend", rollout_backend)
    if rollout_backend == "vllm_colocate":
        backend += ("--vllm_max_model_length", str(VLLM_MAX_MODEL_LEN))
    for name, control in (("grpo", False), ("control", True)):
        console.rule(f"{name}: {steps} steps" + (" (rewards permuted within each step)" if control else ""))
        printer = step_printer(console)
        grpo_run(model_dir, output / name, steps=steps, seed=seed, control=control, callbacks=[printer],
                 overrides=GRPO_OVERRIDES + backend)
        free_finished_run()  # before the control's run: the first one's trainer (and colocated engine) goes
        runs[name] = printer.steps
    print_table(console, step_table(runs))
    equiv = {name: [s.get("tier/equivalent", 0.0) for s in steps] for name, steps in runs.items()}
    grpo_gain, control_gain = gain(equiv["grpo"]), gain(equiv["control"])
    start = window_mean(equiv["grpo"], last=False)
    plot_curves(output / "learn.png", runs, f"GRPO vs permuted-reward control (seed {seed})")
    seconds = time.perf_counter() - started
    console.print(f"curves in {output / 'learn.png'}", highlight=False)
    missed = missed_targets(grpo_gain, control_gain, start, seconds if rollout_backend == "transformers" else 0.0)
    for line in missed:
        console.print(f"target missed: {line}", highlight=False)
    print(f"learn: grpo_gain={grpo_gain:.3f} control_gain={control_gain:.3f} start_equiv={start:.3f} "
          f"seconds={seconds:.0f}", flush=True)
    return 1 if missed else 0
