"""`python -m t2s eval`: agentic evaluation with the same episode, tools and metrics code as training.

Policies:
- ``model``: a transformers checkpoint through ``backends.hf_generate`` (CPU or GPU);
- ``vllm``: an offline ``vllm.LLM`` through ``backends.vllm_colocate``;
- ``endpoint``: an OpenAI-compatible server. ``--endpoint-mode completions`` (vLLM) sends token-id prompts with
  ``return_token_ids`` through ``backends.vllm_server``: the same token stream as training. ``chat`` works with any
  server through ``backends.chat_endpoint``; it re-renders history and drops earlier thinking, so its results are
  marked not comparable;
- ``gold``: the scripted self-check (``backends.scripted.GoldPolicy``), which must score 1.0;
- ``predictions``: a file of predicted SQL in the formats ``score`` reads.

Modes: ``full`` (schema in the prompt), ``withheld`` (schema found through tools), ``single`` (schema in, SQL out, no
tools: one turn under ``SINGLE_TURN_SYSTEM_PROMPT``; the SQL is read from a ``submit_sql`` call, a fenced block or a
bare SELECT/WITH after the thinking).

Output folder (one per mode; with several modes each gets ``DIR/<mode>/`` and ``DIR`` gets a side-by-side report):
``episodes.jsonl`` (one scored episode record per question and sample), ``summary.json``, ``summary.md``,
``summary.png``, and ``eval_config.json`` (the run's configuration, which a resumed run must match).

``solve_counts`` runs the same episodes and scoring for ``data passrate`` (per-question solved counts out of k); the
options a policy needs are added by ``add_policy_arguments``, shared by both commands.

``config.comparable`` is true when the run used the training protocol and token stream: a model, vLLM or a
completions endpoint, in full or withheld mode, with thinking on. The original system prompt of the published
checkpoints is not public (``--system-prompt-file`` takes it), so its hash is recorded next to the flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import time
import zlib
from pathlib import Path

from t2s.cli_args import (non_empty_path, non_negative_float, non_negative_int, positive_float, positive_int,
                          unit_float)
from t2s.databases import file_checksum
from t2s.errors import T2SError, writing
from t2s.run_lock import run_folder_lock

POLICIES = ("model", "vllm", "endpoint", "gold", "predictions")
MODES = ("full", "withheld", "single")
ENDPOINT_MODES = ("completions", "chat")
PACKAGES = ("torch", "transformers", "trl", "vllm", "peft", "sqlglot")
TIMING_KEYS = ("started_at", "finished_at", "wall_seconds")

SINGLE_TURN_SYSTEM_PROMPT = """\
You are an expert SQLite analyst. You are given a question, optional evidence (hints about the data) and the \
CREATE TABLE statements of a SQLite database. Write one SQLite SELECT query that answers the question.
Think first if you need to, then give the final query in a ```sql fenced block. Return only one query; no tools \
are available and the query is not run before it is scored."""


class EvalError(T2SError):
    """A user-facing failure; ``str`` is one line beginning ``Error:``."""


# --------------------------------------------------------------------------------------------------------- arguments
def add_sampling_arguments(p) -> None:
    """Sampling and thinking (shared with ``ask``): evaluation defaults T 0.6, top-p 0.95, top-k 20, thinking on."""
    p.add_argument("--temperature", type=non_negative_float, default=0.6)
    p.add_argument("--top-p", type=unit_float, default=0.95)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=True,
                   help="render prompts with thinking on (default: on)")


def add_endpoint_arguments(p) -> None:
    """How to reach an OpenAI-compatible server (shared with ``ask``)."""
    p.add_argument("--endpoint", default=None, help="base URL of an OpenAI-compatible server, e.g. http://localhost:8000")
    p.add_argument("--endpoint-mode", default="completions", choices=ENDPOINT_MODES,
                   help="completions: token ids on a vLLM server (comparable); chat: any server (not comparable)")
    p.add_argument("--served-model", default=None, help="model name on the server (default: the first of /v1/models)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder or hub id (default: --model, else the served name)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--retries", type=non_negative_int, default=3, help="endpoint retries, with exponential backoff")
    p.add_argument("--backoff", type=non_negative_float, default=2.0, help="first endpoint retry delay in seconds")
    p.add_argument("--request-timeout", type=positive_float, default=600.0)
    p.add_argument("--concurrency", type=positive_int, default=64, help="endpoint requests in flight")


def add_policy_arguments(p) -> None:
    """How a policy plays episodes: the model, endpoint or vLLM to use, sampling, episode limits and threads.

    Shared by ``eval`` and ``data passrate`` (whose episodes run through :func:`solve_counts`).
    """
    p.add_argument("--seed", type=int, default=0, help="seeds sampling (eval: also picks the --n questions)")
    add_sampling_arguments(p)
    p.add_argument("--max-turns", type=positive_int, default=6)
    p.add_argument("--episode-token-budget", type=positive_int, default=12288)
    p.add_argument("--max-tokens-per-turn", type=positive_int, default=2048)
    p.add_argument("--system-prompt-file", type=non_empty_path, default=None, help="replace the exec_plan system prompt with this file's text")
    p.add_argument("--model", default=None, help="model folder or hub id (policies model, vllm; tokenizer for endpoint)")
    add_endpoint_arguments(p)
    p.add_argument("--batch-size", type=non_negative_int, default=0, help="episodes per rollout batch (default: 64, 256 for endpoints)")
    p.add_argument("--device", default=None, help="policy model: cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--gpu-memory-utilization", type=unit_float, default=0.85, help="policy vllm")
    p.add_argument("--workers", type=positive_int, default=4, help="threads for scripted episodes and scoring")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def policy_args(**values) -> argparse.Namespace:
    """The defaults of :func:`add_policy_arguments` as a namespace, with ``values`` set on top."""
    parser = argparse.ArgumentParser(add_help=False)
    add_policy_arguments(parser)
    args = parser.parse_args([])
    vars(args).update(values)
    return args


def add_arguments(parser) -> None:
    p = parser
    p.add_argument("--policy", required=True, choices=POLICIES)
    p.add_argument("--data", required=True, type=non_empty_path, help="BIRD/Spider-style JSON (or a folder holding dev.json)")
    p.add_argument("--db-root", type=non_empty_path, default=None,
                   help="folder of per-db_id folders (default: beside the data file)")
    p.add_argument("--mode", nargs="+", default=["full"], choices=MODES, help="one or more of full, withheld, single")
    p.add_argument("--n", type=non_negative_int, default=0, help="questions to evaluate, picked with --seed (0 = all)")
    p.add_argument("--k", type=positive_int, default=1, help="samples per question (k > 1 adds vote_at_k)")
    p.add_argument("--output", required=True, type=non_empty_path, help="output folder (re-running the same command resumes it)")
    p.add_argument("--skip-missing-dbs", action="store_true",
                   help="skip (and count) questions whose database is missing or cannot be read")
    p.add_argument("--predictions", type=non_empty_path, default=None, help="predictions file (policy predictions)")
    add_policy_arguments(p)


def command_environment() -> None:
    """The quiet settings of ``settings.offline_environment`` without forcing the hub offline: ``--model`` and
    ``--base`` may name hub ids, downloaded unless ``HF_HUB_OFFLINE=1`` is set (as ``train`` does)."""
    from t2s.settings import offline_environment

    hub_offline = os.environ.get("HF_HUB_OFFLINE")
    offline_environment()
    if hub_offline is None:
        del os.environ["HF_HUB_OFFLINE"]


def run(args) -> int:
    import logging

    command_environment()
    logging.getLogger("t2s.data.loaders").setLevel(logging.ERROR)  # eval reports missing databases itself
    evaluate(args)  # an EvalError or OSError becomes one Error: line in cli.main
    return 0


# ---------------------------------------------------------------------------------------------------------- helpers
def text_sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def package_versions() -> dict:
    from importlib import metadata

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def select_rows(rows: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` rows picked by ``seed`` from the whole data file (kept in file order); all rows when n is 0.

    The pick depends only on the file's length, n and seed, so runs of different models pair question by question.
    """
    if n <= 0 or n >= len(rows):
        return list(rows)
    positions = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in positions]


def tokenizer_fingerprint(tokenizer) -> tuple[str | None, str | None]:
    """(hash of the vocabulary and special tokens, hash of the chat template)."""
    if tokenizer is None:
        return None, None
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    special = json.dumps(sorted(map(str, getattr(tokenizer, "all_special_tokens", []))))
    return text_sha256(vocab + special), text_sha256(getattr(tokenizer, "chat_template", None))


# ---------------------------------------------------------------------------------------------------- output folder
class EpisodeLog:
    """``episodes.jsonl``: resumable, one line per finished (question, sample), appended and flushed as it finishes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / "episodes.jsonl"
        self.lines: list[dict] = []
        self._handle = None

    def load(self) -> set[tuple[str, int]]:
        """Read earlier lines; a truncated last line (a killed run) is dropped from the file."""
        if not self.path.is_file():
            return set()
        data = self.path.read_bytes()
        raw_lines = data.split(b"\n")
        complete, tail = raw_lines[:-1], raw_lines[-1]  # tail: bytes after the last newline (a cut-off write)
        lines = []
        for number, raw in enumerate(complete, 1):
            if not raw.strip():
                continue
            try:
                lines.append(json.loads(raw))
            except ValueError:
                if number == len(complete) and not tail.strip():
                    complete = complete[: number - 1]
                    break
                raise EvalError(f"Error: {self.path} line {number} is not valid JSON; move the file away to start over")
        if tail.strip():
            try:
                lines.append(json.loads(tail))
                complete.append(tail)
            except ValueError:
                pass  # the last write was cut off: that question runs again
        kept = b"".join(raw + b"\n" for raw in complete)
        if kept != data:
            self.path.write_bytes(kept)
        unique: dict[tuple[str, int], dict] = {}
        for line in lines:
            unique[(str(line["question_id"]), int(line.get("sample", 0)))] = line
        self.lines = list(unique.values())
        return set(unique)

    def append(self, line: dict) -> None:
        with writing(self.path):  # a full disk: the line is cut off, and read again as missing on resume
            if self._handle is None:
                self._handle = open(self.path, "a", encoding="utf-8")
            self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._handle.flush()
        self.lines.append(line)

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            with writing(self.path):
                handle.close()


def comparable_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in TIMING_KEYS}


def check_resume_config(folder: Path, config: dict) -> None:
    """Write ``eval_config.json``, or refuse when the folder holds results of another configuration."""
    path = folder / "eval_config.json"
    wanted = comparable_config(config)
    if path.is_file():
        try:
            old = comparable_config(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, AttributeError):  # cut off or edited: its results cannot be matched to a config
            raise EvalError(f"Error: {path} is unreadable; move {folder} away to start over, or choose another "
                            "--output") from None
        if old != wanted:
            changed = sorted(k for k in set(old) | set(wanted) if old.get(k) != wanted.get(k))
            raise EvalError(
                f"Error: {folder} holds results of a different configuration (changed: {', '.join(changed)}); "
                "re-run with the same settings to resume, or choose another --output"
            )
    elif (folder / "episodes.jsonl").is_file():
        raise EvalError(f"Error: {folder} has episodes.jsonl but no eval_config.json; choose another --output")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------------------- scoring
def score_final_sql(row: dict, record: dict) -> dict:
    """official, strict, soft_f1 and error of an episode's final SQL (``metrics.score_sql`` on scoring connections)."""
    from t2s.databases import ref_from_row
    from t2s.metrics import score_sql

    final_sql = record.get("final_sql")
    scores = score_sql(ref_from_row(row), final_sql, row["gold_sql"])
    if not scores.get("gold_failed") and not (isinstance(final_sql, str) and final_sql.strip()):
        scores["error"] = "Error: no final SQL"
    return scores


def eval_line(row: dict, record: dict, scores: dict, sample: int) -> dict:
    """The eval line: the episode record plus sample, difficulty, official, strict, soft_f1, executes and error.

    When the gold SQL fails the question cannot be scored: official, strict, soft_f1 and executes are null and
    ``gold_error`` says why (the summary leaves such lines out of its averages and counts them).
    """
    error = scores.get("error")
    line = dict(record)
    if scores.get("gold_failed"):
        line.update(sample=sample, difficulty=row.get("difficulty"), official=None, strict=None, soft_f1=None,
                    executes=None, error=record.get("error"), gold_error=error)
        return line
    line.update(
        sample=sample,
        difficulty=row.get("difficulty"),
        official=int(scores["official"]),
        strict=int(scores["strict"]),
        soft_f1=float(scores["soft_f1"]),
        executes=error is None,
        error=record.get("error") or error,
    )
    return line


def score_record(row: dict, record: dict, sample: int) -> dict:
    return eval_line(row, record, score_final_sql(row, record), sample)


def vote_accuracy(lines: list[dict], rows_by_id: dict[str, dict]) -> float:
    """Official EX of execution-consistency voting over each question's samples (DESIGN §7)."""
    from t2s import databases
    from t2s.databases import ref_from_row
    from t2s.metrics import vote

    by_question: dict[str, list[dict]] = {}
    for line in lines:
        if line["official"] is None:  # the gold SQL failed: not scored
            continue
        by_question.setdefault(str(line["question_id"]), []).append(line)
    correct = 0
    for question_id, samples in by_question.items():
        samples.sort(key=lambda line: line["sample"])
        row = rows_by_id[question_id]
        ref = ref_from_row(row)
        gold = databases.gold_result(ref, row["gold_sql"])
        timeout = databases.scoring_timeout(gold.seconds)
        results, cache = [], {}
        for line in samples:
            sql = line.get("final_sql")
            if not (isinstance(sql, str) and sql.strip()):
                results.append(None)
                continue
            if sql not in cache:
                cache[sql] = databases.run_scoring_query(ref, sql, timeout=timeout)
            results.append(cache[sql])
        chosen = vote(results)
        correct += int(chosen is not None and samples[chosen]["official"] == 1)
    return round(correct / len(by_question), 6) if by_question else 0.0


# ---------------------------------------------------------------------------------------------------------- progress
class Progress:
    """A rich progress bar with the running official EX (silent with ``quiet``)."""

    def __init__(self, total: int, done_lines: list[dict], label: str, quiet: bool = False):
        scored = [line["official"] for line in done_lines if line["official"] is not None]
        self.correct = sum(scored)
        self.count = len(scored)
        self.quiet = quiet
        self._progress = None
        if quiet:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from t2s.rich_output import console

        self._progress = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("official EX {task.fields[acc]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console(stderr=True), transient=False,
        )  # fmt: skip
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=self.count, acc=self._acc())

    def _acc(self) -> str:
        return f"{self.correct / self.count:.3f}" if self.count else "-"

    def advance(self, line: dict) -> None:
        if line["official"] is not None:
            self.count += 1
            self.correct += line["official"]
        if self._progress is not None:
            self._progress.update(self._task, advance=1, acc=self._acc())

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


# ------------------------------------------------------------------------------------------------------------ runners
def _episode_config(args, mode: str):
    from t2s.episode import EpisodeConfig

    return EpisodeConfig(
        mode=mode if mode != "single" else "full",
        max_turns=args.max_turns,
        episode_token_budget=args.episode_token_budget,
        max_tokens_per_turn=args.max_tokens_per_turn,
        system_prompt_file=args.system_prompt_file,
        enable_thinking=args.enable_thinking,
    )


def _sampling(args):
    from t2s.backends.base import SamplingSettings

    return SamplingSettings(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def single_turn_messages(row: dict) -> list[dict]:
    """``single`` mode: the single-turn system prompt and the full-mode user message (question, evidence, schema)."""
    from t2s import protocol
    from t2s.databases import ref_from_row
    from t2s.schema import get_schema

    schema = get_schema(ref_from_row(row))
    return [{"role": "system", "content": SINGLE_TURN_SYSTEM_PROMPT},
            {"role": "user", "content": protocol.user_prompt(row, "full", schema)}]


def single_turn_sql(text: str) -> tuple[str | None, int]:
    """(SQL, format deviations) of a single-turn answer: a submit_sql call, else a fenced block or bare SQL."""
    from t2s import protocol

    parsed = protocol.parse_turn(text)
    for call in parsed.calls:
        if call.tool == "submit_sql" and isinstance(call.args, dict) and isinstance(call.args.get("sql"), str):
            return call.args["sql"], parsed.deviations
    return protocol.bare_sql(parsed.body), 0


def single_turn_record(row: dict, text: str | None, *, cut_off: bool = False, sql: str | None = None) -> dict:
    """An episode record (DESIGN §10 keys) for a one-turn answer."""
    from t2s.episode import COUNTER_KEYS

    deviations = 0
    if sql is None and text is not None:
        sql, deviations = single_turn_sql(text)
    counters = {key: 0 for key in COUNTER_KEYS}
    counters.update(turns=1 if text is not None else 0, format_deviations=deviations, turn_cutoffs=int(cut_off))
    for flag in ("submitted", "forced", "fallback_used", "truncated"):
        counters[flag] = False
    counters["submitted"] = sql is not None
    return {
        "question_id": row["question_id"], "db_id": row["db_id"], "mode": "single",
        "turns": [] if text is None else [{"assistant": text, "calls": [], "observation": ""}],
        "final_sql": sql, "final_sql_source": "submitted" if sql is not None else "none", "submitted_sql": sql,
        "counters": counters,
    }  # fmt: skip


def load_tokenizer(name: str | None, required: bool):
    """A tokenizer by folder or hub id; None when it cannot be loaded and is not required."""
    if not name:
        if required:
            raise EvalError("Error: token-id prompts need a tokenizer: pass --tokenizer (or --model)")
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - one clear line
        if required:
            raise EvalError(f"Error: cannot load the tokenizer {name!r} ({type(exc).__name__}); pass --tokenizer, "
                            "or use --endpoint-mode chat") from None
        return None


def model_backend(model: str, tokenizer_name: str | None = None, device: str | None = None,
                  max_batch_size: int | None = None):
    """(HFGenerateBackend, tokenizer, device) for a transformers checkpoint (bf16 on GPU, fp32 on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from t2s.backends.hf_generate import HFGenerateBackend

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tokenizer = load_tokenizer(tokenizer_name or model, required=True)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    except Exception as exc:  # noqa: BLE001
        raise EvalError(f"Error: cannot load the model {model!r}: {exc}") from None
    return HFGenerateBackend(loaded, tokenizer, max_batch_size=max_batch_size), tokenizer, device


def endpoint_client(args):
    """A chat client for ``args.endpoint`` whose served model name is known (fails fast, after retries)."""
    from t2s.backends.chat_endpoint import ChatEndpointClient, EndpointError

    client = ChatEndpointClient(
        args.endpoint, model=args.served_model, api_key=args.api_key, request_timeout=args.request_timeout,
        retries=args.retries, backoff=args.backoff, enable_thinking=args.enable_thinking,
    )  # fmt: skip
    try:
        client.model_name()
    except EndpointError as exc:
        raise EvalError(f"{exc} (is the server running?)") from None
    return client


def completions_backend(args, tokenizer, served: str):
    """The vLLM server backend (token-id prompts, ``return_token_ids``): the same token stream as training."""
    from t2s.backends.vllm_server import VLLMServerBackend

    return VLLMServerBackend(
        args.endpoint, tokenizer, model=served, max_concurrency=args.concurrency, request_timeout=args.request_timeout,
        retries=args.retries, backoff=args.backoff, api_key=args.api_key,
    )  # fmt: skip


class Runner:
    """Plays jobs ``(row, sample)`` for one policy and calls ``emit(row, sample, record)`` as each finishes."""

    def __init__(self, args):
        self.args = args
        self.tokenizer = None
        self.backend = None
        self.chat_client = None
        self.predictions = None
        self.scripted = None  # policy_factory(row, sample) -> a scripted policy, played instead of args.policy
        self.target: dict = {}

    # -- set-up -------------------------------------------------------------------------------------------------
    def setup(self, all_rows: list[dict]) -> None:
        args = self.args
        if args.policy in ("model", "vllm") and not args.model:
            raise EvalError(f"Error: --policy {args.policy} needs --model PATH")
        if args.policy == "endpoint" and not args.endpoint:
            raise EvalError("Error: --policy endpoint needs --endpoint URL")
        if args.policy == "predictions":
            self._setup_predictions(all_rows)
        elif args.policy == "endpoint":
            self._setup_endpoint()
        elif args.policy == "model":
            self._setup_model()
        elif args.policy == "vllm":
            self._setup_vllm()

    def _setup_predictions(self, all_rows: list[dict]) -> None:
        from t2s.score import PredictionsError, read_predictions

        if not self.args.predictions:
            raise EvalError("Error: --policy predictions needs --predictions FILE")
        try:
            self.predictions = read_predictions(self.args.predictions, all_rows)
        except (PredictionsError, ValueError) as exc:
            raise EvalError(str(exc)) from None
        self.target = {"predictions": str(Path(self.args.predictions).resolve()),
                       "predictions_sha256": file_checksum(self.args.predictions)}

    def _setup_endpoint(self) -> None:
        args = self.args
        self.chat_client = endpoint_client(args)
        served = self.chat_client.model
        names = [args.tokenizer or args.model] if (args.tokenizer or args.model) else [served]
        self.tokenizer = load_tokenizer(names[0], required=args.endpoint_mode == "completions")
        if args.endpoint_mode == "completions":
            self.backend = completions_backend(args, self.tokenizer, served)
        self.target = {"endpoint": self.chat_client.base_url, "endpoint_mode": args.endpoint_mode, "served_model": served,
                       "model": args.model}

    def _setup_model(self) -> None:
        args = self.args
        self.backend, self.tokenizer, device = model_backend(args.model, args.tokenizer, args.device,
                                                             args.batch_size or None)
        self.target = {"model": args.model, "device": device}

    def _setup_vllm(self) -> None:
        args = self.args
        try:
            from vllm import LLM
        except ImportError:
            raise EvalError("Error: --policy vllm needs vLLM (pip install -r requirements-gpu.txt)") from None
        from t2s.backends.vllm_colocate import VLLMColocateBackend

        self.tokenizer = load_tokenizer(args.tokenizer or args.model, required=True)
        llm = LLM(
            model=args.model, tokenizer=args.tokenizer or args.model, seed=args.seed,
            gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=True,
            max_model_len=args.episode_token_budget + 512,
        )  # fmt: skip
        self.backend = VLLMColocateBackend(llm, self.tokenizer)
        self.target = {"model": args.model}

    # -- playing ------------------------------------------------------------------------------------------------
    def batch_size(self) -> int:
        if self.args.batch_size:
            return self.args.batch_size
        return 256 if self.args.policy == "endpoint" else 64

    def play(self, jobs: list[tuple[dict, int]], mode: str, emit) -> None:
        policy = self.args.policy
        if self.scripted is not None:
            self._play_threads(jobs, mode, emit, self._scripted_record)
        elif policy == "predictions":
            for row, sample in jobs:
                emit(row, sample, single_turn_record(row, None, sql=self.predictions.sql.get(row["question_id"])) | {"mode": mode})
        elif policy == "gold":
            self._play_threads(jobs, mode, emit, self._gold_record)
        elif policy == "endpoint" and self.args.endpoint_mode == "chat":
            self._play_threads(jobs, mode, emit, self._chat_record, workers=self.args.concurrency)
        elif mode == "single":
            self._play_single(jobs, emit)
        else:
            self._play_rollout(jobs, mode, emit)

    def _play_threads(self, jobs, mode, emit, make_record, workers: int | None = None) -> None:
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        with ThreadPoolExecutor(max(1, workers or self.args.workers)) as pool:
            pending = {pool.submit(self._scored, make_record, row, sample, mode): (row, sample) for row, sample in jobs}
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    failed = None
                    for future in finished:  # keep every finished result before reporting a failure
                        row, sample = pending.pop(future)
                        if future.exception() is not None:
                            failed = failed or future
                        else:
                            emit(row, sample, future.result(), scored=True)
                    if failed is not None:
                        failed.result()
            except BaseException:
                for future in pending:
                    future.cancel()
                raise

    def _scored(self, make_record, row, sample, mode) -> dict:
        return score_record(row, make_record(row, sample, mode), sample)

    def _gold_record(self, row: dict, sample: int, mode: str) -> dict:
        from t2s.backends.scripted import GoldPolicy
        from t2s.databases import ref_from_row
        from t2s.episode import run_text_episode
        from t2s.schema import get_schema

        if mode == "single":
            return single_turn_record(row, f"```sql\n{row['gold_sql']}\n```")
        try:
            schema = get_schema(ref_from_row(row))
        except Exception as exc:  # noqa: BLE001 - an unreadable database scores 0 with the reason recorded
            return {**single_turn_record(row, None), "mode": mode, "error": f"Error: cannot read the database: {exc}"}
        return run_text_episode(row, _episode_config(self.args, mode), GoldPolicy(row, schema), tokenizer=self.tokenizer)

    def _scripted_record(self, row: dict, sample: int, mode: str) -> dict:
        from t2s.episode import run_text_episode

        return run_text_episode(row, _episode_config(self.args, mode), self.scripted(row, sample),
                                tokenizer=self.tokenizer)

    def _chat_record(self, row: dict, sample: int, mode: str) -> dict:
        from t2s.backends.chat_endpoint import ChatEndpointPolicy, EndpointError
        from t2s.episode import Episode, play

        sampling = _sampling(self.args)
        seed = self.args.seed * 1_000_003 + sample * 7919 + zlib.crc32(str(row["question_id"]).encode()) % 997
        try:
            if mode == "single":
                messages = single_turn_messages(row)
                if self.tokenizer is not None:
                    from t2s.protocol import generation_prompt_ids

                    prompt = generation_prompt_ids(self.tokenizer, messages, self.args.enable_thinking)
                    limit = self.args.episode_token_budget - len(prompt)
                else:  # the prompt's size is unknown: two turns' worth
                    limit = 2 * self.args.max_tokens_per_turn
                if limit <= 0:
                    return {**single_turn_record(row, None), "error": "Error: the prompt does not fit the episode token budget"}
                text, finish, _ = self.chat_client.complete(messages, limit, sampling, seed)
                return single_turn_record(row, text, cut_off=finish == "length")
            policy = ChatEndpointPolicy(self.chat_client, sampling, seed=seed)
            episode = play(Episode(row, _episode_config(self.args, mode)), policy, self.tokenizer)
        except EndpointError as exc:
            raise EvalError(str(exc)) from None
        record = episode.record()
        if self.tokenizer is None:  # without a tokenizer the episode cannot see cut-offs; the server reports them
            record["counters"]["turn_cutoffs"] = max(
                record["counters"]["turn_cutoffs"], sum(reason == "length" for reason in policy.finish_reasons)
            )
        return record

    def _play_rollout(self, jobs, mode, emit) -> None:
        from t2s.rollout import Rollout

        rows = [row for row, _ in jobs]
        failures: list[str] = []

        def on_finish(trace) -> None:  # scored in the rollout's worker threads (scorer), written here
            row, sample = jobs[trace.index]
            if trace.error:
                failures.append(trace.error)
                return
            emit(row, sample, eval_line(row, trace.record, trace.outcome, sample), scored=True)

        try:
            rollout = Rollout(self.backend, self.tokenizer, _episode_config(self.args, mode),
                              sampling=_sampling(self.args), scorer=score_final_sql, on_finish=on_finish,
                              tool_workers=self.args.workers)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        rollout.run(rows)
        if failures:
            raise EvalError(f"{failures[0]} ({len(failures)} episode(s) failed; finished results are kept)")

    def _play_single(self, jobs, emit) -> None:
        from t2s import protocol

        args = self.args
        sampling = _sampling(args)
        prompts, limits, seeds = [], [], []
        for index, (row, sample) in enumerate(jobs):
            ids = protocol.generation_prompt_ids(self.tokenizer, single_turn_messages(row), args.enable_thinking)
            prompts.append(ids)
            limits.append(args.episode_token_budget - len(ids))
            seeds.append(sampling.request_seed(index, 0))
        ready = [i for i, limit in enumerate(limits) if limit > 0]
        outputs = self.backend.generate([prompts[i] for i in ready], [limits[i] for i in ready], sampling,
                                        [seeds[i] for i in ready]) if ready else []
        by_index = dict(zip(ready, outputs))
        for index, (row, sample) in enumerate(jobs):
            out = by_index.get(index)
            if out is None:
                record = single_turn_record(row, None)
                record["error"] = "Error: the prompt does not fit the episode token budget"
            elif out.finish_reason == "error":
                raise EvalError(f"{out.error} (finished results are kept)")
            else:
                ids = out.token_ids[:-1] if out.stop_token_id is not None else out.token_ids
                record = single_turn_record(row, self.tokenizer.decode(ids, skip_special_tokens=False),
                                            cut_off=out.finish_reason == "length")
            emit(row, sample, score_record(row, record, sample), scored=True)


# ------------------------------------------------------------------------------------------------------------- main
def load_data(args) -> tuple[list[dict], list[dict], dict, Path]:
    """(all rows, selected rows whose databases are present and readable, skipped info, data file).

    A missing or unreadable database (``data.db_probe``) is an error naming it; with ``--skip-missing-dbs`` its
    questions are left out, and counted with the database ids in ``skipped``.
    """
    from t2s.data.db_probe import database_problems, problems_text
    from t2s.data.loaders import DataError, load_json_rows

    data = Path(args.data)
    if not data.exists():
        raise EvalError(f"Error: data file not found: {data}")
    try:
        rows = load_json_rows(data, args.db_root, require_databases=False)
    except DataError as exc:
        raise EvalError(str(exc)) from None
    if not rows:
        raise EvalError(f"Error: no questions in {data}")
    data_file = data
    if data.is_dir():
        data_file = next(p for p in (data / n for n in ("dev.json", "train.json", "mini_dev_sqlite.json", "train_spider.json")) if p.is_file())
    selected = select_rows(list(rows), args.n, args.seed)
    unique: dict[str, dict] = {}
    for row in selected:  # a row repeated word for word (rows.repeated_ids) is played and counted once
        unique.setdefault(row["question_id"], row)
    repeated = sorted({row["question_id"] for row in selected} & set(rows.repeated_ids))
    selected = list(unique.values())
    missing = {r["db_id"] for r in selected if r.get("db_path") and not Path(r["db_path"]).is_file()}
    skipped = {"questions": 0, "db_ids": [], "repeated_ids": repeated}
    if missing:
        if not args.skip_missing_dbs:
            root = getattr(rows, "db_root", None) or args.db_root
            raise EvalError(
                f"Error: {len(missing)} database(s) missing under {root}: {', '.join(sorted(missing))} "
                "(pass --db-root, or --skip-missing-dbs to skip their questions)"
            )
        skipped.update(questions=sum(r["db_id"] in missing for r in selected), db_ids=sorted(missing))
        selected = [r for r in selected if r["db_id"] not in missing]
    unusable = database_problems(selected)
    if unusable:
        if not args.skip_missing_dbs:
            raise EvalError(f"Error: {len(unusable)} database(s) cannot be read: {problems_text(unusable)} "
                            "(repair them, or pass --skip-missing-dbs to skip their questions)")
        skipped["unusable_questions"] = sum(r["db_id"] in unusable for r in selected)
        skipped["unusable_dbs"] = unusable
        selected = [r for r in selected if r["db_id"] not in unusable]
    return list(rows), selected, skipped, data_file


def build_config(args, mode: str, runner: Runner, data_file: Path, n_selected: int) -> dict:
    tokenizer_hash, template_hash = tokenizer_fingerprint(runner.tokenizer)
    generative = args.policy in ("model", "vllm", "endpoint")
    chat = args.policy == "endpoint" and args.endpoint_mode == "chat"
    system_prompt = read_system_prompt(args.system_prompt_file) if args.system_prompt_file else None
    if mode == "single":
        system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    elif system_prompt is None:
        from t2s.protocol import system_prompt as default_prompt

        system_prompt = default_prompt("exec_plan")
    config = {
        "policy": args.policy,
        "mode": mode,
        "model": runner.target.get("model"),
        "endpoint": runner.target.get("endpoint"),
        "endpoint_mode": runner.target.get("endpoint_mode"),
        "served_model": runner.target.get("served_model"),
        "predictions": runner.target.get("predictions"),
        "predictions_sha256": runner.target.get("predictions_sha256"),
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k} if generative else None,
        "k": args.k,
        "n": args.n,
        "seed": args.seed,
        "max_turns": args.max_turns,
        "episode_token_budget": args.episode_token_budget,
        "max_tokens_per_turn": args.max_tokens_per_turn,
        "enable_thinking": args.enable_thinking,
        "system_prompt_file": str(Path(args.system_prompt_file).resolve()) if args.system_prompt_file else None,
        "system_prompt_sha256": text_sha256(system_prompt),
        "tokenizer_sha256": tokenizer_hash,
        "chat_template_sha256": template_hash,
        "packages": package_versions(),
        "sqlite_version": sqlite3.sqlite_version,
        "data_file": str(data_file.resolve()),
        "data_sha256": file_checksum(data_file),
        "questions": n_selected,
        "skip_missing_dbs": bool(args.skip_missing_dbs),
        "comparable": bool(generative and not chat and mode != "single" and args.enable_thinking),
    }
    return config


def check_policy_args(args) -> None:
    """Refuse options no episode can run with (EvalError)."""
    if args.k < 1:
        raise EvalError("Error: --k must be at least 1")
    if args.system_prompt_file:
        read_system_prompt(args.system_prompt_file)


def read_system_prompt(path) -> str:
    """The text of a ``--system-prompt-file`` (stripped); EvalError when it is absent or not UTF-8."""
    from t2s.data.loaders import DataError, read_text_file

    try:
        return read_text_file(path, what="system prompt file").strip()
    except DataError as exc:
        raise EvalError(str(exc)) from None


def evaluate(args) -> dict[str, dict]:
    """Run every requested mode; returns {mode: summary}."""
    from t2s.eval_report import modes_markdown, plot_summaries

    check_policy_args(args)
    modes = list(dict.fromkeys(args.mode))
    all_rows, selected, skipped, data_file = load_data(args)
    summaries: dict[str, dict] = {}
    with run_folder_lock(args.output) as root:
        runner = Runner(args)
        runner.setup(all_rows)
        for mode in modes:
            folder = root if len(modes) == 1 else root / mode
            summaries[mode] = evaluate_mode(args, mode, runner, selected, skipped, data_file, folder)
        if len(modes) > 1:
            (root / "summary.md").write_text(modes_markdown(summaries))
            plot_summaries(summaries, root / "summary.png")
    _print_table(summaries)
    return summaries


def evaluate_mode(args, mode, runner, selected, skipped, data_file, folder: Path) -> dict:
    from t2s.eval_report import plot_summaries, summarise, summary_markdown

    config = build_config(args, mode, runner, data_file, len(selected))
    check_resume_config(folder, config)
    log = EpisodeLog(folder)
    done = log.load()
    wanted = {(str(r["question_id"]), s) for r in selected for s in range(args.k)}
    log.lines = [line for line in log.lines if (str(line["question_id"]), int(line["sample"])) in wanted]
    jobs = [(row, s) for row in selected for s in range(args.k) if (str(row["question_id"]), s) not in done]
    progress = Progress(len(wanted), log.lines, f"{args.policy}/{mode}", quiet=args.quiet)
    started = time.time()
    try:
        play_jobs(runner, jobs, mode, lambda row, line: log.append(line), progress)
    finally:
        log.close()
    lines = sorted(log.lines, key=lambda line: (str(line["question_id"]), line["sample"]))
    rows_by_id = {str(r["question_id"]): r for r in selected}
    vote = vote_accuracy(lines, rows_by_id) if args.k > 1 else None
    config = dict(config, wall_seconds=round(time.time() - started, 1))
    summary = summarise(lines, config=config, k=args.k, vote_at_k=vote, skipped=skipped)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "summary.md").write_text(summary_markdown(summary))
    plot_summaries({mode: summary}, folder / "summary.png")
    return summary


def play_jobs(runner: Runner, jobs: list[tuple[dict, int]], mode: str, on_line, progress: Progress) -> None:
    """Play and score every ``(row, sample)`` job in batches, calling ``on_line(row, eval_line)`` as each finishes."""

    def emit(row, sample, record, scored=False):
        line = record if scored else score_record(row, record, sample)
        on_line(row, line)
        progress.advance(line)

    try:
        size = runner.batch_size()
        for start in range(0, len(jobs), size):
            runner.play(jobs[start : start + size], mode, emit)
    finally:
        progress.close()


def solve_counts(rows: list[dict], args, *, policy_factory=None, mode: str = "full") -> list[int]:
    """For each row, how many of ``args.k`` samples end in an official match, played and scored as ``eval`` does.

    ``args`` holds ``policy`` and ``k`` plus the options of :func:`add_policy_arguments` (see :func:`policy_args`).
    ``policy_factory(row, sample)`` plays a scripted policy instead of ``args.policy``. Raises EvalError.
    """
    check_policy_args(args)
    runner = Runner(args)
    if policy_factory is not None:
        runner.scripted = policy_factory
    else:
        if args.policy not in ("model", "vllm", "endpoint", "gold"):
            raise EvalError(f"Error: solve counts need a playing policy, not {args.policy!r}")
        runner.setup(rows)
    rows = [dict(row) for row in rows]  # one object per position, even where the caller repeats a row
    position = {id(row): index for index, row in enumerate(rows)}
    counts = [0] * len(rows)

    def count(row, line) -> None:
        counts[position[id(row)]] += int(line["official"] or 0)

    jobs = [(row, sample) for row in rows for sample in range(args.k)]
    label = "scripted" if policy_factory is not None else args.policy
    play_jobs(runner, jobs, mode, count, Progress(len(jobs), [], f"{label}: solving x{args.k}", quiet=args.quiet))
    return counts


def _print_table(summaries: dict[str, dict]) -> None:
    from rich.table import Table

    from t2s.eval_report import unscored_notes
    from t2s.rich_output import console, print_table

    table = Table(title="t2s eval")
    table.add_column("metric")
    for mode in summaries:
        table.add_column(mode, justify="right")
    keys = ("n", "execution_accuracy_official", "execution_accuracy_official_no_fallback", "strict", "soft_f1",
            "vote_at_k", "submit_rate", "executes_rate", "mean_turns", "mean_calls", "fallback_rate", "forced_rate",
            "truncation_rate", "skipped_missing_dbs", "skipped_unusable_dbs", "gold_failures")
    for key in keys:
        values = [s.get(key) for s in summaries.values()]
        if all(v is None for v in values):
            continue
        table.add_row(key, *("-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in values))
    out = console()
    print_table(out, table)
    for mode, summary in summaries.items():
        for note in unscored_notes(summary):
            out.print(f"{mode}: {note}" if len(summaries) > 1 else note, style="yellow", markup=False, highlight=False)
