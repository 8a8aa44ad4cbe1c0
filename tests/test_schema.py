"""Schema reading, one-line DDL, foreign keys, join paths, descriptions and tables_in_sql."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from t2s.env.databases import benchmark_db, file_checksum, run_tool_query
from t2s.env.schema import (
    Schema, get_schema, one_line_ddl, read_descriptions, tables_in_reading_order, tables_in_sql,
)


def _schema_db(path: Path, script: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.commit()
    conn.close()
    return path


FK_SCRIPT = """
CREATE TABLE Country (code TEXT PRIMARY KEY, name TEXT);
CREATE TABLE city (
    id INTEGER PRIMARY KEY,
    "City Name"   TEXT   DEFAULT 'two  spaces',
    country_code TEXT REFERENCES COUNTRY,          -- implicit parent key, other case
    FOREIGN KEY (Country_Code) REFERENCES country(CODE)
);
CREATE TABLE person (id INTEGER PRIMARY KEY, city_id INTEGER REFERENCES City(ID), "order" TEXT);
CREATE TABLE pair (a TEXT, b TEXT, PRIMARY KEY (a, b));
CREATE TABLE pair_ref (x TEXT, y TEXT, FOREIGN KEY (x, y) REFERENCES pair);
CREATE TABLE island (z INTEGER);
"""


def test_one_line_ddl_collapses_whitespace_outside_quotes():
    sql = "CREATE  TABLE \"my  table\" (\n  a   TEXT DEFAULT 'x  \n y',\n  [b  c] INT, -- note */ here\n  `d  e` INT\n)"
    assert one_line_ddl(sql) == (
        "CREATE TABLE \"my  table\" ( a TEXT DEFAULT 'x  \n y', [b  c] INT, /* note * / here */ `d  e` INT )"
    )
    assert one_line_ddl("CREATE TABLE t (a 'it''s  ok')") == "CREATE TABLE t (a 'it''s  ok')"


def test_foreign_keys_with_implicit_parent_key_and_other_case(tmp_path):
    schema = get_schema(benchmark_db(_schema_db(tmp_path / "fk.sqlite", FK_SCRIPT)))
    assert schema.tables == ["Country", "city", "person", "pair", "pair_ref", "island"]
    assert schema.foreign_keys("CITY") == [
        ("city", "country_code", "Country", "code"),
        ("person", "city_id", "city", "id"),
    ]  # duplicate key declared twice is listed once
    assert schema.foreign_keys("country") == [("city", "country_code", "Country", "code")]
    assert ("pair_ref", "x", "pair", "a") in schema.foreign_keys("pair")
    assert ("pair_ref", "y", "pair", "b") in schema.foreign_keys("pair")
    assert schema.join_path("person", "country") == ["person.city_id = city.id", "city.country_code = Country.code"]
    assert schema.join_path("Country", "person") == ["Country.code = city.country_code", "city.id = person.city_id"]
    assert schema.join_path("city", "City") == []
    assert schema.join_path("person", "island") is None
    assert schema.join_path("person", "nowhere") is None
    assert schema.ddl("city").startswith(
        'CREATE TABLE city ( id INTEGER PRIMARY KEY, "City Name" TEXT DEFAULT \'two  spaces\'')
    assert schema.columns("person") == ["id", "city_id", "order"]
    assert schema.column_types("city") == {"id": "INTEGER", "City Name": "TEXT", "country_code": "TEXT"}
    assert schema.resolve_table('"PERSON"') == "person" and schema.resolve_table('x"; DROP TABLE t; --') is None
    assert schema.resolve_column("PERSON", "ORDER") == "order"
    assert schema.closest_tables("persn") == ["person"]
    assert schema.closest_columns("city", "city_name")[0] == "City Name"
    assert schema.columns("nowhere") == [] and schema.foreign_keys("nowhere") == []


def test_join_path_quotes_odd_identifiers(tmp_path):
    script = 'CREATE TABLE "a b" (id INTEGER PRIMARY KEY); CREATE TABLE c ("the id" INTEGER REFERENCES "a b"(id));'
    schema = get_schema(benchmark_db(_schema_db(tmp_path / "q.sqlite", script)))
    assert schema.join_path("c", "a b") == ['c."the id" = "a b".id']
    rows = run_tool_query(
        benchmark_db(tmp_path / "q.sqlite"), 'SELECT count(*) FROM c JOIN "a b" ON ' + schema.join_path("c", "a b")[0],
        max_rows=5,
    )
    assert rows.ok


def test_schema_is_cached_per_ref(tmp_path):
    ref = benchmark_db(_schema_db(tmp_path / "c.sqlite", "CREATE TABLE t (a)"))
    assert get_schema(ref) is get_schema(ref)
    assert isinstance(get_schema(ref), Schema) and get_schema(ref).tables == ["t"]


def test_empty_database_schema(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    schema = get_schema(benchmark_db(empty))
    assert schema.tables == [] and schema.closest_tables("x") == [] and schema.join_path("a", "b") is None


def test_superhero_schema(bird_superhero_dir):
    path = bird_superhero_dir / "dev_databases" / "superhero" / "superhero.sqlite"
    before = file_checksum(path)
    schema = get_schema(benchmark_db(path))
    assert len(schema.tables) == 10
    assert len(schema.all_foreign_keys) == 11
    assert len({fk[0] for fk in schema.all_foreign_keys} | {fk[2] for fk in schema.all_foreign_keys}) == 10
    assert schema.foreign_keys("colour") == [
        ("superhero", "skin_colour_id", "colour", "id"),
        ("superhero", "hair_colour_id", "colour", "id"),
        ("superhero", "eye_colour_id", "colour", "id"),
    ]
    assert schema.join_path("superpower", "publisher") == [
        "superpower.id = hero_power.power_id",
        "hero_power.hero_id = superhero.id",
        "superhero.publisher_id = publisher.id",
    ]
    assert schema.join_path("hero_attribute", "hero_power") == [
        "hero_attribute.hero_id = superhero.id",
        "superhero.id = hero_power.hero_id",
    ]
    assert "\n" not in schema.ddl("superhero") and "  " not in schema.ddl("superhero")
    assert file_checksum(path) == before


def test_spider_schemas_resolve_every_key(spider_dev_dir):
    paths = sorted((spider_dev_dir / "database").glob("*/*.sqlite"))
    assert len(paths) == 19
    for path in paths:
        schema = get_schema(benchmark_db(path))
        assert schema.tables, path
        for src, src_col, dst, dst_col in schema.all_foreign_keys:
            assert src in schema.tables and src_col in schema.columns(src), (path.name, src, src_col)
            if dst in schema.tables:  # a key may name a table that does not exist; the join tools skip it
                assert dst_col in schema.columns(dst) or dst_col == "rowid", (path.name, dst, dst_col)
    pets = get_schema(benchmark_db(spider_dev_dir / "database" / "pets_1" / "pets_1.sqlite"))
    assert pets.join_path("Student", "Pets") == ["Student.StuID = Has_Pet.StuID", "Has_Pet.PetID = Pets.PetID"]


def test_superhero_descriptions(bird_superhero_dir):
    folder = bird_superhero_dir / "dev_databases" / "superhero"
    descriptions = read_descriptions(folder)
    assert sorted(descriptions) == sorted(p.stem for p in (folder / "database_description").glob("*.csv"))
    assert len(descriptions) == 10 and all(descriptions.values())
    assert "full name" in descriptions["superhero"]["full_name"]
    assert read_descriptions(folder / "database_description") == descriptions


def test_descriptions_read_tolerantly(tmp_path):
    folder = tmp_path / "db" / "database_description"
    folder.mkdir(parents=True)
    header = "original_column_name,column_name,column_description,data_format,value_description\r\n"
    (folder / "bom.csv").write_bytes(b"\xef\xbb\xbf" + (header + "id,identifier,the id,integer,\r\n").encode())
    cp_row = 'name ,,caf\xe9 \x93quoted\x94 \x81,text,"multi\nline"\r\n'
    (folder / "cp.csv").write_bytes((header + cp_row).encode("latin-1"))
    (folder / "binary.csv").write_bytes(b"\x00\xff\xfe\x00garbage\x00\r\n\x00")
    (folder / "empty.csv").write_bytes(b"")
    (folder / "short.csv").write_text("original_column_name\nonly\n")
    descriptions = read_descriptions(tmp_path / "db")
    assert descriptions["bom"] == {"id": "identifier; the id"}
    assert descriptions["cp"] == {"name": "caf\u00e9 \u201cquoted\u201d \ufffd; multi line"}
    assert descriptions["empty"] == {} and descriptions["short"] == {"only": ""}
    assert "binary" in descriptions
    assert read_descriptions(tmp_path / "missing") == {}


def test_tables_in_sql():
    sql = (
        'WITH recent AS (SELECT * FROM "Superhero" WHERE id > 3) '
        "SELECT r.id FROM recent r JOIN [Colour] c ON c.id = r.eye_colour_id "
        "WHERE r.race_id IN (SELECT id FROM main.RACE) AND EXISTS (SELECT 1 FROM `hero_power` hp)"
    )
    assert tables_in_sql(sql) == {"superhero", "colour", "race", "hero_power"}
    assert tables_in_sql("SELECT 1") == set()
    assert tables_in_sql("SELECT a FROM t UNION SELECT b FROM u") == {"t", "u"}
    assert tables_in_sql("SELECT * FROM (SELECT * FROM inner_t) AS sub") == {"inner_t"}
    recursive = "WITH RECURSIVE r AS (SELECT id FROM t UNION ALL SELECT id + 1 FROM r WHERE id < 5) SELECT * FROM r"
    assert tables_in_sql(recursive) == {"t"}
    assert tables_in_sql("WITH superhero AS (SELECT * FROM colour) SELECT * FROM superhero") == {"colour"}
    assert tables_in_sql("SELECT (SELECT max(x) FROM s WHERE s.a = t.a) FROM t") == {"s", "t"}
    assert tables_in_sql('SELECT * FROM "My Table" AS m JOIN other o USING (id)') == {"my table", "other"}
    assert tables_in_sql("SELECT 1; SELECT * FROM t") == set()
    for broken in ("SELEC * FORM", "", None, "SELECT (", 42):
        assert tables_in_sql(broken) == set()


def test_tables_in_reading_order_put_the_outer_from_and_joins_first():
    join = "SELECT T2.colour FROM superhero AS T1 INNER JOIN colour AS T2 ON T1.eye_colour_id = T2.id"
    assert tables_in_reading_order(join) == ["superhero", "colour"]  # not the schema's order
    nested = "SELECT (SELECT max(x) FROM s) FROM Main_T m JOIN b ON 1 WHERE m.a IN (SELECT a FROM c JOIN Main_T)"
    assert tables_in_reading_order(nested) == ["main_t", "b", "s", "c"]  # each once, the outer query's first
    cte = "WITH superhero AS (SELECT * FROM colour) SELECT * FROM superhero JOIN race ON 1"
    assert tables_in_reading_order(cte) == ["race", "colour"]  # a CTE's name is no table read
    for sql in (join, nested, cte):
        assert set(tables_in_reading_order(sql)) == tables_in_sql(sql)
    for broken in ("SELEC * FORM", "", None, 42):
        assert tables_in_reading_order(broken) == []


def test_views_odd_tables_and_unicode_case_read_as_sqlite_reads_them(tmp_path):
    """A view is listed and described like a table; a table whose columns cannot be read (a name too long for the
    statement the pragma builds) is listed with its DDL and leaves every other table readable (one such table made
    every schema tool fail, and the prompt say "(no tables)"); a name is matched exactly first, then with SQLite's
    ASCII-only case folding (a table named with a Kelvin sign answered for ``key``)."""
    from t2s.env import databases
    from t2s.env.tools import Toolbox

    path = tmp_path / "odd.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE base (x INTEGER); INSERT INTO base VALUES (1);
        CREATE VIEW v AS SELECT x AS one FROM base;
        CREATE TABLE key (k TEXT); INSERT INTO key VALUES ('real');
        CREATE TABLE "\u212aey" (fake TEXT); INSERT INTO "\u212aey" VALUES ('decoy');
        CREATE TABLE "Éa" (upper_e TEXT); CREATE TABLE "éa" (lower_e TEXT);
    """)
    conn.execute(f'CREATE TABLE "{"n" * 100_000}" (a)')
    conn.commit()
    conn.close()
    box = Toolbox(databases.user_db(path))
    listed = box.call("list_tables", {}).text.splitlines()
    assert listed[:6] == ["base", "v", "key", "\u212aey", "Éa", "éa"] and listed[6].startswith("nnnn")
    assert listed[-1].startswith("... [output cut:")
    assert box.call("describe_table", {"table_name": "v"}).text == "CREATE VIEW v AS SELECT x AS one FROM base"
    assert box.call("sample_rows", {"table_name": "v"}).text == "one\n1"
    assert box.call("describe_table", {"table_name": "key"}).text == "CREATE TABLE key (k TEXT)"
    assert box.call("sample_rows", {"table_name": "KEY"}).text == "k\nreal"  # ASCII case folds
    assert box.call("sample_rows", {"table_name": "\u212aey"}).text == "fake\ndecoy"
    assert "lower_e" in box.call("describe_table", {"table_name": "éa"}).text
    assert "upper_e" in box.call("describe_table", {"table_name": "Éa"}).text
    assert "upper_e" in box.call("describe_table", {"table_name": "ÉA"}).text  # A folds to a; É stays É


def test_a_cut_observation_counts_the_characters_it_does_not_show(tmp_path):
    """The marker of a long tool result counts what was cut from the result (it was cut twice: by the tool, then
    with its label line, and the second marker counted only the label's characters)."""
    import re

    from t2s.env import databases
    from t2s.env.protocol import OBSERVATION_CHAR_CAP, cap_text, render_observation
    from t2s.env.tools import Toolbox

    path = tmp_path / "many.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("".join(f"CREATE TABLE table_number_{i} (x);" for i in range(2000)))
    conn.close()
    full = "\n".join(f"table_number_{i}" for i in range(2000))
    result = Toolbox(databases.user_db(path)).call("list_tables", {})
    shown = render_observation([result], "")
    assert len(shown) <= OBSERVATION_CHAR_CAP and shown.count("[output cut:") == 1
    [count] = re.findall(r"\[output cut: (\d+) more characters not shown\]", shown)
    kept = result.text[: result.text.index("\n... [output cut:")]
    assert full.startswith(kept) and int(count) == len(full) - len(kept)
    for size in (101, 150, 5000, 123_456):
        text = "x" * size
        cut = cap_text(text, 100)
        assert len(cut) == 100 and int(re.findall(r"(\d+) more", cut)[0]) == size - cut.index("\n")
