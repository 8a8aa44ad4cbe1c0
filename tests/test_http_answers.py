"""How the endpoint clients read an answer (``t2s.backends.http_retry``): a server that sends its answer a byte at a
time is given up on once the whole answer has taken the request timeout, and an answer over ``MAX_ANSWER_BYTES`` is
refused at once, without a retry. Both clients: the chat endpoint's (synchronous) and the completions server's
(asyncio)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

from t2s.backends import http_retry
from t2s.backends.chat_endpoint import ChatEndpointClient, EndpointError
from t2s.backends.http_retry import RequestFailed
from t2s.backends.vllm_server import VLLMServerBackend

MODELS = json.dumps({"data": [{"id": "fake-model", "max_model_len": 4096}]}).encode()


class RawServer:
    """A loopback server answering every request with ``answer(connection)``, one thread per connection."""

    def __init__(self, answer):
        self.answer, self.requests = answer, 0
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.stopped = threading.Event()
        self.accepting = threading.Thread(target=self._serve, daemon=True)
        self.accepting.start()

    def _serve(self):
        while not self.stopped.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection):
        try:
            connection.recv(65536)
            self.answer(connection, self.stopped)
        except OSError:
            pass
        finally:
            connection.close()

    def close(self):
        """Stop accepting, then free the socket. The accepting thread is woken (``shutdown``) and waited for first:
        closed under a thread about to call ``accept``, the descriptor's number could go to the next test's server,
        and this server's thread would answer that server's requests with this server's answers."""
        self.stopped.set()
        self.socket.shutdown(socket.SHUT_RDWR)
        self.accepting.join(timeout=10)
        assert not self.accepting.is_alive(), "the accepting thread did not stop"
        self.socket.close()


def trickle(connection, stopped):
    """Headers at once, then a chunked body a byte every 0.1 s, for as long as the client listens."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    while not stopped.is_set():
        connection.sendall(b"1\r\n \r\n")
        time.sleep(0.1)


def trickled_headers(connection, stopped):
    """The status line and headers a byte every 0.1 s, for as long as the client listens."""
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 10_000:
        if stopped.is_set():
            return
        connection.sendall(bytes([byte]))
        time.sleep(0.1)


def whole(body: bytes):
    def answer(connection, stopped):
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    return answer


@pytest.fixture()
def server(request):
    made = []

    def start(answer):
        made.append(RawServer(answer))
        return made[-1]

    yield start
    with contextlib.ExitStack() as stack:  # every server is closed, also where one fails to close
        for one in made:
            stack.callback(one.close)


def _ends_within(call, seconds: float):
    """What ``call()`` raised, checked to have come within ``seconds`` (a hang fails the test, not the suite)."""
    outcome = []

    def run():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the exception is what the test looks at
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert outcome, f"still waiting after {seconds} s"
    return outcome[0], time.monotonic() - started


@pytest.mark.parametrize("answer", [trickle, trickled_headers], ids=["body", "headers"])
def test_a_trickled_answer_times_out_at_the_request_timeout(server, answer):
    slow = server(answer)
    chat = ChatEndpointClient(slow.url, request_timeout=1.0, retries=0)
    error, took = _ends_within(chat.model_name, 10)
    assert isinstance(error, EndpointError) and "timed out after 1 s" in str(error) and took < 5, (error, took)
    completions = VLLMServerBackend(slow.url, stop_ids=[0], request_timeout=1.0, retries=0)
    error, took = _ends_within(completions.model_name, 10)
    assert isinstance(error, RequestFailed) and "timed out after 1 s" in str(error) and took < 5, (error, took)


def test_an_answer_over_the_size_cap_is_refused_without_a_retry(server, monkeypatch):
    monkeypatch.setattr(http_retry, "MAX_ANSWER_BYTES", 10_000)
    big = server(whole(json.dumps({"data": [{"id": "x" * 20_000}]}).encode()))
    chat = ChatEndpointClient(big.url, request_timeout=5.0, retries=2, backoff=0.0)
    error, _ = _ends_within(chat.model_name, 10)
    assert isinstance(error, EndpointError) and "longer than 10,000 bytes" in str(error) and "1 attempt" in str(error)
    assert big.requests == 1
    completions = VLLMServerBackend(big.url, stop_ids=[0], request_timeout=5.0, retries=2, backoff=0.0)
    error, _ = _ends_within(completions.model_name, 10)
    assert isinstance(error, RequestFailed) and "longer than 10,000 bytes" in str(error) and big.requests == 2
    fine = server(whole(MODELS))
    assert ChatEndpointClient(fine.url, request_timeout=5.0).model_name() == "fake-model"
    assert VLLMServerBackend(fine.url, stop_ids=[0], request_timeout=5.0).model_name() == "fake-model"


# ------------------------------------------------------------------------------------ answers of the wrong shape
def _received(connection) -> bytes:
    """The next bytes of a request; an OSError where the client hung up before sending all of it."""
    chunk = connection.recv(65536)
    if not chunk:
        raise ConnectionResetError("the client hung up")
    return chunk


class ModelsOrPost(RawServer):
    """``GET /v1/models`` answers ``models``; a POST answers ``post``."""

    def __init__(self, models, post):
        self.models, self.post = models, post
        super().__init__(None)

    def _one(self, connection):
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                head += _received(connection)
            header, _, rest = head.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:
                rest += _received(connection)
            body = json.dumps(self.models if header.startswith(b"GET") else self.post).encode()
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                               + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            connection.close()


@pytest.fixture()
def answers(request):
    made = []

    def start(models, post):
        made.append(ModelsOrPost(models, post))
        return made[-1]

    yield start
    with contextlib.ExitStack() as stack:  # every server is closed, also where one fails to close
        for one in made:
            stack.callback(one.close)


MODEL_LIST = {"data": [{"id": "fake-model", "max_model_len": 4096}]}


@pytest.mark.parametrize("completion", [
    {"choices": "abc"}, {"choices": [[1, 2]]}, {"choices": [5]},
    {"choices": [{"token_ids": [1, 2], "logprobs": [1, 2]}]},
    {"choices": [{"token_ids": [10 ** 30], "logprobs": {"token_logprobs": [0.0]}}]},
    {"choices": [{"token_ids": [-5], "logprobs": {"token_logprobs": [0.0]}}]},
    {"choices": [{"token_ids": [1.5], "logprobs": {"token_logprobs": [0.0]}}]},
    {"choices": [{"token_ids": [2 ** 31], "logprobs": {"token_logprobs": [0.0]}}]},
], ids=["choices-text", "choice-list", "choice-number", "logprobs-list", "id-huge", "id-negative", "id-fraction",
        "id-past-32-bits"])
def test_a_completion_of_the_wrong_shape_is_a_failed_turn(answers, completion):
    from t2s.backends.base import SamplingSettings

    server = answers(MODEL_LIST, completion)
    backend = VLLMServerBackend(server.url, stop_ids=[0], request_timeout=5.0, retries=0)
    [turn] = backend.generate([[1, 2, 3]], [4], SamplingSettings())
    assert turn.finish_reason == "error" and turn.error.startswith("Error: unreadable completion"), turn


def test_an_id_in_a_padded_vocabulary_is_kept(answers):
    """A model's embedding may be padded past its tokenizer (Qwen's), and the server may sample an id there: the turn
    keeps it, as training would."""
    from t2s.backends.base import SamplingSettings

    server = answers(MODEL_LIST, {"choices": [{"token_ids": [151_700, 0], "finish_reason": "stop",
                                               "logprobs": {"token_logprobs": [-9.0, -0.1]}}]})
    backend = VLLMServerBackend(server.url, stop_ids=[0], request_timeout=5.0, retries=0)
    [turn] = backend.generate([[1, 2, 3]], [4], SamplingSettings())
    assert turn.finish_reason == "stop" and turn.token_ids == [151_700, 0], turn


@pytest.mark.parametrize("length", [1e400, float("nan"), -3, True, "4096"])
def test_a_max_model_len_that_is_not_a_length_is_reported_as_none(answers, length):
    server = answers({"data": [{"id": "fake-model", "max_model_len": length}]}, {})
    backend = VLLMServerBackend(server.url, stop_ids=[0], request_timeout=5.0, retries=0)
    assert backend.served_max_model_len() is None


def test_a_model_id_that_is_not_a_name_is_one_error(answers):
    server = answers({"data": [{"id": 123}]}, {})
    with pytest.raises(EndpointError, match="lists no model"):
        ChatEndpointClient(server.url, request_timeout=5.0, retries=0).model_name()
    with pytest.raises(TypeError, match="not a name"):
        VLLMServerBackend(server.url, stop_ids=[0], request_timeout=5.0, retries=0).model_name()


def test_message_fields_of_any_type_are_read_as_text():
    from t2s.backends.chat_endpoint import assistant_text
    from t2s.backends.tools_endpoint import read_message

    assert assistant_text({"content": "SELECT 1", "reasoning_content": 42}) == "42\n</think>\n\nSELECT 1"
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, "b", 7]
    assert assistant_text({"content": parts}, enable_thinking=False) == "ab"
    assert assistant_text({"content": 12345}) == "12345"
    assert assistant_text({"content": "x\ud800y"}) == "x\ufffdy"
    call = {"function": {"name": "run_query", "arguments": '{"sql": "SELECT \\ud800"}'}}
    parsed, history = read_message({"content": parts, "tool_calls": [call]}, enable_thinking=False)
    assert parsed.calls[0].args == {"sql": "SELECT \ufffd"}
    json.dumps(parsed.text).encode("utf-8")  # a record of it can be written
    assert "\ud800" not in json.dumps(history, ensure_ascii=False)


@pytest.mark.parametrize("retries, backoff", [(5000, 0.0), (5000, 1.0), (1, 1e300), (12, 2.0)])
def test_the_wait_before_a_retry_is_capped_whatever_the_retries_and_backoff(retries, backoff):
    """backoff x 2^n overflowed inside tenacity (a traceback, "timestamp out of range") and grew past any useful wait
    (--retries 12: 4096 s before the last try): every wait is at most MAX_RETRY_WAIT_S."""
    import tenacity

    from t2s.backends.http_retry import MAX_RETRY_WAIT_S, _policy

    wait = _policy(retries, backoff, None)["wait"]
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    for attempt in (1, 2, 13, retries, retries + 1):
        state.attempt_number = attempt
        assert 0 <= wait(state) <= MAX_RETRY_WAIT_S
