"""Drive many episodes against a generation backend and build what TRL's ``rollout_func`` returns (DESIGN §3, §8).

The token stream is accumulated raw and never re-rendered through the chat template:

- prompt = ``tokens.first_prompt_ids(tokenizer, episode)`` (Qwen3.5's ends in ``<|im_start|>assistant\\n<think>\\n``);
- each model turn's tokens are appended as sampled (a sampled stop token included), ``env_mask`` 1, sampler logprobs;
- the environment's suffix (``protocol.env_suffix_ids``: the template's end of turn when the turn did not end on it, the
  observation as a user turn, the next generation prompt; in the native call format ``native_calls.suffix_ids``: the
  turn's tool messages and user message as the chat template renders them) is appended with ``env_mask`` 0 and
  logprob 0.0;
- a finished trajectory ends on the end of turn: when the last model turn stopped on another stop token (Qwen's
  ``<|endoftext|>``) or was cut off, one end-of-turn token is appended as an environment token.

Every token the template writes is read from it (``t2s.env.chat_format``): no chat family is assumed.

Budgets and cut-offs are the episode's (``Episode.start / next_max_tokens / step / add_env_tokens``). Every policy
plays through here: a token backend answers ``generate`` / ``agenerate`` with sampled ids; a turn backend answers
``turn(index, episode, max_tokens)`` with a ``TurnOutput`` (text policies, through ``t2s.rollout.text_policy``;
without a tokenizer such a turn carries its text and no ids, and only the turn and tool budgets apply). Three
schedules return the same traces:

- **async** (vLLM server): every episode is its own chain of ``agenerate`` calls on one event loop;
- **turnsync** (vLLM colocate, transformers, the warm start's scripted policies): each round batches the next turn of
  every active episode;
- **inline** (one text policy's episode, as ``eval``'s gold and endpoint policies, ``ask --replay`` and ``bench env``
  play them from their own threads): one episode after another on the calling thread, no thread pool.

In the first two, tool calls and scoring run in a thread pool, never on the loop or between batches' generation, and
each episode is scored as soon as it finishes. Tokenisation stays on the driving thread.

``Rollout.timings`` gives the wall seconds of the last run during which generation, and during which the environment
(opening databases, tools, final SQL and scoring), had at least one call in flight. The two overlap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from t2s.backends.base import SamplingSettings, TurnOutput
from t2s.env.chat_format import chat_format
from t2s.env.episode import Episode, EpisodeConfig
from t2s.env.record import EpisodeRecord
from t2s.env.native_reader import special_tokens_of
from t2s.rollout.tokens import EnvTokenCounter, first_prompt_ids
from t2s.rollout.trace import EpisodeTrace, to_trl

logger = logging.getLogger(__name__)

GENERATION, ENVIRONMENT = "generation", "environment"


class BusyClock:
    """Wall seconds during which at least one span of a kind was open; spans may overlap and come from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = defaultdict(int)
        self._since: dict[str, float] = {}
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def span(self, kind: str) -> Iterator[None]:
        with self._lock:
            if self._open[kind] == 0:
                self._since[kind] = time.perf_counter()
            self._open[kind] += 1
        try:
            yield
        finally:
            with self._lock:
                self._open[kind] -= 1
                if self._open[kind] == 0:
                    self.seconds[kind] += time.perf_counter() - self._since.pop(kind)


def default_scorer(row: dict, record: EpisodeRecord):
    """Execute the episode's final SQL against gold (``rewards.execute_final``)."""
    from t2s.scoring.rewards import execute_final

    return execute_final(row, record.final_sql, episode_write_attempt=record.counters["write_attempts"] > 0)


class _Run:
    """One episode being played: the Episode plus its token stream. Tokenisation happens on the driving thread."""

    def __init__(self, index: int, row: dict, rollout: Rollout):
        self.index = index
        self.row = row
        self.rollout = rollout
        self.turn = 0
        self.last: TurnOutput | None = None
        self.episode: Episode | None = None
        self.trace: EpisodeTrace | None = None
        self.env_tokens: EnvTokenCounter | None = None  # counts each observation's suffix, then gives it

    def open(self) -> None:  # worker thread: reads the schema
        with self.rollout.clock.span(ENVIRONMENT):
            self._open()

    def _open(self) -> None:
        rollout = self.rollout
        db = rollout.db(self.row) if callable(rollout.db) else rollout.db
        if rollout.tokenizer is not None:
            self.env_tokens = EnvTokenCounter(
                rollout.tokenizer, rollout.config.enable_thinking, lock=rollout.tokenizer_lock
            )
        self.episode = Episode(self.row, rollout.config, db, env_tokens=self.env_tokens, **rollout.episode_kwargs)

    def adopt(self, episode: Episode) -> None:
        """Play an Episode the caller built: the chat template's rules, special tokens and token counter are set on
        it as ``open`` sets them on its own."""
        rollout = self.rollout
        self.episode = episode
        episode.config = rollout.config
        if rollout.tokenizer is None:
            return
        episode.special_tokens = rollout.special_tokens
        counter = episode.env_tokens  # the suffixes added are the ones counted, when the counter is ours
        if not isinstance(counter, EnvTokenCounter):
            counter = EnvTokenCounter(rollout.tokenizer, rollout.config.enable_thinking, lock=rollout.tokenizer_lock)
        if episode.env_tokens is None:
            episode.env_tokens = counter
        self.env_tokens = counter

    def begin(self) -> None:  # driving thread
        tok = self.rollout.tokenizer
        prompt: list[int] = []
        if tok is not None:
            with self.rollout.tokenizer_lock:
                prompt = first_prompt_ids(tok, self.episode)
        self.trace = EpisodeTrace(self.index, prompt)
        self.episode.start(len(prompt))

    def next_request(self) -> tuple[list[int], int, int | None] | None:
        """(context ids, max_tokens, seed) for the next turn, or None when the episode is over."""
        if self.episode.done:
            return None
        max_tokens = self.episode.next_max_tokens()
        if self.episode.done or max_tokens <= 0:
            return None
        seed = self.rollout.sampling.request_seed(self.index, self.turn)
        return self.trace.prompt_ids + self.trace.completion_ids, max_tokens, seed

    def take_turn(self, out: TurnOutput) -> tuple | None:
        """Append a model turn; returns what ``Episode.step`` needs (text, tokens, cut off, the calls a server read),
        or None when generation failed."""
        trace = self.trace
        self.turn += 1
        self.last = out
        trace.finish_reasons.append(out.finish_reason)
        if out.finish_reason == "error":
            trace.error, trace.unreachable = out.error or "Error: generation failed", out.unreachable
            return None
        trace.completion_ids += out.token_ids
        trace.logprobs += [float(x) for x in out.logprobs]
        trace.env_mask += [1] * len(out.token_ids)
        text = out.text
        if text is None:
            text_ids = out.token_ids[:-1] if out.stop_token_id is not None and out.token_ids else out.token_ids
            with self.rollout.tokenizer_lock:
                text = self.rollout.tokenizer.decode(text_ids, skip_special_tokens=False)
        trace.assistant_texts.append(text)
        return text, len(out.token_ids), out.finish_reason == "length", out.parsed

    def step(self, text: str, n_tokens: int, cut_off: bool, parsed=None) -> str | None:  # worker thread: the tools
        with self.rollout.clock.span(ENVIRONMENT):
            try:
                return self.episode.step(text, n_tokens=n_tokens, cut_off=cut_off, parsed=parsed)
            except Exception as exc:  # noqa: BLE001 - one episode's failure ends that episode, never the rollout
                logger.warning("episode %s (question %s) ended by an environment error: %s: %s", self.index,
                               self.row.get("question_id") if isinstance(self.row, dict) else None,
                               type(exc).__name__, exc)
                self.episode.end_with_error(text)
                return None

    def add_environment(self, observation: str) -> None:
        if self.env_tokens is None:  # no tokenizer: nothing is counted in tokens
            return
        needs_end_of_turn = self.last.stop_token_id != self.rollout.end_of_turn_id
        # tokenized when it was counted
        suffix = self.env_tokens.suffix_ids(observation, needs_end_of_turn=needs_end_of_turn)
        self._append_env(suffix)
        self.episode.add_env_tokens(len(suffix))

    def _append_env(self, ids: list[int]) -> None:
        trace = self.trace
        trace.completion_ids += ids
        trace.logprobs += [0.0] * len(ids)
        trace.env_mask += [0] * len(ids)
        with self.rollout.tokenizer_lock:
            trace.env_texts.append(self.rollout.tokenizer.decode(ids, skip_special_tokens=False))

    def close(self) -> None:
        """End the episode (generation error or budget) and end the stream on the end-of-turn token."""
        if not self.episode.done:
            self.episode.finish("error" if self.trace.error else "stopped")
        ids = self.trace.completion_ids
        if self.rollout.tokenizer is None:  # no token stream to close
            return
        if not ids or ids[-1] != self.rollout.end_of_turn_id:  # never an empty completion
            self._append_env([self.rollout.end_of_turn_id])

    def finish(self) -> EpisodeTrace:  # worker thread: final SQL choice may execute SQL, then scoring
        with self.rollout.clock.span(ENVIRONMENT):
            self.trace.record = self.episode.record()
            if self.rollout.scorer is not None:
                self.trace.outcome = self.rollout.scorer(self.row, self.trace.record)
        return self.trace


class Rollout:
    """Plays rows as episodes through ``backend`` and returns one ``EpisodeTrace`` per row, in row order.

    ``backend``: a token backend (``generate`` / ``agenerate``), or a turn backend (``turn(index, episode,
    max_tokens)``: ``text_policy.TextPolicies``). ``tokenizer`` may be None only for a turn backend: the episodes
    then keep no token stream and count no tokens.
    ``scorer(row, record)`` runs as each episode finishes (default: ``rewards.execute_final`` of the final SQL); pass
    ``score=False`` to skip scoring. ``schedule`` defaults to the backend's ("async", "turnsync" or "inline").
    ``on_finish(trace)`` is called on the driving thread as each scored episode completes.
    ``db`` opens every episode's database: a ``DatabaseRef``, a callable ``row -> DatabaseRef``, or None for the row's
    own (``databases.ref_from_row``: benchmark files open ``immutable``; ``ask`` passes a ``user_db`` instead).
    """

    def __init__(
        self,
        backend,
        tokenizer,
        episode_config: EpisodeConfig | None = None,
        *,
        sampling: SamplingSettings | None = None,
        scorer: Callable[[dict, EpisodeRecord], Any] | None = None,
        score: bool = True,
        tool_workers: int | None = None,
        schedule: str | None = None,
        on_finish: Callable[[EpisodeTrace], None] | None = None,
        db=None,
    ) -> None:
        self.backend = backend
        self.db = db
        # Tool threads count observation tokens while the driving thread tokenizes: one tokenizer user at a time.
        self.tokenizer_lock = threading.Lock()
        self.tokenizer = tokenizer
        self.write_turn = getattr(backend, "turn", None)  # a turn backend's turn(index, episode, max_tokens)
        if tokenizer is None:
            if self.write_turn is None:
                raise ValueError("Error: a token backend needs a tokenizer")
            self.special_tokens, self.format = None, None
            self.config = episode_config or EpisodeConfig()
            self.episode_kwargs: dict = {}
        else:
            self.special_tokens = special_tokens_of(tokenizer)  # what a native turn's reader drops, as a server does
            self.format = chat_format(tokenizer)  # a template t2s cannot use is refused here, with the fix
            self.config = self.format.episode_config(episode_config or EpisodeConfig())
            self.episode_kwargs = {"special_tokens": self.special_tokens}
        self.sampling = sampling or SamplingSettings.training()
        self.scorer = (scorer or default_scorer) if score else None
        self.tool_workers = tool_workers or max(2, os.cpu_count() or 2)
        self.schedule = schedule or getattr(backend, "schedule", "turnsync")
        if self.schedule not in ("async", "turnsync", "inline"):
            raise ValueError(f"Error: unknown rollout schedule {self.schedule!r}; expected 'async', 'turnsync' or "
                             "'inline'")
        if self.schedule == "async" and self.write_turn is not None:
            raise ValueError("Error: a turn backend plays on the 'turnsync' or 'inline' schedule, not 'async'")
        self.on_finish = on_finish
        self.clock = BusyClock()
        self.end_of_turn_id = self.format.end_of_turn_id if self.format is not None else None
        if tokenizer is not None and self.end_of_turn_id not in getattr(backend, "stop_token_ids",
                                                                        [self.end_of_turn_id]):
            raise ValueError(f"Error: the backend does not stop on {self.format.end_of_turn}, the chat template's end "
                             "of turn")

    # ---- public ----------------------------------------------------------------------------------------------------
    @property
    def timings(self) -> dict[str, float]:
        """Seconds of the last run with generation, and with environment work, in flight (they overlap)."""
        return {GENERATION: self.clock.seconds[GENERATION], ENVIRONMENT: self.clock.seconds[ENVIRONMENT]}

    def run(self, rows: Sequence[dict]) -> list[EpisodeTrace]:
        self.clock = BusyClock()
        rows = list(rows)
        if not rows:
            return []
        if self.schedule == "inline":
            traces = [self._play_inline(_Run(i, row, self)) for i, row in enumerate(rows)]
        else:
            with ThreadPoolExecutor(self.tool_workers, thread_name_prefix="t2s-tools") as pool:
                if self.schedule == "async":
                    traces = _run_coroutine(self._run_async(rows, pool))
                else:
                    traces = self._run_turnsync(rows, pool)
        for trace in traces:
            trace.check(self.end_of_turn_id)
        return traces

    def play_episode(self, episode: Episode, index: int = 0) -> EpisodeTrace:
        """Play an Episode the caller built, inline on the calling thread (``text_policy.play``)."""
        run = _Run(index, episode.row, self)
        run.adopt(episode)
        trace = self._play_inline(run, opened=True)
        trace.check(self.end_of_turn_id)
        return trace

    def to_trl(self, traces: Sequence[EpisodeTrace]) -> dict:
        return to_trl(traces, self.end_of_turn_id)

    # ---- inline: one episode on the calling thread -------------------------------------------------------------------
    def _play_inline(self, run: _Run, opened: bool = False) -> EpisodeTrace:
        if not opened:
            run.open()
        run.begin()
        while (request := run.next_request()) is not None:
            turn = run.take_turn(self._generate_one(run, request))
            if turn is None:
                break
            observation = run.step(*turn)
            if observation is None:
                break
            run.add_environment(observation)
        run.close()
        trace = run.finish()
        if self.on_finish is not None:
            self.on_finish(trace)
        return trace

    def _generate_one(self, run: _Run, request: tuple[list[int], int, int | None]) -> TurnOutput:
        context, max_tokens, seed = request
        with self.clock.span(GENERATION):
            if self.write_turn is not None:
                return self.write_turn(run.index, run.episode, max_tokens)
            return self.backend.generate([context], [max_tokens], self.sampling, [seed])[0]

    # ---- async: one chain per episode --------------------------------------------------------------------------------
    async def _run_async(self, rows: list[dict], pool: ThreadPoolExecutor) -> list[EpisodeTrace]:
        loop = asyncio.get_running_loop()

        async def play(index: int, row: dict) -> EpisodeTrace:
            run = _Run(index, row, self)
            await loop.run_in_executor(pool, run.open)
            run.begin()
            while (request := run.next_request()) is not None:
                context, max_tokens, seed = request
                with self.clock.span(GENERATION):
                    out = await self.backend.agenerate(context, max_tokens, self.sampling, seed)
                turn = run.take_turn(out)
                if turn is None:
                    break
                observation = await loop.run_in_executor(pool, run.step, *turn)
                if observation is None:
                    break
                run.add_environment(observation)
            run.close()
            trace = await loop.run_in_executor(pool, run.finish)
            if self.on_finish is not None:
                self.on_finish(trace)
            return trace

        try:
            return list(await asyncio.gather(*(play(i, row) for i, row in enumerate(rows))))
        finally:
            close = getattr(self.backend, "aclose", None)
            if close is not None:
                await close()

    # ---- turn-synchronous: one batch per round -----------------------------------------------------------------------
    def _run_turnsync(self, rows: list[dict], pool: ThreadPoolExecutor) -> list[EpisodeTrace]:
        runs = [_Run(i, row, self) for i, row in enumerate(rows)]
        list(pool.map(_Run.open, runs))
        for run in runs:
            run.begin()
        scoring: list[Future] = []

        def retire(run: _Run) -> None:
            run.close()
            scoring.append(pool.submit(run.finish))

        def report(wait: bool) -> None:
            while scoring and (wait or scoring[0].done()):
                trace = scoring.pop(0).result()
                if self.on_finish is not None:
                    self.on_finish(trace)

        active = runs
        while active:
            requests, waiting = [], []
            for run in active:
                request = run.next_request()
                if request is None:
                    retire(run)
                else:
                    requests.append(request)
                    waiting.append(run)
            report(wait=False)
            if not waiting:
                break
            with self.clock.span(GENERATION):
                if self.write_turn is not None:
                    outputs = [self.write_turn(run.index, run.episode, r[1]) for run, r in zip(waiting, requests)]
                else:
                    outputs = self.backend.generate(
                        [r[0] for r in requests], [r[1] for r in requests], self.sampling, [r[2] for r in requests]
                    )
            if len(outputs) != len(waiting):
                raise RuntimeError(f"the backend answered {len(outputs)} turns for {len(waiting)} prompts")
            turns = [run.take_turn(out) for run, out in zip(waiting, outputs)]
            stepping = [(run, turn) for run, turn in zip(waiting, turns) if turn is not None]
            for run, turn in zip(waiting, turns):
                if turn is None:
                    retire(run)
            observations = list(pool.map(lambda pair: pair[0].step(*pair[1]), stepping))
            active = []
            for (run, _), observation in zip(stepping, observations):
                if observation is None:
                    retire(run)
                else:
                    run.add_environment(observation)
                    active.append(run)
        report(wait=True)
        end = getattr(self.backend, "end_rollout", None)
        if end is not None:  # lets collective backends keep in step with ranks still generating
            end()
        return [run.trace for run in runs]


def _run_coroutine(coroutine):
    """Run a coroutine to completion, also when the caller already has a running loop (e.g. a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as runner:
        return runner.submit(asyncio.run, coroutine).result()
