"""`python -m t2s bench <name>`: performance benchmarks (DESIGN §11). Each prints its figures as ratios measured in one run."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "env": ("t2s.bench.env", "environment overhead against plain sqlite3 on a pinned workload"),
    "rollout": ("t2s.bench.rollout", "async vs turn-synchronous rollout scheduling on a simulated engine"),
    "learn": ("t2s.bench.learn", "CPU proof that training learns: warm start, then GRPO against a permuted-reward control"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        try:
            importlib.import_module(module).add_arguments(sp)
        except ModuleNotFoundError:
            pass


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(BENCHMARKS[args.benchmark][0]).run(args) or 0)
