"""``python -m t2s.training.launch [accelerate launch's arguments]``: ``accelerate launch``, ending as the training
processes end when one of them fails.

``accelerate launch`` answers a training process that exits non-zero with its own traceback: the elastic agent's
``ChildFailedError`` (a failure report of some thirty lines) on the multi-process path, a ``CalledProcessError`` on the
single-process one. The training process has already said what happened (``train`` and ``sft`` print one ``Error:``
line, and exit 2 for a recipe, config, data or model they cannot use; an unexpected exception prints its own traceback),
so here the launcher exits with that process's exit code and adds nothing, except for a process killed by a signal,
which could say nothing itself: that gets one ``Error:`` line naming the rank and the signal, and exit code 128 + the
signal's number. Of several failed processes, one killed by a signal other than the SIGTERM the agent sends the rest is
the one reported (the others' failures follow from it: a broken collective, the agent's stop), else the first. Any other
failure of the launcher (its arguments, a rendezvous that never forms, a command of its own) is raised as accelerate
raises it; and as in ``accelerate launch``, ``--quiet`` ends a failed single-process run with exit code 1, and
``--debug`` prints the agent's stack instead. ``slurm/node.sh`` and ``make train`` launch through this module.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import traceback


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
    """(rank, exit code) of the failure to report among the elastic agent's ``{rank: ProcessFailure}``: one killed by a
    signal other than SIGTERM, else the earliest (timestamps are whole seconds: the lowest rank among equals)."""
    ranks = sorted(failures, key=lambda rank: (failures[rank].timestamp, rank))
    killed = [rank for rank in ranks if failures[rank].exitcode < 0 and -failures[rank].exitcode != signal.SIGTERM]
    rank = (killed or ranks)[0]
    return rank, failures[rank].exitcode


def _from_the_training_process(exc: subprocess.CalledProcessError) -> bool:
    """Whether accelerate's single-process launcher raised ``exc`` for the training process it ran (not for a command
    of its own, such as ``mpirun --version``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].name == "simple_launcher"


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
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
