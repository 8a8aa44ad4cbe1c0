"""`python -m t2s ask --replay`: one episode on a user's SQLite file, read-only, as JSON or readable text."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from t2s.commands.ask import RECORD_EXTRA_KEYS
from t2s.env import databases
from t2s.env.episode import COUNTER_KEYS, RECORD_KEYS
from t2s.settings import REPO_ROOT


def ask(*args):
    return subprocess.run([sys.executable, "-m", "t2s", "ask", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)


def write_turns(path, turns):
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


@pytest.fixture()
def wal_db(tmp_path):
    """A user database in WAL mode with a recent, uncheckpointed write (``immutable`` would miss it)."""
    folder = tmp_path / "my #data?"
    folder.mkdir()
    path = folder / "pets.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE pets (name TEXT, kind TEXT)")
    conn.executemany("INSERT INTO pets VALUES (?, ?)", [("Rex", "dog"), ("Tom", "cat"), ("Fido", "dog")])
    conn.commit()
    yield path, conn
    conn.close()


def test_ask_json_on_a_replay_file(tmp_path, wal_db):
    path, _ = wal_db
    turns = write_turns(tmp_path / "turns.jsonl", [
        'I should list the tables.\n</think>\n\n{"tool": "list_tables", "args": {}}',
        ('Count the dogs.</think>{"tool": "run_query", '
         '"args": {"sql": "SELECT COUNT(*) FROM pets WHERE kind = \'dog\'"}}'),
        '</think>{"tool": "submit_sql", "args": {"sql": "SELECT COUNT(*) FROM pets WHERE kind = \'dog\'"}}',
    ])
    before = databases.file_checksum(path)
    out = ask("--db", path, "--replay", turns, "--json", "--mode", "withheld", "--evidence", "dogs: kind = 'dog'",
              "How many dogs are there?")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert tuple(record) == RECORD_KEYS + RECORD_EXTRA_KEYS and tuple(record["counters"]) == COUNTER_KEYS
    assert record["mode"] == "withheld" and record["db_id"] == "pets"
    # the question and the result rows the readable view shows
    assert record["question"] == "How many dogs are there?" and record["evidence"] == "dogs: kind = 'dog'"
    assert record["pred_result"] == {"columns": ["COUNT(*)"], "rows": [[2]], "more": False, "error": None}
    assert record["turns"][0]["observation"].startswith("[list_tables]\npets")
    assert "COUNT(*)\n2" in record["turns"][1]["observation"]  # the WAL's recent rows are visible
    assert record["final_sql_source"] == "submitted" and record["counters"]["turns"] == 3
    assert databases.file_checksum(path) == before


def test_ask_readable_view_and_running_out_of_turns(tmp_path, wal_db):
    path, _ = wal_db
    turns = write_turns(tmp_path / "turns.jsonl", [
        'Peek.</think>{"tool": "run_query", "args": {"sql": "SELECT name FROM pets ORDER BY name"}}',
    ])
    out = ask("--db", path, "--replay", turns, "--max-turns", "2", "Which pets are there?")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("question ask  db pets  mode full\nWhich pets are there?\n")  # echoed first
    assert out.stdout.count("Which pets are there?") == 1
    assert "turn 1" in out.stdout and "Fido" in out.stdout
    assert "fallback" in out.stdout and "SELECT name FROM pets ORDER BY name" in out.stdout
    assert "result" in out.stdout and "Rex" in out.stdout


@pytest.mark.parametrize("case, code", [("missing_db", 1), ("not_a_db", 1), ("empty_db", 1), ("folder_db", 1),
                                        ("fifo_db", 1), ("missing_turns", 1), ("bad_turns", 1), ("fifo_turns", 1),
                                        ("device_turns", 1), ("no_policy", 2), ("empty_question", 2)])
def test_ask_errors_are_one_clear_line(tmp_path, wal_db, case, code):
    """Bad input (a database, turns file that is missing or broken) exits 1; bad usage exits 2 (docs/evaluation.md)."""
    path, _ = wal_db
    good_turns = write_turns(tmp_path / "good.jsonl", ["</think>"])
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database at all " * 100)
    (tmp_path / "empty.sqlite").write_bytes(b"")
    os.mkfifo(tmp_path / "pipe.sqlite")  # opened, it would wait for a writer for ever
    os.mkfifo(tmp_path / "pipe.jsonl")
    args = {
        "empty_db": ["--db", tmp_path / "empty.sqlite", "--replay", good_turns],
        "folder_db": ["--db", tmp_path, "--replay", good_turns],
        "fifo_db": ["--db", tmp_path / "pipe.sqlite", "--replay", good_turns],
        "missing_db": ["--db", tmp_path / "nope.sqlite", "--replay", good_turns],
        "not_a_db": ["--db", junk, "--replay", good_turns],
        "missing_turns": ["--db", path, "--replay", tmp_path / "absent.jsonl"],
        "bad_turns": ["--db", path, "--replay", write_turns(tmp_path / "bad.jsonl", [{"x": 1}])],
        "fifo_turns": ["--db", path, "--replay", tmp_path / "pipe.jsonl"],  # hung for ever
        "device_turns": ["--db", path, "--replay", "/dev/zero"],  # read until memory ran out
        "no_policy": ["--db", path],
        "empty_question": ["--db", path, "--replay", good_turns, " "],
    }[case]
    out = ask(*args, "a question") if case != "empty_question" else ask(*args)
    assert out.returncode == code, out.stderr
    assert out.stderr.strip().startswith("Error:") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nope.sqlite").exists()
    expected = {
        "empty_db": f"Error: {tmp_path / 'empty.sqlite'} holds no tables (an empty file?): nothing to ask about",
        "folder_db": f"Error: database file is a folder, not a file: {tmp_path}",
        "fifo_db": f"Error: database file is not a regular file (a pipe or a device): {tmp_path / 'pipe.sqlite'}",
        "missing_db": f"Error: database file not found: {tmp_path / 'nope.sqlite'}",
        "missing_turns": f"Error: turns file not found: {tmp_path / 'absent.jsonl'}",
        "fifo_turns": f"Error: turns file is not a regular file (a pipe or a device): {tmp_path / 'pipe.jsonl'}",
        "device_turns": "Error: turns file is not a regular file (a pipe or a device): /dev/zero",
    }
    if case in expected:
        assert out.stderr.strip() == expected[case]
        assert (tmp_path / "empty.sqlite").read_bytes() == b""  # opened read-only: nothing written into it


def test_ask_on_demo_database(demo_dir, tmp_path):
    db = demo_dir / "dev_databases" / "cycling_club" / "cycling_club.sqlite"
    turns = write_turns(tmp_path / "t.jsonl",
                        ['</think>{"tool": "submit_sql", "args": {"sql": "SELECT COUNT(*) FROM clubs"}}'])
    out = ask("--db", db, "--replay", turns, "--json", "How many clubs?")
    record = json.loads(out.stdout)
    assert record["final_sql"] == "SELECT COUNT(*) FROM clubs" and record["counters"]["submitted"] is True


def test_ask_prints_database_text_as_written(tmp_path):
    """Cells, column names and the question are shown as written, never read as rich markup."""
    path = tmp_path / "marked.sqlite"
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE t ("[b]name[/b]" TEXT)')
    conn.execute("INSERT INTO t VALUES ('[red]Rex[/red]')")
    conn.commit()
    conn.close()
    sql = 'SELECT * FROM t'
    turns = write_turns(tmp_path / "t.jsonl", ['</think>{"tool": "submit_sql", "args": {"sql": "%s"}}' % sql])
    out = ask("--db", path, "--replay", turns, "Which [i]pets[/i]?")
    assert out.returncode == 0, out.stderr
    assert "[red]Rex[/red]" in out.stdout and "[b]name[/b]" in out.stdout and "Which [i]pets[/i]?" in out.stdout


@pytest.mark.parametrize("case", ["empty", "other_schema"])
def test_a_duckdb_file_without_tables_the_tools_show_is_one_line_as_an_empty_sqlite_file_is(tmp_path, case):
    """ask played a whole episode on a DuckDB file whose main schema holds no table ("the database has no tables")
    and exited 0, where an empty SQLite file is refused: both are refused, saying where the tables were looked for."""
    import duckdb

    path = tmp_path / f"{case}.duckdb"
    with duckdb.connect(str(path)) as conn:
        if case == "other_schema":
            conn.execute("CREATE SCHEMA s1; CREATE TABLE s1.t AS SELECT 1 AS x")
        else:
            conn.execute("CREATE TABLE gone (x INT); DROP TABLE gone")
    out = ask("--db", path, "--replay", write_turns(tmp_path / "t.jsonl", ["</think>"]), "a question")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == f"Error: {path} holds no tables in its main schema: nothing to ask about"
