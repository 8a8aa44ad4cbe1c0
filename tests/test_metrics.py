"""Metrics: official EX, strict, BIRD mini-dev Soft-F1, voting, McNemar and the paired bootstrap."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2s.scoring.metrics import mcnemar_exact, official_match, paired_bootstrap, soft_f1, strict_match, vote

# ------------------------------------------------------------------------------------------------ official / strict


def test_official_ignores_row_order_and_duplicates():
    gold = [(1, "a"), (2, "b")]
    assert official_match([(2, "b"), (1, "a")], gold)
    assert official_match([(1, "a"), (2, "b"), (2, "b"), (1, "a")], gold)
    assert not official_match([(1, "a")], gold)
    assert not official_match([(1, "a"), (2, "b"), (3, "c")], gold)


def test_official_column_order_matters():
    assert not official_match([("a", 1), ("b", 2)], [(1, "a"), (2, "b")])


def test_strict_cares_about_order_and_duplicates():
    gold = [(1, "a"), (2, "b")]
    assert strict_match([(1, "a"), (2, "b")], gold)
    assert not strict_match([(2, "b"), (1, "a")], gold)
    assert not strict_match([(1, "a"), (2, "b"), (2, "b")], gold)


def test_values_compare_as_sqlite3_returns_them():
    # 1 and 1.0 are equal in Python, text '1' is not the number 1, NULL equals NULL, blobs compare as bytes
    assert official_match([(1,)], [(1.0,)])
    assert not official_match([("1",)], [(1,)])
    assert official_match([(None, b"\x00\x01")], [(None, b"\x00\x01")])
    assert not official_match([(b"a",)], [("a",)])
    assert not official_match([(0.1 + 0.2,)], [(0.3,)])  # no rounding in the official metric


def test_zero_rows():
    assert official_match([], []) and strict_match([], [])
    assert not official_match([], [(None,)])
    assert not official_match([(None,)], [])


def test_lists_and_tuples_compare_alike():
    assert official_match([[1, "a"]], [(1, "a")])
    assert strict_match([[1, "a"]], [(1, "a")])


# ------------------------------------------------------------------------------------------------ Soft-F1


def test_soft_f1_identical_results_score_one():
    rows = [(1, "a", None), (2, "b", 3.5)]
    assert soft_f1(rows, rows) == 1.0


def test_soft_f1_both_empty_scores_one_and_one_empty_scores_zero():
    assert soft_f1([], []) == 1.0
    assert soft_f1([(1,)], []) == 0.0
    assert soft_f1([], [(1,)]) == 0.0


def test_soft_f1_right_rows_in_swapped_order_score_zero():
    # rows pair by position: (1,'a') against (2,'b') and (2,'b') against (1,'a') share no value
    assert soft_f1([(1, "a"), (2, "b")], [(2, "b"), (1, "a")]) == 0.0
    # the official metric calls the same pair correct
    assert official_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")])


def test_soft_f1_swapped_rows_sharing_a_value_get_partial_credit():
    # pair 1: (1,'x') vs (2,'x'): 'x' matched (1/2), 1 pred-only (1/2), 2 gold-only (1/2); pair 2 likewise
    # tp = 1, fp = 1, fn = 1 -> precision = recall = 0.5
    assert soft_f1([(1, "x"), (2, "x")], [(2, "x"), (1, "x")]) == pytest.approx(0.5)


def test_soft_f1_nulls_count_as_values():
    assert soft_f1([(None,)], [(None,)]) == 1.0
    # (1, None) vs (1, 2): 1 matched, None pred-only, 2 gold-only, each /2 -> p = r = 0.5
    assert soft_f1([(1, None)], [(1, 2)]) == pytest.approx(0.5)


def test_soft_f1_deduplicates_keeping_first_occurrence():
    # pred de-duplicates to [(1,), (2,)], which then pairs position by position with gold
    assert soft_f1([(1,), (1,), (2,)], [(1,), (2,)]) == 1.0
    # first occurrence decides the position: [(2,), (1,)] pairs (2 vs 1), (1 vs 2)
    assert soft_f1([(2,), (1,), (2,)], [(1,), (2,)]) == 0.0


def test_soft_f1_extra_and_missing_rows():
    # one extra predicted row: tp = 1, fp = 1, fn = 0 -> p = 0.5, r = 1 -> f1 = 2/3
    assert soft_f1([(1,), (9,)], [(1,)]) == pytest.approx(2 / 3)
    # one missing gold row: tp = 1, fp = 0, fn = 1 -> f1 = 2/3
    assert soft_f1([(1,)], [(1,), (2,)]) == pytest.approx(2 / 3)


def test_soft_f1_divides_by_the_gold_rows_width():
    # pred row has 3 values, gold row 2: matched 2/2, pred-only 1/2, gold-only 0 -> p = 1/1.5, r = 1
    assert soft_f1([(1, 2, 3)], [(1, 2)]) == pytest.approx(2 * (2 / 3) / (2 / 3 + 1))
    # membership, not position, inside a row: column order inside the pair does not matter
    assert soft_f1([(2, 1)], [(1, 2)]) == 1.0


def test_soft_f1_mixed_types():
    # 1 == 1.0 matches; '1' does not match 1; blobs match bytes
    assert soft_f1([(1.0, b"x")], [(1, b"x")]) == 1.0
    assert soft_f1([("1",)], [(1,)]) == 0.0


cells = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([0.5, 1.0, 2.25]), st.sampled_from(["a", "b", "1"]),
                  st.sampled_from([b"x", b""]))


def rows_of(width):
    return st.lists(st.tuples(*[cells] * width), max_size=6)


results = st.integers(1, 3).flatmap(rows_of)


@settings(max_examples=200, deadline=None)
@given(results, results)
def test_soft_f1_lies_in_unit_interval(pred, gold):
    value = soft_f1(pred, gold)
    assert 0.0 <= value <= 1.0 + 1e-12


@settings(max_examples=200, deadline=None)
@given(results, results)
def test_official_at_least_strict(pred, gold):
    assert official_match(pred, gold) >= strict_match(pred, gold)


@settings(max_examples=100, deadline=None)
@given(results)
def test_a_result_matches_itself_under_every_metric(rows):
    assert official_match(rows, rows) and strict_match(rows, rows) and soft_f1(rows, rows) == 1.0


# ------------------------------------------------------------------------------------------------ voting


def _result(rows=(), error=None, **flags):
    return SimpleNamespace(rows=list(rows), error=error, timed_out=flags.get("timed_out", False),
                           over_cap=flags.get("over_cap", False))


def test_vote_largest_group_by_row_set_wins():
    candidates = [
        _result([(1,)]),
        _result([(2,), (3,)]),
        _result([(3,), (2,), (2,)]),  # same set as candidate 1
        None,
        _result(error="Error: no such table"),
    ]
    assert vote(candidates) == 1


def test_vote_tie_goes_to_the_group_whose_first_member_came_first():
    candidates = [_result([(5,)]), _result([(7,)]), _result([(7,)]), _result([(5,)])]
    assert vote(candidates) == 0


def test_vote_leaves_out_errors_empty_timeouts_and_over_cap():
    candidates = [_result([]), _result([]), _result([]), _result([(1,)], timed_out=True),
                  _result([(1,)], over_cap=True), _result([(4,)])]
    assert vote(candidates) == 5


def test_vote_all_failed_is_none():
    assert vote([None, _result(error="Error: x"), _result([])]) is None
    assert vote([]) is None


row_sets = st.sampled_from([[(1,)], [(2,)], [(1,), (2,)], [], None, "error"])


@settings(max_examples=200, deadline=None)
@given(st.lists(row_sets, max_size=8), st.randoms(use_true_random=False))
def test_vote_ignores_candidate_order_when_there_is_no_tie(specs, rnd):
    def build(spec):
        if spec is None:
            return None
        if spec == "error":
            return _result(error="Error: boom")
        return _result(spec)

    def winner(cands):
        index = vote(cands)
        return None if index is None else frozenset(cands[index].rows)

    candidates = [build(s) for s in specs]
    sizes = {}
    for s in specs:
        if s not in (None, "error") and s:
            sizes[frozenset(s)] = sizes.get(frozenset(s), 0) + 1
    shuffled = list(candidates)
    rnd.shuffle(shuffled)
    if not sizes:
        assert vote(candidates) is None and vote(shuffled) is None
        return
    top = max(sizes.values())
    leaders = [k for k, v in sizes.items() if v == top]
    assert winner(candidates) in leaders and winner(shuffled) in leaders
    if len(leaders) == 1:
        assert winner(candidates) == winner(shuffled) == leaders[0]


# ------------------------------------------------------------------------------------------------ paired statistics


def test_mcnemar_hand_values():
    # n = 12, P(X <= 2) = (1 + 12 + 66) / 4096; two-sided doubles it
    assert mcnemar_exact(10, 2) == pytest.approx(0.0386, abs=5e-5)
    assert mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(7, 7) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(1, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@pytest.mark.parametrize("b, c", [(3, 7), (50, 80), (900, 1100), (2000, 2300), (5000, 5000)])
def test_mcnemar_past_the_exact_sums_limit_agrees_with_the_exact_sum(b, c, monkeypatch):
    """Many discordant pairs (a large run's): the tail is summed in log space, within 1e-9 of the exact integer sum,
    which a test of a few thousand pairs can afford (each binomial coefficient exactly, from the one before it)."""
    from t2s.scoring import metrics

    n = b + c
    coefficients = [1]
    for i in range(min(b, c)):  # C(n, i + 1) = C(n, i) * (n - i) / (i + 1), a whole number at every step
        coefficients.append(coefficients[-1] * (n - i) // (i + 1))
    assert all(coefficients[i] == math.comb(n, i) for i in [*range(0, len(coefficients), 97), len(coefficients) - 1])
    exact = min(1.0, 2 * sum(coefficients) / 2**n)
    assert mcnemar_exact(b, c) == exact  # the integer path, below the limit
    monkeypatch.setattr(metrics, "EXACT_MCNEMAR_MAX_PAIRS", 0)
    assert mcnemar_exact(b, c) == pytest.approx(exact, rel=1e-9)
    monkeypatch.undo()
    big = mcnemar_exact(490_000, 510_000)  # a million discordant pairs: the log path, a p-value far below 1e-9
    assert 0.0 <= big < 1e-9 and mcnemar_exact(500_000, 500_000) == pytest.approx(1.0)


def test_paired_bootstrap_is_seeded_and_covers_the_delta():
    rng = random.Random(3)
    a = [int(rng.random() < 0.5) for _ in range(300)]
    b = [int(rng.random() < 0.6) for _ in range(300)]
    low, high = paired_bootstrap(a, b)
    assert (low, high) == paired_bootstrap(a, b)  # deterministic
    delta = sum(b) / 300 - sum(a) / 300
    assert low < delta < high
    assert 0.05 < high - low < 0.25


def test_paired_bootstrap_identical_runs_give_a_zero_interval():
    a = [1, 0, 1, 1, 0]
    assert paired_bootstrap(a, a) == (0.0, 0.0)


def test_paired_bootstrap_rejects_unpaired_input():
    with pytest.raises(ValueError):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError):
        paired_bootstrap([], [])


def test_paired_bootstrap_all_b_better():
    low, high = paired_bootstrap([0] * 50, [1] * 50)
    assert math.isclose(low, 1.0) and math.isclose(high, 1.0)
