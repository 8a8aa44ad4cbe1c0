"""Running one statement on a sandboxed connection under a deadline: :func:`execute` and its tool/scoring forms.

:func:`execute` never raises; every failure comes back as a :class:`QueryResult` whose ``error`` starts ``Error:``.
Before a statement runs, the work of one of its rows is bounded (:mod:`t2s.env.databases.rowcost`). Invalid UTF-8 in
text cells is decoded with replacement characters.
"""

from __future__ import annotations

import sqlite3
import time

from t2s.env.databases import deadlines, engines, limits, results, rowcost
from t2s.env.databases.connections import connection
from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef
from t2s.env.databases.results import QueryResult
from t2s.env.databases.sandbox import SandboxConnection
from t2s.env.databases.sqltext import MAX_CTES, cte_expansion, only_comments, starts_with_reindex

_WRITE_ERROR_MARKERS = (
    "attempt to write a readonly database",
    "may not be modified",
    "too many attached databases",
)


def _tolerant_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


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


_clock, _monotonic = time.perf_counter, time.monotonic


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

    ``max_rows`` bounds the fetch (one more row is read, and ``more`` tells whether rows were left), under
    ``LIMITS.tool_max_bytes`` (``over_cap`` when that stopped it); ``None`` fetches everything, stopping with
    ``over_cap`` past ``max_cells`` cells or about ``max_bytes`` bytes.
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
    if (first in "rR" or not first.isalpha()) and starts_with_reindex(sql):
        return QueryResult(
            error="Error: the database is read-only; writes are not allowed (REINDEX)", write_attempt=True
        )
    try:
        ticket = [_monotonic() + max(0.0, float(timeout))]  # this statement's alone (see t2s.env.databases.deadlines)
    except (TypeError, ValueError):
        return QueryResult(error=f"Error: the timeout must be a number of seconds, got {timeout!r}")
    bounds = limits.LIMITS
    if len(sql) > bounds.max_sql_length:
        return QueryResult(error=f"Error: the SQL is longer than {bounds.max_sql_length} characters")
    lowered = sql.lower()
    expansion = cte_expansion(sql, bounds.max_cte_expansion) if "with" in lowered else 0
    if expansion is None:  # e.g. an unclosed comment, which SQLite accepts: its CTEs could not be bounded
        return QueryResult(error="Error: the query cannot be read to bound its common table expressions (an unclosed "
                                 "comment or quote?)")
    if expansion > bounds.max_cte_expansion:
        return QueryResult(error=f"Error: the query's common table expressions are too many (over {MAX_CTES}) or "
                                 f"expand too far (over {bounds.max_cte_expansion:,} tokens once each reference is "
                                 "compiled as a copy of its CTE; one that names the one before twice doubles the "
                                 "query): refer to them fewer times")
    amplified = rowcost.names_amplifier(lowered)
    try:
        cap = rowcost.value_cap(conn, lowered) if amplified else None  # before the deadline: once per file
        conn.timed_out = conn.write_denied = False
        conn.denied = conn.udf_error = None
        deadlines.start_watching(conn, ticket)
        if amplified:  # values this statement builds stay short enough for one row's work to stay small
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, cap)
        refusal = rowcost.too_heavy(rowcost.heavy_calls(conn, sql, lowered))
        if refusal is not None:
            result = QueryResult(error=refusal)
        else:
            result = _run(conn, sql, max_rows, max_cells, max_bytes)
    except Exception as exc:  # noqa: BLE001 - a query must never raise into the rollout
        error, timed_out, write_attempt = _error_text(exc, conn, timeout)
        result = QueryResult(error=error, timed_out=timed_out, write_attempt=write_attempt)
    finally:
        deadlines.stop_watching(conn, ticket)
        if amplified:
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bounds.max_value_length)
    result.seconds = _clock() - started
    return result


def _run(conn, sql, max_rows, max_cells, max_bytes) -> QueryResult:
    """Run and fetch the statement (raises what SQLite raises)."""
    try:
        result = results.run_statement(conn, sql, max_rows, max_cells, max_bytes)
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith("Could not decode to UTF-8"):
            raise
        conn.text_factory = _tolerant_text  # rare: run it again, decoding invalid UTF-8 with replacement
        try:
            result = results.run_statement(conn, sql, max_rows, max_cells, max_bytes)
        finally:
            conn.text_factory = str
    if not result.columns and only_comments(sql):
        result.error = "Error: empty SQL"
    return result


def _failed(message: str) -> QueryResult:
    return QueryResult(error=message)


def run_tool_query(ref: DatabaseRef, sql: str, *, max_rows: int | None, timeout: float | None = None) -> QueryResult:
    """A model's query on this thread's tool connection, fetching at most ``max_rows`` (+1 to see if more exist);
    ``None``: the whole result under the scoring caps (the final-SQL check: a query that fails at a later row does not
    run without error).

    ``timeout`` defaults to ``LIMITS.tool_timeout``.
    """
    if timeout is None:
        timeout = limits.LIMITS.tool_timeout
    caps = {} if max_rows is not None else {"max_cells": limits.LIMITS.scoring_max_cells,
                                             "max_bytes": limits.LIMITS.scoring_max_bytes}
    if ref.engine != "sqlite":
        return engines.run_query(ref, "tool", sql, timeout=timeout, max_rows=max_rows, **caps)
    try:
        conn = connection(ref, "tool")
    except DatabaseOpenError as exc:
        return _failed(str(exc))
    return execute(conn, sql, timeout=timeout, max_rows=max_rows, **caps)


def run_scoring_query(ref: DatabaseRef, sql: str, *, timeout: float) -> QueryResult:
    """A query to score, on this thread's scoring connection: the full result, under the scoring caps."""
    max_cells, max_bytes = limits.LIMITS.scoring_max_cells, limits.LIMITS.scoring_max_bytes
    if ref.engine != "sqlite":
        return engines.run_query(ref, "scoring", sql, timeout=timeout, max_rows=None, max_cells=max_cells,
                                 max_bytes=max_bytes)
    try:
        conn = connection(ref, "scoring")
    except DatabaseOpenError as exc:
        return _failed(str(exc))
    return execute(conn, sql, timeout=timeout, max_rows=None, max_cells=max_cells, max_bytes=max_bytes)


def scoring_timeout(gold_seconds: float) -> float:
    """The prediction's deadline: max(scoring_min_timeout, scoring_gold_factor x gold time), capped at
    scoring_max_timeout (``LIMITS``)."""
    bounds = limits.LIMITS
    deadline = max(bounds.scoring_min_timeout, bounds.scoring_gold_factor * float(gold_seconds))
    return min(bounds.scoring_max_timeout, deadline)
