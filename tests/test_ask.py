"""`python -m t2s ask --replay`: one episode on a user's SQLite file, read-only, as JSON or readable text."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

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
        'Count the dogs.</think>{"tool": "run_query", "args": {"sql": "SELECT COUNT(*) FROM pets WHERE kind = \'dog\'"}}',
        '</think>{"tool": "submit_sql", "args": {"sql": "SELECT COUNT(*) FROM pets WHERE kind = \'dog\'"}}',
    ])
    before = databases.file_checksum(path)
    out = ask("--db", path, "--replay", turns, "--json", "--mode", "withheld", "--evidence", "dogs: kind = 'dog'",
              "How many dogs are there?")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert tuple(record) == RECORD_KEYS and tuple(record["counters"]) == COUNTER_KEYS
    assert record["mode"] == "withheld" and record["db_id"] == "pets"
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
    assert "turn 1" in out.stdout and "Fido" in out.stdout
    assert "fallback" in out.stdout and "SELECT name FROM pets ORDER BY name" in out.stdout
    assert "result" in out.stdout and "Rex" in out.stdout


@pytest.mark.parametrize("case", ["missing_db", "not_a_db", "missing_turns", "bad_turns", "no_policy"])
def test_ask_errors_are_one_clear_line(tmp_path, wal_db, case):
    path, _ = wal_db
    good_turns = write_turns(tmp_path / "good.jsonl", ["</think>"])
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database at all " * 100)
    args = {
        "missing_db": ["--db", tmp_path / "nope.sqlite", "--replay", good_turns],
        "not_a_db": ["--db", junk, "--replay", good_turns],
        "missing_turns": ["--db", path, "--replay", tmp_path / "absent.jsonl"],
        "bad_turns": ["--db", path, "--replay", write_turns(tmp_path / "bad.jsonl", [{"x": 1}])],
        "no_policy": ["--db", path],
    }[case]
    out = ask(*args, "a question")
    assert out.returncode != 0
    assert out.stderr.strip().startswith("Error:") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nope.sqlite").exists()


def test_ask_on_demo_database(demo_dir, tmp_path):
    db = demo_dir / "dev_databases" / "cycling_club" / "cycling_club.sqlite"
    turns = write_turns(tmp_path / "t.jsonl", ['</think>{"tool": "submit_sql", "args": {"sql": "SELECT COUNT(*) FROM clubs"}}'])
    out = ask("--db", db, "--replay", turns, "--json", "How many clubs?")
    record = json.loads(out.stdout)
    assert record["final_sql"] == "SELECT COUNT(*) FROM clubs" and record["counters"]["submitted"] is True
