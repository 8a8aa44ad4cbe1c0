"""The project's user-facing failures, and how ``python -m t2s`` turns any of them into one ``Error:`` line.

Commands raise :class:`T2SError` (or a subclass) for bad input they can name. ``t2s.commands.main`` also maps the
failures no command should let through as a traceback: ``OSError`` (a missing, read-only or full disk; an output path
that is a file), ``UnicodeDecodeError``, YAML syntax errors and a path that loops through symbolic links. Each becomes
one line on stderr and exit status 1 (2 for a :class:`UsageError`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys


class T2SError(Exception):
    """A failure the user can act on; ``str`` is one line (``Error:`` is added where it is missing)."""


class FileError(T2SError, ValueError):
    """A file the user named that cannot be used (unreadable, not UTF-8, empty)."""


MAX_TEXT_FILE_BYTES = 4 << 20  # a system prompt or chat template is kilobytes


def file_problem(path, what: str) -> str | None:
    """Why ``path`` cannot be read as the file the user named (``what``: "database file", "system prompt file"), in
    one phrase without ``Error:``, or None for a regular file. Found from the file's type, without opening it: a FIFO
    opened plainly would wait for a writer for ever."""
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        return f"{what} is a folder, not a file: {path}"
    if os.path.lexists(path) and not os.path.exists(path):
        return f"{what} is a symbolic link that leads nowhere (its target is missing, or it loops): {path}"
    if os.path.lexists(path):
        return f"{what} is not a regular file (a pipe or a device): {path}"
    return f"{what} not found: {path}"


def read_text_file(path, what: str, *, error: type[T2SError] = FileError, max_bytes: int | None = MAX_TEXT_FILE_BYTES,
                   allow_empty: bool = False) -> str:
    """The UTF-8 text of a file the user named (a byte-order mark dropped), the one reader of such files: prompts and
    chat templates as they are, data files through ``t2s.data.rows.read_text_file``. ``error`` (naming ``what``, e.g.
    "system prompt file", and the path) when it is absent, no regular file (a FIFO would wait for a writer for ever),
    larger than ``max_bytes``, unreadable, not UTF-8, or blank unless ``allow_empty``."""
    from pathlib import Path

    path = Path(path)
    try:
        problem = file_problem(path, what)
        if problem:
            raise error(f"Error: {problem}")
        if max_bytes is not None and path.stat().st_size > max_bytes:
            raise error(f"Error: {what} is larger than {max_bytes >> 20} MiB: {path}")
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"Error: {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"Error: cannot read {what} {path}: {exc.strerror or exc}") from None
    if not allow_empty and not text.strip():
        raise error(f"Error: {what} is empty: {path}")
    return text


class UsageError(T2SError):
    """Options that cannot go together (exit status 2, as the option parser's own usage errors)."""


@contextlib.contextmanager
def writing(path):
    """Name ``path`` in an OSError raised without a file name inside the block (a full disk fails on write or
    flush, where Python does not say which file)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or isinstance(exc, T2SError):
            raise
        raise type(exc)(exc.errno, exc.strerror or str(exc), str(path)) from exc


class ConfigError(T2SError, ValueError):
    """A training configuration that cannot run (``train``, ``sft``); the message starts with ``Error:``."""

    def __init__(self, message: str) -> None:
        super().__init__(message if message.startswith("Error:") else f"Error: {message}")


class EvalError(T2SError):
    """A user-facing failure of an evaluation or an episode's options (``eval``, ``ask``, ``data passrate``)."""


class ExportError(T2SError):
    """A problem with the inputs of an export (``t2s export``), reported as one ``Error:`` line."""


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says (its type's name when it says nothing): a library's message, which may go
    on for a page, shown in one line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(lines)


def _os_error_text(exc: OSError) -> str:
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__)
    names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    return f"{reason}: {' -> '.join(names)}" if names else reason


def _yaml_error(exc: BaseException) -> bool:
    yaml = sys.modules.get("yaml")
    return yaml is not None and isinstance(exc, yaml.YAMLError)


def _symlink_loop(exc: BaseException) -> str | None:
    """The path where pathlib's ``resolve()`` met a loop of symbolic links (Python 3.10-3.12 raise RuntimeError
    ``Symlink loop from '...'``, later ones OSError ELOOP), else None."""
    if type(exc) is RuntimeError and str(exc).startswith("Symlink loop from "):
        return str(exc).removeprefix("Symlink loop from ").strip("'\"")
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return str(exc.filename)
    return None


def _unknown_home(exc: BaseException) -> bool:
    """pathlib's ``expanduser()`` on ``~name`` for a user this machine does not have (RuntimeError)."""
    return type(exc) is RuntimeError and str(exc).startswith("Could not determine home directory")


def user_facing(exc: BaseException) -> bool:
    """True for the failures :func:`error_line` reports as one line (anything else is a bug and keeps its traceback)."""
    return isinstance(exc, (T2SError, OSError, UnicodeDecodeError)) or _yaml_error(exc) or bool(_symlink_loop(exc)) \
        or _unknown_home(exc)


def error_line(exc: BaseException) -> str:
    """One ``Error: ...`` line describing ``exc``, safe on a terminal (``t2s.ui.console.safe_text``)."""
    if _symlink_loop(exc):
        text = f"a path is a loop of symbolic links: {_symlink_loop(exc)}"
    elif _unknown_home(exc):
        text = "a path starts with ~NAME for a user this machine does not have"
    elif isinstance(exc, OSError) and not isinstance(exc, T2SError):
        text = _os_error_text(exc)
    elif isinstance(exc, UnicodeDecodeError):
        text = f"a file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    elif _yaml_error(exc):
        text = f"not valid YAML: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    from t2s.ui.console import safe_text

    text = safe_text(_one_line(text))  # it may quote a SQL, a path or a cell
    return text if text.startswith("Error:") else f"Error: {text}"
