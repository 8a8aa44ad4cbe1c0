"""Each thread's sandboxed connections: one per (database, purpose).

Tool connections serve the model's calls; scoring connections, which tool calls never touch, serve gold and
predicted SQL. A connection is opened on first use and kept until :func:`close_thread_connections`.
"""

from __future__ import annotations

import sqlite3

from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef, open_file, unlocked_state
from t2s.env.databases.payloads import _payloads
from t2s.env.databases.sandbox import SandboxConnection, apply_sandbox
from t2s.env.databases.threads import _local, _thread_connections

def _connection(ref: DatabaseRef, purpose: str) -> SandboxConnection:
    if ref.engine != "sqlite":
        from t2s.env.databases.engines import engine_connection

        return engine_connection(ref, purpose)
    key = (purpose, ref)
    try:
        conn = _local.conns[key]
    except (AttributeError, KeyError):  # this thread's first connection, or the first to this database
        return _open_connection(ref, purpose, key)
    if ref.schema_id is not None:
        _payloads.touch_copy(key)
    elif conn.file_state is not None and conn.file_state != unlocked_state(ref):  # changed since it was opened
        del _local.conns[key]
        conn.close()
        return _open_connection(ref, purpose, key)
    return conn


def _open_connection(ref: DatabaseRef, purpose: str, key: tuple) -> SandboxConnection:
    conns = _thread_connections()
    try:
        if ref.schema_id is not None:
            conn = _payloads.open_copy(ref.schema_id, key)
        elif ref.path:
            state = unlocked_state(ref)
            conn = open_file(ref, SandboxConnection)
            conn.file_state = state
        else:
            raise DatabaseOpenError(f"Error: database {ref.db_id!r} has neither a file nor a registered payload")
        conns[key] = apply_sandbox(conn, f"{purpose}:{ref.db_id}")
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
