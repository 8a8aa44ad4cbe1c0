"""`t2s sft`: warm-start trajectories are the training token stream, the SFT loss mask is the RL env_mask, and the
output folder is a model that `train`, `eval` and `export` take as it is. Real SQLite, real SFTTrainer steps."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

from t2s.backends.scripted import ReplayPolicy
from t2s.training import warm_start as sft
from t2s.env.episode import EpisodeConfig
from t2s.rollout.text_policy import run_text_episode
from t2s.settings import RECIPES_DIR, REPO_ROOT
from tests import preloaded

IM_END = "<|im_end|>"
# Several turns, so that environment tokens sit between model turns.
EXPLORE = EpisodeConfig(mode="withheld", max_turns=4, episode_token_budget=4096, max_tokens_per_turn=256,
                        forced_turn_reserve=64, min_episode_tokens=256)


@pytest.fixture(scope="module")
def demo_recipe():
    return sft.load_rl_recipe(sft.T2SSFTArguments(rl_recipe="recipes/demo.yaml"))


def roomy(demo_recipe) -> EpisodeConfig:
    """demo.yaml's episode settings with room for the test tokenizer's longer turns (it lacks the demo's words)."""
    return dataclasses.replace(demo_recipe[1].episode_config(), max_tokens_per_turn=160)


@pytest.fixture(scope="module")
def rows(demo_recipe, tiny_tokenizer, demo_dir):
    from t2s.training.pipeline import load_training_rows

    script_args, rl_args = demo_recipe
    found, _ = load_training_rows(script_args, rl_args, tiny_tokenizer)
    return found


def _sft_argv(tiny_model_dir, output_dir, *extra) -> list[str]:
    """recipes/sft_warmstart.yaml on the tiny model and recipes/demo.yaml's environment, a few CPU steps."""
    return ["--config", str(RECIPES_DIR / "sft_warmstart.yaml"), "--model_name_or_path", str(tiny_model_dir),
            "--rl_recipe", "recipes/demo.yaml", "--gold_style", "submit", "--dtype", "float32", "--bf16", "false",
            "--use_cpu", "true", "--gradient_checkpointing", "false", "--max_steps", "3",
            "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--max_length", "640",
            "--learning_rate", "1e-3", "--output_dir", str(output_dir), "--logging_steps", "1",
            "--disable_tqdm", "true",
            *extra]


def _segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for token, bit in zip(ids, mask, strict=True):
        if out and out[-1][0] == bit:
            out[-1][1].append(token)
        else:
            out.append((bit, [token]))
    return out


def test_gold_trajectories_are_the_training_token_stream(rows, tiny_tokenizer):
    chosen = rows[:3]
    policies = [sft.answer_policy(row, row["gold_sql"], "explore", EXPLORE) for row in chosen]
    traces = sft.play(chosen, policies, tiny_tokenizer, EXPLORE)
    for row, trace in zip(chosen, traces, strict=True):
        assert trace.outcome.equivalent and trace.record.to_json()["counters"]["submitted"]
        # the same turns and observations as the text path plays for the same policy
        text_record = run_text_episode(row, EXPLORE, sft.answer_policy(row, row["gold_sql"], "explore", EXPLORE),
                                       tokenizer=tiny_tokenizer).to_json()
        assert trace.record.to_json()["turns"] == text_record["turns"] and len(trace.record.to_json()["turns"]) == 4
        # the protocol a warm start teaches: one JSON object per turn, no deviation, within the tool turns
        assert [len(turn["calls"]) for turn in trace.record.to_json()["turns"]] == [1, 1, 1, 1]
        assert trace.record.counters["format_deviations"] == 0 and trace.record.counters["forced"] == 0
        example = sft.example(trace, "gold")
        prompt = len(trace.prompt_ids)
        assert example["input_ids"] == trace.prompt_ids + trace.completion_ids
        assert example["completion_mask"] == [0] * prompt + trace.env_mask
        segments = _segments(trace.completion_ids, trace.env_mask)
        model_texts = [tiny_tokenizer.decode(ids) for bit, ids in segments if bit == 1]
        assert model_texts == [text + IM_END for text in trace.assistant_texts]
        env_texts = [tiny_tokenizer.decode(ids) for bit, ids in segments if bit == 0]
        assert len(env_texts) == 3 and all(turn["observation"] in env for turn, env in
                                           zip(trace.record.to_json()["turns"], env_texts))


@pytest.mark.parametrize("tool_format", ["json", "native"])
def test_warm_start_trajectories_keep_the_format(rows, tiny_tokenizer, tool_format):
    """The gold and near-miss trajectories a warm start trains on deviate from the recipe's call format nowhere."""
    config = dataclasses.replace(EXPLORE, tool_format=tool_format)
    args = sft.T2SSFTArguments(near_misses=1)
    examples, counts = sft.build_examples(args, rows[:8], tiny_tokenizer, config)
    assert counts["gold"] == 8 and counts["near_misses"] >= 1
    assert counts["format_deviations"] == 0 and not any(e["format_deviations"] for e in examples)
    body = tiny_tokenizer.decode(examples[0]["input_ids"])
    assert ("<tool_call>" in body) == (tool_format == "native")


def test_warm_start_counts_deviating_recorded_trajectories(rows, tiny_tokenizer, tmp_path):
    row = rows[0]
    fenced = f'ok\n</think>\n\n```json\n{{"tool": "submit_sql", "args": {{"sql": {json.dumps(row["gold_sql"])}}}}}\n```'
    record = run_text_episode(row, EXPLORE, ReplayPolicy([fenced])).to_json()
    assert record["counters"]["format_deviations"] == 1
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(dict(record, official=1, sample=0)) + "\n")
    examples, counts = sft.build_examples(sft.T2SSFTArguments(trajectories=str(path)), rows, tiny_tokenizer, EXPLORE)
    assert counts["recorded"] == 1 and counts["format_deviations"] == 1 and examples[0]["format_deviations"] == 1


def test_near_misses_run_and_are_wrong(rows, tiny_tokenizer, demo_recipe):
    config = roomy(demo_recipe)
    counts: dict = {}
    same_db = [r for r in rows if r["db_id"] == "cycling_club"][:6]
    assert len(same_db) == 6
    examples = sft.near_miss_examples(same_db, tiny_tokenizer, config, "submit", 2, 0, counts)
    assert counts["near_misses"] == len(examples) == 12
    for e in examples:
        row = next(r for r in rows if str(r["question_id"]) == e["question_id"])
        text = tiny_tokenizer.decode(e["input_ids"])
        assert json.dumps(row["gold_sql"])[1:-1] not in text  # another question's SQL, not this one's
    # the near miss the policy submits runs, and is not this question's answer
    from t2s.scoring.rewards import execute_final

    for e in examples[:4]:
        row = next(r for r in rows if str(r["question_id"]) == e["question_id"])
        body = tiny_tokenizer.decode([t for t, m in zip(e["input_ids"], e["completion_mask"]) if m])
        submitted = json.loads(body[body.index("{"): body.rindex("}") + 1])["args"]["sql"]
        outcome = execute_final(row, submitted)
        assert outcome.executes and not outcome.equivalent


def test_recorded_episodes_replay_only_the_correct_ones(rows, tiny_tokenizer, demo_recipe, tmp_path):
    config = roomy(demo_recipe)
    lines = []
    # correct; wrong and marked so; correct; marked correct but wrong when replayed here
    for row, sql, official in ((rows[0], rows[0]["gold_sql"], 1), (rows[1], rows[2]["gold_sql"], 0),
                               (rows[3], rows[3]["gold_sql"], 1), (rows[4], rows[5]["gold_sql"], 1)):
        record = run_text_episode(row, config, sft.answer_policy(row, sql, "submit", config)).to_json()
        lines.append(json.dumps(dict(record, official=official, sample=0)))
    lines.append(json.dumps({"question_id": "not-in-data", "mode": "withheld", "official": 1, "turns": []}))
    path = tmp_path / "episodes.jsonl"
    path.write_text("\n".join(lines) + "\n")
    counts: dict = {}
    examples = sft.recorded_examples(path, rows, tiny_tokenizer, config, counts)
    assert [e["question_id"] for e in examples] == [str(rows[0]["question_id"]), str(rows[3]["question_id"])]
    assert counts["recorded_correct"] == 4 and counts["recorded_not_in_data"] == 1 and counts["recorded"] == 2
    assert counts["recorded_not_correct_on_replay"] == 1


def test_sft_trainer_labels_are_the_env_mask_and_it_trains(tiny_model_dir, tmp_path, monkeypatch, lm_head_rows):
    """The prepared labels are the model's own tokens, and on a CPU the LM head projects those positions only (TRL's
    fused head alone would project the prompt's too: ``score_labelled_positions_only``)."""
    labelled = []
    sft_args, config, model_args = sft.parse_sft_recipe(_sft_argv(tiny_model_dir, tmp_path / "out",
                                                                  "--near_misses", "1"))
    trainer, counts = sft.build_sft_trainer(sft_args, config, model_args)
    compute_loss = trainer.compute_loss

    def counting_loss(model, inputs, *args, **kwargs):
        shifted = inputs["labels"][:, 1:]
        labelled.append((int((shifted != -100).sum()), shifted.numel()))
        return compute_loss(model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer, "compute_loss", counting_loss)
    assert counts["gold"] > 0 and counts["near_misses"] > 0
    assert counts["examples"] == counts["gold"] * 5 + counts["near_misses"] * 3  # weight 0.6 in fifths
    prepared = trainer.train_dataset
    assert len(prepared) == counts["examples"]
    for item in prepared.select(range(8)):
        labels = item["labels"]
        # the prepared labels keep exactly the model's own tokens: rebuild the mask from the trajectory itself
        assert len(labels) == len(item["input_ids"])
        trained = [label != -100 for label in labels]
        assert any(trained) and not trained[0]
        im_end = trainer.processing_class.convert_tokens_to_ids(IM_END)
        assert [t for t, keep in zip(item["input_ids"], trained) if keep][-1] == im_end
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    sft.fit(trainer, counts)
    assert trainer.state.global_step == 3
    assert lm_head_rows == [own for own, _ in labelled] and len(labelled) == 3  # one pass a step: its own tokens
    assert all(own < every / 2 for own, every in labelled), labelled  # the prompt is most of every position
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses and all(loss == loss and loss > 0 for loss in losses)
    assert any(not (before[n] == p.detach()).all() for n, p in trainer.model.named_parameters())
    summary = json.loads((tmp_path / "out" / sft.SUMMARY_FILE).read_text())
    assert summary["global_step"] == 3 and summary["trajectories"]["gold"] == counts["gold"]


def test_the_warm_starts_loss_and_metrics_do_not_depend_on_which_positions_the_head_projects(
        tiny_model_dir, tmp_path, monkeypatch, lm_head_rows):
    """One batch through the warm start's loss, the LM head projecting the model's own tokens only (as ``sft`` sets it
    on a CPU) and then every position (TRL's own choice there): the same loss, gradients, entropy, token accuracy and
    token count."""
    import torch
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as trl_utils

    sft_args, config, model_args = sft.parse_sft_recipe(_sft_argv(tiny_model_dir, tmp_path / "out"))
    trainer, _ = sft.build_sft_trainer(sft_args, config, model_args)
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model.train()

    def measured():
        trainer._metrics["train"].clear()
        trainer._total_train_tokens = 0
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return loss.detach(), {k: v[-1] for k, v in trainer._metrics["train"].items()}, grads

    own = measured()
    monkeypatch.setattr(trl_utils, "_use_triton", kernels._use_triton)
    every = measured()
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    assert lm_head_rows == [labelled, batch["labels"][:, 1:].numel()]
    torch.testing.assert_close(own[0], every[0], rtol=1e-5, atol=1e-6)
    assert own[1].keys() == every[1].keys() >= {"entropy", "mean_token_accuracy", "num_tokens"}
    for key in every[1]:
        assert own[1][key] == pytest.approx(every[1][key], rel=1e-5, abs=1e-6), key
    assert len(own[2]) == len(every[2]) > 0
    for got, want in zip(own[2], every[2]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_sft_examples_mask_matches_rollout_env_mask(rows, tiny_tokenizer, demo_recipe):
    """The mask SFT trains on is the env_mask the RL rollout returns for the same episode (``to_trl``)."""
    from t2s.rollout.trace import to_trl

    config = roomy(demo_recipe)
    chosen = rows[:4]
    traces = sft.play(chosen, [sft.answer_policy(r, r["gold_sql"], "submit", config) for r in chosen],
                      tiny_tokenizer, config)
    trl_output = to_trl(traces, tiny_tokenizer.convert_tokens_to_ids(IM_END))
    counts: dict = {}
    examples = sft.gold_examples(chosen, tiny_tokenizer, config, "submit", counts)
    for example, prompt, completion, env_mask in zip(examples, trl_output["prompt_ids"], trl_output["completion_ids"],
                                                     trl_output["env_mask"], strict=True):
        assert example["input_ids"] == prompt + completion
        assert example["completion_mask"][len(prompt):] == env_mask
        assert not any(example["completion_mask"][:len(prompt)])


def _run(*args, timeout=600):
    """``python -m t2s ARGS``, from an interpreter that has imported what the command imports first."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return preloaded.run([sys.executable, "-m", "t2s", *args], preload="grpo" if args[0] == "train" else "torch",
                         env=env, timeout=timeout, cwd=REPO_ROOT)


@pytest.mark.slow
def test_sft_command_output_is_taken_by_train_eval_and_export(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """``sft`` and ``train`` in processes of their own (what each prints on stderr is checked), ``eval`` and
    ``export`` in this one."""
    from t2s.commands import main

    out = tmp_path / "warm"
    done = _run("sft", *_sft_argv(tiny_model_dir, out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / sft.SUMMARY_FILE).read_text())["global_step"] == 3
    # it ends with one line naming the folder, and a CPU run says once that the GPU kernels do not apply
    from t2s.training.cpu_threads import KERNEL_FALLBACK, KERNEL_FALLBACK_LINE

    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"wrote {out} after 3 steps: the warm-started model and tokenizer, t2s_sft.json (") and \
        last.endswith("trajectories off the call format: 0)"), done.stdout[-2000:]
    assert KERNEL_FALLBACK not in done.stderr and done.stderr.count(KERNEL_FALLBACK_LINE) <= 1
    # GRPO from the folder, as it is
    train = _run("train", "--config", str(RECIPES_DIR / "demo.yaml"), "--model_name_or_path", str(out),
                 "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2",
                 "--output_dir", str(tmp_path / "grpo"))
    assert train.returncode == 0, train.stderr[-2000:]
    assert json.loads((tmp_path / "grpo" / "train_summary.json").read_text())["global_step"] == 1
    last = train.stdout.strip().splitlines()[-1]
    assert last.startswith(f"wrote {tmp_path / 'grpo'} after 1 steps: the trained model")
    assert KERNEL_FALLBACK not in train.stderr and train.stderr.count(KERNEL_FALLBACK_LINE) <= 1
    # evaluation with the model policy
    monkeypatch.chdir(REPO_ROOT)  # the recipes' relative paths below are the checkout's
    capsys.readouterr()
    evaluated = main(["eval", "--policy", "model", "--model", str(out), "--data", str(REPO_ROOT / "data/demo/dev.json"),
                      "--n", "2", "--mode", "withheld", "--max-turns", "1", "--max-tokens-per-turn", "64",
                      "--episode-token-budget", "4096", "--device", "cpu", "--output", str(tmp_path / "eval")])
    assert evaluated == 0, capsys.readouterr().err[-2000:]
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())
    # export with that eval (of these weights) and the SFT recipe, whose prompt is its rl_recipe's
    exported = main(["export", "--checkpoint", str(out), "--output", str(tmp_path / "export"), "--eval",
                     str(tmp_path / "eval"), "--recipe", "recipes/demo_sft.yaml"])
    assert exported == 0, capsys.readouterr().err[-2000:]
    assert (tmp_path / "export" / "config.json").is_file() and "## Evaluation" in (tmp_path / "export" / "README.md"
                                                                                    ).read_text()
    assert (tmp_path / "export" / "system_prompt.txt").read_text() == (RECIPES_DIR / "demo_system_prompt.txt"
                                                                       ).read_text().strip() + "\n"
    # the GRPO run's card names the overrides it ran with (paths by their last part)
    grpo_export = main(["export", "--checkpoint", str(tmp_path / "grpo"), "--output", str(tmp_path / "export-grpo"),
                        "--recipe", "recipes/demo.yaml", "--no-verify"])
    assert grpo_export == 0, capsys.readouterr().err[-2000:]
    card = (tmp_path / "export-grpo" / "README.md").read_text()
    assert ("`--model_name_or_path warm --max_steps 1 --per_device_train_batch_size 4 --num_generations 2 "
            "--output_dir grpo`") in card and str(tmp_path) not in card
    # every folder that "loads directly in vLLM" is readable as a whole by a server running as another user
    grpo = tmp_path / "grpo"
    for folder in (out, grpo, *grpo.glob("checkpoint-*"), tmp_path / "export"):
        weights = list(folder.glob("*.safetensors"))
        assert weights, folder
        for path in weights:
            assert path.stat().st_mode & 0o777 == (folder / "config.json").stat().st_mode & 0o777, path


@pytest.mark.parametrize("override, message", [
    (("--rl_recipe", "recipes/missing.yaml"), "rl_recipe 'recipes/missing.yaml' not found"),
    (("--trajectories", "no/such/episodes.jsonl"), "neither 'gold' nor an episodes file"),
    (("--max_length", "16"), "max_length 16 would cut trajectories"),
])
def test_sft_bad_input_is_one_error_line(tiny_model_dir, tmp_path, override, message, capsys, monkeypatch):
    from t2s.commands import main

    monkeypatch.chdir(REPO_ROOT)  # the relative paths above are the checkout's
    assert main(["sft", *_sft_argv(tiny_model_dir, tmp_path / "out", *override)]) == 2  # in-process: nothing raised
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "out" / "config.json").exists()


@pytest.mark.parametrize("style", ["submit", "explore"])
def test_trajectories_are_written_in_the_recipes_call_format(rows, tiny_tokenizer, style):
    """The sibling recipe trains the native format: its warm-start trajectories are <tool_call> blocks that end
    correct, never JSON calls the native reader does not take."""
    native = dataclasses.replace(EXPLORE, dialect="sibling", tool_format="native", episode_token_budget=8192)
    chosen = rows[:2]
    traces = sft.play(chosen, [sft.answer_policy(r, r["gold_sql"], style, native) for r in chosen], tiny_tokenizer,
                      native)
    for trace in traces:
        assert trace.outcome.equivalent and trace.record.to_json()["counters"]["submitted"]
        assert all("<tool_call>" in text and '{"tool"' not in text for text in trace.assistant_texts)
        assert trace.record.to_json()["turns"][-1]["calls"][-1]["tool"] == "submit"


@pytest.mark.parametrize("weight", [-0.2, 100.2, 1e9, float("inf"), float("nan")])
def test_a_near_miss_weight_out_of_range_is_one_error_line(weight):
    from t2s.errors import ConfigError

    args = sft.T2SSFTArguments(near_misses=1, near_miss_weight=weight)
    with pytest.raises(ConfigError) as excinfo:  # before any row, tokenizer or trajectory is read
        sft.build_examples(args, [], None, EpisodeConfig())
    assert str(excinfo.value) == f"Error: near_misses must be >= 0 and near_miss_weight from 0 to 100.0 (got 1 and " \
                                 f"{weight})."


def test_a_row_whose_database_does_not_open_is_left_out_of_the_warm_start_and_counted(rows, tiny_tokenizer, tmp_path):
    corrupt = tmp_path / "broken" / "broken.sqlite"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"not a database " * 100)
    chosen = rows[:3]
    broken = dict(chosen[0], db_id="broken", db_path=str(corrupt), question_id="broken-1")
    counts: dict = {}
    examples = sft.gold_examples([broken, *chosen], tiny_tokenizer, EXPLORE, "explore", counts)
    assert counts["unreadable_database"] == 1 and counts["gold"] == len(examples) > 0
    assert "broken-1" not in {e["question_id"] for e in examples}
    near: dict = {}
    sft.near_miss_examples([broken, dict(broken, question_id="broken-2", gold_sql="SELECT 2")], tiny_tokenizer,
                           EXPLORE, "explore", 1, 0, near)  # every pair on the broken database: none played
    assert near["near_misses"] == 0
