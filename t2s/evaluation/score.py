"""Scoring a predictions file (``t2s score``) with official EX, strict EX and BIRD's Soft-F1.

Predictions come as BIRD's ``predict_dev.json`` (``{"<position>": "<SQL>\\t----- bird -----\\t<db_id>"}``, keyed by
0-based position in the data file) or as JSONL / a JSON list of ``{"question_id": ..., "sql": ...}``.

Writes ``DIR/scores.jsonl`` (one line per data row: question_id, db_id, difficulty, official, strict, soft_f1,
error, unscored), ``DIR/summary.json`` (n, execution_accuracy_official, strict, soft_f1, per_difficulty, missing,
missing_ids, errors, error_ids, gold_failures, gold_failure_ids) and ``DIR/problems.json`` (what was wrong with the
input: ids not in the data, duplicated ids, db_ids that disagree with the data, questions that cannot be scored,
unreadable databases with the reason, questions whose gold SQL fails).

Counting rules:
- a question without a prediction scores 0 and is listed in ``missing_ids``;
- a prediction that is blank, not a string, fails, times out or goes over the scoring cap scores 0 and is listed in
  ``error_ids``;
- a question that cannot be scored has null metrics, is left out of the averages (``n`` still counts it), and says
  why in ``unscored``: ``database missing`` or ``database unreadable`` (the databases are probed once at start-up;
  both are listed in ``error_ids``), or ``gold failed`` (its gold SQL fails, times out or goes over the scoring cap:
  listed in ``gold_failure_ids``, never blamed on the prediction);
- a prediction's db_id that disagrees with the data is reported; the data's database is used, as BIRD's script does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from t2s.errors import T2SError, writing
from t2s.run_lock import run_folder_lock

BIRD_SEPARATOR = "\t----- bird -----\t"
METRICS = ("official", "strict", "soft_f1")
SUMMARY_NAMES = {"official": "execution_accuracy_official", "strict": "strict", "soft_f1": "soft_f1"}


class PredictionsError(T2SError, ValueError):
    """A predictions file that cannot be read; the message begins with ``Error:``."""


@dataclass
class Predictions:
    sql: dict[str, object] = field(default_factory=dict)  # question_id -> the predicted SQL (maybe not a string)
    db_ids: dict[str, str] = field(default_factory=dict)  # question_id -> the db_id the prediction names
    unknown_ids: list[str] = field(default_factory=list)  # prediction keys that match no data row
    duplicate_ids: list[str] = field(default_factory=list)


def _split_bird(value) -> tuple[object, str | None]:
    if isinstance(value, str) and BIRD_SEPARATOR in value:
        sql, db_id = value.rsplit(BIRD_SEPARATOR, 1)
        return sql, db_id.strip()
    return value, None


def read_predictions(path, rows: list[dict]) -> Predictions:
    """Read either predictions format, mapping BIRD positions to the rows' question ids."""
    from t2s.data.rows import DataError, parse_records, read_text_file

    file = Path(path)
    try:
        text = read_text_file(file, what="predictions file")
    except DataError as exc:
        raise PredictionsError(str(exc)) from None
    if not text.strip():
        raise PredictionsError(f"Error: the predictions file {file} is empty")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    known = {row["question_id"] for row in rows}
    out = Predictions()
    if document == {} or document == []:
        raise PredictionsError(f"Error: the predictions file {file} holds no predictions ({text.strip()})")
    if isinstance(document, dict) and "question_id" not in document:  # BIRD's predict_dev.json
        for key, value in document.items():
            position = int(key) if str(key).strip().lstrip("-").isdigit() else None
            if position is None or not 0 <= position < len(rows):
                out.unknown_ids.append(str(key))
                continue
            question_id = rows[position]["question_id"]
            if question_id in out.sql:
                out.duplicate_ids.append(question_id)
            out.sql[question_id], db_id = _split_bird(value)
            if db_id is not None:
                out.db_ids[question_id] = db_id
        return out
    if isinstance(document, dict):  # a file holding one {"question_id": ..., "sql": ...} record
        records = [document]
    else:
        try:
            records = parse_records(text, file)
        except DataError as exc:
            raise PredictionsError(str(exc)) from None
    for number, record in enumerate(records, start=1):
        if "question_id" not in record:
            raise PredictionsError(f"Error: {file}: entry {number} has no question_id")
        question_id = str(record["question_id"])
        if question_id not in known:
            out.unknown_ids.append(question_id)
            continue
        if question_id in out.sql:
            out.duplicate_ids.append(question_id)
        sql, db_id = _split_bird(record.get("sql"))
        out.sql[question_id] = sql
        db_id = record.get("db_id", db_id)
        if db_id is not None:
            out.db_ids[question_id] = str(db_id)
    return out


def _database_missing(row: dict) -> bool:
    """No database file (a server database that cannot be reached is found by ``database_problems``)."""
    from t2s.env.databases import is_dsn

    path = row.get("db_path")
    return row.get("schema_id") is None and not (path and (is_dsn(path) or Path(path).is_file()))


def _unscored(line: dict, reason: str, error: str) -> dict:
    return {**line, "official": None, "strict": None, "soft_f1": None, "error": error, "unscored": reason}


def score_row(row: dict, predictions: Predictions, unusable: dict[str, str] | None = None) -> dict:
    """The scores.jsonl line of one data row (``unusable``: db_id -> why that database cannot be read)."""
    from t2s.env import databases
    from t2s.scoring.metrics import score_sql

    line = {"question_id": row["question_id"], "db_id": row["db_id"], "difficulty": row.get("difficulty")}
    if row["question_id"] not in predictions.sql:
        return {**line, "official": 0, "strict": 0, "soft_f1": 0.0, "error": "Error: no prediction for this question",
                "unscored": None}
    if _database_missing(row):
        return _unscored(line, "database missing", f"Error: database not found: {row.get('db_path')}")
    if unusable and row["db_id"] in unusable:
        return _unscored(line, "database unreadable", f"Error: the database cannot be read: {unusable[row['db_id']]}")
    try:
        scores = score_sql(databases.ref_from_row(row), predictions.sql[row["question_id"]], row["gold_sql"])
    except Exception as exc:  # one broken question must not stop the run
        scores = {"official": 0, "strict": 0, "soft_f1": 0.0, "error": f"Error: {type(exc).__name__}: {exc}"}
    if scores.get("gold_failed"):
        return _unscored(line, "gold failed", scores["error"])
    return {**line, **{k: scores[k] for k in (*METRICS, "error")}, "unscored": None}


def _means(lines: list[dict]) -> dict:
    scored = [line for line in lines if line["official"] is not None]
    out = {"n": len(lines)}
    for key in METRICS:
        out[SUMMARY_NAMES[key]] = sum(line[key] for line in scored) / len(scored) if scored else 0.0
    return out


def summarise(lines: list[dict]) -> dict:
    """summary.json from the scores.jsonl lines."""
    summary = _means(lines)
    by_difficulty: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        by_difficulty[line["difficulty"] or "unknown"].append(line)
    summary["per_difficulty"] = {name: _means(group) for name, group in sorted(by_difficulty.items())}
    missing = [line["question_id"] for line in lines if line["error"] == "Error: no prediction for this question"]
    missing_set = set(missing)
    gold = [line["question_id"] for line in lines if line.get("unscored") == "gold failed"]
    errors = [line["question_id"] for line in lines
              if line["error"] and line["question_id"] not in missing_set and line.get("unscored") != "gold failed"]
    summary.update({"missing": len(missing), "missing_ids": missing, "errors": len(errors), "error_ids": errors,
                    "gold_failures": len(gold), "gold_failure_ids": gold})
    return summary


def problems(rows: list[dict], predictions: Predictions, lines: list[dict],
             unusable: dict[str, str] | None = None) -> dict:
    """What was wrong with the input, for problems.json and the printed warnings."""
    mismatched = [
        {"question_id": row["question_id"], "data": row["db_id"], "prediction": predictions.db_ids[row["question_id"]]}
        for row in rows
        if row["question_id"] in predictions.db_ids and predictions.db_ids[row["question_id"]] != row["db_id"]
    ]
    return {
        "unknown_ids": predictions.unknown_ids,
        "duplicate_ids": predictions.duplicate_ids,
        "db_id_mismatches": mismatched,
        "unscorable_ids": [line["question_id"] for line in lines if line["official"] is None],
        "unusable_databases": dict(sorted((unusable or {}).items())),
        "gold_failure_ids": [line["question_id"] for line in lines if line.get("unscored") == "gold failed"],
    }


def score_rows(rows: list[dict], predictions: Predictions, *, workers: int = 4, progress: bool = True,
               unusable: dict[str, str] | None = None) -> list[dict]:
    """Score every row in parallel threads (each query under its own deadline); lines come back in data order."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    lines: list[dict | None] = [None] * len(rows)
    columns = (TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar, \
            ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        task = bar.add_task("scoring", total=len(rows))
        futures = {pool.submit(score_row, row, predictions, unusable): index for index, row in enumerate(rows)}
        for future in as_completed(futures):
            lines[futures[future]] = future.result()
            bar.advance(task)
    return lines  # type: ignore[return-value]


def score_table(summary: dict, lines: list[dict]):
    from rich.table import Table

    table = Table(title="score")
    table.add_column("")
    for name in ("n", "scored", "official EX", "strict", "Soft-F1"):
        table.add_column(name, justify="right")
    scored: dict[str, int] = defaultdict(int)
    for line in lines:
        if line["official"] is not None:
            scored[line["difficulty"] or "unknown"] += 1
            scored["total"] += 1
    groups = list(summary["per_difficulty"].items()) if len(summary["per_difficulty"]) > 1 else []
    for name, part in [*groups, ("total", summary)]:
        table.add_row(name, str(part["n"]), str(scored[name]), f"{part['execution_accuracy_official']:.4f}",
                      f"{part['strict']:.4f}", f"{part['soft_f1']:.4f}")
    return table


def score_warnings(summary: dict, problem_report: dict, lines: list[dict]) -> list[str]:
    from functools import partial

    from t2s.ui.console import some

    some = partial(some, limit=5)

    out = []
    if summary["missing"]:
        out.append(f"{summary['missing']} questions have no prediction (scored 0): {some(summary['missing_ids'])}")
    if problem_report["unknown_ids"]:
        ids = problem_report["unknown_ids"]
        out.append(f"{len(ids)} prediction ids are not in the data (ignored): {some(ids)}")
    if problem_report["duplicate_ids"]:
        ids = problem_report["duplicate_ids"]
        out.append(f"{len(ids)} questions are predicted more than once (the last one is scored): {some(ids)}")
    if problem_report["db_id_mismatches"]:
        items = problem_report["db_id_mismatches"]
        named = [f"{m['question_id']} ({m['prediction']} vs {m['data']})" for m in items]
        out.append(f"{len(items)} predictions name a db_id other than the data's (the data's is used): {some(named)}")
    no_database = [line["question_id"] for line in lines if line.get("unscored") in ("database missing",
                                                                                      "database unreadable")]
    if no_database:
        out.append(f"{len(no_database)} questions cannot be scored, their database is missing or unreadable (left "
                   f"out of the averages): {some(no_database)}")
    for db_id, reason in problem_report.get("unusable_databases", {}).items():
        out.append(f"database {db_id} cannot be read: {reason}")
    if summary["gold_failures"]:
        out.append(f"{summary['gold_failures']} questions cannot be scored, their gold SQL fails (left out of the "
                   f"averages, not blamed on the predictions): {some(summary['gold_failure_ids'])}")
    errors = summary["errors"] - len(no_database)
    if errors:
        out.append(f"{errors} predictions failed or were blank (scored 0); see the error column of scores.jsonl")
    return out


def score_files(data, predictions_file, output, *, db_root=None, workers: int = 4, progress: bool = True,
                engine: str = "sqlite", dsn: str | None = None) -> dict:
    """Score a predictions file against a data file; writes scores.jsonl, summary.json and problems.json.
    ``engine``/``dsn``: the databases' engine (see ``loaders.load_json_rows``)."""
    from t2s.data.db_probe import database_problems
    from t2s.data.loaders import load_json_rows

    rows = list(load_json_rows(data, db_root, require_databases=None, engine=engine, dsn=dsn))
    predictions = read_predictions(predictions_file, rows)
    with run_folder_lock(output) as out:
        unusable = database_problems(rows)
        lines = score_rows(rows, predictions, workers=workers, progress=progress, unusable=unusable)
        summary = summarise(lines)
        problem_report = problems(rows, predictions, lines, unusable)
        with writing(out / "scores.jsonl"), open(out / "scores.jsonl", "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (out / "problems.json").write_text(json.dumps(problem_report, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")
    return {"summary": summary, "problems": problem_report, "lines": lines}
