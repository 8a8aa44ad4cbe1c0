"""`ask --model / --endpoint`: model-backed episodes through the rollout code, on a user's file opened mode=ro."""

from __future__ import annotations

import json
import sqlite3

import pytest

from t2s.env import databases
from t2s.commands import main
from t2s.commands.ask import RECORD_EXTRA_KEYS
from t2s.env.episode import RECORD_KEYS
from tests.fake_vllm import FakeVLLMServer, ScriptedAgent, refused_url
from tests.test_ask import wal_db as wal_db_with_connection  # noqa: F401 - a fixture
from tests.test_evaluate import ChatFake, chat_answer

DOGS = "SELECT name FROM pets WHERE kind = 'dog' ORDER BY name"


@pytest.fixture()
def wal_db(wal_db_with_connection):  # noqa: F811 - the fixture imported above, taken by name
    """A WAL-mode user file whose last write is not checkpointed (``immutable`` would miss it)."""
    return wal_db_with_connection[0]


def agent_turns():
    return [
        "I should look at the pets first.\n</think>\n\n" + json.dumps({"tool": "run_query", "args": {"sql": DOGS}}),
        "Two dogs.\n</think>\n\n" + json.dumps({"tool": "submit_sql", "args": {"sql": DOGS}}),
    ]


def test_ask_endpoint_completions_json(wal_db, tiny_model_dir, tiny_tokenizer, capsys):
    before = databases.file_checksum(wal_db)
    with FakeVLLMServer(ScriptedAgent(tiny_tokenizer, agent_turns())) as server:
        code = main(["ask", "--db", str(wal_db), "--endpoint", server.base_url, "--tokenizer", str(tiny_model_dir),
                     "--json", "Which pets are dogs?"])
        body = server.requests[0]
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert tuple(record) == RECORD_KEYS + RECORD_EXTRA_KEYS and record["question"] == "Which pets are dogs?"
    assert record["final_sql"] == DOGS and record["final_sql_source"] == "submitted"
    assert "Fido" in record["turns"][0]["observation"] and "Rex" in record["turns"][0]["observation"]
    assert record["counters"]["turns"] == 2 and record["counters"]["submitted"] is True
    assert isinstance(body["prompt"][0], int) and body["return_token_ids"] is True
    assert "Which pets are dogs?" in tiny_tokenizer.decode(body["prompt"])
    assert databases.file_checksum(wal_db) == before


def test_ask_endpoint_shows_the_trajectory_as_it_happens(wal_db, tiny_model_dir, tiny_tokenizer, capsys):
    with FakeVLLMServer(ScriptedAgent(tiny_tokenizer, agent_turns())) as server:
        code = main(["ask", "--db", str(wal_db), "--endpoint", server.base_url, "--tokenizer", str(tiny_model_dir),
                     "Which pets are dogs?"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("question ask  db pets  mode full\nWhich pets are dogs?\n")  # echoed before the episode
    assert out.count("Which pets are dogs?") == 1
    assert out.count("I should look at the pets first.") == 1  # shown live, not repeated at the end
    assert out.index("run_query") < out.index("observation") < out.index("submit_sql") < out.index("final SQL")
    assert "Fido" in out[out.index("final SQL"):]  # the final SQL's result table


def test_ask_chat_endpoint(wal_db, capsys):
    turns = iter(agent_turns())

    def respond(body):
        thinking, _, content = next(turns).partition("\n</think>\n\n")
        return chat_answer(content, reasoning=thinking)

    with ChatFake(respond) as fake:
        code = main(["ask", "--db", str(wal_db), "--endpoint", fake.url, "--endpoint-mode", "chat", "--json",
                     "--evidence", "dog refers to kind = 'dog'", "Which pets are dogs?"])
        first = fake.requests[0]
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["final_sql"] == DOGS
    assert "dog refers to kind = 'dog'" in first["messages"][1]["content"]
    assert first["chat_template_kwargs"] == {"enable_thinking": True}


def test_ask_model_tiny(wal_db, tiny_model_dir, capsys):
    code = main(["ask", "--db", str(wal_db), "--model", str(tiny_model_dir), "--max-turns", "1",
                 "--max-tokens-per-turn", "16", "--seed", "0", "--json", "How many cats?"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and tuple(record) == RECORD_KEYS + RECORD_EXTRA_KEYS
    assert 1 <= record["counters"]["turns"] <= 2 and record["mode"] == "full"


def test_ask_endpoint_errors(wal_db, tiny_model_dir, capsys):
    code = main(["ask", "--db", str(wal_db), "--endpoint", refused_url(), "--retries", "1", "--backoff", "0.01",
                 "--tokenizer", str(tiny_model_dir), "Which pets are dogs?"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("Error:") and "failed after 2 attempt(s)" in err[-1]  # bad input: 1
    with FakeVLLMServer(lambda prompt, max_tokens: []) as server:  # served name is not a loadable tokenizer
        code = main(["ask", "--db", str(wal_db), "--endpoint", server.base_url, "Which pets are dogs?"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("Error: cannot load the tokenizer 'fake-model'")
    code = main(["ask", "--db", str(wal_db), "--endpoint", "http://127.0.0.1:1", "--model", str(tiny_model_dir), "q?"])
    assert code == 2 and "choose one policy" in capsys.readouterr().err


def test_rollout_episodes_open_the_user_file_mode_ro(tmp_path, tiny_tokenizer):
    from t2s.rollout import driver as rollout
    from t2s.commands.ask import ask_row
    from t2s.env.episode import EpisodeConfig

    path = tmp_path / "plain.sqlite"  # not WAL: a benchmark opening would be immutable
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    db = databases.user_db(path)
    row = ask_row("q?", "", db)
    assert databases.ref_from_row(row).immutable is True  # what the rollout would use without ``db``
    for given in (db, lambda r: db):
        backend = type("Backend", (), {"stop_token_ids": [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")]})()
        run = rollout._Run(0, row, rollout.Rollout(backend, tiny_tokenizer, EpisodeConfig(), db=given))
        run.open()
        assert run.episode.db == db and run.episode.db.immutable is False


def test_ask_on_a_schema_that_leaves_no_turn_says_why(tmp_path, tiny_model_dir, capsys):
    """A full-mode prompt whose schema leaves less than min_episode_tokens of the budget plays no turn: ask says so
    in one line, with the prompt's length, the budget and min_episode_tokens, and exits 1."""
    import sqlite3

    path = tmp_path / "wide.sqlite"
    with sqlite3.connect(path) as conn:
        for t in range(120):
            columns = ", ".join(f"measurement_column_{c}_of_table_{t} REAL" for c in range(12))
            conn.execute(f"CREATE TABLE wide_table_{t} (id INTEGER PRIMARY KEY, {columns})")
    code = main(["ask", "--db", str(path), "--model", str(tiny_model_dir), "--max-tokens-per-turn", "16",
                 "How wide is it?"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("Error: the episode ended before its first turn: its prompt of ")
    assert "less than min_episode_tokens (2048) of the episode token budget (12288)" in err[-1]
    tokens = int(err[-1].split("its prompt of ")[1].split(" tokens")[0])
    assert 12288 - tokens < 2048
