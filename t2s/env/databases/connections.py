"""Each thread's sandboxed connections: one per (purpose, database), whatever the engine.

Tool connections serve the model's calls; scoring connections, which tool calls never touch, serve gold and
predicted SQL. A connection is opened on first use and kept until :func:`close_thread_connections`. Each thread keeps
its own (sqlite3 connections are not shared across threads); ``payloads`` closes the least recently used row-payload
copies when its memory bound is reached.

A thread's connections are closed when the thread ends. A connection can sit in a reference cycle (its sandbox
callbacks refer back to it), so leaving it to the garbage collector would keep its file, memory copy or server session
open long after a pool's worker is gone: a training run starts a pool per rollout, and in a process holding a model
the collector's full passes are rare. Left alone, each step would add a connection per worker and database.
"""

from __future__ import annotations

import os
import sqlite3
import threading

from t2s.env.databases.engine_base import EngineConnection
from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef, database_problem, open_file, unlocked_state
from t2s.env.databases.payloads import _payloads
from t2s.env.databases.sandbox import SandboxConnection, apply_sandbox

_local = threading.local()


class _ThreadConnections(dict):
    """One thread's connections; closes them when the thread ends (it is dropped with the thread's local storage, on
    the ending thread itself, which sqlite3's same-thread check requires)."""

    def __del__(self):
        for conn in list(self.values()):
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a connection already broken or closed: nothing is left to release
                pass
        self.clear()


def thread_connections() -> dict:
    """This thread's open connections, by ``(purpose, DatabaseRef)``."""
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = _ThreadConnections()
    return conns


def connection(ref: DatabaseRef, purpose: str) -> SandboxConnection | EngineConnection:
    """This thread's connection to ``ref`` for ``purpose`` (``tool`` or ``scoring``); raises DatabaseOpenError."""
    if ref.engine != "sqlite":
        return _engine_connection(ref, purpose)
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
    conns = thread_connections()
    try:
        if ref.schema_id is not None:
            conn = _payloads.open_copy(ref.schema_id, key, conns)
        elif ref.path:
            state = unlocked_state(ref)
            conn = open_file(ref, SandboxConnection)
            conn.file_state = state
            try:
                stat = os.stat(ref.path)
                conn.stored_key = (ref.path, stat.st_size, stat.st_mtime_ns, state)
            except OSError:  # gone since it opened: what it stores is read again for this connection
                conn.stored_key = None
        else:
            raise DatabaseOpenError(f"Error: database {ref.db_id!r} has neither a file nor a registered payload")
        conns[key] = apply_sandbox(conn, f"{purpose}:{ref.db_id}")
    except sqlite3.Error as exc:
        _payloads.drop_copy(key)
        raise DatabaseOpenError(f"Error: cannot open database {ref.db_id!r}: {exc}") from None
    return conn


def _engine_connection(ref: DatabaseRef, purpose: str) -> EngineConnection:
    conns = thread_connections()
    key = (purpose, ref)
    conn = conns.get(key)
    if conn is not None and getattr(conn, "broken", False):  # a server connection that was lost: open it again
        conns.pop(key).close()
        conn = None
    if conn is None:
        conn = conns[key] = _open_engine(ref, purpose)
    return conn


def _open_engine(ref: DatabaseRef, purpose: str) -> EngineConnection:
    label = f"{purpose}:{ref.db_id}"
    problem = database_problem(ref)
    if problem:
        raise DatabaseOpenError(f"Error: {problem}")
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
    except FileNotFoundError as exc:  # no file at the path (DuckDB's check): said as every engine says it
        raise DatabaseOpenError(f"Error: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the driver raises: one Error: line
        where = ref.path
        if ref.engine == "postgres":
            from t2s.env.databases.postgres_engine import redact

            where = redact(ref.path)
        message = " ".join(str(exc).split())
        raise DatabaseOpenError(
            f"Error: cannot open {ref.engine} database {ref.db_id!r} ({where}): {message}"
        ) from None
    raise DatabaseOpenError(f"Error: unknown engine {ref.engine!r} for database {ref.db_id!r}")


def tool_connection(ref: DatabaseRef) -> sqlite3.Connection:
    """This thread's sandboxed connection for the model's tool calls (raises DatabaseOpenError)."""
    return connection(ref, "tool")


def scoring_connection(ref: DatabaseRef) -> sqlite3.Connection:
    """This thread's sandboxed scoring connection, separate from the tool connection (raises DatabaseOpenError)."""
    return connection(ref, "scoring")


def close_thread_connections() -> None:
    """Close every connection this thread holds (they reopen on the next use)."""
    conns = thread_connections()
    for key, conn in list(conns.items()):
        conn.close()
        _payloads.drop_copy(key)
    conns.clear()
