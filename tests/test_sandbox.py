"""The attack suite: every bad SQL input is refused or bounded, and no database file ever changes."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from pathlib import Path

import pytest

from t2s.bench.sandbox import BLOWUPS, DEADLINE_SECONDS, build_attack_db, may_succeed
from t2s.env.databases.limits import LIMITS
from t2s.env.databases import (
    benchmark_db,
    file_checksum,
    run_scoring_query,
    run_tool_query,
    scoring_connection,
    tool_connection,
    user_db,
)

BASELINE_SQL = "SELECT count(*), sum(a), max(b) FROM t WHERE b LIKE 'ROW%'"
MARGIN = 1.0  # seconds allowed past a deadline on a busy 2-core machine


@pytest.fixture()
def db(tmp_path):
    """The attack database; after every test its checksum and its folder's listing must be unchanged."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "attack.sqlite"
    build_attack_db(path)
    before, listing = file_checksum(path), sorted(os.listdir(folder))
    yield path
    assert file_checksum(path) == before, "the database file changed"
    assert sorted(os.listdir(folder)) == listing, "a file appeared next to the database"


def _listing(*folders: Path) -> dict:
    return {str(folder): sorted(os.listdir(folder)) for folder in folders}


def _baseline(ref):
    return run_tool_query(ref, BASELINE_SQL, max_rows=5).rows


WRITES = {
    "insert": "INSERT INTO t VALUES (1000, 'x')",
    "insert_returning": "INSERT INTO t VALUES (1001, 'x') RETURNING a",
    "insert_in_cte": "WITH n(k) AS (SELECT 5000) INSERT INTO t SELECT k, 'x' FROM n",
    "update": "UPDATE t SET b = 'changed'",
    "update_returning": "UPDATE t SET b = 'changed' RETURNING *",
    "update_in_cte": "WITH n AS (SELECT 1) UPDATE t SET b = 'c' WHERE a IN (SELECT * FROM n)",
    "delete": "DELETE FROM t",
    "delete_returning": "DELETE FROM t RETURNING a",
    "delete_in_cte": "WITH n AS (SELECT 1) DELETE FROM t WHERE a IN (SELECT * FROM n)",
    "replace": "REPLACE INTO t VALUES (1, 'x')",
    "replace_returning": "REPLACE INTO t VALUES (1, 'x') RETURNING *",
    "insert_or_replace": "INSERT OR REPLACE INTO t VALUES (1, 'x')",
    "drop_table": "DROP TABLE t",
    "drop_view": "DROP VIEW v",
    "drop_index": "DROP INDEX t_b",
    "create_table": "CREATE TABLE n (x)",
    "create_table_as": "CREATE TABLE n AS SELECT * FROM t",
    "create_temp_table": "CREATE TEMP TABLE t (a, b)",
    "create_temp_view_shadow": "CREATE TEMP VIEW t AS SELECT 999 AS a, 'ROW' AS b",
    "create_view": "CREATE VIEW w AS SELECT 1",
    "create_index": "CREATE INDEX t_a ON t(a)",
    "create_trigger": "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM t; END",
    "create_temp_trigger": "CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM t; END",
    "create_virtual_fts5": "CREATE VIRTUAL TABLE f USING fts5(x)",
    "create_virtual_rtree": "CREATE VIRTUAL TABLE r USING rtree(id, x0, x1)",
    "create_temp_virtual": "CREATE VIRTUAL TABLE temp.f USING fts5(x)",
    "alter_add": "ALTER TABLE t ADD COLUMN c",
    "alter_rename": "ALTER TABLE t RENAME TO t2",
    "reindex": "REINDEX",
    "reindex_table": "REINDEX t",
    "analyze": "ANALYZE",
    "vacuum": "VACUUM",
    "pragma_query_only_off": "PRAGMA query_only = OFF",
    "pragma_writable_schema": "PRAGMA writable_schema = ON",
    "pragma_hard_heap_limit": "PRAGMA hard_heap_limit = 1000",
    "pragma_journal_mode": "PRAGMA journal_mode = DELETE",
    "pragma_case_sensitive_like": "PRAGMA case_sensitive_like = ON",
    "pragma_user_version": "PRAGMA user_version = 7",
    "update_sqlite_master": "UPDATE sqlite_master SET sql = 'x'",
    "detach": "DETACH DATABASE main",
}

# SQL whose only target is a file next to the database or in a separate folder: formatted with {target}.
FILE_WRITES = {
    "vacuum_into": "VACUUM INTO '{target}'",
    "attach": "ATTACH DATABASE '{target}' AS other",
    "attach_uri_rw": "ATTACH DATABASE 'file:{target}?mode=rw' AS other",
    "attach_uri_rwc": "ATTACH DATABASE 'file:{target}?mode=rwc' AS other",
    "attach_memory": "ATTACH DATABASE ':memory:' AS other",
}

REFUSED_NOT_WRITES = {
    "load_extension": "SELECT load_extension('/nonexistent/ext')",
    "fts3_tokenizer": "SELECT fts3_tokenizer('simple')",
    "begin": "BEGIN",
    "begin_immediate": "BEGIN IMMEDIATE",
    "commit": "COMMIT",
    "savepoint": "SAVEPOINT s",
    "release": "RELEASE s",
    "pragma_read_other": "PRAGMA database_list",
}


@pytest.mark.parametrize("ref_kind", ["benchmark", "user"])
@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_are_refused_as_write_attempts(db, tmp_path, name, ref_kind, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = benchmark_db(db) if ref_kind == "benchmark" else user_db(db)
    before, listing, baseline = file_checksum(db), _listing(db.parent, tmp_path), _baseline(ref)
    result = run_tool_query(ref, WRITES[name], max_rows=5)
    assert result.error and result.error.startswith("Error:")
    assert result.write_attempt, result.error
    assert not result.timed_out
    assert file_checksum(db) == before
    assert _listing(db.parent, tmp_path) == listing
    conn = tool_connection(ref)
    assert not conn.in_transaction  # a refused statement leaves no transaction open
    assert _baseline(ref) == baseline  # TEMP objects and PRAGMA changes can never alter later results
    assert run_scoring_query(ref, BASELINE_SQL, timeout=5).rows == baseline


@pytest.mark.parametrize("name", sorted(FILE_WRITES))
def test_attach_and_vacuum_into_create_no_file(db, tmp_path, name, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    ref = benchmark_db(db)
    before, listing = file_checksum(db), _listing(db.parent, elsewhere, tmp_path)
    for target in (elsewhere / "copy.sqlite", db.parent / "copy.sqlite", Path("relative.sqlite"), db):
        result = run_tool_query(ref, FILE_WRITES[name].format(target=target), max_rows=5)
        assert result.error and result.error.startswith("Error:")
        assert result.write_attempt, result.error
    assert _listing(db.parent, elsewhere, tmp_path) == listing
    assert not (elsewhere / "copy.sqlite").exists()
    assert file_checksum(db) == before
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(200,)]


@pytest.mark.parametrize("name", sorted(REFUSED_NOT_WRITES))
def test_refused_statements_that_are_not_writes(db, name):
    ref = benchmark_db(db)
    before, baseline = file_checksum(db), _baseline(ref)
    result = run_tool_query(ref, REFUSED_NOT_WRITES[name], max_rows=5)
    assert result.error and result.error.startswith("Error:")
    assert not result.write_attempt
    assert not tool_connection(ref).in_transaction
    assert _baseline(ref) == baseline
    assert file_checksum(db) == before


def test_refusals_say_what_was_refused(db):
    ref = benchmark_db(db)
    expected = {
        "INSERT INTO t VALUES (1000, 'x')": "Error: the database is read-only; writes are not allowed (INSERT t)",
        "UPDATE t SET b = 'x'": "Error: the database is read-only; writes are not allowed (UPDATE t)",
        "DROP TABLE t": "Error: the database is read-only; writes are not allowed (schema change)",
        "ALTER TABLE t ADD COLUMN c": "Error: the database is read-only; writes are not allowed (ALTER TABLE t)",
        "PRAGMA query_only = OFF": "Error: the database is read-only; writes are not allowed (PRAGMA query_only = OFF)",
        "SELECT load_extension('x')": "Error: not allowed in the read-only sandbox: function load_extension()",
        "BEGIN": "Error: not allowed in the read-only sandbox: transactions",
        "PRAGMA database_list": "Error: not allowed in the read-only sandbox: PRAGMA database_list",
    }
    for sql, message in expected.items():
        assert run_tool_query(ref, sql, max_rows=5).error == message


def test_pragma_assignment_cannot_change_later_results(db):
    ref = benchmark_db(db)
    like_before = run_tool_query(ref, "SELECT count(*) FROM t WHERE b LIKE 'ROW1%'", max_rows=5).rows
    pragmas = ("PRAGMA case_sensitive_like = ON", "PRAGMA query_only = OFF", "PRAGMA reverse_unordered_selects = ON")
    for pragma in pragmas:
        assert run_tool_query(ref, pragma, max_rows=5).write_attempt
    assert run_tool_query(ref, "SELECT count(*) FROM t WHERE b LIKE 'ROW1%'", max_rows=5).rows == like_before
    after = run_tool_query(ref, "INSERT INTO t VALUES (9999, 'x')", max_rows=5)
    assert after.write_attempt


def test_several_statements_are_one_clear_error(db):
    ref = benchmark_db(db)
    before = file_checksum(db)
    for sql in ("SELECT 1; SELECT 2", "SELECT 1; DROP TABLE t", "SELECT * FROM t; DELETE FROM t;"):
        result = run_tool_query(ref, sql, max_rows=5)
        assert result.error == "Error: only one SQL statement per call is allowed"
    assert run_tool_query(ref, "SELECT 1;  -- trailing comment\n", max_rows=5).rows == [(1,)]
    assert file_checksum(db) == before
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(200,)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM big a, big b, big c",
        "SELECT * FROM big a, big b, big c ORDER BY a.y || b.y DESC",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r ORDER BY n DESC",
    ],
)
def test_runaway_queries_end_at_the_deadline(db, sql):
    ref = benchmark_db(db)
    for runner in (
        lambda: run_tool_query(ref, sql, max_rows=5, timeout=0.5),
        lambda: run_scoring_query(ref, sql, timeout=0.5),
    ):
        result = runner()
        assert result.timed_out and result.error == "Error: query timed out after 0.5 s"
        assert 0.45 <= result.seconds < 0.5 + MARGIN
        assert not result.write_attempt
    assert run_tool_query(ref, "SELECT count(*) FROM big", max_rows=5).rows == [(3000,)]


@pytest.mark.parametrize("sql", BLOWUPS)
def test_blowups_end_by_a_limit(db, sql):
    """Each blow-up ends, by a limit and not by the deadline; how soon is `bench sandbox`'s figure, not a test's."""
    ref = benchmark_db(db)
    result = run_tool_query(ref, sql, max_rows=5, timeout=DEADLINE_SECONDS)
    if not may_succeed(sql):  # SQLite's trim with a huge character set is quadratic; ours is linear
        assert result.error and result.error.startswith("Error:")
    assert not result.timed_out, "stopped by a limit, not by the deadline"
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(200,)]


def test_bench_sandbox_prints_its_figures():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "t2s", "bench", "sandbox", "--only", "3"], capture_output=True,
                         text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sandbox: blowups=3 worst_s=\d+\.\d{3} total_s=\d+\.\d{3}", last), out.stdout + out.stderr
    assert "randomblob(2000000000)" in out.stderr and "limit" in out.stderr
    assert out.returncode in (0, 1) and ("target missed" in out.stdout) == (out.returncode == 1)


def test_capped_printf_agrees_with_sqlite_below_the_cap(db):
    ref = benchmark_db(db)
    plain = sqlite3.connect(":memory:")
    for sql in (
        "SELECT printf('%5.2f|%d|%s|%-4s|', 3.14159, 42, 'ab', 'c')",
        "SELECT printf('%*d|%.*f|%%|%q|%Q|%w', 6, 42, 3, 2.0/3, 'it''s', NULL, 'a\"b')",
        "SELECT format('%x %o %e %g %c %,d', 255, 8, 12345.678, 0.0001, 'xyz', 1234567)",
        "SELECT printf('%.3c', 'x'), printf('no args'), printf(NULL), printf('%d'), printf(7)",
    ):
        assert run_tool_query(ref, sql, max_rows=5).rows == plain.execute(sql).fetchall()


def test_trim_with_a_character_set_matches_sqlite(db):
    plain = sqlite3.connect(":memory:")
    sql = (
        "SELECT trim(12.5, '5'), trim(NULL, 'a'), trim('a', NULL), ltrim('xxaxx', 'x'), rtrim('xxaxx', 'x'), "
        "trim('xxaxx', ''), trim(x'787861', 'x'), typeof(trim(5, '')), trim('  a  '), trim(1e20, '0'), "
        "trim(0.1 + 0.2, '3'), ltrim(' x '), rtrim(' x '), trim('éaé', 'é'), "
        "trim('abcxcba', 'abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz')"
    )
    assert run_tool_query(benchmark_db(db), sql, max_rows=5).rows == plain.execute(sql).fetchall()


def test_linear_instr_and_replace_match_sqlite(db):
    plain = sqlite3.connect(":memory:")
    sql = (
        "SELECT instr('abcabc', 'ca'), instr('abc', ''), instr('', 'a'), instr(NULL, 'a'), instr('a', NULL), "
        "instr('éaé', 'é'), instr(x'00ff01', x'ff01'), instr(x'616263', 'c'), instr(12345, 34), instr(1.5, '.'), "
        "instr('abc', 'abcd'), replace('a.b.c', '.', '--'), replace('abc', '', 'x'), typeof(replace(5, '', 'x')), "
        "replace(NULL, 'a', 'b'), replace('a', NULL, 'b'), replace('a', 'a', NULL), replace(x'616263', 'b', 'B'), "
        "replace(1.25, '2', '3'), replace('ééé', 'é', 'e'), replace(123, 2, 9), typeof(replace(x'61', 'a', 'b'))"
    )
    assert run_tool_query(benchmark_db(db), sql, max_rows=5).rows == plain.execute(sql).fetchall()


# One row's function calls run without a check for interrupts between them, so these ran far past any deadline:
# each instr compares a long needle at every position of a long haystack (about 10 s a call), and a select list
# repeats it.
ROW_BOUND_ATTACKS = [
    "SELECT " + ", ".join(["instr(hex(zeroblob(499000 + a - a)), hex(zeroblob(250000)) || 'x')"] * 4) + " FROM t",
    "SELECT " + ", ".join(["instr(hex(zeroblob(49000)), hex(zeroblob(24000)) || 'x')"] * 120),
    "SELECT " + ", ".join(["instr(hex(zeroblob(499000)), 'x')"] * 1500),
    "SELECT " + ", ".join(["b LIKE '%' || hex(zeroblob(240)) || '1'"] * 100) + " FROM (SELECT hex(zeroblob(49000)) b)",
    "SELECT " + ", ".join(["x"] * 100)
    + " FROM (SELECT instr(hex(zeroblob(49000 + a - a)), hex(zeroblob(20000)) || 'x') AS x FROM t)",
]
# Values built without naming a function that builds long ones: doubled with `||` in a recursive query, or
# aggregated with `json_group_array`, to near the length limit; then 32 LIKEs (26 s past a 5 s deadline before such
# statements were capped like the others), or nested `upper` calls (12 s and 3.4 GB).
_LONG_LIKE = " + ".join([f"(s LIKE '%{'a' * 497}b')"] * 32)
_DOUBLED = ("WITH RECURSIVE r(n, s) AS (SELECT 1, 'aaa' UNION ALL SELECT n + 1, s || s FROM r WHERE n < 19), "
            "long(s) AS (SELECT substr(s, 1, 999999) FROM r WHERE n = 19) ")
ROW_BOUND_ATTACKS += [
    _DOUBLED + f"SELECT {_LONG_LIKE} FROM long",
    _DOUBLED + "SELECT " + ", ".join(["length(" + "upper(" * 15 + "s" + ")" * 16] * 500) + " FROM long",
    f"SELECT {_LONG_LIKE} FROM (SELECT json_group_array('{'a' * 1000}') AS s FROM (WITH RECURSIVE r(n) AS (SELECT 1 "
    "UNION ALL SELECT n + 1 FROM r WHERE n < 990) SELECT n FROM r))",
]


@pytest.mark.parametrize("path", ["tool", "scoring"])
@pytest.mark.parametrize("sql", ROW_BOUND_ATTACKS, ids=[f"attack{i}" for i in range(len(ROW_BOUND_ATTACKS))])
def test_the_work_of_one_row_stays_near_the_deadline(db, sql, path):
    ref = benchmark_db(db)
    if path == "tool":
        result = run_tool_query(ref, sql, max_rows=5, timeout=1.0)
    else:
        result = run_scoring_query(ref, sql, timeout=1.0)
    assert result.error and result.error.startswith("Error:"), result.rows[:1]
    assert result.seconds < 1.0 + 4 * MARGIN
    assert run_tool_query(ref, BASELINE_SQL, max_rows=5).ok


def test_heavy_calls_are_counted_in_the_compiled_program(db):
    """A subquery's expression copied into its outer query counts at each copy; real queries stay well below."""
    ref = benchmark_db(db)
    copies = ", ".join(["x"] * (LIMITS.max_heavy_calls + 1))
    result = run_tool_query(ref, f"SELECT {copies} FROM (SELECT replace(b, 'r', 'R') AS x FROM t)", max_rows=2)
    assert result.error == (f"Error: the query calls functions that build or scan long values "
                            f"{LIMITS.max_heavy_calls + 1} times per row (replace); at most "
                            f"{LIMITS.max_heavy_calls} such calls are allowed")
    real = (
        "SELECT CAST(replace(replace(b, 'row', ''), ',', '') AS INTEGER) AS n, instr(b, 'w'), b LIKE 'ROW1%', "
        "printf('%05d', a), hex(a), quote(b) FROM t WHERE b LIKE '%1%' AND replace(b, 'o', '0') GLOB 'r0w*' "
        "ORDER BY n LIMIT 2"
    )
    assert run_tool_query(ref, real, max_rows=5).rows == [(1, 3, 1, "00001", "31", "'row1'"),
                                                          (10, 3, 1, "00010", "3130", "'row10'")]
    too_long = "SELECT 1" + " " * LIMITS.max_sql_length
    assert run_tool_query(ref, too_long, max_rows=2).error == (
        f"Error: the SQL is longer than {LIMITS.max_sql_length} characters")


def test_a_statement_that_concatenates_still_reads_every_stored_value(tmp_path):
    """Capping what a concatenating statement builds must not cap what it reads: SQLite applies the length limit to
    the values read too, so gold SQL with ``||`` or ``json_extract`` failed on a 150,000-character cell."""
    path = tmp_path / "long.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE posts (name TEXT, body TEXT, meta_json TEXT)")
    conn.execute("INSERT INTO posts VALUES ('a', ?, '{\"k\": 1}')", ("y" * 150_000,))
    conn.commit()
    conn.close()
    ref = benchmark_db(path)
    for sql in ("SELECT name || 'x', length(body) FROM posts WHERE body LIKE '%y%'",
                "SELECT *, name || '' FROM posts", "SELECT json_extract(meta_json, '$.k'), length(body) FROM posts"):
        result = run_scoring_query(ref, sql, timeout=5)
        assert result.ok and len(result.rows) == 1, (sql, result.error)
    doubled = ("WITH RECURSIVE r(n, s) AS (SELECT 1, body FROM posts UNION ALL SELECT n + 1, s || s FROM r "
               "WHERE n < 8) SELECT length(s) FROM r")  # what it builds is still capped, at the longest stored cell
    assert "too big" in run_tool_query(ref, doubled, max_rows=10).error


# 50 columns of one 80,000-character value: 4 MB a row, 800 MB in all (a materialised CTE computes it once a row)
WIDE_ROWS = ("WITH m AS MATERIALIZED (SELECT hex(zeroblob(40000 + a - a)) AS x FROM t) SELECT "
             + ", ".join(["x"] * 50) + " FROM m")


def test_wide_rows_of_long_values_stop_at_the_byte_caps(db, monkeypatch):
    """A read stops after the row that passes its byte cap: a tool query's (it had none) and a scoring result's (which
    was checked only every 16 rows at least, 64 MB here); the tool says the result was too large to read further."""
    import dataclasses

    from t2s.env.databases import limits
    from t2s.env.tools import Toolbox

    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(LIMITS, tool_max_bytes=100_000,
                                                              scoring_max_bytes=2 ** 20))
    ref = benchmark_db(db)
    tool = run_tool_query(ref, WIDE_ROWS, max_rows=5)
    assert tool.ok and len(tool.rows) == 1 and tool.more and tool.over_cap
    scoring = run_scoring_query(ref, WIDE_ROWS, timeout=10)
    assert scoring.ok and len(scoring.rows) == 1 and scoring.over_cap
    two_columns = WIDE_ROWS.replace(", ".join(["x"] * 50), "x, x")  # 160,000 bytes a row: shown in full
    text = Toolbox(ref).call("run_query", {"sql": two_columns}).text
    assert text.endswith("... (showing the first 1 rows; the result is too large to read further)"), text[-300:]
    narrow = run_tool_query(ref, "SELECT a, b FROM t ORDER BY a", max_rows=5)
    assert narrow.rows == [(i, f"row{i}") for i in range(5)] and narrow.more and not narrow.over_cap


def test_million_row_results_are_bounded(db):
    ref = benchmark_db(db)
    sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 1000000) SELECT n, n * 2 FROM r"
    tool = run_tool_query(ref, sql, max_rows=5)
    assert tool.ok and tool.rows == [(i, 2 * i) for i in range(1, 6)] and tool.more
    assert tool.seconds < 0.5
    scoring = run_scoring_query(ref, sql, timeout=10)
    assert scoring.over_cap and scoring.ok and not scoring.timed_out
    assert len(scoring.rows) * 2 <= LIMITS.scoring_max_cells
    big_cells = run_scoring_query(ref, "SELECT a.y, b.y FROM big a, big b WHERE b.x < 30", timeout=10)
    assert not big_cells.over_cap and len(big_cells.rows) == 90_000


def test_non_utf8_text_decodes_with_replacement(db):
    ref = benchmark_db(db)
    for result in (
        run_tool_query(ref, "SELECT id, v FROM raw", max_rows=5),
        run_scoring_query(ref, "SELECT id, v FROM raw", timeout=5),
    ):
        assert result.ok and result.rows == [(1, "A\ufffdB")]
    # the connection is back to normal decoding afterwards
    assert run_tool_query(ref, "SELECT b FROM t WHERE a = 3", max_rows=5).rows == [("row3",)]


def test_attacks_leave_other_threads_and_connections_working(db):
    ref = benchmark_db(db)
    baseline = _baseline(ref)
    attacks = list(WRITES.values()) + [
        "PRAGMA hard_heap_limit = 1",
        "PRAGMA soft_heap_limit = 1",
        "SELECT zeroblob(300000000)",
        "SELECT printf('%.*c', 999999999, 'x')",
    ]
    for sql in attacks:
        run_tool_query(ref, sql, max_rows=5)
    seen = []

    def other_thread():
        seen.append((_baseline(ref), run_scoring_query(ref, BASELINE_SQL, timeout=5).rows))

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen == [(baseline, baseline)]
    fresh = sqlite3.connect(db)  # a plain connection elsewhere in the process is unaffected
    assert fresh.execute("SELECT count(*) FROM t").fetchone() == (200,)
    fresh.close()


def test_real_superhero_file_unchanged_after_the_attack_suite(bird_superhero_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = bird_superhero_dir / "dev_databases" / "superhero" / "superhero.sqlite"
    before, listing = file_checksum(path), _listing(path.parent, tmp_path)
    for ref in (benchmark_db(path), user_db(path)):
        baseline = run_tool_query(ref, "SELECT count(*), sum(height_cm) FROM superhero", max_rows=5).rows
        statements = [sql.replace(" t ", " superhero ").replace("TABLE t", "TABLE superhero")
                      for sql in WRITES.values()]
        statements += [sql.format(target=tmp_path / "copy.sqlite") for sql in FILE_WRITES.values()]
        statements += ["SELECT zeroblob(300000000)", "SELECT printf('%.*c', 999999999, 'x')", "DROP TABLE superhero"]
        for sql in statements:
            assert not run_tool_query(ref, sql, max_rows=5).ok, sql
            assert not run_scoring_query(ref, sql, timeout=2).ok, sql
        result = run_tool_query(ref, "SELECT count(*) FROM superhero a, superhero b, superhero c", max_rows=5,
                                timeout=0.5)
        assert result.timed_out
        assert run_tool_query(ref, "SELECT count(*), sum(height_cm) FROM superhero", max_rows=5).rows == baseline
    assert file_checksum(path) == before
    assert _listing(path.parent, tmp_path) == listing


def test_allowlist_keeps_read_only_features(db):
    ref = benchmark_db(db)
    cases = {
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 4) SELECT sum(n) FROM r": [(10,)],
        "SELECT count(*) FROM json_each('[1, 2, 3]')": [(3,)],
        "SELECT name FROM pragma_table_info('t') ORDER BY cid": [("a",), ("b",)],
        "SELECT count(*) FROM sqlite_master WHERE type = 'table'": [(3,)],
        "SELECT a FROM v WHERE a < 2": [(0,), (1,)],
    }
    for sql, expected in cases.items():
        result = run_tool_query(ref, sql, max_rows=5)
        assert result.ok, result.error
        assert result.rows == expected
    info = run_tool_query(ref, "PRAGMA table_info(t)", max_rows=5)
    assert info.ok and [row[1] for row in info.rows] == ["a", "b"]
    assert run_tool_query(ref, "PRAGMA index_list(t)", max_rows=5).ok
    assert run_tool_query(ref, "PRAGMA foreign_key_list(t)", max_rows=5).ok
    assert run_tool_query(ref, "EXPLAIN QUERY PLAN SELECT * FROM t WHERE b = 'x'", max_rows=5).ok


def test_connections_per_thread_and_purpose(db):
    ref = benchmark_db(db)
    tool, scoring = tool_connection(ref), scoring_connection(ref)
    assert tool is tool_connection(ref) and scoring is scoring_connection(ref) and tool is not scoring
    others = []
    worker = threading.Thread(target=lambda: others.append(tool_connection(ref)))
    worker.start()
    worker.join()
    assert others[0] is not tool
    assert tool.isolation_level is None
    assert tool.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
    assert tool.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == LIMITS.max_value_length


VIRTUAL_READS = {  # a read of an R*Tree or full-text table, and what it returns
    "SELECT id FROM boxes WHERE min_x >= 0 AND max_x <= 20 ORDER BY id": [(1,), (2,)],
    "SELECT count(*) FROM boxes": [(3,)],
    "SELECT body FROM notes5 WHERE notes5 MATCH 'cheap' ORDER BY rowid": [("cheap flights",)],
    "SELECT highlight(notes5, 0, '<', '>') FROM notes5 WHERE notes5 MATCH 'hotels'": [("<hotels> nearby",)],
    "SELECT body FROM notes4 WHERE notes4 MATCH 'nearby'": [("hotels nearby",)],
}
VIRTUAL_WRITES = ["INSERT INTO boxes VALUES (9, 0, 1, 0, 1)", "UPDATE boxes SET min_x = 5", "DELETE FROM boxes",
                  "INSERT INTO boxes_node VALUES (7, x'00')", "INSERT INTO notes5(notes5) VALUES ('optimize')",
                  "INSERT INTO notes4 VALUES ('x')", "DELETE FROM notes5_data"]


@pytest.mark.parametrize("ref_kind", ["benchmark", "user"])
def test_virtual_tables_read_as_tables_and_refuse_writes(tmp_path, ref_kind):
    """An R*Tree or full-text table prepares writes to its shadow tables when a connection first reads it: a plain
    SELECT of one is a read, not a refused write attempt, and a write to it is still refused."""
    path = tmp_path / "virtual.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE VIRTUAL TABLE boxes USING rtree(id, min_x, max_x, min_y, max_y)")
        conn.executemany("INSERT INTO boxes VALUES (?, ?, ?, 0, 1)", [(1, 0, 10), (2, 5, 15), (3, 50, 60)])
        conn.execute("CREATE VIRTUAL TABLE notes5 USING fts5(body)")
        conn.execute("CREATE VIRTUAL TABLE notes4 USING fts4(body)")
        for table in ("notes5", "notes4"):
            conn.executemany(f"INSERT INTO {table} VALUES (?)", [("cheap flights",), ("hotels nearby",)])
    conn.close()
    before, listing = file_checksum(path), sorted(os.listdir(tmp_path))
    ref = benchmark_db(path) if ref_kind == "benchmark" else user_db(path)
    for sql, expected in VIRTUAL_READS.items():
        for result in (run_tool_query(ref, sql, max_rows=5), run_scoring_query(ref, sql, timeout=5)):
            assert result.ok and not result.write_attempt, (sql, result.error)
            assert result.rows == expected, sql
    for sql in VIRTUAL_WRITES:
        result = run_tool_query(ref, sql, max_rows=5)
        assert result.error and result.write_attempt, (sql, result.error)
    assert file_checksum(path) == before and sorted(os.listdir(tmp_path)) == listing


def test_a_virtual_table_whose_shadow_is_a_slow_view_cannot_hold_a_connection_open(tmp_path):
    """A file can put a view where an R*Tree's shadow table belongs; the view runs when the table connects, which a
    connection does as it opens. That is bounded (``LIMITS.virtual_tables_timeout``): a query of another table runs,
    and a query of the R*Tree itself ends by its own deadline or refusal; the file never changes."""
    import time

    path = tmp_path / "slow.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (7)")
        conn.execute("CREATE VIRTUAL TABLE r USING rtree(id, x0, x1)")
        conn.execute("DROP TABLE r_node")
        conn.execute("CREATE VIEW r_node(nodeno, data) AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                     "FROM n WHERE x < 3000000000) SELECT 1, zeroblob(100) FROM n WHERE x = 3000000000")
    conn.close()
    before = file_checksum(path)
    ref = benchmark_db(path)
    began = time.monotonic()
    result = run_tool_query(ref, "SELECT a FROM t", max_rows=5)
    assert result.ok and result.rows == [(7,)], result.error
    assert time.monotonic() - began < LIMITS.virtual_tables_timeout + 2 * MARGIN
    began = time.monotonic()
    assert run_tool_query(ref, "SELECT * FROM r", max_rows=5).error  # refused, or past its deadline
    assert time.monotonic() - began < LIMITS.tool_timeout + MARGIN
    assert file_checksum(path) == before


CTE_QUERIES = {  # real shapes, each measured at about its own length in tokens, and run
    "plain": ("WITH n AS (SELECT a FROM t WHERE a < 3) SELECT count(*) FROM n", [(3,)]),
    "columns_materialized": ("WITH n(k) AS MATERIALIZED (SELECT a FROM t), m AS NOT MATERIALIZED (SELECT k FROM n "
                             "WHERE k < 2) SELECT count(*) FROM m, n WHERE m.k = n.k", [(2,)]),
    "recursive": ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 50) SELECT max(i) FROM r",
                  [(50,)]),
    "nested": ('WITH "A" AS (SELECT a FROM t), b AS (WITH c AS (SELECT a FROM A) SELECT a FROM c UNION ALL '
               "SELECT a FROM a) SELECT count(*) FROM b", [(400,)]),
}


@pytest.mark.parametrize("case", CTE_QUERIES)
def test_real_cte_queries_are_measured_small_and_run(db, case):
    from t2s.env.databases.sqltext import cte_expansion

    sql, rows = CTE_QUERIES[case]
    assert cte_expansion(sql, LIMITS.max_cte_expansion) < 20 * len(sql.split())
    assert run_tool_query(benchmark_db(db), sql, max_rows=5).rows == rows


def test_cte_expansion_counts_every_copy_of_a_chain():
    """Each level of the chain doubles what SQLite compiles; quoted and bare names, a column list and a CTE inside
    another's body are all followed."""
    from t2s.bench.sandbox import cte_chain
    from t2s.env.databases.sqltext import MAX_CTES, cte_expansion

    small, deeper = cte_expansion(cte_chain(8), 10**9), cte_expansion(cte_chain(9), 10**9)
    assert 1.9 < deeper / small < 2.1 and small > 2**8
    assert cte_expansion(cte_chain(30), 1000) == 1001  # capped, never computed in full
    # a body of 17 tokens past its "(": each use of its name, quoted or bare, in any case, adds 16 more; so does one
    # inside another CTE's body, itself counted at each of its own uses
    body = "(SELECT 1, 2, 3, 4, 5, 6, 7, 8)"
    on_tables = cte_expansion(f'WITH x AS {body} SELECT * FROM "T", t', 10**9)
    assert cte_expansion(f'WITH x AS {body} SELECT * FROM "X", x', 10**9) == on_tables + 2 * 16
    # names sqlglot reads as keywords (SQLite as names) still count; more than MAX_CTES definitions are over the cap
    keywords = cte_chain(22).replace("c7_0", "first").replace("c14_1", "range").replace("c21_0", "filter")
    assert cte_expansion(keywords, 10**6) == 10**6 + 1
    def many(count: int) -> str:
        return "WITH " + ", ".join(f"n{i} AS (SELECT 1)" for i in range(count)) + " SELECT 1"

    assert cte_expansion(many(MAX_CTES), 10**9) < 10**4 and cte_expansion(many(MAX_CTES + 1), 10**9) == 10**9 + 1
    assert cte_expansion(cte_chain(21) + " /* an unclosed comment, which SQLite accepts", 10**9) is None
    nested = f"WITH x(v) AS {body}, y AS (WITH z AS (SELECT v FROM x) SELECT v FROM z) SELECT * FROM y"
    assert cte_expansion(nested, 10**9) > cte_expansion(nested.replace("FROM x", "FROM t"), 10**9) + 3 * 16
