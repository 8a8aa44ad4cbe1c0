"""``bench eval-scale``: evaluation across two vLLM servers against one, on the same episodes.

Each server is started as ``make serve`` starts it (so this benchmark runs from a checkout), pinned with ``taskset``
to a core of its own, its OpenMP threads bound to that core. The baseline is one server on the first core; the run is
two servers, on the first and the second core, as one ``ServerPool`` (``eval --endpoint A --endpoint B``). Both play
the same episodes through the rollout driver that ``eval`` uses (``--n`` episodes of the demo questions in withheld
mode, greedy, ``--max-turns`` tool turns of at most ``--max-tokens-per-turn`` tokens), after a short warm-up pass on
each server (``WARMUP_EPISODES``: it compiles what the first requests compile). The two-server pass says how many
requests each server answered (from the servers' access logs): an episode keeps its server, so a pass of few episodes
can load one server more than the other. The last line is ``eval-scale: servers=2 episodes=N seconds=S speedup=R``,
where S is the two-server time and R the one-server time over it; the bench exits 1 when R is below ``TARGET``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TARGET = 1.6
MAX_MODEL_LEN = 4096
EPISODES = 64  # 8 demo questions, 8 episodes each (``bench rollout``'s picking)
WARMUP_EPISODES = 4


@contextlib.contextmanager
def make_serve(model: Path, port: int, log: Path, *, core: int | None = None, max_model_len: int = MAX_MODEL_LEN,
               serve_args: str = "", env: dict | None = None, timeout: float = 900.0):
    """The OpenAI server as ``make serve`` starts it (its install step taken as done) on loopback ``port``, under
    ``taskset -c core`` with its OpenMP threads bound there when ``core`` is given; yields its URL once /health
    answers, and stops its process group on exit. RuntimeError when it exits or does not answer in ``timeout`` s."""
    from t2s.settings import REPO_ROOT

    env = os.environ | {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"} | (env or {})
    cmd = ["make", "--no-print-directory", "-o", "install-vllm", "serve", f"MODEL={model}", f"PORT={port}",
           f"MAX_MODEL_LEN={max_model_len}", f"SERVE_ARGS={serve_args}"]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"Error: the server exited ({proc.returncode}); see {log}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Error: the server did not answer /health within {timeout:g} s; see {log}")
                time.sleep(1)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def play(urls: list[str], tokenizer, rows: list[dict], config) -> float:
    """Seconds to play ``rows`` through the servers at ``urls`` (a ``ServerPool`` when several)."""
    from t2s.backends.base import SamplingSettings
    from t2s.backends.server_pool import ServerPool
    from t2s.backends.vllm_server import VLLMServerBackend
    from t2s.rollout.driver import Rollout

    backends = [VLLMServerBackend(url, tokenizer, max_concurrency=64) for url in urls]
    backend = backends[0] if len(backends) == 1 else ServerPool(backends)
    rollout = Rollout(backend, tokenizer, config, sampling=SamplingSettings(temperature=0.0, seed=0), score=False)
    started = time.perf_counter()
    traces = rollout.run(rows)
    seconds = time.perf_counter() - started
    failed = [trace.error for trace in traces if trace.error]
    if failed:
        raise RuntimeError(f"Error: {len(failed)} of {len(traces)} episodes failed: {failed[0]}")
    return seconds


def requests_served(log: Path) -> int:
    """How many completion requests a server's access log shows so far."""
    try:
        return log.read_text(errors="replace").count("POST /v1/completions")
    except OSError:
        return 0


def run(*, model=None, episodes=EPISODES, max_turns=2, max_tokens_per_turn=64, seed=0, output=None) -> int:
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    from t2s.backends.vllm_engine import free_port
    from t2s.bench.rollout import pick_rows
    from t2s.data.loaders import load_json_rows
    from t2s.env.episode import EpisodeConfig
    from t2s.settings import DEMO_DIR, REPO_ROOT
    from t2s.ui.console import print_line

    cores = sorted(os.sched_getaffinity(0))
    model = Path(model) if model else REPO_ROOT / ".cache" / "models" / "smollm2-135m-instruct"
    problems = [message for failed, message in (
        (len(cores) < 2, f"two cores are needed, this process may use {len(cores)}"),
        (shutil.which("taskset") is None, "taskset is not installed (util-linux)"),
        (not (REPO_ROOT / "Makefile").is_file(), "the servers start with `make serve`: run from a checkout"),
        (not (model / "config.json").is_file(), f"no model folder at {model} (make install-models, or --model DIR)"),
    ) if failed]
    if problems:
        print_line(f"Error: bench eval-scale: {problems[0]}", stderr=True)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pick_rows(load_json_rows(DEMO_DIR / "dev.json"), episodes, seed)
    config = EpisodeConfig(mode="withheld", max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                           forced_turn_reserve=max_tokens_per_turn, episode_token_budget=MAX_MODEL_LEN,
                           min_episode_tokens=256, enable_thinking=False)
    logs = Path(output) if output else Path(tempfile.mkdtemp(prefix="t2s-bench-eval-scale-"))
    logs.mkdir(parents=True, exist_ok=True)
    from t2s.ui.console import console

    out = console(stderr=True)
    with make_serve(model, free_port(), logs / "server0.log", core=cores[0]) as first:
        out.print(f"one server on core {cores[0]}: warm-up, then {len(rows)} episodes", highlight=False)
        play([first], tokenizer, rows[:WARMUP_EPISODES], config)
        one = play([first], tokenizer, rows, config)
        with make_serve(model, free_port(), logs / "server1.log", core=cores[1]) as second:
            out.print(f"two servers on cores {cores[0]} and {cores[1]}: warm-up, then the same episodes",
                      highlight=False)
            play([second], tokenizer, rows[:WARMUP_EPISODES], config)
            before = [requests_served(logs / f"server{i}.log") for i in (0, 1)]
            two = play([first, second], tokenizer, rows, config)
            split = [requests_served(logs / f"server{i}.log") - before[i] for i in (0, 1)]
    speedup = one / two
    out.print(f"one server {one:.1f} s, two servers {two:.1f} s; the two answered {split[0]} and {split[1]} requests "
              f"(server logs in {logs})", highlight=False)
    if speedup < TARGET:
        print_line(f"Error: two servers played {speedup:.2f}x as fast as one, below the target of {TARGET}x",
                   stderr=True)
    print(f"eval-scale: servers=2 episodes={len(rows)} seconds={two:.1f} speedup={speedup:.2f}")
    sys.stdout.flush()
    return 0 if speedup >= TARGET else 1
