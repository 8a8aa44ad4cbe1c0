"""Evaluation metrics over query results as Python's sqlite3 returns them (docs/design.md §7).

- **official**: BIRD's execution accuracy, ``set(pred) == set(gold)`` on the full results (row order and duplicates
  ignored, column order kept);
- **strict**: ``pred == gold`` as lists (order and duplicates count);
- **soft_f1**: BIRD mini-dev's Soft-F1, reproduced with its quirks;
- :func:`score_sql` runs a prediction and its gold SQL on scoring connections and applies all three;
- :func:`vote` picks a candidate by execution consistency; :func:`mcnemar_exact` and :func:`paired_bootstrap` compare
  two runs question by question.

Values are compared exactly as sqlite3 returns them (``1 == 1.0``, ``'1' != 1``, ``None == None``); rounding belongs
only to the training reward's F1 (:mod:`t2s.scoring.rewards`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from t2s.env import databases

Row = Sequence[Any]

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def _rows(rows) -> list[tuple]:
    return [tuple(row) for row in rows]


def official_match(pred_rows, gold_rows) -> bool:
    """BIRD's rule: the two results hold the same set of rows."""
    return set(_rows(pred_rows)) == set(_rows(gold_rows))


def strict_match(pred_rows, gold_rows) -> bool:
    """The same rows in the same order, duplicates included."""
    return _rows(pred_rows) == _rows(gold_rows)


def _row_counts(pred_row: tuple, gold_row: tuple) -> tuple[float, float, float]:
    """(matched, predicted-only, gold-only) for one pair of rows, each divided by the gold row's width.

    A value counts as matched when it occurs anywhere in the other row (membership, not position or multiplicity).
    """
    width = len(gold_row)
    if width and pred_row == gold_row:  # every value matched
        return 1.0, 0.0, 0.0
    matched = sum(1 for value in pred_row if value in gold_row)
    pred_only = len(pred_row) - matched
    gold_only = sum(1 for value in gold_row if value not in pred_row)
    return matched / width, pred_only / width, gold_only / width


def soft_f1(pred_rows, gold_rows) -> float:
    """BIRD mini-dev's Soft-F1, quirks included.

    - both results empty scores 1.0;
    - each side is de-duplicated, keeping the first occurrence of each row;
    - rows are paired by position (so the right rows in another order can score 0);
    - a pair adds its matched / predicted-only / gold-only value counts, each divided by the gold row's width;
    - an unpaired gold row adds 1 to the missed count, an unpaired predicted row 1 to the extra count;
    - precision = tp / (tp + fp), recall = tp / (tp + fn), F1 their harmonic mean (0 when undefined).
    """
    pred = list(dict.fromkeys(_rows(pred_rows)))
    gold = list(dict.fromkeys(_rows(gold_rows)))
    if not pred and not gold:
        return 1.0
    tp = fp = fn = 0.0
    for pred_row, gold_row in zip(pred, gold):
        matched, pred_only, gold_only = _row_counts(pred_row, gold_row)
        tp += matched
        fp += pred_only
        fn += gold_only
    fn += max(0, len(gold) - len(pred))
    fp += max(0, len(pred) - len(gold))
    precision = tp / (tp + fp) if tp + fp > 0 else 0.0
    recall = tp / (tp + fn) if tp + fn > 0 else 0.0
    if precision + recall <= 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def _zero(error: str) -> dict:
    return {"official": 0, "strict": 0, "soft_f1": 0.0, "error": error}


def score_sql(ref, pred_sql, gold_sql: str, *, results: dict | None = None) -> dict:
    """Score one prediction against its gold SQL on the scoring connections of ``ref``.

    Returns ``{"official": 0|1, "strict": 0|1, "soft_f1": float, "error": str | None}``. The gold result comes from
    the per-database cache; the prediction runs under the scoring deadline (``max(5 s, 10 x gold time)``, capped).
    A blank or non-string prediction, an error, a timeout, or a result over the scoring cap scores 0 with the reason
    in ``error`` (over the cap: ``over_cap`` True too, as it ran). A gold SQL that fails, times out or goes over the
    cap is reported in ``error`` and never scores as correct; ``gold_failed`` is then True (whatever the prediction),
    so callers can leave the question out rather than blame the prediction.

    ``results``, when given, receives the ``gold`` and ``pred`` query results that were run (for a reader to see).
    """
    gold = databases.gold_result(ref, gold_sql)
    if results is not None:
        results["gold"] = gold
    if gold.error is not None or gold.timed_out:
        return {**_zero(f"Error: the gold SQL failed: {gold.error or 'timed out'}"), "gold_failed": True}
    if gold.over_cap:
        return {**_zero("Error: the gold result is over the scoring cap"), "gold_failed": True}
    if not isinstance(pred_sql, str):
        return _zero(f"Error: the prediction is not a string ({type(pred_sql).__name__})")
    if not pred_sql.strip():
        return _zero("Error: the prediction is blank")
    pred = databases.run_scoring_query(ref, pred_sql, timeout=databases.scoring_timeout(gold.seconds))
    if results is not None:
        results["pred"] = pred
    if pred.error is not None or pred.timed_out:
        return _zero(pred.error or "Error: the prediction timed out")
    if pred.over_cap:  # it ran (``over_cap``: the executes rate counts it, as the reward's executable tier does)
        return {**_zero("Error: the prediction's result is over the scoring cap"), "over_cap": True}
    if pred.rows == gold.rows:  # the same rows in the same order: each measure at its best (soft_f1 exactly 1.0)
        return {"official": 1, "strict": 1, "soft_f1": 1.0, "error": None}
    return {
        "official": int(official_match(pred.rows, gold.rows)),
        "strict": int(strict_match(pred.rows, gold.rows)),
        "soft_f1": soft_f1(pred.rows, gold.rows),
        "error": None,
    }


def vote(candidates: Sequence) -> int | None:
    """Execution-consistency voting: the index of the chosen candidate, or None when every candidate failed.

    ``candidates`` are query results (anything with ``rows`` and ``error``, e.g. ``databases.QueryResult``) or None.
    Results that failed, timed out, went over the cap or are empty are left out. The rest are grouped by the *set* of
    their rows; the largest group wins and a tie goes to the group whose first member came first. The returned index
    is that first member.
    """
    groups: dict[frozenset, list[int]] = {}
    for index, result in enumerate(candidates):
        if result is None or getattr(result, "error", None) is not None:
            continue
        if getattr(result, "timed_out", False) or getattr(result, "over_cap", False):
            continue
        rows = _rows(result.rows)
        if not rows:
            continue
        groups.setdefault(frozenset(rows), []).append(index)
    if not groups:
        return None
    # dicts keep insertion order, which is the order of each group's first member; max keeps the first of equals
    best = max(groups.values(), key=len)
    return best[0]


EXACT_MCNEMAR_MAX_PAIRS = 20_000  # above this many discordant pairs, the tail is summed in log space


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: a binomial(b + c, 1/2) test on the discordant counts ``b`` and ``c``."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    if n > EXACT_MCNEMAR_MAX_PAIRS:  # the tail's terms in log space: exact to float precision, in O(k)
        log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
        top = max(log_terms)
        log_tail = top + math.log(math.fsum(math.exp(t - top) for t in log_terms))
        return min(1.0, math.exp(math.log(2.0) + log_tail - n * math.log(2.0)))
    term = tail = 1  # C(n, 0); each next binomial coefficient from the one before, in exact integers
    for i in range(k):
        term = term * (n - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**n)


def paired_bootstrap(
    correct_a: Sequence[float],
    correct_b: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``delta = mean(b) - mean(a)``, resampling questions (pairs) with replacement.

    Deterministic for a given seed. Returns ``(low, high)``.
    """
    import numpy as np

    if len(correct_a) != len(correct_b):
        raise ValueError("the two runs must be paired question by question")
    n = len(correct_a)
    if n == 0:
        raise ValueError("no questions to compare")
    diffs = np.asarray(correct_b, dtype=np.float64) - np.asarray(correct_a, dtype=np.float64)
    rng = np.random.default_rng(seed)
    deltas = np.empty(resamples, dtype=np.float64)
    chunk = max(1, min(resamples, 2_000_000 // n))
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, n, size=(stop - start, n))
        deltas[start:stop] = diffs[picks].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(deltas, [alpha, 1.0 - alpha])
    return float(low), float(high)
