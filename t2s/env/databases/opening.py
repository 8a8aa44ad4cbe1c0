"""Which database a row means, and opening its file read-only without writing anything next to it.

URIs come from ``Path.resolve().as_uri()`` plus ``?mode=ro`` (a ``#`` or ``?`` in a path can never turn into URI
syntax). Connections are in autocommit mode. How a file opens depends on what lies next to it when it is opened:

* a **hot journal** (``-journal``, not empty, header not zeroed): a writer stopped in the middle of a transaction
  and the file is half-written. It is not opened; :func:`database_problem` says why. (``immutable=1`` would read the
  half-written file as whole; ``mode=ro`` cannot roll the journal back.)
* a **WAL with frames** (``-wal``, not empty): the latest data is partly in the WAL. The ``-wal`` and then the file
  are copied into a private temporary folder, removed with the connection, and the copy opens ``mode=ro`` on the
  ``unix-none`` VFS with ``PRAGMA locking_mode=EXCLUSIVE`` set before the first read, so SQLite reads through the WAL
  with its index in private memory. Opened in place, a connection that closes as the file's last (``unix-none``
  takes no locks, so it always is) checkpoints and deletes the ``-wal`` when it holds no valid frame: a damaged WAL,
  or the frames another program's open transaction had written there, which its commit then lost. A plain
  ``mode=ro`` reader would create ``-shm`` and ``-wal`` files.
* otherwise a **benchmark file**, or any file whose header says WAL mode (its WAL is empty or absent), opens
  ``immutable=1``: nothing is locked or created. A **user's file** (``ask --db``) in rollback mode opens ``mode=ro``,
  with SQLite's usual locking, which creates nothing either.

WAL files are read without locks, so a WAL file that is not an unchanging benchmark file is watched: when it or its
``-wal`` changes between statements, the connection is opened again (:func:`unlocked_state`). A writer that
checkpoints while a statement runs can still make that one statement read a mix of old and new pages.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import shutil
import sqlite3
import weakref
from pathlib import Path
from typing import NamedTuple

from t2s.errors import file_problem


class DatabaseRef(NamedTuple):
    """Which database a row or request means: plain, picklable, hashable; never a live handle.

    A tuple, so hashing and comparing it (it keys every connection and gold-cache lookup) runs in C.
    """

    db_id: str
    path: str | None = None  # SQLite file
    immutable: bool = True  # benchmark files; user files (ask --db) open with mode=ro only
    schema_id: str | None = None  # row-payload database registered in this process
    engine: str = "sqlite"  # sqlite, duckdb (path: a .duckdb file) or postgres (path: a postgresql:// URL)


class DatabaseOpenError(Exception):
    """A database that cannot be opened; the message starts with ``Error:``."""


_JOURNAL_SUFFIX, _WAL_SUFFIX = "-journal", "-wal"


@contextlib.contextmanager
def regular_file(path):
    """``path`` open for binary reading; OSError (EINVAL) unless it is a regular file, found without blocking: a FIFO
    opened plainly waits for a writer for ever, and a device never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            yield handle
    finally:
        os.close(fd)


def _hot_journal(path: str) -> str | None:
    """The path of a hot rollback journal next to ``path``, or None (absent, empty or zeroed: a finished one)."""
    journal = path + _JOURNAL_SUFFIX
    try:
        with regular_file(journal) as handle:
            first = handle.read(1)
    except OSError:
        return None
    return journal if first not in (b"", b"\x00") else None


def _wal_has_frames(path: str) -> bool:
    """True when a non-empty ``-wal`` file lies next to ``path``."""
    try:
        return os.path.getsize(path + _WAL_SUFFIX) > 0
    except OSError:
        return False


def database_problem(ref: DatabaseRef) -> str | None:
    """Why a database file cannot be read as a whole (without ``Error:``), or None: a file beside it that is no
    regular file (SQLite's journal or WAL, DuckDB's WAL: the engine would open a FIFO and wait for ever), or a hot
    journal next to a SQLite file."""
    if ref.path is None or ref.engine not in ("sqlite", "duckdb"):
        return None
    engine = "SQLite" if ref.engine == "sqlite" else "DuckDB"
    sides = (_JOURNAL_SUFFIX, _WAL_SUFFIX) if ref.engine == "sqlite" else (".wal",)
    for side in (ref.path + suffix for suffix in sides):
        if os.path.lexists(side) and not os.path.isfile(side):
            return (f"{side} beside the database is not a regular file (a pipe or a folder?): {engine} cannot read "
                    "past it")
    if ref.engine == "duckdb":
        return None
    journal = _hot_journal(ref.path)
    if journal is None:
        return None
    return (f"{ref.path} is half-written: a hot journal ({journal}) shows that a writer stopped in the middle of a "
            "transaction. Open it once with sqlite3 and write access to roll the journal back, or use a clean copy")


def _is_wal(path: str) -> bool:
    """True when the file header says WAL mode (read/write versions 2); False for anything unreadable."""
    try:
        with regular_file(path) as handle:
            header = handle.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[:16] == b"SQLite format 3\x00" and header[18] == 2


_DSN_PREFIXES = ("postgresql://", "postgres://")
_DUCKDB_SUFFIXES = (".duckdb", ".ddb")


def is_dsn(path) -> bool:
    """True for a PostgreSQL URL (``postgresql://...``) rather than a file path."""
    return isinstance(path, str) and path.lower().startswith(_DSN_PREFIXES)


def file_engine(path: str) -> str:
    """``duckdb`` for a file named ``.duckdb``/``.ddb`` or whose header says DuckDB, else ``sqlite``."""
    if path.lower().endswith(_DUCKDB_SUFFIXES):
        return "duckdb"
    try:
        with regular_file(path) as handle:
            header = handle.read(12)
    except OSError:
        return "sqlite"
    return "duckdb" if header[8:12] == b"DUCK" else "sqlite"


def server_db(dsn: str, db_id: str | None = None) -> DatabaseRef:
    """A database on a PostgreSQL server; ``db_id`` defaults to the URL's database name."""
    if db_id is None:
        from urllib.parse import unquote, urlsplit

        try:
            db_id = unquote(urlsplit(dsn).path.lstrip("/")) or "postgres"
        except ValueError as exc:  # "Invalid IPv6 URL": said without the URL, which may hold a password
            raise DatabaseOpenError(f"Error: the PostgreSQL URL cannot be read: {exc}") from None
    return DatabaseRef(db_id=db_id, path=dsn, immutable=False, engine="postgres")


def server_url(dsn: str, database: str) -> str:
    """``dsn`` with its database replaced by ``database`` (query parameters such as ``host=`` kept): where
    ``data convert --engine postgres`` puts each ``db_id``."""
    from urllib.parse import quote as url_quote, urlsplit

    parts = urlsplit(dsn)
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}/{url_quote(database, safe='')}{query}"


def benchmark_db(path, db_id: str | None = None) -> DatabaseRef:
    """A benchmark file: opened ``immutable`` unless its header says WAL mode or a journal or WAL lies next to it (an
    absolute path is looked up once). A ``postgresql://`` URL is a database on a server."""
    if is_dsn(path):
        return server_db(path, db_id)
    if isinstance(path, str) and os.path.isabs(path):
        return _absolute_benchmark_db(path, db_id)
    return _absolute_benchmark_db.__wrapped__(_real_path(path), db_id)


@functools.lru_cache(maxsize=4096)
def _absolute_benchmark_db(path: str, db_id: str | None) -> DatabaseRef:
    resolved = _real_path(path)
    name = db_id if db_id is not None else Path(resolved).stem
    if file_engine(resolved) == "duckdb":  # opened read-only; a benchmark file is taken never to change
        return DatabaseRef(db_id=name, path=resolved, immutable=True, engine="duckdb")
    changing = _is_wal(resolved) or _wal_has_frames(resolved) or _hot_journal(resolved) is not None
    return DatabaseRef(db_id=name, path=resolved, immutable=not changing)


def _real_path(path) -> str:
    """``path`` absolute, ``~`` expanded and links followed; a link that loops stays as it is (``Path.resolve``
    raises RuntimeError on one), to be reported when the database is opened."""
    return os.path.realpath(os.path.expanduser(path))


def user_db(path) -> DatabaseRef:
    """A user's own file (``ask --db``): never ``immutable`` in rollback mode, so another program's commits show.
    A ``.duckdb`` file opens read-only in DuckDB; a ``postgresql://`` URL is a database on a server."""
    if is_dsn(path):
        return server_db(path)
    resolved = _real_path(path)
    return DatabaseRef(db_id=Path(resolved).stem, path=resolved, immutable=False, engine=file_engine(resolved))


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


def unlocked_state(ref: DatabaseRef) -> tuple | None:
    """For a file read without locks that may change (a WAL file that is not an unchanging benchmark file): the size
    and modification time of it and its ``-wal``, to compare before each statement. None for any other file."""
    path = ref.path
    if path is None or ref.engine != "sqlite" or (ref.immutable and not _wal_has_frames(path)):
        return None
    if not (_is_wal(path) or _wal_has_frames(path)):
        return None
    state = []
    for name in (path, path + _WAL_SUFFIX):
        try:
            stat = os.stat(name)
            state += [stat.st_size, stat.st_mtime_ns]
        except OSError:
            state += [None, None]
    return tuple(state)


def open_file(ref: DatabaseRef, factory: type[sqlite3.Connection]) -> sqlite3.Connection:
    """Open a database file read-only as a ``factory`` connection, creating nothing beside it (raises
    DatabaseOpenError; see the module's docstring for how each kind of file opens)."""
    path = ref.path
    problem = file_problem(path, "database file")
    if problem:
        raise DatabaseOpenError(f"Error: {problem}")
    problem = database_problem(ref)
    if problem:
        raise DatabaseOpenError(f"Error: {problem}")
    through_wal = _wal_has_frames(path)
    snapshot = None
    if through_wal:
        snapshot, copy = _private_copy(path)
        through_wal = copy is not None  # else the -wal went (checkpointed) between the look and the copy
    if through_wal:
        uri = Path(copy).as_uri() + "?mode=ro&vfs=unix-none"
    else:
        uri = database_uri(path, ref.immutable or _is_wal(path))
    try:
        conn = sqlite3.connect(
            uri,
            uri=True,
            timeout=1.0,  # seconds to wait on another process's lock (user files in rollback mode only)
            isolation_level=None,
            check_same_thread=True,
            factory=factory,
        )
        if through_wal:  # before the first read: the WAL index lives in private memory, never in a -shm file
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now on a file that is not SQLite
    except sqlite3.Error as exc:
        if snapshot is not None:
            shutil.rmtree(snapshot, ignore_errors=True)
        raise DatabaseOpenError(f"Error: cannot open database {path}: {exc}") from None
    if snapshot is not None:  # the copy goes when the connection does (or at exit)
        conn.snapshot = weakref.finalize(conn, shutil.rmtree, snapshot, True)
    return conn


def _private_copy(path: str) -> tuple[str | None, str | None]:
    """(a temporary folder, the path in it) of a copy of ``path`` and its ``-wal``: the ``-wal`` first, so that a
    checkpoint by a writer between the two copies leaves frames at least as new as the file's pages; (None, None) when
    the ``-wal`` is gone by then. Raises DatabaseOpenError when the copy cannot be made (a full disk)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="t2s-wal-")
    copy = os.path.join(folder, "db.sqlite")
    try:
        try:
            shutil.copyfile(path + _WAL_SUFFIX, copy + _WAL_SUFFIX)
        except FileNotFoundError:
            shutil.rmtree(folder, ignore_errors=True)
            return None, None
        shutil.copyfile(path, copy)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise DatabaseOpenError(f"Error: cannot read {path} through its -wal file: copying them to a temporary "
                                f"folder failed ({exc.strerror or exc})") from None
    return folder, copy
