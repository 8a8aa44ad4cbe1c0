"""Opening databases read-only, the layered sandbox, deadlines and result fetching.

Every query a model sends runs through :func:`execute` on a sandboxed connection, one module per idea:

* :mod:`~t2s.env.databases.limits`: the numbers (deadlines, caps, cache sizes); change them before opening connections.
* :mod:`~t2s.env.databases.opening`: which database a row means (:class:`DatabaseRef`) and opening its file read-only.
* :mod:`~t2s.env.databases.sandbox`: the sandboxed connection: limits, the authorizer's allowlist, replaced functions
  (:mod:`~t2s.env.databases.functions`).
* :mod:`~t2s.env.databases.deadlines`: wall-clock deadlines, the watchdog thread and the progress-handler backstop.
* :mod:`~t2s.env.databases.rowcost`: bounding the work of one result row, which no deadline can interrupt.
* :mod:`~t2s.env.databases.connections` and :mod:`~t2s.env.databases.threads`: each thread's tool and scoring
  connections.
* :mod:`~t2s.env.databases.executing` and :mod:`~t2s.env.databases.fetching`: running one statement and reading its rows.
* :mod:`~t2s.env.databases.engines`: the engine layer. A ``DatabaseRef`` names its engine (``sqlite``, ``duckdb``,
  ``postgres``); DuckDB files (:mod:`~t2s.env.databases.duckdb_engine`) and PostgreSQL databases
  (:mod:`~t2s.env.databases.postgres_engine`, :mod:`~t2s.env.databases.postgres_guard`) run under the same deadlines and
  caps, with values normalised to what sqlite3 returns (:mod:`~t2s.env.databases.engine_base`).
* :mod:`~t2s.env.databases.sqltext`: reading SQL text without SQLite (leading keyword, comment-only statements).
* :mod:`~t2s.env.databases.hashing` and :mod:`~t2s.env.databases.gold`: what a database holds, and cached gold results.
* :mod:`~t2s.env.databases.payloads`: row-payload databases (DDL plus rows) built in memory.

:func:`execute` never raises; every failure comes back as a :class:`QueryResult` whose ``error`` starts ``Error:``.

Import from this package. Each name below is read from, and assigned on, the module that defines it, so
``t2s.env.databases.TOOL_TIMEOUT = 10`` (or a test's ``monkeypatch.setattr(databases, "execute", ...)``) reaches the code
that uses it.
"""

from __future__ import annotations

import sys
import types

from t2s.env.databases import (
    connections,
    deadlines,
    engine_base,
    engines,
    executing,
    fetching,
    functions,
    gold,
    hashing,
    limits,
    opening,
    payloads,
    results,
    sandbox,
    sqltext,
    threads,
)

_HOMES = {
    limits: limits.NAMES,
    opening: ("DatabaseRef", "DatabaseOpenError", "benchmark_db", "user_db", "server_db", "ref_from_row",
              "database_uri", "database_problem", "is_dsn", "file_engine", "server_url"),
    engine_base: ("ENGINES", "ENGINE_NAMES", "SQLGLOT_DIALECTS", "check_engine", "normalise_value",
                  "quote_identifier"),
    engines: ("read_catalog", "server_databases"),
    functions: ("printf_too_wide",),
    sandbox: ("SandboxConnection",),
    connections: ("tool_connection", "scoring_connection", "close_thread_connections"),
    threads: ("_thread_connections",),
    executing: ("execute", "run_tool_query", "run_scoring_query", "scoring_timeout"),
    fetching: ("_fetch",),
    results: ("QueryResult",),
    hashing: ("file_checksum", "database_hash"),
    gold: ("ByteLRU", "gold_result", "_gold_cache"),
    payloads: ("build_payload_image", "payload_source_digest", "register_payload", "_payloads", "_thread_copies",
               "_ddl_statements"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def _forwarded(home: types.ModuleType, name: str) -> property:
    """A package attribute that reads and assigns ``name`` on its home module."""
    return property(lambda _package: getattr(home, name), lambda _package, value: setattr(home, name, value))


_Package = type(
    "_Package",
    (types.ModuleType,),
    {name: _forwarded(home, name) for name, home in _HOME_OF.items()}
    | {"__doc__": "``t2s.env.databases``: its names live in the submodules that define them."},
)
sys.modules[__name__].__class__ = _Package
__all__ = sorted(name for name in _HOME_OF if not name.startswith("_"))
