"""Scoring a predictions file (``t2s score``) with official EX, strict EX and BIRD's Soft-F1.

Predictions come as BIRD's ``predict_dev.json`` (``{"<position>": "<SQL>\\t----- bird -----\\t<db_id>"}``, keyed by
0-based position in the data file) or as JSONL / a JSON list of ``{"question_id": ..., "sql": ...}``.

:func:`read_predictions` is the one reader of a predictions file, for ``score`` and ``eval --policy predictions``:
its result holds the problems found and their warning lines, which both commands print with :func:`print_warnings`.

Writes ``DIR/scores.jsonl`` (one line per scored data row: question_id, db_id, difficulty, official, strict, soft_f1,
error, unscored), ``DIR/summary.json`` (n, questions, execution_accuracy_official, strict, soft_f1, per_difficulty,
missing, missing_ids, errors, error_ids, gold_failures, gold_failure_ids, and eval's skipped_missing_dbs,
missing_db_ids, skipped_unusable_dbs, unusable_db_ids, unusable_dbs) and ``DIR/problems.json`` (what was wrong with the
input: ids not in the data, duplicated ids, db_ids that disagree with the data, questions that cannot be scored, missing
and unreadable databases with the reason, questions whose gold SQL fails).

Counting rules:
- a question whose database is missing or cannot be read follows eval's rule (``t2s.evaluation.questions``): the
  run stops at start-up naming the databases, or, with ``--skip-missing-dbs``, their questions are left out of the
  scores and of ``n`` and counted in ``skipped_missing_dbs`` / ``skipped_unusable_dbs``, whatever was predicted;
- a question without a prediction scores 0 and is listed in ``missing_ids``;
- a prediction that is blank, not a string, fails, times out or goes over the scoring cap scores 0 and is listed in
  ``error_ids``;
- a question whose gold SQL fails, times out or goes over the scoring cap has null metrics, is left out of the
  averages and of ``n`` (the questions scored, as in eval's summary; ``questions`` counts every row scored or not),
  says ``gold failed`` in ``unscored``, and is listed in ``gold_failure_ids``, never blamed on the prediction;
- a prediction's db_id that disagrees with the data is reported; the data's database is used, as BIRD's script does.
"""

from __future__ import annotations

import json
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
    """A predictions file as read against its data, with what was wrong with it (:func:`read_predictions`)."""

    sql: dict[str, object] = field(default_factory=dict)  # question_id -> the predicted SQL (maybe not a string)
    db_ids: dict[str, str] = field(default_factory=dict)  # question_id -> the db_id the prediction names
    unknown_ids: list[str] = field(default_factory=list)  # prediction keys that match no data row
    duplicate_ids: list[str] = field(default_factory=list)
    db_id_mismatches: list[dict] = field(default_factory=list)  # {"question_id", "data", "prediction"}
    missing_ids: list[str] = field(default_factory=list)  # questions to score that have no prediction
    warnings: list[str] = field(default_factory=list)  # one line per kind of problem, as both commands print them


def _split_bird(value) -> tuple[object, str | None]:
    if isinstance(value, str) and BIRD_SEPARATOR in value:
        sql, db_id = value.rsplit(BIRD_SEPARATOR, 1)
        return sql, db_id.strip()
    return value, None


def read_predictions(path, rows: list[dict], questions: list[dict] | None = None) -> Predictions:
    """Read either predictions format, mapping BIRD positions to the rows' question ids; PredictionsError when the
    file cannot be read.

    ``rows``: every row of the data file (BIRD positions count in it); ``questions``: the rows that will be scored
    (default: all), over which questions without a prediction are counted; when none of them has one, the file and
    the data do not go together (PredictionsError). The result holds the problems found and their warning lines
    (``warnings``).
    """
    out = _read(path, rows)
    out.db_id_mismatches = [
        {"question_id": row["question_id"], "data": row["db_id"], "prediction": out.db_ids[row["question_id"]]}
        for row in rows if out.db_ids.get(row["question_id"], row["db_id"]) != row["db_id"]
    ]
    wanted = rows if questions is None else questions
    out.missing_ids = [row["question_id"] for row in wanted if row["question_id"] not in out.sql]
    if wanted and len(out.missing_ids) == len(wanted):
        from t2s.ui.console import some

        scored = {row["question_id"] for row in wanted}  # where the predicted ones are: a database skipped, say
        elsewhere = sorted({str(row["db_id"]) for row in rows if row["question_id"] in out.sql and
                            row["question_id"] not in scored})
        raise PredictionsError(
            f"Error: none of the {len(wanted)} questions to score (such as "
            f"{some([row['question_id'] for row in wanted], limit=3)}) has a prediction in {path}, which predicts "
            f"{len(out.sql)} other questions of the data"
            + (f" (on {some(elsewhere, limit=3)})" if elsewhere else "") + f" and {len(out.unknown_ids)} ids not in it"
            + (f" ({some(out.unknown_ids, limit=3)})" if out.unknown_ids else "")
            + "; check that the predictions, the data and --n go together")
    out.warnings = prediction_warnings(out)
    return out


def prediction_warnings(predictions: Predictions) -> list[str]:
    """The warning lines of a predictions file's problems (without the ``Warning:`` prefix)."""
    from t2s.ui.console import some

    out = []
    if predictions.missing_ids:
        ids = predictions.missing_ids
        out.append(f"{len(ids)} questions have no prediction (scored 0): {some(ids, limit=5)}")
    if predictions.unknown_ids:
        ids = predictions.unknown_ids
        out.append(f"{len(ids)} prediction ids are not in the data (ignored): {some(ids, limit=5)}")
    if predictions.duplicate_ids:
        ids = predictions.duplicate_ids
        out.append(f"{len(ids)} questions are predicted more than once (the last one is scored): {some(ids, limit=5)}")
    if predictions.db_id_mismatches:
        items = predictions.db_id_mismatches
        named = [f"{m['question_id']} ({m['prediction']} vs {m['data']})" for m in items]
        out.append(f"{len(items)} predictions name a db_id other than the data's (the data's is used): "
                   f"{some(named, limit=5)}")
    return out


def print_warnings(warnings: list[str]) -> None:
    """Print each line as ``Warning: ...`` on stdout, through the project's console (as data, never markup)."""
    from t2s.ui.console import console

    out = console()
    for warning in warnings:
        out.print(f"Warning: {warning}", style="yellow", markup=False, highlight=False)


def _read(path, rows: list[dict]) -> Predictions:
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
    except (ValueError, RecursionError):  # not one JSON document: JSONL, or refused below with the reason
        document = None
    known = {row["question_id"] for row in rows}
    out = Predictions()
    if document == {} or document == []:
        raise PredictionsError(f"Error: the predictions file {file} holds no predictions ({text.strip()})")
    if isinstance(document, dict) and "question_id" not in document:  # BIRD's predict_dev.json
        positions: dict[str, int] = {}
        for key, value in sorted(document.items(), key=lambda item: _position(item[0], len(rows)) or 0):
            position = _position(key, len(rows))
            if position is None:
                out.unknown_ids.append(str(key))
                continue
            question_id = rows[position]["question_id"]
            if positions.setdefault(question_id, position) != position:
                continue  # a row the data repeats (word for word: loading refuses others): its first position counts
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
    if not any("sql" in record for record in records):  # e.g. "SQL" or "query": every prediction would score 0
        named = ", ".join(sorted({str(key) for record in records for key in record})[:8])
        raise PredictionsError(f"Error: {file}: no entry has an 'sql' field (they have: {named})")
    seen: set[str] = set()
    repeated = {row["question_id"] for row in rows if row["question_id"] in seen or seen.add(row["question_id"])}
    for number, record in enumerate(records, start=1):
        if "question_id" not in record:
            raise PredictionsError(f"Error: {file}: entry {number} has no question_id")
        question_id = str(record["question_id"])
        if question_id not in known:
            out.unknown_ids.append(question_id)
            continue
        if question_id in out.sql:
            if question_id in repeated:  # a line per data row: the data's repeat, its first line counts
                continue
            out.duplicate_ids.append(question_id)
        sql, db_id = _split_bird(record.get("sql"))
        out.sql[question_id] = sql
        db_id = record.get("db_id", db_id)
        if db_id is not None:
            out.db_ids[question_id] = str(db_id)
    return out


def _position(key, count: int) -> int | None:
    """A BIRD predictions key as a position among ``count`` rows, or None: ASCII digits only ("²" is a digit to
    ``str.isdigit`` but no number), and no row is further on than 19 digits."""
    digits = str(key).strip().lstrip("-")
    position = int(key) if digits.isascii() and digits.isdigit() and len(digits) < 19 else None
    return position if position is not None and 0 <= position < count else None


def _unscored(line: dict, reason: str, error: str) -> dict:
    return {**line, "official": None, "strict": None, "soft_f1": None, "error": error, "unscored": reason}


def score_row(row: dict, predictions: Predictions) -> dict:
    """The scores.jsonl line of one data row (whose database is present and readable: ``questions.playable_rows``)."""
    from t2s.env import databases
    from t2s.scoring.metrics import score_sql

    line = {"question_id": row["question_id"], "db_id": row["db_id"], "difficulty": row.get("difficulty")}
    if row["question_id"] not in predictions.sql:
        return {**line, "official": 0, "strict": 0, "soft_f1": 0.0, "error": "Error: no prediction for this question",
                "unscored": None}
    try:
        scores = score_sql(databases.ref_from_row(row), predictions.sql[row["question_id"]], row["gold_sql"])
    except Exception as exc:  # one broken question must not stop the run
        scores = {"official": 0, "strict": 0, "soft_f1": 0.0, "error": f"Error: {type(exc).__name__}: {exc}"}
    if scores.get("gold_failed"):
        return _unscored(line, "gold failed", scores["error"])
    return {**line, **{k: scores[k] for k in (*METRICS, "error")}, "unscored": None}


def _means(lines: list[dict]) -> dict:
    scored = [line for line in lines if line["official"] is not None]
    out = {"n": len(scored), "questions": len(lines)}
    for key in METRICS:
        # None: no average of nothing; 6 places, as eval's summary
        out[SUMMARY_NAMES[key]] = round(sum(line[key] for line in scored) / len(scored), 6) if scored else None
    return out


def summarise(lines: list[dict], skipped: dict | None = None) -> dict:
    """summary.json from the scores.jsonl lines and the questions skipped (``questions.playable_rows``)."""
    from t2s.evaluation.questions import skipped_summary
    from t2s.evaluation.report import by_difficulty

    summary = _means(lines)
    summary["per_difficulty"] = {name: _means(group) for name, group in by_difficulty(lines).items()}
    missing = [line["question_id"] for line in lines if line["error"] == "Error: no prediction for this question"]
    missing_set = set(missing)
    gold = [line["question_id"] for line in lines if line.get("unscored") == "gold failed"]
    errors = [line["question_id"] for line in lines
              if line["error"] and line["question_id"] not in missing_set and line.get("unscored") != "gold failed"]
    summary.update({"missing": len(missing), "missing_ids": missing, "errors": len(errors), "error_ids": errors,
                    "gold_failures": len(gold), "gold_failure_ids": gold, **skipped_summary(skipped)})
    return summary


def problems(predictions: Predictions, lines: list[dict], skipped: dict | None = None) -> dict:
    """What was wrong with the input, for problems.json."""
    skipped = skipped or {}
    return {
        "unknown_ids": predictions.unknown_ids,
        "duplicate_ids": predictions.duplicate_ids,
        "db_id_mismatches": predictions.db_id_mismatches,
        "unscorable_ids": [line["question_id"] for line in lines if line["official"] is None],
        "missing_databases": sorted(skipped.get("db_ids", [])),
        "unusable_databases": dict(sorted((skipped.get("unusable_dbs") or {}).items())),
        "gold_failure_ids": [line["question_id"] for line in lines if line.get("unscored") == "gold failed"],
    }


def score_rows(rows: list[dict], predictions: Predictions, *, workers: int = 4, progress: bool = True) -> list[dict]:
    """Score every row in parallel threads (each query under its own deadline); lines come back in data order."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    lines: list[dict | None] = [None] * len(rows)
    columns = (TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar, \
            ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        task = bar.add_task("scoring", total=len(rows))
        futures = {pool.submit(score_row, row, predictions): index for index, row in enumerate(rows)}
        for future in as_completed(futures):
            lines[futures[future]] = future.result()
            bar.advance(task)
    return lines  # type: ignore[return-value]


def score_table(summary: dict):
    from rich.table import Table

    table = Table(title="score")
    table.add_column("")
    for name in ("questions", "scored (n)", "official EX", "strict", "Soft-F1"):
        table.add_column(name, justify="right")
    groups = list(summary["per_difficulty"].items()) if len(summary["per_difficulty"]) > 1 else []
    for name, part in [*groups, ("total", summary)]:
        figures = [part[key] for key in ("execution_accuracy_official", "strict", "soft_f1")]
        table.add_row(name, str(part["questions"]), str(part["n"]),
                      *("-" if value is None else f"{value:.4f}" for value in figures))
    return table


def score_warnings(summary: dict, predictions: Predictions) -> list[str]:
    """Every warning line of a scoring run: the predictions file's (the lines ``eval --policy predictions`` prints
    too), the questions skipped for their database (as eval words them), gold failures and failed predictions."""
    from t2s.evaluation.report import unscored_notes
    from t2s.evaluation.questions import skipped_summary
    from t2s.ui.console import some

    out = list(predictions.warnings)
    out += unscored_notes({key: summary[key] for key in skipped_summary(None)}, limit=5)  # the skipped questions
    if summary["gold_failures"]:
        out.append(f"{summary['gold_failures']} questions cannot be scored, their gold SQL fails (left out of the "
                   f"averages, not blamed on the predictions): {some(summary['gold_failure_ids'], limit=5)}")
    if summary["errors"]:
        out.append(f"{summary['errors']} predictions failed or were blank (scored 0); see the error column of "
                   "scores.jsonl")
    return out


def score_files(data, predictions_file, output, *, db_root=None, workers: int = 4, progress: bool = True,
                engine: str = "sqlite", dsn: str | None = None, skip_missing_dbs: bool = False) -> dict:
    """Score a predictions file against a data file; writes scores.jsonl, summary.json and problems.json.
    ``engine``/``dsn``: the databases' engine (see ``loaders.load_json_rows``). A missing or unreadable database
    stops the run (EvalError), unless ``skip_missing_dbs`` leaves its questions out (``questions.playable_rows``).
    Returns {"summary", "problems", "lines", "predictions"}."""
    from t2s.data.loaders import load_json_rows
    from t2s.data.rows import DataError
    from t2s.evaluation.questions import once_each, playable_rows
    from t2s.data.loaders import json_data_file
    from t2s.evaluation.run_folders import check_output_apart, check_score_folder

    check_score_folder(output)
    rows = load_json_rows(data, db_root, require_databases=False, engine=engine, dsn=dsn)
    if not rows:
        raise DataError(f"Error: no questions in {data}")
    check_output_apart(output, json_data_file(data), rows, inputs=(predictions_file,))
    once, repeated = once_each(rows, list(rows))  # as eval counts them; positions still key BIRD's predictions
    scored, skipped = playable_rows(rows, once, skip_missing_dbs=skip_missing_dbs, db_root=db_root)
    skipped["repeated_ids"] = repeated
    predictions = read_predictions(predictions_file, list(rows), scored)
    with run_folder_lock(output) as out:
        lines = score_rows(scored, predictions, workers=workers, progress=progress)
        summary = summarise(lines, skipped)
        problem_report = problems(predictions, lines, skipped)
        with writing(out / "scores.jsonl"), open(out / "scores.jsonl", "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (out / "problems.json").write_text(json.dumps(problem_report, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")
    return {"summary": summary, "problems": problem_report, "lines": lines, "predictions": predictions}
