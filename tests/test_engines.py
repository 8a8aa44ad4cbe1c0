"""DuckDB files and PostgreSQL databases through the one engine layer: data convert, the schema tools, normalised
values, the prompts, the gold self-check in both modes, both tool sets and call formats, score and ask.

Real engines only: DuckDB files written by ``data convert``, and a PostgreSQL server the ``postgres_dsn`` fixture
starts in a temp folder (each test skips, saying why, only where the engine cannot start).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from t2s.env import databases
from t2s.env.databases import normalise_value

ROOT = Path(__file__).resolve().parents[1]


def _engine_data(request, engine):
    """(data file, eval/score keyword arguments) of data/demo converted to ``engine``."""
    if engine == "duckdb":
        folder, report = request.getfixturevalue("duckdb_demo")
        return folder / "dev.json", {"engine": "duckdb"}, report
    folder, report, dsn = request.getfixturevalue("postgres_demo")
    return folder / "dev.json", {"engine": "postgres", "dsn": dsn}, report


ENGINES = ("duckdb", "postgres")


def test_values_are_normalised_to_what_sqlite3_returns():
    assert normalise_value(Decimal("15")) == 15 and type(normalise_value(Decimal("15"))) is int
    assert normalise_value(Decimal("2.5")) == 2.5 and type(normalise_value(Decimal("2.5"))) is float
    assert normalise_value(True) == 1 and type(normalise_value(True)) is int
    assert normalise_value(datetime.date(2024, 5, 1)) == "2024-05-01"
    assert normalise_value(datetime.datetime(2024, 5, 1, 10, 0)) == "2024-05-01 10:00:00"
    assert normalise_value(memoryview(b"ab")) == b"ab"
    assert normalise_value([1, 2]) == "[1, 2]"
    assert normalise_value(None) is None and normalise_value("12") == "12"


@pytest.mark.parametrize("engine", ENGINES)
def test_convert_keeps_every_demo_question_and_reports(request, engine):
    data, _, report = _engine_data(request, engine)
    assert report["questions"] == 63 and report["kept"] == 63 and report["dropped"] == 0, report["reasons"]
    written = json.loads((data.parent / "convert_report.json").read_text())
    assert written["share_kept"] == 1.0 and written["engine"] == engine
    questions = json.loads(data.read_text())
    assert len(questions) == 63
    assert all(q["gold_sql_sqlite"] and q["SQL"] for q in questions)
    assert any(q["SQL"] != q["gold_sql_sqlite"] for q in questions)  # transpiled, the original kept
    for db in report["databases"].values():
        assert db["primary_keys"] > 0 and db["foreign_keys"] > 0 and not db["notes"]


def _demo_ref(request, engine, db_id="cycling_club"):
    data, options, _ = _engine_data(request, engine)
    if engine == "duckdb":
        return databases.benchmark_db(str(data.parent / "dev_databases" / db_id / f"{db_id}.duckdb"), db_id)
    return databases.server_db(databases.server_url(options["dsn"], db_id), db_id)


@pytest.mark.parametrize("engine", ENGINES)
def test_schema_tools_read_each_engines_catalog(request, engine, demo_dir):
    from t2s.env.tools import Toolbox

    ref = _demo_ref(request, engine)
    assert ref.engine == engine
    sqlite_box = Toolbox(databases.benchmark_db(demo_dir / "dev_databases/cycling_club/cycling_club.sqlite"))
    box = Toolbox(ref)
    tables = box.call("list_tables", {}).text.splitlines()
    sqlite_tables = sqlite_box.call("list_tables", {}).text.splitlines()
    assert sorted(t.lower() for t in tables) == sorted(t.lower() for t in sqlite_tables)
    ddl = box.call("describe_table", {"table_name": "rides"}).text
    assert ddl.startswith(("CREATE TABLE rides", 'CREATE TABLE "rides"')) and "PRIMARY KEY" in ddl
    assert "FOREIGN KEY" in ddl
    keys = box.call("foreign_keys", {"table_name": "rides"}).text
    assert not keys.startswith("Error") and "->" in keys
    path = box.call("join_path", {"table_a": "clubs", "table_b": "rides"}).text
    assert "=" in path and not path.startswith("Error")
    sample = box.call("sample_rows", {"table_name": "clubs", "limit": 2}).text.splitlines()
    assert len(sample) == 3
    values = box.call("distinct_values", {"table_name": "clubs", "column_name": "city"})
    assert not values.error and "count" in values.text
    unknown = box.call("describe_table", {"table_name": 'x"; DROP TABLE clubs; --'})
    assert unknown.error and unknown.text.startswith("Error: no table")
    same = "SELECT COUNT(*), SUM(founded_year), AVG(founded_year) FROM clubs"
    answer = box.call("run_query", {"sql": same}).text.splitlines()
    assert answer[1:] == sqlite_box.call("run_query", {"sql": same}).text.splitlines()[1:]  # headers differ per engine


@pytest.mark.parametrize("engine", ENGINES)
def test_prompts_name_the_engines_dialect(request, engine):
    from t2s.env.episode import Episode, EpisodeConfig
    from t2s.env.protocol import default_system_prompt

    name = {"duckdb": "DuckDB", "postgres": "PostgreSQL"}[engine]
    assert "SQLite" in default_system_prompt() and name not in default_system_prompt()
    ref = _demo_ref(request, engine)
    row = {"question_id": "q", "question": "How many clubs?", "evidence": "", "db_id": ref.db_id}
    json_episode = Episode(row, EpisodeConfig(mode="full"), ref)
    assert f"a {name} database" in json_episode.messages[0]["content"]
    assert "SQLite" not in json_episode.messages[0]["content"]
    native = Episode(row, EpisodeConfig(mode="withheld", tool_format="native"), ref)
    sql_arg = next(t for t in native.tools if t["function"]["name"] == "run_query")
    assert name in sql_arg["function"]["parameters"]["properties"]["sql"]["description"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dialect,tool_format", [("exec_plan", "json"), ("sibling", "native")])
def test_gold_self_check_scores_one_in_both_modes(request, tmp_path, engine, dialect, tool_format):
    from t2s.evaluation.config import EvalConfig
    from t2s.evaluation.runner import evaluate

    data, options, _ = _engine_data(request, engine)
    args = EvalConfig.from_options(dict(policy="gold", data=str(data), output=str(tmp_path / "run"),
                                        mode=["full", "withheld"], quiet=True, dialect=dialect,
                                        tool_format=tool_format, **options))
    summaries = evaluate(args)
    for mode in ("full", "withheld"):
        summary = summaries[mode]
        assert summary["n"] == 63
        assert summary["execution_accuracy_official"] == 1.0 and summary["strict"] == 1.0, mode
        assert summary["soft_f1"] == 1.0
    config = json.loads((tmp_path / "run" / "full" / "eval_config.json").read_text())
    assert config["database_engine"] == engine


@pytest.mark.parametrize("engine", ENGINES)
def test_score_reads_the_engines_databases(request, tmp_path, engine):
    from t2s.evaluation.score import score_files

    data, options, _ = _engine_data(request, engine)
    questions = json.loads(data.read_text())
    predictions = tmp_path / "pred.jsonl"
    lines = [{"question_id": str(q["question_id"]), "sql": q["SQL"]} for q in questions[:10]]
    lines[0]["sql"] = "SELECT 1"
    predictions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = score_files(data, predictions, tmp_path / "scores", progress=False, **options)
    scored = {line["question_id"]: line["official"] for line in result["lines"]}
    assert scored[lines[0]["question_id"]] == 0
    assert all(scored[line["question_id"]] == 1 for line in lines[1:])


def _ask(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t2s", "ask", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("engine", ENGINES)
def test_ask_takes_a_duckdb_file_or_a_postgresql_url(request, tmp_path, engine):
    ref = _demo_ref(request, engine)
    turns = tmp_path / "turns.jsonl"
    turns.write_text(json.dumps('</think>\n{"tool": "submit_sql", "args": {"sql": "SELECT COUNT(*) FROM clubs"}}')
                     + "\n")
    done = _ask("--db", ref.path, "--replay", turns, "--json", "How many clubs are there?")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["final_sql_source"] == "submitted" and record["db_id"] == "cycling_club"
    missing = ref.path.replace("cycling_club", "no_such_db")
    failed = _ask("--db", missing, "--replay", turns, "--json", "How many?")
    assert failed.returncode != 0 and failed.stderr.startswith("Error:")


@pytest.mark.shared_data
def test_bird_dev_converts_with_at_least_ninety_percent_kept(tmp_path, bird_superhero_dir, request):
    """BIRD dev databases not in this repository: at least 90% of their questions kept on each engine, and the gold
    self-check then scores 1.0 on every kept question in both modes."""
    pytest.importorskip("duckdb")
    from t2s.data.convert import convert
    from t2s.evaluation.config import EvalConfig
    from t2s.evaluation.runner import evaluate

    targets = [("duckdb", None)]
    try:
        targets.append(("postgres", request.getfixturevalue("postgres_dsn")))
    except pytest.skip.Exception:
        pass
    for engine, dsn in targets:
        report = convert(bird_superhero_dir / "dev.json", engine, tmp_path / engine, dsn=dsn)
        assert report["share_kept"] >= 0.9, (engine, report["reasons"])
        from t2s.env.tools import Toolbox

        if engine == "duckdb":
            ref = databases.benchmark_db(str(tmp_path / engine / "dev_databases/superhero/superhero.duckdb"))
        else:
            ref = databases.server_db(databases.server_url(dsn, "superhero"))
        described = Toolbox(ref, column_descriptions=True).call("describe_table", {"table_name": "superhero"}).text
        assert "\n-- " in described  # BIRD's column descriptions stay usable
        args = EvalConfig.from_options(dict(policy="gold", data=str(tmp_path / engine / "dev.json"),
                                            output=str(tmp_path / f"ev-{engine}"), mode=["full", "withheld"],
                                            quiet=True, engine=engine, dsn=dsn))
        for summary in evaluate(args).values():
            assert summary["n"] == report["kept"] and summary["execution_accuracy_official"] == 1.0


def test_eval_refuses_postgres_without_a_server(tmp_path, demo_dir):
    from t2s.errors import EvalError
    from t2s.evaluation.config import EvalConfig

    with pytest.raises(EvalError, match="--dsn"):  # refused as the command builds its config
        EvalConfig.from_options(dict(policy="gold", data=str(demo_dir / "dev.json"), output=str(tmp_path),
                                     engine="postgres", dsn=None))


def test_transpiled_gold_keeps_sqlites_meaning():
    from t2s.data.engine_copy import transpile

    columns = {"name": {"text"}, "year": {"text"}, "id": {"int"}, "code": {"text"}}
    sql = 'SELECT Name FROM T WHERE name LIKE "%a%" AND year = 2010 AND code = id'
    duck = transpile(sql, "duckdb", columns)
    assert "ILIKE '%a%'" in duck and "year = '2010'" in duck and "CAST(id AS TEXT)" in duck
    pg = transpile('SELECT T1."Full Name", COUNT(*) FROM People AS T1 GROUP BY T1.id', "postgres", columns)
    assert 'MIN(t1."full name")' in pg and "FROM people AS t1" in pg  # bare column, lowercased names
    assert "julian(" in transpile("SELECT julianday(a) - julianday(b) FROM t", "duckdb").lower()
    assert "EXTRACT(JULIAN" in transpile("SELECT julianday(a) FROM t", "postgres").upper()


def test_postgres_guard_reads_postgresqls_own_parse():
    pytest.importorskip("pglast", reason="pglast is not installed (pip install -r requirements.txt)")
    from t2s.env.databases.postgres_guard import check

    assert check("SELECT count(*), round(avg(x)::numeric, 2) FROM t WHERE s ILIKE '%a%' GROUP BY 1") is None
    assert check("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r") is None
    assert check("SELECT pg_sleep(1)") == ("function pg_sleep()", False)
    assert check("SELECT pg_catalog.pg_read_file('x')")[0].startswith("function")
    assert check("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d")[1] is True
    assert check("SELECT 1; SELECT 2")[0].startswith("more than one statement")
    assert check("SET statement_timeout = 0")[0].startswith("changing settings")
    assert check("SELECT * FROM pg_authid")[0].startswith("the system catalog")
    assert check("SELEC 1")[0].startswith("syntax error")


def test_postgres_urls_hide_their_password():
    from t2s.env.databases.postgres_engine import redact

    assert redact("postgresql://me:secret@host/db") == "postgresql://me:***@host/db"
    assert redact("postgresql:///db?host=/tmp") == "postgresql:///db?host=/tmp"
    assert redact("postgresql://h:1/db?sslmode=require&password=S3cret") == \
        "postgresql://h:1/db?sslmode=require&password=***"  # libpq reads a password from the query too
    assert redact("host=h password='a secret' dbname=x") == "password=*** dbname=x host=h"  # libpq's own parser
    assert redact("host=h dbname=x") == "host=h dbname=x"
    assert "S3cret" not in redact("host=h password=S3cret ===")  # unreadable: none of it is shown
    assert databases.server_url("postgresql://me@host/postgres?sslmode=require", "my db") == \
        "postgresql://me@host/my%20db?sslmode=require"
    assert databases.user_db("postgresql://me@host/sales").engine == "postgres"
    assert databases.user_db("postgresql://me@host/sales").db_id == "sales"


def test_convert_never_replaces_a_database_it_did_not_make(postgres_dsn, demo_dir, tmp_path):
    import psycopg

    from t2s.data.convert import convert_database
    from t2s.data.rows import DataError

    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute('DROP DATABASE IF EXISTS "keepme" WITH (FORCE)')
        admin.execute('CREATE DATABASE "keepme"')
    with psycopg.connect(databases.server_url(postgres_dsn, "keepme"), autocommit=True) as conn:
        conn.execute("CREATE TABLE precious (a int)")
    source = demo_dir / "dev_databases" / "cycling_club" / "cycling_club.sqlite"
    with pytest.raises(DataError, match="did not make"):
        convert_database(source, "keepme", "postgres", tmp_path, postgres_dsn)
    with psycopg.connect(databases.server_url(postgres_dsn, "keepme"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM precious").fetchone() == (0,)
    convert_database(source, "made_by_convert", "postgres", tmp_path, postgres_dsn)
    convert_database(source, "made_by_convert", "postgres", tmp_path, postgres_dsn)  # its own: replaced


@pytest.mark.parametrize("engine", ENGINES)
def test_predictions_policy_and_single_mode_on_each_engine(request, tmp_path, engine):
    from t2s.env.episode import Episode, EpisodeConfig
    from t2s.evaluation.config import EvalConfig
    from t2s.evaluation.runner import evaluate

    data, options, _ = _engine_data(request, engine)
    questions = json.loads(data.read_text())
    predictions = tmp_path / "pred.jsonl"
    predictions.write_text("".join(json.dumps({"question_id": str(q["question_id"]), "sql": q["SQL"]}) + "\n"
                                   for q in questions))
    args = EvalConfig.from_options(dict(policy="predictions", predictions=str(predictions), data=str(data),
                                        output=str(tmp_path / "run"), mode=["full", "single"], quiet=True, **options))
    for summary in evaluate(args).values():
        assert summary["n"] == 63 and summary["execution_accuracy_official"] == 1.0
    ref = _demo_ref(request, engine)
    row = {"question_id": "q", "question": "How many clubs?", "evidence": "", "db_id": ref.db_id, "db_path": ref.path}
    system = Episode(row, EpisodeConfig(mode="single")).messages[0]["content"]
    assert {"duckdb": "DuckDB", "postgres": "PostgreSQL"}[engine] in system and "SQLite" not in system


def test_data_convert_command_needs_a_server_for_postgres(tmp_path, demo_dir):
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "T2S_DSN": ""}
    done = subprocess.run([sys.executable, "-m", "t2s", "data", "convert", "--engine", "postgres", "--data",
                           str(demo_dir / "dev.json"), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert done.returncode == 1 and "Error: --engine postgres needs --dsn" in done.stderr


def test_data_convert_command_writes_duckdb_files(tmp_path, demo_dir):
    pytest.importorskip("duckdb")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "t2s", "data", "convert", "--engine", "duckdb", "--data",
                           str(demo_dir / "dev.json"), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "kept 63 of 63 questions (100.0%)" in done.stdout
    assert (tmp_path / "out/dev_databases/cycling_club/cycling_club.duckdb").is_file()


def test_converted_questions_keep_the_source_ids_after_a_drop(tmp_path, demo_dir):
    """Spider-style data has no question_id: each question's id comes from its position in the source. A converted
    file keeps those ids, so a question dropped by the conversion shifts no other id, and runs on both engines pair."""
    pytest.importorskip("duckdb")
    from t2s.data.convert import convert
    from t2s.data.loaders import load_json_rows

    demo = json.loads((demo_dir / "dev.json").read_text())[:4]
    spider = [{"db_id": r["db_id"], "question": r["question"], "query": r["SQL"]} for r in demo]
    spider[1]["query"] = "SELEC broken"  # dropped by the conversion: its gold does not run
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(spider))
    (tmp_path / "dev_databases").symlink_to(demo_dir / "dev_databases")
    report = convert(data, "duckdb", tmp_path / "out")
    assert report["kept"] == 3 and report["dropped_questions"][0]["position"] == 1
    source = {r["question_id"]: r["question"] for r in load_json_rows(data)}
    out_rows = load_json_rows(tmp_path / "out" / "dev.json", engine="duckdb")
    converted = {r["question_id"]: r["question"] for r in out_rows}
    assert len(converted) == 3 and all(source[qid] == question for qid, question in converted.items())


def test_convert_reads_a_wal_database_without_touching_its_folder(tmp_path, demo_dir):
    """A source file in WAL mode whose last rows are only in its ``-wal``: copied with those rows, and its folder keeps
    exactly its files and bytes (a plain ``mode=ro`` reader created ``-shm`` and ``-wal`` files, and deleted a ``-wal``
    with no valid frame)."""
    pytest.importorskip("duckdb")
    import shutil
    import sqlite3

    from t2s.data.convert import convert
    from t2s.env.databases import file_checksum

    [first] = json.loads((demo_dir / "dev.json").read_text())[:1]
    data = tmp_path / "src"
    folder = data / "dev_databases" / first["db_id"]
    shutil.copytree(demo_dir / "dev_databases" / first["db_id"], folder)
    (data / "dev.json").write_text(json.dumps([first]))
    path = folder / f"{first['db_id']}.sqlite"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE only_in_the_wal (x)")
    writer.execute("INSERT INTO only_in_the_wal VALUES (7)")
    shutil.copy(path, tmp_path / "kept")
    shutil.copy(str(path) + "-wal", tmp_path / "kept-wal")
    writer.close()  # its close checkpoints and removes the -wal: put both files back as they were, as after a crash
    shutil.copy(tmp_path / "kept", path)
    shutil.copy(tmp_path / "kept-wal", str(path) + "-wal")
    (folder / f"{path.name}-shm").unlink(missing_ok=True)
    before = {p.name: file_checksum(p) for p in folder.iterdir() if p.is_file()}
    assert f"{path.name}-wal" in before and f"{path.name}-shm" not in before
    report = convert(data / "dev.json", "duckdb", tmp_path / "out")
    assert report["kept"] == 1
    assert {p.name: file_checksum(p) for p in folder.iterdir() if p.is_file()} == before
    import duckdb

    copied = tmp_path / "out" / "dev_databases" / first["db_id"] / f"{first['db_id']}.duckdb"
    with duckdb.connect(str(copied), read_only=True) as conn:
        assert conn.execute("SELECT x FROM only_in_the_wal").fetchall() == [(7,)]


def test_a_pools_server_sessions_end_with_its_threads(request):
    """A training run starts a thread pool per rollout: each worker's PostgreSQL sessions end when the worker does,
    so steps never pile sessions up against the server's ``max_connections``."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    ref = _demo_ref(request, "postgres")
    _, options, _ = _engine_data(request, "postgres")

    def sessions() -> int:
        with psycopg.connect(options["dsn"], autocommit=True) as admin:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                 (ref.db_id,)).fetchone()[0]

    before = sessions()
    was_enabled = gc.isenabled()
    gc.disable()  # as if no full collection came
    try:
        for _ in range(3):
            with ThreadPoolExecutor(4) as pool:
                counts = list(pool.map(lambda _: databases.run_tool_query(ref, "SELECT count(*) FROM clubs",
                                                                           max_rows=5).rows, range(12)))
            assert len(set(map(str, counts))) == 1 and counts[0][0][0] > 0
            deadline = time.monotonic() + 10  # the server notices a closed session at once; allow it a moment
            while sessions() > before and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sessions() == before
    finally:
        if was_enabled:
            gc.enable()


def test_a_database_whose_descriptions_cannot_be_copied_is_left_out_with_a_readable_reason(tmp_path, demo_dir):
    pytest.importorskip("duckdb")
    import shutil

    from t2s.data.convert import convert

    folder = tmp_path / "data"
    shutil.copytree(demo_dir, folder)
    data = folder / "questions.json"  # not dev.json: the conversion writes that one beside it
    data.write_text((folder / "dev.json").read_text())
    report = convert(data, "duckdb", folder, db_root=folder / "dev_databases")  # each description onto itself
    errors = {db: info.get("error") for db, info in report["databases"].items()}
    assert errors == {db: f"could not copy {db}'s database_description files" for db in errors} and errors
    assert report["kept"] == 0 and report["reasons"] == {"database_not_converted": report["questions"]}


def _duckdb_toolbox(path, *statements, **options):
    """The tools on a DuckDB file that ``statements`` build."""
    duckdb = pytest.importorskip("duckdb")
    from t2s.env.tools import Toolbox

    with duckdb.connect(str(path)) as conn:
        for statement in statements:
            conn.execute(statement)
    return Toolbox(databases.user_db(str(path)), **options)


def test_a_duckdb_files_views_are_listed_and_described(tmp_path):
    """As on SQLite and PostgreSQL: a view is listed (after the tables), described by its DDL, and read."""
    box = _duckdb_toolbox(tmp_path / "views.duckdb", "CREATE TABLE base (x INTEGER)", "INSERT INTO base VALUES (1)",
                          "CREATE VIEW doubled AS SELECT x * 2 AS two FROM base", "CREATE TABLE later (y INTEGER)")
    assert box.call("list_tables", {}).text.splitlines() == ["base", "later", "doubled"]
    assert box.call("describe_table", {"table_name": "doubled"}).text.startswith("CREATE VIEW doubled AS SELECT")
    assert box.call("sample_rows", {"table_name": "doubled"}).text == "two\n2"
    databases.close_thread_connections()


def test_a_duckdb_files_quoted_names_and_comments_are_shown_as_they_are(tmp_path):
    """A DuckDB file's DDL keeps the spaces inside a quoted name (the model must write it as stored), and a column
    comment that spans lines is shown on its one line of notes, so no line of it passes for DDL."""
    box = _duckdb_toolbox(tmp_path / "names.duckdb", 'CREATE TABLE "two  spaces" ("a  b" INTEGER, plain  VARCHAR)',
                          'INSERT INTO "two  spaces" VALUES (7, \'x\')',
                          'COMMENT ON COLUMN "two  spaces"."a  b" IS \'first line\nCREATE TABLE fake (x INTEGER);\'',
                          column_descriptions=True)
    described = box.call("describe_table", {"table_name": "two  spaces"}).text
    ddl, *notes = described.splitlines()
    assert '"two  spaces"' in ddl and '"a  b" INTEGER' in ddl and "plain VARCHAR" in ddl, ddl
    assert notes == ["-- a  b: first line CREATE TABLE fake (x INTEGER);"], described
    assert box.call("run_query", {"sql": 'SELECT "a  b" FROM "two  spaces"'}).text.splitlines()[-1] == "7"
    databases.close_thread_connections()
