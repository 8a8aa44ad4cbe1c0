"""Opening, references, fetching, scoring caps, gold caching and row-payload databases."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from t2s.env import databases
from t2s.env.databases import hashing, limits, payloads
from t2s.settings import REPO_ROOT
from t2s.env.databases import (
    DatabaseRef,
    build_payload_image,
    QueryResult,
    benchmark_db,
    database_uri,
    execute,
    file_checksum,
    gold_result,
    ref_from_row,
    register_payload,
    run_scoring_query,
    run_tool_query,
    scoring_timeout,
    tool_connection,
    user_db,
)


def _make_db(path: Path, rows: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i}") for i in range(rows)])
    conn.commit()
    conn.close()
    return path


def test_refs_are_plain_hashable_and_picklable(tmp_path):
    path = _make_db(tmp_path / "one.sqlite")
    ref = benchmark_db(path, "one")
    assert ref == DatabaseRef(db_id="one", path=str(path.resolve()), immutable=True)
    assert pickle.loads(pickle.dumps(ref)) == ref and hash(ref) == hash(pickle.loads(pickle.dumps(ref)))
    assert user_db(path).immutable is False and user_db(path).db_id == "one"
    assert benchmark_db(path).db_id == "one"
    row = {"question_id": "q", "db_id": "one", "db_path": str(path), "schema_id": None}
    assert ref_from_row(row) == ref
    payload_row = {"question_id": "q", "db_id": "s1", "db_path": None, "schema_id": "s1"}
    assert ref_from_row(payload_row) == DatabaseRef(db_id="s1", schema_id="s1")
    with pytest.raises(ValueError, match="^Error:"):
        ref_from_row({"question_id": "q", "db_id": "x", "db_path": None, "schema_id": None})


def test_uri_is_built_by_pathlib_and_flags_follow_the_kind(tmp_path):
    path = tmp_path / "a#b?c d%.sqlite"
    uri = database_uri(str(path), immutable=True)
    assert uri == path.resolve().as_uri() + "?mode=ro&immutable=1"
    assert "#" not in uri and uri.count("?") == 1
    assert database_uri(str(path), immutable=False).endswith("?mode=ro")


def test_path_with_hash_and_question_mark(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "odd#dir?x"
    path = _make_db(folder / "we#ird?name.sqlite", rows=3)
    before, listing = file_checksum(path), (sorted(os.listdir(folder)), sorted(os.listdir(tmp_path)))
    for ref in (benchmark_db(path), user_db(path)):
        result = run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5)
        assert result.ok and result.rows == [(3,)]
    assert (sorted(os.listdir(folder)), sorted(os.listdir(tmp_path))) == listing  # no stray empty database
    assert file_checksum(path) == before


def test_missing_and_invalid_files_give_clear_errors(tmp_path):
    missing = run_tool_query(benchmark_db(tmp_path / "nope.sqlite"), "SELECT 1", max_rows=5)
    assert missing.error.startswith("Error: database file not found") and "nope.sqlite" in missing.error
    assert not (tmp_path / "nope.sqlite").exists()
    scoring = run_scoring_query(benchmark_db(tmp_path / "nope.sqlite"), "SELECT 1", timeout=1)
    assert scoring.error.startswith("Error: database file not found")
    os.mkfifo(tmp_path / "pipe.sqlite")  # a path that is there but no file: said so, never opened (it would block)
    piped = run_tool_query(benchmark_db(tmp_path / "pipe.sqlite"), "SELECT 1", max_rows=5)
    assert piped.error == f"Error: database file is not a regular file (a pipe or a device): {tmp_path / 'pipe.sqlite'}"
    assert run_scoring_query(benchmark_db(tmp_path / "pipe.sqlite"), "SELECT 1", timeout=1).error == piped.error
    os.mkfifo(tmp_path / "pipe.duckdb")
    assert "database file is not a regular file" in run_tool_query(user_db(tmp_path / "pipe.duckdb"), "SELECT 1",
                                                                    max_rows=5).error
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    result = run_tool_query(benchmark_db(junk), "SELECT 1", max_rows=5)
    assert result.error.startswith("Error: cannot open database") and not result.ok
    assert run_tool_query(DatabaseRef(db_id="nothing"), "SELECT 1", max_rows=5).error.startswith("Error:")


def test_empty_databases(tmp_path):
    zero = tmp_path / "zero.sqlite"
    zero.write_bytes(b"")
    no_tables = tmp_path / "none.sqlite"
    sqlite3.connect(no_tables).execute("PRAGMA user_version = 1").close()
    for path in (zero, no_tables):
        before = file_checksum(path)
        ref = benchmark_db(path)
        assert run_tool_query(ref, "SELECT count(*) FROM sqlite_master", max_rows=5).rows == [(0,)]
        missing = run_tool_query(ref, "SELECT * FROM t", max_rows=5)
        assert missing.error == "Error: no such table: t"
        assert run_tool_query(ref, "CREATE TABLE t (x)", max_rows=5).write_attempt
        assert file_checksum(path) == before
    assert zero.stat().st_size == 0


def _wal_writer(path, *statements) -> sqlite3.Connection:
    """Another program's connection to ``path`` in WAL mode, in autocommit, after running ``statements``."""
    writer = sqlite3.connect(path, isolation_level=None)
    for statement in ("PRAGMA journal_mode = WAL", *statements):
        writer.execute(statement)
    return writer


def test_wal_user_database_shows_latest_data(tmp_path):
    path = tmp_path / "wal.sqlite"
    writer = _wal_writer(path, "PRAGMA wal_autocheckpoint = 0", "CREATE TABLE t (a)", "INSERT INTO t VALUES (1), (2)")
    assert (tmp_path / "wal.sqlite-wal").stat().st_size > 0  # the rows live only in the WAL so far
    ref = user_db(path)
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(2,)]
    writer.execute("INSERT INTO t VALUES (3)")
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(3,)]
    assert benchmark_db(path).immutable is False  # WAL files are never opened immutable
    assert run_tool_query(ref, "INSERT INTO t VALUES (4)", max_rows=5).write_attempt
    assert writer.execute("SELECT count(*) FROM t").fetchone() == (3,)
    writer.close()


def _folder_state(folder: Path) -> dict:
    """Every file in a folder with its checksum."""
    return {name: file_checksum(folder / name) for name in sorted(os.listdir(folder))}


def _crash_mid_transaction(path: Path) -> None:
    """A writer killed (SIGKILL) in the middle of a transaction that has already written pages to the file."""
    code = (
        "import os, signal, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA cache_size = 10')\n"  # a small cache spills changed pages to the file early
        "conn.execute('BEGIN')\n"
        "conn.execute('UPDATE t SET a = -1')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], timeout=60)
    assert done.returncode == -signal.SIGKILL


def test_a_half_written_database_is_reported_not_read(tmp_path):
    folder = tmp_path / "bench"
    path = folder / "half.sqlite"
    conn = sqlite3.connect(_make_db(path, rows=0))
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 200) for i in range(20_000)])
    conn.commit()
    conn.close()
    _crash_mid_transaction(path)
    assert (folder / "half.sqlite-journal").stat().st_size > 0
    before = _folder_state(folder)
    ref = benchmark_db(path)
    scored = run_scoring_query(ref, "SELECT count(*) FROM t WHERE a = -1", timeout=5)
    assert not scored.ok and "half-written" in scored.error, scored.rows  # never a mix of old and new pages
    problem = databases.database_problem(ref)
    assert problem.startswith(f"{path} is half-written: a hot journal ({path}-journal)")
    assert scored.error == f"Error: {problem}" and not ref.immutable
    assert run_tool_query(user_db(path), "SELECT 1 FROM t", max_rows=1).error == f"Error: {problem}"
    assert gold_result(ref, "SELECT count(*) FROM t").error == f"Error: {problem}"
    from t2s.data.db_probe import database_problems  # the eval start-up check reports it

    assert problem in database_problems([{"db_id": "half", "db_path": str(path)}])["half"]
    databases.close_thread_connections()
    assert _folder_state(folder) == before  # the journal is left for its owner to roll back
    assert databases.database_problem(benchmark_db(_make_db(tmp_path / "clean.sqlite"))) is None


def test_pipes_beside_or_instead_of_a_database_are_never_opened(tmp_path):
    """A FIFO opened for reading waits for a writer for ever: a database folder holding one (as the database, or as
    its -journal or -wal) is looked at without blocking, and a pipe is never hashed as a database."""
    path = _make_db(tmp_path / "db.sqlite", rows=3)
    for side in ("-journal", "-wal"):
        os.mkfifo(f"{path}{side}")
        problem = f"{path}{side} beside the database is not a regular file (a pipe or a folder?): SQLite cannot " \
                  "read past it"
        assert databases.database_problem(benchmark_db(path)) == problem
        for ref in (benchmark_db(path), user_db(path)):
            assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).error == f"Error: {problem}"
        os.remove(f"{path}{side}")
    assert run_tool_query(user_db(path), "SELECT count(*) FROM t", max_rows=5).rows == [(3,)]
    import duckdb  # DuckDB's own WAL (X.duckdb.wal) as a FIFO: DuckDB opened it and waited for ever

    duck = tmp_path / "db.duckdb"
    with duckdb.connect(str(duck)) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    os.mkfifo(f"{duck}.wal")
    problem = f"{duck}.wal beside the database is not a regular file (a pipe or a folder?): DuckDB cannot read past it"
    assert databases.database_problem(user_db(duck)) == problem
    assert run_tool_query(user_db(duck), "SELECT count(*) FROM t", max_rows=5).error == f"Error: {problem}"
    assert run_scoring_query(benchmark_db(duck), "SELECT 1", timeout=5).error == f"Error: {problem}"
    os.remove(f"{duck}.wal")
    assert run_tool_query(user_db(duck), "SELECT count(*) FROM t", max_rows=5).rows == [(1,)]
    pipe = tmp_path / "pipe.sqlite"
    os.mkfifo(pipe)
    assert hashing.database_hash(DatabaseRef(db_id="pipe", path=str(pipe))).startswith("missing:")
    assert gold_result(benchmark_db(pipe), "SELECT 1").error == \
        f"Error: database file is not a regular file (a pipe or a device): {pipe}"
    with pytest.raises(OSError, match="not a regular file"):
        file_checksum(pipe)


@pytest.mark.parametrize("engine", ["sqlite", "duckdb"])
def test_a_folder_or_a_link_that_leads_nowhere_is_said_so_as_ask_and_every_tool_say_it(tmp_path, capsys, engine):
    """One wording for a database path that is no file, from the tools, the scorer and ``ask`` alike: a folder, a
    symbolic link whose target is gone, and one that loops are each named for what they are, never "not found"."""
    from t2s.commands import main

    folder = tmp_path / f"folder.{engine}"
    folder.mkdir()
    dangling, looping = tmp_path / f"gone.{engine}", tmp_path / f"loop.{engine}"
    dangling.symlink_to(tmp_path / "absent")
    looping.symlink_to(looping)
    nowhere = "is a symbolic link that leads nowhere (its target is missing, or it loops)"
    turns = tmp_path / "turns.jsonl"
    turns.write_text(json.dumps('{"tool": "submit_sql", "args": {"sql": "SELECT 1"}}') + "\n")
    for path, phrase in ((folder, "is a folder, not a file"), (dangling, nowhere), (looping, nowhere)):
        expected = f"Error: database file {phrase}: {path}"
        # the tools open the file the link leads to, and name it where it is missing
        opened = f"Error: database file not found: {tmp_path / 'absent'}" if path == dangling else expected
        assert run_tool_query(user_db(path), "SELECT 1", max_rows=5).error == opened
        assert run_scoring_query(benchmark_db(path), "SELECT 1", timeout=1).error == opened
        assert main(["ask", "a question", "--db", str(path), "--replay", str(turns)]) == 1
        assert capsys.readouterr().err.strip() == expected


def _wal_database(folder: Path, shm: bool) -> Path:
    """A WAL database whose last commit is only in its -wal file (the writer exited without a checkpoint)."""
    path = folder / "wal.sqlite"
    conn = sqlite3.connect(_make_db(path, rows=3))
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    code = ("import os, sqlite3, sys\n"
            "conn = sqlite3.connect(sys.argv[1])\n"
            "conn.execute('PRAGMA wal_autocheckpoint = 0')\n"
            "conn.execute('INSERT INTO t VALUES (99, ?)', ('from the wal',))\n"
            "conn.commit()\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    assert (folder / "wal.sqlite-wal").stat().st_size > 0
    if not shm:
        (folder / "wal.sqlite-shm").unlink()
    return path


@pytest.mark.parametrize("files", ["db+wal+shm", "db+wal", "db"])
def test_wal_databases_are_read_without_writing_beside_them(tmp_path, files):
    folder = tmp_path / "users folder"
    folder.mkdir()
    if files == "db":  # checkpointed: everything is in the file, which still says WAL mode
        path = _make_db(folder / "wal.sqlite", rows=3)
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("INSERT INTO t VALUES (99, 'from the wal')")
        conn.commit()
        conn.close()
    else:
        path = _wal_database(folder, shm=files == "db+wal+shm")
    before = _folder_state(folder)
    assert sorted(before) == {"db": ["wal.sqlite"], "db+wal": ["wal.sqlite", "wal.sqlite-wal"],
                              "db+wal+shm": ["wal.sqlite", "wal.sqlite-shm", "wal.sqlite-wal"]}[files]
    for ref in (user_db(path), benchmark_db(path)):
        assert run_tool_query(ref, "SELECT count(*), max(b) FROM t", max_rows=5).rows == [(4, "v2")]
        assert run_tool_query(ref, "SELECT b FROM t WHERE a = 99", max_rows=5).rows == [("from the wal",)]
        assert run_scoring_query(ref, "SELECT a FROM t ORDER BY a DESC LIMIT 1", timeout=5).rows == [(99,)]
        assert run_tool_query(ref, "INSERT INTO t VALUES (5, 'no')", max_rows=5).write_attempt
        assert _folder_state(folder) == before  # nothing created or written, also while connections are open
    databases.close_thread_connections()
    assert _folder_state(folder) == before
    turns = tmp_path / "turns.jsonl"
    turns.write_text(json.dumps('</think>{"tool": "submit_sql", "args": {"sql": "SELECT b FROM t WHERE a = 99"}}')
                     + "\n")
    asked = subprocess.run([sys.executable, "-m", "t2s", "ask", "--db", str(path), "--replay", str(turns), "--json",
                            "Which row came last?"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["final_sql"] == "SELECT b FROM t WHERE a = 99"
    assert _folder_state(folder) == before


def test_reading_never_removes_the_wal_of_a_writer_with_an_open_transaction(tmp_path):
    """Another program's open transaction has spilled frames into an otherwise checkpointed ``-wal``: reading the file
    through it leaves it in place, so that the commit lands (a connection opened in place deleted it on close, as the
    file's last: the transaction's rows were lost)."""
    path = tmp_path / "live.sqlite"
    writer = _wal_writer(path, "CREATE TABLE t (a, b)", "INSERT INTO t VALUES (0, 'committed')",
                         "PRAGMA wal_checkpoint(TRUNCATE)")
    writer.execute("PRAGMA cache_size = 5")  # the open transaction spills its pages into the -wal
    writer.execute("BEGIN")
    writer.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 200) for i in range(1, 3001)])
    wal = tmp_path / "live.sqlite-wal"
    assert wal.stat().st_size > 0
    ref = user_db(path)
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=1).rows == [(1,)]  # what is committed
    databases.close_thread_connections()
    assert wal.is_file()
    writer.execute("COMMIT")
    writer.close()
    with sqlite3.connect(path) as fresh:
        assert fresh.execute("SELECT count(*) FROM t").fetchone() == (3001,)
    fresh.close()


def test_a_damaged_wal_is_left_as_it_was(tmp_path):
    """A ``-wal`` holding no valid frame (damaged) beside a rollback-mode file: read, closed, still there unchanged."""
    import random

    path = _make_db(tmp_path / "d.sqlite", rows=3)
    wal = tmp_path / "d.sqlite-wal"
    wal.write_bytes(random.Random(0).randbytes(5000))
    before = _folder_state(tmp_path)
    for ref in (user_db(path), benchmark_db(path)):
        assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=1).rows == [(3,)]
        snapshot = getattr(tool_connection(ref), "snapshot", None)  # removes the private copy it reads
        copy = Path(snapshot.peek()[2][0]) if snapshot is not None else None
        databases.close_thread_connections()
        assert _folder_state(tmp_path) == before
        assert copy is not None and copy != tmp_path and not copy.exists()


def test_tool_fetch_is_bounded_and_reports_more(tmp_path):
    ref = benchmark_db(_make_db(tmp_path / "f.sqlite", rows=10))
    exact = run_tool_query(ref, "SELECT a FROM t ORDER BY a", max_rows=10)
    assert exact.rows == [(i,) for i in range(10)] and not exact.more
    cut = run_tool_query(ref, "SELECT a FROM t ORDER BY a", max_rows=3)
    assert cut.rows == [(0,), (1,), (2,)] and cut.more and cut.columns == ["a"]
    assert run_tool_query(ref, "SELECT a FROM t WHERE a < 0", max_rows=3).rows == []


def test_scoring_caps_on_cells_and_bytes(tmp_path):
    ref = benchmark_db(_make_db(tmp_path / "c.sqlite", rows=100))
    conn = databases.scoring_connection(ref)
    full = execute(conn, "SELECT a, b FROM t", timeout=5, max_rows=None, max_cells=200)
    assert full.ok and not full.over_cap and len(full.rows) == 100
    cells = execute(conn, "SELECT a, b FROM t", timeout=5, max_rows=None, max_cells=199)
    assert cells.over_cap and cells.ok and len(cells.rows) * 2 <= 199
    wide = "SELECT a, printf('%.*c', 1000, 'x') FROM t"
    assert execute(conn, wide, timeout=5, max_rows=None, max_bytes=10_000).over_cap
    assert not execute(conn, wide, timeout=5, max_rows=None, max_bytes=1_000_000).over_cap


def test_execute_never_raises(tmp_path):
    ref = benchmark_db(_make_db(tmp_path / "e.sqlite"))
    conn = tool_connection(ref)
    for sql in (None, 42, "", "   ", "-- just a comment", "SELEC 1", "SELECT * FROM nowhere", "SELECT 'unterminated"):
        result = execute(conn, sql, timeout=1, max_rows=5)
        assert isinstance(result, QueryResult) and result.error.startswith("Error:"), sql
    plain = sqlite3.connect(":memory:")
    assert execute(plain, "SELECT 1", timeout=1, max_rows=5).error.startswith("Error: queries run only on sandboxed")
    other = databases.tool_connection(benchmark_db(_make_db(tmp_path / "closed.sqlite")))
    databases.close_thread_connections()
    assert execute(other, "SELECT 1", timeout=1, max_rows=5).error.startswith("Error:")
    assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(10,)]  # reopened on demand


def test_scoring_timeout_rule():
    assert scoring_timeout(0.01) == 5.0
    assert scoring_timeout(1.2) == pytest.approx(12.0)
    assert scoring_timeout(100) == 30.0


def test_gold_results_are_cached_by_file_hash_and_sql(tmp_path, monkeypatch):
    path = _make_db(tmp_path / "g.sqlite", rows=5)
    ref = benchmark_db(path)
    calls = []
    real = hashing.file_checksum
    monkeypatch.setattr(hashing, "file_checksum", lambda p: calls.append(p) or real(p))
    first = gold_result(ref, "SELECT sum(a) FROM t")
    assert first.rows == [(10,)] and first.seconds > 0
    assert gold_result(ref, "SELECT sum(a) FROM t") is first
    assert gold_result(user_db(path), "SELECT sum(a) FROM t") is first  # same file content, same cache entry
    other = gold_result(ref, "SELECT count(*) FROM t")
    assert other.rows == [(5,)] and other is not first
    assert len(calls) == 1  # the file is hashed once, not per call
    broken = gold_result(ref, "SELECT nope FROM t")
    assert broken.error == "Error: no such column: nope"


def test_gold_runs_on_a_connection_the_tools_never_touch(tmp_path):
    ref = benchmark_db(_make_db(tmp_path / "s.sqlite", rows=4))
    run_tool_query(ref, "CREATE TEMP VIEW t AS SELECT 100 AS a", max_rows=5)
    assert gold_result(ref, "SELECT max(a) FROM t").rows == [(3,)]
    assert databases.scoring_connection(ref) is not tool_connection(ref)


def test_row_payload_database(tmp_path):
    ddl = """
        CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id), data TEXT, n INTEGER);
        CREATE TABLE broken (x INTEGR PRIMARY KEY KEY);
        THIS IS NOT SQL;
    """
    rows = {
        "parent": [{"id": 1, "name": "a"}, {"id": 1, "name": "duplicate"}, {"id": 2, "name": "b"}],
        "child": [
            {"id": 1, "parent_id": 99, "data": {"k": [1, 2]}, "n": 2**70},
            {"id": 2, "parent_id": 1, "data": [1, "x"], "n": -(2**70), "unknown_column": 5},
        ],
        "no_such_table": [{"x": 1}],
    }
    ref = register_payload("payload-test-1", ddl, rows)
    assert ref == DatabaseRef(db_id="payload-test-1", schema_id="payload-test-1")
    assert register_payload("payload-test-1", ddl, rows) == ref  # the same content: built once
    assert run_tool_query(ref, "SELECT id, name FROM parent ORDER BY id", max_rows=5).rows == [(1, "a"), (2, "b")]
    children = run_tool_query(ref, "SELECT id, parent_id, data, n FROM child ORDER BY id", max_rows=5).rows
    assert children == [(1, 99, '{"k": [1, 2]}', 2**63 - 1), (2, 1, '[1, "x"]', -(2**63))]  # FK not enforced
    assert json.loads(children[0][2]) == {"k": [1, 2]}
    assert run_tool_query(ref, "SELECT count(*) FROM broken", max_rows=5).error == "Error: no such table: broken"
    assert run_tool_query(ref, "DELETE FROM parent", max_rows=5).write_attempt
    assert gold_result(ref, "SELECT count(*) FROM parent").rows == [(2,)]
    seen = []

    def reader():
        conn = tool_connection(ref)
        seen.append((id(conn), run_tool_query(ref, "SELECT count(*) FROM child", max_rows=5).rows))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [rows for _, rows in seen] == [[(2,)]] * 3
    missing = run_tool_query(DatabaseRef(db_id="x", schema_id="never-registered"), "SELECT 1", max_rows=5)
    assert missing.error.startswith("Error:") and "not registered" in missing.error
    with pytest.raises(ValueError, match="^Error:"):
        register_payload("payload-too-big", "CREATE TABLE t (x)", {"t": [{"x": "y" * 5000}]}, max_bytes=1000)


def test_payload_copies_stay_within_the_byte_bound(monkeypatch):
    refs = [
        register_payload(f"bound-{i}", "CREATE TABLE t (x)", {"t": [{"x": "z" * 2000} for _ in range(20)]})
        for i in range(4)
    ]
    image_size = len(payloads._payloads._images["bound-0"][0])
    bound = payloads._payloads.total + 2 * image_size
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, payload_cache_bytes=bound))
    for ref in refs:
        assert run_tool_query(ref, "SELECT count(*) FROM t", max_rows=5).rows == [(20,)]
        assert payloads._payloads.total <= bound
    copies = [key for key in payloads._thread_copies() if key[1] in refs]
    assert 0 < len(copies) <= 2  # the oldest copies were closed to make room
    assert run_tool_query(refs[0], "SELECT count(*) FROM t", max_rows=5).rows == [(20,)]  # reopened on demand


def test_payload_copies_are_released_when_their_thread_ends():
    ref = register_payload("released-1", "CREATE TABLE t (x)", {"t": [{"x": 1}]})
    before = payloads._payloads.total
    results = []
    worker = threading.Thread(target=lambda: results.append(run_tool_query(ref, "SELECT x FROM t", max_rows=5).rows))
    worker.start()
    worker.join()
    del worker
    import gc

    gc.collect()
    assert results == [[(1,)]]
    assert payloads._payloads.total == before


def _open_files(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    target, count = str(path.resolve()), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:  # closed meanwhile
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count open descriptors")
def test_a_threads_connections_are_closed_when_the_thread_ends(tmp_path):
    """Pools come and go (a training run starts one per rollout): each worker's connections are closed when it ends,
    not when the garbage collector next runs a full pass, which is rare in a process holding a model."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    path = _make_db(tmp_path / "pooled.sqlite")
    ref = benchmark_db(path, "pooled")
    assert _open_files(path) == 0
    was_enabled = gc.isenabled()
    gc.disable()  # as if no full pass came
    try:
        for _ in range(3):
            with ThreadPoolExecutor(4) as pool:
                def one(i):
                    return (run_tool_query(ref, f"SELECT trim(b) FROM t WHERE a = {i}", max_rows=5).rows,
                            run_scoring_query(ref, "SELECT count(*) FROM t", timeout=5).rows)

                done = list(pool.map(one, range(16)))
            assert done[3] == ([("v3",)], [(10,)])
            assert _open_files(path) == 0
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("ddl", ["", "   -- nothing here\n",
                                 "CREATE TABLE t (a INTEGR PRIMARY KEY KEY); NOT SQL AT ALL;"])
def test_a_payload_without_tables_loads_as_an_empty_database(ddl):
    image, counts = build_payload_image(ddl, {"t": [{"a": 1}]})
    assert counts["ddl_ok"] == 0 and counts["tables_skipped"] == 1
    conn = sqlite3.connect(":memory:")
    conn.deserialize(image)
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    ref = register_payload(f"empty-{len(ddl)}", ddl, {"t": [{"a": 1}]})
    result = run_tool_query(ref, "SELECT a FROM t", max_rows=5)
    assert result.error == "Error: no such table: t" and not result.write_attempt
    assert run_tool_query(ref, "SELECT 1 + 1", max_rows=5).rows == [(2,)]


def test_a_broken_ddl_statement_does_not_hide_the_next_ones():
    ddl = """
        CREATE TABLE first (id INTEGER PRIMARY KEY, note TEXT DEFAULT 'a;b');
        CREATE TABLE unbalanced (id INTEGER, name TEXT;
        -- a comment; with a semicolon
        CREATE TABLE second (id INTEGER, label TEXT /* ; inside a comment */);
        CREATE TRIGGER second_audit AFTER INSERT ON second BEGIN SELECT 1; SELECT 2; END;
        CREATE TABLE third (x)
    """
    statements = payloads._ddl_statements(ddl)
    assert [s.split()[0:3] for s in statements] == [
        ["CREATE", "TABLE", "first"], ["CREATE", "TABLE", "unbalanced"], ["--", "a", "comment;"],
        ["CREATE", "TRIGGER", "second_audit"], ["CREATE", "TABLE", "third"],
    ]
    image, counts = build_payload_image(ddl, {"first": [{"id": 1}], "second": [{"id": 2, "label": "b"}],
                                              "third": [{"x": 3}]})
    assert counts == {"ddl_ok": 4, "ddl_skipped": 1, "rows": 3, "rows_skipped": 0, "tables_skipped": 0}
    conn = sqlite3.connect(":memory:")
    conn.deserialize(image)
    names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    assert names == ["first", "second", "third"]
    assert conn.execute("SELECT note FROM first").fetchall() == [("a;b",)]


def test_an_unterminated_quote_does_not_swallow_the_rest():
    ddl = "CREATE TABLE a (x DEFAULT 'open); CREATE TABLE b (y); CREATE TABLE c (z);"
    statements = payloads._ddl_statements(ddl)
    assert [s.strip() for s in statements] == ["CREATE TABLE a (x DEFAULT 'open);", "CREATE TABLE b (y);",
                                               "CREATE TABLE c (z);"]
    _, counts = build_payload_image(ddl, {})
    assert counts["ddl_ok"] == 2 and counts["ddl_skipped"] == 1


def test_reregistering_an_id_with_other_content_is_refused():
    ref = register_payload("changed-1", "CREATE TABLE t (x, y)", {"t": [{"x": 1, "y": 2}]})
    # the same content in another key order is the same database
    assert register_payload("changed-1", "CREATE TABLE t (x, y)", {"t": [{"y": 2, "x": 1}]}) == ref
    for ddl, rows in (("CREATE TABLE t (x, y)", {"t": [{"x": 2, "y": 2}]}), ("CREATE TABLE u (x)", {"t": []})):
        with pytest.raises(ValueError, match="^Error: row-payload database 'changed-1' is already registered with"):
            register_payload("changed-1", ddl, rows)
    assert run_tool_query(ref, "SELECT x FROM t", max_rows=5).rows == [(1,)]  # the first image is kept
    # an id whose build failed is not claimed: it can be registered with other content afterwards
    with pytest.raises(ValueError, match="bytes, above"):
        register_payload("changed-2", "CREATE TABLE t (x)", {"t": [{"x": "y" * 5000}]}, max_bytes=1000)
    small = register_payload("changed-2", "CREATE TABLE t (x)", {"t": [{"x": "small"}]}, max_bytes=1000 * 1000)
    assert run_tool_query(small, "SELECT x FROM t", max_rows=5).rows == [("small",)]


def test_an_evicted_payload_is_rebuilt_from_the_same_content():
    ref = register_payload("evicted-1", "CREATE TABLE t (x)", {"t": [{"x": 7}]})
    with payloads._payloads._lock:
        image, _ = payloads._payloads._images.pop("evicted-1")
        payloads._payloads.total -= len(image)
    assert register_payload("evicted-1", "CREATE TABLE t (x)", {"t": [{"x": 7}]}) == ref
    assert run_scoring_query(ref, "SELECT x FROM t", timeout=5).rows == [(7,)]


def test_a_watchdog_interrupt_never_reaches_a_later_statement(tmp_path, monkeypatch):
    """Statements overdue from their start are claimed and interrupted by the watchdog, racing their own end, while
    the statement run next on the same connection, far from its deadline, always completes (databases' ticket rules).
    The watchdog is made slow to interrupt, so an interrupt that could land late would land on the next statement.
    """
    import time

    ref = benchmark_db(_make_db(tmp_path / "race.sqlite", rows=300))
    conn = tool_connection(ref)

    def slow_interrupt(self):
        time.sleep(0.002)  # between the watchdog's claim and the interrupt, the worker thread runs on
        sqlite3.Connection.interrupt(self)

    # the watchdog scans without pause
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, watchdog_poll=0.0))
    monkeypatch.setattr(databases.SandboxConnection, "interrupt", slow_interrupt)
    queries = [f"SELECT count(*) FROM t a, t b WHERE a.a < {n}" for n in (1, 3, 10, 30)]  # from µs to ms
    interrupted = 0
    execute(conn, "SELECT 1", timeout=5.0, max_rows=1)  # the watchdog is running from here on
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        for sql in queries:
            overdue = execute(conn, sql, timeout=0.0, max_rows=1)
            interrupted += overdue.timed_out
            later = execute(conn, sql, timeout=30.0, max_rows=1)
            assert later.ok and not later.timed_out, later.error
    assert interrupted > 0  # the race was run: the watchdog did interrupt overdue statements
