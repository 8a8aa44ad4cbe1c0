"""vLLM server: each episode is its own async chain of ``POST /v1/completions`` requests (token ids in and out).

Every rank talks to the server itself (never TRL's collective ``VLLMGeneration.generate``); TRL syncs the weights
before the rollout. Requests carry token-id prompts, ``return_token_ids``, ``return_tokens_as_token_ids``,
``logprobs: 0`` (the sampled token's logprob), both stop ids and a per-turn ``max_tokens``. A semaphore caps the
requests in flight. A request that times out, meets a 5xx/429 or a refused connection is retried with exponential
backoff; after the last retry the turn comes back with finish "error" and the episode ends cleanly.

The same client serves ``eval --policy endpoint --endpoint-mode completions`` against any vLLM server:
``VLLMServerBackend(base_url, tokenizer)`` reads the model name from ``/v1/models`` when none is given.
``served_max_model_len`` reads the context length vLLM reports there, for start-up checks.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Sequence

from t2s.backends.base import SamplingSettings, TurnOutput, engine_turn, stop_token_ids

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class VLLMServerBackend:
    """An aiohttp client for a vLLM server's completions endpoint; usable from any event loop, one at a time."""

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
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.model = model
        self.stop_token_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
        self.max_concurrency = max_concurrency
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra_body = dict(extra_body or {})
        self._loop = None
        self._session = None
        self._semaphore: asyncio.Semaphore | None = None
        self._model_lock: asyncio.Lock | None = None
        self.requests_sent = 0
        self.retries_done = 0

    # ---- session, bound to the running loop ------------------------------------------------------------------
    def _bind(self):
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._session is None or self._session.closed:
            self._loop = loop
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=self.connect_timeout),
                headers=self.headers,
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._model_lock = asyncio.Lock()
        return self._session

    async def aclose(self) -> None:
        """Close the HTTP session (the rollout calls this at the end of each run)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
        self._loop = None

    async def aserved_model(self) -> dict:
        """The served model's ``GET /v1/models`` entry: the named model's, else the first listed."""
        session = self._bind()
        status, body = await self._request(session, "GET", "/v1/models", None)
        if status != 200:
            raise RuntimeError(f"Error: {self.base_url}/v1/models answered {status}: {str(body)[:200]}")
        entries = body["data"]
        return next((entry for entry in entries if entry.get("id") == self.model), entries[0])

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
        import aiohttp

        deadline = time.monotonic() + wait
        while True:
            try:
                entry = self._run(self.aserved_model)
                break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                if time.monotonic() + poll > deadline:
                    raise RuntimeError(f"Error: no vLLM server answers at {self.base_url}/v1/models "
                                       f"({type(exc).__name__}); start one with make serve") from None
                time.sleep(poll)
            except (KeyError, IndexError, TypeError, AttributeError, StopIteration):
                raise RuntimeError(f"Error: {self.base_url}/v1/models does not list a model") from None
        length = entry.get("max_model_len") if isinstance(entry, dict) else None
        return int(length) if isinstance(length, (int, float)) and not isinstance(length, bool) else None

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

    async def _request(self, session, method: str, path: str, payload: dict | None):
        async with session.request(method, self.base_url + path, json=payload) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except json.JSONDecodeError:
                return response.status, text

    async def agenerate(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingSettings, seed: int | None = None
    ) -> TurnOutput:
        """One turn; never raises for server trouble: after the retries it answers finish "error"."""
        import aiohttp

        session = self._bind()
        try:
            model = await self.amodel_name()
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError, KeyError, IndexError, TypeError) as exc:
            return TurnOutput.failed(f"could not read the model name from {self.base_url}/v1/models: {exc!r}")
        body = self.request_body(model, prompt_ids, max_tokens, sampling, seed)
        last_error = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                self.retries_done += 1
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                async with self._semaphore:
                    self.requests_sent += 1
                    status, answer = await self._request(session, "POST", "/v1/completions", body)
            except asyncio.TimeoutError:
                last_error = f"request timed out after {self.request_timeout:g} s"
                continue
            except aiohttp.ClientError as exc:
                last_error = f"connection failed: {exc}"
                continue
            if status == 200:
                try:
                    return self.parse_choice(answer["choices"][0], max_tokens)
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    return TurnOutput.failed(f"unreadable completion from {self.base_url}: {exc!r}")
            last_error = f"server answered {status}: {str(answer)[:300]}"
            if status not in RETRY_STATUSES:
                break
        return TurnOutput.failed(f"{self.base_url}/v1/completions failed after {attempt + 1} attempt(s): {last_error}")

    def parse_choice(self, choice: dict, max_tokens: int) -> TurnOutput:
        """Token ids (``token_ids``, else the ``token_id:N`` strings) and ``token_logprobs`` of one choice."""
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            ids = [int(str(t).split(":", 1)[1]) for t in logprobs.get("tokens", [])]
        values = logprobs.get("token_logprobs")
        if values is None or len(values) != len(ids):
            raise ValueError("the completion has no per-token logprobs (the request asks for logprobs: 0)")
        values = [float(v) if v is not None else 0.0 for v in values]
        return engine_turn([int(t) for t in ids], values, choice.get("finish_reason"), max_tokens, self.stop_token_ids)

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
