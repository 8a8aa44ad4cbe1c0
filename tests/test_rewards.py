"""The dense reward (tiers, F1, join, consensus), the sibling reward, and the TRL reward functions, on real SQLite."""

from __future__ import annotations

import dataclasses
import pickle
import sqlite3
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2s.env import databases
from t2s.env.databases import limits
from t2s.scoring import metrics
from t2s.scoring.rewards import (
    MAX_F1_CELLS,
    REWARD_FUNCS,
    ExecutionOutcome,
    RewardSettings,
    _cells,
    cell_f1,
    dense_rewards,
    execute_final,
    make_dense_reward,
    normalise_cell,
    parses_as_sql,
    result_signature,
    sibling_rewards,
)


@pytest.fixture(scope="module")
def hero_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "heroes.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE team (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE hero (id INTEGER PRIMARY KEY, name TEXT, height REAL, team_id INTEGER REFERENCES team(id));
        CREATE TABLE odd (v);
        INSERT INTO team VALUES (1, 'red'), (2, 'blue');
        INSERT INTO hero VALUES (1, 'Ann', 1.5, 1), (2, 'Bob', 1.75, 1), (3, 'Cy', NULL, 2), (4, 'Di', 2.0, NULL);
        INSERT INTO odd VALUES (NULL), (1), (1.0), ('1'), (X'00ff'), (2.5), (2.5);
        """
    )
    conn.commit()
    conn.close()
    return str(path)


def _row(db_path, gold_sql, question_id="q1"):
    return {"question_id": question_id, "question": "?", "evidence": "", "gold_sql": gold_sql, "db_id": "heroes",
            "db_path": db_path, "schema_id": None, "difficulty": "simple", "source": "test"}


def _one(outcome, **kw):
    return dense_rewards([outcome], 1, **kw)[0]


# ------------------------------------------------------------------------------------------------ tiers


def test_equivalent_scores_three_regardless_of_row_order(hero_db):
    row = _row(hero_db, "SELECT name FROM hero ORDER BY name")
    outcome = execute_final(row, "SELECT name FROM hero ORDER BY name DESC")
    assert outcome.executes and outcome.equivalent and outcome.parses
    b = _one(outcome)
    assert (b.reward, b.tier) == (3.0, "equivalent")


def test_executable_reward_is_floor_plus_weighted_f1(hero_db):
    row = _row(hero_db, "SELECT name FROM hero WHERE team_id = 1")  # Ann, Bob
    outcome = execute_final(row, "SELECT name FROM hero")  # Ann, Bob, Cy, Di
    assert outcome.executes and not outcome.equivalent
    assert outcome.f1 == pytest.approx(2 * 2 / (4 + 2))
    assert not outcome.join  # gold reads one table
    b = _one(outcome)
    assert b.tier == "executable"
    assert b.reward == pytest.approx(0.1 + 0.9 * outcome.f1)


def test_join_needs_gold_with_two_tables_and_the_same_set(hero_db):
    gold = "SELECT h.name, t.name FROM hero AS h JOIN team AS t ON h.team_id = t.id"
    row = _row(hero_db, gold)
    same_tables = execute_final(row, "SELECT t.name FROM team t JOIN hero h ON h.team_id = t.id WHERE h.id = 1")
    assert same_tables.join and not same_tables.equivalent
    fewer = execute_final(row, "SELECT name FROM hero")
    assert not fewer.join
    subquery = execute_final(row, "SELECT name FROM hero WHERE team_id IN (SELECT id FROM TEAM)")
    assert subquery.join  # subquery tables count, case ignored
    b = _one(same_tables)
    assert b.join == 1 and b.reward == pytest.approx(0.1 + 0.9 * same_tables.f1 + 0.1)


def test_parsable_but_failing_sql_gets_the_parse_credit(hero_db):
    row = _row(hero_db, "SELECT name FROM hero")
    outcome = execute_final(row, "SELECT nope FROM hero")
    assert outcome.parses and not outcome.executes and outcome.error.startswith("Error:")
    assert (_one(outcome).reward, _one(outcome).tier) == (0.05, "parsable")


@pytest.mark.parametrize("sql", [None, "", "   ", "hello world", "SELEC name FROM hero", "SELECT * FROM", 42])
def test_invalid_sql_scores_zero(hero_db, sql):
    outcome = execute_final(_row(hero_db, "SELECT name FROM hero"), sql)
    assert not outcome.parses and not outcome.executes
    assert (_one(outcome).reward, _one(outcome).tier) == (0.0, "invalid")


def test_sql_longer_than_any_engine_runs_is_refused_before_sqlglot_reads_it(hero_db, monkeypatch):
    import sqlglot

    def no_parse(*args, **kwargs):
        raise AssertionError("sqlglot read the over-long SQL")

    longest = limits.LIMITS.max_sql_length
    too_long = "SELECT " + " + ".join(["1"] * longest)  # a valid statement, several times the limit
    monkeypatch.setattr(sqlglot, "parse", no_parse)
    outcome = execute_final(_row(hero_db, "SELECT name FROM hero"), too_long)
    assert not outcome.parses and not outcome.executes and outcome.error == \
        f"Error: the SQL is longer than {longest} characters"
    assert (_one(outcome).reward, _one(outcome).tier) == (0.0, "invalid")


def test_parses_as_sql_accepts_statements_only():
    assert parses_as_sql("SELECT 1")
    assert parses_as_sql("WITH a AS (SELECT 1) SELECT * FROM a")
    assert parses_as_sql("DROP TABLE hero")
    assert not parses_as_sql("hello world")  # a bare expression, not a statement
    assert not parses_as_sql(";")
    assert not parses_as_sql("The answer is 5")


def test_timeout_is_parsable_tier(hero_db, monkeypatch):
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, scoring_min_timeout=0.2,
                                                              scoring_max_timeout=0.2))
    row = _row(hero_db, "SELECT count(*) FROM hero")
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    outcome = execute_final(row, slow)
    assert outcome.timed_out and not outcome.executes and outcome.parses
    assert _one(outcome).tier == "parsable"


def test_over_cap_is_never_equivalent(hero_db, monkeypatch):
    row = _row(hero_db, "SELECT name FROM team")
    execute_final(row, "SELECT 1")  # warm the gold cache under the normal cap
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, scoring_max_cells=5))
    # the same set of rows as gold, repeated past the cap
    sql = "SELECT t.name FROM team t, hero, hero AS h2"
    outcome = execute_final(row, sql)
    assert outcome.over_cap and not outcome.equivalent and outcome.f1 == 0.0
    b = _one(outcome)
    assert b.tier != "equivalent" and b.reward < 3.0
    # it ran: the reward's executable tier and eval's executes say so alike, and eval scores it 0 with the reason
    from t2s.env.record import one_turn_record
    from t2s.evaluation.records import eval_line

    scores = metrics.score_sql(databases.ref_from_row(row), sql, row["gold_sql"])
    line = eval_line(row, one_turn_record(row, "full", sql, sql), scores, 0)
    assert outcome.executes and b.tier == "executable" and line["executes"] is True
    assert line["official"] == 0 and "over the scoring cap" in line["error"]


def test_gold_failure_is_never_equivalent(hero_db):
    row = _row(hero_db, "SELECT missing_column FROM hero")
    outcome = execute_final(row, "SELECT missing_column FROM hero")
    assert outcome.gold_error and not outcome.equivalent and outcome.f1 == 0.0
    assert _one(outcome).reward < 3.0


def test_write_attempt_is_recorded_and_the_sibling_reward_punishes_it(hero_db):
    row = _row(hero_db, "SELECT name FROM hero")
    write = execute_final(row, "DELETE FROM hero")
    assert write.write_attempt and not write.executes
    right = execute_final(row, "SELECT name FROM hero")
    right_after_write = execute_final(row, "SELECT name FROM hero", episode_write_attempt=True)
    wrong = execute_final(row, "SELECT name FROM team")
    broken = execute_final(row, "SELECT nope FROM hero")
    assert sibling_rewards([right, wrong, broken, write, right_after_write]) == [1.0, 0.1, 0.0, -1.0, -1.0]
    with sqlite3.connect(hero_db) as conn:
        assert conn.execute("SELECT count(*) FROM hero").fetchone() == (4,)


def test_outcome_is_picklable_and_round_trips_through_asdict(hero_db):
    outcome = execute_final(_row(hero_db, "SELECT name FROM hero"), "SELECT name FROM hero WHERE id < 3")
    assert pickle.loads(pickle.dumps(outcome)) == outcome
    assert ExecutionOutcome.from_any(dataclasses.asdict(outcome)) == outcome


# ------------------------------------------------------------------------------------------------ F1 normalisation


def test_cell_normalisation():
    assert normalise_cell(1.0) == 1 and isinstance(normalise_cell(1.0), int)
    assert normalise_cell(0.1 + 0.2) == 0.3
    assert normalise_cell("12") == "12" and normalise_cell(None) is None and normalise_cell(b"\x00") == b"\x00"


def test_cell_f1_values():
    assert cell_f1(_cells([(1,), (2.0,)]), _cells([(1.0,), (2,)])) == 1.0
    assert cell_f1(_cells([("12",)]), _cells([(12,)])) == 0.0  # text is not a number
    assert cell_f1(_cells([(None,)]), _cells([(None,)])) == 1.0  # NULL equals NULL
    assert cell_f1(_cells([(0.1 + 0.2,)]), _cells([(0.3,)])) == 1.0  # rounded to 6 places
    assert cell_f1(_cells([(0.3000001,)]), _cells([(0.3,)])) == 1.0
    assert cell_f1(_cells([(0.300001,)]), _cells([(0.3,)])) == 0.0
    assert cell_f1(_cells([]), _cells([(1,)])) == 0.0 and cell_f1(_cells([(1,)]), _cells([])) == 0.0
    # multisets: duplicates count, Counter intersection
    assert cell_f1(_cells([(1,), (1,), (1,)]), _cells([(1,)])) == pytest.approx(2 * 1 / 4)
    assert cell_f1(_cells([(b"x", "x")]), _cells([(b"x", "y")])) == pytest.approx(0.5)


def test_cell_multiset_is_capped():
    rows = [(i, i) for i in range(MAX_F1_CELLS)]  # twice the cap
    assert sum(_cells(rows).values()) == MAX_F1_CELLS


def test_mixed_types_and_duplicates_from_sqlite(hero_db):
    row = _row(hero_db, "SELECT v FROM odd")  # NULL, 1, 1.0, '1', blob, 2.5, 2.5
    same = execute_final(row, "SELECT v FROM odd ORDER BY rowid DESC")
    assert same.equivalent and same.f1 == 1.0
    distinct = execute_final(row, "SELECT DISTINCT v FROM odd")  # 1 and 1.0 are one value to DISTINCT too
    assert distinct.equivalent  # set semantics: duplicates do not matter
    assert distinct.f1 < 1.0  # the multiset F1 sees the missing duplicates
    text_only = execute_final(row, "SELECT v FROM odd WHERE typeof(v) = 'text'")
    assert not text_only.equivalent and text_only.f1 == pytest.approx(2 * 1 / (1 + 7))


def test_signature_ignores_row_order_but_not_multiplicity():
    assert result_signature([(1, "a"), (2.0, None)]) == result_signature([(2, None), (1, "a")])
    assert result_signature([(1,)]) != result_signature([(1,), (1,)])
    assert result_signature([("1",)]) != result_signature([(1,)])


# ------------------------------------------------------------------------------------------------ consensus


def _executed(signature, f1=0.5, reads=True, non_empty=True, equivalent=False):
    return ExecutionOutcome(parses=True, executes=True, signature=signature, f1=f1, reads_tables=reads,
                            non_empty=non_empty, equivalent=equivalent)


def test_consensus_for_the_most_frequent_shared_result():
    group = [_executed("A"), _executed("A"), _executed("B"), ExecutionOutcome(parses=True)]
    rewards = dense_rewards(group, 4)
    assert [b.consensus for b in rewards] == [1, 1, 0, 0]
    assert rewards[0].reward == pytest.approx(0.1 + 0.45 + 0.1)


def test_consensus_ties_and_singletons_give_nothing():
    assert [b.consensus for b in dense_rewards([_executed("A"), _executed("A"), _executed("B"), _executed("B")], 4)] \
        == [0, 0, 0, 0]
    assert [b.consensus for b in dense_rewards([_executed("A"), _executed("B")], 2)] == [0, 0]


def test_consensus_needs_f1_tables_and_rows():
    assert {b.consensus for b in dense_rewards([_executed("A", f1=0.0)] * 3, 3)} == {0}
    assert {b.consensus for b in dense_rewards([_executed("A", reads=False)] * 3, 3)} == {0}
    assert {b.consensus for b in dense_rewards([_executed(None, non_empty=False)] * 3, 3)} == {0}


def test_consensus_is_per_group():
    outcomes = [_executed("A"), _executed("A"), _executed("A"), _executed("B")]
    assert [b.consensus for b in dense_rewards(outcomes, 2)] == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        dense_rewards(outcomes, 3)


def test_constant_queries_get_no_consensus_bonus(hero_db):
    # gold contains the value 1, so SELECT 1 has F1 > 0, but it reads no table
    row = _row(hero_db, "SELECT id FROM hero WHERE id <= 2")
    group = [execute_final(row, sql) for sql in ("SELECT 1", "SELECT 1", "select 1", "SELECT 1 AS id")]
    assert all(o.executes and o.f1 > 0 and not o.reads_tables for o in group)
    rewards = dense_rewards(group, 4)
    assert {b.consensus for b in rewards} == {0}
    assert {round(b.reward, 6) for b in rewards} == {round(0.1 + 0.9 * group[0].f1, 6)}


def test_tool_side_temp_view_and_pragma_cannot_change_a_later_gold_result(hero_db):
    ref = databases.benchmark_db(hero_db, "heroes")
    gold_sql = "SELECT name FROM hero WHERE id = 1 /* fresh */"
    attacks = [
        "CREATE TEMP VIEW hero AS SELECT 'X' AS name, 1 AS id",
        "PRAGMA query_only = OFF",
        "PRAGMA temp_store = MEMORY",
        "CREATE TEMP TABLE hero (id, name)",
    ]
    for sql in attacks:
        result = databases.run_tool_query(ref, sql, max_rows=10)
        assert result.error is not None
    after_tools = databases.run_tool_query(ref, gold_sql, max_rows=10)
    assert after_tools.rows == [("Ann",)]
    assert databases.gold_result(ref, gold_sql).rows == [("Ann",)]
    outcome = execute_final(_row(hero_db, gold_sql), "SELECT name FROM hero WHERE name = 'Ann'")
    assert outcome.equivalent


# ------------------------------------------------------------------------------------------------ tier properties


outcomes = st.builds(
    ExecutionOutcome,
    parses=st.booleans(),
    executes=st.booleans(),
    equivalent=st.booleans(),
    f1=st.floats(0.0, 1.0),
    join=st.booleans(),
    signature=st.sampled_from([None, "A", "B"]),
    reads_tables=st.booleans(),
    non_empty=st.booleans(),
    over_cap=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(outcomes, min_size=1, max_size=8))
def test_tiers_are_strictly_ordered(items):
    for o, b in zip(items, dense_rewards(items, len(items))):
        if b.reward == 3.0:
            assert o.equivalent and o.executes and not o.over_cap
        if not (o.equivalent and o.executes and not o.over_cap):
            assert b.reward <= 1.3 + 1e-9
        if o.executes and b.tier == "executable":
            assert 0.1 <= b.reward <= 1.3 + 1e-9
        elif not o.executes and o.parses:
            assert b.reward == 0.05
        elif not o.executes:
            assert b.reward == 0.0
    executable = [b.reward for b in dense_rewards(items, len(items)) if b.tier == "executable"]
    parsable = [b.reward for b in dense_rewards(items, len(items)) if b.tier == "parsable"]
    invalid = [b.reward for b in dense_rewards(items, len(items)) if b.tier == "invalid"]
    assert all(e > p for e in executable for p in parsable)
    assert all(p > i for p in parsable for i in invalid)
    assert all(e > i for e in executable for i in invalid)


def test_fallback_scale_discounts_fallback_episodes():
    items = [_executed("A", equivalent=True), _executed("A", equivalent=True)]
    scaled = dense_rewards(items, 2, fallback=[False, True], settings=RewardSettings(fallback_reward_scale=0.5))
    assert [b.reward for b in scaled] == [3.0, 1.5] and [b.fallback for b in scaled] == [False, True]


# ------------------------------------------------------------------------------------------------ TRL functions


def test_dense_trl_function_reads_extras_and_logs_components():
    logged = Counter()

    def log_metric(name, value):
        logged[name] = value

    group = [_executed("A"), _executed("A"), _executed("B"), ExecutionOutcome(parses=True)]
    extras = [dataclasses.asdict(o) | {"question_id": "q7"} for o in group]
    rewards = REWARD_FUNCS["dense"](["p"] * 4, ["c"] * 4, completion_ids=[[1] * 10, [1] * 20, [1] * 30, [1] * 5],
                                    outcome=extras, final_sql_source=["submitted"] * 4, log_metric=log_metric)
    assert rewards == pytest.approx([0.65, 0.65, 0.55, 0.05])
    assert logged["rewards/dense/consensus"] == pytest.approx(0.5)
    assert logged["tier/executable"] == pytest.approx(0.75) and logged["tier/parsable"] == pytest.approx(0.25)
    assert logged["tier/executable/length"] == pytest.approx(20)
    assert REWARD_FUNCS["dense"].__name__ == "dense"


def test_dense_trl_function_groups_by_group_id_and_scales_fallback():
    fn = make_dense_reward(RewardSettings(fallback_reward_scale=0.0))
    group = [_executed("A"), _executed("A"), _executed("A"), _executed("B")]
    rewards = fn(None, None, outcome=group, group_id=[0, 1, 0, 1], final_sql_source=["fallback", "submitted",
                                                                                     "forced", "submitted"])
    assert rewards == pytest.approx([0.0, 0.55, 0.65, 0.55])


def test_sibling_trl_function():
    items = [dataclasses.asdict(o) for o in (_executed("A", equivalent=True), _executed("B"),
                                             ExecutionOutcome(parses=True, write_attempt=True))]
    assert REWARD_FUNCS["sibling"](None, None, outcome=items) == [1.0, 0.1, -1.0]


def test_gold_features_are_computed_once_per_question(hero_db, monkeypatch):
    calls = []
    real = databases.gold_result

    def counting(ref, sql):
        calls.append(sql)
        return real(ref, sql)

    monkeypatch.setattr(databases, "gold_result", counting)
    row = _row(hero_db, "SELECT name FROM hero WHERE id = 2 /* once */")
    first = [execute_final(row, sql) for sql in ("SELECT 'Bob'", "SELECT name FROM hero", "SELECT name FROM hero")]
    assert calls == ["SELECT name FROM hero WHERE id = 2 /* once */"]
    assert first[1] == first[2] and not first[1].equivalent
