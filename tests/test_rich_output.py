"""rich output never wraps a path, an id or SQL, whatever the terminal width (COLUMNS) or the path's length."""

from __future__ import annotations

import json

import pytest
from rich.table import Table

from t2s.commands import main

LONG_PATH = "/data/" + "a-rather-long-folder-name/" * 8 + "dev.json"
SQL = "SELECT T1.name, COUNT(*) FROM members AS T1 INNER JOIN rides AS T2 ON T1.id = T2.member_id GROUP BY T1.name"


@pytest.mark.parametrize("columns", [None, "20", "80"])
def test_tables_and_lines_keep_paths_and_sql_whole(capsys, monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    from t2s.ui.console import console, print_table

    out = console()
    table = Table(title=f"gold SQL check: {LONG_PATH}")
    table.add_column("question_id")
    table.add_column("SQL")
    table.add_row("bird_dev:1534-with-a-long-suffix", SQL)
    print_table(out, table)
    out.print(f"wrote {LONG_PATH} and {SQL}")
    printed = capsys.readouterr().out
    assert f"gold SQL check: {LONG_PATH}" in printed and SQL in printed
    assert "bird_dev:1534-with-a-long-suffix" in printed and f"wrote {LONG_PATH} and {SQL}" in printed


def test_a_command_prints_long_paths_whole(demo_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    runs = tmp_path.joinpath(*["nested-folder-with-a-long-name"] * 4)
    runs.mkdir(parents=True)
    predictions = runs / "predictions.jsonl"
    first = json.loads((demo_dir / "dev.json").read_text())[0]["question_id"]  # one question predicted, one id unknown
    predictions.write_text(json.dumps({"question_id": first, "sql": "SELECT 1"}) + "\n"
                           + json.dumps({"question_id": "missing-everywhere", "sql": "SELECT 1"}) + "\n")
    out = runs / "score-output"
    assert main(["score", "--data", str(demo_dir / "dev.json"), "--predictions", str(predictions), "--output", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert str(out / "scores.jsonl") in printed and str(out / "summary.json") in printed
    assert "missing-everywhere" in printed
