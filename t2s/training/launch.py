"""``python -m t2s.training.launch [accelerate launch's arguments]``: ``accelerate launch``, ending as the training
processes end when one of them fails.

``accelerate launch`` answers a training process that exits non-zero with its own traceback: the elastic agent's
``ChildFailedError`` (a failure report of some thirty lines) on the multi-process path, a ``CalledProcessError`` on
the single-process one. The training process has already said what happened (``train`` and ``sft`` print one
``Error:`` line; an unexpected exception prints its own traceback), so here the launcher exits with that process's
exit code and adds nothing, except for a process killed by a signal (out of memory, say), which could say nothing
itself: that gets one ``Error:`` line naming the rank and the signal, and exit code 128 + the signal's number. Any
other failure of the launcher (its arguments, a rendezvous that never forms) is raised as accelerate raises it.
``slurm/node.sh`` and ``make train`` launch through this module.
"""

from __future__ import annotations

import signal
import subprocess
import sys


def exit_code(returncode: int, rank: int | None = None) -> int:
    """The exit code for a training process that ended with ``returncode``; prints an ``Error:`` line for a signal."""
    if returncode >= 0:
        return returncode
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    who = "the training process" if rank is None else f"training process rank {rank}"
    print(f"Error: {who} was killed by {name} (out of memory is the usual cause)", file=sys.stderr, flush=True)
    return 128 - returncode


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        return exit_code(failure.exitcode, rank)
    except subprocess.CalledProcessError as exc:
        return exit_code(exc.returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
