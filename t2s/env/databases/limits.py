"""The sandbox's numbers: deadlines, result caps, value limits and cache sizes.

Every module of ``t2s.env.databases`` reads them from here when it needs them, so setting one (on this module or on the
``t2s.env.databases`` package, which forwards the assignment here) takes effect for connections opened afterwards.
"""

TOOL_TIMEOUT = 5.0  # seconds, for a model's tool query
SCORING_MIN_TIMEOUT = 5.0  # scoring deadline = max(SCORING_MIN_TIMEOUT, SCORING_GOLD_FACTOR * gold seconds) ...
SCORING_GOLD_FACTOR = 10.0
SCORING_MAX_TIMEOUT = 30.0  # ... capped here; also the deadline for computing a gold result
SCORING_MAX_CELLS = 500_000  # a scoring result larger than this is `over_cap`
SCORING_MAX_BYTES = 64 * 1024 * 1024  # approximate text/blob bytes of a scoring result before `over_cap`
MAX_VALUE_LENGTH = 1_000_000  # SQLITE_LIMIT_LENGTH: longest string, blob or row
AMPLIFIED_MAX_LENGTH = 100_000  # ... in a statement that names a function able to build long values (rowcost)
MAX_SQL_LENGTH = 100_000  # SQLITE_LIMIT_SQL_LENGTH: longest statement, in bytes (real ones are below 2,000)
MAX_LIKE_PATTERN = 500  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH: longest LIKE/GLOB pattern (real ones are below 200)
MAX_HEAVY_CALLS = 32  # calls to functions that build or scan long values, in one statement's program (rowcost)
PRINTF_MAX_WIDTH = 100_000  # largest width or precision the capped printf/format accepts
FETCH_BATCH = 2048  # rows per fetchmany when a scoring result is fetched in full
PROGRESS_INTERVAL = 1_000_000  # virtual-machine instructions between the progress handler's deadline checks
WATCHDOG_POLL = 0.01  # seconds between the watchdog's deadline checks
PAYLOAD_MAX_BYTES = 256 * 1024 * 1024  # largest single row-payload database image
PAYLOAD_CACHE_BYTES = 2 * 1024 * 1024 * 1024  # row-payload images plus per-thread copies, across all threads
GOLD_CACHE_BYTES = 512 * 1024 * 1024  # cached gold results (approximate size)

NAMES = tuple(name for name in dir() if name.isupper() and name != "NAMES")
