"""The engine layer: one interface over SQLite files, DuckDB files and PostgreSQL databases.

A :class:`~t2s.env.databases.opening.DatabaseRef` names its engine (``ref.engine``). Everything above this module (the
tools, schema, episode, rewards, metrics and scoring) runs statements through ``run_tool_query``/``run_scoring_query``
and reads schemas through :func:`read_catalog`, whatever the engine. SQLite keeps its own sandbox
(:mod:`~t2s.env.databases.sandbox`); DuckDB and PostgreSQL run on an :class:`EngineConnection`
(:mod:`~t2s.env.databases.duckdb_engine`, :mod:`~t2s.env.databases.postgres_engine`) under the same deadlines
(:mod:`~t2s.env.databases.deadlines`' watchdog), caps and value normalisation (:mod:`~t2s.env.databases.engine_base`).
Each thread keeps its own connection per (purpose, database), as for SQLite.
"""

from __future__ import annotations

import hashlib
import time

from t2s.env.databases import deadlines
from t2s.env.databases.engine_base import Catalog, EngineConnection
from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef
from t2s.env.databases.results import QueryResult
from t2s.env.databases.threads import _thread_connections

_clock, _monotonic = time.perf_counter, time.monotonic


def _open(ref: DatabaseRef, purpose: str) -> EngineConnection:
    label = f"{purpose}:{ref.db_id}"
    try:
        if ref.engine == "duckdb":
            from t2s.env.databases.duckdb_engine import DuckDBConnection

            return DuckDBConnection(ref.path, label)
        if ref.engine == "postgres":
            from t2s.env.databases.postgres_engine import PostgresConnection

            return PostgresConnection(ref.path, label)
    except ImportError as exc:
        raise DatabaseOpenError(f"Error: the {ref.engine} engine needs the {exc.name} package "
                                "(pip install -r requirements.txt)") from None
    except Exception as exc:  # noqa: BLE001 - whatever the driver raises: one Error: line
        where = ref.path
        if ref.engine == "postgres":
            from t2s.env.databases.postgres_engine import redact

            where = redact(ref.path)
        message = " ".join(str(exc).split())
        raise DatabaseOpenError(f"Error: cannot open {ref.engine} database {ref.db_id!r} ({where}): {message}") from None
    raise DatabaseOpenError(f"Error: unknown engine {ref.engine!r} for database {ref.db_id!r}")


def engine_connection(ref: DatabaseRef, purpose: str) -> EngineConnection:
    """This thread's connection to ``ref`` for ``purpose`` (``tool`` or ``scoring``); raises DatabaseOpenError."""
    conns = _thread_connections()
    key = (purpose, ref)
    conn = conns.get(key)
    if conn is not None and getattr(conn, "broken", False):  # a server connection that was lost: open it again
        conns.pop(key).close()
        conn = None
    if conn is None:
        conn = conns[key] = _open(ref, purpose)
    return conn


def run_query(ref: DatabaseRef, purpose: str, sql, *, timeout: float, max_rows: int | None,
              max_cells: int | None = None, max_bytes: int | None = None) -> QueryResult:
    """One statement on ``ref``'s engine under a deadline and the caps; never raises (see ``executing.execute``)."""
    started = _clock()
    if not isinstance(sql, str) or not sql.strip():
        return QueryResult(error="Error: empty SQL")
    from t2s.env.databases import limits

    if len(sql) > limits.MAX_SQL_LENGTH:
        return QueryResult(error=f"Error: the SQL is longer than {limits.MAX_SQL_LENGTH} characters")
    try:
        conn = engine_connection(ref, purpose)
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
    conn = engine_connection(ref, "tool")
    try:
        return conn.read_catalog()
    except Exception as exc:  # noqa: BLE001
        raise DatabaseOpenError(f"Error: cannot read the catalog of {ref.db_id!r}: {' '.join(str(exc).split())}") from None


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
