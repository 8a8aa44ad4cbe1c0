"""The eval line: one episode record scored on the scoring connections (DESIGN §7 and §10), with what a reader
needs to judge it: the question, evidence, gold SQL, and the first rows of the gold and predicted results.

Result previews (``gold_result``, ``pred_result``) are ``{"columns", "rows", "more", "error"}`` holding at most
``PREVIEW_ROWS`` rows, each cell cut to ``PREVIEW_CELL_CHARS`` characters; ``more`` says rows were left out.
``scores.jsonl`` holds the scoring keys of each line only (:func:`score_line`).
"""

from __future__ import annotations

import json
import math

PREVIEW_ROWS = 10
#: stop reasons of an episode that played no turn of the policy's own: its server or the environment failed, or its
#: prompt left no room in the budget (its 0 says nothing of the policy: compare and passrate leave such episodes out)
UNPLAYED = ("error", "prompt_too_long")
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
        executes=error is None or bool(scores.get("over_cap")),  # ran without error, as the reward's tiers count
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
#: the numbers of a line, with the range each lies in: scores from 0 to 1 (official and strict are 0 or 1, Soft-F1 a
#: fraction; a ``score`` run's too), ``executes`` a flag, ``prompt_tokens`` a count
NUMBER_KEYS = {"official": (0, 1), "strict": (0, 1), "soft_f1": (0, 1), "executes": (0, 1),
               "prompt_tokens": (0, None)}
MAX_COUNT = 2**53  # past it a number is no count a run writes, and its mean would not fit a float
TURN_TEXT_KEYS = ("assistant", "observation", "thinking")
EVAL_LINE_KEYS = ("sample", "official")  # what a resumed eval reads of every line


def _shown(value) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def _in_range(value, low=None, high=None) -> bool:
    """``value`` is an int or a float, finite, within ``low`` .. ``high`` (either None: open) and ``MAX_COUNT``."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return -MAX_COUNT <= value <= MAX_COUNT and (low is None or value >= low) and (high is None or value <= high)


def _call_problem(index: int, calls) -> str | None:
    """A turn's ``calls`` as episodes write them: a list of ``{"tool": text, "args": any JSON}``."""
    if not isinstance(calls, list):
        return f"turn {index}'s 'calls' must be a list, got {_shown(calls)}"
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("tool"), (str, type(None))):
            return f"turn {index}'s calls must be objects with a text 'tool', got {_shown(call)}"
    return None


def _turn_problem(turns) -> str | None:
    if not isinstance(turns, list):
        return f"'turns' must be a list, got {_shown(turns)}"
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"turn {index} must be an object, got {_shown(turn)}"
        for key in TURN_TEXT_KEYS:
            if not isinstance(turn.get(key), (str, type(None))):
                return f"turn {index}'s {key!r} must be text, got {_shown(turn[key])}"
        if problem := _call_problem(index, turn.get("calls", [])):
            return problem
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
    where present, with the types ``eval`` writes and numbers in their ranges (``NUMBER_KEYS``; NaN and infinities
    are none) (a training run's episodes have a ``step`` and no ``sample`` or ``official``).
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
    step = line.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or not _in_range(step, 0):
        return f"'step' must be a whole number of 0 or more, got {_shown(step)}"
    for key, (low, high) in NUMBER_KEYS.items():
        value = line.get(key)
        if value is not None and (not isinstance(value, (int, float)) or not _in_range(value, low, high)):
            bounds = f"from {low} to {high}" if high is not None else f"of {low} or more"
            return f"{key!r} must be a number {bounds}, or null, got {_shown(value)}"
    for key in TEXT_KEYS:
        if not isinstance(line.get(key), (str, type(None))):
            return f"{key!r} must be text or null, got {_shown(line[key])}"
    from t2s.env.record import COUNTER_KEYS

    counters = line.get("counters", {})
    if not isinstance(counters, dict):
        return f"'counters' must be an object, got {_shown(counters)}"
    for key in COUNTER_KEYS:  # the counters readers add up; others are carried as they are
        value = counters.get(key)
        if value is not None and (not isinstance(value, (int, float)) or not _in_range(value)):
            return f"counter {key!r} must be a finite number, got {_shown(value)}"
    return _turn_problem(line.get("turns", [])) or _preview_problem("gold_result", line.get("gold_result")) or \
        _preview_problem("pred_result", line.get("pred_result"))
