"""Rollouts on real episodes (data/demo, real SQLite): the token-stream invariants of DESIGN §3 through transformers
generate, the fake vLLM server and the fake ``vllm.LLM``; a scripted good agent; failures that end episodes cleanly."""

from __future__ import annotations

import json

import pytest

from t2s.backends.base import SamplingSettings, stop_token_ids
from t2s.backends.vllm_colocate import VLLMColocateBackend
from t2s.backends.vllm_server import VLLMServerBackend
from t2s.env.episode import EpisodeConfig
from t2s.rollout.driver import Rollout
from t2s.rollout.trace import to_trl
from tests.fake_vllm import FakeLLM, FakeSamplingParams, FakeVLLMServer, RandomAgent, ScriptedAgent, refused_url

SMALL = EpisodeConfig(max_turns=3, max_tokens_per_turn=24)


@pytest.fixture(scope="module")
def rows(demo_dir):
    from t2s.data.loaders import load_json_rows

    return load_json_rows(demo_dir / "dev.json")


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def segments(trace):
    """(is_model, ids) runs of the completion by env_mask."""
    runs = []
    for tid, m in zip(trace.completion_ids, trace.env_mask):
        if runs and runs[-1][0] == bool(m):
            runs[-1][1].append(tid)
        else:
            runs.append((bool(m), [tid]))
    return runs


def assert_stream_invariants(trace, tok, config: EpisodeConfig = SMALL):
    """DESIGN §3: model segments decode to the assistant texts, env segments to observation + generation prompt,
    lengths align, a finished trajectory ends on <|im_end|>, and env positions carry logprob 0."""
    im_end, eot = stop_token_ids(tok)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    n = len(trace.completion_ids)
    assert len(trace.env_mask) == n and len(trace.logprobs) == n
    assert trace.completion_ids[-1] == im_end
    assert all(lp == 0.0 for lp, m in zip(trace.logprobs, trace.env_mask) if not m)
    assert all(lp <= 0.0 for lp in trace.logprobs)
    assert decode(trace.prompt_ids).endswith("<|im_start|>assistant\n<think>\n")
    turns = trace.record.to_json()["turns"]
    runs = segments(trace)
    model_runs = [ids for is_model, ids in runs if is_model]
    env_runs = [ids for is_model, ids in runs if not is_model]
    assert len(model_runs) == len(turns) == len(trace.assistant_texts)
    for ids, turn, text in zip(model_runs, turns, trace.assistant_texts):
        assert turn["assistant"] == text
        body = ids[:-1] if ids[-1] in (im_end, eot) else ids
        assert decode(body) == text
        assert not set(body) & {im_end, eot}  # stop tokens only ever close a turn
    for k, ids in enumerate(env_runs):
        previous = model_runs[k]
        lead = "" if previous[-1] == im_end else "<|im_end|>"
        if k < len(turns) and turns[k]["observation"]:
            expected = (f"{lead}\n<|im_start|>user\n{turns[k]['observation'].strip()}<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n")
            if k + 1 == len(model_runs):  # no model turn followed (generation error or budget): closed here
                expected += "<|im_end|>"
        else:  # the closing <|im_end|> after a last turn that did not end on it
            expected = lead
            assert k == len(env_runs) - 1
        assert decode(ids) == expected
    # every model token is in a model segment (none hidden in the environment's)
    assert sum(len(ids) for ids in model_runs) == sum(trace.env_mask)


def test_hf_generate_rollout_invariants(rows, tiny_model, tiny_tokenizer):
    from t2s.backends.hf_generate import HFGenerateBackend

    finished = []
    rollout = Rollout(
        HFGenerateBackend(tiny_model, tiny_tokenizer), tiny_tokenizer,
        EpisodeConfig(max_turns=2, max_tokens_per_turn=16),
        sampling=SamplingSettings(seed=0), on_finish=finished.append,
    )  # fmt: skip
    traces = rollout.run(rows[:3])
    assert [t.index for t in traces] == [0, 1, 2] and len(finished) == 3
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer)
        assert trace.record.to_json()["counters"]["turns"] >= 1 and trace.outcome is not None
    batch = rollout.to_trl(traces)
    assert [len(x) for x in batch["completion_ids"]] == [len(x) for x in batch["env_mask"]]
    assert all(isinstance(lp, float) for seq in batch["logprobs"] for lp in seq)
    assert batch["outcome"][0]["question_id"] == rows[0]["question_id"]
    json.dumps([record.to_json() for record in batch["record"]])  # each record has one JSON form
    # TRL receives the token stream and only what the rewards (outcome, final_sql_source) and trainer (record) read
    assert set(batch) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "outcome", "final_sql_source",
                          "record"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["async", "turnsync"])
def test_fake_server_random_agent_invariants(rows, tiny_tokenizer, schedule):
    stops = stop_token_ids(tiny_tokenizer)
    with FakeVLLMServer(RandomAgent(tiny_tokenizer, seed=1, stop_prob=0.5)) as server:
        backend = VLLMServerBackend(server.base_url, tiny_tokenizer, retries=0)
        traces = Rollout(backend, tiny_tokenizer, SMALL, schedule=schedule, score=False).run(rows[:6])
    reasons = [r for t in traces for r in t.finish_reasons]
    assert "length" in reasons and "stop" in reasons
    stop_ids = {ids[-1] for t in traces for m, ids in segments(t) if m}
    assert stops[1] in stop_ids  # <|endoftext|> stops happened and were handled
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer)
        cutoffs = trace.finish_reasons.count("length")
        assert trace.record.to_json()["counters"]["turn_cutoffs"] == cutoffs


def test_fake_llm_colocate_invariants(rows, tiny_tokenizer):
    llm = FakeLLM(RandomAgent(tiny_tokenizer, seed=2))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    traces = Rollout(backend, tiny_tokenizer, SMALL, score=False).run(rows[:5])
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer)
    # turn-synchronous: the first call batched every episode, with each request's own max_tokens
    first_prompts, first_params = llm.calls[0]
    assert len(first_prompts) == 5 and all(p.max_tokens == SMALL.max_tokens_per_turn for p in first_params)
    assert len(llm.calls) <= SMALL.max_turns + 1


def good_agent_turns(row) -> list[str]:
    gold = row["gold_sql"]
    call = lambda tool, **args: json.dumps({"tool": tool, "args": args})  # noqa: E731
    return [
        f"I should see the tables.\n</think>\n\n{call('list_tables')}",
        f"Now run the query.\n</think>\n\n{call('run_query', sql=gold)}",
        f"It works.\n</think>\n\n{call('submit_sql', sql=gold)}",
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", ["<|im_end|>", "<|endoftext|>"])
def test_fake_server_good_agent_submits(rows, tiny_tokenizer, stop):
    row = rows[0]
    agent = ScriptedAgent(tiny_tokenizer, good_agent_turns(row), stop=stop)
    config = EpisodeConfig(max_tokens_per_turn=512)
    with FakeVLLMServer(agent) as server:
        rollout = Rollout(VLLMServerBackend(server.base_url, tiny_tokenizer), tiny_tokenizer, config)
        traces = rollout.run([row] * 4)
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer, config)
        assert trace.record.to_json()["final_sql_source"] == "submitted"
        assert trace.record.to_json()["counters"]["submitted"]
        assert trace.record.to_json()["final_sql"] == row["gold_sql"]
        assert [t["calls"][0]["tool"] for t in trace.record.to_json()["turns"]] == [
            "list_tables", "run_query", "submit_sql"]
        assert trace.record.to_json()["turns"][0]["observation"].endswith("[5 tool turns left before you must answer]")
        assert trace.outcome.equivalent and trace.outcome.executes
    batch = rollout.to_trl(traces)
    assert batch["final_sql_source"] == ["submitted"] * 4
    assert [(r.counters["submitted"], r.counters["turns"], r.stop_reason) for r in batch["record"]] == [
        (True, 3, "submitted")] * 4
    assert batch["outcome"][0]["equivalent"] is True
    if stop == "<|endoftext|>":  # every turn's <|endoftext|> is followed by an env <|im_end|>
        im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids, mask = traces[0].completion_ids, traces[0].env_mask
        assert ids[-1] == im_end and mask[-1] == 0


@pytest.mark.timeout(120)
def test_each_observation_is_tokenized_once(rows, tiny_tokenizer, monkeypatch):
    from t2s.env import protocol

    tokenized = []
    observation_ids = protocol.observation_ids
    monkeypatch.setattr(protocol, "observation_ids",
                        lambda tok, text: tokenized.append(text) or observation_ids(tok, text))
    row = rows[0]
    with FakeVLLMServer(ScriptedAgent(tiny_tokenizer, good_agent_turns(row))) as server:
        rollout = Rollout(VLLMServerBackend(server.base_url, tiny_tokenizer), tiny_tokenizer,
                          EpisodeConfig(max_tokens_per_turn=512))
        traces = rollout.run([row] * 2)
    observations = [t["observation"] for trace in traces for t in trace.record.to_json()["turns"] if t["observation"]]
    assert len(observations) == 4 and sorted(tokenized) == sorted(observations)  # counted, then added, once each
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer)


@pytest.mark.timeout(60)
def test_server_failures_end_episodes_cleanly(rows, tiny_tokenizer):
    """A refused server: every episode ends as an error with a well-formed stream and a record; nothing hangs."""
    backend = VLLMServerBackend(refused_url(), tiny_tokenizer, model="m", retries=1, backoff=0.01)
    rollout = Rollout(backend, tiny_tokenizer, SMALL)
    traces = rollout.run(rows[:3])
    for trace in traces:
        assert trace.error and trace.error.startswith("Error:")
        assert trace.completion_ids == [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")] and trace.env_mask == [0]
        assert trace.record.to_json()["final_sql_source"] == "none" and trace.outcome.executes is False
    assert all(trace.record.stop_reason == "error" for trace in traces)


@pytest.mark.timeout(60)
def test_server_error_mid_episode_keeps_earlier_turns(rows, tiny_tokenizer):
    row = rows[1]
    agent = ScriptedAgent(tiny_tokenizer, good_agent_turns(row))
    with FakeVLLMServer(agent, faults=[None, "500", "500"]) as server:  # turn 2 fails twice: retries=1 gives up
        backend = VLLMServerBackend(server.base_url, tiny_tokenizer, retries=1, backoff=0.01)
        trace = Rollout(backend, tiny_tokenizer, EpisodeConfig(max_tokens_per_turn=512)).run([row])[0]
    assert trace.error and "500" in trace.error
    assert trace.finish_reasons == ["stop", "error"] and len(trace.record.to_json()["turns"]) == 1
    assert_stream_invariants(trace, tiny_tokenizer)


@pytest.mark.parametrize("seed", [5, 6, 7, 8])
def test_budget_cutoffs_and_forced_turn(rows, tiny_tokenizer, seed):
    """A tight token budget: turns are cut (finish length) and the episode is truncated or forced, still well-formed."""
    llm = FakeLLM(RandomAgent(tiny_tokenizer, seed=seed, stop_prob=0.0))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    from t2s.env.protocol import generation_prompt_ids
    from t2s.env.episode import Episode

    prompt = len(generation_prompt_ids(tiny_tokenizer, Episode(rows[0], EpisodeConfig()).messages))
    config = EpisodeConfig(episode_token_budget=prompt + 700, min_episode_tokens=100, max_tokens_per_turn=200,
                           forced_turn_reserve=100)  # fmt: skip
    trace = Rollout(backend, tiny_tokenizer, config, score=False).run([rows[0]])[0]
    assert_stream_invariants(trace, tiny_tokenizer, config)
    counters = trace.record.to_json()["counters"]
    assert counters["turn_cutoffs"] >= 1 and (counters["truncated"] or counters["forced"])
    runs = segments(trace)
    assert all(len(ids) <= config.max_tokens_per_turn for is_model, ids in runs if is_model)
    # the whole episode, prompt and environment included, fits the budget
    assert len(trace.prompt_ids) + len(trace.completion_ids) <= config.episode_token_budget


def test_to_trl_rejects_misaligned_traces(rows, tiny_tokenizer):
    llm = FakeLLM(RandomAgent(tiny_tokenizer, seed=3))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    traces = Rollout(backend, tiny_tokenizer, SMALL, score=False).run(rows[:1])
    traces[0].logprobs.append(0.0)
    with pytest.raises(AssertionError):
        to_trl(traces)


def test_seeded_requests_differ_per_episode(rows, tiny_tokenizer):
    llm = FakeLLM(RandomAgent(tiny_tokenizer, seed=4))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    Rollout(backend, tiny_tokenizer, SMALL, sampling=SamplingSettings(seed=9), score=False).run([rows[0]] * 3)
    seeds = [p.seed for p in llm.calls[0][1]]
    assert len(set(seeds)) == 3 and None not in seeds


def test_server_rollouts_wait_for_rank_zeros_weight_sync(tiny_tokenizer, rows):
    """Server mode: TRL pushes the weights from rank 0 only, so every rank waits at a barrier before its requests."""
    from types import SimpleNamespace

    from t2s.backends.base import TurnOutput
    from t2s.training.trainer import Text2SQLGRPOTrainer

    events = []

    class Backend:
        schedule = "async"
        stop_token_ids = stop_token_ids(tiny_tokenizer)

        async def agenerate(self, prompt_ids, max_tokens, sampling, seed=None):
            events.append("request")
            return TurnOutput.failed("scripted failure")

    accelerator = SimpleNamespace(num_processes=2, wait_for_everyone=lambda: events.append("barrier"))
    trainer = SimpleNamespace(
        args=SimpleNamespace(rollout_backend="vllm_server", temperature=1.0, episode_config=lambda: SMALL),
        accelerator=accelerator, processing_class=tiny_tokenizer, _backend=Backend(),
    )
    out = Text2SQLGRPOTrainer._run_episodes(trainer, rows[:2], trainer)
    assert len(out["completion_ids"]) == 2
    assert events[0] == "barrier" and events.count("barrier") == 1 and "request" in events


@pytest.mark.timeout(120)
def test_a_hostile_turn_does_not_stop_the_rollout(rows, tiny_tokenizer, monkeypatch):
    """JSON nested past the recursion limit is a deviation and the episode goes on; an episode whose environment
    fails anyway ends alone, and the other episodes of the rollout finish."""
    row = rows[0]
    hostile = '</think>\n{"tool": "run_query", "args": {"sql": ' + "[" * 1500 + "]" * 1500 + "}}"
    submit = good_agent_turns(row)[-1]
    config = EpisodeConfig(max_tokens_per_turn=4096, episode_token_budget=16384)
    llm = FakeLLM(ScriptedAgent(tiny_tokenizer, [hostile, submit]))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    traces = Rollout(backend, tiny_tokenizer, config).run([row] * 2)
    for trace in traces:
        assert_stream_invariants(trace, tiny_tokenizer, config)
        assert trace.record.to_json()["final_sql"] == row["gold_sql"]
        assert trace.record.to_json()["counters"]["format_deviations"] >= 1
        assert trace.outcome.equivalent

    from t2s.env.episode import Episode

    real_step = Episode.step

    def failing_step(self, text, **kwargs):
        if self.row["question_id"] == rows[1]["question_id"]:
            raise MemoryError("the environment gave up")
        return real_step(self, text, **kwargs)

    monkeypatch.setattr(Episode, "step", failing_step)
    llm = FakeLLM(ScriptedAgent(tiny_tokenizer, [submit]))
    backend = VLLMColocateBackend(llm, tiny_tokenizer, sampling_params_cls=FakeSamplingParams)
    failed, finished = Rollout(backend, tiny_tokenizer, config).run([rows[1], row])
    assert failed.record.to_json()["counters"]["tool_errors"] == 1
    assert failed.record.to_json()["final_sql_source"] == "none"
    assert finished.record.to_json()["final_sql"] == row["gold_sql"] and finished.outcome.equivalent
    assert_stream_invariants(failed, tiny_tokenizer, config)
