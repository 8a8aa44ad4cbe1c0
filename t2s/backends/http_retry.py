"""The one HTTP retry policy of the endpoint clients: httpx carries the requests, tenacity retries them.

An attempt is retried when it cannot connect, times out, breaks off mid-answer (any ``httpx.RequestError``) or
meets a status in ``RETRY_STATUSES``; the wait before retry ``i`` (1-based) is ``backoff * 2 ** (i - 1)`` seconds.
Any other status is final at once. ``send`` (synchronous) and ``asend`` (asyncio) return the first 200 response or
raise ``RequestFailed``, whose ``reason`` says how the last attempt failed and ``attempts`` how many were made.

An attempt made by ``request``/``arequest`` times out once the whole request, headers and body, has taken longer
than the request timeout (httpx's own timeouts bound each read, so a server sending a byte a second would never time
out), and reads its answer as it streams in, stopping without a retry at ``MAX_ANSWER_BYTES``. ``request`` runs the
attempt on an asyncio client of its own, since only a coroutine can be stopped in the middle of a read.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Awaitable, Callable

import httpx
import tenacity

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # far above any completion's answer (a turn's tokens, ids and logprobs)


class AnswerTooLarge(Exception):
    """An answer longer than ``MAX_ANSWER_BYTES`` (final: not retried)."""


class StatusError(Exception):
    """An answer other than 200 (retried when its status is in ``RETRY_STATUSES``)."""

    def __init__(self, response: httpx.Response):
        super().__init__(response.status_code)
        self.response = response


class RequestFailed(Exception):
    """Every attempt failed; ``str()`` is ``failed after N attempt(s): <how the last one failed>``.

    ``retryable`` is False when the last answer was a status that is never retried (the server is up but refuses).
    """

    def __init__(self, reason: str, attempts: int, retryable: bool):
        super().__init__(f"failed after {attempts} attempt(s): {reason}")
        self.reason = reason
        self.attempts = attempts
        self.retryable = retryable


class UnusableAnswer(RequestFailed):
    """The server answered 200 with something that is no answer (not the API's shape, token ids that are no token
    ids). Not retried on that server; ``retryable``, since another server of the model may answer it (``server_pool``,
    which takes a server out after a few in a row)."""

    def __init__(self, reason: str):
        super().__init__(reason, 1, True)


def normalise_base_url(url: str) -> str:
    """The server's root: ``http://host:port/v1/`` becomes ``http://host:port``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def timeouts(request_timeout: float, connect_timeout: float | None = None) -> httpx.Timeout:
    """``request_timeout`` for each read, write and pool wait; ``connect_timeout`` (default the same) to connect."""
    return httpx.Timeout(request_timeout, connect=request_timeout if connect_timeout is None else connect_timeout)


def request(method: str, url: str, payload, seconds: float, *, timeout: httpx.Timeout,
            headers: dict) -> httpx.Response:
    """One attempt from synchronous code: ``arequest`` on a client and event loop of its own."""

    async def attempt() -> httpx.Response:
        async with httpx.AsyncClient(timeout=timeout, headers=headers, verify=_tls()) as client:
            return await arequest(client, method, url, payload, seconds)

    return asyncio.run(attempt())


@functools.cache
def _tls():
    """One TLS context, httpx's default, for every client ``request`` makes (building one reads the certificate store:
    most of the cost of a client)."""
    return httpx.create_ssl_context()


async def arequest(client: httpx.AsyncClient, method: str, url: str, payload, seconds: float) -> httpx.Response:
    """One attempt: the whole answer, headers included, within ``seconds``, at most ``MAX_ANSWER_BYTES``."""

    async def read() -> httpx.Response:
        chunks, size = [], 0
        async with client.stream(method, url, json=payload) as response:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise AnswerTooLarge(f"its answer is longer than {MAX_ANSWER_BYTES:,} bytes")
                chunks.append(chunk)
        # the body is decoded already: without the headers that say how it was sent
        headers = {key: value for key, value in response.headers.items()
                   if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")}
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks),
                              request=response.request)

    try:
        return await asyncio.wait_for(read(), seconds)
    except asyncio.TimeoutError:
        raise httpx.ReadTimeout(f"the answer took longer than {seconds:g} s") from None


def _retried(exc: BaseException) -> bool:
    if isinstance(exc, StatusError):
        return exc.response.status_code in RETRY_STATUSES
    return isinstance(exc, httpx.RequestError)


def _reason(exc: BaseException, timeout: httpx.Timeout) -> str:
    if isinstance(exc, StatusError):
        return f"answered {exc.response.status_code}: {exc.response.text[:300]}"
    if isinstance(exc, httpx.ConnectTimeout):
        return f"connection failed (timed out after {timeout.connect:g} s)"
    if isinstance(exc, AnswerTooLarge):
        return str(exc)
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout.read:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"connection failed ({exc})"
    return f"request failed ({type(exc).__name__}: {exc})"


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code != 200:
        raise StatusError(response)
    return response


MAX_RETRY_WAIT_S = 300.0  # the longest wait before a retry: backoff x 2^n grows past any useful wait (and time_t)


def _policy(retries: int, backoff: float, on_retry: Callable[[], None] | None) -> dict:
    return dict(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=tenacity.wait_exponential(multiplier=backoff, max=MAX_RETRY_WAIT_S),
        retry=tenacity.retry_if_exception(_retried),
        before_sleep=(lambda state: on_retry()) if on_retry else None,
        reraise=True,
    )


def send(attempt: Callable[[], httpx.Response], *, retries: int, backoff: float, timeout: httpx.Timeout,
         on_retry: Callable[[], None] | None = None) -> httpx.Response:
    """``attempt()`` (one request) until it answers 200, at most ``retries + 1`` times."""
    count = [0]

    def once():
        count[0] += 1
        return _checked(attempt())

    try:
        return tenacity.Retrying(**_policy(retries, backoff, on_retry))(once)
    except (StatusError, httpx.RequestError, AnswerTooLarge) as exc:
        raise RequestFailed(_reason(exc, timeout), count[0], _retried(exc)) from None


async def asend(attempt: Callable[[], Awaitable[httpx.Response]], *, retries: int, backoff: float,
                timeout: httpx.Timeout, on_retry: Callable[[], None] | None = None) -> httpx.Response:
    """``await attempt()`` (one request) until it answers 200, at most ``retries + 1`` times."""
    count = [0]

    async def once():
        count[0] += 1
        return _checked(await attempt())

    try:
        return await tenacity.AsyncRetrying(**_policy(retries, backoff, on_retry))(once)
    except (StatusError, httpx.RequestError, AnswerTooLarge) as exc:
        raise RequestFailed(_reason(exc, timeout), count[0], _retried(exc)) from None
