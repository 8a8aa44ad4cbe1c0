"""The rollout-scheduling benchmark: its serving simulator's timing rules and the command's figures."""

from __future__ import annotations

import re

import pytest

from t2s.backends.base import SamplingSettings
from t2s.bench.rollout import SimulatorSpec, EpisodePlan, ServingSimulator


def in_process(argv: list[str]) -> int:
    """``python -m t2s bench ARGV`` in this process (so a test may patch the benchmark's module)."""
    from t2s.commands import main

    return main(["bench", *argv])


def make_engine(tiny_tokenizer, n_plans: int, turn_len: int, prompt_len: int, **spec):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    plans = [
        EpisodePlan({"question_id": str(i)}, [[7] * (turn_len - 1) + [im_end]], tuple([100 + i] * prompt_len))
        for i in range(n_plans)
    ]
    return ServingSimulator(tiny_tokenizer, plans, SimulatorSpec(**spec), "turnsync"), plans


def test_engine_single_request_timing(tiny_tokenizer):
    # 5000 prompt tokens: 3 prefill steps (the last one samples token 1), then 99 decode steps
    engine, plans = make_engine(tiny_tokenizer, 1, 100, 5000)
    out = engine.generate([list(plans[0].first_prompt)], [2048], SamplingSettings())[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == 100
    assert engine.stats.steps == 3 + 99 and engine.now == pytest.approx(1.02)


def test_engine_per_request_max_tokens_cuts(tiny_tokenizer):
    engine, plans = make_engine(tiny_tokenizer, 1, 100, 10)
    out = engine.generate([list(plans[0].first_prompt)], [40], SamplingSettings())[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 40 and engine.stats.steps == 40


def test_engine_capacity_makes_requests_wait(tiny_tokenizer):
    engine, plans = make_engine(tiny_tokenizer, 3, 50, 10, max_num_seqs=2)
    engine.generate([list(p.first_prompt) for p in plans], [2048] * 3, SamplingSettings())
    assert engine.stats.max_running == 2 and engine.stats.steps == 100  # the third ran after a slot freed
    engine, plans = make_engine(tiny_tokenizer, 3, 50, 10)
    engine.generate([list(p.first_prompt) for p in plans], [2048] * 3, SamplingSettings())
    assert engine.stats.steps == 50  # all three decode together


def test_engine_prefill_shares_the_step_budget(tiny_tokenizer):
    # two 3000-token prompts: 6000 prompt tokens at 2048 per step need 3 steps before both decode
    engine, plans = make_engine(tiny_tokenizer, 2, 10, 3000, prefix_caching=False)
    engine.generate([list(p.first_prompt) for p in plans], [2048] * 2, SamplingSettings())
    assert engine.stats.prefill_tokens == 6000 and engine.stats.steps == 3 + 9


@pytest.mark.timeout(300)
def test_bench_rollout_last_line_and_async_bound(capsys, demo_dir):


    assert in_process(["rollout", "--n", "24", "--seed", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(r"async_over_critical=(\d+\.\d+) turnsync_over_critical=(\d+\.\d+)", lines[-1])
    assert match, lines[-1]
    async_ratio, turnsync_ratio = map(float, match.groups())
    assert 0.99 <= async_ratio <= 1.15
    assert turnsync_ratio > async_ratio


def test_bench_rollout_rejects_bad_episodes(capsys):


    assert in_process(["rollout", "--episodes", "0"]) != 0
    assert capsys.readouterr().out.startswith("Error:")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dialect, tool_format", [("sibling", "native"), ("exec_plan", "native"), ("sibling", "json")])
def test_bench_rollout_in_each_tool_set_and_call_format(capsys, monkeypatch, demo_dir, dialect, tool_format):
    """The engine serves the prompts the rollout really sends in each tool set and call format: every planned turn
    is served, every episode submits the gold SQL and scores correct, and the last line keeps its format."""

    from t2s.bench import rollout
    from t2s.training.tiny_model import build_tokenizer

    measured = []
    real_measure = rollout.measure

    def keep(*args, **kwargs):
        measured.append(real_measure(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(rollout, "measure", keep)
    assert in_process(["rollout", "--n", "16", "--dialect", dialect, "--tool-format", tool_format]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"async_over_critical=\d+\.\d+ turnsync_over_critical=\d+\.\d+", last), last
    async_r, turnsync_r, _, _, plans = measured[0]
    assert len(plans) == 16
    for result in (async_r, turnsync_r):
        assert result.turns == sum(len(p.turns) for p in plans)
        assert result.submitted == result.equivalent == 16
    tokenizer = build_tokenizer()
    prompt = tokenizer.decode(list(plans[0].first_prompt))
    written = "".join(tokenizer.decode(turn) for turn in plans[0].turns)
    native = tool_format == "native"
    assert ("<tools>" in prompt) == native and ("<tool_call>" in written) == native  # the template declares the tools
    assert ("inspect_schema" in written) == (dialect == "sibling")
    assert ('"tool": "submit"' in written) == (dialect == "sibling" and not native)
