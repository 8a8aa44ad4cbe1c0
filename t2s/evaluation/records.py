"""The eval line: one episode record scored on the scoring connections (DESIGN §7 and §10), with what a reader
needs to judge it: the question, evidence, gold SQL, and the first rows of the gold and predicted results.

Result previews (``gold_result``, ``pred_result``) are ``{"columns", "rows", "more", "error"}`` holding at most
``PREVIEW_ROWS`` rows, each cell cut to ``PREVIEW_CELL_CHARS`` characters; ``more`` says rows were left out.
``scores.jsonl`` holds the scoring keys of each line only (:func:`score_line`).
"""

from __future__ import annotations

PREVIEW_ROWS = 10
PREVIEW_CELL_CHARS = 200
SCORE_KEYS = ("question_id", "sample", "db_id", "difficulty", "official", "strict", "soft_f1", "executes", "error",
              "gold_error")


def _cell(value):
    if isinstance(value, bytes):
        value = f"<{len(value)} bytes>"
    if isinstance(value, str) and len(value) > PREVIEW_CELL_CHARS:
        return value[:PREVIEW_CELL_CHARS] + "…"
    return value


def result_preview(result, rows: int = PREVIEW_ROWS) -> dict | None:
    """The first ``rows`` rows of a ``databases.QueryResult`` as JSON (None when the query did not run)."""
    if result is None:
        return None
    kept = [[_cell(value) for value in row] for row in result.rows[:rows]]
    return {"columns": [str(c) for c in result.columns], "rows": kept,
            "more": bool(result.more or len(result.rows) > rows), "error": result.error}


def score_final_sql(row: dict, record) -> dict:
    """official, strict, soft_f1 and error of an episode's final SQL (``metrics.score_sql`` on scoring connections),
    with ``gold_result`` and ``pred_result`` previews."""
    from t2s.env.databases import ref_from_row
    from t2s.scoring.metrics import score_sql

    final_sql = record.final_sql
    results: dict = {}
    scores = score_sql(ref_from_row(row), final_sql, row["gold_sql"], results=results)
    if not scores.get("gold_failed") and not (isinstance(final_sql, str) and final_sql.strip()):
        scores["error"] = "Error: no final SQL"
    scores["gold_result"] = result_preview(results.get("gold"))
    scores["pred_result"] = result_preview(results.get("pred"))
    return scores


def eval_line(row: dict, record, scores: dict, sample: int) -> dict:
    """The eval line: the episode record (``EpisodeRecord.to_json``) plus question, evidence, gold_sql, sample,
    difficulty, official, strict, soft_f1, executes, error and the result previews.

    When the gold SQL fails the question cannot be scored: official, strict, soft_f1 and executes are null and
    ``gold_error`` says why (the summary leaves such lines out of its averages and counts them).
    """
    error = scores.get("error")
    line = record.to_json()
    line.update(question=row.get("question"), evidence=row.get("evidence") or "", gold_sql=row.get("gold_sql"),
                gold_result=scores.get("gold_result"), pred_result=scores.get("pred_result"))
    if scores.get("gold_failed"):
        line.update(sample=sample, difficulty=row.get("difficulty"), official=None, strict=None, soft_f1=None,
                    executes=None, error=record.error, gold_error=error)
        return line
    line.update(
        sample=sample,
        difficulty=row.get("difficulty"),
        official=int(scores["official"]),
        strict=int(scores["strict"]),
        soft_f1=float(scores["soft_f1"]),
        executes=error is None,
        error=record.error or error,
    )
    return line


def score_record(row: dict, record, sample: int) -> dict:
    """The eval line of an ``EpisodeRecord``, scored here."""
    return eval_line(row, record, score_final_sql(row, record), sample)


def score_line(line: dict) -> dict:
    """The ``scores.jsonl`` line of an eval line: its scoring keys only."""
    return {key: line.get(key) for key in SCORE_KEYS if key in line or key != "gold_error"}
