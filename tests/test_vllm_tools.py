"""The sibling's tools mode on the real server: vLLM's own ``qwen3_xml`` parser turns a model's native XML calls into
OpenAI ``tool_calls`` that reach our tools, and they score as the completions path scores the same text.

The model is the tiny ``attention`` preset warm-started with ``t2s sft`` in the sibling dialect's native format (the
gold policy's ``submit`` calls as ``<tool_call><function=submit>...`` blocks), so that it writes real native calls.
"""

from __future__ import annotations

import json

import pytest

from tests.vllm_support import HANG_GUARD_S, MODULE_TIMEOUT_S, ROOT, attention_model, environment_kept

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(MODULE_TIMEOUT_S)]

QUESTIONS = 2
EPISODE = ["--dialect", "sibling", "--mode", "withheld", "--max-turns", "1", "--max-tokens-per-turn", "96",
           "--episode-token-budget", "4096", "--temperature", "0", "--quiet"]


def _t2s(*argv: str) -> None:
    """A t2s command in this process (the server, when there is one, runs in its own); what it prints is shown with a
    failure."""
    from t2s.commands import main

    with environment_kept():
        assert main(list(argv)) == 0, f"t2s {argv[0]} failed; its output is above"


@pytest.fixture(scope="module")
def native_model_dir(tmp_path_factory):
    """``t2s sft`` of the attention preset on gold ``submit`` turns in the sibling dialect's native format."""
    folder = tmp_path_factory.mktemp("native")
    base = attention_model(folder)
    recipe = (ROOT / "recipes" / "demo.yaml").read_text(encoding="utf-8")
    keep = [line for line in recipe.splitlines()
            if not line.startswith(("dialect:", "system_prompt_file:", "max_train_rows:", "episode_token_budget:",
                                    "max_tokens_per_turn:", "max_completion_length:", "model_name_or_path:"))]
    keep += [f"model_name_or_path: {base}", "dialect: sibling", "tool_format: native", f"max_train_rows: {QUESTIONS}",
             "episode_token_budget: 2048", "max_tokens_per_turn: 96", "max_completion_length: 2048"]
    rl_recipe = folder / "native.yaml"
    rl_recipe.write_text("\n".join(keep) + "\n", encoding="utf-8")
    out = folder / "sft"
    _t2s("sft", "--config", str(ROOT / "recipes" / "demo_sft.yaml"), "--model_name_or_path", str(base),
         "--rl_recipe", str(rl_recipe), "--near_misses", "0", "--max_steps", "40", "--max_length", "2048",
         "--per_device_train_batch_size", "16", "--output_dir", str(out))
    return out


def _episodes(out) -> dict[str, dict]:
    lines = (out / "withheld" / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    return {e["question_id"]: e for e in map(json.loads, filter(None, lines))}


def _server_turns(url: str, tokenizer, max_tokens: int, n: int, temperature: float) -> list[tuple[str, list]]:
    """(the raw text, the server's tool calls) of every sampled first turn of each question, the raw text decoded
    from the token ids the server returns beside its parsed message."""
    import httpx

    from t2s.data.loaders import load_json_rows
    from t2s.env import protocol, tool_schemas
    from t2s.env.databases import ref_from_row
    from t2s.env.episode import EpisodeConfig
    from t2s.env.schema import get_schema

    config = EpisodeConfig(dialect="sibling", tool_format="native", mode="withheld")
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    out = []
    for row in load_json_rows(ROOT / "data" / "demo" / "dev.json")[:QUESTIONS]:
        messages = protocol.initial_messages(row, config, get_schema(ref_from_row(row)))
        reply = httpx.post(url + "/v1/chat/completions", timeout=HANG_GUARD_S, json={
            "model": model, "messages": messages, "tools": tool_schemas.function_schemas("sibling"), "n": n,
            "max_tokens": max_tokens, "temperature": temperature, "seed": 0, "return_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": True}}).json()
        for choice in reply["choices"]:
            text = tokenizer.decode(choice["token_ids"], skip_special_tokens=False)
            calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in choice["message"].get("tool_calls") or []]
            out.append((text, calls))
    return out


def test_tools_mode_calls_reach_our_tools_and_score_as_completions(vllm_server, native_model_dir, tmp_path):
    """Two properties that hold for any text the model writes, on any machine:
    - the server's ``qwen3_xml`` parser and ``native_calls.parse_turn`` read the same calls from every turn the
      server samples: greedy, and at temperature 1 with token limits that cut turns off inside their calls;
    - the two eval paths play the same episodes: one request at a time and no prefix cache, so the server computes
      each prompt the same way in both, and each question's calls, final SQL and verdict are the same.
    The server is the session's (its flags are the sibling's: ``qwen3_xml``, no prefix cache), holding this model."""
    from transformers import AutoTokenizer

    from t2s.env.native_calls import parse_turn
    from t2s.env.tool_schemas import function_schemas

    tokenizer = AutoTokenizer.from_pretrained(native_model_dir)
    url = vllm_server.hold(native_model_dir)
    sampled = _server_turns(url, tokenizer, 96, 1, 0.0)
    for max_tokens in (12, 24, 40):
        sampled += _server_turns(url, tokenizer, max_tokens, 6, 1.0)
    one_at_a_time = [*EPISODE, "--concurrency", "1"]
    _t2s("eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", "tools", "--data",
         str(ROOT / "data" / "demo"), "--n", str(QUESTIONS), *one_at_a_time, "--output", str(tmp_path / "tools"))
    _t2s("eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", "completions", "--tool-format",
         "native", "--tokenizer", str(native_model_dir), "--data", str(ROOT / "data" / "demo"), "--n",
         str(QUESTIONS), *one_at_a_time, "--output", str(tmp_path / "completions"))
    tools_declared = function_schemas("sibling")
    disagree = [(text, calls) for text, calls in sampled
                if [(c.tool, c.args) for c in parse_turn(text, tools=tools_declared).calls] != calls]
    assert not disagree, f"{len(disagree)} of {len(sampled)} turns read otherwise than the server: {disagree[0]!r}"
    assert any(calls for _, calls in sampled), "the warm-started model wrote no call the server parsed"
    tools, completions = _episodes(tmp_path / "tools"), _episodes(tmp_path / "completions")
    assert set(tools) == set(completions) and len(tools) == QUESTIONS
    for qid, episode in tools.items():
        assert [c["tool"] for c in episode["turns"][0]["calls"]] == [
            c["tool"] for c in completions[qid]["turns"][0]["calls"]], qid
        assert episode["final_sql"] == completions[qid]["final_sql"], qid
        assert episode["official"] == completions[qid]["official"], qid
