"""Several OpenAI-compatible servers serving one model, used as one (``--endpoint A --endpoint B``).

- :class:`ServerPool` (completions mode) is a token backend over several ``VLLMServerBackend``s. An episode stays on
  the server that took its first turn while that server answers, so the server's prefix cache keeps the episode's
  stream; a new episode goes to the live server with the fewest requests in flight. Each episode of the rollout is
  its own asyncio task, so the episode's server is kept in a ``ContextVar``: set at its first turn, it is the task's
  own. Each server keeps its own bound on requests in flight (``--concurrency`` is per server).
- :class:`ChatClientPool` (chat and tools modes) routes request by request to the live server with the fewest in
  flight: a chat request carries its whole history, so any server can take any turn.

A server whose request still fails after its retries because it cannot be reached (refused connection, time-out, a
5xx answer) is marked down and reported once on stderr, and the turn goes to another live server: the episode goes
on there, so none is lost and none is played twice. A server that answers 200 with something that is no answer (not
the API's shape, token ids that are no token ids: a proxy's page, another API) has that turn go to another server
too, and is marked down after ``UNUSABLE_IN_A_ROW`` such answers in a row; a turn no server answers usably fails on
its own, so one odd request never takes the servers down. A request the server refuses (a 400) is the turn's own
failure, as with one server. When no server is left, the turn fails as a single server's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from typing import Callable, Sequence

from t2s.backends.base import SamplingSettings, TurnOutput
from t2s.backends.http_retry import RequestFailed, UnusableAnswer

_EPISODE_SERVER: contextvars.ContextVar[int | None] = contextvars.ContextVar("t2s_episode_server", default=None)
UNUSABLE_IN_A_ROW = 3  # unusable answers in a row that take a server out of the pool


def _say_down(url: str, reason: str, left: int) -> None:
    from t2s.ui.console import print_line

    where = f"its turns go to the {left} other server(s)" if left else "no server is left"
    print_line(f"Warning: the server at {url} is left out ({reason}); {where}", stderr=True)


class _Health:
    """Which servers are down, and how many requests each has in flight (thread-safe)."""

    def __init__(self, urls: Sequence[str], report: Callable[[str, str, int], None]):
        self.urls = list(urls)
        self.down: dict[int, str] = {}  # server index -> why it was marked down
        self.in_flight = [0] * len(urls)
        self.unusable = [0] * len(urls)  # unusable answers in a row
        self.report = report
        self.lock = threading.Lock()

    def pick(self, preferred: int | None, tried: set[int]) -> int | None:
        with self.lock:
            if preferred is not None and preferred not in self.down and preferred not in tried:
                return preferred
            live = [i for i in range(len(self.urls)) if i not in self.down and i not in tried]
            return min(live, key=lambda i: (self.in_flight[i], i)) if live else None

    @contextlib.contextmanager
    def taking(self, index: int):
        """Count one request in flight on server ``index`` while the block runs."""
        with self.lock:
            self.in_flight[index] += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight[index] -= 1

    def answered(self, index: int, usable: bool, reason: str = "") -> None:
        """Count a 200 answer of server ``index``: a usable one clears its count, the last of ``UNUSABLE_IN_A_ROW``
        unusable ones in a row marks it down."""
        with self.lock:
            self.unusable[index] = 0 if usable else self.unusable[index] + 1
            down = self.unusable[index] >= UNUSABLE_IN_A_ROW
        if down:
            self.mark_down(index, f"{UNUSABLE_IN_A_ROW} unusable answers in a row, the last: {reason}")

    def mark_down(self, index: int, reason: str) -> None:
        with self.lock:
            if index in self.down:
                return
            self.down[index] = reason
            left = len(self.urls) - len(self.down)
        self.report(self.urls[index], reason, left)


class ServerPool:
    """A token backend over several vLLM servers (see the module docstring)."""

    schedule = "async"

    def __init__(self, backends: Sequence, report: Callable[[str, str, int], None] = _say_down):
        if not backends:
            raise ValueError("ServerPool needs at least one server")
        self.backends = list(backends)
        self.stop_token_ids = list(self.backends[0].stop_token_ids)
        self.health = _Health([b.base_url for b in self.backends], report)

    @property
    def base_url(self) -> str:
        return self.backends[0].base_url

    async def agenerate(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingSettings, seed: int | None = None
    ) -> TurnOutput:
        """One turn on the episode's server, or on another live one when that server is down."""
        tried: set[int] = set()
        last, unusable = "every server is down", False
        while (index := self.health.pick(_EPISODE_SERVER.get(), tried)) is not None:
            _EPISODE_SERVER.set(index)
            try:
                with self.health.taking(index):
                    turn = await self.backends[index].arequest_turn(prompt_ids, max_tokens, sampling, seed)
                self.health.answered(index, usable=True)
                return turn
            except UnusableAnswer as exc:
                last, unusable = exc.reason, True
                tried.add(index)
                self.health.answered(index, usable=False, reason=exc.reason)
            except RequestFailed as exc:
                last, unusable = f"{self.health.urls[index]}: {exc}", False
                if not exc.retryable:  # the server answers and refuses this request: the turn's own failure
                    return TurnOutput.failed(last)
                tried.add(index)
                self.health.mark_down(index, exc.reason)
        # unreachable (the run stops, to resume later) unless the last server tried answered with nothing usable
        return TurnOutput.failed(f"no server answered this turn ({last})", unreachable=not unusable)

    def generate(self, prompts, max_tokens, sampling, seeds=None) -> list[TurnOutput]:
        """A batch as concurrent requests, each its own episode (for turn-synchronous callers)."""
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)

        async def batch():
            try:
                return await asyncio.gather(*(self.agenerate(p, m, sampling, s)
                                              for p, m, s in zip(prompts, max_tokens, seeds)))
            finally:
                await self.aclose()

        return list(asyncio.run(batch()))

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


class ChatClientPool:
    """Several ``ChatEndpointClient``s serving one model, as one client (see the module docstring)."""

    def __init__(self, clients: Sequence, report: Callable[[str, str, int], None] = _say_down):
        if not clients:
            raise ValueError("ChatClientPool needs at least one server")
        self.clients = list(clients)
        self.health = _Health([c.base_url for c in self.clients], report)

    @property
    def base_url(self) -> str:
        return self.clients[0].base_url

    @property
    def model(self) -> str | None:
        return self.clients[0].model

    @property
    def enable_thinking(self) -> bool:
        return self.clients[0].enable_thinking

    def model_name(self) -> str:
        return self.clients[0].model_name()

    def _routed(self, call: Callable):
        from t2s.backends.chat_endpoint import EndpointError

        tried: set[int] = set()
        last = None
        while (index := self.health.pick(None, tried)) is not None:
            try:
                with self.health.taking(index):
                    answer = call(self.clients[index])
                self.health.answered(index, usable=True)
                return answer
            except EndpointError as exc:
                if not (exc.unreachable or exc.unusable):
                    raise
                last = exc
                tried.add(index)
                if exc.unusable:
                    self.health.answered(index, usable=False, reason=str(exc).removeprefix("Error: "))
                else:
                    self.health.mark_down(index, str(exc).removeprefix("Error: "))
        # as the last server failed: unreachable (the run stops, to resume later) or unusable (this request alone);
        # no server left to try at all is unreachable
        raise EndpointError(f"Error: no server answered (the last: {str(last).removeprefix('Error: ')})",
                            unreachable=last is None or last.unreachable, unusable=last is not None and last.unusable)

    def complete(self, messages, max_tokens, sampling, seed=None):
        return self._routed(lambda client: client.complete(messages, max_tokens, sampling, seed))

    def complete_message(self, messages, max_tokens, sampling, seed=None, tools=None):
        return self._routed(lambda client: client.complete_message(messages, max_tokens, sampling, seed, tools))
