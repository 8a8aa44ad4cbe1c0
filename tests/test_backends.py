"""Generation backends: the vLLM server client against a loopback fake (good and bad days), vLLM colocate against
an object shaped like ``vllm.LLM``, and transformers generate on the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time

import pytest

from t2s.backends.base import SamplingSettings, TurnOutput, finish_turn, stop_token_ids
from t2s.backends.vllm_colocate import VLLMColocateBackend
from t2s.backends.vllm_server import VLLMServerBackend
from tests.fake_vllm import FakeLLM, FakeSamplingParams, FakeVLLMServer, fake_logprob, refused_url


@pytest.fixture(scope="module")
def stops(tiny_tokenizer):
    return stop_token_ids(tiny_tokenizer)


def fixed(ids):
    """A policy that always writes ``ids``."""
    return lambda prompt, max_tokens: list(ids)


def one_turn(backend, prompt, max_tokens=16, sampling=None):
    return backend.generate([prompt], [max_tokens], sampling or SamplingSettings())[0]


def test_stop_ids_are_im_end_then_endoftext(tiny_tokenizer, stops):
    assert stops == [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"),
                     tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")]


def test_finish_turn_cuts_at_first_stop_or_limit():
    assert finish_turn([5, 6, 1, 7], [-1, -2, -3, -4], 10, [1, 2]) == TurnOutput([5, 6, 1], [-1, -2, -3], "stop", 1)
    assert finish_turn([5, 6, 7, 8], [-1.0] * 4, 3, [1, 2]) == TurnOutput([5, 6, 7], [-1.0] * 3, "length", None)
    assert finish_turn([5, 6, 2], [-1.0] * 3, 2, [1, 2]).finish_reason == "length"  # the stop lies past the limit


# ---------------------------------------------------------------------------------------------------- server


@pytest.mark.timeout(30)
def test_server_good_answer_and_request_body(stops):
    with FakeVLLMServer(fixed([11, 12, stops[0]]), model="served-name") as server:
        backend = VLLMServerBackend(server.base_url + "/v1", stop_ids=stops, retries=0)
        sampling = SamplingSettings(temperature=0.7)
        out = backend.generate([[3, 4, 5], [6]], [8, 8], sampling, seeds=[7, None])
    assert [o.token_ids for o in out] == [[11, 12, stops[0]]] * 2
    assert out[0].logprobs == [fake_logprob(t) for t in (11, 12, stops[0])]
    assert out[0].finish_reason == "stop" and out[0].stop_token_id == stops[0]
    bodies = sorted(server.requests, key=lambda b: len(b["prompt"]), reverse=True)
    body = bodies[0]
    assert body["model"] == "served-name"  # read from /v1/models
    assert body["prompt"] == [3, 4, 5] and body["n"] == 1 and body["max_tokens"] == 8
    assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert body["stop_token_ids"] == stops and body["temperature"] == 0.7 and body["top_k"] == -1
    assert body["seed"] == 7 and "seed" not in bodies[1]


SAMPLINGS = [
    SamplingSettings.training(),
    SamplingSettings.evaluation(seed=4),
    SamplingSettings(temperature=0.8, top_p=0.9, top_k=5, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.25,
                     repetition_penalty=1.1, seed=2),
]


def _expected_sampling(sampling: SamplingSettings) -> dict:
    """Every SamplingSettings field but the seed, as vLLM names it (top-k off is -1)."""
    fields = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(SamplingSettings) if f.name != "seed"}
    assert {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "top_k"} <= set(fields)
    return {**fields, "top_k": sampling.top_k if sampling.top_k > 0 else -1}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["training", "evaluation", "custom"])
def test_every_sampling_field_is_sent_in_server_and_chat_modes(stops, sampling):
    """A field left out is filled by vLLM from the checkpoint's generation_config.json: none may be left out."""
    from t2s.backends.chat_endpoint import ChatEndpointClient

    expected = _expected_sampling(sampling)
    with FakeVLLMServer(fixed([11, stops[0]])) as server:
        VLLMServerBackend(server.base_url, stop_ids=stops, retries=0).generate([[3, 4]], [8], sampling, [sampling.seed])
        client = ChatEndpointClient(server.base_url, retries=0)
        text, finish, _ = client.complete([{"role": "user", "content": "Which tables?"}], 8, sampling, sampling.seed)
    assert text.endswith("The answer.") and finish == "stop"
    for body in (server.requests[0], server.chat_requests[0]):
        assert {key: body.get(key, "missing") for key in expected} == expected
        assert body.get("seed") == sampling.seed
    # the colocate engine gets the same fields in its SamplingParams
    params = VLLMColocateBackend(FakeLLM(fixed([1])), stop_ids=stops, sampling_params_cls=FakeSamplingParams
                                 ).sampling_params(8, sampling, sampling.seed)
    assert {key: getattr(params, key) for key in expected} == expected


@pytest.mark.timeout(30)
@pytest.mark.parametrize("reported", [16384, None])
def test_server_reports_its_max_model_len(stops, reported):
    with FakeVLLMServer(fixed([1]), max_model_len=reported, model="m") as server:
        assert VLLMServerBackend(server.base_url, stop_ids=stops).served_max_model_len() == reported


@pytest.mark.timeout(30)
def test_server_max_model_len_of_a_dead_server_is_one_error_line(stops):
    with pytest.raises(RuntimeError, match=r"^Error: no vLLM server answers at http://127\.0\.0\.1:\d+/v1/models"):
        VLLMServerBackend(refused_url(), stop_ids=stops).served_max_model_len(wait=0.2, poll=0.1)


@pytest.mark.timeout(30)
def test_server_length_finish_without_stop_token(stops):
    with FakeVLLMServer(fixed(list(range(20, 40)))) as server:
        out = one_turn(VLLMServerBackend(server.base_url, stop_ids=stops), [1, 2], max_tokens=5)
    assert out.token_ids == [20, 21, 22, 23, 24] and out.finish_reason == "length" and out.stop_token_id is None
    assert len(out.logprobs) == 5


@pytest.mark.timeout(30)
def test_server_500s_are_retried(stops):
    with FakeVLLMServer(fixed([9, stops[1]]), faults=["500", "503"]) as server:
        backend = VLLMServerBackend(server.base_url, stop_ids=stops, retries=3, backoff=0.01)
        out = one_turn(backend, [1, 2])
    assert out.finish_reason == "stop" and out.stop_token_id == stops[1]
    assert len(server.requests) == 3 and backend.retries_done == 2


@pytest.mark.timeout(30)
def test_server_500s_past_the_retries_end_as_error(stops):
    with FakeVLLMServer(fixed([9, stops[0]]), faults=["500"] * 10) as server:
        out = one_turn(VLLMServerBackend(server.base_url, stop_ids=stops, retries=2, backoff=0.01), [1])
    assert out.finish_reason == "error" and out.token_ids == [] and "500" in out.error
    assert out.error.startswith("Error:") and len(server.requests) == 3


@pytest.mark.timeout(30)
def test_server_slow_answer_times_out_then_retry_succeeds(stops):
    with FakeVLLMServer(fixed([9, stops[0]]), faults=["slow"], slow_seconds=3.0) as server:
        backend = VLLMServerBackend(server.base_url, stop_ids=stops, request_timeout=0.5, retries=1, backoff=0.01)
        started = time.monotonic()
        out = one_turn(backend, [1])
    assert out.finish_reason == "stop" and out.token_ids == [9, stops[0]]
    assert time.monotonic() - started < 2.5  # did not wait for the slow answer


@pytest.mark.timeout(30)
def test_server_always_slow_ends_as_error(stops):
    with FakeVLLMServer(fixed([9, stops[0]]), faults=["slow"] * 3, slow_seconds=3.0) as server:
        backend = VLLMServerBackend(server.base_url, stop_ids=stops, request_timeout=0.3, retries=1, backoff=0.01)
        out = one_turn(backend, [1])
    assert out.finish_reason == "error" and "timed out" in out.error


@pytest.mark.timeout(30)
def test_server_refused_connection_ends_as_error(stops):
    backend = VLLMServerBackend(refused_url(), stop_ids=stops, model="m", retries=2, backoff=0.01)
    out = one_turn(backend, [1])
    assert out.finish_reason == "error" and "connection failed" in out.error and backend.requests_sent == 3


@pytest.mark.timeout(30)
def test_server_refused_without_model_name_ends_as_error(stops):
    out = one_turn(VLLMServerBackend(refused_url(), stop_ids=stops, retries=0), [1])
    assert out.finish_reason == "error" and "/v1/models" in out.error


@pytest.mark.timeout(30)
def test_server_unreadable_answer_is_an_error(stops):
    with FakeVLLMServer(fixed([9]), faults=["garbage"]) as server:
        out = one_turn(VLLMServerBackend(server.base_url, stop_ids=stops, retries=0), [1])
    assert out.finish_reason == "error" and "unreadable" in out.error


@pytest.mark.timeout(30)
def test_server_concurrency_limit(stops):
    in_flight, peak = [0], [0]

    def slow_policy(prompt, max_tokens):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.05)
        in_flight[0] -= 1
        return [5, stops[0]]

    with FakeVLLMServer(slow_policy) as server:
        backend = VLLMServerBackend(server.base_url, stop_ids=stops, max_concurrency=2, model="m")
        outs = backend.generate([[i] for i in range(8)], [4] * 8, SamplingSettings())
    assert all(o.finish_reason == "stop" for o in outs)
    assert peak[0] <= 2


@pytest.mark.timeout(30)
def test_server_model_name_and_reuse_across_loops(stops):
    with FakeVLLMServer(fixed([5, stops[0]]), model="my-model") as server:
        backend = VLLMServerBackend(server.base_url, stop_ids=stops)
        assert backend.model_name() == "my-model"
        for _ in range(2):  # a fresh event loop each time: the session is rebuilt, not reused across loops
            out = asyncio.run(backend.agenerate([1, 2], 4, SamplingSettings()))
            assert out.token_ids == [5, stops[0]]
            asyncio.run(backend.aclose())


# ------------------------------------------------------------------------------------ one retry policy, one client


def _chat_turn(url, retries):
    """One chat-mode turn: (error line or None, finish reason or None)."""
    from t2s.backends.chat_endpoint import ChatEndpointClient, EndpointError

    try:
        _, finish, _ = ChatEndpointClient(url, model="m", retries=retries, backoff=0.01).complete(
            [{"role": "user", "content": "Which tables?"}], 8, SamplingSettings())
    except EndpointError as exc:
        return str(exc), None
    return None, finish


def _completions_turn(url, retries, stops):
    out = one_turn(VLLMServerBackend(url, stop_ids=stops, model="m", retries=retries, backoff=0.01), [1])
    return out.error, out.finish_reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_both_endpoint_clients_share_one_retry_policy(stops, mode):
    """408, 429 and 5xx are retried and other statuses are final at once, with one error shape in both modes."""

    def turn(server, retries):
        if mode == "chat":
            return _chat_turn(server.base_url, retries)
        return _completions_turn(server.base_url, retries, stops)

    with FakeVLLMServer(fixed([9, stops[0]]), faults=["408", "429", "502", "503", "504"]) as server:
        assert turn(server, 5) == (None, "stop")
        assert len(server.requests) + len(server.chat_requests) == 6
    with FakeVLLMServer(fixed([9, stops[0]]), faults=["404", "500"]) as server:
        error, finish = turn(server, 5)
        assert len(server.requests) + len(server.chat_requests) == 1  # a 404 is not retried
    assert (finish in (None, "error") and error.startswith("Error: ")
            and "failed after 1 attempt(s): answered 404" in error)
    with FakeVLLMServer(fixed([9, stops[0]]), faults=["429"] * 3) as server:
        error, _ = turn(server, 2)
    assert "failed after 3 attempt(s): answered 429" in error


@pytest.mark.timeout(120)
def test_endpoint_clients_need_neither_aiohttp_nor_requests(stops, tmp_path):
    """Both modes run on httpx alone: with aiohttp and requests unimportable a turn still completes."""
    import subprocess
    import sys

    script = tmp_path / "turns.py"
    script.write_text(
        "import sys\n"
        "sys.modules['aiohttp'] = sys.modules['requests'] = None  # any import of them now fails\n"
        "from t2s.backends.base import SamplingSettings\n"
        "from t2s.backends.chat_endpoint import ChatEndpointClient\n"
        "from t2s.backends.vllm_server import VLLMServerBackend\n"
        "url, stop = sys.argv[1], int(sys.argv[2])\n"
        "out = VLLMServerBackend(url, stop_ids=[stop], retries=0).generate([[1]], [4], SamplingSettings())[0]\n"
        "text, finish, _ = ChatEndpointClient(url, retries=0).complete([{'role': 'user', 'content': 'q'}], 4,"
        " SamplingSettings())\n"
        "print(out.token_ids, out.finish_reason, finish, text.endswith('The answer.'))\n"
    )
    with FakeVLLMServer(fixed([9, stops[0]])) as server:
        done = subprocess.run([sys.executable, str(script), server.base_url, str(stops[0])], capture_output=True,
                              text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[9,", f"{stops[0]}]", "stop", "stop", "True"]


# ---------------------------------------------------------------------------------------------------- colocate


def test_colocate_per_request_sampling_params(stops):
    llm = FakeLLM(lambda prompt, m: [100 + len(prompt)] * 3 + [stops[1]])
    backend = VLLMColocateBackend(llm, stop_ids=stops, sampling_params_cls=FakeSamplingParams)
    outs = backend.generate([[1, 2], [3]], [10, 2], SamplingSettings(temperature=0.6, top_p=0.95, top_k=20), [4, 5])
    prompts, params = llm.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [p.max_tokens for p in params] == [10, 2] and [p.seed for p in params] == [4, 5]
    assert all(p.logprobs == 0 and p.stop_token_ids == stops and p.n == 1 for p in params)
    assert (params[0].temperature, params[0].top_p, params[0].top_k) == (0.6, 0.95, 20)
    assert outs[0].token_ids == [102, 102, 102, stops[1]] and outs[0].stop_token_id == stops[1]
    assert outs[0].logprobs == [fake_logprob(t) for t in outs[0].token_ids]
    assert outs[1].token_ids == [101, 101] and outs[1].finish_reason == "length"


def test_colocate_sleep_mode_wakes_for_a_rollout_and_sleeps_after(stops):
    """vllm_enable_sleep_mode: TRL leaves the KV cache asleep after its weight sync; a rollout wakes it once, re-pushes
    weights that level-2 sleep discarded, and end_rollout puts the engine back to sleep."""
    from types import SimpleNamespace

    events = []

    class SleepyLLM(FakeLLM):
        def generate(self, prompts, sampling_params=None, use_tqdm=True, **kw):
            events.append("generate")
            return super().generate(prompts, sampling_params, use_tqdm)

        def wake_up(self, tags=None):
            events.append(("wake_up", tuple(tags)))

        def sleep(self, level=1):
            events.append(("sleep", level))

    generation = SimpleNamespace(enable_sleep_mode=True, _llm_weights_sleeping=True,
                                 sync_weights=lambda: events.append("sync_weights"))
    backend = VLLMColocateBackend(SleepyLLM(fixed([5, stops[0]])), stop_ids=stops,
                                  sampling_params_cls=FakeSamplingParams, generation=generation)
    one_turn(backend, [1])
    one_turn(backend, [2])
    backend.end_rollout()
    assert events == ["sync_weights", ("wake_up", ("kv_cache",)), "generate", "generate", ("sleep", 2)]
    assert generation._llm_weights_sleeping is True
    generation._llm_weights_sleeping = False  # TRL synced the weights before the next rollout
    events.clear()
    one_turn(backend, [3])
    backend.end_rollout()
    assert events == [("wake_up", ("kv_cache",)), "generate", ("sleep", 2)]


def test_colocate_without_sleep_mode_never_sleeps(stops):
    generation = type("Generation", (), {"enable_sleep_mode": False})()
    backend = VLLMColocateBackend(FakeLLM(fixed([5])), stop_ids=stops, sampling_params_cls=FakeSamplingParams,
                                  generation=generation)
    one_turn(backend, [1])
    backend.end_rollout()  # FakeLLM has no sleep/wake_up: calling either would raise


def test_colocate_aborted_request_is_an_error(stops):
    class Aborting(FakeLLM):
        def generate(self, prompts, sampling_params=None, use_tqdm=True, **kw):
            results = super().generate(prompts, sampling_params, use_tqdm)
            results[0].outputs[0].finish_reason = "abort"
            return results

    backend = VLLMColocateBackend(Aborting(fixed([5])), stop_ids=stops, sampling_params_cls=FakeSamplingParams)
    assert one_turn(backend, [1]).finish_reason == "error"


def test_colocate_without_vllm_installed_says_so(stops):
    try:
        import vllm  # noqa: F401
    except ImportError:
        backend = VLLMColocateBackend(FakeLLM(fixed([5])), stop_ids=stops)
        with pytest.raises(ImportError):
            one_turn(backend, [1])
    else:  # pragma: no cover - GPU machines
        pytest.skip("vllm is installed")


# ---------------------------------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_hf_per_sequence_limits_and_logprobs_match_training(tiny_model, tiny_tokenizer, stops):
    import torch

    from t2s.backends.hf_generate import HFGenerateBackend

    backend = HFGenerateBackend(tiny_model, tiny_tokenizer)
    prompts = [tiny_tokenizer("SELECT name FROM customers")["input_ids"], tiny_tokenizer("How many")["input_ids"]]
    for temperature in (1.0, 0.7):
        sampling = SamplingSettings(temperature=temperature, seed=3)
        outs = backend.generate(prompts, [12, 3], sampling)
        assert len(outs[1].token_ids) <= 3
        for prompt, out, limit in zip(prompts, outs, [12, 3]):
            assert len(out.token_ids) == len(out.logprobs) <= limit
            if out.finish_reason == "stop":
                assert out.token_ids[-1] in stops and out.stop_token_id == out.token_ids[-1]
                assert not set(out.token_ids[:-1]) & set(stops)
            else:
                assert (out.finish_reason == "length" and len(out.token_ids) == limit
                        and not set(out.token_ids) & set(stops))
            ids = torch.tensor([prompt + out.token_ids])
            with torch.no_grad():
                logits = tiny_model(ids).logits[0, len(prompt) - 1 : -1].float()
            expected = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
            assert torch.allclose(expected, torch.tensor(out.logprobs), atol=1e-4)


def test_hf_logprobs_ignore_top_k(tiny_model, tiny_tokenizer):
    """Sampling with top-k still reports log_softmax(logits / T), the training side's definition."""
    import torch

    from t2s.backends.hf_generate import HFGenerateBackend

    prompt = tiny_tokenizer("SELECT")["input_ids"]
    out = one_turn(HFGenerateBackend(tiny_model, tiny_tokenizer), prompt, 6, SamplingSettings(top_k=2, seed=1))
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = tiny_model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(out.logprobs), atol=1e-4)


def test_hf_model_factory_is_entered_per_call(tiny_model, tiny_tokenizer):
    import contextlib

    from t2s.backends.hf_generate import HFGenerateBackend

    entered = []

    @contextlib.contextmanager
    def unwrap():
        entered.append(1)
        yield tiny_model

    backend = HFGenerateBackend(unwrap, tiny_tokenizer, max_batch_size=1)
    outs = backend.generate([[1, 2], [3, 4, 5]], [2, 2], SamplingSettings(seed=0))
    assert len(outs) == 2 and entered == [1]


def test_hf_end_rollout_keeps_step_with_other_ranks(tiny_model, tiny_tokenizer):
    """Multi-process: a rank done early keeps entering the (collective) model context until every rank is done."""
    import contextlib

    from t2s.backends.hf_generate import HFGenerateBackend

    entered, other_rank_rounds = [], [3]  # the other rank generates 3 more rounds after this one stops

    @contextlib.contextmanager
    def unwrap():
        entered.append(1)
        yield tiny_model

    def ranks_active(active: bool) -> int:
        other = other_rank_rounds[0] > 0
        other_rank_rounds[0] -= 1
        return int(active) + int(other)

    backend = HFGenerateBackend(unwrap, tiny_tokenizer, ranks_active=ranks_active)
    backend.generate([[1, 2]], [2], SamplingSettings(seed=0))
    backend.end_rollout()
    assert len(entered) == 3 and other_rank_rounds[0] == -1  # 1 real round + 2 empty ones, then all done


def test_hf_refuses_penalties_it_cannot_apply(tiny_model, tiny_tokenizer):
    from t2s.backends.hf_generate import HFGenerateBackend

    backend = HFGenerateBackend(tiny_model, tiny_tokenizer)
    for penalty in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(ValueError, match="^Error: the transformers backend has no presence or frequency penalty"):
            one_turn(backend, [1, 2], 2, SamplingSettings(**{penalty: 0.5}))


def test_hf_sampling_ignores_the_checkpoints_generation_defaults(tiny_model_dir, tiny_tokenizer):
    """A checkpoint's generation_config (Qwen3.5 ships top_p/top_k defaults) must not reshape training sampling.

    transformers fills every None field of the call's GenerationConfig from the model's; a top_p there would keep only
    the most likely token here, so every sampled token would be the argmax.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from t2s.backends.hf_generate import HFGenerateBackend

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config.top_p = 1e-6
    model.generation_config.min_p = 0.999
    prompts = [tiny_tokenizer(f"SELECT {i} FROM t")["input_ids"] for i in range(4)]
    outs = HFGenerateBackend(model, tiny_tokenizer).generate(prompts, [12] * 4, SamplingSettings(seed=5))
    not_argmax = 0
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        not_argmax += int((logits.argmax(-1) != ids[0, len(prompt) :]).sum())
    assert not_argmax > 0, "temperature-only sampling must draw tokens other than the argmax"


# ------------------------------------------------------------------ transformers: keys and values kept between turns
GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def attention_model(attention_model_dir):
    """(model, tokenizer) of the tiny full-attention model, whose cache is one ``DynamicLayer`` a layer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(attention_model_dir), AutoTokenizer.from_pretrained(attention_model_dir)


def _first_and_next_turns(tokenizer, backend):
    """Turn one on three prompts of different lengths, then turn two as the rollout builds it (each prompt, its turn,
    an environment reply of its own length), for two of the rows in another order, as when an episode has ended."""
    texts = ["SELECT name FROM customers WHERE city = 'Lyon' ORDER BY name", "How many orders",
             "List the tables of the database, then count the rows of each one"]
    first = [tokenizer(text)["input_ids"] for text in texts]
    turns = backend.generate(first, [8, 6, 8], GREEDY)
    replies = [tokenizer(f" result {'x' * n} ")["input_ids"] for n in (1, 9, 4)]
    second = [first[i] + turns[i].token_ids + replies[i] for i in (2, 0)]
    return first, turns, second


@pytest.mark.parametrize("max_batch_size", [None, 1], ids=["one-batch", "batches-of-one"])
def test_hf_keeps_keys_and_values_from_one_turn_to_the_next(attention_model, max_batch_size):
    """Turn two starts from turn one's keys and values: the same tokens as a fresh prefill, logprobs within float
    noise, and at least every row's earlier prompt less the longest new part taken from the kept cache."""
    import torch

    from t2s.backends.hf_generate import HFGenerateBackend

    model, tokenizer = attention_model
    kept = HFGenerateBackend(model, tokenizer, max_batch_size=max_batch_size)
    fresh = HFGenerateBackend(model, tokenizer, max_batch_size=max_batch_size, reuse_cache_bytes=0)
    first, turns, second = _first_and_next_turns(tokenizer, kept)
    assert kept.reused_tokens == 0 and [t.token_ids for t in turns] == [
        t.token_ids for t in fresh.generate(first, [8, 6, 8], GREEDY)]
    again, expected = kept.generate(second, [8, 8], GREEDY), fresh.generate(second, [8, 8], GREEDY)
    assert [t.token_ids for t in again] == [t.token_ids for t in expected]
    for a, b in zip(again, expected):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    longest_new = max(len(s) - len(first[i]) for s, i in zip(second, (2, 0)))
    assert kept.reused_tokens >= sum(len(s) - longest_new for s in second) > 0
    assert fresh.reused_tokens == 0


def test_hf_kept_keys_and_values_never_outlive_the_weights_or_the_rollout(attention_model):
    import torch

    from t2s.backends.hf_generate import HFGenerateBackend

    model, tokenizer = attention_model
    backend = HFGenerateBackend(model, tokenizer)
    _, _, second = _first_and_next_turns(tokenizer, backend)
    backend.end_rollout()  # the rollout ended: nothing kept
    backend.generate(second, [4, 4], GREEDY)
    assert backend.reused_tokens == 0
    weight = model.get_input_embeddings().weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)  # an optimizer step: the kept keys are stale
        moved = backend.generate(second, [4, 4], GREEDY)
        assert backend.reused_tokens == 0
        assert [t.logprobs for t in moved] == [
            t.logprobs for t in HFGenerateBackend(model, tokenizer, reuse_cache_bytes=0).generate(second, [4, 4],
                                                                                                 GREEDY)]
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_hf_keeps_nothing_of_a_linear_attention_model_or_past_its_budget(tiny_model, tiny_tokenizer, attention_model):
    """The hybrid tiny Qwen3.5's gated-delta-net layers keep a recurrent state that cannot be cut back to a prefix;
    a budget of one byte keeps nothing either."""
    from t2s.backends.hf_generate import HFGenerateBackend

    for backend, tokenizer in ((HFGenerateBackend(tiny_model, tiny_tokenizer), tiny_tokenizer),
                               (HFGenerateBackend(*attention_model, reuse_cache_bytes=1), attention_model[1])):
        _, _, second = _first_and_next_turns(tokenizer, backend)
        backend.generate(second, [4, 4], GREEDY)
        assert backend.reused_tokens == 0 and backend.prompt_tokens > 0


VLLM_VARIABLES = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE",
                  "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCHDYNAMO_DISABLE")


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
def test_vllm_environment_on_a_cpu_and_on_a_gpu(monkeypatch, cuda):
    from t2s.backends import vllm_engine

    for name in VLLM_VARIABLES:  # what vllm_environment sets ends with the test (conftest's environment_restored)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: cuda)
    vllm_engine.vllm_environment()
    set_here = {name: os.environ.get(name) for name in VLLM_VARIABLES}
    assert set_here["VLLM_NO_USAGE_STATS"] == set_here["DO_NOT_TRACK"] == "1"
    assert set_here["VLLM_HOST_IP"] == "127.0.0.1"
    cpu_only = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCHDYNAMO_DISABLE")
    if cuda:  # a GPU engine keeps its own process layout and its compiled kernels
        assert [set_here[name] for name in cpu_only] == [None, None, None]
    else:
        assert [set_here[name] for name in cpu_only] == [vllm_engine.CPU_KV_CACHE_GIB, "0", "1"]


def test_vllm_environment_keeps_torchdynamo_for_a_compiled_run_and_what_the_user_set(monkeypatch):
    from t2s.backends import vllm_engine

    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: False)
    for name in VLLM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    vllm_engine.vllm_environment(torch_compile=True)  # training with --torch_compile
    assert "TORCHDYNAMO_DISABLE" not in os.environ
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    vllm_engine.vllm_environment()
    assert os.environ["TORCHDYNAMO_DISABLE"] == "0" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_a_test_leaves_the_environment_as_it_found_it(monkeypatch):
    """conftest's ``environment_restored`` (every test): what a command run in a test sets, changes or removes in
    ``os.environ`` is undone when the test ends."""
    from tests.vllm_support import environment_kept

    monkeypatch.setenv("T2S_KEPT", "before")
    for name in ("T2S_LEFT_BY_A_TEST", *VLLM_VARIABLES):  # unset here: each that vllm_environment sets is undone
        monkeypatch.delenv(name, raising=False)
    with environment_kept():
        from t2s.backends import vllm_engine

        monkeypatch.setattr(vllm_engine, "has_cuda", lambda: False)
        os.environ["T2S_LEFT_BY_A_TEST"] = "1"
        os.environ.pop("T2S_KEPT")
        vllm_engine.vllm_environment()
        changed = dict(os.environ)
    assert "T2S_LEFT_BY_A_TEST" in changed and "T2S_LEFT_BY_A_TEST" not in os.environ
    assert changed["TORCHDYNAMO_DISABLE"] == os.environ.get("TORCHDYNAMO_DISABLE", "1")
    assert os.environ["T2S_KEPT"] == "before"
    assert changed["DO_NOT_TRACK"] == "1" and not set(VLLM_VARIABLES) & set(os.environ)


def test_a_colocated_engine_rendezvous_at_a_port_the_os_hands_out(monkeypatch):
    """TRL takes the first of 29500, 23456, 12355, 12345 free when it looks, so two runs started together both take
    29500 and the later engine fails (EADDRINUSE). engine_settings gives an unset MASTER_PORT an OS-assigned port, which
    TRL then keeps; a launcher's MASTER_PORT stays."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import socket

    from trl.trainer.utils import ensure_master_addr_port

    from t2s.training.vllm_sync import engine_settings

    monkeypatch.delenv("MASTER_PORT", raising=False)
    ports = []
    for _ in range(2):  # a second run started while the first's engine listens
        os.environ.pop("MASTER_PORT", None)
        with engine_settings("float32"):
            ensure_master_addr_port()
            port = int(os.environ["MASTER_PORT"])
        assert port not in (29500, 23456, 12355, 12345)
        listening = socket.socket()
        listening.bind(("127.0.0.1", port))  # free when handed out: the engine binds it
        listening.listen()
        ports.append((port, listening))
    assert ports[0][0] != ports[1][0]
    for _, listening in ports:
        listening.close()
    monkeypatch.setenv("MASTER_PORT", "29511")
    with engine_settings("float32"):
        ensure_master_addr_port()
    assert os.environ["MASTER_PORT"] == "29511"


def test_a_colocated_engine_is_built_in_the_checkpoints_dtype_without_a_tokenizer(monkeypatch):
    """TRL's one ``LLM(...)`` call, as engine_settings completes it: the dtype given, token ids in and out with no
    tokenizer loaded by vLLM (the rollout decodes with the trainer's), and what TRL passed kept."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    from trl.generation import vllm_generation

    from t2s.backends import vllm_engine
    from t2s.training.vllm_sync import engine_settings

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *args, **kwargs: built.append(kwargs))
    for cuda in (False, True):
        monkeypatch.setattr(vllm_engine, "has_cuda", lambda: cuda)
        with engine_settings("float32"):
            vllm_generation.LLM(model="m", max_model_len=2048, seed=3)
    cpu, gpu = built
    assert cpu["skip_tokenizer_init"] is gpu["skip_tokenizer_init"] is True
    assert cpu["dtype"] == gpu["dtype"] == "float32" and cpu["seed"] == gpu["seed"] == 3
    assert cpu["enforce_eager"] is True and "enforce_eager" not in gpu


def test_the_engine_dtypes_t2s_accepts_are_the_ones_vllm_takes():
    """``train``'s ``vllm_dtype`` and ``eval --dtype`` check against ``ENGINE_DTYPES`` before an engine starts; that
    list is vLLM's own, neither more nor fewer."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import typing

    from vllm.config.model import ModelDType

    from t2s.backends.vllm_engine import ENGINE_DTYPES

    assert sorted(ENGINE_DTYPES) == sorted(typing.get_args(ModelDType))


def test_only_the_tokenless_chat_template_warmup_failure_is_dropped_from_vllms_log():
    """An engine with no tokenizer cannot warm up a chat template, and vLLM logs that failure with its traceback at
    every start; that record is dropped, and any other from the same logger (another warmup failure included) is
    kept."""
    import logging

    from t2s.backends.vllm_engine import WARMUP_LOGGER, token_ids_only

    assert token_ids_only() == token_ids_only() == {"skip_tokenizer_init": True}
    logger = logging.getLogger(WARMUP_LOGGER)
    assert len(logger.filters) == len(set(logger.filters))  # installed once, however many engines start

    def warmup_failure(error: Exception) -> None:
        try:
            raise error
        except ValueError:
            logger.warning("Chat template warmup failed", exc_info=True)

    class Kept(logging.Handler):  # on the logger itself: vLLM's logging config stops propagation to the root
        def __init__(self):
            super().__init__()
            self.records = []

        def emit(self, record):
            self.records.append(record)

    kept = Kept()
    logger.addHandler(kept)
    try:
        warmup_failure(ValueError("Tokenizer not available when `skip_tokenizer_init=True`"))
        warmup_failure(ValueError("the template is broken"))
        logger.warning("another warning")
    finally:
        logger.removeHandler(kept)
    assert [(r.getMessage(), str(r.exc_info[1]) if r.exc_info else None) for r in kept.records] == [
        ("Chat template warmup failed", "the template is broken"), ("another warning", None)]


@pytest.mark.parametrize("config, dtype", [
    ({"dtype": "bfloat16"}, "bfloat16"), ({"torch_dtype": "torch.float16"}, "float16"),
    ({"text_config": {"dtype": "float32"}}, "float32"), ({"dtype": "float64"}, "auto"), ({"dtype": ["bf16"]}, "auto"),
    ({"text_config": "x"}, "auto"), ([1, 2], "auto"), ("[" * 100_000 + "]" * 100_000, "auto"),
])
def test_a_checkpoints_dtype_is_one_an_engine_takes_or_auto(tmp_path, config, dtype):
    """What config.json states reaches vLLM only where vLLM takes it; anything else (a list, a dtype vLLM has no
    name for, a text_config that is no object) is ``auto``, never a traceback."""
    from t2s.backends.vllm_engine import checkpoint_dtype

    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert checkpoint_dtype(tmp_path) == dtype


@pytest.mark.parametrize("policy", ["model", "vllm"])
def test_eval_refuses_a_model_folder_that_cannot_load_in_one_line(tiny_model_dir, demo_dir, tmp_path, capsys, policy):
    import shutil

    from t2s.commands import main
    from tests.test_trainer_validation import BROKEN_MODELS

    if policy == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    for name, (damage, problem) in sorted(BROKEN_MODELS.items()):
        model = tmp_path / name
        shutil.copytree(tiny_model_dir, model)
        damage(model)
        code = main(["eval", "--policy", policy, "--model", str(model), "--data", str(demo_dir), "--n", "1",
                     "--output", str(tmp_path / f"out-{name}"), "--quiet"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error")]
        assert code != 0 and err == [f"Error: cannot load the model {model}: {problem}"], (name, err)
