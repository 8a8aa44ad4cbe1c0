"""The serving simulator of ``bench rollout`` (a model of a vLLM server, called a simulator so that "engine" keeps one
meaning, the database engine): a discrete-event model on a virtual clock (decode steps, a token
budget per step with chunked prefill, prefix caching, ``max_num_seqs``), which serves the rollout's real requests
(see ``t2s.bench.rollout``)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass


@dataclass
class EpisodePlan:
    """One episode's turns as token ids (stop token included); ``first_prompt`` identifies its first request."""

    row: dict
    turns: list[list[int]]
    first_prompt: tuple[int, ...] = ()


@dataclass(frozen=True)
class SimulatorSpec:
    step_seconds: float = 0.010
    max_num_seqs: int = 256
    tokens_per_step: int = 2048
    prefix_caching: bool = True


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
class SimulatorStats:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    requests: int = 0
    max_running: int = 0
    max_waiting: int = 0
    busy_seq_steps: int = 0  # sum over steps of running sequences (for mean occupancy)
    outside_seconds: float = 0.0  # wall time episodes spent outside the engine between turns (tools, tokenising)


class ServingSimulator:
    """A GenerationBackend over a virtual clock (see the module docstring). One rollout run per engine."""

    def __init__(self, tokenizer, plans: list[EpisodePlan], spec: SimulatorSpec, schedule: str):
        from t2s.backends.base import stop_token_ids

        self.stop_token_ids = stop_token_ids(tokenizer)
        self.spec = spec
        self.schedule = schedule
        self.now = 0.0
        self.last_event_wall = time.perf_counter()
        self.stats = SimulatorStats()
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
                if (chain.first_output
                        and tuple(prompt[length : length + len(chain.first_output)]) == chain.first_output):
                    return chain
        raise RuntimeError("the serving simulator got a prompt that belongs to no planned episode")

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
            while (self._pending and self._pending[0].arrival <= self.now + 1e-12
                   and len(self._running) < spec.max_num_seqs):
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
                raise RuntimeError("the serving simulator stalled")
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
