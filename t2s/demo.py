"""`python -m t2s demo` (what `make demo` runs): real GRPO steps on a CPU, then an evaluation, in a few minutes.

1. trains the ``smoke`` recipe (the tiny offline Qwen3.5 on ``data/demo``) for ``--steps`` optimiser steps through
   the real rollout, tools, rewards, loss and KL controller, printing each step's reward components as it goes;
2. evaluates the trained model on ``data/demo`` with ``t2s eval`` (policy ``model``), and runs the harness's gold
   self-check, which must score 1.0.

The tiny model has random weights, so its rewards stay near zero: the demo shows the machinery, not learning.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from t2s.cli_args import add_hidden_alias

STEP_COLUMNS = (  # (log key, column title, format)
    ("reward", "reward", "{:.3f}"),
    ("rewards/dense/f1", "f1", "{:.3f}"),
    ("rewards/dense/join", "join", "{:.2f}"),
    ("rewards/dense/consensus", "consensus", "{:.2f}"),
    ("tier/equivalent", "equiv", "{:.2f}"),
    ("tier/executable", "exec", "{:.2f}"),
    ("tier/parsable", "parse", "{:.2f}"),
    ("tier/invalid", "invalid", "{:.2f}"),
    ("episodes/turns_mean", "turns", "{:.1f}"),
    ("episodes/submit_rate", "submit", "{:.2f}"),
    ("episodes/forced_rate", "forced", "{:.2f}"),
    ("kl", "kl", "{:.2e}"),
    ("beta", "beta", "{:.6f}"),
    ("step_time", "s/step", "{:.1f}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=3, help="optimiser steps to train (default 3)")
    parser.add_argument("--output", default="runs/demo", help="output folder (default runs/demo)")
    parser.add_argument("--n", dest="eval_n", type=int, default=8, help="questions the trained model is evaluated on (default 8)")
    add_hidden_alias(parser, "--n", "--eval-n", type=int)
    parser.add_argument("--model", default=None,
                        help="model folder to start from (default: the smoke recipe's tiny model, built when absent)")


def step_printer(console):
    """A TrainerCallback that prints each step's reward components, episode rates, KL and beta as it ends."""
    from transformers import TrainerCallback

    class StepPrinter(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            self.steps.append(dict(logs, step=state.global_step))

            def show(key: str) -> str:
                fmt = next(f for k, _, f in STEP_COLUMNS if k == key)
                return fmt.format(logs[key]) if logs.get(key) is not None else "-"

            console.print(
                f"[bold]step {state.global_step}/{state.max_steps}[/]  reward {show('reward')}  f1 {show('rewards/dense/f1')}  "
                f"join {show('rewards/dense/join')}  consensus {show('rewards/dense/consensus')}\n"
                f"  tiers: equivalent {show('tier/equivalent')}  executable {show('tier/executable')}  parsable "
                f"{show('tier/parsable')}  invalid {show('tier/invalid')}\n"
                f"  turns {show('episodes/turns_mean')}  submit {show('episodes/submit_rate')}  forced "
                f"{show('episodes/forced_rate')}  kl {show('kl')}  beta {show('beta')}  {show('step_time')}s",
                highlight=False,
            )

        def table(self):
            from rich.table import Table

            table = Table(title="training steps")
            table.add_column("metric")
            for entry in self.steps:
                table.add_column(f"step {entry['step']}", justify="right")
            for key, title, fmt in STEP_COLUMNS:
                table.add_row(title, *(fmt.format(e[key]) if e.get(key) is not None else "-" for e in self.steps))
            return table

    return StepPrinter()


def run(args: argparse.Namespace) -> int:
    from t2s.resources import workspace
    from t2s.rich_output import console as make_console
    from t2s.settings import RECIPES_DIR, offline_environment

    offline_environment()
    console = make_console()  # printed paths are never wrapped
    started = time.perf_counter()
    output = workspace() / args.output  # an absolute output stays as it is
    _quiet_libraries()

    from transformers import PrinterCallback, ProgressCallback

    from t2s.configs import ConfigError, parse_recipe
    from t2s.train import build_trainer, fit

    console.rule("[bold]t2s demo: GRPO on a CPU with the tiny Qwen3.5 and data/demo")
    try:
        script_args, training_args, model_args = parse_recipe([
            "--config", str(RECIPES_DIR / "smoke.yaml"), "--output_dir", str(output / "model"),
            "--max_steps", str(args.steps), "--disable_tqdm", "true",
            *(["--model_name_or_path", str(args.model)] if args.model else []),
        ])
        with console.status("loading data, building the tiny model, starting the trainer"):
            trainer, counts = build_trainer(script_args, training_args, model_args)
    except (ConfigError, ValueError, OSError) as exc:
        message = str(exc) if str(exc).startswith("Error:") else f"Error: {exc}"
        console.print(message.splitlines()[0], style="red")
        return 2
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    printer = step_printer(console)
    trainer.add_callback(printer)
    console.print(f"{counts['kept']} training rows of {counts['loaded']} "
                  f"({counts.get('dropped_difficulty', 0)} challenging, {counts.get('dropped_gold_hygiene', 0)} failed "
                  f"gold hygiene, {counts.get('dropped_prompt_too_long', 0)} prompts too long); "
                  f"{training_args.per_device_train_batch_size // training_args.num_generations} questions × "
                  f"{training_args.num_generations} rollouts per step")
    with console.status(f"training {args.steps} steps (episodes, rewards, loss, KL controller)"):
        fit(trainer, counts)
    console.print(printer.table())
    console.print(f"trained {trainer.state.global_step} steps; beta {trainer.beta:.6f}; model in {output / 'model'}")

    code = _evaluate(console, output, args.eval_n)
    console.rule(f"[bold]demo finished in {time.perf_counter() - started:.0f} s")
    return code


def _evaluate(console, output: Path, n: int) -> int:
    """The trained model on data/demo through ``t2s eval``, then the gold self-check (must be 1.0)."""
    import importlib.util

    from t2s.settings import DEMO_DIR

    if importlib.util.find_spec("t2s.evaluate") is None:
        return _gold_self_check(console)
    from t2s.cli import main as t2s_main

    data = str(DEMO_DIR / "dev.json")
    for folder in ("eval_model", "eval_gold"):  # a fresh evaluation of this run's model, never a resumed one
        shutil.rmtree(output / folder, ignore_errors=True)
    console.rule("evaluation of the trained model on data/demo (t2s eval --policy model)")
    code = t2s_main(["eval", "--policy", "model", "--model", str(output / "model"), "--data", data, "--n", str(n),
                     "--mode", "full", "--max-turns", "2", "--episode-token-budget", "4096",
                     "--max-tokens-per-turn", "48", "--device", "cpu", "--output", str(output / "eval_model")])
    console.rule("gold self-check of the harness (t2s eval --policy gold): must score 1.0")
    gold = t2s_main(["eval", "--policy", "gold", "--data", data, "--output", str(output / "eval_gold")])
    return code or gold


def _gold_self_check(console) -> int:
    """Fallback when the evaluator is absent: every demo question's gold episode must score 1.0."""
    from t2s.backends.scripted import GoldPolicy
    from t2s.data.loaders import load_rows
    from t2s.databases import ref_from_row
    from t2s.episode import EpisodeConfig, run_text_episode
    from t2s.metrics import score_sql
    from t2s.schema import get_schema
    from t2s.settings import DEMO_DIR

    rows = load_rows("bird", str(DEMO_DIR / "dev.json"))
    correct = 0
    for row in rows:
        ref = ref_from_row(row)
        record = run_text_episode(row, EpisodeConfig(), GoldPolicy(row, get_schema(ref)))
        correct += bool(score_sql(ref, record.get("final_sql"), row["gold_sql"])["official"])
    console.print(f"gold self-check: {correct}/{len(rows)} = {correct / len(rows):.3f}")
    return 0 if correct == len(rows) else 1


def _quiet_libraries() -> None:
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
