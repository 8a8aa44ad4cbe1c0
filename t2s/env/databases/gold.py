"""Gold results, computed once on a clean scoring connection and cached by (database hash, SQL) under a byte bound."""

from __future__ import annotations

import threading
from collections import OrderedDict

from t2s.env.databases import executing, hashing, limits
from t2s.env.databases.opening import DatabaseRef
from t2s.env.databases.results import QueryResult, cell_bytes


class ByteLRU:
    """A thread-safe least-recently-used map bounded by the approximate byte size of its values."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.total = 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        item = self._items.get(key)  # one C call, atomic under the GIL: a hit takes no lock
        if item is None:
            return None
        try:
            self._items.move_to_end(key)
        except KeyError:  # evicted meanwhile by another thread: the value read is still good
            pass
        return item[0]

    def put(self, key, value, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.total -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.total += size
            while self.total > self.max_bytes and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self.total -= dropped

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.total = 0


_gold_cache = ByteLRU(limits.LIMITS.gold_cache_bytes)  # its bound is read once, when this module is imported


def _result_size(result: QueryResult) -> int:
    return 256 + cell_bytes(result.rows)


def gold_result(ref: DatabaseRef, gold_sql: str) -> QueryResult:
    """The gold SQL's result on a clean scoring connection, cached by (database hash, SQL).

    ``seconds`` is the gold's own run time (of its first, uncached run). Timeouts are not cached.
    """
    key = (hashing.database_hash(ref), gold_sql)
    cached = _gold_cache.get(key)
    if cached is not None:
        return cached
    result = executing.run_scoring_query(ref, gold_sql, timeout=limits.LIMITS.scoring_max_timeout)
    if not result.timed_out:
        _gold_cache.put(key, result, _result_size(result))
    return result


def clear_gold_cache() -> None:
    """Forget every cached gold result (``bench env`` computes them afresh, as a step on new questions does)."""
    _gold_cache.clear()
