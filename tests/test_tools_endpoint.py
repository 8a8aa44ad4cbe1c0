"""``--endpoint-mode tools`` against a loopback server speaking OpenAI's / vLLM's function-calling wire format
(``tests/fake_vllm.py``): tools declared, parallel calls, a reply with no call, arguments that are not JSON, an
unknown tool, the forced final turn, and the gold SQL submitted through ``submit`` scoring 1.0."""

from __future__ import annotations

import json

import pytest

from t2s.backends.base import SamplingSettings
from t2s.backends.chat_endpoint import ChatEndpointClient
from t2s.backends.tools_endpoint import ToolsEndpointPolicy
from t2s.env.episode import Episode, EpisodeConfig
from t2s.rollout.text_policy import play
from t2s.env.native_calls import NOT_RUN
from tests.fake_vllm import FakeVLLMServer


def call(index: int, name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": text}}


def turn_number(body: dict) -> int:
    return sum(m["role"] == "assistant" for m in body["messages"])


def gold_replies(gold_by_question: dict[str, str]):
    """Parallel inspect_schema + run_sql of the gold SQL, then submit of the gold SQL."""

    def reply(body):
        question = body["messages"][1]["content"].split("\n")[0].removeprefix("Question: ")
        gold = gold_by_question[question]
        if turn_number(body) == 0:
            return {"content": "", "reasoning_content": "Look, then test.",
                    "tool_calls": [call(0, "inspect_schema", {}), call(1, "run_sql", {"sql": gold})]}
        return {"content": None, "reasoning_content": "It works.", "tool_calls": [call(2, "submit", {"sql": gold})]}

    return reply


@pytest.mark.timeout(300)
def test_eval_tools_mode_submits_gold_and_scores_one(demo_dir, tmp_path):
    from t2s.evaluation.runner import evaluate
    from t2s.commands.eval import eval_config

    gold = {r["question"]: r["SQL"] for r in json.loads((demo_dir / "dev.json").read_text())}
    with FakeVLLMServer(None, chat_reply=gold_replies(gold)) as server:
        argv = ["--policy", "endpoint", "--endpoint", server.base_url, "--endpoint-mode", "tools",
                "--dialect", "sibling", "--data", str(demo_dir), "--n", "6", "--retries", "0",
                "--output", str(tmp_path / "out"), "--quiet"]
        summary = evaluate(eval_config(argv))["full"]
        requests = list(server.chat_requests)
    assert summary["n"] == 6 and summary["execution_accuracy_official"] == 1.0 and summary["submit_rate"] == 1.0
    assert summary["config"]["endpoint_mode"] == "tools" and summary["config"]["tool_format"] == "native"
    assert summary["config"]["comparable"] is False and summary["config"]["training_token_stream"] is False
    assert len(requests) == 12
    first, second = (r for r in requests if r["messages"][1] == requests[0]["messages"][1])
    assert [t["function"]["name"] for t in first["tools"]] == ["inspect_schema", "sample_rows", "run_sql", "submit"]
    assert first["tools"][1]["function"]["parameters"]["properties"]["limit"]["type"] == "integer"
    assert "Tools:" not in first["messages"][0]["content"]  # the server renders the tool list
    assert first["chat_template_kwargs"] == {"enable_thinking": True}
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant, schema, result = second["messages"][2:5]
    assert [c["id"] for c in assistant["tool_calls"]] == [schema["tool_call_id"], result["tool_call_id"]]
    assert "reasoning_content" not in assistant  # earlier reasoning is not sent back
    assert schema["content"].startswith("CREATE TABLE") and "\n" in result["content"]
    assert second["messages"][5]["content"] == "[5 tool turns left before you must answer]"


def test_malformed_calls_count_as_in_the_json_format(demo_dir):
    """Arguments that are not JSON and an unknown tool are tool errors; a reply with no call gets the error that asks
    for one; on the forced final turn the reply's content is read as bare SQL."""
    from t2s.data.loaders import load_json_rows

    row = load_json_rows(demo_dir / "dev.json")[0]
    replies = [
        {"content": "", "reasoning_content": "a", "tool_calls": [
            call(0, "run_sql", '{"sql": "SELECT 1"'), call(1, "drop_everything", {}),
            call(2, "run_sql", {"sql": "SELECT 7"})]},
        {"content": "I will answer without tools.", "reasoning_content": "b"},
        {"content": "SELECT 7", "reasoning_content": "c"},
    ]
    with FakeVLLMServer(None, chat_reply=lambda body: replies[turn_number(body)]) as server:
        client = ChatEndpointClient(server.base_url, retries=0)
        policy = ToolsEndpointPolicy(client, SamplingSettings.evaluation(seed=0), seed=0)
        config = EpisodeConfig(dialect="sibling", tool_format="native", max_turns=2)
        episode = play(Episode(row, config), policy)
        requests = list(server.chat_requests)
    record = episode.record().to_json()
    counters = record["counters"]
    assert counters["calls"] == 3 and counters["tool_errors"] == 2
    assert counters["format_deviations"] == 1  # bad_json (the reasoning came apart from the content: no deviation)
    first = episode.turns[0]["observation"].messages
    assert "args must be a JSON object" in first[0]["content"]
    assert first[1]["content"].startswith("Error: unknown tool 'drop_everything'")
    assert first[2]["content"].startswith("7")
    assert [c["tool"] for c in record["turns"][0]["calls"]] == ["run_sql", "drop_everything", "run_sql"]
    assert '"arguments": "{\\"sql\\": \\"SELECT 1\\""' in record["turns"][0]["assistant"]  # as the server sent it
    third = requests[2]["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "tool", "tool", "user", "assistant",
                                          "user"]
    assert third[3]["content"] == first[0]["content"]
    assert "Error: no tool call found" in third[-1]["content"] and "exploration budget is spent" in third[-1]["content"]
    assert counters["forced"] and record["final_sql"] == "SELECT 7" and record["final_sql_source"] == "forced"


def test_calls_that_did_not_run_are_still_answered(demo_dir):
    """OpenAI refuses a conversation where a tool call has no answer: calls past max_calls_per_turn get NOT_RUN."""
    from t2s.data.loaders import load_json_rows

    row = load_json_rows(demo_dir / "dev.json")[0]
    many = {"content": "", "tool_calls": [call(i, "run_sql", {"sql": f"SELECT {i}"}) for i in range(3)]}
    replies = [many, {"content": "", "tool_calls": [call(9, "submit", {"sql": "SELECT 2"})]}]
    with FakeVLLMServer(None, chat_reply=lambda body: replies[turn_number(body)]) as server:
        client = ChatEndpointClient(server.base_url, retries=0)
        config = EpisodeConfig(dialect="sibling", tool_format="native", max_calls_per_turn=2)
        record = play(Episode(row, config),
                      ToolsEndpointPolicy(client, SamplingSettings.evaluation())).record().to_json()
        second = server.chat_requests[1]["messages"]
    assert record["final_sql"] == "SELECT 2" and record["final_sql_source"] == "submitted"
    assert [m.get("tool_call_id") for m in second if m["role"] == "tool"] == ["call_0", "call_1", "call_2"]
    assert second[5]["content"] == NOT_RUN


def test_ask_through_a_tools_endpoint(demo_dir, tmp_path, capsys):
    from t2s.commands import main

    db = next((demo_dir / "dev_databases").glob("*/*.sqlite"))
    replies = [{"content": "", "tool_calls": [call(0, "submit", {"sql": "SELECT 1"})]}]
    with FakeVLLMServer(None, chat_reply=lambda body: replies[0]) as server:
        code = main(["ask", "--db", str(db), "How many?", "--endpoint", server.base_url, "--endpoint-mode", "tools",
                     "--dialect", "sibling", "--retries", "0", "--json"])
        body = server.chat_requests[0]
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["final_sql"] == "SELECT 1"
    assert record["turns"][0]["calls"] == [{"tool": "submit", "args": {"sql": "SELECT 1"}}]
    assert [t["function"]["name"] for t in body["tools"]][-1] == "submit"


def test_tools_mode_reads_a_call_as_completions_mode_reads_its_text():
    """The same call, read from a server's tool_calls (tools mode) and from the turn's text (completions mode, as
    vLLM's qwen3_xml parser reads it), gives the same tool name and arguments: a name with spaces around it is an
    unknown tool in both, and arguments nested past MAX_JSON_DEPTH are cut the same way."""
    from t2s.backends.tools_endpoint import read_message
    from t2s.env.native_reader import parse_turn
    from t2s.env.turns import MAX_JSON_DEPTH

    deep = {"sql": "SELECT 1", "x": json.loads("[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5))}
    for name, arguments in ((" submit ", {"sql": "SELECT 1"}), ("submit", deep)):
        parsed, _ = read_message({"content": "", "reasoning_content": "r",
                                  "tool_calls": [call(0, name, arguments)]})
        body = json.dumps({"name": name, "arguments": arguments})
        text = parse_turn(f"r</think>\n<tool_call>\n<function= >{body}</function>\n</tool_call>")
        assert [(c.tool, c.args) for c in parsed.calls] == [(c.tool, c.args) for c in text.calls]
        assert parsed.calls[0].tool == name
