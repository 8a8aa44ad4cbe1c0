"""`python -m t2s demo` (what `make demo` runs): a tiny model learning on a CPU, in a few minutes.

1. a supervised warm start (``recipes/demo_sft.yaml``, as ``bench learn`` trains it): the tiny offline Qwen3.5 with
   four full-attention layers, on gold and runnable wrong answers played by the demo recipe's own environment. It is
   cached under ``.cache/`` after the first run, keyed on what determines it (recipes, data, the t2s sources and the
   library versions);
2. GRPO steps of ``recipes/demo.yaml`` from there, through the real rollout, tools, dense reward, loss and KL
   controller, printing each step's reward components as it goes and writing the curve to ``learn.png``;
3. an evaluation of the trained model on the questions it trained on with ``t2s eval`` (policy ``model``), and the
   harness's gold self-check, which must score 1.0.

What it shows is the whole chain learning: the share of right answers rises over the GRPO steps. The model learns the
protocol and which of the database's queries answers which question; it does not learn SQL.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from t2s.ui.args import add_hidden_alias

DEMO_STEPS = 12
# The demo is bench learn's experiment made shorter: its warm start, then GRPO on 8 of its 16 questions, so that
# every step sees each of them. (A warm start on those 8 alone, 80 steps, started at 0.05 equivalence with 40% invalid.)
EVAL_OPTIONS = {"mode": ["withheld"], "max_turns": 1, "max_tokens_per_turn": 128, "episode_token_budget": 4096}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"GRPO steps (default: {DEMO_STEPS})")
    parser.add_argument("--output", default="runs/demo", help="output folder (default: runs/demo)")
    parser.add_argument("--n", dest="eval_n", type=int, default=8,
                        help="questions the trained model is evaluated on (default: 8)")
    add_hidden_alias(parser, "--n", "--eval-n", type=int)
    parser.add_argument("--model", default=None,
                        help="model folder to start GRPO from (default: the cached warm start, trained when absent)")


def run(args: argparse.Namespace) -> int:
    from t2s.training.cpu_threads import configure_cpu_threads
    from t2s.settings import workspace
    from t2s.ui.console import console as make_console, print_table
    from t2s.settings import offline_environment
    from t2s.training.progress import quiet_libraries, step_printer
    from rich.text import Text

    configure_cpu_threads(on_cpu=True)  # before torch is imported
    offline_environment()
    console = make_console()  # printed paths are never wrapped
    started = time.perf_counter()
    output = workspace() / args.output  # an absolute output stays as it is
    quiet_libraries()

    from t2s.bench.learn import grpo_run, plot_curves
    from t2s.training.configs import ConfigError
    from t2s.training.pipeline import free_finished_run

    console.rule(Text("t2s demo: a tiny Qwen3.5 learns on a CPU", style="bold"))  # fits 80 columns
    printer = step_printer(console)
    try:
        model_dir = Path(args.model) if args.model else cached_warm_start(console)
        with console.status(f"GRPO, {args.steps} steps of 8 questions × 8 rollouts (episodes, rewards, loss, KL)"):
            trainer = grpo_run(model_dir, output / "model", steps=args.steps, seed=0, callbacks=[printer])
    except (ConfigError, ValueError, OSError) as exc:
        message = str(exc) if str(exc).startswith("Error:") else f"Error: {exc}"
        console.print(message.splitlines()[0], style="red", highlight=False, markup=False)
        return 2
    print_table(console, printer.table())
    plot_curves(output / "learn.png", {"grpo": printer.steps}, "t2s demo: GRPO from the warm start")
    equiv = [entry.get("tier/equivalent") or 0.0 for entry in printer.steps]
    third = max(1, len(equiv) // 3)
    console.print(f"equivalence rate: {sum(equiv[:third]) / third:.2f} over the first {third} steps, "
                  f"{sum(equiv[-third:]) / third:.2f} over the last {third}; curve in {output / 'learn.png'}",
                  highlight=False)
    console.print(f"trained {trainer.state.global_step} steps; beta {trainer.beta:.6f}; model in {output / 'model'}",
                  highlight=False)
    rows = list(trainer.train_dataset)
    del trainer
    free_finished_run()  # the trained model goes before the evaluation loads it again
    code = _evaluate(console, output, args.eval_n, rows)
    console.rule(Text(f"demo finished in {time.perf_counter() - started:.0f} s", style="bold"))
    return code


def warm_start_key() -> str:
    """A hash of what the warm start depends on: its recipes and prompt, the demo data, the t2s sources, the
    libraries."""
    from t2s.bench.learn import content_key
    from t2s.settings import DEMO_DIR, PACKAGE_DIR, RECIPES_DIR

    return content_key([
        (RECIPES_DIR, [RECIPES_DIR / n for n in ("demo_sft.yaml", "demo.yaml", "demo_system_prompt.txt")]),
        (DEMO_DIR, sorted(p for p in DEMO_DIR.rglob("*") if p.is_file())),
        (PACKAGE_DIR, sorted(PACKAGE_DIR.rglob("*.py"))),
    ])


def cached_warm_start(console) -> Path:
    """The warm-started model folder: from ``.cache/`` when its key matches, else trained there now."""
    from t2s.bench.learn import warm_start
    from t2s.settings import workspace
    from t2s.training.warm_start import SUMMARY_FILE

    folder = workspace() / ".cache" / f"demo-warmstart-{warm_start_key()}"
    if (folder / SUMMARY_FILE).is_file():
        console.print(f"warm start: cached in {folder}", highlight=False)
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    began = time.perf_counter()
    with console.status("warm start: SFT on gold and near-miss trajectories (first run only, then cached)"):
        warm_start(partial, seed=0, report=lambda line: console.print(line, markup=False, highlight=False))
    partial.rename(folder)
    console.print(f"warm start: trained in {time.perf_counter() - began:.0f} s, cached in {folder}", highlight=False)
    return folder


def _evaluate(console, output: Path, n: int, train_rows: list[dict]) -> int:
    """The trained model on its questions through ``t2s eval``, then the gold self-check (must be 1.0)."""
    import json

    from t2s.errors import error_line, user_facing
    from t2s.evaluation.config import EvalConfig
    from t2s.evaluation.runner import evaluate
    from t2s.settings import DEMO_DIR, RECIPES_DIR

    trained = {str(row["question_id"]) for row in train_rows}
    questions = output / "questions.json"  # the questions GRPO trained on, in BIRD's layout
    records = json.loads((DEMO_DIR / "dev.json").read_text(encoding="utf-8"))
    questions.write_text(json.dumps([r for r in records if str(r.get("question_id")) in trained], indent=1))
    for folder in ("eval_model", "eval_gold"):  # a fresh evaluation of this run's model, never a resumed one
        shutil.rmtree(output / folder, ignore_errors=True)
    console.rule("evaluation of the trained model on its questions (t2s eval --policy model)")
    runs = [
        dict(policy="model", model=str(output / "model"), data=str(questions), db_root=str(DEMO_DIR / "dev_databases"),
             n=n, **EVAL_OPTIONS, system_prompt_file=str(RECIPES_DIR / "demo_system_prompt.txt"), device="cpu",
             output=str(output / "eval_model")),
        dict(policy="gold", data=str(DEMO_DIR / "dev.json"), output=str(output / "eval_gold")),
    ]
    code = 0
    for options in runs:
        if options["policy"] == "gold":
            console.rule("gold self-check of the harness (t2s eval --policy gold): must score 1.0")
        try:
            evaluate(EvalConfig.from_options(options))
        except Exception as exc:
            if not user_facing(exc):
                raise
            console.print(error_line(exc), style="red", highlight=False, markup=False)
            code = 1
    return code


