"""`python -m t2s bench rollout`: async vs turn-synchronous rollout scheduling on a simulated engine (DESIGN §11).

The engine is a discrete-event model of a vLLM server, run on a **virtual clock**:

- one decode step is 10 ms and advances every running sequence by one token, with at most ``max_num_seqs`` (256)
  sequences running; requests over capacity wait in arrival order;
- a step processes at most 2048 tokens: the running sequences' decodes first, then prompt tokens of newly admitted
  requests (chunked prefill), so prefill costs one step per 2048 prompt tokens; a request's first token comes out
  of the step that finishes its prefill. With prefix caching (on, as ``make serve`` runs vLLM) only the tokens past a
  sequence's previous context, or past a first prompt already seen, are prefilled;
- per-turn lengths come from a seeded log-normal (median 300 tokens, sigma 0.75, capped at 2048), with 2 to 6 turns
  per episode. Turn *k* writes filler thinking up to its length, then real tool calls (the pinned calls of
  ``bench env``, spread over the turns, in the ``--dialect`` and ``--tool-format`` played); the last turn submits
  the gold SQL, so every episode should score correct.

The engine knows an episode by its prompt, as a prefix cache would: a first request is the episode's first prompt
exactly as the rollout renders it (the chat template's ``tools=`` included in the native format), and every later
request of that episode extends it with the episode's first turn. Its turn index is the number of turns the engine
has served that episode, so neither depends on how the environment's segments are rendered.

Everything else is real: the rollout code (``t2s.rollout.Rollout``, both schedules), Episode, tools, SQLite on
``data/demo`` and scoring. Wall-clock time spent outside the engine - tool calls, tokenisation, bookkeeping -
is added to the virtual clock where it happens: an episode's next request arrives at the virtual time its previous
turn returned plus the wall time it took to come back. The engine only advances while every live episode is inside
it, so no request ever arrives in the engine's past.

The critical path is the longest single episode, each episode run alone on an idle engine. A schedule's time is the
virtual time of its last engine event plus the wall time from then until the rollout returned. The last line is
``async_over_critical=<float> turnsync_over_critical=<float>``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from dataclasses import dataclass, field

from t2s.cli_args import add_hidden_alias

ROLLOUTS_PER_QUESTION = 8


@dataclass(frozen=True)
class EngineSpec:
    step_seconds: float = 0.010
    max_num_seqs: int = 256
    tokens_per_step: int = 2048
    prefix_caching: bool = True


@dataclass(frozen=True)
class LengthModel:
    median: int = 300
    sigma: float = 0.75
    cap: int = 2048
    min_turns: int = 2
    max_turns: int = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", dest="episodes", type=int, default=144, help="episodes (groups of 8 rollouts per question)")
    add_hidden_alias(parser, "--n", "--episodes", type=int)
    parser.add_argument("--seed", type=int, default=0, help="seed of the questions and the turn lengths")
    parser.add_argument("--data", default=None, help="a BIRD-style JSON file (default: data/demo/dev.json)")
    parser.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt token on every turn")
    parser.add_argument("--workers", type=int, default=None, help="tool worker threads (default: the core count)")
    from t2s.evaluate import add_tool_arguments

    add_tool_arguments(parser)


# ---------------------------------------------------------------------------------------------------------------
# What the simulated model writes


@dataclass
class EpisodePlan:
    """One episode's turns as token ids (stop token included); ``first_prompt`` identifies its first request."""

    row: dict
    turns: list[list[int]]
    first_prompt: tuple[int, ...] = ()


def plan_turns(row: dict, n_turns: int, lengths: list[int], tokenizer, marker: str, dialect: str = "exec_plan",
               tool_format: str = "json") -> list[list[int]]:
    """``n_turns`` assistant turns: the pinned bench-env calls spread over ``n_turns - 1`` tool turns, then submit.

    The calls are written in the dialect and call format the episodes play (``bench env``'s ``call_writer``). Each
    turn is filler thinking up to its sampled length, then ``</think>`` and its calls; a turn whose calls need more
    tokens than sampled is longer.
    """
    from t2s.bench.env import call_writer, workload_turns
    from t2s.databases import ref_from_row
    from t2s.schema import get_schema

    pinned = workload_turns(row, get_schema(ref_from_row(row)), dialect, tool_format)
    calls = [c for turn in pinned[:-1] for c in turn]
    tool_turns = n_turns - 1
    if len(calls) < tool_turns:
        calls += [call_writer(dialect, tool_format)("run_query", sql=row["gold_sql"])] * (tool_turns - len(calls))
    per_turn = [calls[round(i * len(calls) / tool_turns) : round((i + 1) * len(calls) / tool_turns)] for i in range(tool_turns)]
    per_turn.append(pinned[-1])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    filler = tokenizer(" plan", add_special_tokens=False)["input_ids"]
    head = tokenizer(f"Episode {marker}.", add_special_tokens=False)["input_ids"]
    turns = []
    for calls_text, length in zip(per_turn, lengths):
        tail = tokenizer("\n</think>\n\n" + "\n".join(calls_text), add_special_tokens=False)["input_ids"] + [im_end]
        pad = max(0, length - len(head) - len(tail))
        turns.append(head + (filler * (pad // max(1, len(filler)) + 1))[:pad] + tail)
    return turns


def build_plans(rows: list[dict], tokenizer, config, seed: int, lengths: LengthModel) -> list[EpisodePlan]:
    """One plan per row; its first prompt is the one the rollout sends (``episode.first_prompt_ids``: in the native
    format the chat template declares the tools too)."""
    from t2s.episode import Episode, first_prompt_ids

    rng = random.Random(seed)
    plans = []
    for index, row in enumerate(rows):
        n_turns = rng.randint(lengths.min_turns, lengths.max_turns)
        sampled = [min(lengths.cap, max(1, round(rng.lognormvariate(math.log(lengths.median), lengths.sigma))))
                   for _ in range(n_turns)]  # fmt: skip
        turns = plan_turns(row, n_turns, sampled, tokenizer, f"e{index}", config.dialect, config.tool_format)
        plans.append(EpisodePlan(row, turns, tuple(first_prompt_ids(tokenizer, Episode(row, config)))))
    return plans


# ---------------------------------------------------------------------------------------------------------------
# The simulated engine


@dataclass
class _Chain:
    plan: EpisodePlan
    turns_served: int = 0
    first_output: tuple[int, ...] = ()
    cached: int = 0  # tokens of this sequence already in the prefix cache
    last_return_virtual: float | None = None
    last_return_wall: float | None = None


@dataclass
class _Request:
    chain: _Chain
    prompt_len: int
    output: list[int]
    arrival: float
    prefill_left: int = 0
    generated: int = 0
    future: object = None
    result: object = None


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    requests: int = 0
    max_running: int = 0
    max_waiting: int = 0
    busy_seq_steps: int = 0  # sum over steps of running sequences (for mean occupancy)
    outside_seconds: float = 0.0  # wall time episodes spent outside the engine between turns (tools, tokenising)


class SimulatedEngine:
    """A GenerationBackend over a virtual clock (see the module docstring). One rollout run per engine."""

    def __init__(self, tokenizer, plans: list[EpisodePlan], spec: EngineSpec, schedule: str):
        from t2s.backends.base import stop_token_ids

        self.stop_token_ids = stop_token_ids(tokenizer)
        self.spec = spec
        self.schedule = schedule
        self.now = 0.0
        self.last_event_wall = time.perf_counter()
        self.stats = EngineStats()
        self._fresh: dict[tuple, list[EpisodePlan]] = {}
        for plan in plans:
            self._fresh.setdefault(plan.first_prompt, []).append(plan)
        self._first_lengths = sorted({len(p.first_prompt) for p in plans})
        self._chains: dict[tuple, list[_Chain]] = {}
        self._seen_first: set[tuple] = set()
        self._pending: list[_Request] = []  # arrived or arriving, not yet admitted
        self._running: list[_Request] = []
        self.live = len(plans)  # episodes not yet finished (async: the engine waits for all of them)
        self.in_engine = 0
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None

    # ---- identifying the episode a prompt belongs to (as a prefix cache would) ---------------------------------------
    def _chain_for(self, prompt: list[int]) -> _Chain:
        for length in self._first_lengths:
            first = tuple(prompt[:length])
            if len(prompt) == length and first in self._fresh and self._fresh[first]:
                chain = _Chain(self._fresh[first].pop(0))
                self._chains.setdefault(first, []).append(chain)
                return chain
            for chain in self._chains.get(first, ()):
                if chain.first_output and tuple(prompt[length : length + len(chain.first_output)]) == chain.first_output:
                    return chain
        raise RuntimeError("the simulated engine got a prompt that belongs to no planned episode")

    def _request(self, prompt_ids: list[int], max_tokens: int) -> _Request:
        chain = self._chain_for(prompt_ids)
        plan = chain.plan
        turn = plan.turns[min(chain.turns_served, len(plan.turns) - 1)]
        if chain.last_return_wall is None:
            arrival = self.now
        else:
            outside = time.perf_counter() - chain.last_return_wall
            self.stats.outside_seconds += outside
            arrival = max(self.now, chain.last_return_virtual + outside)
        request = _Request(chain, len(prompt_ids), list(turn[: max(1, max_tokens)]), arrival)
        cached = chain.cached
        first = tuple(prompt_ids) if chain.turns_served == 0 else None
        if self.spec.prefix_caching and first is not None and first in self._seen_first:
            cached = len(prompt_ids) - 1
        if first is not None:
            self._seen_first.add(first)
        request.prefill_left = max(1, len(prompt_ids) - (cached if self.spec.prefix_caching else 0))
        self.stats.requests += 1
        return request

    def _returned(self, request: _Request) -> None:
        from t2s.backends.base import finish_turn

        chain = request.chain
        if chain.turns_served == 0:
            chain.first_output = tuple(request.output)
        chain.turns_served += 1
        chain.cached = request.prompt_len + len(request.output)
        chain.last_return_virtual = self.now
        chain.last_return_wall = self.last_event_wall = time.perf_counter()
        lps = [-0.5] * len(request.output)
        request.result = finish_turn(request.output, lps, len(request.output), self.stop_token_ids)

    # ---- the clock --------------------------------------------------------------------------------------------------
    def _advance(self) -> list[_Request]:
        """Run steps until at least one request finishes; returns the finished requests."""
        spec = self.spec
        while True:
            self._pending.sort(key=lambda r: r.arrival)
            while self._pending and self._pending[0].arrival <= self.now + 1e-12 and len(self._running) < spec.max_num_seqs:
                self._running.append(self._pending.pop(0))
            arrived_waiting = sum(1 for r in self._pending if r.arrival <= self.now + 1e-12)
            self.stats.max_waiting = max(self.stats.max_waiting, arrived_waiting)
            if not self._running:
                if not self._pending:
                    return []
                self.now = self._pending[0].arrival  # idle until the next arrival
                continue
            self.stats.max_running = max(self.stats.max_running, len(self._running))
            decoding = [r for r in self._running if r.prefill_left == 0]
            prefilling = [r for r in self._running if r.prefill_left > 0]
            if prefilling:
                steps = 1
            else:
                steps = min(len(r.output) - r.generated for r in decoding)
                future = [r.arrival for r in self._pending if r.arrival > self.now + 1e-12]
                if future and len(self._running) < spec.max_num_seqs:
                    steps = min(steps, max(1, math.ceil((min(future) - self.now) / spec.step_seconds - 1e-9)))
            for r in decoding:
                r.generated += steps
            self.stats.decode_tokens += steps * len(decoding)
            budget = spec.tokens_per_step - len(decoding)
            for r in prefilling:
                if budget <= 0:
                    break
                take = min(budget, r.prefill_left)
                r.prefill_left -= take
                budget -= take
                self.stats.prefill_tokens += take
                if r.prefill_left == 0:
                    r.generated += 1  # the step that finishes a prefill samples the first token
                    self.stats.decode_tokens += 1
            self.now += steps * spec.step_seconds
            self.stats.steps += steps
            self.stats.busy_seq_steps += steps * len(self._running)
            done = [r for r in self._running if r.prefill_left == 0 and r.generated >= len(r.output)]
            if done:
                self._running = [r for r in self._running if r not in done]
                for r in done:
                    self._returned(r)
                return done

    # ---- GenerationBackend ------------------------------------------------------------------------------------------
    def generate(self, prompts, max_tokens, sampling, seeds=None):
        """Turn-synchronous: the whole batch arrives, and the call returns when its last request finishes."""
        requests = [self._request(p, m) for p, m in zip(prompts, max_tokens)]
        self._pending.extend(requests)
        left = set(map(id, requests))
        while left:
            finished = self._advance()
            if not finished:
                raise RuntimeError("the simulated engine stalled")
            left -= set(map(id, finished))
        wall = self.last_event_wall = time.perf_counter()
        for request in requests:  # the caller sees every result when the batch's last request finishes
            request.chain.last_return_virtual, request.chain.last_return_wall = self.now, wall
        return [r.result for r in requests]

    async def agenerate(self, prompt_ids, max_tokens, sampling, seed=None):
        loop = asyncio.get_running_loop()
        if self._driver is None:
            self._wake = asyncio.Event()
            self._driver = loop.create_task(self._drive())
        request = self._request(list(prompt_ids), max_tokens)
        request.future = loop.create_future()
        self._pending.append(request)
        self.in_engine += 1
        self._wake.set()
        return await request.future

    def episode_finished(self, trace=None) -> None:
        """Rollout ``on_finish`` hook: one fewer episode to wait for."""
        self.live -= 1
        if self._wake is not None:
            self._wake.set()

    async def _drive(self) -> None:
        try:
            while self.live > 0:
                while self.in_engine < self.live:  # an episode is outside (tools, tokenising): its arrival is unknown
                    self._wake.clear()
                    await self._wake.wait()
                if self.live == 0:
                    break
                for request in self._advance():
                    self.in_engine -= 1
                    request.future.set_result(request.result)
                await asyncio.sleep(0)
        except Exception as exc:  # never leave an episode waiting forever
            for request in self._pending + self._running:
                if request.future is not None and not request.future.done():
                    request.future.set_exception(exc)
            raise

    def elapsed(self) -> float:
        """The schedule's time: the last engine event's virtual time plus the wall time since it."""
        return self.now + (time.perf_counter() - self.last_event_wall)


# ---------------------------------------------------------------------------------------------------------------
# Running the schedules


@dataclass
class ScheduleResult:
    name: str
    seconds: float
    stats: EngineStats
    turns: int = 0
    submitted: int = 0
    equivalent: int = 0
    extra: dict = field(default_factory=dict)


def run_schedule(name, plans, tokenizer, config, spec, workers, schedule) -> ScheduleResult:
    from t2s.rollout import Rollout

    engine = SimulatedEngine(tokenizer, plans, spec, schedule)
    rollout = Rollout(engine, tokenizer, config, tool_workers=workers, schedule=schedule, on_finish=engine.episode_finished)
    traces = rollout.run([p.row for p in plans])
    seconds = engine.elapsed()
    result = ScheduleResult(name, seconds, engine.stats)
    if engine.live != 0 and schedule == "async":
        raise RuntimeError(f"{engine.live} episodes never reported their end")
    result.turns = sum(t.record["counters"]["turns"] for t in traces)
    result.submitted = sum(bool(t.record["counters"]["submitted"]) for t in traces)
    result.equivalent = sum(bool(getattr(t.outcome, "equivalent", False)) for t in traces)
    return result


def critical_path(plans, tokenizer, config, spec, workers, progress=None) -> tuple[float, int]:
    """The longest single episode, each run alone on an idle engine: (seconds, index)."""
    best, where = 0.0, -1
    for index, plan in enumerate(plans):
        seconds = run_schedule("solo", [plan], tokenizer, config, spec, workers, "async").seconds
        if seconds > best:
            best, where = seconds, index
        if progress is not None:
            progress()
    return best, where


def pick_rows(rows: list[dict], episodes: int, seed: int) -> list[dict]:
    questions = max(1, math.ceil(episodes / ROLLOUTS_PER_QUESTION))
    chosen = random.Random(seed).sample(rows, min(questions, len(rows)))
    repeated = [row for row in chosen for _ in range(ROLLOUTS_PER_QUESTION)]
    while len(repeated) < episodes:
        repeated += repeated
    return repeated[:episodes]


def measure(episodes: int = 144, seed: int = 0, data=None, prefix_caching: bool = True, workers=None, console=None,
            dialect: str = "exec_plan", tool_format: str = "json"):
    """Run the three measurements in a tool set and call format; returns (async, turnsync, critical seconds,
    critical index, plans)."""
    from rich.progress import Progress

    from t2s.data.loaders import load_json_rows
    from t2s.episode import EpisodeConfig
    from t2s.settings import DEMO_DIR
    from t2s.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    rows = pick_rows(load_json_rows(data or DEMO_DIR / "dev.json"), episodes, seed)
    config = EpisodeConfig(dialect=dialect, tool_format=tool_format)
    spec = EngineSpec(prefix_caching=prefix_caching)
    plans = build_plans(rows, tokenizer, config, seed, LengthModel())
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("episodes alone (critical path)", total=len(plans) + 2)
        critical, where = critical_path(plans, tokenizer, config, spec, workers, lambda: progress.advance(task))
        progress.update(task, description="async schedule")
        async_result = run_schedule("async", plans, tokenizer, config, spec, workers, "async")
        progress.advance(task)
        progress.update(task, description="turn-synchronous schedule")
        turnsync_result = run_schedule("turn-sync", plans, tokenizer, config, spec, workers, "turnsync")
        progress.advance(task)
    return async_result, turnsync_result, critical, where, plans


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from t2s.settings import offline_environment

    offline_environment()
    if args.episodes < 1:
        print("Error: --n must be at least 1")
        return 2
    from t2s.rich_output import console as make_console, print_table

    console = make_console()
    try:
        async_r, turnsync_r, critical, where, plans = measure(
            args.episodes, args.seed, args.data, not args.no_prefix_cache, args.workers, console, args.dialect,
            args.tool_format,
        )
    except (OSError, ValueError) as exc:
        message = str(exc)
        print(message if message.startswith("Error:") else f"Error: {message}")
        return 1
    table = Table(
        title=f"Rollout scheduling: {len(plans)} episodes, {args.dialect} tools in {args.tool_format} calls, "
        "simulated engine (virtual clock)",
        caption="critical path: the longest episode run alone. seconds: virtual engine time plus the real time episodes "
        "spent outside the engine (outside s: summed over episodes)",
    )
    for column in ("schedule", "seconds", "x critical", "turns", "submitted", "correct", "steps", "mean running",
                   "outside s"):
        table.add_column(column, justify="right" if column != "schedule" else "left")
    table.add_row("critical path", f"{critical:.2f}", "1.000", "", "", "", "", "", "")
    for result in (async_r, turnsync_r):
        occupancy = result.stats.busy_seq_steps / max(1, result.stats.steps)
        table.add_row(
            result.name, f"{result.seconds:.2f}", f"{result.seconds / critical:.3f}", str(result.turns),
            f"{result.submitted}/{len(plans)}", f"{result.equivalent}/{len(plans)}", str(result.stats.steps),
            f"{occupancy:.1f}", f"{result.stats.outside_seconds:.2f}",
        )  # fmt: skip
    print_table(console, table)
    longest = plans[where]
    console.print(
        f"longest episode: question {longest.row['question_id']} with {len(longest.turns)} planned turns of "
        f"{[len(t) for t in longest.turns]} tokens; prefix caching {'on' if not args.no_prefix_cache else 'off'}"
    )
    print(f"async_over_critical={async_r.seconds / critical:.4f} turnsync_over_critical={turnsync_r.seconds / critical:.4f}")
    return 0
