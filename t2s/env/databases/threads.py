"""This thread's open connections, by ``(purpose, DatabaseRef)``: each thread keeps its own (sqlite3 connections are
not shared across threads). ``connections`` opens and reuses them; ``payloads`` closes the least recently used
row-payload copies when its memory bound is reached."""

from __future__ import annotations

import threading

_local = threading.local()


def _thread_connections() -> dict:
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    return conns
