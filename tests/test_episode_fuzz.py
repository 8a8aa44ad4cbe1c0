"""Property-based: random assistant turns never make the episode raise, and its counters agree with its record."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t2s.episode import COUNTER_KEYS, RECORD_KEYS, Episode, EpisodeConfig

TOOLS = ["list_tables", "describe_table", "foreign_keys", "join_path", "sample_rows", "distinct_values", "run_query",
         "submit_sql", "nope", ""]
SQLS = ["SELECT COUNT(*) FROM t", "SELECT nope FROM t", "DELETE FROM t", "SELECT 1; SELECT 2", "", "SELECT '{\"a\": 1}'",
        "WITH x AS (SELECT 1) SELECT * FROM x"]


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "f.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE TABLE u (t_id INTEGER REFERENCES t(id));")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i % 3}") for i in range(12)])
    conn.commit()
    conn.close()
    return {"question_id": "f", "question": "q?", "evidence": "", "gold_sql": "SELECT 1", "db_id": "f",
            "db_path": str(path), "schema_id": None, "difficulty": None, "source": "fuzz"}


values = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                   st.sampled_from(["t", "u", "T", "x\"; DROP TABLE t; --", "v", "id", "🙂"] + SQLS), st.text(max_size=20))
args = st.one_of(
    st.dictionaries(st.sampled_from(["table_name", "column_name", "table_a", "table_b", "limit", "sql", "extra"]), values,
                    max_size=4),
    values,
)
calls = st.builds(lambda tool, a: json.dumps({"tool": tool, "args": a}), st.sampled_from(TOOLS), args)
pieces = st.one_of(
    calls,
    st.sampled_from(["</think>", "<think>", "```json\n", "```", "\n", "{", "}", '{"tool": "run_query", "args": {"sql": "SEL',
                     "SELECT COUNT(*) FROM t", "<|im_end|>", "I think", "[1, 2]"]),
    st.text(max_size=30),
)
turns = st.lists(st.lists(pieces, max_size=8).map("".join), max_size=10)
steps = st.lists(st.tuples(st.integers(0, 3000), st.booleans(), st.integers(0, 600)), min_size=10, max_size=10)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=turns, steps=steps, max_turns=st.integers(1, 5), calls_per_turn=st.integers(1, 4),
       prompt=st.integers(0, 9000), mode=st.sampled_from(["full", "withheld"]))
def test_random_turns(row, turns, steps, max_turns, calls_per_turn, prompt, mode):
    config = EpisodeConfig(mode=mode, max_turns=max_turns, max_calls_per_turn=calls_per_turn, max_failed_queries=2,
                           episode_token_budget=12288, min_episode_tokens=2048, tool_timeout=1.0)
    episode = Episode(row, config)
    episode.start(prompt)
    observations = 0
    for index in range(max_turns + 3):
        if episode.done or episode.next_max_tokens() == 0:
            break
        text = turns[index] if index < len(turns) else ""
        n_tokens, cut_off, env = steps[index % len(steps)]
        observation = episode.step(text, n_tokens=n_tokens, cut_off=cut_off)
        if observation is None:
            break
        observations += 1
        assert observation.strip()
        episode.add_env_tokens(env)
    record = episode.record()
    c = record["counters"]
    assert tuple(record) == RECORD_KEYS and tuple(c) == COUNTER_KEYS
    assert episode.done
    assert c["turns"] == len(record["turns"]) <= max_turns + 1
    assert c["calls"] == sum(len(t["calls"]) for t in record["turns"])
    assert c["tool_errors"] <= c["calls"]
    assert all(len(t["calls"]) <= calls_per_turn for t in record["turns"])
    assert observations == sum(1 for t in record["turns"] if t["observation"])
    assert c["format_deviations"] >= 0 and c["turn_cutoffs"] <= c["turns"]
    assert record["final_sql_source"] in ("submitted", "forced", "fallback", "none")
    assert (record["final_sql"] is None) == (record["final_sql_source"] == "none")
    assert c["fallback_used"] == (record["final_sql_source"] == "fallback")
    assert c["submitted"] == (record["submitted_sql"] is not None)
    if c["submitted"]:
        assert record["turns"][-1]["calls"][-1]["tool"] == "submit_sql"
    if record["final_sql_source"] == "forced":
        assert c["forced"]
    json.dumps(record)
