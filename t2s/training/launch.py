"""``python -m t2s.training.launch [accelerate launch's arguments]``: ``accelerate launch``, ending as the training
processes end when one of them fails.

``accelerate launch`` answers a training process that exits non-zero with its own traceback: the elastic agent's
``ChildFailedError`` (a failure report of some thirty lines) on the multi-process path, a ``CalledProcessError`` on the
single-process one. The training process has already said what happened (``train`` and ``sft`` print one ``Error:``
line, and exit 2 for a recipe, config, data or model they cannot use; an unexpected exception prints its own traceback),
so here the launcher exits with that process's exit code and adds nothing, except for a process killed by a signal,
which could say nothing itself: that gets one ``Error:`` line naming the rank and the signal, and exit code 128 + the
signal's number. Of several failed processes, the one reported is one killed by a signal other than the SIGTERM the
agent sends the rest (the others' failures follow from it: a broken collective, the agent's stop), else one that exited
with a code of its own, else the first (of those the agent found together); the agent's own log lines that report the
failure are left out (with ``--debug``, kept). The processes of one launch print an ``Error:`` line that another of
them has printed already only once (``t2s.ui.console.print_error_once``, for the set-up and command-line errors of
``train`` and ``sft``): a recipe, config or flag error, which every rank of a machine meets alike, is one line, not
one per rank. Any
other failure of the launcher (its arguments, a rendezvous that never forms, a command of its own) is raised as
accelerate raises it; and as in ``accelerate launch``, ``--quiet`` ends a failed single-process run with exit code 1,
and ``--debug`` prints the agent's stack instead. ``slurm/node.sh`` and ``make train`` launch through this module.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback

from t2s.ui.console import LAUNCH_ERRORS_DIR

# The elastic agent's logger for the processes it starts and stops, and its records that report a failure the launch
# reports itself (any other record of it, such as a process that would not stop, is kept)
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"
AGENT_FAILURE_REPORT = ("failed (exitcode", "Sending process", "Closing process")


def _not_a_failure_report(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(AGENT_FAILURE_REPORT)


def exit_code(returncode: int, rank: int | None = None) -> int:
    """The exit code for a training process that ended with ``returncode``; prints an ``Error:`` line for a signal."""
    if returncode >= 0:
        return returncode
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    who = "the training process" if rank is None else f"training process rank {rank}"
    cause = " (out of memory is the usual cause)" if -returncode == signal.SIGKILL else ""
    print(f"Error: {who} was killed by {name}{cause}", file=sys.stderr, flush=True)
    return 128 - returncode


def reported_failure(failures: dict) -> tuple[int, int]:
    """(rank, exit code) of the failure to report among the elastic agent's ``{rank: ProcessFailure}``. Of the failures
    stamped within a second of the earliest (whole seconds: those the agent found together; a later one followed from
    them, such as the SIGKILL the agent sends 30 s after a SIGTERM that did not stop a process): one killed by a signal
    other than SIGTERM, else one that exited with a code of its own, else one stopped by SIGTERM; among equals the
    earliest, then the lowest rank."""

    def kind(code: int) -> int:
        return 0 if code < 0 and -code != signal.SIGTERM else 1 if code > 0 else 2

    first = min(failure.timestamp for failure in failures.values())
    together = [rank for rank in failures if failures[rank].timestamp <= first + 1]
    rank = min(together, key=lambda rank: (kind(failures[rank].exitcode), failures[rank].timestamp, rank))
    return rank, failures[rank].exitcode


def _from_the_training_process(exc: subprocess.CalledProcessError) -> bool:
    """Whether accelerate's single-process launcher raised ``exc`` for the training process it ran (not for a command
    of its own, such as ``mpirun --version``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].name == "simple_launcher"


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command_parser

    args = launch_command_parser().parse_args(argv)
    agent_log = logging.getLogger(AGENT_LOGGER)
    if not args.debug:
        agent_log.addFilter(_not_a_failure_report)
    before = os.environ.get(LAUNCH_ERRORS_DIR)
    try:
        with tempfile.TemporaryDirectory(prefix="t2s-launch-errors-", ignore_cleanup_errors=True) as errors:
            os.environ[LAUNCH_ERRORS_DIR] = errors  # the training processes inherit it
            return _launch(args)
    finally:
        agent_log.removeFilter(_not_a_failure_report)
        if before is None:
            os.environ.pop(LAUNCH_ERRORS_DIR, None)
        else:
            os.environ[LAUNCH_ERRORS_DIR] = before


def _launch(args) -> int:
    from accelerate.commands.launch import launch_command
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(args)
    except ChildFailedError as exc:
        rank, code = reported_failure(exc.failures)
        return exit_code(code, rank)
    except subprocess.CalledProcessError as exc:
        if not _from_the_training_process(exc):
            raise
        return exit_code(exc.returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
