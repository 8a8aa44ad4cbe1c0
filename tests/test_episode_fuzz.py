"""Random and hostile assistant turns never make the episode raise, and its counters agree with its record.

Hostile turns: JSON nested past Python's recursion limit, numbers too long to read, lone surrogates (escaped in JSON
strings and raw in the text) and megabyte turns. Each is a format deviation or a tool error, and the episode goes on.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t2s.backends.scripted import ReplayPolicy
from t2s.env.episode import COUNTER_KEYS, RECORD_KEYS, Episode, EpisodeConfig
from t2s.rollout.text_policy import play
from t2s.env.tools import Toolbox

TOOLS = ["list_tables", "describe_table", "foreign_keys", "join_path", "sample_rows", "distinct_values", "run_query",
         "submit_sql", "nope", ""]
SQLS = ["SELECT COUNT(*) FROM t", "SELECT nope FROM t", "DELETE FROM t", "SELECT 1; SELECT 2", "",
        "SELECT '{\"a\": 1}'", "WITH x AS (SELECT 1) SELECT * FROM x"]


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "f.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); "
                       "CREATE TABLE u (t_id INTEGER REFERENCES t(id));")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i % 3}") for i in range(12)])
    conn.commit()
    conn.close()
    return {"question_id": "f", "question": "q?", "evidence": "", "gold_sql": "SELECT 1", "db_id": "f",
            "db_path": str(path), "schema_id": None, "difficulty": None, "source": "fuzz"}


values = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                   st.sampled_from(["t", "u", "T", "x\"; DROP TABLE t; --", "v", "id", "🙂"] + SQLS),
                   st.text(max_size=20))
args = st.one_of(
    st.dictionaries(st.sampled_from(["table_name", "column_name", "table_a", "table_b", "limit", "sql", "extra"]),
                    values, max_size=4),
    values,
)
calls = st.builds(lambda tool, a: json.dumps({"tool": tool, "args": a}), st.sampled_from(TOOLS), args)
pieces = st.one_of(
    calls,
    st.sampled_from(["</think>", "<think>", "```json\n", "```", "\n", "{", "}",
                     '{"tool": "run_query", "args": {"sql": "SEL', "SELECT COUNT(*) FROM t", "<|im_end|>", "I think",
                     "[1, 2]"]),
    st.sampled_from(["[" * 1500, '{"a": ' * 1500, '{"tool": "run_query", "args": {"sql": ' + "[" * 1500, "9" * 5000,
                     "1e999999", '"\\ud800"', "\ud800", "\udfff",
                     '{"tool": "describe_table", "args": {"table_name": "\\udc00"}}',
                     '{"tool": "run_query", "args": {"sql": "SELECT \'\\ud83d\'"}}']),  # hostile pieces
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
    record = episode.record().to_json()
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
    json.dumps(record, ensure_ascii=False).encode("utf-8")  # the record can be written as it is


def tool_call(tool: str, **args) -> str:
    return "thinking\n</think>\n" + json.dumps({"tool": tool, "args": args})


HOSTILE = {
    "arrays nested 1,500 deep": '</think>\n{"tool": "run_query", "args": {"sql": ' + "[" * 1500 + "]" * 1500 + "}}",
    "arrays nested 1,500 deep after prose": "</think> Let me look. " + '{"tool": "run_query", "args": ' + "[" * 1500,
    "objects nested 1,500 deep": "</think>\n" + '{"a": ' * 1500 + "1" + "}" * 1500,
    "args nested 40 deep": tool_call("run_query", sql=json.loads("[" * 40 + "]" * 40)),
    "args as a JSON string nested 3,000 deep": "</think>" + json.dumps({"tool": "run_query", "args": "[" * 3000}),
    "a number of 5,000 digits": ("</think>" + '{"tool": "sample_rows", "args": {"table_name": "t", "limit": '
                                 + "9" * 5000 + "}}"),
    "a number of 4,000 digits": ("</think>" + '{"tool": "sample_rows", "args": {"table_name": "t", "limit": '
                                 + "9" * 4000 + "}}"),
    "an infinite number": "</think>" + '{"tool": "sample_rows", "args": {"table_name": "t", "limit": 1e999999}}',
    "an escaped lone surrogate": "</think>" + '{"tool": "run_query", "args": {"sql": "SELECT \'\\ud800\'"}}',
    "an escaped lone surrogate in a name": "</think>" + '{"tool": "describe_table", "args": {"table_name": "\\udfff"}}',
    "a raw lone surrogate": "\ud800</think>\ud800" + '{"tool": "run_query", "args": {"sql": "SELECT \'\udc00\'"}}',
    "a megabyte of brackets": "</think>" + "[" * 1_000_000,
    "a megabyte of calls": "x" * 500_000 + "</think>" + tool_call("list_tables") * 10_000,
    "a megabyte of escaped surrogates": "</think>" + '{"tool": "run_query", "args": {"sql": "' + "\\ud800" * 170_000
                                        + '"}}',
}

READABLE = {"a number of 4,000 digits", "an escaped lone surrogate", "a raw lone surrogate", "a megabyte of brackets"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize("counted", [False, True], ids=["characters", "tokens"])
def test_hostile_turns_never_stop_the_episode(row, tiny_tokenizer, case, counted):
    """The hostile turn is a deviation or a tool error; the next turn submits, as it would have anyway."""
    submit = tool_call("submit_sql", sql="SELECT COUNT(*) FROM t")
    config = EpisodeConfig(max_turns=3, max_tokens_per_turn=1_000_000 if counted else 2048,
                           episode_token_budget=2_000_000 if counted else 12288)
    episode = play(Episode(row, config), ReplayPolicy([HOSTILE[case], submit]), tiny_tokenizer if counted else None)
    record = episode.record().to_json()
    c = record["counters"]
    assert record["final_sql_source"] == "submitted" and record["final_sql"] == "SELECT COUNT(*) FROM t"
    assert c["turns"] == 2 and c["calls"] == len(record["turns"][0]["calls"]) + 1
    if case not in READABLE:  # the hostile turn is noted as a deviation or a tool error
        assert c["format_deviations"] + c["tool_errors"] >= 1
    first = record["turns"][0]
    assert first["observation"].startswith(("Error:", "[")) and "tool turns left" in first["observation"]
    json.dumps(record, ensure_ascii=False).encode("utf-8")


def test_an_environment_failure_is_a_tool_error_and_the_episode_goes_on(row, monkeypatch):
    real_call = Toolbox.call

    def failing_once(self, tool, args, **kwargs):
        if tool == "list_tables":
            raise RecursionError("maximum recursion depth exceeded")
        return real_call(self, tool, args, **kwargs)

    monkeypatch.setattr(Toolbox, "call", failing_once)
    turns = [tool_call("list_tables"), tool_call("run_query", sql="SELECT 1"), tool_call("submit_sql", sql="SELECT 2")]
    record = play(Episode(row, EpisodeConfig(max_turns=4)), ReplayPolicy(turns)).record().to_json()
    assert [t["observation"].splitlines()[0] for t in record["turns"][:2]] == [
        "Error: the environment failed on this turn (RecursionError); nothing of it ran.", "[run_query: SELECT 1]"]
    assert record["counters"]["tool_errors"] == 1 and record["final_sql"] == "SELECT 2"
    # on the last tool turn the failure ends the episode, with the usual final-SQL rule
    record = play(Episode(row, EpisodeConfig(max_turns=2)), ReplayPolicy([turns[1], turns[0]])).record().to_json()
    assert record["counters"]["tool_errors"] == 1 and record["final_sql"] == "SELECT 1"
    assert record["final_sql_source"] == "fallback" and record["turns"][-1]["observation"] == ""
