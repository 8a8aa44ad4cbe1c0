"""The embedded demo data (data/demo): BIRD's layout, runnable gold SQL, and a deterministic generator."""

from __future__ import annotations

import csv
import dataclasses
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from t2s.data import demo

DESCRIPTION_HEADER = ["original_column_name", "column_name", "column_description", "data_format", "value_description"]
# SQLite writes the library's version into the file header (bytes 92-99); everything else must match exactly.
HEADER_VERSION_BYTES = slice(92, 100)


def open_read_only(path: Path):
    return closing(sqlite3.connect(path.as_uri() + "?mode=ro", uri=True))


@pytest.fixture(scope="module")
def questions(demo_dir):
    return json.loads((demo_dir / "dev.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tables_entries(demo_dir):
    return json.loads((demo_dir / "dev_tables.json").read_text(encoding="utf-8"))


def db_file(demo_dir: Path, db_id: str) -> Path:
    return demo_dir / "dev_databases" / db_id / f"{db_id}.sqlite"


def user_tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_every_gold_sql_runs_read_only_and_returns_rows(demo_dir, questions):
    connections: dict[str, sqlite3.Connection] = {}
    try:
        for q in questions:
            if q["db_id"] not in connections:
                path = db_file(demo_dir, q["db_id"])
                connections[q["db_id"]] = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)
            rows = connections[q["db_id"]].execute(q["SQL"]).fetchall()
            assert rows, f"question {q['question_id']} returns no rows"
        conn = next(iter(connections.values()))
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM clubs")
    finally:
        for conn in connections.values():
            conn.close()


def test_dev_json_has_birds_fields_and_types(questions):
    assert len(questions) >= 40
    expected = {"question_id": int, "db_id": str, "question": str, "evidence": str, "SQL": str, "difficulty": str}
    for q in questions:
        assert set(q) == set(expected), q
        for field, kind in expected.items():
            assert isinstance(q[field], kind), (field, q)
        assert q["difficulty"] in {"simple", "moderate", "challenging"}
        assert q["question"].strip() and q["SQL"].strip()
    assert [q["question_id"] for q in questions] == list(range(len(questions)))
    assert len({q["question"] for q in questions}) == len(questions)
    assert {q["difficulty"] for q in questions} == {"simple", "moderate", "challenging"}


def test_layout_matches_bird(demo_dir, questions, tables_entries):
    db_ids = {q["db_id"] for q in questions}
    assert db_ids == {e["db_id"] for e in tables_entries}
    for db_id in db_ids:
        folder = demo_dir / "dev_databases" / db_id
        assert db_file(demo_dir, db_id).is_file()
        assert not list(folder.glob("*-wal")) and not list(folder.glob("*-journal"))
        with open_read_only(db_file(demo_dir, db_id)) as conn:
            tables = user_tables(conn)
            assert 5 <= len(tables) <= 8
            assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
            total = sum(conn.execute(f"SELECT COUNT(*) FROM {quoted(t)}").fetchone()[0] for t in tables)
            assert 2000 <= total <= 10000
            columns = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({quoted(t)})")] for t in tables}
        csv_files = sorted(p.stem for p in (folder / "database_description").glob("*.csv"))
        assert csv_files == sorted(tables)
        for table in tables:
            with open(folder / "database_description" / f"{table}.csv", encoding="utf-8", newline="") as handle:
                rows = list(csv.reader(handle))
            assert rows[0] == DESCRIPTION_HEADER
            assert [r[0] for r in rows[1:]] == columns[table]
            assert all(len(r) == len(DESCRIPTION_HEADER) for r in rows)
            assert all(r[3] in {"integer", "text", "real"} and r[2] for r in rows[1:])


def test_tables_json_agrees_with_the_database(demo_dir, tables_entries):
    for entry in tables_entries:
        with open_read_only(db_file(demo_dir, entry["db_id"])) as conn:
            tables = user_tables(conn)
            assert entry["table_names_original"] == tables
            assert len(entry["table_names"]) == len(tables)
            expected_columns, expected_types, pk_columns, fks = [[-1, "*"]], ["text"], set(), []
            for t, table in enumerate(tables):
                for _, name, col_type, _, _, pk in conn.execute(f"PRAGMA table_info({quoted(table)})"):
                    expected_columns.append([t, name])
                    expected_types.append(col_type.lower())
                    if pk:
                        pk_columns.add(len(expected_columns) - 1)
                for fk in conn.execute(f"PRAGMA foreign_key_list({quoted(table)})"):
                    fks.append(((table, fk[3]), (fk[2], fk[4])))
        assert entry["column_names_original"] == expected_columns
        assert entry["column_types"] == expected_types
        assert [c[0] for c in entry["column_names"]] == [c[0] for c in expected_columns]
        flat_pks = {i for k in entry["primary_keys"] for i in (k if isinstance(k, list) else [k])}
        assert flat_pks == pk_columns
        named = [((tables[expected_columns[a][0]], expected_columns[a][1]),
                  (tables[expected_columns[b][0]], expected_columns[b][1])) for a, b in entry["foreign_keys"]]
        assert sorted(named) == sorted(fks)


def test_each_database_declares_valid_foreign_keys(demo_dir, tables_entries):
    for entry in tables_entries:
        with open_read_only(db_file(demo_dir, entry["db_id"])) as conn:
            tables = user_tables(conn)
            referencing = [t for t in tables if conn.execute(f"PRAGMA foreign_key_list({quoted(t)})").fetchall()]
            assert len(referencing) >= 3, entry["db_id"]
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert len(entry["foreign_keys"]) >= 4


def test_awkward_names_nulls_text_dates_and_numbers_are_present(demo_dir, tables_entries):
    names, types, nulls = [], set(), 0
    for entry in tables_entries:
        with open_read_only(db_file(demo_dir, entry["db_id"])) as conn:
            for table in user_tables(conn):
                names.append(table)
                for col in conn.execute(f"PRAGMA table_info({quoted(table)})").fetchall():
                    names.append(col[1])
                    types.add(col[2].upper())
                    nulls += conn.execute(
                        f"SELECT COUNT(*) FROM {quoted(table)} WHERE {quoted(col[1])} IS NULL").fetchone()[0]
    assert "Ride Participants" in names and "Book Copies" in names
    assert any(" " in n for n in names[1:] if n not in {"Ride Participants", "Book Copies"}), "no spaced column"
    assert any(n != n.lower() and " " not in n for n in names), "no mixed-case name"
    assert {"INTEGER", "REAL", "TEXT"} <= types
    assert nulls > 0

    with open_read_only(db_file(demo_dir, "cycling_club")) as conn:
        assert conn.execute("SELECT COUNT(*) FROM members WHERE JoinDate IS NULL OR typeof(JoinDate) <> 'text' "
                            "OR date(JoinDate) IS NOT JoinDate").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM members WHERE birth_year IS NULL").fetchone()[0] > 0
        assert conn.execute("SELECT typeof(purchase_price) FROM bikes LIMIT 1").fetchone()[0] == "real"
        assert conn.execute("SELECT typeof(elevation_gain_m) FROM routes WHERE elevation_gain_m IS NOT NULL "
                            "LIMIT 1").fetchone()[0] == "integer"
    with open_read_only(db_file(demo_dir, "village_library")) as conn:
        dates = conn.execute('SELECT COUNT(*), SUM(date("Registered On") IS "Registered On") FROM patrons').fetchone()
        assert dates[0] > 0 and dates[0] == dates[1]
        assert conn.execute("SELECT COUNT(*) FROM loans WHERE returned_on IS NULL").fetchone()[0] > 0


def make_demo(output) -> int:
    """``python -m t2s data make-demo --output OUTPUT`` in this process (so a test may patch the generator)."""
    from t2s.commands import main

    return main(["data", "make-demo", "--output", str(output)])


def test_generator_is_deterministic(demo_dir, tmp_path):
    assert make_demo(tmp_path) == 0
    committed = sorted(p.relative_to(demo_dir) for p in demo_dir.rglob("*") if p.is_file())
    regenerated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert committed == regenerated
    assert any(p.suffix == ".sqlite" for p in committed)
    for relative in committed:
        old, new = (demo_dir / relative).read_bytes(), (tmp_path / relative).read_bytes()
        if relative.suffix == ".sqlite":
            old, new = bytearray(old), bytearray(new)
            old[HEADER_VERSION_BYTES] = new[HEADER_VERSION_BYTES] = b"\0" * 8
        assert old == new, f"{relative} differs after regenerating"


def test_generator_rejects_gold_sql_without_rows(tmp_path, monkeypatch, capsys):
    empty_answer = ("Any club founded in 1066?", "", "SELECT club_name FROM clubs WHERE founded_year = 1066", "simple")
    broken = dataclasses.replace(demo.DATABASES[0], questions=[empty_answer])
    monkeypatch.setattr(demo, "DATABASES", (*demo.DATABASES[1:], broken))
    assert make_demo(tmp_path) == 1
    assert capsys.readouterr().err.startswith("Error:")
    assert not (tmp_path / "dev.json").exists()
    assert not list(tmp_path.rglob("*.sqlite*")), "a database was left behind although a gold SQL failed"
