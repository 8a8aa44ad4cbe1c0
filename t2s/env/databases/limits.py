"""The sandbox's numbers: deadlines, result caps, value limits and cache sizes, in one frozen :class:`Limits`.

Every module of ``t2s.env.databases`` reads ``limits.LIMITS`` when it needs a number (never a copy taken at import), so
replacing it (``limits.LIMITS = dataclasses.replace(limits.LIMITS, tool_timeout=10.0)``, or a test's
``monkeypatch.setattr(limits, "LIMITS", ...)``) takes effect for statements run and connections opened afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    tool_timeout: float = 5.0  # seconds, for a model's tool query
    scoring_min_timeout: float = 5.0  # scoring deadline = max(scoring_min_timeout, scoring_gold_factor x gold s) ...
    scoring_gold_factor: float = 10.0
    scoring_max_timeout: float = 30.0  # ... capped here; also the deadline for computing a gold result
    scoring_max_cells: int = 500_000  # a scoring result larger than this is `over_cap`
    scoring_max_bytes: int = 64 * 1024 * 1024  # approximate text/blob bytes of a scoring result before `over_cap`
    tool_max_bytes: int = 16 * 1024 * 1024  # ... of a tool result (the model sees 200 characters a cell)
    max_value_length: int = 1_000_000  # SQLITE_LIMIT_LENGTH: longest string, blob or row
    amplified_max_length: int = 100_000  # ... in a statement that can build long values (rowcost)
    max_sql_length: int = 100_000  # SQLITE_LIMIT_SQL_LENGTH: longest statement, in bytes (real ones are below 2,000)
    max_like_pattern: int = 500  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH: longest LIKE/GLOB pattern (real ones: below 200)
    # tokens SQLite compiles once each CTE reference is a copy of its body (sqltext.cte_expansion); about 27 ns each
    # on a 2-core machine, so 0.5 s of compiling, which no deadline interrupts (real statements: below 2,000)
    max_cte_expansion: int = 20_000_000
    max_heavy_calls: int = 32  # calls to functions that build or scan long values, in one statement's program (rowcost)
    printf_max_width: int = 100_000  # largest width or precision the capped printf/format accepts
    fetch_batch: int = 2048  # rows per fetchmany when a scoring result is fetched in full
    progress_interval: int = 1_000_000  # virtual-machine instructions between the progress handler's deadline checks
    watchdog_poll: float = 0.01  # seconds between the watchdog's deadline checks
    virtual_tables_timeout: float = 1.0  # seconds, in all, for connecting a file's virtual tables as a connection opens
    payload_max_bytes: int = 256 * 1024 * 1024  # largest single row-payload database image
    payload_cache_bytes: int = 2 * 1024 * 1024 * 1024  # row-payload images plus per-thread copies, across all threads
    gold_cache_bytes: int = 512 * 1024 * 1024  # cached gold results (approximate size)


LIMITS = Limits()
