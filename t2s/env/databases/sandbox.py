"""The sandboxed connection: limits, the authorizer's allowlist and the replaced SQL functions.

* **Limits.** ``SQLITE_LIMIT_ATTACHED`` is 0 and ``SQLITE_LIMIT_LENGTH`` about 1e6, so blob and string blow-ups fail at
  once; statements and LIKE/GLOB patterns are bounded too. ``printf``/``format`` are replaced by versions that refuse
  huge widths and precisions, and ``trim``, ``instr`` and ``replace`` by linear ones
  (:mod:`t2s.env.databases.functions`), which also stop a statement past its deadline (see
  :mod:`t2s.env.databases.rowcost`).
* **Authorizer allowlist.** SELECT, READ, RECURSIVE, functions other than ``load_extension``/``fts3_tokenizer``,
  read-only introspection PRAGMAs, and the ``UPDATE sqlite_master`` that SQLite issues (with no trigger context) to
  build eponymous virtual tables such as ``json_each``. Everything else is denied, transactions included.
* **Virtual tables, connected first.** An R*Tree or full-text table prepares its own statements, writes to its shadow
  tables among them, when a connection first reads it, and the authorizer cannot tell those from a query's own, so a
  plain SELECT of one would be refused as a write. Each virtual table the file declares is read once (``LIMIT 0``)
  before the authorizer is set; a query's writes to it are still refused, since its INSERT, UPDATE or DELETE is the
  query's own. FTS5 also prepares ``PRAGMA data_version`` (a read-only counter) at every query, so that PRAGMA is
  allowed. The reads are bounded in time (``LIMITS.virtual_tables_timeout``).
* **Deadlines.** The progress handler is the backstop of :mod:`t2s.env.databases.deadlines`.
"""

from __future__ import annotations

import sqlite3
import time

from t2s.env.databases import deadlines, limits
from t2s.env.databases.functions import (
    ValueTooLong,
    linear_instr,
    linear_replace,
    linear_trim,
    plain_printf,
    printf_too_wide,
)

_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})
_READ_ONLY_PRAGMAS = frozenset(  # and data_version, a counter FTS5 prepares and reads at every query of its tables
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list", "data_version"}
)
MAX_VIRTUAL_TABLES = 256  # connected before the authorizer; a read of any further one is refused as before
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


class SandboxConnection(sqlite3.Connection):
    """A read-only connection carrying the sandbox state of the statement being run."""

    timed_out: bool = False
    write_denied: bool = False  # the authorizer refused a write in the current statement
    denied: str | None = None  # what the authorizer refused, in words (the statement rather than its bookkeeping)
    denied_internal: bool = False
    udf_error: str | None = None  # a clear reason raised inside our own SQL functions
    label: str = ""
    file_state: tuple | None = None  # a file read without locks: its state when opened (opening.unlocked_state)
    snapshot = None  # a file read through its -wal: the temporary folder holding the copy read (opening.open_file)
    stored_key = None  # a file's (path, size, mtime, state): the key of what rowcost.value_cap learns of it
    longest_stored = None  # what rowcost.value_cap learned of a database that has no stored_key

    def _progress(self) -> int:
        return deadlines.progress_check(self)

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

    def _check_deadline(self) -> None:
        """Stop the statement when it is past its deadline: SQLite checks only between rows, our functions check at
        every call."""
        if deadlines.progress_check(self):
            raise TimeoutError("past the deadline")

    def _printf(self, fmt, *args):
        self._check_deadline()
        if printf_too_wide(fmt, args):
            most = limits.LIMITS.printf_max_width
            self.udf_error = f"Error: printf/format width or precision above {most} is not allowed"
            raise ValueError(self.udf_error)
        return plain_printf(fmt, args)

    def _trim(self, left: bool, right: bool):
        def trim(value, chars):
            self._check_deadline()
            return linear_trim(value, chars, left, right)

        return trim

    def _instr(self, haystack, needle):
        self._check_deadline()
        return linear_instr(haystack, needle)

    def _replace(self, value, old, new):
        self._check_deadline()
        try:
            return linear_replace(value, old, new, self.getlimit(sqlite3.SQLITE_LIMIT_LENGTH))
        except ValueTooLong as exc:
            self.udf_error = str(exc)
            raise


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


def apply_sandbox(conn: SandboxConnection, label: str) -> SandboxConnection:
    """Apply every sandbox layer to a freshly opened connection."""
    bounds = limits.LIMITS
    conn.label = label
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bounds.max_value_length)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, bounds.max_sql_length)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, bounds.max_like_pattern)
    for name in ("printf", "format"):
        conn.create_function(name, -1, conn._printf, deterministic=True)
    conn.create_function("trim", 2, conn._trim(True, True), deterministic=True)
    conn.create_function("ltrim", 2, conn._trim(True, False), deterministic=True)
    conn.create_function("rtrim", 2, conn._trim(False, True), deterministic=True)
    conn.create_function("instr", 2, conn._instr, deterministic=True)
    conn.create_function("replace", 3, conn._replace, deterministic=True)
    conn.execute("PRAGMA query_only = ON")
    _connect_virtual_tables(conn)
    conn.set_authorizer(conn._authorize)
    conn.set_progress_handler(conn._progress, bounds.progress_interval)
    return conn


def _connect_virtual_tables(conn: SandboxConnection) -> None:
    """Read each virtual table the file declares once, before the authorizer is set (module docstring), all within
    ``LIMITS.virtual_tables_timeout`` seconds (a file can put a view where a table's shadow table belongs, and that
    view runs when the table connects). One that cannot be read in time, or at all (a module this SQLite lacks, a
    damaged table), is left for the query that names it, under that query's deadline and the authorizer."""
    deadline = time.monotonic() + limits.LIMITS.virtual_tables_timeout
    try:
        names = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' LIMIT ?",
            (MAX_VIRTUAL_TABLES,))]
    except sqlite3.Error:
        return
    for name in names:
        if not isinstance(name, str) or time.monotonic() >= deadline:
            continue
        ticket = [deadline]
        deadlines.start_watching(conn, ticket)
        try:
            conn.execute('SELECT 1 FROM "{}" LIMIT 0'.format(name.replace('"', '""'))).fetchall()
        except (sqlite3.Error, ValueError, MemoryError):
            continue
        finally:
            deadlines.stop_watching(conn, ticket)
    conn.timed_out = False
