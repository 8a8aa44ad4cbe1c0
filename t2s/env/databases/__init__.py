"""Opening databases read-only, the layered sandbox, deadlines and result fetching.

Every query a model sends runs through :func:`execute` on a sandboxed connection, one module per idea:

* :mod:`~t2s.env.databases.limits`: the numbers (deadlines, caps, cache sizes), one frozen ``Limits``.
* :mod:`~t2s.env.databases.opening`: which database a row means (:class:`DatabaseRef`) and opening its file read-only.
* :mod:`~t2s.env.databases.sandbox`: the sandboxed connection: limits, the authorizer's allowlist, replaced functions
  (:mod:`~t2s.env.databases.functions`).
* :mod:`~t2s.env.databases.deadlines`: wall-clock deadlines, the watchdog thread and the progress-handler backstop.
* :mod:`~t2s.env.databases.rowcost`: bounding the work of one result row, which no deadline can interrupt.
* :mod:`~t2s.env.databases.connections`: each thread's tool and scoring connections, whatever the engine.
* :mod:`~t2s.env.databases.executing`: running one statement; :mod:`~t2s.env.databases.results`: what it gives back
  (:class:`QueryResult`) and reading its rows.
* :mod:`~t2s.env.databases.engines`: the engine layer. A ``DatabaseRef`` names its engine (``sqlite``, ``duckdb``,
  ``postgres``); DuckDB files (:mod:`~t2s.env.databases.duckdb_engine`) and PostgreSQL databases
  (:mod:`~t2s.env.databases.postgres_engine`, :mod:`~t2s.env.databases.postgres_guard`) run under the same deadlines and
  caps, with values normalised to what sqlite3 returns (:mod:`~t2s.env.databases.engine_base`).
* :mod:`~t2s.env.databases.sqltext`: reading SQL text without SQLite (leading keyword, comment-only statements).
* :mod:`~t2s.env.databases.hashing` and :mod:`~t2s.env.databases.gold`: what a database holds, and cached gold results.
* :mod:`~t2s.env.databases.payloads`: row-payload databases (DDL plus rows) built in memory.

:func:`execute` never raises; every failure comes back as a :class:`QueryResult` whose ``error`` starts ``Error:``.

Other packages import the names below from this package. They are plain re-exports: to change a limit, replace
``limits.LIMITS``; a test patches the module that defines a name (``monkeypatch.setattr(limits, "LIMITS", ...)``), or
the package only when the code under test looks the name up on the package.
"""

from __future__ import annotations

from t2s.env.databases import limits
from t2s.env.databases.connections import close_thread_connections, scoring_connection, tool_connection
from t2s.env.databases.engine_base import (
    ENGINE_NAMES,
    ENGINES,
    SQLGLOT_DIALECTS,
    check_engine,
    normalise_value,
    quote_identifier,
)
from t2s.env.databases.engines import read_catalog, server_databases
from t2s.env.databases.executing import execute, run_scoring_query, run_tool_query, scoring_timeout
from t2s.env.databases.gold import ByteLRU, clear_gold_cache, gold_result
from t2s.env.databases.hashing import database_hash, file_checksum
from t2s.env.databases.limits import Limits
from t2s.env.databases.opening import (
    DatabaseOpenError,
    DatabaseRef,
    benchmark_db,
    database_problem,
    database_uri,
    file_engine,
    is_dsn,
    ref_from_row,
    server_db,
    server_url,
    user_db,
)
from t2s.env.databases.payloads import build_payload_image, payload_source_digest, register_payload
from t2s.env.databases.results import QueryResult
from t2s.env.databases.sandbox import SandboxConnection

__all__ = [
    "ENGINES", "ENGINE_NAMES", "SQLGLOT_DIALECTS", "ByteLRU", "DatabaseOpenError", "DatabaseRef", "Limits",
    "QueryResult", "SandboxConnection", "benchmark_db", "build_payload_image", "check_engine", "clear_gold_cache",
    "close_thread_connections", "database_hash", "database_problem", "database_uri", "execute", "file_checksum",
    "file_engine", "gold_result", "is_dsn", "limits", "normalise_value", "payload_source_digest", "quote_identifier",
    "read_catalog", "ref_from_row", "register_payload", "run_scoring_query", "run_tool_query", "scoring_connection",
    "scoring_timeout", "server_databases", "server_db", "server_url", "tool_connection", "user_db",
]  # fmt: skip
