"""Every scan of model output, SQL or data stays linear: adversarial text far larger than any real input (100,000
characters and more) is read in about a second.

Each case runs in a subprocess with a generous time limit: a scan that backtracks holds the GIL inside the regular
expression engine, where no in-process timeout can stop it, so a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LIMIT_SECONDS = 60  # each case takes about a second; the scans these cases replaced ran for hours

CASES = {
    # the leading-REINDEX check ran before SQLite saw the statement: 26 spaces took seconds, 40 took hours
    "spaces before a query": """
        result = run(" " * 90_000 + "SELECT 1")  # statements are at most 100,000 characters
        assert result.rows == [(1,)] and result.error is None, result
        assert run(" " * 200_000 + "SELECT 1").error == "Error: the SQL is longer than 100000 characters"
    """,
    "spaces before REINDEX": """
        result = run(" " * 200_000 + "REINDEX")
        assert result.write_attempt and "REINDEX" in result.error, result
    """,
    "comments and blank lines before REINDEX": """
        result = run("\\n \\t" * 30_000 + "-- note\\n" * 10_000 + "/* c */ " * 10_000 + "reindex")
        assert result.write_attempt, result
        result = run("/* */ " * 50_000 + "reindexer")  # another word: SQLite's own syntax error
        assert not result.write_attempt and result.error.startswith("Error:"), result
    """,
    "only comments": """
        from t2s.env.databases.sqltext import only_comments
        for n in (12_000, 50_000):  # 12,000 repeats fit in one statement; 50,000 are read by the scan alone
            for sql in ("/* a */" * n, "-- a\\n" * n + ";" * 1000, "/*" + " " * 7 * n):
                assert only_comments(sql) and not only_comments("x" + sql)
                if len(sql) < 100_000:
                    result = run(sql)
                    assert result.error == "Error: empty SQL", (sql[:20], result)
    """,
    "an unclosed code fence with a long run of spaces": """
        from t2s.env.turns import bare_sql, parse_turn
        assert bare_sql("```" + " " * 200_000) is None
        assert bare_sql("```sql" + " " * 200_000 + "\\nSELECT 1\\n```") == "SELECT 1"
        assert bare_sql("```sqlite\\n" + " " * 200_000 + "SELECT 2```") == "SELECT 2"
        assert bare_sql("```" * 100_000 + "select 3") == "select 3"
        assert parse_turn("</think>```" + " " * 200_000).calls == []
    """,
    "a bare query after a long text": """
        from t2s.env.turns import bare_sql
        assert bare_sql("selected " * 50_000 + "WITH x AS (SELECT 1) SELECT * FROM x").startswith("WITH x")
        assert bare_sql("selectwith" * 50_000) is None
    """,
    "printf formats with long flag and digit runs": """
        from t2s.env.databases.functions import printf_too_wide
        assert printf_too_wide("%" + "5" * 200_000 + "d", ())
        assert printf_too_wide("%" + "-" * 200_000 + "0" * 200_000 + "d", ()) is False
        assert printf_too_wide("%.*c", (" " * 100_000 + "9" * 100_000, "x"))
        assert printf_too_wide("%" * 400_000, ()) is False
        result = run("SELECT printf('%" + "7" * 90_000 + "d', 1)")
        assert "width or precision above" in result.error, result
    """,
    "tables of a very long query": """
        from t2s.env.schema import tables_in_sql
        assert tables_in_sql("SELECT * FROM t" + " JOIN t USING (a)" * 20_000) == set()
        assert tables_in_sql("SELECT * FROM a JOIN b USING (x)") == {"a", "b"}
    """,
    "DDL whose statements never end": """
        from t2s.env.databases.payloads import _ddl_statements
        trigger = "CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1;"
        assert len(_ddl_statements(trigger * 20_000)) == 20_000  # 1 MB; each piece is taken alone
        statements = _ddl_statements("CREATE TABLE t (a DEFAULT '" + ";" * 200_000 + "');")
        assert len(statements) == 1
        assert _ddl_statements("/*;" * 100_000 + "CREATE TABLE u (b);") == ["CREATE TABLE u (b);"]
    """,
}

PRELUDE = """
import sqlite3, sys, tempfile
from t2s.env.databases import DatabaseRef, run_tool_query
path = tempfile.mkdtemp() + "/d.sqlite"
sqlite3.connect(path).executescript("CREATE TABLE t (a); CREATE INDEX t_a ON t (a);")
def run(sql):
    return run_tool_query(DatabaseRef("d", path, False), sql, max_rows=5, timeout=30)
"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_adversarial_text_is_read_in_linear_time(case):
    code = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('done')\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                  timeout=LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: still running after {LIMIT_SECONDS} s")
    assert finished.returncode == 0 and finished.stdout.strip() == "done", finished.stderr[-3000:]
