"""One episode driver plays every policy: text policies (replayed turns, gold, endpoints, a predictions file) reach
``Rollout`` through ``t2s.rollout.text_policy``, inline or turn-synchronously, with or without a tokenizer."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from t2s.backends.base import TurnOutput
from t2s.backends.scripted import GoldPolicy, ReplayPolicy
from t2s.data.loaders import load_bird
from t2s.env.episode import Episode, EpisodeConfig
from t2s.env.schema import get_schema
from t2s.env.databases import ref_from_row
from t2s.env.single_turn import answer_sql
from t2s.evaluation.policies import PredictionPolicy
from t2s.rollout.driver import Rollout
from t2s.rollout.text_policy import TextPolicies, play, run_text_episode

PACKAGE = Path(__file__).resolve().parent.parent / "t2s"


@pytest.fixture(scope="module")
def rows(demo_dir):
    return load_bird(demo_dir / "dev.json")[:4]


def _gold(rows, config):
    return [GoldPolicy.for_episode(row, get_schema(ref_from_row(row)), config) for row in rows]


def test_only_the_driver_steps_an_episode():
    """The turn loop exists once: no module but the driver calls ``Episode.step`` or adds environment tokens."""
    stepping = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("step", "add_env_tokens") and "episode" in ast.unparse(node.func.value):
                stepping.add(str(path.relative_to(PACKAGE.parent)))
    assert stepping == {"t2s/rollout/driver.py"}


@pytest.mark.parametrize("tool_format", ["json", "native"])
def test_text_policies_play_the_same_episodes_inline_and_turn_synchronously(rows, tiny_tokenizer, tool_format):
    config = EpisodeConfig(tool_format=tool_format)
    inline = [run_text_episode(row, config, policy, tokenizer=tiny_tokenizer)
              for row, policy in zip(rows, _gold(rows, config))]
    batched = Rollout(TextPolicies(_gold(rows, config), tiny_tokenizer, schedule="turnsync"), tiny_tokenizer,
                      config, score=False).run(rows)
    assert [trace.record for trace in batched] == inline
    assert all(record.stop_reason == "submitted" and record.prompt_tokens > 0 for record in inline)
    for trace in batched:  # the stream a training rollout builds: model turns masked 1, closed by the end of turn
        assert trace.completion_ids and sum(trace.env_mask) > 0 and trace.logprobs == [0.0] * len(trace.env_mask)
        assert trace.assistant_texts == [turn["assistant"] for turn in trace.record.turns]


def test_without_a_tokenizer_turns_carry_text_and_a_servers_cut_counts(rows):
    class CutByServer(ReplayPolicy):
        """A policy whose server cut its first turn (finish reason "length"), as an endpoint reports it."""

        def __call__(self, episode=None):
            self.finish_reasons = ["length"] if not hasattr(self, "finish_reasons") else [*self.finish_reasons, "stop"]
            return super().__call__(episode)

    gold = rows[0]["gold_sql"]
    turns = ['{"tool": "list_tables", "args": {}}', json.dumps({"tool": "submit_sql", "args": {"sql": gold}})]
    trace = Rollout(TextPolicies(CutByServer(turns)), None, EpisodeConfig(), score=False).run(rows[:1])[0]
    assert trace.prompt_ids == [] and trace.completion_ids == [] and trace.env_mask == []
    assert trace.record.final_sql == gold and trace.record.counters["turn_cutoffs"] == 1
    assert trace.record.prompt_tokens == 0 and trace.record.counters["turns"] == 2


def test_a_token_turn_longer_than_the_episode_allows_is_cut_and_decoded(rows, tiny_tokenizer):
    config = EpisodeConfig(max_tokens_per_turn=24)
    policy = ReplayPolicy(["word " * 200, json.dumps({"tool": "submit_sql", "args": {"sql": "SELECT 1"}})])
    episode = play(Episode(rows[0], config), policy, tiny_tokenizer)
    record = episode.record()
    assert record.counters["turn_cutoffs"] == 1
    first = record.turns[0]["assistant"]
    assert len(tiny_tokenizer(first, add_special_tokens=False)["input_ids"]) <= 24 < 200
    assert record.final_sql == "SELECT 1" and record.counters["turns"] == 2


def test_the_driver_refuses_what_it_cannot_play(tiny_tokenizer):
    class TokenBackend:
        schedule = "turnsync"

        def generate(self, prompts, max_tokens, sampling, seeds=None):
            return [TurnOutput() for _ in prompts]

    with pytest.raises(ValueError, match="token backend needs a tokenizer"):
        Rollout(TokenBackend(), None)
    with pytest.raises(ValueError, match="not 'async'"):
        Rollout(TextPolicies(ReplayPolicy([])), tiny_tokenizer, schedule="async")


def test_a_prediction_is_a_single_turn_answer_taken_as_filed(rows):
    """A text reader would find no SQL in this answer (``</think>`` ends a thinking block); as a prediction it is
    submitted exactly as filed, and played as a single-turn episode."""
    sql = "SELECT 'a</think>b' AS x"
    assert answer_sql(sql)[0] is None
    record = run_text_episode(rows[0], EpisodeConfig(mode="single"), PredictionPolicy(sql))
    assert record.final_sql == record.submitted_sql == sql and record.stop_reason == "submitted"
    assert record.counters["turns"] == 1 and record.counters["format_deviations"] == 0
    missing = run_text_episode(rows[0], EpisodeConfig(mode="single"), PredictionPolicy(None))
    assert missing.final_sql is None and missing.stop_reason == "no_answer"


def test_a_predictions_eval_records_the_mode_it_is_evaluated_in(demo_dir, tmp_path):
    from t2s.commands.eval import eval_config
    from t2s.evaluation.runner import evaluate

    records = json.loads((demo_dir / "dev.json").read_text())[:3]
    predictions = tmp_path / "pred.jsonl"
    predictions.write_text("".join(json.dumps({"question_id": r["question_id"], "sql": r["SQL"]}) + "\n"
                                   for r in records))
    evaluate(eval_config(["--policy", "predictions", "--predictions", str(predictions), "--data", str(demo_dir),
                          "--mode", "withheld", "--output", str(tmp_path / "out"), "--quiet"]))
    lines = [json.loads(line) for line in (tmp_path / "out" / "withheld" / "episodes.jsonl").read_text().splitlines()]
    answered = [line for line in lines if line["final_sql"] is not None]
    assert {line["mode"] for line in lines} == {"withheld"} and len(answered) == 3
    assert all(line["official"] == 1 and line["submitted_sql"] == line["final_sql"] for line in answered)
