"""The eval run: pick the questions, play every mode into its folder, resume a killed run, write the summaries.

The output folder's layout is the same for one mode or several (``t2s.evaluation.run_folders``): each mode plays into
``DIR/<mode>/`` and ``DIR`` gets summary.json, summary.md, summary.png and report.html over all of them.

``config.training_token_stream`` is true when the run used the training protocol and token stream: a model, vLLM or
a completions endpoint, in full or withheld mode, with thinking on. ``config.comparable`` is true when, besides, the
settings are the published harness's (``report.published_differences`` is empty): the one meaning of "comparable",
the one the console and summary.md print. The original system prompt of the published checkpoints is not public
(``--system-prompt-file`` takes it), so its hash is recorded next to the flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

from t2s.env.databases import file_checksum
from t2s.errors import writing
from t2s.evaluation.records import EVAL_LINE_KEYS, UNPLAYED, line_problem, score_record
from t2s.evaluation.policies import Runner
from t2s.errors import EvalError
from t2s.env import single_turn
from t2s.env.episode import EpisodeConfig
from t2s.evaluation.config import EPISODE_OPTIONS, EvalConfig, PolicyConfig, read_system_prompt
from t2s.evaluation.report import published_differences
from t2s.evaluation.run_folders import EPISODES, EVAL_CONFIG, check_output_apart
from t2s.evaluation.progress import Progress
from t2s.evaluation.questions import once_each, playable_rows, select_rows
from t2s.run_lock import run_folder_lock
from t2s.settings import package_versions

RECORDED_PACKAGES = ("torch", "transformers", "trl", "vllm", "peft", "sqlglot")  # their versions, in eval_config.json
TIMING_KEYS = ("started_at", "finished_at", "wall_seconds")


# ---------------------------------------------------------------------------------------------------------- helpers
def text_sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


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
        self.path = folder / EPISODES
        self.lines: list[dict] = []
        self._handle = None

    def load(self) -> set[tuple[str, int]]:
        """Read earlier lines; a truncated last line (a killed run) is dropped from the file, and so is an episode that
        ended in an error (``stop_reason`` "error": its server refused the request, or the environment failed), to be
        played again."""
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
            except (ValueError, RecursionError):
                if number == len(complete) and not tail.strip():
                    complete = complete[: number - 1]
                    break
                raise EvalError(f"Error: {self.path} line {number} is not valid JSON; move the file away to start over")
            if problem := line_problem(lines[-1], EVAL_LINE_KEYS):
                raise EvalError(f"Error: {self.path} line {number}: {problem}; move the file away to start over")
        if tail.strip():
            try:
                lines.append(json.loads(tail))
                complete.append(tail)
            except (ValueError, RecursionError):
                pass  # the last write was cut off: that question runs again
            else:
                if problem := line_problem(lines[-1], EVAL_LINE_KEYS):
                    raise EvalError(f"Error: {self.path} line {len(complete)}: {problem}; move the file away to start "
                                    "over")
        kept = b"".join(raw + b"\n" for raw in complete)
        if any(line.get("stop_reason") == "error" for line in lines):  # a refusal or a failure is no result
            lines = [line for line in lines if line.get("stop_reason") != "error"]
            kept = b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)
        if kept != data:
            partial = self.path.with_name(self.path.name + ".partial")
            with writing(partial):
                partial.write_bytes(kept)
            os.replace(partial, self.path)  # whole or not at all: an interrupt never loses a finished episode
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


def resume_config(config: dict) -> dict:
    """What a resumed run must match: the configuration less its timings, ``comparable`` and ``data`` (derived from
    the rest), and less where its servers are (``endpoint``, ``endpoints``): a server restarted on another port, or a
    run going on without one that died, serves the same ``served_model`` under the same settings.
    A folder written before ``training_token_stream`` had that flag under the name ``comparable``."""
    config = dict(config)
    if "training_token_stream" not in config and "comparable" in config:
        config["training_token_stream"] = config["comparable"]
    return {k: v for k, v in config.items() if k not in (*TIMING_KEYS, "comparable", "data", "endpoint", "endpoints")}


def check_resume_config(folder: Path, config: dict) -> None:
    """Write ``eval_config.json``, or refuse when the folder holds results of another configuration. A folder written
    before evals recorded ``weights_sha256`` (or ``databases_sha256``) resumes, and ``config`` then loses that key: it
    vouches for no weights (databases)."""
    path = folder / EVAL_CONFIG
    wanted = resume_config(config)
    if path.is_file():
        try:
            old = resume_config(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, AttributeError, TypeError):  # cut off or edited: its results cannot be matched to a config
            raise EvalError(f"Error: {path} is unreadable; move {folder} away to start over, or choose another "
                            "--output") from None
        for key in ("weights_sha256", "databases_sha256"):
            if key not in old:  # written before evals recorded it: its earlier episodes ran on weights (databases)
                wanted.pop(key, None)  # nobody recorded, so the folder vouches for none
                config.pop(key, None)
        if old != wanted:
            changed = sorted(k for k in set(old) | set(wanted) if old.get(k) != wanted.get(k))
            raise EvalError(
                f"Error: {folder} holds results of a different configuration (changed: {', '.join(changed)}); "
                "re-run with the same settings to resume, or choose another --output"
            )
    elif (folder / EPISODES).is_file():
        raise EvalError(f"Error: {folder} has episodes.jsonl but no eval_config.json; choose another --output")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v for k, v in config.items() if k not in TIMING_KEYS}, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------------------- main
def load_data(config: EvalConfig) -> tuple[list[dict], list[dict], dict, Path]:
    """(all rows, selected rows whose databases are present and readable, skipped info, data file).

    A missing or unreadable database (``data.db_probe``) is an error naming it; with ``--skip-missing-dbs`` its
    questions are left out, and counted with the database ids in ``skipped``.
    """
    from t2s.data.loaders import json_data_file, load_json_rows
    from t2s.data.rows import DataError

    data = Path(config.data)
    if not data.exists():
        raise EvalError(f"Error: data file not found: {data}")
    try:
        rows = load_json_rows(data, config.db_root, require_databases=False, engine=config.policy.engine,
                              dsn=config.policy.dsn)
    except DataError as exc:
        raise EvalError(str(exc)) from None
    if not rows:
        raise EvalError(f"Error: no questions in {data}")
    data_file = json_data_file(data)
    selected = select_rows(list(rows), config.n, config.policy.seed)
    selected, repeated = once_each(rows, selected)
    selected, skipped = playable_rows(rows, selected, skip_missing_dbs=config.skip_missing_dbs, db_root=config.db_root)
    skipped["repeated_ids"] = repeated
    return list(rows), selected, skipped, data_file


def build_config(run: EvalConfig, mode: str, runner: Runner, data_file: Path, selected: list[dict]) -> dict:
    """What ``eval_config.json`` records of one mode's run (a resumed run must match it)."""
    from t2s.data.loaders import data_label

    policy, episode = run.policy, run.policy.episode
    tokenizer_hash, template_hash = tokenizer_fingerprint(runner.tokenizer)
    generative = policy.generates
    chat = policy.policy == "endpoint" and policy.endpoint.mode in ("chat", "tools")
    system_prompt = read_system_prompt(episode.system_prompt_file) if episode.system_prompt_file else None
    if mode == "single":
        system_prompt = single_turn.system_prompt(policy.engine)
    elif system_prompt is None:
        from t2s.env.protocol import default_system_prompt

        system_prompt = default_system_prompt(episode.dialect, episode.tool_format, policy.engine)
    sampling = policy.sampling
    config = {
        "policy": policy.policy,
        "mode": mode,
        "model": runner.target.get("model"),
        "endpoint": runner.target.get("endpoint"),
        "endpoint_mode": runner.target.get("endpoint_mode"),
        "served_model": runner.target.get("served_model"),
        "predictions": runner.target.get("predictions"),
        "predictions_sha256": runner.target.get("predictions_sha256"),
        "sampling": ({"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
                     if generative else None),
        "k": policy.k,
        "n": run.n,
        "seed": policy.seed,
        "max_turns": episode.max_turns,
        "episode_token_budget": episode.episode_token_budget,
        "max_tokens_per_turn": episode.max_tokens_per_turn,
        "enable_thinking": episode.enable_thinking,
        "system_prompt_file": (str(Path(episode.system_prompt_file).resolve()) if episode.system_prompt_file
                               else None),
        "system_prompt_sha256": text_sha256(system_prompt),
        "tokenizer_sha256": tokenizer_hash,
        "chat_template_sha256": template_hash,
        "packages": package_versions(RECORDED_PACKAGES),
        "sqlite_version": sqlite3.sqlite_version,
        "data_file": str(data_file.resolve()),
        "data_sha256": file_checksum(data_file),
        "databases_sha256": databases_fingerprint(selected),
        "data": data_label(selected, data_file),
        "questions": len(selected),
        "skip_missing_dbs": bool(run.skip_missing_dbs),
        "training_token_stream": bool(generative and not chat and mode != "single" and episode.enable_thinking),
    }
    if "weights_sha256" in runner.target:  # which weights ran (``export --eval`` checks it), hashed once at set-up
        config["weights_sha256"] = runner.target["weights_sha256"]
    if runner.target.get("endpoints"):  # several servers of one model (only then, so older folders resume)
        config["endpoints"] = runner.target["endpoints"]
    for key in ("engine", "dtype"):  # what generated the episodes: "vllm 0.31.0", "transformers 5.17.0"
        if runner.target.get(key) is not None:
            config[key] = runner.target[key]
    defaults = EpisodeConfig()
    for key in EPISODE_OPTIONS:  # recorded when not the default, so folders of earlier default runs still resume
        if key not in config and getattr(episode, key) != getattr(defaults, key):
            config[key] = getattr(episode, key)
    if policy.engine != "sqlite":  # the databases' engine (sqlite, duckdb, postgres)
        config["database_engine"] = policy.engine
    config["comparable"] = not published_differences(config)
    return config


def databases_fingerprint(selected: list[dict]) -> str:
    """SHA-256 over the content hash of every database the selected questions read (``database_hash``: a file's
    bytes, hashed once per process and cached, as scoring hashes them for its gold results), so that a run resumed on
    databases that changed since is refused."""
    from t2s.env.databases import database_hash
    from t2s.env.databases.opening import DatabaseOpenError, ref_from_row

    hashes = set()
    for row in selected:
        try:
            hashes.add((str(row.get("db_id")), database_hash(ref_from_row(row))))
        except (ValueError, OSError, DatabaseOpenError) as exc:  # recorded as unreadable: playing it says why
            hashes.add((str(row.get("db_id")), f"unreadable: {type(exc).__name__}"))
    return hashlib.sha256(json.dumps(sorted(hashes)).encode()).hexdigest()


def evaluate(config: EvalConfig) -> dict[str, dict]:
    """Run every mode of ``config`` into ``config.output`` (layout: ``t2s.evaluation.run_folders``); returns
    {mode: summary}."""
    from t2s.evaluation.report import print_summaries, write_reports
    from t2s.ui.console import console
    from t2s.evaluation.run_folders import check_eval_layout, earlier_summaries

    modes = list(config.modes)
    all_rows, selected, skipped, data_file = load_data(config)
    check_output_apart(config.output, data_file, selected)
    summaries: dict[str, dict] = {}
    with run_folder_lock(config.output) as root:
        check_eval_layout(root)
        earlier = earlier_summaries(root, modes)
        runner = Runner(config.policy)
        runner.setup(all_rows, selected)
        try:
            for mode in modes:
                summaries[mode] = evaluate_mode(config, mode, runner, selected, skipped, data_file, root / mode)
        except KeyboardInterrupt:
            say_saved(root, modes)
            raise
        write_reports(root, {**earlier, **summaries})
    print_summaries(summaries)
    console().print(f"wrote {root}: report.html, summary.json, summary.md, summary.png, and "
                    f"{', '.join(modes)} episodes", markup=False, highlight=False, soft_wrap=True)
    check_something_evaluated(summaries)
    return summaries


def check_something_evaluated(summaries: dict[str, dict]) -> None:
    """An ``EvalError`` (after the folder is written) when the run's figures measure nothing: every episode ended
    before its first turn or in an error (generation or environment), or no question could be scored (every gold SQL
    fails)."""
    played = sum(s.get("n_episodes", 0) for s in summaries.values())  # the scored episodes
    no_turn = sum(s.get("no_turn_episodes", 0) for s in summaries.values())
    errors = sum(s.get("stop_reasons", {}).get("error", 0) for s in summaries.values())
    if played and no_turn == played:
        raise EvalError("Error: every episode ended before its first turn (see the line above): nothing was evaluated")
    if played and errors == played:
        raise EvalError(f"Error: every one of {played} episodes ended in an error, the model's server or the "
                        "environment (see the lines above): the figures measure the errors, not the policy")
    if played and no_turn + errors >= played:
        raise EvalError(f"Error: none of {played} episodes was played: {no_turn} ended before their first turn and "
                        f"{errors} in an error (see the lines above): nothing was evaluated")
    unscored = max((s.get("gold_failures", 0) for s in summaries.values()), default=0)
    if not played and unscored:
        raise EvalError(f"Error: no question could be scored: the gold SQL of every one of the {unscored} questions "
                        "fails on its database (see the line above); check --data and --db-root")


def say_saved(root: Path, modes: list[str]) -> None:
    """On an interrupted eval: how many episodes each mode has saved, and how to go on."""
    from t2s.evaluation.run_folders import EPISODES, read_jsonl
    from t2s.ui.console import print_line

    saved = {mode: len(read_jsonl(root / mode / EPISODES)) if (root / mode / EPISODES).is_file() else 0
             for mode in modes}
    counts = ", ".join(f"{n} {mode}" for mode, n in saved.items())
    print_line(f"Interrupted: {sum(saved.values())} episodes are saved in {root} ({counts}); run the same command "
               "again to resume where it stopped.", stderr=True)


def evaluate_mode(run: EvalConfig, mode, runner, selected, skipped, data_file, folder: Path) -> dict:
    """Play one mode into ``folder`` (episodes.jsonl, scores.jsonl, eval_config.json); returns its summary."""
    from t2s.evaluation.records import score_line
    from t2s.evaluation.report import summarise
    from t2s.evaluation.run_folders import SCORES, VOTES, write_jsonl
    from t2s.scoring.voting import accuracy_of, question_votes

    config, k = build_config(run, mode, runner, data_file, selected), run.policy.k
    check_resume_config(folder, config)
    log = EpisodeLog(folder)
    done = log.load()
    wanted = {(str(r["question_id"]), s) for r in selected for s in range(k)}
    log.lines = [line for line in log.lines if (str(line["question_id"]), int(line["sample"])) in wanted]
    jobs = [(row, s) for row in selected for s in range(k) if (str(row["question_id"]), s) not in done]
    progress = Progress(len(wanted), log.lines, f"{run.policy.policy}/{mode}", quiet=run.policy.quiet)
    started = time.time()
    try:
        play_jobs(runner, jobs, mode, lambda row, line: log.append(line), progress)
    finally:
        log.close()
    lines = sorted(log.lines, key=lambda line: (str(line["question_id"]), line["sample"]))
    write_jsonl(folder / SCORES, [score_line(line) for line in lines])
    rows_by_id = {str(r["question_id"]): r for r in selected}
    vote = None
    if k > 1:
        votes = question_votes(lines, rows_by_id)
        write_jsonl(folder / VOTES, [{"question_id": key, **value} for key, value in sorted(votes.items())])
        vote = accuracy_of(votes)
    config = dict(config, wall_seconds=round(time.time() - started, 1))
    return summarise(lines, config=config, k=k, vote_at_k=vote, skipped=skipped)


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


class SolveCounts(list):
    """Solve counts, one a row (None: not measured); ``unplayed``: the ids of the rows not measured because an episode
    of theirs played no turn (it ended in an error, or before its first turn), which a count of 0 would call hard."""

    unplayed: list[str]


def solve_counts(rows: list[dict], config: PolicyConfig, *, policy_factory=None, mode: str = "full") -> SolveCounts:
    """For each row, how many of ``config.k`` samples end in an official match, played and scored as ``eval`` does;
    None for a row that cannot be scored (its gold SQL fails, times out or goes over the scoring cap) or one of whose
    episodes played no turn (``SolveCounts.unplayed``).

    ``policy_factory(row, sample)`` plays a scripted policy instead of ``config.policy``. Raises EvalError, also when
    no episode played a turn.
    """
    runner = Runner(config)
    if policy_factory is not None:
        runner.scripted = policy_factory
    else:
        if config.policy not in ("model", "vllm", "endpoint", "gold"):
            raise EvalError(f"Error: solve counts need a playing policy, not {config.policy!r}")
        runner.setup(rows)
    rows = [dict(row) for row in rows]  # one object per position, even where the caller repeats a row
    position = {id(row): index for index, row in enumerate(rows)}
    counts, unplayed = SolveCounts([0] * len(rows)), set()

    def count(row, line) -> None:
        index = position[id(row)]
        if line.get("stop_reason") in UNPLAYED:
            unplayed.add(index)
        if line["official"] is None or counts[index] is None or index in unplayed:
            counts[index] = None  # unscorable, or not measured: a count of 0 would call it unsolved
        else:
            counts[index] += int(line["official"])

    jobs = [(row, sample) for row in rows for sample in range(config.k)]
    label = "scripted" if policy_factory is not None else config.policy
    play_jobs(runner, jobs, mode, count, Progress(len(jobs), [], f"{label}: solving x{config.k}", quiet=config.quiet))
    if rows and len(unplayed) == len(rows) and all(c is None for c in counts):
        raise EvalError(f"Error: no solve count was measured: an episode of every one of the {len(rows)} rows ended "
                        "in an error (the server refused or garbled a request, or the environment failed) or before "
                        "its first turn (its prompt left no room in the episode token budget)")
    counts.unplayed = [str(rows[index].get("question_id")) for index in sorted(unplayed)]
    return counts
