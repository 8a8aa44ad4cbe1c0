"""Stand-ins for vLLM in tests: a loopback HTTP server answering like ``vllm serve`` and an object shaped like
``vllm.LLM`` (TRL_NOTES §12). Both sample through the same policy, so a scripted agent plays identically on either.

A policy is ``policy(prompt_ids, max_tokens) -> list[int]``: the whole turn the "model" would write, stop token
included. The engines cut it at ``max_tokens`` (finish "length", no stop token) or stop at the first stop id
(kept in ``token_ids``, finish "stop"), and give every sampled token a deterministic fake logprob.

The server also answers ``/v1/chat/completions`` with ``chat_reply`` (reasoning split off, as vLLM's reasoning parser
does), and lists its model in ``/v1/models`` with the ``max_model_len`` it was started with, as vLLM does.
``chat_reply`` may instead be a function ``body -> message``: the assistant message to answer, ``tool_calls``
included (OpenAI's and vLLM's function-calling wire format: ``finish_reason`` is then ``"tool_calls"``). Requests
that break that format's rules are answered 400 as OpenAI does: a ``tool`` message must answer a ``tool_call_id`` of
the assistant message before it, every call of that message must be answered, ``tools`` must be function
declarations.

The server's bad days are scripted per request with ``faults``: a status such as ``"500"``, ``"slow"`` (answers after
``slow_seconds``), ``"garbage"`` (a 200 with no choices). A refused connection is ``refused_url()``.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


def fake_logprob(token_id: int) -> float:
    return -0.05 * (1 + token_id % 13)


def turn_index(prompt_ids, im_start_id: int) -> int:
    """Which assistant turn a prompt asks for: system, user, assistant open 3 ``<|im_start|>``; each turn adds 2."""
    return max(0, (list(prompt_ids).count(im_start_id) - 3) // 2)


class ScriptedAgent:
    """Plays fixed assistant turns (text after the generation prompt), each closed with ``<|im_end|>``.

    Turns past the script repeat the last one. ``stop`` may be ``<|endoftext|>`` to exercise the other stop id.
    """

    def __init__(self, tokenizer, turns: list[str], stop: str = IM_END):
        self.im_start = tokenizer.convert_tokens_to_ids(IM_START)
        self.turn_ids = [
            list(tokenizer(t, add_special_tokens=False)["input_ids"]) + [tokenizer.convert_tokens_to_ids(stop)]
            for t in turns
        ]
        self.calls = 0

    def __call__(self, prompt_ids, max_tokens: int) -> list[int]:
        self.calls += 1
        return list(self.turn_ids[min(turn_index(prompt_ids, self.im_start), len(self.turn_ids) - 1)])


class RandomAgent:
    """Random tokens from the ordinary vocabulary, ending on a stop id with some probability, else running past
    ``max_tokens`` (a cut-off)."""

    def __init__(self, tokenizer, seed: int = 0, stop_prob: float = 0.5, length: tuple[int, int] = (3, 40)):
        self.rng = random.Random(seed)
        self.stops = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
        self.ordinary = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]
        self.stop_prob = stop_prob
        self.length = length
        self.lock = threading.Lock()

    def __call__(self, prompt_ids, max_tokens: int) -> list[int]:
        with self.lock:
            ids = [self.rng.choice(self.ordinary) for _ in range(self.rng.randint(*self.length))]
            if self.rng.random() < self.stop_prob:
                return ids + [self.rng.choice(self.stops)]
            while len(ids) <= max_tokens:
                ids.append(self.rng.choice(self.ordinary))
            return ids


class CompletionsGoodAgent:
    """A token-level agent for the vLLM fakes: reads the question from the prompt, runs the gold SQL, submits it."""

    def __init__(self, tokenizer, gold: dict[str, str]):
        self.tokenizer = tokenizer
        self.gold = gold
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, prompt_ids, max_tokens):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question = text.split("Question: ", 1)[1].split("\n", 1)[0].strip()
        tool = "run_query" if turn_index(prompt_ids, self.im_start) == 0 else "submit_sql"
        turn = ("I check the query first.\n</think>\n\n"
                + json.dumps({"tool": tool, "args": {"sql": self.gold[question]}}))
        return list(self.tokenizer(turn, add_special_tokens=False)["input_ids"]) + [self.im_end]


def engine_sample(policy, prompt_ids, max_tokens: int, stop_ids) -> tuple[list[int], list[float], str, int | None]:
    """(token_ids, logprobs, finish_reason, stop_reason) as vLLM reports them."""
    wanted = list(policy(list(prompt_ids), max_tokens))
    out, finish, stop_reason = [], "length", None
    for tid in wanted[:max_tokens]:
        out.append(tid)
        if tid in stop_ids:
            finish, stop_reason = "stop", tid
            break
    if finish == "length" and len(wanted) <= max_tokens:
        finish = "stop"  # the policy ended on its own without a stop id (like a stop string)
    return out, [fake_logprob(t) for t in out], finish, stop_reason


# ---------------------------------------------------------------------------------------------------- HTTP server


class FakeVLLMServer:
    """``with FakeVLLMServer(policy, stop_ids) as server: ...`` serves /health, /v1/models, /v1/completions and
    /v1/chat/completions."""

    def __init__(self, policy, stop_ids=(), *, model: str = "fake-model", faults=(), slow_seconds: float = 2.0,
                 max_model_len: int | None = 32768, chat_reply: tuple[str, str] = ("Thinking.", "The answer.")):
        self.policy = policy
        self.stop_ids = set(stop_ids)
        self.model = model
        self.faults = deque(faults)
        self.slow_seconds = slow_seconds
        self.max_model_len = max_model_len  # None: a server that does not report it
        self.chat_reply = chat_reply  # (reasoning_content, content)
        self.requests: list[dict] = []  # every completions body received
        self.chat_requests: list[dict] = []  # every chat completions body received
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeVLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def completions(self, body: dict) -> dict:
        prompts = body["prompt"]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        stop_ids = set(body.get("stop_token_ids") or []) | self.stop_ids
        choices = []
        for prompt in prompts:
            for _ in range(int(body.get("n", 1))):
                ids, lps, finish, stop_reason = engine_sample(self.policy, prompt, int(body["max_tokens"]), stop_ids)
                choices.append(
                    {
                        "index": len(choices),
                        "text": "",
                        "token_ids": ids,
                        "prompt_token_ids": list(prompt),
                        "finish_reason": finish,
                        "stop_reason": stop_reason,
                        "logprobs": {
                            "tokens": [f"token_id:{t}" for t in ids],
                            "token_logprobs": lps,
                            "top_logprobs": [None] * len(ids),
                        },
                    }
                )
        return {"id": "cmpl-fake", "object": "text_completion", "model": self.model, "choices": choices}

    def chat_completions(self, body: dict) -> dict:
        if callable(self.chat_reply):
            message = {"role": "assistant", **self.chat_reply(body)}
        else:
            reasoning, content = self.chat_reply
            message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": {}}

    def models(self) -> dict:
        entry = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model}
        if self.max_model_len is not None:
            entry["max_model_len"] = self.max_model_len
        return {"object": "list", "data": [entry]}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    self._send(200, fake.models())
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    return self._send(404, {"error": "not found"})
                chat = self.path == "/v1/chat/completions"
                with fake.lock:
                    (fake.chat_requests if chat else fake.requests).append(body)
                    fault = fake.faults.popleft() if fake.faults else None
                if fault and fault.isdigit():
                    return self._send(int(fault), {"error": "scripted failure"})
                if fault == "slow":
                    time.sleep(fake.slow_seconds)
                if fault == "garbage":
                    return self._send(200, {"unexpected": True})
                problem = tool_conversation_problem(body) if chat else None
                if problem:
                    return self._send(400, {"error": {"message": problem, "type": "invalid_request_error"}})
                self._send(200, fake.chat_completions(body) if chat else fake.completions(body))

        return Handler


def tool_conversation_problem(body: dict) -> str | None:
    """What makes a chat request invalid under the function-calling rules, or None."""
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not isinstance(tool.get("function", {}).get("name"), str):
            return "tools must be function declarations with a name"
    pending: list[str] = []
    for message in body.get("messages", []):
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return f"a tool message answers no pending tool call: {message.get('tool_call_id')!r}"
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            return f"tool calls without answers: {pending}"
        if role == "assistant":
            pending = [call["id"] for call in message.get("tool_calls") or []]
            for call in message.get("tool_calls") or []:
                if not isinstance(call.get("function", {}).get("arguments"), str):
                    return "tool call arguments must be a string"
    return f"tool calls without answers: {pending}" if pending else None


def refused_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------------- vllm.LLM shape


@dataclass
class FakeSamplingParams:
    """Keyword-compatible with the ``vllm.SamplingParams`` fields the colocate backend sets."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list = field(default_factory=list)
    skip_special_tokens: bool = True


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None = 1
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: list | None
    finish_reason: str | None
    stop_reason: int | None = None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list
    outputs: list


class FakeLLM:
    """``llm.generate(prompts=[{"prompt_token_ids": ids}], sampling_params=[...], use_tqdm=False)`` like vLLM's."""

    def __init__(self, policy, stop_ids=()):
        self.policy = policy
        self.stop_ids = set(stop_ids)
        self.calls: list[tuple[list, list]] = []  # (prompts, sampling params) of every generate call

    def generate(self, prompts, sampling_params=None, use_tqdm=True, **kwargs):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.calls.append((prompts, params))
        results = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            ids_in = prompt["prompt_token_ids"]
            ids, lps, finish, stop_reason = engine_sample(
                self.policy, ids_in, sp.max_tokens, set(sp.stop_token_ids or []) | self.stop_ids
            )
            steps = [{t: FakeLogprob(lp)} for t, lp in zip(ids, lps)] if sp.logprobs is not None else None
            out = FakeCompletionOutput(0, "", ids, sum(lps), steps, finish, stop_reason)
            results.append(FakeRequestOutput(str(i), list(ids_in), [out]))
        return results
