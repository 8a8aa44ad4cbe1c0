"""Questions that cannot be scored are said, counted and left out: unreadable databases (probed at start-up) and gold
SQL that fails, in `eval` and `score`; duplicated question ids are refused by every command that loads data."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from t2s.commands import main
from t2s.data.loaders import load_json_rows, load_rows
from t2s.data.rows import DataError
from t2s.settings import REPO_ROOT

BROKEN = ("not_sqlite", "truncated", "damaged", "half_written")
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")  # a rollback journal's header: a writer stopped mid-transaction


def _root_page(db: Path, table: str) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    finally:
        conn.close()


def _bird_with_broken_databases(demo_dir: Path, folder: Path) -> Path:
    """A BIRD-layout folder: village_library as it is, three broken copies of it, and one gold SQL that fails."""
    source = demo_dir / "dev_databases" / "village_library" / "village_library.sqlite"
    records = [r for r in json.loads((demo_dir / "dev.json").read_text()) if r["db_id"] == "village_library"][:4]
    good = folder / "dev_databases" / "village_library"
    good.mkdir(parents=True)
    shutil.copy(source, good / "village_library.sqlite")
    data = source.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    damaged = bytearray(data)
    page = _root_page(source, "loans")
    damaged[(page - 1) * page_size : page * page_size] = b"\xab" * page_size
    contents = {"not_sqlite": b"just some text, not a database\n" * 10, "truncated": data[: len(data) // 2],
                "damaged": bytes(damaged), "half_written": data}
    for db_id, content in contents.items():
        (folder / "dev_databases" / db_id).mkdir(parents=True)
        (folder / "dev_databases" / db_id / f"{db_id}.sqlite").write_bytes(content)
    journal = folder / "dev_databases" / "half_written" / "half_written.sqlite-journal"
    journal.write_bytes(JOURNAL_MAGIC + bytes(page_size - len(JOURNAL_MAGIC)))
    rows = [dict(r, question_id=f"good{i}") for i, r in enumerate(records[:3])]
    rows.append(dict(records[3], question_id="gold_fails", SQL="SELECT no_such_column FROM loans"))
    for db_id in BROKEN:
        rows += [dict(r, question_id=f"{db_id}{i}", db_id=db_id) for i, r in enumerate(records[:2])]
    (folder / "dev.json").write_text(json.dumps(rows))
    return folder


def test_the_probe_names_each_broken_database(demo_dir, tmp_path):
    from t2s.data.db_probe import database_problems

    rows = load_json_rows(_bird_with_broken_databases(demo_dir, tmp_path / "bird") / "dev.json")
    problems = database_problems(rows)
    assert sorted(problems) == sorted(BROKEN)
    assert "not a database" in problems["not_sqlite"]
    assert "truncated" in problems["truncated"]
    assert "malformed" in problems["damaged"] and "loans" in problems["damaged"]
    assert "half-written" in problems["half_written"] and "hot journal" in problems["half_written"]


def test_a_pipe_or_folder_in_a_databases_place_is_unreadable_not_missing_and_never_blocks(demo_dir, tmp_path, capsys):
    """A FIFO opened for reading waits for a writer for ever; a folder is no database either. Both are named at
    start-up as unreadable (not as missing, which would send the user looking for a file that is there)."""
    data = _bird_with_broken_databases(demo_dir, tmp_path / "bird")
    for db_id in ("not_sqlite", "truncated"):
        os.remove(data / "dev_databases" / db_id / f"{db_id}.sqlite")
    os.mkfifo(data / "dev_databases" / "not_sqlite" / "not_sqlite.sqlite")
    (data / "dev_databases" / "truncated" / "truncated.sqlite").mkdir()
    out = tmp_path / "out"
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(out), "--quiet"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("Error: 4 database(s) cannot be read") and "database(s) missing" not in line
    for db_id in ("not_sqlite", "truncated"):
        assert f"{db_id} (cannot read {data / 'dev_databases' / db_id / db_id}.sqlite: not a regular file)" in line
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(out), "--quiet",
                 "--skip-missing-dbs"]) == 0
    summary = json.loads((out / "summary.json").read_text())["modes"]["full"]
    assert summary["skipped_unusable_dbs"] == 8 and summary["skipped_missing_dbs"] == 0


def test_eval_refuses_unreadable_databases_then_skips_and_counts_them(demo_dir, tmp_path, capsys):
    data = _bird_with_broken_databases(demo_dir, tmp_path / "bird")
    out = tmp_path / "out"
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: 4 database(s) cannot be read")
    assert all(db_id in err[0] for db_id in BROKEN) and "--skip-missing-dbs" in err[0]
    assert not (out / "full" / "episodes.jsonl").exists()

    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(out), "--quiet",
                 "--skip-missing-dbs"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())["modes"]["full"]
    assert summary["n"] == 3 and summary["execution_accuracy_official"] == 1.0 and summary["strict"] == 1.0
    assert summary["skipped_unusable_dbs"] == 8 and summary["unusable_db_ids"] == sorted(BROKEN)
    assert set(summary["unusable_dbs"]) == set(BROKEN)
    assert summary["gold_failures"] == 1 and summary["gold_failure_ids"] == ["gold_fails"]
    assert summary["per_difficulty"] and sum(b["n"] for b in summary["per_difficulty"].values()) == 3
    lines = [json.loads(line) for line in (out / "full" / "episodes.jsonl").read_text().splitlines()]
    failed = [line for line in lines if line["question_id"] == "gold_fails"]
    assert len(lines) == 4 and failed[0]["official"] is None and "gold SQL failed" in failed[0]["gold_error"]
    assert "skipped_unusable_dbs" in printed and "gold_failures" in printed
    assert "gold_fails" in printed and all(db_id in printed for db_id in BROKEN)
    assert "skipped (unreadable databases) | 8" in (out / "summary.md").read_text()


def test_eval_with_every_question_skipped_is_an_error_not_ex_zero(demo_dir, tmp_path, capsys):
    data = _bird_with_broken_databases(demo_dir, tmp_path / "bird")
    rows = [r for r in json.loads((data / "dev.json").read_text()) if r["db_id"] in BROKEN]
    (data / "dev.json").write_text(json.dumps(rows))
    out = tmp_path / "out"
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(out), "--quiet",
                 "--skip-missing-dbs"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: every selected question was skipped")
    assert "8 with an unreadable one" in err[0]
    assert not (out / "summary.json").exists()


def test_score_does_not_blame_predictions_for_broken_databases_or_gold(demo_dir, tmp_path, capsys):
    """Unreadable databases follow eval's rule: the run stops naming them, or --skip-missing-dbs skips and counts
    their questions."""
    data = _bird_with_broken_databases(demo_dir, tmp_path / "bird") / "dev.json"
    records = json.loads(data.read_text())
    predictions = tmp_path / "p.jsonl"
    predictions.write_text("\n".join(json.dumps({"question_id": r["question_id"], "sql": r["SQL"]}) for r in records))
    out = tmp_path / "out"
    argv = ["score", "--data", str(data), "--predictions", str(predictions), "--output", str(out), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: 4 database(s) cannot be read")
    assert all(db_id in err[0] for db_id in BROKEN) and "--skip-missing-dbs" in err[0]
    assert not out.exists()

    assert main([*argv, "--skip-missing-dbs"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["execution_accuracy_official"] == 1.0  # only the 3 scorable questions count
    assert summary["gold_failures"] == 1 and summary["gold_failure_ids"] == ["gold_fails"]
    broken_ids = sorted(r["question_id"] for r in records if r["db_id"] in BROKEN)
    assert summary["questions"] == len(records) - len(broken_ids) and summary["error_ids"] == []
    assert summary["n"] == summary["questions"] - 1  # n: the questions scored, as eval counts them
    assert summary["skipped_unusable_dbs"] == len(broken_ids) == 8 and summary["unusable_db_ids"] == sorted(BROKEN)
    lines = {line["question_id"]: line for line in map(json.loads, (out / "scores.jsonl").read_text().splitlines())}
    assert not set(lines) & set(broken_ids)
    problems = json.loads((out / "problems.json").read_text())
    assert sorted(problems["unusable_databases"]) == sorted(BROKEN)
    assert "their gold SQL fails" in printed and "failed or were blank" not in printed
    assert "8 questions skipped, their database unreadable" in printed


def test_a_wal_database_in_a_read_only_folder_is_read_not_reported(tmp_path):
    from t2s.data.db_probe import database_problems

    folder = tmp_path / "db" / "walled"
    folder.mkdir(parents=True)
    writer = sqlite3.connect(folder / "walled.sqlite")
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()
    shutil.copy(folder / "walled.sqlite-wal", tmp_path / "wal")  # the committed frames, as a closed writer leaves them
    writer.close()
    shutil.copy(tmp_path / "wal", folder / "walled.sqlite-wal")
    (folder / "walled.sqlite-shm").unlink(missing_ok=True)
    before = sorted(os.listdir(folder))
    folder.chmod(0o555)
    try:
        row = {"question_id": "1", "db_id": "walled", "db_path": str(folder / "walled.sqlite")}
        assert database_problems([row]) == {}
    finally:
        folder.chmod(0o755)
    assert sorted(os.listdir(folder)) == before  # nothing was created beside it


# ------------------------------------------------------------------------------------------------ duplicated ids
def _demo_copy_with_ids(demo_dir: Path, folder: Path, ids: list[str]) -> Path:
    records = json.loads((demo_dir / "dev.json").read_text())[: len(ids)]
    folder.mkdir(parents=True)
    (folder / "dev_databases").symlink_to(demo_dir / "dev_databases")
    (folder / "dev.json").write_text(json.dumps([dict(r, question_id=q) for r, q in zip(records, ids)]))
    return folder / "dev.json"


def test_duplicated_question_ids_are_refused_by_every_command(demo_dir, tmp_path, capsys):
    data = _demo_copy_with_ids(demo_dir, tmp_path / "dup", ["7"] * 6 + ["8", "9", "9", "10"])
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"question_id": "8", "sql": "SELECT 1"}))
    commands = [
        ["eval", "--policy", "gold", "--data", str(data), "--output", str(tmp_path / "eval"), "--quiet"],
        ["score", "--data", str(data), "--predictions", str(predictions), "--output", str(tmp_path / "score")],
        ["data", "check", "--data", str(data), "--no-cache"],
    ]
    for argv in commands:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("Error:"), err
        assert "7 (6 rows)" in err[0] and "9 (2 rows)" in err[0] and "8 (" not in err[0]
    assert not (tmp_path / "eval" / "full" / "episodes.jsonl").exists() and not (tmp_path / "score").exists()
    with pytest.raises(DataError, match="7 \\(6 rows\\)"):  # the training loader's path
        load_rows("bird", data)


def test_a_question_repeated_word_for_word_is_counted_once(demo_dir, tmp_path, capsys):
    data = _demo_copy_with_ids(demo_dir, tmp_path / "rep", ["a", "b", "c"])
    records = json.loads(data.read_text())
    data.write_text(json.dumps(records + [records[1]]))  # as BIRD mini-dev repeats two of its questions
    assert load_json_rows(data).repeated_ids == ["b"]
    assert main(["eval", "--policy", "gold", "--data", str(data), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["modes"]["full"]
    assert summary["n"] == summary["n_episodes"] == 3 and summary["repeated_question_ids"] == ["b"]
    assert "repeats questions word for word" in capsys.readouterr().out


def test_duplicated_ids_through_the_command_line(demo_dir, tmp_path):
    data = _demo_copy_with_ids(demo_dir, tmp_path / "dup", ["1", "1", "2"])
    done = subprocess.run([sys.executable, "-m", "t2s", "eval", "--policy", "gold", "--data", str(data), "--output",
                           str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "1 (2 rows)" in done.stderr and "Traceback" not in done.stderr


def test_eval_does_not_blame_an_empty_answer_for_a_failing_gold(demo_dir, tmp_path):
    data = _bird_with_broken_databases(demo_dir, tmp_path / "bird")
    records = json.loads((data / "dev.json").read_text())
    predictions = tmp_path / "p.jsonl"  # right answers, and nothing at all for the question whose gold fails
    predictions.write_text("\n".join(json.dumps({"question_id": r["question_id"], "sql": r["SQL"]})
                                     for r in records if r["question_id"] != "gold_fails"))
    out = tmp_path / "out"
    assert main(["eval", "--policy", "predictions", "--predictions", str(predictions), "--data", str(data),
                 "--output", str(out), "--quiet", "--skip-missing-dbs"]) == 0
    summary = json.loads((out / "summary.json").read_text())["modes"]["full"]
    assert summary["n"] == 3 and summary["execution_accuracy_official"] == 1.0
    assert summary["gold_failure_ids"] == ["gold_fails"]


def test_an_empty_file_and_a_database_without_tables_cannot_be_read(tmp_path, capsys):
    """SQLite opens a 0-byte file as an empty database: every question on it would fail its gold SQL in silence."""
    from t2s.data.db_probe import database_problems

    empty, bare = tmp_path / "empty" / "empty.sqlite", tmp_path / "bare" / "bare.sqlite"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    bare.parent.mkdir()
    with contextlib.closing(sqlite3.connect(bare)) as connection:
        connection.execute("PRAGMA user_version = 7")  # a valid database file, with no table
        connection.commit()
    assert bare.stat().st_size > 0
    rows = [{"question_id": "1", "db_id": "empty", "db_path": str(empty)},
            {"question_id": "2", "db_id": "bare", "db_path": str(bare)}]
    assert database_problems(rows) == {"empty": f"{empty} is empty (0 bytes), not a database",
                                       "bare": f"{bare} holds no tables"}
    assert empty.read_bytes() == b""  # the probe wrote nothing
    views = tmp_path / "views" / "views.sqlite"  # a database of views only answers questions all the same
    views.parent.mkdir()
    with contextlib.closing(sqlite3.connect(views)) as connection:
        connection.execute("CREATE VIEW answer AS SELECT 42 AS x")
        connection.commit()
    assert database_problems([{"question_id": "3", "db_id": "views", "db_path": str(views)}]) == {}
