"""Bounding the work of one result row, which no deadline can interrupt.

SQLite checks for interrupts (and runs the progress handler) only when a statement jumps: between rows and loop
iterations, never between the function calls that compute one row. One select list holding many calls on values near
the length limit would run far past any deadline. So the work of a row is bounded before it starts:

* ``instr`` and ``replace`` are linear (:mod:`t2s.env.databases.functions`; SQLite's compare at every position, seconds
  for one call on two long values), and every function of ours stops a statement that is past its deadline;
* statements are at most ``max_sql_length`` characters and LIKE/GLOB patterns at most ``max_like_pattern`` (``LIMITS``);
* a statement that can build long values runs with values capped at ``amplified_max_length`` instead of
  ``max_value_length``: one that names a function able to (``AMPLIFIERS``), or concatenates (``||``, ``string_agg``,
  the ``json_`` builders: ``BUILDERS``), since a recursive query doubling a value with ``||`` reaches the length limit
  in 19 steps, and 32 LIKEs over a value of a million characters ran 26 s past a 5 s deadline. SQLite applies the cap
  to the values a statement reads as well, so a statement that only concatenates is capped at the database's longest
  stored record instead where that is longer (:func:`value_cap`: ``dbstat``'s largest cell, once per file): it still
  reads every value the database holds;
* a statement that names a function that builds or scans long values (``HEAVY_FUNCTIONS``) is compiled with
  ``EXPLAIN`` first, and refused when its program calls them more than ``max_heavy_calls`` times (a subquery's
  expressions copied into its outer query count at each copy).

Long values read from the database itself are not capped: its data is trusted.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

from t2s.env.databases import limits

AMPLIFIERS = ("zeroblob", "randomblob", "hex", "quote", "printf", "format", "char", "concat", "json_quote", "unistr",
              "replace")
HEAVY_FUNCTIONS = frozenset(AMPLIFIERS + ("concat_ws", "instr", "like", "glob"))
_NAMES = tuple(sorted(HEAVY_FUNCTIONS - {"concat_ws"}))  # every name in HEAVY_FUNCTIONS contains one of these
# text that concatenates: the operator, the aggregate's other name (``group_concat`` is found by "concat"), and the
# JSON functions that build arrays and objects (``json_array``, ``json_group_array``, ``jsonb_set``, ...)
BUILDERS = ("||", "string_agg", "json_", "jsonb_")
_CAPPED = AMPLIFIERS + BUILDERS


def names_amplifier(lowered_sql: str) -> bool:
    """Whether the (lowercased) SQL text names a function able to build long values or concatenates (a superset:
    any substring)."""
    return any(name in lowered_sql for name in _CAPPED)


_longest_stored: dict[tuple, int] = {}  # (path, size, mtime) of a database file -> its largest cell, in bytes


def value_cap(conn: sqlite3.Connection, lowered_sql: str) -> int:
    """The value cap of a statement that ``names_amplifier``: ``amplified_max_length``; for one that only concatenates,
    raised to the database's largest stored cell (never above ``max_value_length``), so that it reads every value."""
    bounds = limits.LIMITS
    if any(name in lowered_sql for name in AMPLIFIERS):
        return bounds.amplified_max_length
    key = getattr(conn, "stored_key", None)
    longest = _longest_stored.get(key) if key is not None else getattr(conn, "longest_stored", None)
    if longest is None:
        try:  # every page's largest cell: a record at least as long as any value it holds
            longest = int(conn.execute("SELECT max(mx_payload) FROM dbstat").fetchone()[0] or 0)
        except (sqlite3.Error, TypeError, ValueError):  # no dbstat in this SQLite: any stored value may be that long
            longest = bounds.max_value_length
        finally:  # what reading it noted is no part of the statement
            conn.denied, conn.denied_internal, conn.write_denied = None, False, False
        if key is not None:
            _longest_stored[key] = longest
        else:  # an in-memory copy (a row-payload database): known to this connection only
            conn.longest_stored = longest
    return min(bounds.max_value_length, max(bounds.amplified_max_length, longest))


def heavy_calls(conn: sqlite3.Connection, sql: str, lowered_sql: str) -> Counter:
    """The calls to ``HEAVY_FUNCTIONS`` in the statement's program, by name; none when its text names none, or when
    it does not compile (running it reports why)."""
    count: Counter = Counter()
    if not any(name in lowered_sql for name in _NAMES):
        return count
    try:
        program = conn.execute("EXPLAIN " + sql).fetchall()
    except (sqlite3.Error, sqlite3.Warning, ValueError):
        return count
    finally:  # compiling ran the authorizer: what it noted belongs to the statement itself
        conn.denied, conn.denied_internal, conn.write_denied = None, False, False
    for row in program:
        if row[1] in ("Function", "PureFunc") and isinstance(row[5], str):  # p4 names the function: "instr(2)"
            name = row[5].partition("(")[0].lower()
            if name in HEAVY_FUNCTIONS:
                count[name] += 1
    return count


def too_heavy(calls: Counter) -> str | None:
    """The refusal of a statement whose program makes more than ``LIMITS.max_heavy_calls`` heavy calls, else None."""
    total, most = sum(calls.values()), limits.LIMITS.max_heavy_calls
    if total <= most:
        return None
    return (
        f"Error: the query calls functions that build or scan long values {total} times per row "
        f"({', '.join(sorted(calls))}); at most {most} such calls are allowed"
    )
