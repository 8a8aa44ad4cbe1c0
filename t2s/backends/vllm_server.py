"""vLLM server: each episode is its own async chain of ``POST /v1/completions`` requests (token ids in and out).

Every rank talks to the server itself (never TRL's collective ``VLLMGeneration.generate``); TRL syncs the weights
before the rollout. Requests carry token-id prompts, ``return_token_ids``, ``return_tokens_as_token_ids``,
``logprobs: 0`` (the sampled token's logprob), both stop ids and a per-turn ``max_tokens``. A semaphore caps the
requests in flight. Requests go through ``http_retry`` (httpx, retried by tenacity): one that times out, breaks off,
meets 408/429/5xx or a refused connection is retried with exponential backoff; after the last retry the turn comes
back with finish "error" and the episode ends cleanly.

The same client serves ``eval --policy endpoint --endpoint-mode completions`` against any vLLM server:
``VLLMServerBackend(base_url, tokenizer)`` reads the model name from ``/v1/models`` when none is given.
``served_max_model_len`` reads the context length vLLM reports there, for start-up checks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import httpx

from t2s.backends.base import SamplingSettings, TurnOutput, engine_turn, stop_token_ids
from t2s.backends.http_retry import RequestFailed, UnusableAnswer, arequest, asend, normalise_base_url, timeouts



def context_error(base_url: str, max_model_len: int | None, episode_token_budget: int) -> str | None:
    """An ``Error:`` line when a served ``max_model_len`` cannot hold a whole episode (late turns would get HTTP 400
    and their episodes would end as errors), else None. A server that reports no length passes."""
    if max_model_len is None or max_model_len >= episode_token_budget:
        return None
    return (f"Error: the vLLM server at {base_url} has max_model_len {max_model_len}, below episode_token_budget "
            f"{episode_token_budget}: late turns would be refused. Restart it with --max-model-len "
            f"{episode_token_budget} or more (make serve MAX_MODEL_LEN=...).")


def model_length(entry) -> int | None:
    """The ``max_model_len`` of a ``/v1/models`` entry, or None where it states none that is a length (a string,
    NaN or infinity, a number below 1)."""
    length = entry.get("max_model_len") if isinstance(entry, dict) else None
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not 0 < length < 2 ** 63:
        return None  # NaN fails the comparison too
    return int(length)


class VLLMServerBackend:
    """An httpx client for a vLLM server's completions endpoint; usable from any event loop, one at a time."""

    schedule = "async"

    def __init__(
        self,
        base_url: str,
        tokenizer=None,
        *,
        model: str | None = None,
        stop_ids: Sequence[int] | None = None,
        max_concurrency: int = 256,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 1.0,
        api_key: str | None = None,
        extra_body: dict | None = None,
    ) -> None:
        if stop_ids is None and tokenizer is None:
            raise ValueError("VLLMServerBackend needs a tokenizer or stop_ids")
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.stop_token_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
        # an id is a whole number below 2**31 (a tokenizer's decode fails past its 32-bit range). Not checked against
        # len(tokenizer): a model's embedding may be padded past it (Qwen's), and vLLM may sample an id there
        self.max_token_id = 2 ** 31 - 1
        self.max_concurrency = max_concurrency
        self.timeout = timeouts(request_timeout, connect_timeout)
        self.retries = retries
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra_body = dict(extra_body or {})
        self._loop = None
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._model_lock: asyncio.Lock | None = None
        self.requests_sent = 0
        self.retries_done = 0

    # ---- client, bound to the running loop ------------------------------------------------------------------
    def _bind(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._client.is_closed:
            self._loop = loop
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, headers=self.headers,
                                             limits=limits)
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._model_lock = asyncio.Lock()
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client (the rollout calls this at the end of each run).

        A client made on another, finished event loop is dropped unclosed: its connections belong to that loop.
        """
        client, loop = self._client, self._loop
        self._client = None
        self._loop = None
        if client is not None and not client.is_closed and loop is asyncio.get_running_loop():
            await client.aclose()

    async def _send(self, method: str, path: str, payload: dict | None = None, *, retries: int | None = None):
        """The 200 answer's JSON (or its text when not JSON), retried by ``http_retry``; RequestFailed otherwise."""
        client = self._bind()

        async def attempt() -> httpx.Response:
            async with self._semaphore:
                self.requests_sent += 1
                return await arequest(client, method, path, payload, self.timeout.read)

        def count_retry() -> None:
            self.retries_done += 1

        response = await asend(attempt, retries=self.retries if retries is None else retries, backoff=self.backoff,
                               timeout=self.timeout, on_retry=count_retry)
        try:
            return response.json()
        except (ValueError, RecursionError):  # not JSON (nested past the interpreter's limit included)
            return response.text

    async def aserved_model(self, *, retries: int | None = None) -> dict:
        """The served model's ``GET /v1/models`` entry: the named model's, else the first listed."""
        entries = (await self._send("GET", "/v1/models", retries=retries))["data"]
        entry = next((entry for entry in entries if entry.get("id") == self.model), entries[0])
        if not isinstance(entry.get("id"), str) or not entry["id"].strip():  # a TypeError, as for a list of no models
            raise TypeError(f"the model's id is {entry.get('id')!r}, not a name")
        return entry

    async def amodel_name(self) -> str:
        """The served model's name: the one given, else the first of ``GET /v1/models``."""
        if self.model:
            return self.model
        self._bind()
        async with self._model_lock:
            if not self.model:
                self.model = (await self.aserved_model())["id"]
        return self.model

    def _run(self, make_coroutine):
        """Run ``make_coroutine()`` on a fresh event loop, closing the session after (for callers outside a loop)."""

        async def run():
            try:
                return await make_coroutine()
            finally:
                await self.aclose()

        return asyncio.run(run())

    def model_name(self) -> str:
        """Synchronous ``amodel_name`` (for callers outside an event loop)."""
        return self._run(self.amodel_name)

    def served_max_model_len(self, *, wait: float = 0.0, poll: float = 2.0) -> int | None:
        """The ``max_model_len`` the server reports for its model (None when it reports none).

        A server that does not answer yet is asked again every ``poll`` seconds for up to ``wait`` seconds (it may
        still be loading); after that, or for an answer that is not a model list, a RuntimeError says so.
        """
        deadline = time.monotonic() + wait
        while True:
            try:
                entry = self._run(lambda: self.aserved_model(retries=0))
                break
            except RequestFailed as exc:
                if not exc.retryable:
                    raise RuntimeError(f"Error: {self.base_url}/v1/models {exc}") from None
                if time.monotonic() + poll > deadline:
                    raise RuntimeError(f"Error: no vLLM server answers at {self.base_url}/v1/models "
                                       f"({exc.reason}); start one with make serve") from None
                time.sleep(poll)
            except (KeyError, IndexError, TypeError, AttributeError, StopIteration):
                raise RuntimeError(f"Error: {self.base_url}/v1/models does not list a model") from None
        return model_length(entry)

    # ---- requests ----------------------------------------------------------------------------------------------
    def request_body(self, model: str, prompt_ids, max_tokens: int, sampling: SamplingSettings, seed=None) -> dict:
        body = {
            "model": model,
            "prompt": list(prompt_ids),
            "n": 1,
            "max_tokens": max(1, int(max_tokens)),
            **sampling.engine_fields(),
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": list(self.stop_token_ids),
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = int(seed)
        body.update(self.extra_body)
        return body

    async def agenerate(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingSettings, seed: int | None = None
    ) -> TurnOutput:
        """One turn; never raises for server trouble: after the retries it answers finish "error"."""
        try:
            return await self.arequest_turn(prompt_ids, max_tokens, sampling, seed)
        except UnusableAnswer as exc:
            return TurnOutput.failed(exc.reason)
        except RequestFailed as exc:
            return TurnOutput.failed(f"{self.base_url}/v1/completions {exc}", unreachable=exc.retryable)

    async def arequest_turn(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingSettings, seed: int | None = None
    ) -> TurnOutput:
        """One turn, raising ``RequestFailed`` when the server could not answer it after the retries (its
        ``retryable`` is False when the server answered and refused), ``UnusableAnswer`` for an unreadable answer."""
        try:
            model = await self.amodel_name()
        except RequestFailed as exc:
            raise RequestFailed(f"could not read the model name from {self.base_url}/v1/models: {exc.reason}",
                                exc.attempts, exc.retryable) from None
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise UnusableAnswer(f"could not read the model name from {self.base_url}/v1/models: {exc}") from None
        body = self.request_body(model, prompt_ids, max_tokens, sampling, seed)
        answer = await self._send("POST", "/v1/completions", body)
        try:
            return self.parse_choice(answer["choices"][0], max_tokens)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise UnusableAnswer(f"unreadable completion from {self.base_url}: {exc!r}") from None

    def parse_choice(self, choice: dict, max_tokens: int) -> TurnOutput:
        """Token ids (``token_ids``, else the ``token_id:N`` strings) and ``token_logprobs`` of one choice; a ValueError
        for ids that are not whole numbers from 0 to ``max_token_id`` (the decode would fail, or read another token)."""
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            ids = [int(str(t).split(":", 1)[1]) for t in logprobs.get("tokens", [])]
        if not isinstance(ids, list) or any(type(t) is not int or not 0 <= t <= self.max_token_id for t in ids):
            raise ValueError(f"the completion's token ids are not whole numbers from 0 to {self.max_token_id}")
        values = logprobs.get("token_logprobs")
        if values is None or len(values) != len(ids):
            raise ValueError("the completion has no per-token logprobs (the request asks for logprobs: 0)")
        values = [float(v) if v is not None else 0.0 for v in values]
        return engine_turn(ids, values, choice.get("finish_reason"), max_tokens, self.stop_token_ids)

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        sampling: SamplingSettings,
        seeds: Sequence[int | None] | None = None,
    ) -> list[TurnOutput]:
        """A batch as concurrent requests (for callers that want turn-synchronous use of a server)."""
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)

        async def batch():
            return await asyncio.gather(
                *(self.agenerate(p, m, sampling, s) for p, m, s in zip(prompts, max_tokens, seeds))
            )

        return list(self._run(batch))
