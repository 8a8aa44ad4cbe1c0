"""The eval line: one episode record scored on the scoring connections (DESIGN §7 and §10), with what a reader
needs to judge it: the question, evidence, gold SQL, and the first rows of the gold and predicted results.

Result previews (``gold_result``, ``pred_result``) are ``{"columns", "rows", "more", "error"}`` holding at most
``PREVIEW_ROWS`` rows, each cell cut to ``PREVIEW_CELL_CHARS`` characters; ``more`` says rows were left out.
``scores.jsonl`` holds the scoring keys of each line only (:func:`score_line`).
"""

from __future__ import annotations

import json

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


# ------------------------------------------------------------------------------------------------- reading lines back
TEXT_KEYS = ("db_id", "mode", "final_sql", "final_sql_source", "submitted_sql", "stop_reason", "question", "evidence",
             "gold_sql", "difficulty", "error", "gold_error")
NUMBER_KEYS = ("official", "strict", "soft_f1", "executes", "prompt_tokens")
TURN_TEXT_KEYS = ("assistant", "observation", "thinking")
EVAL_LINE_KEYS = ("sample", "official")  # what a resumed eval reads of every line


def _shown(value) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def _turn_problem(turns) -> str | None:
    if not isinstance(turns, list):
        return f"'turns' must be a list, got {_shown(turns)}"
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"turn {index} must be an object, got {_shown(turn)}"
        for key in TURN_TEXT_KEYS:
            if not isinstance(turn.get(key), (str, type(None))):
                return f"turn {index}'s {key!r} must be text, got {_shown(turn[key])}"
        if not isinstance(turn.get("calls", []), list):
            return f"turn {index}'s 'calls' must be a list, got {_shown(turn['calls'])}"
    return None


def _preview_problem(key: str, preview) -> str | None:
    if preview is None:
        return None
    if not isinstance(preview, dict):
        return f"{key!r} must be an object, got {_shown(preview)}"
    rows = preview.get("rows", [])
    if not isinstance(preview.get("columns", []), list) or not isinstance(rows, list) or \
            not all(isinstance(row, list) for row in rows):
        return f"{key!r} must hold a list of columns and a list of rows, got {_shown(preview)}"
    return None


def line_problem(line, required: tuple[str, ...] = ()) -> str | None:
    """What would make ``line`` (a line of ``episodes.jsonl`` or ``scores.jsonl``) fail a reader, or None: its
    ``question_id`` and ``required`` keys (a resumed eval's: ``EVAL_LINE_KEYS``), and the other keys a reader uses,
    where present, with the types ``eval`` writes (a training run's episodes have no ``sample`` or ``official``).
    Resume, ``show`` and ``compare --html`` refuse such a line with its file and number instead of failing deep
    inside."""
    if not isinstance(line, dict):
        return f"is a JSON {type(line).__name__}, not an object"
    question_id = line.get("question_id")
    if isinstance(question_id, bool) or not isinstance(question_id, (str, int)):
        return f"'question_id' must be text or a whole number, got {_shown(question_id)}"
    missing = [key for key in required if key not in line]
    if missing:
        return f"has no {' or '.join(repr(key) for key in missing)}"
    sample = line.get("sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        return f"'sample' must be a whole number of 0 or more, got {_shown(sample)}"
    for key in NUMBER_KEYS:
        if not isinstance(line.get(key), (int, float, type(None))):
            return f"{key!r} must be a number or null, got {_shown(line[key])}"
    for key in TEXT_KEYS:
        if not isinstance(line.get(key), (str, type(None))):
            return f"{key!r} must be text or null, got {_shown(line[key])}"
    from t2s.env.record import COUNTER_KEYS

    counters = line.get("counters", {})
    if not isinstance(counters, dict):
        return f"'counters' must be an object, got {_shown(counters)}"
    for key in COUNTER_KEYS:  # the counters readers add up; others are carried as they are
        if not isinstance(counters.get(key), (int, float, type(None))):
            return f"counter {key!r} must be a number, got {_shown(counters[key])}"
    return _turn_problem(line.get("turns", [])) or _preview_problem("gold_result", line.get("gold_result")) or \
        _preview_problem("pred_result", line.get("pred_result"))
