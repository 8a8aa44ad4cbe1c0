"""Which database a row means, and opening its file read-only.

URIs come from ``Path.resolve().as_uri()`` plus ``?mode=ro`` (a ``#`` or ``?`` in a path can never turn into URI
syntax). ``immutable=1`` is added only for benchmark files that are not in WAL mode; user files open ``mode=ro`` only.
Connections are in autocommit mode.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from pathlib import Path
from typing import NamedTuple


class DatabaseRef(NamedTuple):
    """Which database a row or request means: plain, picklable, hashable; never a live handle.

    A tuple, so hashing and comparing it (it keys every connection and gold-cache lookup) runs in C.
    """

    db_id: str
    path: str | None = None  # SQLite file
    immutable: bool = True  # benchmark files; user files (ask --db) open with mode=ro only
    schema_id: str | None = None  # row-payload database registered in this process


class DatabaseOpenError(Exception):
    """A database that cannot be opened; the message starts with ``Error:``."""


def _is_wal(path: str) -> bool:
    """True when the file header says WAL mode (read/write versions 2); False for anything unreadable."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[:16] == b"SQLite format 3\x00" and header[18] == 2


def benchmark_db(path, db_id: str | None = None) -> DatabaseRef:
    """A benchmark file: opened ``immutable`` unless its header says WAL mode (an absolute path is looked up once)."""
    if isinstance(path, str) and os.path.isabs(path):
        return _absolute_benchmark_db(path, db_id)
    return _absolute_benchmark_db.__wrapped__(str(Path(path).expanduser().resolve()), db_id)


@functools.lru_cache(maxsize=4096)
def _absolute_benchmark_db(path: str, db_id: str | None) -> DatabaseRef:
    resolved = str(Path(path).resolve())
    name = db_id if db_id is not None else Path(resolved).stem
    return DatabaseRef(db_id=name, path=resolved, immutable=not _is_wal(resolved))


def user_db(path) -> DatabaseRef:
    """A user's own file (``ask --db``): ``mode=ro`` only, so a WAL database shows its latest data."""
    resolved = str(Path(path).expanduser().resolve())
    return DatabaseRef(db_id=Path(resolved).stem, path=resolved, immutable=False)


def ref_from_row(row: dict) -> DatabaseRef:
    """The database a data row points at: its ``db_path`` file, else its registered ``schema_id``."""
    if row.get("db_path"):
        return benchmark_db(row["db_path"], row.get("db_id"))
    if row.get("schema_id"):
        return DatabaseRef(db_id=str(row.get("db_id") or row["schema_id"]), schema_id=str(row["schema_id"]))
    raise ValueError(f"Error: row {row.get('question_id')!r} has neither db_path nor schema_id")


def database_uri(path: str, immutable: bool) -> str:
    """The read-only ``file:`` URI for a path (percent-encoded by pathlib, never string-formatted)."""
    return Path(path).resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


def open_file(ref: DatabaseRef, factory: type[sqlite3.Connection]) -> sqlite3.Connection:
    """Open a database file read-only as a ``factory`` connection (raises DatabaseOpenError)."""
    path = ref.path
    if not os.path.isfile(path):
        raise DatabaseOpenError(f"Error: database file not found: {path}")
    try:
        conn = sqlite3.connect(
            database_uri(path, ref.immutable),
            uri=True,
            timeout=1.0,  # seconds to wait on another process's lock (user files only; benchmark files never lock)
            isolation_level=None,
            check_same_thread=True,
            factory=factory,
        )
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now on a file that is not SQLite
    except sqlite3.Error as exc:
        raise DatabaseOpenError(f"Error: cannot open database {path}: {exc}") from None
    return conn
