"""`python -m t2s bench <name>`: performance benchmarks (docs/design.md §11) and the CPU learning proofs; the library is
``t2s.bench``. Each prints its figures as ratios measured in one run."""

from __future__ import annotations

import argparse
import importlib

from t2s.evaluation.options import add_tool_arguments
from t2s.ui.args import add_hidden_alias, non_empty_path, positive_int


def env_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.bench.env import MIN_REPEATS, REPEAT_SECONDS, REPEATS, SEED

    parser.add_argument("--data", required=True, type=non_empty_path,
                        help="a BIRD/Spider-style JSON file, e.g. dev.json")
    parser.add_argument("--db-root", type=non_empty_path, default=None,
                        help="folder with one sub-folder per db_id (default: beside --data)")
    parser.add_argument("--workers", type=positive_int, default=None, help="worker threads (default: the core count)")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help=f"timed repetitions, each on fresh connections and a cold gold cache; the best is "
                             f"reported (default: {REPEATS}, or fewer but at least {MIN_REPEATS} once the timed passes "
                             f"have taken {REPEAT_SECONDS:g} s)")
    parser.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    add_tool_arguments(parser)


def rollout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", dest="episodes", type=int, default=144,
                        help="episodes (groups of 8 rollouts per question)")
    add_hidden_alias(parser, "--n", "--episodes", type=int)
    parser.add_argument("--seed", type=int, default=0, help="seed of the questions and the turn lengths")
    parser.add_argument("--data", default=None, help="a BIRD-style JSON file (default: data/demo/dev.json)")
    parser.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt token on every turn")
    parser.add_argument("--workers", type=int, default=None, help="tool worker threads (default: the core count)")
    parser.add_argument("--engine", default="sim", choices=("sim", "vllm"),
                        help="sim: the serving simulator on a virtual clock; vllm: a real vLLM server at --endpoint "
                        "(default: sim)")
    parser.add_argument("--endpoint", default=None, help="--engine vllm: the server's URL (a running `make serve`)")
    parser.add_argument("--tokenizer", default=None, help="--engine vllm: the served model's tokenizer folder")
    add_tool_arguments(parser)


def learn_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.bench.learn import STEPS

    parser.add_argument("--steps", type=int, default=STEPS, help=f"GRPO steps of each run (default: {STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the warm start, both runs and the permutation")
    parser.add_argument("--output", default="runs/bench-learn", help="output folder (default: runs/bench-learn)")
    parser.add_argument("--rollout-backend", default="transformers", choices=("transformers", "vllm_colocate"),
                        help="what generates the GRPO episodes: transformers generate, or the real vLLM engine "
                        "colocated in the trainer (make install-vllm) (default: transformers)")


def learn_real_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.bench.learn_real import GRPO_QUESTIONS, MODEL, SFT_QUESTIONS, STEPS

    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the SFT and GRPO questions, the warm start, both runs and the permutation")
    parser.add_argument("--output", type=non_empty_path, default="runs/bench-learn-real",
                        help="output folder (default: runs/bench-learn-real)")
    parser.add_argument("--steps", type=positive_int, default=STEPS, help=f"GRPO steps of each run (default: {STEPS})")
    parser.add_argument("--sft-questions", type=positive_int, default=SFT_QUESTIONS,
                        help=f"training questions of the warm start (default: {SFT_QUESTIONS})")
    parser.add_argument("--grpo-questions", type=positive_int, default=GRPO_QUESTIONS,
                        help=f"other training questions GRPO plays (default: {GRPO_QUESTIONS})")
    parser.add_argument("--unseen-n", type=int, default=0,
                        help="unseen-database questions evaluated, picked with --seed (default: 0, all 350)")
    parser.add_argument("--model", type=non_empty_path, default=None,
                        help=f"the base model's folder (default: {MODEL}, from make install-models)")


def report_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.bench.report import QUESTIONS, TURNS

    parser.add_argument("--questions", type=positive_int, default=QUESTIONS,
                        help=f"questions per mode (default: {QUESTIONS}, BIRD dev)")
    parser.add_argument("--turns", type=positive_int, default=TURNS, help=f"turns per episode (default: {TURNS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic episodes (default: 0)")
    parser.add_argument("--output", type=non_empty_path, default=None,
                        help="an empty folder to build in and keep (default: a temporary folder, removed)")


def eval_scale_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.bench.eval_scale import EPISODES, TARGET

    parser.add_argument("--model", type=non_empty_path, default=None,
                        help="the served model folder (default: .cache/models/smollm2-135m-instruct, from "
                        "make install-models)")
    parser.add_argument("--n", dest="episodes", type=positive_int, default=EPISODES,
                        help=f"episodes played, 8 per demo question (default: {EPISODES})")
    parser.add_argument("--max-turns", type=positive_int, default=2, help="tool turns per episode (default: 2)")
    parser.add_argument("--max-tokens-per-turn", type=positive_int, default=64, help="tokens per turn (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the questions picked (default: 0)")
    parser.add_argument("--output", type=non_empty_path, default=None,
                        help=f"folder for the servers' logs (default: a temporary one); the target is {TARGET}x")


def sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", type=positive_int, default=None,
                        help="time only the first N blow-ups (default: every one)")


BENCHMARKS = {
    "env": ("t2s.bench.env", env_arguments, "environment overhead against plain sqlite3 on a pinned workload"),
    "rollout": ("t2s.bench.rollout", rollout_arguments,
                "async vs turn-synchronous rollout scheduling on a serving simulator"),
    "learn": ("t2s.bench.learn", learn_arguments,
              "CPU proof that training learns: warm start, then GRPO against a permuted-reward control"),
    "learn-real": ("t2s.bench.learn_real", learn_real_arguments,
                   "the recipe in miniature on SmolLM2-135M: GRPO's EX on unseen databases, against its warm start "
                   "and a permuted-reward control"),
    "report": ("t2s.bench.report", report_arguments,
               "report.html, show and compare on a synthetic eval folder the size of BIRD dev in both modes"),
    "sandbox": ("t2s.bench.sandbox", sandbox_arguments, "how soon the sandbox ends each resource blow-up"),
    "eval-scale": ("t2s.bench.eval_scale", eval_scale_arguments,
                   "evaluation across two vLLM servers against one, each pinned to a core of its own"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (_, arguments, help_text) in BENCHMARKS.items():
        arguments(sub.add_parser(name, help=help_text, description=help_text))


def run(args: argparse.Namespace) -> int:
    import inspect

    module = BENCHMARKS[args.benchmark][0]
    if args.benchmark == "rollout" and args.engine == "vllm":
        module = "t2s.bench.real_engine"
    bench = importlib.import_module(module).run
    taken = inspect.signature(bench).parameters  # each benchmark takes its own options as keywords
    return int(bench(**{name: value for name, value in vars(args).items() if name in taken}) or 0)
