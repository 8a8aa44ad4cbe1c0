"""`python -m t2s bench sandbox`: how fast the sandbox ends each resource blow-up (docs/design.md §5).

Every statement in ``BLOWUPS`` would allocate gigabytes, or run for minutes, in plain SQLite; the sandbox stops each
by a limit (a length cap, a capped ``printf``, the linear ``trim``) with an ``Error:`` result, long before the
deadline. The suite checks that each ends and how (``tests/test_sandbox.py``); how soon is a figure of the machine and
its load, so it is measured here, on a fresh attack database, and compared with ``TARGET_SECONDS``.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

#: the slowest blow-up should end within this, on an idle machine
TARGET_SECONDS = 2.0
#: the deadline each statement runs under: far past the target, so a slow machine reports a time, not a timeout
DEADLINE_SECONDS = 60.0

def cte_chain(depth: int) -> str:
    """Two CTEs a level, each naming both of the level below: the text grows linearly, the query SQLite compiles
    (each reference a copy of its CTE) doubles at every level."""
    levels = ["c0_0 AS (SELECT 1 AS x)", "c0_1 AS (SELECT 2 AS x)"]
    for level in range(1, depth + 1):
        below = f"SELECT x FROM c{level - 1}_0 UNION ALL SELECT x FROM c{level - 1}_1"
        levels += [f"c{level}_0 AS ({below})", f"c{level}_1 AS ({below})"]
    return "WITH " + ", ".join(levels) + f" SELECT count(*) FROM c{depth}_0"


BLOWUPS = [
    "SELECT randomblob(2000000000)",
    "SELECT zeroblob(300000000)",
    "SELECT length(randomblob(2000000000))",
    "SELECT printf('%.*c', 999999999, 'x')",
    "SELECT format('%.*c', 999999999, 'x')",
    "SELECT printf('%999999999d', 1)",
    "SELECT printf('%*s', -999999999, 'x')",
    "SELECT printf('%s%.*c', 'a', '999999999', 'x')",
    "SELECT printf('%.*c', CAST('999999999' AS BLOB), 'x')",
    "SELECT printf('%.*c', ' +999999999.5e0', 'x')",
    "SELECT printf('%l999999999c', 'x')",
    "SELECT printf('%.1l999999999c', 'x')",
    "SELECT length(replace(hex(zeroblob(400000)), '0', 'abcdefgh'))",
    "SELECT length(replace(replace(hex(zeroblob(90000)), '0', '0000000000'), '0', '0000000000'))",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3000000) "
    "SELECT length(group_concat('xxxxxxxxxx')) FROM r",
    "SELECT length(group_concat(a.y || b.y)) FROM big a, big b",
    "SELECT trim(hex(zeroblob(499999)), hex(zeroblob(250000)) || 'x')",
    "SELECT ltrim(replace(hex(zeroblob(499999)), '0', 'a'), replace(hex(zeroblob(250000)), '0', 'b') || 'a')",
    cte_chain(21),  # 2 ** 21 copies to compile, 20 s past a 5 s deadline: none is checked while SQLite compiles
    cte_chain(21) + " /* a comment SQLite takes unclosed",  # text sqlglot cannot read: not measured, so refused
]


def may_succeed(sql: str) -> bool:
    """Whether the blow-up ``sql`` may end without an error: SQLite's ``trim`` with a huge character set is quadratic,
    the sandbox's is linear, so it may finish (or meet the length cap)."""
    return "trim(" in sql


def build_attack_db(path: Path) -> None:
    """The attack database: ``t`` (200 rows, indexed, NOCASE), ``big`` (3,000 rows), ``raw`` (invalid UTF-8), ``v``."""
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT COLLATE NOCASE);
        CREATE INDEX t_b ON t(b);
        CREATE TABLE big (x INTEGER, y TEXT);
        CREATE TABLE raw (id INTEGER, v TEXT);
        CREATE VIEW v AS SELECT a, b FROM t;
        """
    )
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row{i}") for i in range(200)])
    conn.executemany("INSERT INTO big VALUES (?, ?)", [(i, "y" * 10) for i in range(3000)])
    conn.execute("INSERT INTO raw VALUES (1, CAST(x'41ff42' AS TEXT))")
    conn.commit()
    conn.close()


def run(*, only=None) -> int:
    from rich.table import Table

    from t2s.env.databases import benchmark_db, run_tool_query
    from t2s.ui import console as consoles

    chosen = BLOWUPS[: only] if only else BLOWUPS
    console = consoles.console(stderr=True)
    table = Table(title=f"bench sandbox: {len(chosen)} blow-ups, deadline {DEADLINE_SECONDS:g} s each")
    for column in ("seconds", "ended by", "SQL"):
        table.add_column(column)
    times, wrong = [], []
    with tempfile.TemporaryDirectory(prefix="t2s-bench-sandbox-") as folder:
        path = Path(folder) / "attack.sqlite"
        build_attack_db(path)
        ref = benchmark_db(path)
        for sql in chosen:
            result = run_tool_query(ref, sql, max_rows=5, timeout=DEADLINE_SECONDS)
            ended = "deadline" if result.timed_out else ("rows" if not result.error else "limit")
            if result.timed_out or (not may_succeed(sql) and not (result.error or "").startswith("Error:")):
                wrong.append(sql)
            times.append(result.seconds)
            shown = sql if len(sql) <= 160 else f"{sql[:150]}... ({len(sql):,} characters)"
            table.add_row(f"{result.seconds:.3f}", ended, shown)
    consoles.print_table(console, table)
    worst = max(times)
    for sql in wrong:
        print(f"not ended by a limit: {sql}")
    if worst > TARGET_SECONDS:
        print(f"target missed: the slowest blow-up took {worst:.3f} s (target {TARGET_SECONDS:g} s)")
    print(f"sandbox: blowups={len(chosen)} worst_s={worst:.3f} total_s={sum(times):.3f}")
    return 1 if wrong or worst > TARGET_SECONDS else 0
