"""`python -m t2s ask --db DATABASE QUESTION`: one agentic episode against a SQLite or DuckDB file or a PostgreSQL
database, read-only.

The policy comes from the command line: ``--replay TURNS.jsonl`` plays recorded assistant turns (DESIGN §10),
``--model`` a transformers checkpoint, ``--endpoint`` a server (completions, chat or tools mode, as in ``eval``). The
options become one ``PolicyConfig`` (``t2s.evaluation.config``, as ``eval``'s). Each entry of ``POLICIES`` takes the
parsed arguments, that config, the row, the episode config and the database, and returns the record and whether its
turns were shown as they happened.
The user's file opens ``mode=ro`` (never ``immutable``).

The question is printed first, then the episode. The record (``--json``) holds the episode keys of DESIGN §10 plus
``question``, ``evidence`` and ``pred_result``: the first ``RESULT_ROWS`` rows of the final SQL's result, as the
readable view shows them. A missing or unreadable database, system prompt or turns file is bad input (exit 1); no
policy, two policies or an empty question is bad usage (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable

from t2s.ui.args import non_empty_path, positive_int

RESULT_ROWS = 20  # rows of the final SQL's result shown in the readable view
RECORD_EXTRA_KEYS = ("question", "evidence", "pred_result")  # what ask's record adds to the episode record's keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.env.episode import EpisodeConfig  # the episode defaults, declared once there

    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--db", required=True, type=non_empty_path,
                        help="the database to ask, read-only: a SQLite or DuckDB (.duckdb) file, "
                        "or a postgresql:// URL")
    parser.add_argument("--replay", metavar="TURNS.jsonl", help="play recorded assistant turns: one JSON string a line")
    parser.add_argument("--mode", choices=("full", "withheld"), default="full",
                        help="full: the prompt shows the schema; withheld: the model discovers it with tools")
    parser.add_argument("--evidence", default="", help="a hint, as BIRD's evidence field")
    parser.add_argument("--max-turns", type=positive_int, default=EpisodeConfig.max_turns,
                        help=f"tool turns before the forced final turn (default: {EpisodeConfig.max_turns})")
    parser.add_argument("--system-prompt-file", type=non_empty_path, default=None,
                        help="replace the system prompt with this file's text")
    parser.add_argument("--json", action="store_true", help="print the episode record as one JSON object")
    from t2s.evaluation.options import add_tool_arguments

    add_tool_arguments(parser)
    add_model_arguments(parser)


def _replay_policy(args, policy, row: dict, config, db):
    from t2s.backends.scripted import ReplayPolicy
    from t2s.rollout.text_policy import run_text_episode

    return run_text_episode(row, config, ReplayPolicy.from_file(args.replay), db=db), False


# name -> (is it chosen by these args?, play it); exactly one must be chosen.
POLICIES: dict[str, tuple[Callable, Callable]] = {
    "replay": (lambda args: bool(getattr(args, "replay", None)), _replay_policy),
    "model": (lambda args: bool(getattr(args, "model", None)), lambda *a: _model_policy(*a)),
    "endpoint": (lambda args: bool(getattr(args, "endpoint", None)), lambda *a: _endpoint_policy(*a)),
}


def ask_row(question: str, evidence: str, db) -> dict:
    """A data row for a free-form question (no gold SQL)."""
    from t2s.data.rows import make_row

    return make_row(question_id="ask", question=question, evidence=evidence, gold_sql=None, db_id=db.db_id,
                    db_path=db.path, source="ask")


def run(args: argparse.Namespace) -> int:
    from t2s.env import databases
    from t2s.errors import EvalError, UsageError, file_problem
    from t2s.evaluation.config import PolicyConfig
    from t2s.evaluation.records import result_preview
    from t2s.evaluation.transcript import print_heading
    from t2s.ui.console import console as make_console

    if not str(args.question).strip():
        raise UsageError("Error: ask: the question is empty")
    chosen = [name for name, (wanted, _) in POLICIES.items() if wanted(args)]
    if not chosen:
        raise UsageError("Error: ask: choose a policy: --replay TURNS.jsonl" + "".join(
            f" or --{name}" for name in POLICIES if name != "replay"))
    if len(chosen) > 1:
        raise UsageError(f"Error: ask: choose one policy, got {', '.join(chosen)}")
    if databases.is_dsn(args.db):  # a database on a PostgreSQL server
        try:
            db = databases.user_db(args.db)
        except databases.DatabaseOpenError as exc:
            raise EvalError(str(exc)) from None
    else:
        path = Path(os.path.expanduser(args.db))  # ~user of no user stays as written (pathlib raises)
        problem = file_problem(path, "database file")
        if problem:
            if "password=" in args.db:  # a key-value connection string, which --db does not take: never echo it
                from t2s.env.databases.postgres_engine import redact

                raise EvalError("Error: --db takes a database file or a postgresql:// URL, not a key-value "
                                f"connection string ({redact(args.db)})")
            raise EvalError(f"Error: {problem}")
        db = databases.user_db(path)
    tables = [("",)]
    try:
        if db.engine == "sqlite":
            tables = databases.tool_connection(db).execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') LIMIT 1").fetchall()
        else:  # DuckDB's main schema, PostgreSQL's public one: the tables the tools show
            from t2s.env.schema import get_schema

            tables = get_schema(db).tables
    except Exception as exc:  # not a database, unreadable, unreachable, ...
        shown = args.db if db.engine != "postgres" else db.db_id  # a URL may hold a password
        message = str(exc).removeprefix("Error: ")
        raise EvalError(f"Error: cannot open {shown} as a {databases.ENGINE_NAMES[db.engine]} database: "
                        f"{message}") from None
    if not tables:  # SQLite opens an empty file as a database without tables: no question has an answer there
        shown = args.db if db.engine != "postgres" else f"the PostgreSQL database {db.db_id}"
        where = {"sqlite": " (an empty file?)", "duckdb": " in its main schema",
                 "postgres": " in its current schema"}[db.engine]
        raise EvalError(f"Error: {shown} holds no tables{where}: nothing to ask about")
    policy = PolicyConfig.from_options({**vars(args), "policy": chosen[0]})  # a bad system prompt file is named here
    config = policy.episode_for(args.mode)
    row = ask_row(args.question, args.evidence, db)
    console = make_console()
    if not args.json:
        print_heading({"question_id": row["question_id"], "db_id": row["db_id"], "mode": config.mode,
                       "question": row["question"], "evidence": row["evidence"]}, console)
    try:
        record, shown_live = POLICIES[chosen[0]][1](args, policy, row, config, db)
    except ValueError as exc:  # a bad turns file, a model or endpoint that cannot be used
        raise EvalError(str(exc)) from None
    if record.played_no_turn:
        from t2s.env.record import no_turn_line

        raise EvalError("Error: " + no_turn_line(1, 1, record.prompt_tokens, config.episode_token_budget,
                                                 config.min_episode_tokens))
    sql = record.final_sql
    result = databases.run_tool_query(db, sql, max_rows=RESULT_ROWS) if sql else None
    extra = {"question": row["question"], "evidence": row["evidence"],
             "pred_result": result_preview(result, rows=RESULT_ROWS)}
    record = {**record.to_json(), **extra}  # extra's keys are RECORD_EXTRA_KEYS, in that order
    if args.json:
        from t2s.ui.console import safe_json

        print(safe_json(record))
    elif shown_live:  # the turns were shown as they happened: only the final SQL now
        show_trajectory({**record, "turns": []}, console)
    else:
        show_trajectory(record, console)
    return 0


def show_trajectory(record: dict, console) -> None:
    """The episode after its heading, readably (``t2s.evaluation.transcript``), with its result's first rows."""
    from t2s.evaluation.transcript import print_transcript

    print_transcript(record, console, fold_thinking=False, heading=False)


# ---------------------------------------------------------------------------------------------------------------
# Model-backed policies: a transformers checkpoint (--model) or a server (--endpoint), through the same rollout code
# as training and evaluation (token-id prompts, raw token stream). The trajectory is shown as it happens.


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.env.episode import EpisodeConfig
    from t2s.evaluation.options import add_endpoint_arguments, add_sampling_arguments

    parser.add_argument("--model", default=None, help="a transformers model folder or hub id (runs locally)")
    parser.add_argument("--device", default=None, help="--model: cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--max-tokens-per-turn", type=positive_int, default=EpisodeConfig.max_tokens_per_turn,
                        help=f"tokens one model turn may generate (default: {EpisodeConfig.max_tokens_per_turn})")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: unseeded)")
    add_sampling_arguments(parser)
    add_endpoint_arguments(parser)


def _model_policy(args, policy, row: dict, config, db):
    from t2s.evaluation.policies import model_backend
    from t2s.errors import EvalError

    try:
        backend, tokenizer, _ = model_backend(policy.model, policy.tokenizer, policy.device,
                                              chat_template=policy.chat_template)
    except EvalError as exc:
        raise ValueError(str(exc)) from None
    return _rollout_episode(args, backend, tokenizer, row, config, policy.sampling, db)


def _endpoint_policy(args, policy, row: dict, config, db):
    from t2s.backends.chat_endpoint import ChatEndpointPolicy, EndpointError
    from t2s.env.episode import Episode
    from t2s.rollout.text_policy import play
    from t2s.evaluation.policies import completions_backend, endpoint_client, load_tokenizer
    from t2s.errors import EvalError

    sampling, endpoint = policy.sampling, policy.endpoint
    try:
        client = endpoint_client(endpoint, config.enable_thinking, config.episode_token_budget)
        if endpoint.mode == "completions":
            tokenizer = load_tokenizer(policy.tokenizer or client.model, required=True,
                                       chat_template=policy.chat_template)
            backend = completions_backend(endpoint, tokenizer, client.model, config.episode_token_budget)
            return _rollout_episode(args, backend, tokenizer, row, config, sampling, db)
        tokenizer = load_tokenizer(policy.tokenizer, required=False, chat_template=policy.chat_template)
        if endpoint.mode == "tools":  # the server's function calling (PolicyConfig made the call format native)
            from t2s.backends.tools_endpoint import ToolsEndpointPolicy

            player = ToolsEndpointPolicy(client, sampling, seed=policy.seed)
        else:
            player = ChatEndpointPolicy(client, sampling, seed=policy.seed)
        if not args.json:
            player = LiveTextPolicy(player, tool_format=config.tool_format)
        return play(Episode(row, config, db), player, tokenizer).record(), not args.json
    except (EvalError, EndpointError) as exc:
        raise ValueError(str(exc)) from None


def _rollout_episode(args, backend, tokenizer, row: dict, config, sampling, db):
    """One episode through ``rollout.Rollout`` on the user's database (``mode=ro``)."""
    from t2s.rollout import driver as rollout

    if not args.json:
        backend = LiveBackend(backend, tokenizer, tool_format=config.tool_format)
    trace = rollout.Rollout(
        backend, tokenizer, config, sampling=sampling, score=False, tool_workers=1, db=db
    ).run([row])[0]
    if trace.error:
        raise ValueError(f"{trace.error} (the episode stopped)")
    return trace.record, not args.json


def _show_turn(console, text: str, tool_format: str = "json") -> None:
    from rich.text import Text

    from t2s.env.native_calls import parse_turn as parse_native
    from t2s.env.turns import parse_turn
    from t2s.ui.console import safe_text

    parsed = parse_native(text) if tool_format == "native" else parse_turn(text)
    shown = Text("assistant\n", style="bold")
    if parsed.thinking:
        shown.append(safe_text(parsed.thinking.strip()) + "\n", style="dim italic")
    for call in parsed.calls:
        shown.append(safe_text(json.dumps(call.as_dict(), ensure_ascii=False)) + "\n", style="bold cyan")
    if not parsed.calls:
        shown.append(safe_text(parsed.body.strip() or "(empty turn)") + "\n",
                     style="" if parsed.body.strip() else "dim")
    console.print(shown)


def _show_observation(console, observation: str) -> None:
    from t2s.ui.console import untrusted

    if observation.strip():
        console.rule("observation", align="left", style="green")
        console.print(untrusted(observation.strip(), style="green"))


class LiveTextPolicy:
    """Shows each observation and assistant turn of a text policy as it happens."""

    def __init__(self, policy, console=None, tool_format: str = "json"):
        from t2s.ui.console import console as make_console

        self.policy = policy
        self.tool_format = tool_format
        self.console = console or make_console()
        self.finish_reasons = getattr(policy, "finish_reasons", [])

    def __call__(self, episode) -> str:
        if episode.turns:
            _show_observation(self.console, episode.turns[-1]["observation"])
        text = self.policy(episode)
        _show_turn(self.console, getattr(text, "text", text) if not isinstance(text, str) else text, self.tool_format)
        return text


class LiveBackend:
    """Wraps a generation backend for one episode and shows each turn and observation as the tokens arrive."""

    def __init__(self, backend, tokenizer, console=None, tool_format: str = "json"):
        from t2s.ui.console import console as make_console

        self.backend = backend
        self.tool_format = tool_format
        self.tokenizer = tokenizer
        self.console = console or make_console()
        self.schedule = getattr(backend, "schedule", "turnsync")
        self.stop_token_ids = backend.stop_token_ids
        self.seen = 0  # prompt tokens already shown

    def _before(self, prompt_ids) -> None:
        if self.seen:  # the environment's suffix since the last turn holds the observation
            text = self.tokenizer.decode(list(prompt_ids[self.seen:]), skip_special_tokens=False)
            from t2s.env.chat_format import chat_format

            fmt = chat_format(self.tokenizer)  # the template's user-turn opening, and its end of turn
            observation = text.partition(fmt.user_head[True].strip())[2].rpartition(fmt.end_of_turn)[0].strip("\n")
            _show_observation(self.console, observation)

    def _after(self, prompt_ids, out) -> None:
        self.seen = len(prompt_ids) + len(out.token_ids)
        if out.finish_reason == "error":
            self.console.print(str(out.error), style="red", highlight=False, markup=False)
            return
        ids = out.token_ids[:-1] if out.stop_token_id is not None else out.token_ids
        _show_turn(self.console, self.tokenizer.decode(ids, skip_special_tokens=False), self.tool_format)

    def generate(self, prompts, max_tokens, sampling, seeds=None):
        for prompt in prompts:
            self._before(prompt)
        outputs = self.backend.generate(prompts, max_tokens, sampling, seeds)
        for prompt, out in zip(prompts, outputs):
            self._after(prompt, out)
        return outputs

    async def agenerate(self, prompt_ids, max_tokens, sampling, seed=None):
        self._before(prompt_ids)
        out = await self.backend.agenerate(prompt_ids, max_tokens, sampling, seed)
        self._after(prompt_ids, out)
        return out

    async def aclose(self) -> None:
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            await close()
