"""From a parsed recipe to a trained model: the rows (loaded, filtered, counted), the model path, the trainer, resume
and fit, shared by ``train``, ``sft``, ``demo`` and ``bench learn``.

Before the model loads, rows are loaded (``t2s.data.loaders.load_rows``), filtered by difficulty (labelled or, with
``difficulty_estimated``, estimated), by pass rate when a file is given, and by gold hygiene; rows whose prompt
leaves less than ``min_episode_tokens`` of the episode budget are dropped. Every drop is counted, logged and written
to ``<output_dir>/data_summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from t2s.settings import match_umask

log = logging.getLogger(__name__)


def load_chat_tokenizer(model_path, chat_template: str | None = None, **kwargs):
    """The policy's tokenizer, given the recipe's ``chat_template`` file when it names one, and its chat format read
    (``t2s.env.chat_format``): a template t2s cannot use stops the run here, with the fix."""
    from transformers import AutoTokenizer

    from t2s.env.chat_format import ChatFormatError, apply_chat_template_file, chat_format
    from t2s.errors import first_line
    from t2s.training.configs import ConfigError

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, **kwargs)
    except OSError:
        raise  # a hub id offline, a missing file: transformers' own message names it
    except Exception as exc:  # noqa: BLE001 - a tokenizer file that is not JSON, or not a tokenizer
        raise ConfigError(f"Error: cannot load the tokenizer of {model_path}: {first_line(exc)} (in tokenizer.json or "
                          "tokenizer_config.json?)") from None
    template = None
    if chat_template:
        template = resolve_path(chat_template)
        if template is None:
            raise ConfigError(f"Error: chat_template {chat_template!r} not found.")
    try:
        chat_format(apply_chat_template_file(tokenizer, template))
    except ChatFormatError as exc:
        raise ConfigError(str(exc)) from None
    return tokenizer


def resolve_path(path: str | None) -> Path | None:
    """A path as given if it exists, else a shipped repository path (recipes name repo paths such as
    ``data/demo/dev.json``), else one under the workspace; None if absent."""
    if not path:
        return None
    from t2s.settings import shipped, workspace

    for candidate in (Path(path), shipped(path), workspace() / path):
        if candidate.exists():
            return candidate.resolve()
    return None


def check_data_paths(script_args) -> tuple[Path | None, Path | None]:
    """The resolved data file and db_root; a ConfigError for a missing one (SQaLe may name a Hub dataset)."""
    from t2s.training.configs import ConfigError

    data_path = resolve_path(script_args.dataset_path)
    if data_path is None and script_args.dataset_kind != "sqale":
        raise ConfigError(f"Error: dataset_path {script_args.dataset_path!r} not found (looked in the working "
                          "directory and the repository root).")
    db_root = resolve_path(script_args.db_root) if script_args.db_root else None
    if script_args.db_root and db_root is None:
        raise ConfigError(f"Error: db_root {script_args.db_root!r} not found.")
    return data_path, db_root


def load_training_rows(script_args, training_args, tokenizer=None) -> tuple[list[dict], dict]:
    """Rows for training and the counts of every filter; raises ConfigError for a missing data path."""
    from t2s.training.configs import ConfigError
    from t2s.data.loaders import load_rows

    data_path, db_root = check_data_paths(script_args)
    opts = {"schemas": script_args.sqale_schemas} if script_args.dataset_kind == "sqale" else {}
    engine = getattr(script_args, "engine", "sqlite") or "sqlite"

    def load(**more):
        return load_rows(script_args.dataset_kind, str(data_path or script_args.dataset_path),
                         str(db_root) if db_root else None, **opts, **more)

    if engine == "sqlite":
        rows = load()
    else:  # the same questions on DuckDB files or a PostgreSQL server (`t2s data convert`)
        from t2s.data.loaders import rows_on_engine
        from t2s.data.rows import DataError

        try:
            rows = rows_on_engine(lambda: load(require_databases=False), engine,
                                  script_args.dsn or os.environ.get("T2S_DSN"), require_databases=True)
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    rows = list(rows)
    counts: dict = {"loaded": len(rows)}
    if script_args.difficulties:
        wanted = set(script_args.difficulties)
        if script_args.difficulty_estimated:
            from t2s.data.difficulty import estimate

            unlabelled = [r for r in rows if r.get("difficulty") is None]
            for row, level in zip(unlabelled, estimate(unlabelled), strict=True):
                row["difficulty"] = level
            counts["difficulty_estimated"] = len(unlabelled)
        kept = [r for r in rows if r.get("difficulty") in wanted]
        counts["dropped_difficulty"] = len(rows) - len(kept)
        rows = kept
    if script_args.pass_rate_file:
        path = resolve_path(script_args.pass_rate_file)
        if path is None:
            raise ConfigError(f"Error: pass_rate_file {script_args.pass_rate_file!r} not found.")
        keep_ids = pass_rate_ids(path)
        kept = [r for r in rows if str(r["question_id"]) in keep_ids]
        counts["dropped_pass_rate"] = len(rows) - len(kept)
        rows = kept
    if script_args.gold_hygiene:
        from t2s.data.hygiene import filter_rows

        before = len(rows)
        rows, hygiene = filter_rows(rows)
        counts["dropped_gold_hygiene"] = before - len(rows)
        counts["gold_hygiene"] = hygiene
    if tokenizer is not None:
        rows, too_long = drop_long_prompts(rows, tokenizer, training_args)
        counts["dropped_prompt_too_long"] = too_long
    if script_args.max_train_rows is not None and len(rows) > script_args.max_train_rows:
        import random

        random.Random(script_args.rows_seed).shuffle(rows)
        rows = rows[: script_args.max_train_rows]
    counts["kept"] = len(rows)
    if not rows:
        raise ConfigError(f"Error: no training rows left after filtering ({counts}).")
    return rows, counts


def pass_rate_ids(path: Path) -> set[str]:
    """Question ids kept by ``t2s data passrate`` (its JSON list of rows, or JSONL with question_id)."""
    from t2s.data.rows import DataError, jsonl_values, read_text_file

    text = read_text_file(path, what="pass_rate_file")
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):  # JSONL; a line that is not JSON is a DataError naming it
        items = [value for _, value in jsonl_values(text, path)]
    items = [items] if isinstance(items, dict) else items
    if not isinstance(items, list) or not all(isinstance(item, dict) and "question_id" in item for item in items):
        raise DataError(f"Error: {path} is not what `t2s data passrate` writes: rows, each with a question_id")
    return {str(item["question_id"]) for item in items}


def drop_long_prompts(rows: list[dict], tokenizer, training_args) -> tuple[list[dict], int]:
    """Drop rows whose rendered prompt leaves less than ``min_episode_tokens`` of the episode budget."""
    from t2s.env.episode import Episode
    from t2s.rollout.tokens import first_prompt_ids

    config = training_args.episode_config()
    kept = []
    for row in rows:
        prompt_tokens = len(first_prompt_ids(tokenizer, Episode(row, config)))
        if config.episode_token_budget - prompt_tokens >= config.min_episode_tokens:
            kept.append(row)
    dropped = len(rows) - len(kept)
    if dropped:
        log.warning("dropped %d rows whose prompt leaves less than %d of the %d-token episode budget", dropped,
                    config.min_episode_tokens, config.episode_token_budget)
    return kept, dropped


def prepare_model_path(script_args, model_args) -> str:
    """The model to load: a local folder (built first for the tiny smoke model) or a hub id."""
    from t2s.training.configs import ConfigError

    name = model_args.model_name_or_path
    if not name:
        raise ConfigError("Error: model_name_or_path is not set in the recipe.")
    local = resolve_path(name)
    if local is not None:
        return str(local)
    if script_args.build_tiny_model:
        from t2s.settings import workspace
        from t2s.training.tiny_model import build_tiny_model

        target = workspace() / name  # an absolute name stays as it is
        return str(build_tiny_model(target))
    return name


def build_trainer(script_args, training_args, model_args, *, callbacks=None):
    """Load data and model and return a ready :class:`Text2SQLGRPOTrainer` (plus the data counts)."""
    from datasets import Dataset
    from trl import get_peft_config

    from t2s.training.configs import ConfigError
    from t2s.training.trainer import Text2SQLGRPOTrainer

    check_data_paths(script_args)
    if training_args.system_prompt_file:  # a recipe may name a shipped file such as recipes/prompt.txt
        prompt_file = resolve_path(training_args.system_prompt_file)
        if prompt_file is None:
            raise ConfigError(f"Error: system_prompt_file {training_args.system_prompt_file!r} not found.")
        training_args.system_prompt_file = str(prompt_file)
    model_path = prepare_model_path(script_args, model_args)
    from t2s.training.checkpoints import check_model_folder

    check_model_folder(model_path)
    tokenizer = load_chat_tokenizer(model_path, training_args.chat_template, padding_side="left",
                                    revision=model_args.model_revision,
                                    trust_remote_code=training_args.trust_remote_code)
    rows, counts = load_training_rows(script_args, training_args, tokenizer)
    log.info("training rows: %s", counts)
    batch, group = training_args.generation_batch_size, training_args.num_generations
    if len(rows) < batch // group:  # TRL's sampler yields only whole batches of questions: no step would run
        raise ConfigError(f"Error: {len(rows)} training rows left after filtering, fewer than the {batch // group} "
                          f"questions one generation batch samples (generation_batch_size {batch} / num_generations "
                          f"{group}), so no step would run ({counts}).")
    init_kwargs = dict(training_args.model_init_kwargs or {})
    for key in ("dtype", "attn_implementation"):
        value = getattr(model_args, key, None)
        if value is not None:
            init_kwargs.setdefault(key, value)
    if model_args.model_revision and model_args.model_revision != "main":
        init_kwargs.setdefault("revision", model_args.model_revision)
    training_args.model_init_kwargs = init_kwargs or None
    dataset = Dataset.from_list([{"prompt": row["question"], **row} for row in rows])
    trainer = Text2SQLGRPOTrainer(model_path, training_args, train_dataset=dataset, processing_class=tokenizer,
                                  peft_config=get_peft_config(model_args), callbacks=callbacks)
    return trainer, counts


def resume_checkpoint(training_args) -> str | None:
    """``resume_from_checkpoint``: a folder, or ``latest``/``true`` for the newest *complete* checkpoint in output_dir.

    ``latest`` passes over newer incomplete checkpoints (``t2s.training.checkpoints.checkpoint_problem``, e.g. a save
    cut off by a crash) with one warning naming them and the one chosen; a named folder that is incomplete is a
    ConfigError, and so is a fresh run into an output_dir that holds a run (``checkpoints.fresh_run_problem``)."""
    from t2s.training.checkpoints import checkpoint_problem, fresh_run_problem, newest_complete_checkpoint
    from t2s.training.configs import ConfigError

    value, output_dir = training_args.resume_from_checkpoint, training_args.output_dir
    model_only = bool(getattr(training_args, "save_only_model", False))
    if value in (None, "", False):
        if problem := fresh_run_problem(output_dir, model_only=model_only):
            raise ConfigError(problem)
        return None
    if str(value).lower() in ("latest", "last", "true"):
        found, skipped = newest_complete_checkpoint(output_dir, model_only=model_only)
        passed_over = "; ".join(f"{folder} ({problem})" for folder, problem in skipped)
        if found is None and not skipped:
            raise ConfigError(f"Error: no checkpoint to resume in {output_dir}.")
        if found is None:
            raise ConfigError(f"Error: no complete checkpoint to resume in {output_dir}: incomplete {passed_over}.")
        if skipped and int(os.environ.get("RANK", "0")) == 0:
            log.warning("resuming from %s: passing over incomplete %s", found, passed_over)
        return str(found)
    if not os.path.isdir(value):
        raise ConfigError(f"Error: checkpoint {value!r} not found.")
    problem = checkpoint_problem(value, model_only=model_only)
    if problem is not None:
        raise ConfigError(f"Error: checkpoint {value} cannot be resumed: {problem}.")
    return str(value)


def fit(trainer, counts: dict, checkpoint: str | None = None, recipe: dict | None = None):
    """Train (from ``checkpoint`` when given), save the model and a summary in output_dir, then end the run.
    ``recipe`` (``{"recipe": file name, "overrides": [flags]}``, from ``train``) goes into ``train_summary.json``,
    where ``export`` reads which overrides the run used.

    Ending the run unregisters the process group, but the trainer's model still holds it, and the trainer lives in
    reference cycles. Left to the collector at interpreter shutdown, a gloo worker thread still dropping its last
    collective needs the GIL, is made to exit, and the process aborts ("terminate called without an active
    exception") after a finished run. So a caller done with the trainer drops it and calls :func:`free_finished_run`.
    """
    output_dir = trainer.args.output_dir
    if trainer.accelerator.is_main_process:
        os.makedirs(output_dir, exist_ok=True)
        Path(output_dir, "data_summary.json").write_text(json.dumps(counts, indent=2, default=str))
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(output_dir)
    played = gather_counts(trainer.episodes_played)  # collective: every process's share, in rank order
    if trainer.accelerator.is_main_process:
        match_umask(output_dir)
        summary = {"global_step": trainer.state.global_step, "beta": trainer.beta, "data": counts,
                   "processes": trainer.accelerator.num_processes, "episodes_by_process": played, **(recipe or {})}
        Path(output_dir, "train_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    from t2s.training.vllm_sync import release_engine

    release_engine(trainer)
    # every rank ends the group together: a rank that leaves while another is still descheduled before its own end
    # closes the gloo connections under it, and that process aborts (seen once in a loaded two-process test run)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return trainer


def gather_counts(count: int, timeout: float = 30.0) -> list[int]:
    """Every process's ``count`` in rank order (a collective; ``[count]`` outside a process group), returned once the
    group's worker threads have let go of the tensors it used, or after ``timeout`` seconds.

    A gloo worker marks a collective done before it drops its hold on the tensors, and dropping that hold on tensors
    Python also owns takes the GIL (torch hands their Python objects back). A process that frees its process group
    just after its last collective joins the workers while holding the GIL, and a worker still to drop that hold waits
    for the GIL forever (seen in a two-process run on a starved machine: rank 0 hung in :func:`free_finished_run`).
    :func:`fit` makes this its last collective with tensors; the wait here, with the GIL free, closes that window.
    A tensor's reference count is how its holders are seen: the worker's hold adds one."""
    import sys
    import time

    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [int(count)]
    mine = torch.tensor([count], dtype=torch.long)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    held = [mine, *gathered]

    def holders() -> list[int]:  # measured the same way each time, so only the worker's hold differs
        return [sys.getrefcount(tensor) for tensor in held]

    alone = holders()
    dist.all_gather(gathered, mine)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(now > before for now, before in zip(holders(), alone, strict=True)):
        time.sleep(0.002)
    return [int(tensor) for tensor in gathered]


def release_kept_frames() -> bool:
    """Drop the tracebacks of exceptions kept at module level; when one was dropped, run the collector. Returns
    whether one was.

    A library that keeps an import error at module level keeps its traceback, and with it every frame on the stack of
    that first import, locals included. vLLM 0.31 does so (``vllm.multimodal.media.audio`` keeps torchcodec's
    ``ModuleNotFoundError``), so whatever the frames that first imported vLLM held outlives them: the trainer, when
    vLLM is first imported while the trainer is built; an evaluation's runner and its engine, when it is first
    imported while an in-process ``eval --policy vllm`` sets up. Such errors keep their message and type here and
    lose only their traceback. ``t2s.commands.main`` calls this after every command (without a kept traceback it
    costs a scan of the loaded modules, not a collection).
    """
    import gc
    import sys

    dropped = False
    for module in list(sys.modules.values()):
        try:  # sys.modules may hold any object (a lazy or fake module among them)
            values = list(vars(module).values())
        except Exception:  # noqa: BLE001 - no __dict__, or one that cannot be read: nothing kept there
            continue
        for value in values:
            # not isinstance: no module attribute's __class__ is asked
            if issubclass(type(value), BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                dropped = True
    if dropped:
        gc.collect()
    return dropped


def free_finished_run() -> None:
    """Free a trainer its caller has dropped (``del trainer``), with its model and process group, while Python is
    fully alive (see :func:`fit`): the kept frames that may hold it go (:func:`release_kept_frames`), then the
    collector runs whatever happened, since the trainer lives in reference cycles; then the heap pages it freed go back
    to the system (:func:`return_freed_memory`)."""
    import gc

    if not release_kept_frames():
        gc.collect()
    return_freed_memory()


def return_freed_memory() -> bool:
    """Ask the C allocator to hand the free pages inside its heaps back to the system (glibc's ``malloc_trim(0)``);
    returns whether this C library has that call (not macOS or musl, where this does nothing).

    glibc keeps what a process frees below memory still in use: after a finished run, the pages of its activations and
    gradients stay resident. ``bench learn-real`` trains its warm start in its own process and GRPO in a child beside
    it; without this the bench's process held 8.6 GB through the GRPO runs, and 1.8 GB once trimmed."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols, its C library's among them
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def say_written(trainer, what: str) -> None:
    """A run's last line, on the main process: the output folder and what it holds, as ``eval`` and ``export`` end."""
    if trainer.accelerator.is_main_process:
        from t2s.ui.console import console

        console().print(f"wrote {trainer.args.output_dir} after {trainer.state.global_step} steps: {what}",
                        markup=False, highlight=False)


def use_step_printer(trainer) -> None:
    """Print each step as ``make demo`` does (reward components, tiers, episode rates, KL, beta) instead of the
    transformers callbacks' dict of every logged key; every key still reaches trainer_state.json and the trackers."""
    from transformers import PrinterCallback, ProgressCallback

    from t2s.training.progress import step_printer
    from t2s.ui.console import console

    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    if trainer.accelerator.is_main_process:
        trainer.add_callback(step_printer(console()))


def start_command(config: str) -> Path | None:
    """What ``train`` and ``sft`` do first: find the recipe (before anything heavy is imported: a mistyped path is
    answered at once), then CPU threads (before torch is imported), quiet settings, logging.

    Returns the recipe's path, or None after one ``Error:`` line (once for the processes of one launch) when it is
    not found.
    """
    path = resolve_path(config)
    if path is None or not path.is_file():
        from t2s.ui.console import print_error_once

        print_error_once(f"Error: recipe {config} not found.")
        return None
    from t2s.training.cpu_threads import configure_cpu_threads
    from t2s.settings import command_environment

    configure_cpu_threads()
    command_environment()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return path
