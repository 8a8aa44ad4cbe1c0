"""This thread's open connections, by ``(purpose, DatabaseRef)``: each thread keeps its own (sqlite3 connections are
not shared across threads). ``connections`` opens and reuses them; ``payloads`` closes the least recently used
row-payload copies when its memory bound is reached.

A thread's connections are closed when the thread ends. A connection can sit in a reference cycle (its sandbox
callbacks refer back to it), so leaving it to the garbage collector would keep its file, memory copy or server session
open long after a pool's worker is gone: a training run starts a pool per rollout, and in a process holding a model
the collector's full passes are rare. Left alone, each step would add a connection per worker and database.
"""

from __future__ import annotations

import threading

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


def _thread_connections() -> dict:
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = _ThreadConnections()
    return conns
