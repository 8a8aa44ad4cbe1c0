"""The sibling's tools mode on the real server: vLLM's own ``qwen3_xml`` parser turns a model's native XML calls into
OpenAI ``tool_calls`` that reach our tools, and they score as the completions path scores the same text.

The model is the tiny ``attention`` preset warm-started with ``t2s sft`` in the sibling dialect's native format (the
gold policy's ``submit`` calls as ``<tool_call><function=submit>...`` blocks), so that it writes real native calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.vllm_support import ROOT, VLLM_ENV, attention_model, served

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

QUESTIONS = 2
EPISODE = ["--dialect", "sibling", "--mode", "withheld", "--max-turns", "1", "--max-tokens-per-turn", "96",
           "--episode-token-budget", "4096", "--temperature", "0", "--quiet"]


def _t2s(*argv: str, timeout: int = 400) -> None:
    done = subprocess.run([sys.executable, "-m", "t2s", *argv], cwd=ROOT, env=os.environ | VLLM_ENV,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


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
         "--rl_recipe", str(rl_recipe), "--near_misses", "0", "--max_steps", "150", "--max_length", "2048",
         "--per_device_train_batch_size", "16", "--output_dir", str(out))
    return out


def _episodes(out) -> dict[str, dict]:
    lines = (out / "withheld" / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    return {e["question_id"]: e for e in map(json.loads, filter(None, lines))}


def test_tools_mode_calls_reach_our_tools_and_score_as_completions(native_model_dir, tmp_path):
    with served(native_model_dir, tmp_path / "server.log", "--enable-auto-tool-choice",
                "--tool-call-parser", "qwen3_xml") as url:
        _t2s("eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", "tools", "--data",
             str(ROOT / "data" / "demo"), "--n", str(QUESTIONS), *EPISODE, "--output", str(tmp_path / "tools"))
        _t2s("eval", "--policy", "endpoint", "--endpoint", url, "--endpoint-mode", "completions", "--tool-format",
             "native", "--tokenizer", str(native_model_dir), "--data", str(ROOT / "data" / "demo"), "--n",
             str(QUESTIONS), *EPISODE, "--output", str(tmp_path / "completions"))
    tools, completions = _episodes(tmp_path / "tools"), _episodes(tmp_path / "completions")
    assert set(tools) == set(completions) and len(tools) == QUESTIONS
    submitted = [e for e in tools.values() if e["final_sql_source"] == "submitted"]
    assert submitted, "no tools-mode episode submitted: the parser's tool_calls never reached the submit tool"
    for episode in submitted:
        assert episode["turns"][0]["calls"][0]["tool"] == "submit"
    for qid, episode in tools.items():
        assert episode["final_sql"] == completions[qid]["final_sql"], qid
        assert episode["official"] == completions[qid]["official"], qid
