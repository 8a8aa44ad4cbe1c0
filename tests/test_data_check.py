"""Gold hygiene: `data check` counts on real data, outcome classes, the on-disk cache, filter_rows, `data prepare`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from t2s.commands import main
from t2s.data import hygiene
from t2s.data.loaders import load_json_rows, load_rows


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("T2S_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_check_superhero_and_the_cache(bird_superhero_dir, tmp_path, capsys, monkeypatch, cache_in_tmp):
    assert main(["data", "check", "--data", str(bird_superhero_dir), "--output", str(tmp_path)]) == 0
    output = tmp_path / "check.jsonl"
    printed = capsys.readouterr().out
    assert "superhero" in printed and "129" in printed and "from the cache" not in printed
    outcomes = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(outcomes) == 129 and {o["outcome"] for o in outcomes} == {"ok"}
    assert outcomes[0]["question_id"] == "717" and outcomes[0]["rows"] > 0
    cached = list((cache_in_tmp / "data_check").glob("*.jsonl"))
    assert len(cached) == 1

    # second run: answered from the cache file, no gold SQL runs at all
    def no_queries(*args, **kwargs):
        raise AssertionError("a gold SQL ran although the cache holds the answer")

    monkeypatch.setattr(hygiene, "check_row", no_queries)
    assert main(["data", "check", "--data", str(bird_superhero_dir)]) == 0
    printed = capsys.readouterr().out
    assert "from the cache" in printed and cached[0].name in printed.replace("\n", "")


def test_check_spider_dev_counts(spider_dev_dir):
    rows = load_rows("spider", spider_dev_dir)
    outcomes, from_cache = hygiene.check_rows(rows, progress=False)
    summary = hygiene.summarize(outcomes)
    assert not from_cache
    assert summary["overall"] == {"ok": 923, "error": 0, "timeout": 0, "empty": 49, "missing_db": 62}
    assert summary["per_db"]["wta_1"]["missing_db"] == 62 and summary["per_db"]["flight_2"]["empty"] == 30


def _tiny_bird(folder: Path, slow_query: bool = True) -> Path:
    """A BIRD-layout folder whose gold SQL covers every outcome."""
    db = folder / "dev_databases" / "tiny" / "tiny.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])
    conn.close()
    slow = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT COUNT(*) FROM c")
    records = [
        {"question_id": 1, "db_id": "tiny", "question": "ok", "evidence": "", "SQL": "SELECT x FROM t"},
        {"question_id": 2, "db_id": "tiny", "question": "error", "evidence": "", "SQL": "SELECT nope FROM t"},
        {"question_id": 3, "db_id": "tiny", "question": "empty", "evidence": "", "SQL": "SELECT x FROM t WHERE x > 9"},
        {"question_id": 4, "db_id": "tiny", "question": "timeout", "evidence": "", "SQL": slow},
        {"question_id": 5, "db_id": "tiny", "question": "write", "evidence": "", "SQL": "DELETE FROM t"},
        {"question_id": 6, "db_id": "gone", "question": "missing", "evidence": "", "SQL": "SELECT 1"},
    ]
    if not slow_query:
        records = [r for r in records if r["question"] != "timeout"]
    (folder / "dev.json").write_text(json.dumps(records))
    return folder / "dev.json"


def test_limit_counts_missing_databases_over_the_rows_kept(tmp_path, capsys):
    data = _tiny_bird(tmp_path / "bird", slow_query=False)  # the last row's database is absent
    assert main(["data", "check", "--data", str(data), "--n", "2", "--seed", "1"]) == 0  # seed 1 picks rows 0 and 1
    printed = capsys.readouterr().out
    assert "missing" in printed and "gone" not in printed and "point at databases" not in printed
    assert main(["data", "check", "--data", str(data), "--limit", "5", "--no-cache"]) == 0
    assert "1 of 5 questions point at databases missing" in " ".join(capsys.readouterr().out.split())


def test_n_is_evals_seeded_pick_from_the_whole_file(bird_superhero_dir, tmp_path, capsys):
    from t2s.evaluation.runner import select_rows

    rows = load_json_rows(bird_superhero_dir)
    for seed in (0, 7):
        out = tmp_path / f"seed{seed}"
        assert main(["data", "check", "--data", str(bird_superhero_dir), "--n", "5", "--seed", str(seed),
                     "--output", str(out)]) == 0
        checked = [json.loads(line)["question_id"] for line in (out / "check.jsonl").read_text().splitlines()]
        assert checked == [r["question_id"] for r in select_rows(rows, 5, seed)]  # the questions eval --n 5 plays
        assert checked != [r["question_id"] for r in rows[:5]]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["data", "check", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "only N rows, picked with --seed from the whole file as eval picks its questions" in helped
    assert "--seed SEED picks the --n rows, as in eval (default: 0)" in helped


def test_outcome_classes_and_filter_rows(tmp_path):
    rows = load_json_rows(_tiny_bird(tmp_path / "bird"))
    outcomes, _ = hygiene.check_rows(rows, timeout=0.5, progress=False)
    assert [o["outcome"] for o in outcomes] == ["ok", "error", "empty", "timeout", "error", "missing_db"]
    assert outcomes[1]["error"].startswith("Error:") and "gone" in outcomes[5]["error"]
    db = Path(rows[0]["db_path"])
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM t").fetchone() == (3,)  # the DELETE changed nothing

    no_timeout_rows = [r for r in rows if r["question"] != "timeout"]
    kept, counts = hygiene.filter_rows(no_timeout_rows)
    assert [r["question"] for r in kept] == ["ok"]
    assert counts == {"ok": 1, "error": 2, "timeout": 0, "empty": 1, "missing_db": 1}
    # filter_rows caches by row contents: the same rows again give the same answer from the cache
    assert hygiene.read_cache(hygiene.cache_key(no_timeout_rows), no_timeout_rows) is not None


def test_cache_key_follows_the_data_and_databases(tmp_path):
    data = _tiny_bird(tmp_path / "bird")
    rows = load_json_rows(data)
    key = hygiene.cache_key(rows, rows.db_root)
    assert key == hygiene.cache_key(rows, rows.db_root)
    assert key != hygiene.cache_key(rows, tmp_path)  # another database root
    data.write_text(data.read_text().replace("SELECT x FROM t WHERE x > 9", "SELECT x FROM t WHERE x > 2"))
    assert key != hygiene.cache_key(load_json_rows(data), rows.db_root)  # another data file


@pytest.mark.parametrize("folder_name", ["data", "d" * 40 + "/" + "long-folder-name-" * 6])
@pytest.mark.parametrize("columns", [None, "40"])
def test_prepare_prints_layout_and_checks_what_is_present(tmp_path, capsys, bird_train_file, monkeypatch, columns,
                                                         folder_name):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    root = tmp_path / folder_name
    _tiny_bird(root / "bird" / "dev_20240627", slow_query=False)
    train = root / "bird" / "train"
    train.mkdir(parents=True)
    (train / "train.json").write_text(json.dumps(json.loads(bird_train_file.read_text())[:3]))
    assert main(["data", "prepare", "--data-dir", str(root)]) == 0
    raw = capsys.readouterr().out
    printed = " ".join(raw.split())
    assert "https://bird-bench.github.io" in printed and "train_databases/<db_id>/<db_id>.sqlite" in printed
    assert "dev_20240627" in printed and "missing_db" in printed  # the present file was checked
    assert "skipped" in printed and "train_databases" in printed  # the file without databases is named
    # every path is printed whole on one line, whatever the terminal width and the path's length
    for path in (root / "bird" / "dev_20240627" / "dev.json", train / "train.json", train / "train_databases"):
        assert str(path) in raw, path
    assert f"{root}/bird/dev_20240627/dev_databases/<db_id>/<db_id>.sqlite" in raw


def test_prepare_where_no_present_gold_sql_runs_says_so_and_exits_1(tmp_path, capsys):
    data = _tiny_bird(tmp_path / "bird" / "dev_20240627", slow_query=False)
    records = json.loads(data.read_text())
    data.write_text(json.dumps([r for r in records if r["question"] not in ("ok",)]))  # error, empty, write, missing
    assert main(["data", "prepare", "--data-dir", str(tmp_path)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("Error: the gold SQL of none of the 3 rows ran and returned rows (error 2, empty 1);")
    assert str(data) in line
    data.write_text(json.dumps(records))  # one that runs: the others are the table's business
    assert main(["data", "prepare", "--data-dir", str(tmp_path)]) == 0


@pytest.mark.parametrize("damage", [b"\xff\xfe not utf-8\n", b"[1, 2]\n", b"{broken\n", b"[" * 100_000 + b"\n"])
def test_a_damaged_cache_file_is_checked_again_and_rewritten(tmp_path, capsys, cache_in_tmp, damage):
    data = _tiny_bird(tmp_path / "bird", slow_query=False)
    assert main(["data", "check", "--data", str(data)]) == 0
    [cached] = (cache_in_tmp / "data_check").glob("*.jsonl")
    outcomes = lambda: [(o["question_id"], o["outcome"]) for o in map(json.loads, cached.read_text().splitlines())]  # noqa: E731
    good = outcomes()
    cached.write_bytes(damage)
    capsys.readouterr()
    assert main(["data", "check", "--data", str(data)]) == 0
    assert "from the cache" not in capsys.readouterr().out and outcomes() == good


def test_prepare_with_nothing_present(tmp_path, capsys):
    assert main(["data", "prepare", "--data-dir", str(tmp_path / "empty")]) == 0
    assert "Nothing to check yet" in " ".join(capsys.readouterr().out.split())


def test_prepare_where_every_data_file_found_is_skipped_exits_1(tmp_path, capsys):
    """A data file found whose databases are not there yet is skipped; when that is every one, nothing was checked:
    one line, exit 1, not a clean end."""
    data = tmp_path / "bird" / "dev.json"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps([{"question_id": 1, "question": "q", "SQL": "SELECT 1", "db_id": "shop"}]))
    assert main(["data", "prepare", "--data-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "skipped" in captured.out
    assert captured.err.strip().splitlines()[-1] == ("Error: none of the 1 data files found could be checked (each "
                                                     "skipped, above)")


def test_make_demo_then_check_it(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["data", "make-demo", "--output", str(out)]) == 0
    rows = load_json_rows(out / "dev.json")
    assert rows and rows.missing_databases == {}
    kept, counts = hygiene.filter_rows(rows)
    assert counts["ok"] == len(rows) == len(kept)  # every demo gold SQL runs and returns rows


def test_make_demo_writes_over_the_demo_but_never_over_a_users_questions(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["data", "make-demo", "--output", str(out)]) == 0
    assert main(["data", "make-demo", "--output", str(out)]) == 0  # the demo again: the same questions, rewritten
    mine = tmp_path / "mine"
    mine.mkdir()
    theirs = json.dumps([{"question_id": 1, "db_id": "shop", "question": "q?", "SQL": "SELECT 1"}])
    (mine / "dev.json").write_text(theirs)
    capsys.readouterr()
    assert main(["data", "make-demo", "--output", str(mine)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("Error:") and "not the demo's" in line and "choose another folder" in line
    assert (mine / "dev.json").read_text() == theirs and not (mine / "dev_databases").exists()
    # the demo's questions with one of the user's own on a demo database (its name: the demo's): still refused
    demo = json.loads((out / "dev.json").read_text())
    own = json.dumps([*demo, {**demo[0], "question_id": 999, "question": "MY OWN QUESTION?"}])
    (mine / "dev.json").write_text(own)
    assert main(["data", "make-demo", "--output", str(mine)]) == 1
    assert "not the demo's" in capsys.readouterr().err and (mine / "dev.json").read_text() == own
    (mine / "dev.json").write_text('[{"question_id": 0, "db_id": "cycling_club", "quest')  # cut off: unreadable
    assert main(["data", "make-demo", "--output", str(mine)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "is there but not a JSON list of questions" in line and "remove it, or choose another folder" in line


@pytest.mark.parametrize("argv, written", [
    (["convert", "--engine", "duckdb"], "dev.json"),  # its --output DIR gets DIR/dev.json
    (["passrate", "--policy", "gold", "--k", "1"], "passrate_kept.json"),
])
def test_a_data_command_never_writes_over_the_file_it_reads(demo_dir, tmp_path, capsys, argv, written):
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(demo_dir, folder)
    data = folder / written
    if written != "dev.json":
        shutil.copy(folder / "dev.json", data)
    before = data.read_bytes()
    for named in (data, folder) if written == "dev.json" else (data,):  # the file, or the folder that holds it
        assert main(["data", argv[0], "--data", str(named), "--output", str(folder), *argv[1:]]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == f"Error: --output {folder} would write {written} over the --data file it reads; choose " \
                       "another folder"
    assert data.read_bytes() == before


def test_check_sqale_payloads(tmp_path, capsys, cache_in_tmp):
    from test_data_loaders import write_sqale

    queries, schemas = write_sqale(tmp_path / "sqale")
    args = ["data", "check", "--kind", "sqale", "--data", str(queries), "--schemas", str(schemas)]
    assert main(args) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "schema_nasty" in printed and "schema_unknown (1 question)" in printed and "left out" in printed
    assert main(args) == 0
    assert "from the cache" in capsys.readouterr().out
    # another schema table: another cache entry, not the stale one
    schemas.write_text(schemas.read_text().replace('"number_of_tables": 2', '"number_of_tables": 3'))
    assert main(args) == 0
    assert "from the cache" not in capsys.readouterr().out


def test_a_check_where_no_gold_sql_runs_fails_with_one_line(tmp_path, capsys):
    data = _tiny_bird(tmp_path / "bird", slow_query=False)
    records = [r for r in json.loads(data.read_text()) if r["question"] in ("error", "empty", "write")]
    data.write_text(json.dumps(records))
    assert main(["data", "check", "--data", str(data), "--no-cache"]) == 1
    out, err = capsys.readouterr()
    assert "gold SQL check" in out  # the table comes first
    assert err.strip().splitlines() == ["Error: the gold SQL of none of the 3 rows ran and returned rows (error 2, "
                                        "empty 1); check --data and --db-root"]
    data.write_text(json.dumps(records + [json.loads(_tiny_bird(tmp_path / "again").read_text())[0]]))  # one runs
    assert main(["data", "check", "--data", str(data), "--db-root", str(tmp_path / "bird" / "dev_databases"),
                 "--no-cache"]) == 0


@pytest.mark.parametrize("verb", [["check"], ["passrate", "--policy", "gold", "--k", "2"], ["difficulty"]])
def test_a_data_file_without_questions_is_one_error_line(tmp_path, capsys, verb):
    empty = tmp_path / "dev.json"
    empty.write_text("[]")
    assert main(["data", *verb, "--data", str(empty), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"Error: no questions in {empty}"]
    assert not any((tmp_path / "out").glob("*"))


def test_a_sqale_check_whose_every_schema_is_absent_names_them(tmp_path, capsys, cache_in_tmp):
    from test_data_loaders import write_sqale

    queries, schemas = write_sqale(tmp_path / "sqale")
    lines = [json.loads(line) for line in queries.read_text().splitlines()]
    queries.write_text("".join(json.dumps(line) + "\n" for line in lines if line["schema_id"] == "schema_unknown"))
    assert main(["data", "check", "--kind", "sqale", "--data", str(queries), "--schemas", str(schemas)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: no question of {queries} can be used: 1 questions left out, "
                                               "their schemas absent") and "schema_unknown" in err[0], err
