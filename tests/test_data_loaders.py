"""Loaders: BIRD, Spider, SQaLe and SynSQL into the common row shape, on real data and on written fixtures."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from t2s.env import databases
from t2s.data import loaders
from t2s.data.loaders import load_json_rows, load_rows
from t2s.data.sqale import SqaleColumns
from t2s.data.rows import ROW_KEYS, DataError


def _query(row: dict, sql: str):
    result = databases.run_scoring_query(databases.ref_from_row(row), sql, timeout=5.0)
    assert result.error is None, result.error
    return result.rows


# ----------------------------------------------------------------------------------------------------------------
# Real data


def test_bird_superhero_rows(bird_superhero_dir):
    rows = load_rows("bird", bird_superhero_dir)
    assert len(rows) == 129 and rows.missing_databases == {}
    assert all(tuple(r) == ROW_KEYS for r in rows)
    first = rows[0]
    assert first["question_id"] == "717"  # the data's own id, as a string
    assert first["source"] == "bird_dev" and first["db_id"] == "superhero" and first["schema_id"] is None
    assert Path(first["db_path"]).is_absolute() and Path(first["db_path"]).is_file()
    assert {r["difficulty"] for r in rows} == {"simple", "moderate", "challenging"}
    assert all(r["evidence"] for r in rows[:5])
    # the registry maps a row to its database; the gold runs there
    assert _query(first, first["gold_sql"])


def test_bird_train_without_databases_names_the_missing_folder(bird_train_file):
    with pytest.raises(DataError) as info:
        load_rows("bird", bird_train_file)
    message = str(info.value)
    assert message.startswith("Error:") and "train_databases" in message and "does not exist" in message
    rows = load_rows("bird", bird_train_file, require_databases=False)
    assert len(rows) == 9428
    assert rows[4021]["question_id"] == "bird_train:4021" and rows[0]["difficulty"] is None
    assert len(rows.missing_databases) == 69 and rows.missing_questions == 9428


def test_bird_train_folder_layout(tmp_path, bird_train_file):
    """train/train.json found from its folder; with one database present, the others are reported, not fatal."""
    everything = json.loads(Path(bird_train_file).read_text())
    records = everything[:20] + [r for r in everything if r["db_id"] != everything[0]["db_id"]][:20]
    train = tmp_path / "train"
    train.mkdir()
    (train / "train.json").write_text(json.dumps(records))
    db_id = records[0]["db_id"]
    (train / "train_databases" / db_id).mkdir(parents=True)
    sqlite3.connect(train / "train_databases" / db_id / f"{db_id}.sqlite").close()
    rows = load_rows("bird", train)
    assert len(rows) == 40 and rows[0]["db_path"].endswith(f"train_databases/{db_id}/{db_id}.sqlite")
    assert db_id not in rows.missing_databases and rows.missing_questions == 20
    with pytest.raises(DataError, match=r"1 database file\(s\) missing under .*/train_databases/(\w+)/\1\.sqlite"):
        load_rows("bird", train, require_databases=True)  # the .sqlite named: its folder may well be there


def test_spider_dev_counts_the_missing_wta_1(spider_dev_dir):
    rows = load_rows("spider", spider_dev_dir)
    assert len(rows) == 1034
    assert rows.missing_databases == {"wta_1": 62}
    assert "wta_1 (62 questions)" in rows.missing_summary()
    assert rows[17]["question_id"] == "spider_dev:17" and rows[17]["evidence"] == "" and rows[17]["difficulty"] is None
    with pytest.raises(DataError) as info:
        load_rows("spider", spider_dev_dir, require_databases=True)
    assert "wta_1" in str(info.value)
    present = next(r for r in rows if r["db_id"] != "wta_1")
    assert _query(present, present["gold_sql"]) is not None


def test_load_json_rows_detects_bird_and_spider(spider_dev_dir, bird_superhero_dir, bird_minidev_file):
    spider = load_json_rows(spider_dev_dir / "dev.json")
    assert spider[0]["source"] == "spider_dev" and spider.missing_databases == {"wta_1": 62}
    bird = load_json_rows(bird_superhero_dir / "dev.json")
    assert bird[0]["source"] == "bird_dev" and bird[0]["question_id"] == "717"
    mini = load_json_rows(bird_minidev_file, db_root=bird_superhero_dir / "dev_databases")
    assert len(mini) == 500 and mini[0]["question_id"] == "1471"
    counts = {d: sum(r["difficulty"] == d for r in mini) for d in ("simple", "moderate", "challenging")}
    assert counts == {"simple": 148, "moderate": 250, "challenging": 102}
    assert "superhero" not in mini.missing_databases and len(mini.missing_databases) == 10


def test_rows_fit_a_datasets_dataset(bird_superhero_dir):
    import datasets

    rows = load_rows("bird", bird_superhero_dir, limit=5)
    dataset = datasets.Dataset.from_list(list(rows))
    assert dataset.column_names == list(ROW_KEYS) and dataset[0]["question_id"] == rows[0]["question_id"]


def test_common_shape_rows_keep_their_own_ids_even_zero(tmp_path):
    db = tmp_path / "databases" / "tiny" / "tiny.sqlite"
    db.parent.mkdir(parents=True)
    sqlite3.connect(db).close()
    rows = [{"question_id": qid, "question": "q", "gold_sql": "SELECT 1", "db_id": "tiny", "db_path": str(db)}
            for qid in (0, 1, None)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert [r["question_id"] for r in load_json_rows(tmp_path / "rows.json")] == ["0", "1", "rows:2"]


# ----------------------------------------------------------------------------------------------------------------
# Bad input


def test_malformed_json_names_file_and_line(tmp_path):
    bad = tmp_path / "dev.json"
    bad.write_text('[{"question": "q", "SQL": "SELECT 1", "db_id": "x"},\n {"question": "broken" "SQL": 1}]')
    with pytest.raises(DataError) as info:
        load_json_rows(bad)
    assert str(bad) in str(info.value) and "line 2" in str(info.value) and str(info.value).startswith("Error:")


def test_malformed_jsonl_names_the_line(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"question": "q", "SQL": "SELECT 1", "db_id": "x"}\n{"question": oops}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl: line 2 is not valid JSON"):
        load_json_rows(bad)


def test_row_missing_fields_names_file_and_row(tmp_path):
    data = tmp_path / "dev.json"
    records = [{"question": "a", "SQL": "SELECT 1", "db_id": "x"}] * 2 + [{"question": "c", "db_id": "x"}]
    data.write_text(json.dumps(records))
    with pytest.raises(DataError) as info:
        load_rows("bird", data, require_databases=False)
    message = str(info.value)
    assert str(data) in message and "row 2 (0-based)" in message and "'SQL'" in message
    spider = tmp_path / "train_spider.json"
    spider.write_text(json.dumps([{"query": "SELECT 1", "db_id": "x"}]))
    with pytest.raises(DataError, match=r"row 0 \(0-based\) is missing required field\(s\) 'question'"):
        load_rows("spider", spider, require_databases=False)
    data.write_text(json.dumps([{"question": 123, "SQL": ["SELECT 1"], "db_id": "x"}]))  # there, but not text
    with pytest.raises(DataError, match=r"row 0 \(0-based\) 'question' holds int, not text; 'SQL' holds list, not "
                                        "text"):
        load_rows("bird", data, require_databases=False)


@pytest.mark.parametrize("db_id", ["../victim", "/tmp/victim", "a/b", "..", "a\\b", "a\0b"])
def test_a_db_id_that_is_a_path_is_refused_before_any_file_is_touched(tmp_path, db_id):
    """A db_id names ``<db_root>/<db_id>/<db_id>.sqlite``; one holding a path would reach (and, through ``data
    convert``, replace) files outside the data's folders."""
    data = tmp_path / "dev.json"
    rows = [{"question": "q", "SQL": "SELECT 1", "db_id": "ok"}, {"question": "q2", "SQL": "SELECT 2", "db_id": db_id}]
    data.write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"row 1 \(0-based\): db_id .* is a path, not the name of a database folder"):
        load_rows("bird", data, require_databases=False)
    common = tmp_path / "rows.json"
    common.write_text(json.dumps([{"question": "q", "gold_sql": "SELECT 1", "db_id": db_id, "db_path": "x.sqlite"}]))
    with pytest.raises(DataError, match=r"row 0 \(0-based\): db_id"):
        load_json_rows(common)
    common.write_text(json.dumps([{"question": "q", "gold_sql": "SELECT 1", "db_id": "ok", "db_path": 5}]))
    with pytest.raises(DataError, match=r"row 0 \(0-based\) 'db_path' holds int, not text"):
        load_json_rows(common)


def test_not_a_list_and_missing_file(tmp_path):
    scalar = tmp_path / "dev.json"
    scalar.write_text("42")
    with pytest.raises(DataError, match="expected a JSON list"):
        load_json_rows(scalar)
    with pytest.raises(DataError, match="data file not found"):
        load_json_rows(tmp_path / "nowhere.json")
    with pytest.raises(DataError, match="unknown data kind"):
        load_rows("wikisql", scalar)


def test_cli_reports_malformed_data_in_one_line(tmp_path, capsys):
    from t2s.commands import main

    bad = tmp_path / "dev.json"
    bad.write_text("[{")
    assert main(["data", "check", "--data", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and str(bad) in err[0]


@pytest.mark.parametrize("name", ["dev.json", "rows.jsonl"])
@pytest.mark.parametrize("value, problem", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"question_id": 1' + "0" * 5000 + "}", "a number of more digits than Python reads"),
])
def test_json_past_pythons_own_limits_is_one_error_line(tmp_path, capsys, name, value, problem):
    """Nesting deeper than Python's recursion limit, an integer longer than its digit limit: refused as invalid JSON
    naming the file, by the readers every command shares, never a RecursionError or ValueError traceback."""
    from t2s.commands import main

    bad = tmp_path / name
    bad.write_text(value + "\n")
    with pytest.raises(DataError, match=f"^Error: {re.escape(str(bad))}: .*not valid JSON: {problem}"):
        load_json_rows(bad)
    for argv in (["data", "check", "--data", str(bad)], ["eval", "--policy", "gold", "--data", str(bad), "--output",
                                                        str(tmp_path / "eval")]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"Error: {bad}: ") and problem in err[0], err


# ----------------------------------------------------------------------------------------------------------------
# SQaLe fixtures (row payloads), written in the documented formats

NASTY_DDL = """
CREATE TABLE "clients" (id INTEGER PRIMARY KEY, name TEXT, profile TEXT, balance INTEGER);
CREATE TABLE orders (id INTEGER, client_id INTEGER REFERENCES clients(id), total REAL);
CREATE TABLE broken (id INT, FOREIGN KEY oops);
CREATE TABLE "Straße_日本" ("größe" INTEGER, "名前" TEXT);
CREATE TABLE never_filled (id INTEGER);
"""

NASTY_ROWS = {
    "clients": [
        {"id": 1, "name": "Ada", "profile": {"tags": ["a", "b"], "nested": {"x": 1}}, "balance": 2**70},
        {"id": 2, "name": "Bo", "profile": [1, 2, 3], "balance": -(2**80)},
        {"id": 2, "name": "duplicate id, ignored", "profile": None, "balance": 0},
    ],
    "orders": [{"id": 1, "client_id": 99, "total": 12.5}],  # a foreign key to nowhere: kept (FKs off)
    "broken": [{"id": 1}],  # its DDL fails: skipped
    "Straße_日本": [{"größe": 3, "名前": "ünïcödé"}],
    "ghost_table": [{"id": 1}],  # not in the DDL
}


def write_sqale(folder: Path, fmt: str = "jsonl") -> tuple[Path, Path]:
    """A SQaLe-style schema table and query table: the nasty schema, one with no rows, one with a failing DDL."""
    schemas = [
        {"schema_id": "schema_nasty", "full_schema": NASTY_DDL, "schema_content": json.dumps(NASTY_ROWS),
         "number_of_tables": 5},
        {"schema_id": "schema_empty", "full_schema": "CREATE TABLE lonely (id INTEGER, label TEXT);",
         "schema_content": "{}", "number_of_tables": 1},
        {"schema_id": "schema_bad_ddl", "full_schema": "CREATE TABLE bad (x INT, FOREIGN KEY oops);\n"
         "CREATE TABLE ok_table (v INTEGER);", "schema_content": json.dumps({"ok_table": [{"v": 7}]}),
         "number_of_tables": 2},
        {"schema_id": "schema_no_ddl_left", "full_schema": "CREATE TABLE (;", "schema_content": "{}",
         "number_of_tables": 1},
    ]
    queries = [
        {"schema_id": "schema_nasty", "question": "How many clients?", "query": "SELECT COUNT(*) FROM clients"},
        {"schema_id": "schema_nasty", "question": "Largest balance?", "query": "SELECT MAX(balance) FROM clients"},
        {"schema_id": "schema_empty", "question": "How many lonely rows?", "query": "SELECT COUNT(*) FROM lonely"},
        {"schema_id": "schema_bad_ddl", "question": "The value?", "query": "SELECT v FROM ok_table"},
        {"schema_id": "schema_unknown", "question": "Where?", "query": "SELECT 1"},
        {"schema_id": "schema_no_ddl_left", "question": "Anything?", "query": "SELECT 1"},
    ]
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import datasets

        datasets.Dataset.from_list(schemas).to_parquet(str(folder / "schemas.parquet"))
        datasets.Dataset.from_list(queries).to_parquet(str(folder / "queries.parquet"))
        return folder / "queries.parquet", folder / "schemas.parquet"
    (folder / "schemas.jsonl").write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in schemas))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return folder / "queries.jsonl", folder / "schemas.jsonl"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_sqale_payloads(tmp_path, fmt):
    queries, schemas = write_sqale(tmp_path / fmt, fmt)
    rows = load_rows("sqale", queries, schemas=schemas, source=f"sqale_{fmt}")
    # a schema with nothing left of its DDL is either left out (reported) or kept as an empty database
    assert len(rows) + rows.missing_databases.get("schema_no_ddl_left", 0) == 5
    assert set(rows.missing_databases) <= {"schema_unknown", "schema_no_ddl_left"}
    assert rows.missing_databases["schema_unknown"] == 1
    assert all(tuple(r) == ROW_KEYS and r["db_path"] is None and r["schema_id"] for r in rows)
    assert rows[0]["question_id"] == f"sqale_{fmt}:0" and rows[3]["question_id"] == f"sqale_{fmt}:3"
    nasty, empty, bad_ddl = rows[0], rows[2], rows[3]
    assert _query(nasty, nasty["gold_sql"]) == [(2,)]  # duplicate primary key ignored
    # integers beyond 64 bits are clamped, nested values stored as JSON text
    assert _query(nasty, "SELECT balance FROM clients ORDER BY id") == [(2**63 - 1,), (-(2**63),)]
    profile = _query(nasty, "SELECT profile FROM clients WHERE id = 1")[0][0]
    assert json.loads(profile) == {"tags": ["a", "b"], "nested": {"x": 1}}
    assert _query(nasty, 'SELECT "名前" FROM "Straße_日本" WHERE "größe" = 3') == [("ünïcödé",)]
    assert _query(nasty, "SELECT COUNT(*) FROM never_filled") == [(0,)]  # named in the DDL, absent from rows
    assert _query(nasty, "SELECT total FROM orders") == [(12.5,)]
    tables = {t for (t,) in _query(nasty, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "broken" not in tables and "ghost_table" not in tables
    assert _query(empty, empty["gold_sql"]) == [(0,)]  # a schema with no rows
    assert _query(bad_ddl, bad_ddl["gold_sql"]) == [(7,)]  # the failing statement is skipped


def test_sqale_folder_inline_and_configurable_columns(tmp_path):
    # inline form: every query row carries its own DDL and payload, under renamed columns
    inline = tmp_path / "inline.jsonl"
    inline.write_text(
        json.dumps({"nl": "How many?", "sql_query": "SELECT COUNT(*) FROM t", "ddl": "CREATE TABLE t (x INT);",
                    "rows": {"t": [{"x": 1}, {"x": 2}]}}) + "\n"
    )
    rows = load_rows("sqale", inline, columns=SqaleColumns(question="nl", sql="sql_query", ddl="ddl", content="rows"))
    assert len(rows) == 1 and rows[0]["schema_id"].startswith("schema_")
    assert _query(rows[0], rows[0]["gold_sql"]) == [(2,)]
    # a column that is nowhere: the message lists what is there
    queries, schemas = write_sqale(tmp_path / "cols")
    with pytest.raises(DataError) as info:
        load_rows("sqale", queries, schemas=schemas,
                  columns=SqaleColumns(question="utterance", question_aliases=()))
    assert "utterance" in str(info.value) and "schema_id" in str(info.value)


@pytest.mark.parametrize("content, reason", [
    ("{not json", "the row payload is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "the row payload cannot be read: RecursionError"),  # past Python's nesting limit
    ('{"a": 5}', "rows of table 'a' are not a list of objects"),
    ("[1, 2]", "the row payload is list, expected a table -> rows map"),
])
def test_a_schema_with_a_bad_payload_leaves_its_questions_out_and_the_rest_load(tmp_path, caplog, content, reason):
    """One broken schema does not stop the load: its questions are left out and counted, as a schema whose DDL
    cannot be built is, and the warning names it and why."""
    import logging

    queries, _ = write_sqale(tmp_path / "bad")
    schemas = tmp_path / "bad" / "broken_schemas.jsonl"
    schemas.write_text(json.dumps({"schema_id": "schema_nasty", "full_schema": "CREATE TABLE a (x);",
                                   "schema_content": content}) + "\n" + json.dumps(
        {"schema_id": "schema_empty", "full_schema": "CREATE TABLE lonely (id INTEGER, label TEXT);",
         "schema_content": "{}"}) + "\n")
    with caplog.at_level(logging.WARNING):
        rows = load_rows("sqale", queries, schemas=schemas, limit=3)
    assert [row["schema_id"] for row in rows] == ["schema_empty"]
    assert rows.missing_databases["schema_nasty"] == 2
    assert any("schema_nasty could not be built" in r.getMessage() and reason in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    with pytest.raises(DataError, match="file not found"):
        load_rows("sqale", tmp_path / "absent.parquet", schemas=schemas)


# ----------------------------------------------------------------------------------------------------------------
# SynSQL fixture


def write_synsql(folder: Path) -> Path:
    records = [
        {"db_id": "shop", "sql_complexity": "Simple", "question_style": "Formal", "question": "How many items?",
         "external_knowledge": "", "cot": "...", "sql": "SELECT COUNT(*) FROM item"},
        {"db_id": "shop", "sql_complexity": "Moderate", "question": "Cheapest?", "external_knowledge": "cheap = price",
         "sql": "SELECT name FROM item ORDER BY price LIMIT 1"},
        {"db_id": "shop", "sql_complexity": "Complex", "question": "Ranked?", "external_knowledge": None,
         "sql": "SELECT name, RANK() OVER (ORDER BY price) FROM item"},
        {"db_id": "shop", "sql_complexity": "Highly Complex", "question": "Nested?",
         "sql": "WITH c AS (SELECT * FROM item) SELECT COUNT(*) FROM c"},
        {"db_id": "absent_db", "sql_complexity": "unheard of", "question": "?", "sql": "SELECT 1"},
    ]
    db_dir = folder / "databases" / "shop"
    db_dir.mkdir(parents=True)
    with sqlite3.connect(db_dir / "shop.sqlite") as conn:
        conn.execute("CREATE TABLE item (name TEXT, price REAL)")
        conn.executemany("INSERT INTO item VALUES (?, ?)", [("pen", 1.5), ("ink", 3.0)])
    conn.close()
    (folder / "data.json").write_text(json.dumps(records))
    return folder / "data.json"


def test_synsql_rows(tmp_path):
    data = write_synsql(tmp_path / "synsql")
    rows = load_rows("synsql", tmp_path / "synsql")
    assert [r["difficulty"] for r in rows] == ["simple", "moderate", "challenging", "challenging", None]
    assert rows[1]["evidence"] == "cheap = price" and rows[2]["evidence"] == ""
    assert rows[0]["question_id"] == "synsql:0" and rows[0]["source"] == "synsql"
    assert rows.missing_databases == {"absent_db": 1}
    assert _query(rows[0], rows[0]["gold_sql"]) == [(2,)]
    assert load_json_rows(data)[3]["difficulty"] == "challenging"  # detected from its `sql` / `sql_complexity`
    with pytest.raises(DataError, match="absent_db"):
        load_rows("synsql", data, require_databases=True)


def test_synsql_label_mapping():
    assert loaders.synsql_difficulty("Highly Complex") == "challenging"
    assert loaders.synsql_difficulty(" highly_complex ") == "challenging"
    assert loaders.synsql_difficulty("Simple") == "simple" and loaders.synsql_difficulty(None) is None


def test_sqale_hub_id_offline_is_a_clear_error(tmp_path):
    _, schemas = write_sqale(tmp_path / "hub")
    with pytest.raises(DataError, match="cannot load the Hub dataset 'no-such-org/no-such-sqale'"):
        load_rows("sqale", "no-such-org/no-such-sqale", schemas=schemas)


def test_evidence_that_is_not_text_is_left_out_as_bird_files_leave_it(tmp_path):
    """A row's evidence reaches the prompt and every eval line; one that is not text (a list, a number) is dropped
    by both readers alike, so the lines eval writes read back."""
    rows = [{"question_id": "q1", "question": "How many?", "gold_sql": "SELECT 1", "db_id": "x", "evidence": ["a"]},
            {"question_id": "q2", "question": "How many?", "gold_sql": "SELECT 1", "db_id": "x", "evidence": 7},
            {"question_id": "q3", "question": "How many?", "gold_sql": "SELECT 1", "db_id": "x", "evidence": "hint"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    bird = [{"question_id": r["question_id"], "question": r["question"], "SQL": r["gold_sql"], "db_id": "x",
             "evidence": r["evidence"]} for r in rows]
    (tmp_path / "dev.json").write_text(json.dumps(bird))
    for path in (tmp_path / "rows.json", tmp_path / "dev.json"):
        assert [row["evidence"] for row in load_json_rows(path, require_databases=False)] == ["", "", "hint"]


def test_a_lone_surrogate_in_a_question_becomes_a_replacement_character_the_tokenizer_encodes(tmp_path,
                                                                                               tiny_tokenizer):
    data = tmp_path / "dev.json"
    data.write_text('[{"question_id": 1, "db_id": "x", "question": "how many \\udcff\\ud800?", "evidence": '
                    '"a \\udcfe", "SQL": "SELECT 1"}, {"question_id": 2, "db_id": "x", "question": "caf\\u00e9 '
                    '\\ud83d\\ude00", "SQL": "SELECT 1"}]')  # valid UTF-8 JSON; its escapes name lone surrogates
    first, second = load_rows("bird", data, require_databases=False)
    assert first["question"] == "how many \ufffd\ufffd?" and first["evidence"] == "a \ufffd"
    assert second["question"] == "café 😀"  # a surrogate pair is one character, kept
    assert tiny_tokenizer(first["question"] + first["evidence"])["input_ids"]


def test_every_text_of_a_row_is_well_formed_and_a_field_of_the_wrong_type_is_named(tmp_path):
    """A lone surrogate anywhere in a row (not only its question) would fail at the first UTF-8 write of it: eval's
    lines, a Dataset, data check's outcomes. A schema_id, source or question_id that is no text (nor a whole number)
    would fail later, far from the file: each is named with its row at load."""
    data = tmp_path / "rows.json"
    data.write_text('[{"question_id": "a\\ud800", "question": "q", "gold_sql": "SELECT \'\\udcff\'", '
                    '"db_id": "x\\udc80", "db_path": "x.sqlite", "source": "s\\ud801"}]')
    [row] = load_json_rows(data)
    for value in row.values():
        assert value is None or isinstance(value.encode("utf-8"), bytes)  # raises for a lone surrogate
    assert row["question_id"] == "a\ufffd" and row["db_id"] == "x\ufffd" and row["source"] == "s\ufffd"
    good = {"question": "q", "gold_sql": "SELECT 1", "db_id": "x", "db_path": "x.sqlite"}
    for field, value, said in [("schema_id", {"a": 1}, "'schema_id' holds dict, not text"),
                               ("source", ["s"], "'source' holds list, not text"),
                               ("question_id", {"a": 1}, "'question_id' holds dict, not text or a whole number"),
                               ("question_id", True, "'question_id' holds bool"),
                               ("question_id", 1.5, "'question_id' holds float")]:
        data.write_text(json.dumps([good, {**good, field: value}]))
        with pytest.raises(DataError, match=r"row 1 \(0-based\) " + re.escape(said)):
            load_json_rows(data)
    bird = tmp_path / "dev.json"
    bird.write_text(json.dumps([{"question_id": [1], "question": "q", "SQL": "SELECT 1", "db_id": "x"}]))
    with pytest.raises(DataError, match=r"row 0 \(0-based\) 'question_id' holds list"):
        load_rows("bird", bird, require_databases=False)


def test_a_db_id_too_long_for_a_file_name_is_a_missing_database_not_a_crash(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps([{"question_id": 1, "question": "q", "SQL": "SELECT 1", "db_id": "a" * 300}]))
    rows = load_rows("bird", data, require_databases=False)
    assert rows.missing_databases == {"a" * 300: 1}
    from t2s.data import hygiene

    [outcome] = hygiene.check_rows([{**rows[0], "db_path": str(tmp_path / ("b" * 300) / "x.sqlite")}],
                                   progress=False, use_cache=False)[0]
    assert outcome["outcome"] == "missing_db"


def test_an_output_file_is_written_whole_or_left_as_it_was(tmp_path, monkeypatch):
    import os

    from t2s.data.rows import write_text_whole

    path = tmp_path / "out" / "dev.json"
    write_text_whole(path, json.dumps(["caf\u00e9", "lone \udcff"], ensure_ascii=False))
    assert json.loads(path.read_text(encoding="utf-8")) == ["café", "lone \udcff"]  # the escape reads back the same

    def interrupted(source, target):  # the new text written in full, then the run killed before it takes the place
        assert Path(source).read_text() == '["new"]'
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_whole(path, '["new"]')
    assert json.loads(path.read_text(encoding="utf-8"))[0] == "café"  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == ["dev.json"]  # and no staged file left behind


def test_a_broken_json_document_of_many_lines_is_placed_where_it_breaks(tmp_path):
    """A pretty-printed {"data": [...]} with a stray comma is one JSON document, not JSONL: its error names its own
    line, not line 1."""
    data = tmp_path / "dev.json"
    rows = [{"question_id": i, "question": "q", "SQL": "SELECT 1", "db_id": "x"} for i in range(3)]
    text = json.dumps({"data": rows}, indent=1).replace('"x"\n  }', '"x",\n  }', 1)  # a trailing comma
    data.write_text(text)
    broken = text.index('"x",') + 4
    line = text[:broken].count("\n") + 1
    with pytest.raises(DataError, match=rf"not valid JSON: .* at line {line + 1} column"):
        load_json_rows(data)
    data.write_text("\n".join(json.dumps(row) for row in rows[:2]) + "\n{broken\n")  # JSONL stays JSONL
    with pytest.raises(DataError, match="line 3 is not valid JSON"):
        load_json_rows(data)
