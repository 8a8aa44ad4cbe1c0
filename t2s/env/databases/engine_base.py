"""What the DuckDB and PostgreSQL engines share: their names, values normalised to what sqlite3 returns, the capped
fetch, and the connection every engine's statements run on.

**Values.** Metrics and rewards compare cells exactly as Python's sqlite3 gives them: ``int``, ``float``, ``str``,
``bytes`` or ``None``. Other engines return richer types, so every fetched row is normalised here, once:

* ``Decimal`` (DuckDB's DECIMAL, PostgreSQL's ``numeric``, the type of ``SUM``/``AVG`` over integers there): an ``int``
  when it is whole, else the nearest ``float``; so ``SUM`` gives ``15`` on all three engines, and ``AVG`` a float;
* ``bool``: ``1`` or ``0`` (SQLite has no booleans: its comparisons give integers);
* dates, times and timestamps: ISO text (``2024-05-01``, ``2024-05-01 10:00:00``), as SQLite stores them;
* intervals, UUIDs, lists, structs, JSON and any other type: their text (``str``); ``memoryview``/``bytearray``:
  ``bytes``.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re

from t2s.env.databases.results import QueryResult, fetch_all, tool_caps

ENGINES = ("sqlite", "duckdb", "postgres")
ENGINE_NAMES = {"sqlite": "SQLite", "duckdb": "DuckDB", "postgres": "PostgreSQL"}  # the SQL dialect, in words
SQLGLOT_DIALECTS = {"sqlite": "sqlite", "duckdb": "duckdb", "postgres": "postgres"}


def check_engine(engine) -> str:
    if engine not in ENGINES:
        raise ValueError(f"Error: unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    return engine


_PLAIN = (int, float, str, bytes, type(None))


def normalise_value(value):
    """One cell as sqlite3 would give it (see the module's docstring)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is bool:
        return int(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return float(value)
        whole = value.to_integral_value()
        return int(whole) if whole == value else float(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (memoryview, bytearray)):
        return bytes(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, (int, float, str)):  # subclasses (numpy scalars, enums)
        return value
    return str(value)


def normalise_rows(rows) -> list[tuple]:
    out = []
    for row in rows:
        for value in row:
            if type(value) not in _PLAIN:
                row = tuple(map(normalise_value, row))
                break
        else:
            row = tuple(row)
        out.append(row)
    return out


def fetch_capped(cursor, max_rows, max_cells, max_bytes) -> tuple[list, bool, bool]:
    """(rows, more, over_cap), normalised, as ``results.fetch_all`` reads them: a tool query's ``max_rows`` under
    ``results.tool_caps``, else stopping past ``max_cells`` cells or about ``max_bytes`` bytes."""
    if max_rows is not None:
        max_rows, max_cells, max_bytes = tool_caps(max_rows)
    return fetch_all(cursor, max_cells, max_bytes, normalise_rows, max_rows=max_rows)


class EngineConnection:
    """A sandboxed connection of an engine other than SQLite, owned by one thread.

    ``run`` executes one statement and returns a :class:`QueryResult` (it may raise; ``engines.run_query`` turns that
    into an ``Error:``). ``interrupt`` is what the deadline watchdog calls from its own thread; it never raises.
    """

    engine = ""
    timed_out = False
    label = ""
    conn = None  # the driver's connection

    def run(self, sql: str, timeout: float, max_rows, max_cells, max_bytes) -> QueryResult:
        raise NotImplementedError

    def error(self, exc: Exception, timeout: float) -> QueryResult:
        """The result of a statement that raised ``exc``."""
        if self.timed_out:
            return QueryResult(error=f"Error: query timed out after {timeout:g} s", timed_out=True)
        message = " ".join(str(exc).split()) or type(exc).__name__
        return QueryResult(error=f"Error: {message}")

    def interrupt(self) -> None:
        try:
            self._interrupt()
        except Exception:  # noqa: BLE001 - the statement may have just ended
            pass

    def _interrupt(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - a connection already lost
            pass

    def read_catalog(self) -> Catalog:
        raise NotImplementedError


class Catalog:
    """What the schema tools read from an engine's catalog: tables in order, one-line DDL, columns with their types,
    foreign keys ``(src_table, src_col, dst_table, dst_col)`` and column comments ``{table: {column: text}}``."""

    def __init__(self, tables, ddl, columns, fks, comments=None):
        self.tables, self.ddl, self.columns, self.fks = tables, ddl, columns, fks
        self.comments = comments or {}


def refused(reason: str, write: bool = False) -> QueryResult:
    """A statement the sandbox does not run: a write attempt, or something else it does not allow."""
    if write:
        return QueryResult(error=f"Error: the database is read-only; writes are not allowed ({reason})",
                           write_attempt=True)
    return QueryResult(error=f"Error: not allowed in the read-only sandbox: {reason}")


_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = frozenset(
    """abort action add after all alter analyze and as asc attach autoincrement before begin between by cascade case
    cast check collate column commit conflict constraint create cross current current_date current_time
    current_timestamp database default deferrable deferred delete desc detach distinct do drop each else end escape
    except exclusive exists explain fail filter for foreign from full glob group having if ignore immediate in index
    indexed initially inner insert instead intersect into is isnull join key left like limit match natural no not
    nothing notnull null of offset on or order outer over plan pragma primary query raise recursive references regexp
    reindex release rename replace restrict returning right rollback row rows savepoint select set table temp temporary
    then to transaction trigger union unique update using vacuum values view virtual when where window with
    without""".split()
)


# Words DuckDB and PostgreSQL reserve beyond SQLite's list above.
_SERVER_RESERVED = _RESERVED | frozenset(
    """analyse any array asymmetric authorization binary both cast current_catalog current_role current_schema
    current_user fetch freeze grant ilike lateral leading localtime localtimestamp only overlaps placing returning
    session_user similar some symmetric tablesample trailing true false user variadic verbose""".split()
)


def quote_identifier(name: str, engine: str = "sqlite") -> str:
    """``name`` as written when it is a plain, non-reserved identifier, else double-quoted safely. On PostgreSQL and
    DuckDB a name with capitals is quoted too (PostgreSQL folds bare names to lowercase)."""
    if engine == "sqlite":
        if _PLAIN_IDENTIFIER.fullmatch(name) and name.lower() not in _RESERVED:
            return name
    elif _PLAIN_IDENTIFIER.fullmatch(name) and name == name.lower() and name not in _SERVER_RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


def quote(name: str) -> str:
    """A double-quoted identifier (DuckDB and PostgreSQL)."""
    return '"' + str(name).replace('"', '""') + '"'
