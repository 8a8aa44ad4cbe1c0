"""The supervised warm start (``t2s sft``): trajectories the environment plays, trained with TRL's ``SFTTrainer``.

The trajectories are episodes of the GRPO recipe named by ``rl_recipe``: its data, filters and episode settings
(protocol, prompts, tools, budgets). They are played by ``t2s.rollout.driver.Rollout``, the policies' turns written as
a model's (``t2s.rollout.text_policy.TextPolicies``), so each one is the very token stream a training rollout builds:
prompt ids, then model turns and environment turns, with the same ``env_mask``. Where they come from:

- ``trajectories: gold``: the gold policy (``gold_style: explore`` lists and describes the tables, runs the gold SQL
  and submits it; ``submit`` submits the gold SQL in the first turn);
- ``trajectories: PATH``: recorded episodes (an eval's ``episodes.jsonl``), those scored correct, replayed turn by
  turn; a replay that does not end correct again is left out (counted).

``near_misses: K`` adds, per question, K runnable wrong answers played the same way as the gold: other questions'
gold SQL on the same database whose result differs. Their weight against a gold trajectory is ``near_miss_weight``,
realised by repetition in fifths (gold 5 copies, each near miss ``round(5 w)``). A policy warm-started this way fails
with valid near misses rather than garbage, which is what GRPO can improve on.

``format_deviations`` in the counts (``t2s_sft.json``) is how many of the trajectories break the protocol's format
(several JSON objects in a turn, fences, prose): 0 for the gold and near-miss trajectories, which teach the protocol.

Each example is ``input_ids`` = prompt + completion and ``completion_mask`` = 0 over the prompt, then ``env_mask``:
the loss covers the model's own tokens only, as the GRPO loss does. TRL's ``SFTTrainer`` trains on it
(``completion_only_loss``); on a CPU its LM head projects only those tokens, not the prompt's
(``t2s.training.cpu_threads.score_labelled_positions_only``, as in GRPO's passes). The output folder (model and
tokenizer) is what ``t2s train`` (``model_name_or_path``), ``t2s eval --policy model --model`` and ``t2s export``
take.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

from t2s.settings import match_umask
from t2s.training.cpu_threads import score_labelled_positions_only

log = logging.getLogger(__name__)
WEIGHT_STEPS = 5  # near_miss_weight is realised by repetition in fifths of a gold trajectory
MAX_NEAR_MISS_WEIGHT = 100.0  # 500 copies of each near miss: far past any useful weight, well short of memory's end
SUBMIT_THINKING = ""  # the submit style closes an empty think block at once
SUMMARY_FILE = "t2s_sft.json"


@dataclass
class T2SSFTArguments:
    """Where the warm-start trajectories come from."""

    rl_recipe: str = field(
        default="recipes/bird.yaml",
        metadata={"help": "The GRPO recipe the warm-started model will train with: its data, filters and episode "
                  "settings (protocol, prompts, tools, budgets) are the ones the trajectories are played with."},
    )
    trajectories: str = field(
        default="gold",
        metadata={"help": "'gold' (the gold policy), or an eval's episodes.jsonl: its correct episodes, replayed."},
    )
    gold_style: str = field(
        default="explore",
        metadata={"help": "Gold and near-miss turns: 'explore' (list_tables, describe_table of the SQL's tables, "
                  "run_query, submit_sql) or 'submit' (submit_sql in the first turn)."},
    )
    near_misses: int = field(
        default=0,
        metadata={"help": "Runnable wrong answers per question (other questions' gold SQL on the same database whose "
                  "result differs), played like the gold."},
    )
    near_miss_weight: float = field(
        default=0.6,
        metadata={"help": "Weight of each near miss against a gold trajectory (0 to 100), realised by repetition in "
                  "fifths."},
    )
    tiny_model: str | None = field(
        default=None,
        metadata={"help": "Build the tiny offline Qwen3.5 of this preset "
                  "(t2s.training.tiny_model.PRESETS: hybrid, attention) "
                  "at model_name_or_path when it is absent. For the CPU demo and `bench learn`."},
    )
    trajectory_seed: int = field(default=0, metadata={"help": "Seed of the near-miss choice."})


def parse_sft_recipe(argv: list[str]):
    """``--config recipe.yaml [overrides]`` into (sft_args, SFTConfig, ModelConfig)."""
    from trl import ModelConfig, SFTConfig, TrlParser

    from t2s.training.configs import parse_with

    sft_args, config, model_args = parse_with(TrlParser((T2SSFTArguments, SFTConfig, ModelConfig)), argv)
    config.completion_only_loss = True  # the loss covers completion_mask 1: the model's own tokens
    from t2s.backends.cpu_precision import cpu_autocast, has_accelerator

    if config.use_cpu or not has_accelerator():  # SFTConfig's bf16 is true unless set
        cpu_autocast(config)  # bf16 on a CPU only where it has bfloat16 instructions
    return sft_args, config, model_args


def play(rows: list[dict], policies: list, tokenizer, episode_config):
    """Play one text policy per row through the episode driver (``t2s.rollout``); returns its ``EpisodeTrace`` list
    (scored)."""
    from t2s.rollout.driver import Rollout
    from t2s.rollout.text_policy import TextPolicies

    backend = TextPolicies(list(policies), tokenizer, schedule="turnsync")
    return Rollout(backend, tokenizer, episode_config).run(rows)


def answer_policy(row: dict, sql: str, style: str, episode_config):
    """The scripted policy that answers ``row`` with ``sql`` in ``style`` (explore or submit), writing its calls in
    the episode's call format (json, one object a turn, or native ``<tool_call>`` blocks)."""
    from t2s.backends.scripted import GoldPolicy, submit_policy
    from t2s.env.episode import row_database
    from t2s.env.schema import get_schema

    if style == "submit":
        return submit_policy(sql, episode_config.dialect, episode_config.tool_format,
                             thinking=SUBMIT_THINKING if episode_config.enable_thinking else None)
    if style != "explore":
        raise ValueError(f"Error: gold_style {style!r} is unknown; use 'explore' or 'submit'.")
    return GoldPolicy.for_episode(dict(row, gold_sql=sql), get_schema(row_database(row)), episode_config)


def example(trace, kind: str) -> dict:
    """One SFT example: ``input_ids`` = prompt + completion, ``completion_mask`` = 0 over the prompt, then env_mask."""
    return {
        "input_ids": list(trace.prompt_ids) + list(trace.completion_ids),
        "completion_mask": [0] * len(trace.prompt_ids) + list(trace.env_mask),
        "kind": kind,
        "question_id": str(trace.record.question_id),
        "format_deviations": int(trace.record.counters["format_deviations"]),
    }


def _equivalent(trace) -> bool:
    return bool(trace.outcome is not None and trace.outcome.executes and trace.outcome.equivalent)


def _policies(pairs, style: str, episode_config, counts: dict) -> tuple[list[dict], list]:
    """The rows and answer policies of those (row, sql) pairs whose database opens; the others are counted
    (``unreadable_database``), as GRPO's rollout leaves such a row out, not the run."""
    from t2s.env.databases.opening import DatabaseOpenError

    rows, policies = [], []
    for row, sql in pairs:
        try:
            policies.append(answer_policy(row, sql, style, episode_config))
            rows.append(row)
        except DatabaseOpenError:
            counts["unreadable_database"] = counts.get("unreadable_database", 0) + 1
    return rows, policies


def gold_examples(rows, tokenizer, episode_config, style: str, counts: dict) -> list[dict]:
    rows, policies = _policies([(row, row["gold_sql"]) for row in rows], style, episode_config, counts)
    traces = play(rows, policies, tokenizer, episode_config)
    kept = [example(t, "gold") for t in traces if _equivalent(t)]
    counts["gold"] = len(kept)
    counts["gold_not_correct"] = len(traces) - len(kept)
    return kept


def near_miss_examples(rows, tokenizer, episode_config, style: str, per_question: int, seed: int,
                       counts: dict) -> list[dict]:
    """Per question, up to ``per_question`` other questions' gold SQL on its database that runs and differs."""
    rng = random.Random(seed)
    by_db: dict = {}
    for row in rows:
        by_db.setdefault(row["db_id"], []).append(row)
    pairs = []
    for row in rows:
        others = sorted({r["gold_sql"] for r in by_db[row["db_id"]] if r["gold_sql"] != row["gold_sql"]})
        rng.shuffle(others)
        pairs += [(row, sql) for sql in others[: 2 * per_question]]  # spares for those that turn out equivalent
    near_counts: dict = {}  # a database that does not open was counted once already, for its gold
    played, policies = _policies(pairs, style, episode_config, near_counts)
    traces = play(played, policies, tokenizer, episode_config)
    kept, per_row = [], {}
    for row, trace in zip(played, traces, strict=True):
        key = str(row["question_id"])
        runnable_wrong = trace.outcome is not None and trace.outcome.executes and not trace.outcome.equivalent
        if runnable_wrong and per_row.get(key, 0) < per_question:
            per_row[key] = per_row.get(key, 0) + 1
            kept.append(example(trace, "near_miss"))
    counts["near_misses"] = len(kept)
    return kept


def read_correct_episodes(path: Path) -> list[dict]:
    """The correct episodes of an eval's ``episodes.jsonl`` (``official`` true); an ``Error:`` for a bad file."""
    from t2s.data.rows import jsonl_values, read_text_file

    text = read_text_file(path, "episodes file")
    episodes = []
    for number, value in jsonl_values(text, path):
        if not isinstance(value, dict) or not isinstance(value.get("turns"), list):
            raise ValueError(f"Error: {path} line {number} is not an episode record (no 'turns' list)")
        if value.get("official"):
            episodes.append(value)
    return episodes


def recorded_examples(path: Path, rows, tokenizer, episode_config, counts: dict) -> list[dict]:
    """Correct recorded episodes of the recipe's questions, replayed turn by turn; kept when they end correct again."""
    from t2s.backends.scripted import ReplayPolicy

    by_id = {str(row["question_id"]): row for row in rows}
    episodes = read_correct_episodes(path)
    counts["recorded_correct"] = len(episodes)
    chosen = [(by_id[str(e.get("question_id"))], e) for e in episodes if str(e.get("question_id")) in by_id]
    counts["recorded_not_in_data"] = len(episodes) - len(chosen)
    same_mode = [pair for pair in chosen if pair[1].get("mode") in (None, episode_config.mode)]
    counts["recorded_other_mode"] = len(chosen) - len(same_mode)
    chosen = same_mode
    policies = [ReplayPolicy([str(turn.get("assistant") or "") for turn in e["turns"]]) for _, e in chosen]
    traces = play([row for row, _ in chosen], policies, tokenizer, episode_config)
    kept = [example(t, "recorded") for t in traces if _equivalent(t)]
    counts["recorded"] = len(kept)
    counts["recorded_not_correct_on_replay"] = len(traces) - len(kept)
    return kept


def build_examples(sft_args: T2SSFTArguments, rows: list[dict], tokenizer, episode_config) -> tuple[list[dict], dict]:
    """The warm-start examples, repeated by weight, and the counts of what was kept and left out."""
    from t2s.training.configs import ConfigError

    if sft_args.near_misses < 0 or not 0 <= sft_args.near_miss_weight <= MAX_NEAR_MISS_WEIGHT:  # nan fails too
        raise ConfigError(f"Error: near_misses must be >= 0 and near_miss_weight from 0 to {MAX_NEAR_MISS_WEIGHT} "
                          f"(got {sft_args.near_misses} and {sft_args.near_miss_weight}).")
    from t2s.env.chat_format import chat_format

    episode_config = chat_format(tokenizer).episode_config(episode_config)  # thinking as the template writes it
    counts: dict = {"questions": len(rows)}
    if sft_args.trajectories == "gold":
        base = gold_examples(rows, tokenizer, episode_config, sft_args.gold_style, counts)
    else:
        from t2s.training.pipeline import resolve_path

        path = resolve_path(sft_args.trajectories)
        if path is None or not path.is_file():
            raise ConfigError(f"Error: trajectories {sft_args.trajectories!r} is neither 'gold' nor an episodes file.")
        base = recorded_examples(path, rows, tokenizer, episode_config, counts)
    if not base:
        raise ConfigError(f"Error: no correct trajectory to train on ({counts}).")
    near = []
    if sft_args.near_misses:
        near = near_miss_examples(rows, tokenizer, episode_config, sft_args.gold_style, sft_args.near_misses,
                                  sft_args.trajectory_seed, counts)
    base_copies, near_copies = (WEIGHT_STEPS, round(WEIGHT_STEPS * sft_args.near_miss_weight)) if near else (1, 0)
    examples = [e for e in base for _ in range(base_copies)] + [e for e in near for _ in range(near_copies)]
    counts["examples"] = len(examples)
    counts["format_deviations"] = sum(1 for e in base + near if e["format_deviations"])  # trajectories, not copies
    return examples, counts


def prepare_model(sft_args: T2SSFTArguments, model_args) -> str:
    """The model folder (the tiny preset built there when asked and absent; a folder holding another model is used as
    it is, never written over) or hub id to start from."""
    from t2s.training.configs import ConfigError
    from t2s.settings import workspace
    from t2s.training.pipeline import resolve_path

    name = model_args.model_name_or_path
    if not name:
        raise ConfigError("Error: model_name_or_path is not set in the recipe.")
    if sft_args.tiny_model:
        from t2s.training.tiny_model import build_tiny_model

        target = workspace() / name  # an absolute name stays as it is
        if (target / "config.json").is_file() and not (target / "t2s_tiny.json").is_file():
            return str(target)  # a model of the user's, as the recipe's tiny preset would be: used as it is
        return str(build_tiny_model(target, preset=sft_args.tiny_model))
    local = resolve_path(name)
    return str(local) if local is not None else name


def load_rl_recipe(sft_args: T2SSFTArguments):
    """(script_args, training_args) of the GRPO recipe the trajectories are played with."""
    from t2s.training.configs import ConfigError, parse_recipe
    from t2s.training.pipeline import resolve_path

    path = resolve_path(sft_args.rl_recipe)
    if path is None or not path.is_file():
        raise ConfigError(f"Error: rl_recipe {sft_args.rl_recipe!r} not found.")
    script_args, training_args, _ = parse_recipe(["--config", str(path)])
    if training_args.system_prompt_file:  # as `train` reads it: a shipped file such as recipes/prompt.txt
        prompt = resolve_path(training_args.system_prompt_file)
        if prompt is None:
            raise ConfigError(f"Error: system_prompt_file {training_args.system_prompt_file!r} not found.")
        training_args.system_prompt_file = str(prompt)
    return script_args, training_args


def build_sft_trainer(sft_args: T2SSFTArguments, config, model_args, *, callbacks=None):
    """The examples played and a ready TRL ``SFTTrainer``; returns (trainer, counts)."""
    from datasets import Dataset
    from trl import SFTTrainer

    from t2s.training.checkpoints import check_model_folder, loading_model
    from t2s.training.pipeline import load_chat_tokenizer, load_training_rows

    script_args, rl_args = load_rl_recipe(sft_args)
    model_path = prepare_model(sft_args, model_args)
    check_model_folder(model_path)
    tokenizer = load_chat_tokenizer(model_path, rl_args.chat_template, revision=model_args.model_revision,
                                    trust_remote_code=config.trust_remote_code)
    rows, data_counts = load_training_rows(script_args, rl_args, tokenizer)
    examples, counts = build_examples(sft_args, rows, tokenizer, rl_args.episode_config())
    counts["data"] = data_counts
    longest = max(len(e["input_ids"]) for e in examples)
    if config.max_length is not None and config.max_length < longest:
        from t2s.training.configs import ConfigError

        raise ConfigError(f"Error: max_length {config.max_length} would cut trajectories of up to {longest} tokens; "
                          "raise it (or set it to the episode budget).")
    init_kwargs = dict(config.model_init_kwargs or {})
    if model_args.dtype is not None:
        init_kwargs.setdefault("dtype", model_args.dtype)
    config.model_init_kwargs = init_kwargs or None
    dataset = Dataset.from_list([{"input_ids": e["input_ids"], "completion_mask": e["completion_mask"]}
                                 for e in examples])
    with loading_model(model_path):  # a config.json at odds with its weights: one Error: line
        trainer = SFTTrainer(model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=callbacks)
    score_labelled_positions_only()  # on a CPU, the LM head projects the model's own tokens only (as GRPO's passes)
    return trainer, counts


def fit(trainer, counts: dict):
    """Train, save the model and tokenizer and ``t2s_sft.json`` in output_dir; returns the trainer."""
    trainer.train()
    trainer.save_model(trainer.args.output_dir)
    if trainer.accelerator.is_main_process:
        match_umask(trainer.args.output_dir)
        summary = {"global_step": trainer.state.global_step, "trajectories": counts}
        Path(trainer.args.output_dir, SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    trainer.accelerator.end_training()
    return trainer
