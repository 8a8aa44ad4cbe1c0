"""The ``chat`` endpoint mode: any OpenAI-compatible server's ``/v1/chat/completions``, as a text policy.

Every turn re-renders the conversation as chat messages: the initial system and user messages, then each earlier
assistant turn *without its thinking* (only the text after ``</think>``) and each observation as a user message.
Thinking is requested explicitly with ``chat_template_kwargs: {"enable_thinking": true}`` (vLLM and SGLang read it).
This is not the token stream the model was trained on (training keeps earlier thinking and never re-renders), so
results from this mode are labelled *not comparable* with the published figures. Use the ``completions`` mode on a
vLLM server for comparable numbers.

Requests go through ``http_retry``: one that fails to connect, times out, breaks off mid-answer, or meets 408/429/5xx
is retried with exponential backoff; after the last retry, or at once for another status, ``EndpointError`` is raised
with one clear ``Error:`` line (the evaluator keeps the finished results).
"""

from __future__ import annotations

import json

from t2s.backends.base import SamplingSettings
from t2s.backends.http_retry import RequestFailed, normalise_base_url, request, send, timeouts
from t2s.env.protocol import THINK_CLOSE
from t2s.env import turns
from t2s.env.turns import split_thinking


class EndpointError(RuntimeError):
    """The endpoint could not be reached, kept failing or answered nonsense; the message begins with ``Error:``.
    ``unreachable`` is True when the server did not answer (refused, timed out, 5xx after the retries); ``unusable``
    when it answered 200 with something that is no answer. Neither, when it answered and refused the request."""

    def __init__(self, message: str, *, unreachable: bool = False, unusable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable
        self.unusable = unusable


class ChatEndpointClient:
    """A small synchronous client for ``/v1/chat/completions`` with retries (thread-safe: one httpx client per call)."""

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 request_timeout: float = 600.0, retries: int = 3, backoff: float = 1.0,
                 enable_thinking: bool = True, extra_body: dict | None = None):
        self.base_url = normalise_base_url(base_url)
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.request_timeout = request_timeout
        self.retries = retries
        self.backoff = backoff
        self.enable_thinking = enable_thinking
        self.extra_body = dict(extra_body or {})

    def _call(self, method: str, path: str, payload: dict | None = None) -> dict:
        """The JSON answer of one request, retried by the policy of ``http_retry``; ``EndpointError`` otherwise."""
        url = self.base_url + path
        timeout = timeouts(self.request_timeout)
        try:
            response = send(lambda: request(method, url, payload, self.request_timeout, timeout=timeout,
                                            headers=self.headers), retries=self.retries, backoff=self.backoff,
                            timeout=timeout)
        except RequestFailed as exc:
            raise EndpointError(f"Error: {url} {exc}", unreachable=exc.retryable) from None
        try:
            return response.json()
        except (ValueError, RecursionError):
            raise EndpointError(f"Error: {url} answered 200 with a body that is not JSON", unusable=True) from None

    def model_name(self) -> str:
        """The served model: the one given, else the first of ``GET /v1/models``."""
        if not self.model:
            body = self._call("GET", "/v1/models")
            try:
                name = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                name = None
            if not isinstance(name, str) or not name.strip():
                raise EndpointError(f"Error: {self.base_url}/v1/models lists no model", unusable=True) from None
            self.model = turns.valid_text(name)
        return self.model

    def served_max_model_len(self) -> int | None:
        """The ``max_model_len`` that ``GET /v1/models`` states for the served model (vLLM's servers state one), or
        None where it states none or cannot be read."""
        from t2s.backends.vllm_server import model_length

        try:
            entries = self._call("GET", "/v1/models")["data"]
            entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == self.model), None)
        except (EndpointError, KeyError, TypeError):
            return None
        return model_length(entry)

    def request_body(self, messages: list[dict], max_tokens: int, sampling: SamplingSettings, seed=None,
                     tools: list[dict] | None = None) -> dict:
        body = {
            "model": self.model_name(),
            "messages": messages,
            **({"tools": tools} if tools else {}),
            "max_tokens": max(1, int(max_tokens)),
            **sampling.engine_fields(),
            "chat_template_kwargs": {"enable_thinking": self.enable_thinking},
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = int(seed)
        body.update(self.extra_body)
        return body

    def complete(self, messages: list[dict], max_tokens: int, sampling: SamplingSettings,
                 seed=None) -> tuple[str, str, dict]:
        """(assistant text as the model produced it after the generation prompt, finish reason, usage)."""
        message, finish, usage = self.complete_message(messages, max_tokens, sampling, seed)
        return assistant_text(message, self.enable_thinking), finish, usage

    def complete_message(self, messages: list[dict], max_tokens: int, sampling: SamplingSettings, seed=None,
                         tools: list[dict] | None = None) -> tuple[dict, str, dict]:
        """(``choices[0].message`` as the server answered it, finish reason, usage); ``tools`` declares functions."""
        body = self.request_body(messages, max_tokens, sampling, seed, tools)
        answer = self._call("POST", "/v1/chat/completions", body)
        try:
            choice = answer["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EndpointError(f"Error: {self.base_url}/v1/chat/completions answered without choices",
                                unusable=True) from None
        if not isinstance(message, dict):
            raise EndpointError(f"Error: {self.base_url}/v1/chat/completions answered a message that is no object",
                                unusable=True)
        return message, choice.get("finish_reason") or "stop", answer.get("usage") or {}


def message_text(value) -> str:
    """A message field as text: a string (lone surrogates as U+FFFD), the text parts of OpenAI's list of content
    parts, "" for none, and anything else as its JSON (a number where text belongs is what the server said, shown)."""
    if value is None:
        return ""
    if isinstance(value, list):
        parts = [part.get("text") if isinstance(part, dict) else part for part in value]
        return "".join(turns.valid_text(part) for part in parts if isinstance(part, str))
    if not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False, default=str)
    return turns.valid_text(value)


def assistant_text(message: dict, enable_thinking: bool = True) -> str:
    """The turn as the exec_plan parser reads it: ``thinking</think>body`` when the server split the reasoning off."""
    content = message_text(message.get("content"))
    reasoning = message_text(message.get("reasoning_content") or message.get("reasoning"))
    if reasoning:
        return f"{reasoning.strip()}\n{THINK_CLOSE}\n\n{content.lstrip()}"
    return content


def history_messages(episode) -> list[dict]:
    """The conversation so far, re-rendered: initial messages, then (assistant body, observation) pairs."""
    messages = [dict(m) for m in episode.messages]
    for turn in episode.turns:
        _, body, _ = split_thinking(turn["assistant"])
        messages.append({"role": "assistant", "content": body.strip()})
        if turn.get("observation"):
            messages.append({"role": "user", "content": turn["observation"]})
    return messages


class ChatEndpointPolicy:
    """``policy(episode) -> str`` for ``play.play``: one chat request per turn, earlier thinking dropped."""

    def __init__(self, client: ChatEndpointClient, sampling: SamplingSettings, *, seed: int | None = None):
        self.client = client
        self.sampling = sampling
        self.seed = seed
        self.turn_index = 0
        self.finish_reasons: list[str] = []

    def next_request(self, episode) -> tuple[int, int | None]:
        """(max_tokens, seed) of the next turn's request: each turn gets its own seed."""
        seed = None if self.seed is None else self.seed * 1009 + self.turn_index
        self.turn_index += 1
        return episode.next_max_tokens() or 1, seed

    def __call__(self, episode) -> str:
        max_tokens, seed = self.next_request(episode)
        text, finish, _ = self.client.complete(history_messages(episode), max_tokens, self.sampling, seed)
        self.finish_reasons.append(finish)
        return text
