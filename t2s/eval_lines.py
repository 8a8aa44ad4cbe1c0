"""The eval line: one episode record scored on the scoring connections (DESIGN §7 and §10)."""

from __future__ import annotations


def score_final_sql(row: dict, record: dict) -> dict:
    """official, strict, soft_f1 and error of an episode's final SQL (``metrics.score_sql`` on scoring connections)."""
    from t2s.databases import ref_from_row
    from t2s.metrics import score_sql

    final_sql = record.get("final_sql")
    scores = score_sql(ref_from_row(row), final_sql, row["gold_sql"])
    if not scores.get("gold_failed") and not (isinstance(final_sql, str) and final_sql.strip()):
        scores["error"] = "Error: no final SQL"
    return scores


def eval_line(row: dict, record: dict, scores: dict, sample: int) -> dict:
    """The eval line: the episode record plus sample, difficulty, official, strict, soft_f1, executes and error.

    When the gold SQL fails the question cannot be scored: official, strict, soft_f1 and executes are null and
    ``gold_error`` says why (the summary leaves such lines out of its averages and counts them).
    """
    error = scores.get("error")
    line = dict(record)
    if scores.get("gold_failed"):
        line.update(sample=sample, difficulty=row.get("difficulty"), official=None, strict=None, soft_f1=None,
                    executes=None, error=record.get("error"), gold_error=error)
        return line
    line.update(
        sample=sample,
        difficulty=row.get("difficulty"),
        official=int(scores["official"]),
        strict=int(scores["strict"]),
        soft_f1=float(scores["soft_f1"]),
        executes=error is None,
        error=record.get("error") or error,
    )
    return line


def score_record(row: dict, record: dict, sample: int) -> dict:
    return eval_line(row, record, score_final_sql(row, record), sample)
