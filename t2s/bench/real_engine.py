"""``bench rollout --engine vllm``: the async schedule against turn-synchronous batches on a real vLLM server.

Start the server first (``make serve MODEL=DIR PORT=P``, the CPU build included) and pass ``--endpoint`` and
``--tokenizer``. The same episodes (the ``--n`` questions of ``--data``, each played with a per-episode seed at
temperature 1, so that turn lengths vary as they do in training) run through the server twice per schedule,
alternating, so that both see a warm prefix cache; the best time of each is reported. The turn-synchronous schedule
sends every active episode's next turn together and waits for the slowest, as a colocated engine does; the async one
lets each episode send its next turn as soon as its tools have run. The last line is
``vllm: async_s=A turnsync_s=T turnsync_over_async=R``. The serving simulator (the default ``--engine sim``) stays the
benchmark for the large, exact workload.
"""

from __future__ import annotations

import time

REPEATS = 2


def measure(endpoint: str, tokenizer_path: str, episodes: int, seed: int, data=None, workers=None,
            dialect: str = "exec_plan", tool_format: str = "json", max_turns: int = 4, max_tokens_per_turn: int = 96):
    """Seconds of each schedule (best of ``REPEATS``) and the episodes' turn counts: ({schedule: seconds}, turns)."""
    from transformers import AutoTokenizer

    from t2s.backends.base import SamplingSettings
    from t2s.backends.vllm_server import VLLMServerBackend
    from t2s.bench.rollout import pick_rows
    from t2s.data.loaders import load_json_rows
    from t2s.env.episode import EpisodeConfig
    from t2s.settings import DEMO_DIR
    from t2s.rollout.driver import Rollout

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    rows = pick_rows(load_json_rows(data or DEMO_DIR / "dev.json"), episodes, seed)
    config = EpisodeConfig(dialect=dialect, tool_format=tool_format, max_turns=max_turns,
                           max_tokens_per_turn=max_tokens_per_turn, forced_turn_reserve=max_tokens_per_turn,
                           episode_token_budget=4096, min_episode_tokens=256)
    backend = VLLMServerBackend(endpoint, tokenizer, max_concurrency=256)
    best: dict[str, float] = {}
    turns: dict[str, int] = {}
    for _ in range(REPEATS):
        for schedule in ("turnsync", "async"):
            rollout = Rollout(backend, tokenizer, config, tool_workers=workers, schedule=schedule,
                              sampling=SamplingSettings.training(seed=seed))
            started = time.perf_counter()
            traces = rollout.run(rows)
            seconds = time.perf_counter() - started
            best[schedule] = min(seconds, best.get(schedule, float("inf")))
            turns[schedule] = sum(t.record.counters["turns"] for t in traces)
    return best, turns


def run(*, episodes=144, seed=0, data=None, workers=None, endpoint=None, tokenizer=None, dialect="exec_plan",
        tool_format="json") -> int:
    from t2s.settings import offline_environment

    offline_environment()
    if episodes < 1:
        print("Error: --n must be at least 1")
        return 2
    if not endpoint or not tokenizer:
        print("Error: --engine vllm needs --endpoint URL (a running `make serve`) and --tokenizer DIR")
        return 2
    best, turns = measure(endpoint, tokenizer, episodes, seed, data, workers,
                          dialect, tool_format)
    print(f"{episodes} episodes on {endpoint}: turns {turns['async']} async, {turns['turnsync']} "
          f"turn-synchronous (best of {REPEATS} runs each)")
    print(f"vllm: async_s={best['async']:.2f} turnsync_s={best['turnsync']:.2f} "
          f"turnsync_over_async={best['turnsync'] / best['async']:.3f}", flush=True)
    return 0
