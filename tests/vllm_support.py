"""What the real-vLLM tests share: the environment every vLLM process runs with, the tiny model in the shape vLLM's
CPU backend runs, and the OpenAI server started the way ``make serve`` starts it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
SERVER_MAX_MODEL_LEN = 8192
# Hang guards, not speed targets: a subprocess or server start that takes longer than this has hung. Generous, since
# the suite must pass on one core beside other work (`taskset -c 0`), where a start takes several times as long.
HANG_GUARD_S = 1200
MODULE_TIMEOUT_S = 3600  # pytest-timeout for a whole vLLM test (its fixtures included)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attention_model(folder: Path, noise: float = 0.0) -> Path:
    """The tiny model's ``attention`` preset (full attention, head_dim 32, float32: the shape vLLM's CPU backend runs)
    in ``folder``; with ``noise``, seeded noise of that std added to its matrices (as built, its greedy turns are
    newlines only, which would make token identity say little; perturbed, they are varied text)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from t2s.training.tiny_model import build_tiny_model

    built = build_tiny_model(folder / "built", preset="attention")
    if not noise:
        return built
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * noise)
    out = folder / "noisy"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(built).save_pretrained(out)
    return out


@contextlib.contextmanager
def served(model_dir: Path, log_path: Path, *serve_args: str):
    """The OpenAI server as `make serve` starts it (its install step taken as done) on a free loopback port; yields
    its URL and stops it on exit."""
    port = free_port()
    cmd = ["make", "--no-print-directory", "-o", "install-vllm", "serve", f"MODEL={model_dir}", f"PORT={port}",
           f"MAX_MODEL_LEN={SERVER_MAX_MODEL_LEN}", "SERVE_ARGS=--enforce-eager " + " ".join(serve_args)]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ | VLLM_ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}); see {log.name}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"no /health within {HANG_GUARD_S} s; see {log.name}"
            time.sleep(1)
        log.flush()
        started = Path(log.name).read_text(encoding="utf-8", errors="replace")
        assert not [line for line in started.splitlines() if "DeprecationWarning" in line and "vllm" in line], (
            f"the server's entry point is deprecated; see {log.name}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
