"""End to end: real GRPO steps on data/demo with the tiny Qwen3.5 through the real rollout, tools and dense reward."""

from __future__ import annotations

import json
import re

import pytest

from t2s.settings import RECIPES_DIR
from t2s.training.trainer import TIME_METRICS

pytestmark = pytest.mark.slow


def _smoke_args(model_dir, output_dir, *extra):
    from t2s.training.configs import parse_recipe

    return parse_recipe(["--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(model_dir),
                         "--output_dir", str(output_dir), *extra])


def test_real_rollout_trains_and_keeps_the_token_stream_invariants(tiny_model_dir, demo_dir, tmp_path, capsys):
    from t2s.training.pipeline import build_trainer, fit

    script_args, training_args, model_args = _smoke_args(tiny_model_dir, tmp_path / "run", "--max_steps", "2",
                                                         "--log_completions", "true")
    trainer, counts = build_trainer(script_args, training_args, model_args)
    assert counts["kept"] > 0 and counts["dropped_difficulty"] > 0  # the demo has challenging rows
    outputs, rows_seen = [], []
    rollout = trainer._rollout

    def capture(prompts, trainer_):
        rows_seen.append([row["question_id"] for row in trainer_._batch_rows])
        out = rollout(prompts, trainer_)
        outputs.append(out)
        return out

    trainer.rollout_func = capture
    fit(trainer, counts)
    assert " Step 1 ─" not in capsys.readouterr().out  # TRL's completions table stays off the console
    assert trainer.state.global_step == 2 and len(outputs) == 2

    tokenizer = trainer.processing_class
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for out, ids in zip(outputs, rows_seen):
        assert len(out["completion_ids"]) == len(ids) == 8
        for i in range(0, 8, 4):  # G consecutive copies of one question per group
            assert len(set(ids[i : i + 4])) == 1
        for completion, logprobs, mask, record in zip(out["completion_ids"], out["logprobs"], out["env_mask"],
                                                      out["record"]):
            assert len(completion) == len(logprobs) == len(mask) > 0
            assert completion[-1] == im_end  # a finished trajectory ends on <|im_end|>
            assert 0 in mask and 1 in mask  # model turns and at least one environment turn
            assert all(lp <= 0.0 for lp, m in zip(logprobs, mask) if m)
            assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
            assert record.question_id in ids and set(record.counters) >= {"turns", "submitted", "truncated"}
        assert all(o is not None for o in out["outcome"])  # every episode was scored

    logged = {key for entry in trainer.state.log_history for key in entry}
    for key in ("reward", "rewards/dense/mean", "rewards/dense/f1", "rewards/dense/join", "rewards/dense/consensus",
                "tier/invalid", "frac_reward_zero_std", "episodes/stop/submitted", "episodes/stop/prompt_too_long",
                "episodes/turns_mean", "episodes/submit_rate", "episodes/forced_rate",
                "episodes/truncated_rate", "episodes/turn_cutoffs_per_turn", "kl", "beta", "sampling/logp_gap/mean",
                *TIME_METRICS):
        assert key in logged, key
    # the transformers backend in fp32 samples from the policy the loss scores: the logprob gap is ~0
    gaps = [entry["sampling/logp_gap/mean"] for entry in trainer.state.log_history if "sampling/logp_gap/mean" in entry]
    assert len(gaps) == 2 and all(0.0 <= gap < 1e-4 for gap in gaps), gaps
    for key in TIME_METRICS:  # every part of the step took some time
        assert all(entry[key] > 0 for entry in trainer.state.log_history if key in entry), key
    completions = sorted((tmp_path / "run" / "completions").glob("*.parquet"))
    assert completions, "log_completions writes the completions with their episode records"
    import pandas as pd

    table = pd.read_parquet(completions[-1])
    assert "episode" in table.columns and json.loads(table["episode"].iloc[0])["question_id"]
    # each episode's tier, F1, join, consensus, turns and submit flag sit beside its completion ...
    assert {"tier", "f1", "join", "consensus", "turns", "submitted", "dense", "advantage"} <= set(table.columns)
    assert len(table) == 8 and set(table["tier"]) <= {"equivalent", "executable", "parsable", "invalid"}
    assert list(table["turns"]) == [json.loads(e)["counters"]["turns"] for e in table["episode"]]
    # ... and `t2s show` reads them
    from t2s.commands import main
    from t2s.evaluation.browse import run_episodes

    episodes = run_episodes(tmp_path / "run")
    assert len(episodes) == 16 and {e["step"] for e in episodes} == {1, 2}
    assert all(e["tier"] in {"equivalent", "executable", "parsable", "invalid"} for e in episodes)
    tier = episodes[0]["tier"]
    assert main(["show", str(tmp_path / "run"), "--tier", tier]) == 0


def test_train_command_runs_the_smoke_recipe(tiny_model_dir, demo_dir, tmp_path, capsys):
    from t2s.commands import main

    output = tmp_path / "cli"
    code = main(["train", "--config", str(RECIPES_DIR / "smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
                 "--output_dir", str(output), "--max_steps", "1"])
    assert code == 0
    printed = capsys.readouterr()
    # the step printer of `make demo`, not the transformers callbacks' dict of every logged key
    assert "step 1/1  reward " in printed.out and "tiers: equivalent" in printed.out
    # the step's time split, every part measured: generation, environment, reward, forward and backward passes
    assert re.search(r"time \d+\.\d s: generation \d+\.\d  environment \d+\.\d\d  reward \d+\.\d\d  "
                     r"forward/backward \d+\.\d", printed.out), printed.out
    assert "'frac_reward_zero_std'" not in printed.out + printed.err
    assert printed.out.strip().splitlines()[-1] == (  # save_strategy "no": no checkpoint, and none is named
        f"wrote {output} after 1 steps: the trained model and tokenizer, train_summary.json and metrics.jsonl")
    assert not list(output.glob("checkpoint-*"))
    summary = json.loads((output / "train_summary.json").read_text())
    assert summary["global_step"] == 1 and 0 < summary["beta"] <= 1.0
    data = json.loads((output / "data_summary.json").read_text())
    assert data["loaded"] == data["kept"] + data["dropped_difficulty"] + data["dropped_gold_hygiene"] + data[
        "dropped_prompt_too_long"]
    generation = json.loads((output / "generation_config.json").read_text())
    assert len(generation["eos_token_id"]) == 2  # stops on <|im_end|> and <|endoftext|>


def test_demo_trains_three_steps_prints_reward_components_and_evaluates(tiny_model_dir, demo_dir, tmp_path, capsys):
    import argparse

    from t2s.commands import demo

    code = demo.run(argparse.Namespace(steps=3, output=str(tmp_path / "demo"), eval_n=2, model=str(tiny_model_dir)))
    out = capsys.readouterr().out
    assert code == 0
    for step in (1, 2, 3):
        assert f"step {step}/3" in out
    for part in ("reward", "f1", "join", "consensus", "equivalent", "invalid", "beta"):
        assert part in out
    summary = json.loads((tmp_path / "demo" / "model" / "train_summary.json").read_text())
    assert summary["global_step"] == 3
    assert (tmp_path / "demo" / "learn.png").read_bytes()[:4] == b"\x89PNG"  # the curve
    # the trained model on the questions it trained on, with the demo recipe's episode settings
    evaluated = json.loads((tmp_path / "demo" / "eval_model" / "summary.json").read_text())["modes"]["withheld"]
    assert evaluated["n"] == 2
    gold = json.loads((tmp_path / "demo" / "eval_gold" / "summary.json").read_text())["modes"]["full"]
    assert gold["execution_accuracy_official"] == 1.0 and gold["n"] == 63
