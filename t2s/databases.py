"""Opening databases read-only, the layered sandbox, deadlines and result fetching.

Every query a model sends runs through :func:`execute` on a sandboxed connection. The layers, each tested:

* **Opening.** URIs come from ``Path.resolve().as_uri()`` plus ``?mode=ro`` (a ``#`` or ``?`` in a path can never
  turn into URI syntax). ``immutable=1`` is added only for benchmark files that are not in WAL mode; user files open
  ``mode=ro`` only. Connections are in autocommit mode.
* **Limits.** ``SQLITE_LIMIT_ATTACHED`` is 0 and ``SQLITE_LIMIT_LENGTH`` about 1e6, so blob and string blow-ups fail at
  once. ``printf``/``format`` are replaced by versions that refuse huge widths and precisions (SQLite's own spends
  seconds inside a single opcode, out of reach of the progress handler).
* **Authorizer allowlist.** SELECT, READ, RECURSIVE, functions other than ``load_extension``/``fts3_tokenizer``,
  read-only introspection PRAGMAs, and the ``UPDATE sqlite_master`` that SQLite issues (with no trigger context) to
  build eponymous virtual tables such as ``json_each``. Everything else is denied, transactions included.
* **Deadlines.** A statement, fetching included, is aborted once its wall-clock deadline has passed: a watchdog thread
  interrupts it (``Connection.interrupt``, which costs the running statement nothing), and a progress handler checks
  the deadline too, every ``PROGRESS_INTERVAL`` VM instructions. The handler needs the GIL each time it runs, a hand-off
  between threads that a short interval would pay thousands of times a step; the watchdog keeps the deadline tight.
* **Connections.** One per (thread, database, purpose): tool connections for the model's calls and separate scoring
  connections that tool calls never touch. Invalid UTF-8 in text cells is decoded with replacement characters.

:func:`execute` never raises; every failure comes back as a :class:`QueryResult` whose ``error`` starts ``Error:``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import marshal
import math
import operator
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# ----------------------------------------------------------------------------------------------------------------
# Configuration (module constants; change them before opening connections)
# ----------------------------------------------------------------------------------------------------------------
TOOL_TIMEOUT = 5.0  # seconds, for a model's tool query
SCORING_MIN_TIMEOUT = 5.0  # scoring deadline = max(SCORING_MIN_TIMEOUT, SCORING_GOLD_FACTOR * gold seconds) ...
SCORING_GOLD_FACTOR = 10.0
SCORING_MAX_TIMEOUT = 30.0  # ... capped here; also the deadline for computing a gold result
SCORING_MAX_CELLS = 500_000  # a scoring result larger than this is `over_cap`
SCORING_MAX_BYTES = 64 * 1024 * 1024  # approximate text/blob bytes of a scoring result before `over_cap`
MAX_VALUE_LENGTH = 1_000_000  # SQLITE_LIMIT_LENGTH: longest string, blob or row
PRINTF_MAX_WIDTH = 100_000  # largest width or precision the capped printf/format accepts
FETCH_BATCH = 2048  # rows per fetchmany when a scoring result is fetched in full
PROGRESS_INTERVAL = 1_000_000  # virtual-machine instructions between the progress handler's deadline checks
WATCHDOG_POLL = 0.01  # seconds between the watchdog's deadline checks
PAYLOAD_MAX_BYTES = 256 * 1024 * 1024  # largest single row-payload database image
PAYLOAD_CACHE_BYTES = 2 * 1024 * 1024 * 1024  # row-payload images plus per-thread copies, across all threads
GOLD_CACHE_BYTES = 512 * 1024 * 1024  # cached gold results (approximate size)

_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})
_READ_ONLY_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"})
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})

# Authorizer action codes whose denial is a write attempt (PRAGMA and UPDATE are decided case by case).
_WRITE_ACTIONS = frozenset(
    getattr(sqlite3, name)
    for name in dir(sqlite3)
    if name.startswith(("SQLITE_CREATE_", "SQLITE_DROP_"))
    or name
    in {
        "SQLITE_INSERT",
        "SQLITE_DELETE",
        "SQLITE_UPDATE",
        "SQLITE_ALTER_TABLE",
        "SQLITE_ATTACH",
        "SQLITE_DETACH",
        "SQLITE_REINDEX",
        "SQLITE_ANALYZE",
        "SQLITE_COPY",
    }
)
_WRITE_ERROR_MARKERS = (
    "attempt to write a readonly database",
    "may not be modified",
    "too many attached databases",
)


# ----------------------------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------------------------
class DatabaseRef(NamedTuple):
    """Which database a row or request means: plain, picklable, hashable; never a live handle.

    A tuple, so hashing and comparing it (it keys every connection and gold-cache lookup) runs in C.
    """

    db_id: str
    path: str | None = None  # SQLite file
    immutable: bool = True  # benchmark files; user files (ask --db) open with mode=ro only
    schema_id: str | None = None  # row-payload database registered in this process


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


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class QueryResult:
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    more: bool = False  # more rows existed beyond those fetched
    error: str | None = None
    timed_out: bool = False
    write_attempt: bool = False
    over_cap: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class DatabaseOpenError(Exception):
    """A database that cannot be opened; the message starts with ``Error:``."""


# ----------------------------------------------------------------------------------------------------------------
# Capped printf/format
# ----------------------------------------------------------------------------------------------------------------
_LEADING_REINDEX = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*reindex\b", re.I | re.S)
_PRINTF_SPEC = re.compile(r"%([-+ #!0,l.*\d]*)(.|$)", re.S)  # flags, widths, precisions, then the conversion
_PRINTF_SIZES = re.compile(r"\*|\d+")
_LEADING_NUMBER = re.compile(r"\s*[-+]?\d+")


def _as_int(value) -> int:
    """SQLite's integer reading of a printf argument (text and blobs take their leading digits, else 0)."""
    if isinstance(value, bool) or isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        match = _LEADING_NUMBER.match(value)
        return int(match.group()) if match else 0
    return 0


def printf_too_wide(fmt, args) -> bool:
    """True when a printf format asks for a width or precision above ``PRINTF_MAX_WIDTH``.

    Every digit run and every ``*`` argument between a ``%`` and its conversion letter is checked, whatever the
    order SQLite would read them in.
    """
    if not isinstance(fmt, str) or "%" not in fmt:
        return False
    next_arg = 0
    for match in _PRINTF_SPEC.finditer(fmt):
        body, kind = match.group(1), match.group(2)
        for size in _PRINTF_SIZES.findall(body):
            if size == "*":
                value = _as_int(args[next_arg]) if next_arg < len(args) else 0
                next_arg += 1
            else:
                value = int(size)
            if abs(value) > PRINTF_MAX_WIDTH:
                return True
        if kind not in ("%", "n", ""):
            next_arg += 1
    return False


def _helper() -> sqlite3.Connection:
    """This thread's private in-memory connection, without our overrides, for SQLite's own formatting."""
    helper = getattr(_local, "helper_conn", None)
    if helper is None:
        helper = _local.helper_conn = sqlite3.connect(":memory:", check_same_thread=True)
        helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_LENGTH)
    return helper


def _plain_printf(fmt, args):
    """SQLite's own printf, run on the helper connection once the widths are known to be safe."""
    placeholders = ", ".join("?" * (len(args) + 1))
    return _helper().execute(f"SELECT printf({placeholders})", (fmt, *args)).fetchone()[0]


def _sql_text(value) -> str:
    """A value as SQLite would turn it into text (REAL formatting is SQLite's own)."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    if type(value) is bytes:
        return value.decode("utf-8", "replace")
    return _helper().execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0]


def _linear_trim(value, chars, left: bool, right: bool):
    """``trim``/``ltrim``/``rtrim`` with a character set, in linear time.

    SQLite's own compares every character with the whole set, which reaches minutes inside one opcode when both are
    near the length limit.
    """
    if value is None or chars is None:
        return None
    text, chars = _sql_text(value), _sql_text(chars)
    if len(chars) <= 64:
        return text.strip(chars) if left and right else text.lstrip(chars) if left else text.rstrip(chars)
    members = set(chars)
    start, end = 0, len(text)
    while left and start < end and text[start] in members:
        start += 1
    while right and end > start and text[end - 1] in members:
        end -= 1
    return text[start:end]


# ----------------------------------------------------------------------------------------------------------------
# The sandboxed connection
# ----------------------------------------------------------------------------------------------------------------
def _tolerant_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class SandboxConnection(sqlite3.Connection):
    """A read-only connection carrying the sandbox state of the statement being run."""

    timed_out: bool = False
    write_denied: bool = False  # the authorizer refused a write in the current statement
    denied: str | None = None  # what the authorizer refused, in words (the statement rather than its bookkeeping)
    denied_internal: bool = False
    udf_error: str | None = None  # a clear reason raised inside our own SQL functions
    label: str = ""

    def _progress(self) -> int:
        """The backstop to the watchdog: stop a statement found past its deadline (read from its ticket)."""
        ticket = _watching.get(self)
        if ticket is None:  # no statement of ``execute`` is running: nothing is under a deadline
            return 0
        try:
            if _monotonic() <= ticket[0]:
                return 0
        except IndexError:  # the watchdog has claimed the statement and is interrupting it
            return 1
        self.timed_out = True
        return 1

    def _authorize(self, action, arg1, arg2, db_name, trigger_or_view) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() not in _DENIED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            return self._deny(f"function {arg2}()", write=False)
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in _READ_ONLY_PRAGMAS:
                return sqlite3.SQLITE_OK
            assignment = arg2 is not None
            return self._deny(f"PRAGMA {arg1}" + (f" = {arg2}" if assignment else ""), write=assignment)
        if action == sqlite3.SQLITE_UPDATE and trigger_or_view is None and (arg1 or "").lower() in _SCHEMA_TABLES:
            return sqlite3.SQLITE_OK  # how SQLite builds eponymous virtual tables (json_each, pragma_table_info)
        words = _ACTION_WORDS.get(action, f"action {action}")
        target = arg2 if action == sqlite3.SQLITE_ALTER_TABLE else arg1
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            target = None
        if (target or "").lower().startswith("sqlite_"):  # SQLite's own bookkeeping behind a statement
            return self._deny("schema change", write=action in _WRITE_ACTIONS, internal=True)
        return self._deny(f"{words} {target}" if target else words, write=action in _WRITE_ACTIONS)

    def _deny(self, what: str, write: bool, internal: bool = False) -> int:
        if self.denied is None or (self.denied_internal and not internal):
            self.denied, self.denied_internal = what, internal
        self.write_denied = self.write_denied or write
        return sqlite3.SQLITE_DENY

    def _printf(self, fmt, *args):
        if printf_too_wide(fmt, args):
            self.udf_error = f"Error: printf/format width or precision above {PRINTF_MAX_WIDTH} is not allowed"
            raise ValueError(self.udf_error)
        return _plain_printf(fmt, args)


_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_ACTION_WORDS = {
    getattr(sqlite3, name): name[len("SQLITE_"):].replace("_", " ")
    for name in dir(sqlite3)
    if name.startswith("SQLITE_") and name[len("SQLITE_"):].split("_")[0]
    in {"CREATE", "DROP", "INSERT", "DELETE", "UPDATE", "ALTER", "ATTACH", "DETACH", "REINDEX", "ANALYZE", "COPY",
        "TRANSACTION", "SAVEPOINT"}
}
_ACTION_WORDS[sqlite3.SQLITE_TRANSACTION] = "transactions"
_ACTION_WORDS[sqlite3.SQLITE_SAVEPOINT] = "savepoints"


def _sandbox(conn: SandboxConnection, label: str) -> SandboxConnection:
    """Apply every sandbox layer to a freshly opened connection."""
    conn.label = label
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_LENGTH)
    for name in ("printf", "format"):
        conn.create_function(name, -1, conn._printf, deterministic=True)
    conn.create_function("trim", 2, lambda value, chars: _linear_trim(value, chars, True, True), deterministic=True)
    conn.create_function("ltrim", 2, lambda value, chars: _linear_trim(value, chars, True, False), deterministic=True)
    conn.create_function("rtrim", 2, lambda value, chars: _linear_trim(value, chars, False, True), deterministic=True)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(conn._authorize)
    conn.set_progress_handler(conn._progress, PROGRESS_INTERVAL)
    return conn


def _open_file(ref: DatabaseRef) -> SandboxConnection:
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
            factory=SandboxConnection,
        )
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now on a file that is not SQLite
    except sqlite3.Error as exc:
        raise DatabaseOpenError(f"Error: cannot open database {path}: {exc}") from None
    return conn


_local = threading.local()


def _thread_connections() -> dict:
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    return conns


def _connection(ref: DatabaseRef, purpose: str) -> SandboxConnection:
    key = (purpose, ref)
    try:
        conn = _local.conns[key]
    except (AttributeError, KeyError):  # this thread's first connection, or the first to this database
        return _open_connection(ref, purpose, key)
    if ref.schema_id is not None:
        _payloads.touch_copy(key)
    return conn


def _open_connection(ref: DatabaseRef, purpose: str, key: tuple) -> SandboxConnection:
    conns = _thread_connections()
    try:
        if ref.schema_id is not None:
            conn = _payloads.open_copy(ref.schema_id, key)
        elif ref.path:
            conn = _open_file(ref)
        else:
            raise DatabaseOpenError(f"Error: database {ref.db_id!r} has neither a file nor a registered payload")
        conns[key] = _sandbox(conn, f"{purpose}:{ref.db_id}")
    except sqlite3.Error as exc:
        _payloads.drop_copy(key)
        raise DatabaseOpenError(f"Error: cannot open database {ref.db_id!r}: {exc}") from None
    return conn


def tool_connection(ref: DatabaseRef) -> sqlite3.Connection:
    """This thread's sandboxed connection for the model's tool calls (raises DatabaseOpenError)."""
    return _connection(ref, "tool")


def scoring_connection(ref: DatabaseRef) -> sqlite3.Connection:
    """This thread's sandboxed scoring connection, separate from the tool connection (raises DatabaseOpenError)."""
    return _connection(ref, "scoring")


def close_thread_connections() -> None:
    """Close every connection this thread holds (they reopen on the next use)."""
    conns = _thread_connections()
    for key, conn in list(conns.items()):
        conn.close()
        _payloads.drop_copy(key)
    conns.clear()


# ----------------------------------------------------------------------------------------------------------------
# The deadline watchdog
# ----------------------------------------------------------------------------------------------------------------
# A statement being run is watched through its *ticket*, a one-element list ``[deadline]`` made for that statement
# alone and listed in ``_watching`` under its connection. A ticket is emptied exactly once (``list.pop`` is atomic under
# the GIL): by the statement when it ends, or by the watchdog when it claims an overdue statement to interrupt it.
#
# Why an interrupt can never reach a later statement:
# 1. the watchdog calls ``interrupt()`` only for a ticket it emptied itself, and only while holding ``_interrupt_lock``,
#    taken before it emptied the ticket;
# 2. ``execute`` returns only after emptying its ticket itself (the watchdog's claim then fails, so nothing is
#    interrupted for that statement), or, when the watchdog emptied it first, after taking ``_interrupt_lock``, that
#    is once the watchdog's ``interrupt()`` has returned;
# 3. a connection belongs to one thread, so its next statement starts only after ``execute`` returned.
# So every ``interrupt()`` call ends while its own statement is still inside ``execute``. One that lands after the
# statement finished, with nothing running on the connection, is cleared by SQLite when the next statement starts.
# Statements take no lock on the usual path: a dict write to start, a list pop and a dict pop to end.
_watch_lock = threading.Lock()  # starting the watchdog thread
_interrupt_lock = threading.Lock()  # held by the watchdog from claiming a ticket until its interrupt() has returned
_watching: dict[SandboxConnection, list] = {}  # connection -> ticket [deadline] of the statement it is running
_watchdog_started = False


def _start_watchdog() -> None:
    global _watchdog_started
    with _watch_lock:
        if not _watchdog_started:
            threading.Thread(target=_watchdog, name="t2s-sql-deadlines", daemon=True).start()
            _watchdog_started = True


def _watchdog() -> None:
    """Interrupt every statement past its deadline (see the ticket rules above)."""
    while True:
        time.sleep(WATCHDOG_POLL)
        now = time.monotonic()
        for conn, ticket in list(_watching.items()):  # a snapshot: statements start and end meanwhile
            try:
                if now <= ticket[0]:
                    continue
            except IndexError:  # the statement has ended
                continue
            with _interrupt_lock:
                try:
                    ticket.pop()  # the claim; it fails once the statement has ended
                except IndexError:
                    continue
                conn.timed_out = True
                try:
                    conn.interrupt()
                except sqlite3.Error:
                    pass


def _reset_watchdog_in_child() -> None:
    """A forked child has no watchdog thread, and may hold a copy of a lock that was taken at the fork."""
    global _watch_lock, _interrupt_lock, _watching, _watchdog_started
    _watch_lock, _interrupt_lock, _watching, _watchdog_started = threading.Lock(), threading.Lock(), {}, False


os.register_at_fork(after_in_child=_reset_watchdog_in_child)


# ----------------------------------------------------------------------------------------------------------------
# Executing
# ----------------------------------------------------------------------------------------------------------------
def _error_text(exc: Exception, conn: SandboxConnection, timeout: float) -> tuple[str, bool, bool]:
    """(message, timed_out, write_attempt) for an exception raised while running a statement."""
    message = str(exc)
    lowered = message.lower()
    if conn.timed_out:
        return f"Error: query timed out after {timeout:g} s", True, False
    if conn.udf_error:
        return conn.udf_error, False, False
    if isinstance(exc, sqlite3.ProgrammingError) and "one statement at a time" in lowered:
        return "Error: only one SQL statement per call is allowed", False, False
    if isinstance(exc, (sqlite3.Warning, sqlite3.ProgrammingError)) and "one statement" in lowered:
        return "Error: only one SQL statement per call is allowed", False, False
    if conn.write_denied or any(marker in lowered for marker in _WRITE_ERROR_MARKERS):
        return f"Error: the database is read-only; writes are not allowed ({conn.denied or message})", False, True
    if conn.denied is not None:
        return f"Error: not allowed in the read-only sandbox: {conn.denied}", False, False
    return f"Error: {message}", False, False


def _cell_bytes(rows) -> int:
    """Approximate bytes of fetched rows (their marshalled size: text and blob lengths plus a few bytes a cell)."""
    return len(marshal.dumps(rows))


def _fetch(cursor, max_cells, max_bytes) -> tuple[list, bool, bool]:
    """(rows, more, over_cap) of a full read, in batches, stopping past ``max_cells`` cells or about ``max_bytes``."""
    if max_cells is None and max_bytes is None:
        return cursor.fetchall(), False, False
    width = max(1, len(cursor.description or ()))
    rows: list = []
    size = 0
    while True:
        batch_size = FETCH_BATCH
        if max_bytes is not None:  # a batch can never hold much more than the bytes still allowed
            batch_size = min(FETCH_BATCH, max(16, (max_bytes - size) // (width * MAX_VALUE_LENGTH)))
        batch = cursor.fetchmany(batch_size)
        if not batch:
            return rows, False, False
        rows.extend(batch)
        if max_cells is not None and len(rows) * width > max_cells:
            return rows[: max_cells // width], True, True
        if max_bytes is not None:
            size += _cell_bytes(batch)
            if size > max_bytes:
                return rows, True, True
        if len(batch) < batch_size:  # a short batch: the statement has no rows left
            return rows, False, False


_first = operator.itemgetter(0)  # a column's name in cursor.description
_clock, _monotonic = time.perf_counter, time.monotonic


def _run(conn, sql, max_rows, max_cells, max_bytes) -> tuple[list, list, bool, bool]:
    """(columns, rows, more, over_cap) of one statement; a statement without a result has no columns.

    With ``max_rows`` (a tool query) one ``fetchmany(max_rows + 1)`` reads the rows; else ``_fetch`` reads them all.
    """
    cursor = conn.execute(sql)
    description = cursor.description
    if description is None:
        cursor.close()
        return [], [], False, False
    if max_rows is not None:
        if type(max_rows) is not int or max_rows < 0:
            max_rows = max(0, int(max_rows))
        rows = cursor.fetchmany(max_rows + 1)
        cursor.close()
        if len(rows) > max_rows:
            return list(map(_first, description)), rows[:max_rows], True, False
        return list(map(_first, description)), rows, False, False
    rows, more, over_cap = _fetch(cursor, max_cells, max_bytes)
    cursor.close()
    return list(map(_first, description)), rows, more, over_cap


def execute(
    conn: sqlite3.Connection,
    sql: str,
    *,
    timeout: float,
    max_rows: int | None,
    max_cells: int | None = None,
    max_bytes: int | None = None,
) -> QueryResult:
    """Run one statement under the sandbox and a wall-clock deadline. Never raises.

    ``max_rows`` bounds the fetch (``fetchmany(max_rows + 1)``, then ``more`` tells whether rows were left);
    ``None`` fetches everything, stopping with ``over_cap`` past ``max_cells`` cells or about ``max_bytes`` bytes.
    """
    started = _clock()
    if not isinstance(sql, str) or not sql or sql.isspace():
        return QueryResult(error="Error: empty SQL")
    if not isinstance(conn, SandboxConnection):
        return QueryResult(
            error="Error: queries run only on sandboxed connections (tool_connection / scoring_connection)"
        )
    # A REINDEX of a database without indexes never reaches the authorizer. A statement that starts with a letter
    # other than r cannot be one (the pattern allows only whitespace and comments before the keyword).
    first = sql[0]
    if (first in "rR" or not first.isalpha()) and _LEADING_REINDEX.match(sql):
        return QueryResult(
            error="Error: the database is read-only; writes are not allowed (REINDEX)", write_attempt=True
        )
    try:
        ticket = [_monotonic() + max(0.0, float(timeout))]  # this statement's alone (see the ticket rules above)
    except (TypeError, ValueError):
        return QueryResult(error=f"Error: the timeout must be a number of seconds, got {timeout!r}")
    try:
        conn.timed_out = conn.write_denied = False
        conn.denied = conn.udf_error = None
        if not _watchdog_started:
            _start_watchdog()
        _watching[conn] = ticket
        try:
            columns, rows, more, over_cap = _run(conn, sql, max_rows, max_cells, max_bytes)
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith("Could not decode to UTF-8"):
                raise
            conn.text_factory = _tolerant_text  # rare: run it again, decoding invalid UTF-8 with replacement
            try:
                columns, rows, more, over_cap = _run(conn, sql, max_rows, max_cells, max_bytes)
            finally:
                conn.text_factory = str
        error = "Error: empty SQL" if not columns and _only_comments(sql) else None
        result = QueryResult(columns, rows, more, error, False, False, over_cap)
    except Exception as exc:  # noqa: BLE001 - a query must never raise into the rollout
        error, timed_out, write_attempt = _error_text(exc, conn, timeout)
        result = QueryResult(error=error, timed_out=timed_out, write_attempt=write_attempt)
    finally:
        try:
            ticket.pop()  # ended before any claim: the watchdog will not interrupt for this statement
        except IndexError:  # the watchdog claimed it: wait until its interrupt() has returned
            with _interrupt_lock:
                pass
        _watching.pop(conn, None)
    result.seconds = _clock() - started
    return result


def _only_comments(sql: str) -> bool:
    stripped = re.sub(r"--[^\n]*|/\*.*?(\*/|$)", " ", sql, flags=re.S).strip().strip(";").strip()
    return not stripped


def _failed(message: str) -> QueryResult:
    return QueryResult(error=message)


def run_tool_query(ref: DatabaseRef, sql: str, *, max_rows: int, timeout: float | None = None) -> QueryResult:
    """A model's query on this thread's tool connection, fetching at most ``max_rows`` (+1 to see if more exist).

    ``timeout`` defaults to ``TOOL_TIMEOUT``.
    """
    try:
        conn = _connection(ref, "tool")
    except DatabaseOpenError as exc:
        return _failed(str(exc))
    return execute(conn, sql, timeout=TOOL_TIMEOUT if timeout is None else timeout, max_rows=max_rows)


def run_scoring_query(ref: DatabaseRef, sql: str, *, timeout: float) -> QueryResult:
    """A query to score, on this thread's scoring connection: the full result, under the scoring caps."""
    try:
        conn = _connection(ref, "scoring")
    except DatabaseOpenError as exc:
        return _failed(str(exc))
    return execute(conn, sql, timeout=timeout, max_rows=None, max_cells=SCORING_MAX_CELLS, max_bytes=SCORING_MAX_BYTES)


def scoring_timeout(gold_seconds: float) -> float:
    """The prediction's deadline: max(SCORING_MIN_TIMEOUT, SCORING_GOLD_FACTOR x gold time), capped."""
    return min(SCORING_MAX_TIMEOUT, max(SCORING_MIN_TIMEOUT, SCORING_GOLD_FACTOR * float(gold_seconds)))


# ----------------------------------------------------------------------------------------------------------------
# File identity and gold results
# ----------------------------------------------------------------------------------------------------------------
def file_checksum(path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_hash_lock = threading.Lock()
_file_hashes: dict[tuple, str] = {}


_immutable_hashes: dict[DatabaseRef, str] = {}  # benchmark files opened immutable: SQLite assumes they never change


def database_hash(ref: DatabaseRef) -> str:
    """A content hash of the database, computed once per (path, size, mtime) and then cached.

    A file opened ``immutable`` is never looked at again: its first hash stays its hash, as SQLite assumes too.
    """
    if ref.schema_id is not None:
        return "payload:" + _payloads.digest(ref.schema_id)
    if ref.immutable:
        found = _immutable_hashes.get(ref)
        if found is None:
            found = _file_hash(ref)
            if not found.startswith("missing:"):  # a file that appears later is hashed then
                _immutable_hashes[ref] = found
        return found
    return _file_hash(ref)


def _file_hash(ref: DatabaseRef) -> str:
    try:
        stat = os.stat(ref.path)
    except OSError:
        return f"missing:{ref.path}"
    key = (ref.path, stat.st_size, stat.st_mtime_ns)
    found = _file_hashes.get(key)
    if found is None:
        with _hash_lock:
            found = _file_hashes.get(key)
            if found is None:
                found = _file_hashes[key] = file_checksum(ref.path)
    return found


class ByteLRU:
    """A thread-safe least-recently-used map bounded by the approximate byte size of its values."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.total = 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        item = self._items.get(key)  # one C call, atomic under the GIL: a hit takes no lock
        if item is None:
            return None
        try:
            self._items.move_to_end(key)
        except KeyError:  # evicted meanwhile by another thread: the value read is still good
            pass
        return item[0]

    def put(self, key, value, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.total -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.total += size
            while self.total > self.max_bytes and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self.total -= dropped

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.total = 0


_gold_cache = ByteLRU(GOLD_CACHE_BYTES)


def _result_size(result: QueryResult) -> int:
    return 256 + _cell_bytes(result.rows)


def gold_result(ref: DatabaseRef, gold_sql: str) -> QueryResult:
    """The gold SQL's result on a clean scoring connection, cached by (database hash, SQL).

    ``seconds`` is the gold's own run time (of its first, uncached run). Timeouts are not cached.
    """
    key = (database_hash(ref), gold_sql)
    cached = _gold_cache.get(key)
    if cached is not None:
        return cached
    result = run_scoring_query(ref, gold_sql, timeout=SCORING_MAX_TIMEOUT)
    if not result.timed_out:
        _gold_cache.put(key, result, _result_size(result))
    return result


# ----------------------------------------------------------------------------------------------------------------
# Row-payload databases (SQaLe-style: DDL plus rows as JSON)
# ----------------------------------------------------------------------------------------------------------------
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _payload_value(value):
    if value is None or isinstance(value, (str, bytes, float)):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return min(_INT64_MAX, max(_INT64_MIN, value))
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _ddl_statements(ddl) -> list[str]:
    """A DDL script (or a list of statements) as single statements, comment-only pieces dropped.

    The script is cut after every ``;`` and the pieces are joined again until ``sqlite3.complete_statement`` says
    they end a statement, so a ``;`` inside a string, a comment or a trigger body does not cut. A broken statement
    (an unbalanced parenthesis, an unknown keyword) ends at its own ``;`` and fails alone. A piece that never
    completes (an unterminated quote or comment swallowing the rest) is taken alone, and splitting resumes after it.
    """
    if isinstance(ddl, (list, tuple)):
        pieces = [str(part) for part in ddl]
    else:
        parts = str(ddl or "").split(";")
        chunks = [part + ";" for part in parts[:-1]] + [parts[-1]]
        pieces, start = [], 0
        while start < len(chunks):
            buffer, end = "", start
            while end < len(chunks):
                buffer += chunks[end]
                end += 1
                if sqlite3.complete_statement(buffer):
                    break
            else:
                if end - start > 1:  # never completed: take the first piece alone and resume after it
                    buffer, end = chunks[start], start + 1
            pieces.append(buffer)
            start = end
    return [piece for piece in pieces if not _only_comments(piece)]


def _quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def build_payload_image(ddl, rows: dict | None) -> tuple[bytes, dict]:
    """Build a row-payload database in memory and serialise it: (image, counts of what was kept and skipped)."""
    counts = {"ddl_ok": 0, "ddl_skipped": 0, "rows": 0, "rows_skipped": 0, "tables_skipped": 0}
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("PRAGMA user_version = 0")  # writes the header page, so a schema with no table still serialises
        for statement in _ddl_statements(ddl):
            try:
                conn.execute(statement)
                counts["ddl_ok"] += 1
            except (sqlite3.Error, sqlite3.Warning):
                counts["ddl_skipped"] += 1
        tables = {
            name.lower(): name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        }
        conn.execute("BEGIN")
        for table_name, table_rows in (rows or {}).items():
            table = tables.get(str(table_name).lower())
            if table is None or not isinstance(table_rows, list):
                counts["tables_skipped"] += 1
                continue
            columns = {str(info[1]).lower(): info[1] for info in conn.execute(f"PRAGMA table_info({_quote(table)})")}
            for row in table_rows:
                if not isinstance(row, dict):
                    counts["rows_skipped"] += 1
                    continue
                kept = [(columns[str(k).lower()], v) for k, v in row.items() if str(k).lower() in columns]
                if not kept:
                    counts["rows_skipped"] += 1
                    continue
                names = ", ".join(_quote(name) for name, _ in kept)
                marks = ", ".join("?" * len(kept))
                try:
                    conn.execute(
                        f"INSERT OR IGNORE INTO {_quote(table)} ({names}) VALUES ({marks})",
                        [_payload_value(value) for _, value in kept],
                    )
                    counts["rows"] += 1
                except (sqlite3.Error, OverflowError, ValueError):
                    counts["rows_skipped"] += 1
        conn.execute("COMMIT")
        return conn.serialize(), counts
    finally:
        conn.close()


class _PayloadStore:
    """Serialised row-payload images and the byte count of every thread's deserialised copy."""

    def __init__(self):
        self._lock = threading.Lock()
        self._images: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self.total = 0  # images plus live copies

    def register(self, schema_id: str, image: bytes) -> None:
        with self._lock:
            old = self._images.pop(schema_id, None)
            if old is not None:
                self.total -= len(old[0])
            self._images[schema_id] = (image, hashlib.sha256(image).hexdigest())
            self.total += len(image)
            self._evict_images_locked(keep=schema_id)

    def _evict_images_locked(self, keep: str) -> None:
        while self.total > PAYLOAD_CACHE_BYTES and len(self._images) > 1:
            oldest = next(iter(self._images))
            if oldest == keep:
                self._images.move_to_end(oldest)
                oldest = next(iter(self._images))
            image, _ = self._images.pop(oldest)
            self.total -= len(image)

    def has(self, schema_id: str) -> bool:
        with self._lock:
            return schema_id in self._images

    def digest(self, schema_id: str) -> str:
        with self._lock:
            item = self._images.get(schema_id)
        return item[1] if item else f"unregistered:{schema_id}"

    def open_copy(self, schema_id: str, key) -> SandboxConnection:
        """Deserialise this thread's own copy of a registered image, for the connection stored under ``key``."""
        with self._lock:
            item = self._images.get(schema_id)
            if item is not None:
                self._images.move_to_end(schema_id)
        if item is None:
            raise DatabaseOpenError(f"Error: row-payload database {schema_id!r} is not registered in this process")
        image = item[0]
        self._make_room(len(image))
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True, factory=SandboxConnection)
        conn.deserialize(image)
        _thread_copies()[key] = len(image)
        with self._lock:
            self.total += len(image)
        return conn

    def touch_copy(self, key) -> None:
        copies = _thread_copies()
        if key in copies:
            copies.move_to_end(key)

    def drop_copy(self, key) -> None:
        size = _thread_copies().pop(key, 0)
        if size:
            with self._lock:
                self.total -= size

    def _make_room(self, size: int) -> None:
        """Close this thread's least recently used copies while the store is over its bound."""
        copies = _thread_copies()
        conns = _thread_connections()
        while copies and self.total + size > PAYLOAD_CACHE_BYTES:
            oldest = next(iter(copies))
            conn = conns.pop(oldest, None)
            if conn is not None:
                conn.close()
            self.drop_copy(oldest)


class _ThreadCopies(OrderedDict):
    """One thread's deserialised payload copies (connection key -> bytes); released when the thread ends."""

    def __del__(self):
        released = sum(self.values())
        if released:
            with _payloads._lock:
                _payloads.total -= released


def _thread_copies() -> _ThreadCopies:
    copies = getattr(_local, "payload_copies", None)
    if copies is None:
        copies = _local.payload_copies = _ThreadCopies()
    return copies


_payloads = _PayloadStore()


_payload_sources: dict[str, str] = {}  # schema id -> digest of the DDL and rows it was registered with (never evicted)
_sources_lock = threading.Lock()


def payload_source_digest(ddl, rows: dict | None) -> str:
    """SHA-256 of what a row-payload database is built from: its DDL and its rows (key order does not matter)."""
    document = [list(map(str, ddl)) if isinstance(ddl, (list, tuple)) else str(ddl or ""), rows or {}]
    try:
        text = json.dumps(document, sort_keys=True, ensure_ascii=False, default=repr)
    except TypeError:  # keys that cannot be sorted together
        text = repr(document)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def register_payload(schema_id: str, ddl, rows: dict | None, *, max_bytes: int = PAYLOAD_MAX_BYTES) -> DatabaseRef:
    """Build a row-payload database once (FKs off, failing DDL skipped, INSERT OR IGNORE) and register it.

    A schema with no surviving table builds an empty database: its questions load and their queries fail with
    ``Error: no such table``. Registering an id again with the same DDL and rows returns at once (an evicted image
    is rebuilt); with different DDL or rows it raises ValueError (``Error: ...``), since queries, schemas and cached
    gold results would otherwise mix the two databases under one id. Also raises ValueError when the built database
    is larger than ``max_bytes``.
    """
    schema_id = str(schema_id)
    ref = DatabaseRef(db_id=schema_id, schema_id=schema_id)
    source = payload_source_digest(ddl, rows)
    with _sources_lock:
        known = _payload_sources.get(schema_id)
        if known is None:
            _payload_sources[schema_id] = source  # claimed now; released again if the build fails
    if known is not None and known != source:
        raise ValueError(
            f"Error: row-payload database {schema_id!r} is already registered with different DDL or rows; "
            "give each distinct schema its own id"
        )
    if known is not None and _payloads.has(schema_id):
        return ref
    try:
        image, _counts = build_payload_image(ddl, rows)
        if len(image) > max_bytes:
            raise ValueError(f"Error: row-payload database {schema_id!r} is {len(image)} bytes, above {max_bytes}")
    except BaseException:
        if known is None:
            with _sources_lock:
                _payload_sources.pop(schema_id, None)
        raise
    _payloads.register(schema_id, image)
    return ref
