"""One run at a time per output folder.

A run that writes a folder (``eval``, ``score``, ``train``'s ``output_dir``) holds an exclusive ``fcntl.flock`` on
``LOCK_NAME`` inside it for as long as it runs. The lock file records the holder (pid, host, command, start time), so a
second run into the same folder stops at once with one ``Error:`` line naming it, before doing any work. A run that
ends removes the file (a finished folder, uploaded or shared, carries no pid, host or command). The kernel drops the
lock when the holder exits, however it exits; a killed run's file stays behind, and only the lock counts. A run that
takes the lock checks that the file it locked is still the folder's, since one that ended may have just removed it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from t2s.errors import T2SError

LOCK_NAME = ".t2s-run.lock"


class RunFolderBusy(T2SError):
    """Another live run holds the output folder."""


def _holder_text(handle, wait: float = 2.0) -> str:
    """The holder's details from the lock file. A holder writes them just after it takes the lock, so a run that
    meets the lock in between reads again for up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        handle.seek(0)
        try:
            holder = json.loads(handle.read())
            return (f"pid {holder['pid']} on {holder['host']}, started {holder['started_at']}: "
                    f"{holder['command']}")
        except (ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "its details are not written yet"
            time.sleep(0.05)


def _this_command() -> str:
    """This process's command line, as typed: ``t2s eval ...`` for ``python -m t2s eval ...``."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    program = "t2s" if program in ("__main__.py", "t2s") else program
    return shlex.join([program, *sys.argv[1:]])


def output_folder(folder) -> Path:
    """``folder`` created if absent; T2SError when the path is a file or cannot be made a folder."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise T2SError(f"Error: the output {folder} is a file, not a folder; choose another output")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def run_folder_lock(folder, command: str | None = None):
    """Hold ``folder``'s run lock for the ``with`` block (creating the folder, and removing it again when the block
    left it empty, as a run refused before any work does); RunFolderBusy when another run holds it."""
    made = not Path(folder).exists()
    folder = output_folder(folder)
    path = folder / LOCK_NAME
    while True:
        folder.mkdir(parents=True, exist_ok=True)  # again: a run refused before any work removes the folder it made
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = _holder_text(handle)
            handle.close()
            raise RunFolderBusy(f"Error: {folder} is in use by another run ({text}); wait for it to finish, or "
                                "choose another output folder") from None
        if _same_file(handle, path):
            break
        handle.close()  # the file was removed by a run that ended while this one opened it: take the new one
    try:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(command.split()) if command else _this_command(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        yield folder
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # removed while still held: a finished folder carries no lock file
            if made:
                folder.rmdir()  # only when empty
        handle.close()  # closing the file releases the lock


def _same_file(handle, path: Path) -> bool:
    """Whether ``path`` still names the file ``handle`` holds."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def rank_zero_lock(folder, command: str | None = None):
    """:func:`run_folder_lock` for a run launched on several processes (``accelerate``, ``torchrun``): the global
    rank 0 takes it for all of them (a single process is rank 0); the other ranks hold nothing."""
    if os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext(Path(folder))
    return run_folder_lock(folder, command)
