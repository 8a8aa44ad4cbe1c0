"""The engine layer: one interface over SQLite files, DuckDB files and PostgreSQL databases.

A :class:`~t2s.env.databases.opening.DatabaseRef` names its engine (``ref.engine``). Everything above this module (the
tools, schema, episode, rewards, metrics and scoring) runs statements through ``run_tool_query``/``run_scoring_query``
and reads schemas through :func:`read_catalog`, whatever the engine. SQLite keeps its own sandbox
(:mod:`~t2s.env.databases.sandbox`); DuckDB and PostgreSQL run on an :class:`EngineConnection`
(:mod:`~t2s.env.databases.duckdb_engine`, :mod:`~t2s.env.databases.postgres_engine`) under the same deadlines
(:mod:`~t2s.env.databases.deadlines`' watchdog), caps and value normalisation (:mod:`~t2s.env.databases.engine_base`).
Each thread keeps its own connection per (purpose, database), as for SQLite (:mod:`~t2s.env.databases.connections`).
"""

from __future__ import annotations

import hashlib
import time

from t2s.env.databases import deadlines, limits
from t2s.env.databases.connections import connection
from t2s.env.databases.engine_base import Catalog
from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef
from t2s.env.databases.results import QueryResult

_clock, _monotonic = time.perf_counter, time.monotonic


def run_query(ref: DatabaseRef, purpose: str, sql, *, timeout: float, max_rows: int | None,
              max_cells: int | None = None, max_bytes: int | None = None) -> QueryResult:
    """One statement on ``ref``'s engine under a deadline and the caps; never raises (see ``executing.execute``)."""
    started = _clock()
    if not isinstance(sql, str) or not sql.strip():
        return QueryResult(error="Error: empty SQL")
    max_length = limits.LIMITS.max_sql_length
    if len(sql) > max_length:
        return QueryResult(error=f"Error: the SQL is longer than {max_length} characters")
    try:
        conn = connection(ref, purpose)
    except DatabaseOpenError as exc:
        return QueryResult(error=str(exc))
    try:
        ticket = [_monotonic() + max(0.0, float(timeout))]
    except (TypeError, ValueError):
        return QueryResult(error=f"Error: the timeout must be a number of seconds, got {timeout!r}")
    conn.timed_out = False
    deadlines.start_watching(conn, ticket)
    try:
        result = conn.run(sql, timeout, max_rows, max_cells, max_bytes)
    except Exception as exc:  # noqa: BLE001 - a query must never raise into the rollout
        result = conn.error(exc, timeout)
    finally:
        deadlines.stop_watching(conn, ticket)
    if result.error is None and not result.columns:
        result.error = "Error: the statement returned no rows or columns"
    result.seconds = _clock() - started
    return result


def read_catalog(ref: DatabaseRef) -> Catalog:
    """The tables, DDL, columns, foreign keys and comments of a DuckDB or PostgreSQL database (raises
    DatabaseOpenError when it cannot be opened)."""
    conn = connection(ref, "tool")
    try:
        return conn.read_catalog()
    except Exception as exc:  # noqa: BLE001
        message = " ".join(str(exc).split())
        raise DatabaseOpenError(f"Error: cannot read the catalog of {ref.db_id!r}: {message}") from None


def server_hash(ref: DatabaseRef) -> str:
    """What keys a PostgreSQL database's cached gold results: its server and database (its password left out)."""
    from t2s.env.databases.postgres_engine import redact

    return "postgres:" + hashlib.sha256(redact(ref.path).encode("utf-8")).hexdigest()


def server_databases(dsn: str) -> set[str]:
    """The names of the databases on the PostgreSQL server at ``dsn`` (raises DatabaseOpenError)."""
    from t2s.env.databases.postgres_engine import connect, redact

    try:
        with connect(dsn) as conn:
            return {row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datallowconn")}
    except ImportError as exc:
        raise DatabaseOpenError(f"Error: the postgres engine needs the {exc.name} package") from None
    except Exception as exc:  # noqa: BLE001
        raise DatabaseOpenError(f"Error: cannot reach the PostgreSQL server {redact(dsn)}: "
                                f"{' '.join(str(exc).split())}") from None
