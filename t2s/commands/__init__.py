"""The commands: one thin module per verb, and this dispatcher (`python -m t2s <command>`).

Each command lives in its own module, which exposes ``add_arguments(parser)`` and ``run(args) -> int``.
Command modules import heavy libraries (torch, transformers, trl) inside ``run`` only, so ``--help`` stays fast.
Every failure a user can act on ends as one ``Error:`` line on stderr (``t2s.errors``): usage errors exit 2, the rest 1.
A command imports the library packages and the foundation, never another command; nothing below imports a command.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from t2s.training.cpu_threads import sleep_while_waiting
from t2s.training.pipeline import release_kept_frames
from t2s.ui.args import CommandParser
from t2s.ui.console import escape_log_records
from t2s.errors import UsageError, error_line, user_facing

# name -> (module, one-line help). Only commands whose module exists are offered.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("t2s.commands.demo",
             "CPU: warm-start a tiny model on data/demo, run GRPO steps whose reward rises, evaluate it"),
    "train": ("t2s.commands.train", "GRPO training from a recipe YAML (launch with accelerate for several GPUs)"),
    "sft": ("t2s.commands.sft",
            "supervised warm start on trajectories the environment plays (gold or recorded episodes)"),
    "eval": ("t2s.commands.eval", "agentic evaluation of a model, endpoint, scripted policy or predictions file"),
    "score": ("t2s.commands.score", "score a predictions file with official EX, strict EX and Soft-F1"),
    "compare": ("t2s.commands.compare", "paired comparison of two runs: McNemar and bootstrap CI"),
    "show": ("t2s.commands.show",
             "read a run's episodes in the terminal: an eval folder, a pair of runs, a training run"),
    "ask": ("t2s.commands.ask",
            "one agentic episode against a SQLite or DuckDB file or a PostgreSQL database, read-only"),
    "export": ("t2s.commands.export", "write a vLLM-loadable model folder from a checkpoint"),
    "data": ("t2s.commands.data", "prepare, check, estimate difficulty, pass-rate filter"),
    "bench": ("t2s.commands.bench",
              "performance benchmarks (env, rollout, report, sandbox, eval-scale) and the CPU learning proofs "
              "(learn, learn-real)"),
}


class VersionAction(argparse.Action):
    """``--version``: the line is made only when asked for (it may ask git for the checkout's commit)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from t2s.settings import version_line

        print(version_line())
        parser.exit()


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is absent
        return False


def available_commands() -> dict[str, tuple[str, str]]:
    return {name: spec for name, spec in COMMANDS.items() if _exists(spec[0])}


def build_parser(command: str | None = None) -> CommandParser:
    parser = CommandParser(prog="t2s", description="Agentic text-to-SQL with GRPO on TRL.")
    parser.add_argument("--version", action=VersionAction, help="print the version and where t2s runs from, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in available_commands().items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:  # only the chosen command's module is imported
            importlib.import_module(module).add_arguments(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if command is not None and command not in available_commands():
        print(f"Error: unknown command {command!r}. Run `python -m t2s --help`.", file=sys.stderr)
        return 2
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    sleep_while_waiting()  # before torch is imported: OpenMP threads that wait sleep rather than spin (cpu_threads)
    module = importlib.import_module(available_commands()[args.command][0])
    escape_log_records()  # a library's warning may quote a path or a cell
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:
        if not user_facing(exc):
            raise
        print(error_line(exc), file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    finally:  # what the command dropped and a library's kept import error still held goes now (an engine)
        release_kept_frames()
