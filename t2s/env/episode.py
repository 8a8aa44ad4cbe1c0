"""The per-question episode: a model-agnostic state machine over the tools (DESIGN §3, §10).

The caller feeds assistant turns (text) and its own token counts; the episode runs the calls, enforces every
budget, renders the next observation and finally picks the final SQL:
1. the submitted SQL, if it executes;  2. else the forced answer, if it executes;  3. else the last ``run_query`` that
ran without error, unless that check failed it (fallback);  4. else the submitted/forced SQL as written, or none.

Mode ``single`` is the single-turn protocol (``t2s.env.single_turn``): one turn, no tools, the turn's SQL is the
answer as written; the only budget is the episode's, so a prompt ends it unplayed only when it leaves no token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from t2s.env import native_calls, native_reader, protocol, single_turn, tool_schemas
from t2s.env import turns
from t2s.env.protocol import budget_line, forced_message, render_observation
from t2s.env.turns import ParsedTurn, ToolCall, parse_turn
from t2s.env.record import COUNTER_KEYS, RECORD_KEYS, EpisodeRecord, counters as record_counters
from t2s.env.tools import ToolResult, Toolbox

ENV_CHARS_PER_TOKEN = 2  # conservative guess of an observation's size in tokens, when no counter is given


@functools.lru_cache(maxsize=4096)
def _database(db_path, db_id, schema_id):
    from t2s.env.databases import ref_from_row

    return ref_from_row({"db_path": db_path, "db_id": db_id, "schema_id": schema_id})


def row_database(row: dict):
    """The row's DatabaseRef, looked up once per database (resolving a path reads the file's header)."""
    return _database(row.get("db_path"), row.get("db_id"), row.get("schema_id"))


@dataclass
class EpisodeConfig:
    mode: str = "full"
    dialect: str = "exec_plan"  # the tool set: exec_plan or sibling
    tool_format: str = "json"  # the call format: json (DESIGN §3) or native (the chat template's own tool calling)
    max_turns: int = 6
    max_calls_per_turn: int = 8
    max_failed_queries: int = 4
    episode_tool_seconds: float = 30.0
    episode_token_budget: int = 12288
    max_tokens_per_turn: int = 2048
    forced_turn_reserve: int = 512
    min_episode_tokens: int = 2048
    tool_timeout: float = 5.0
    column_descriptions: bool = False
    system_prompt_file: str | None = None
    enable_thinking: bool = True

    def budget_problem(self, as_flags: bool = False) -> str | None:
        """Why an episode could play no turn under this budget (None when every one that starts can): ``start`` ends
        every episode whose prompt leaves less than ``min_episode_tokens``, so a budget of ``min_episode_tokens`` or
        less ends them all; and a tool turn gets what is left less ``forced_turn_reserve`` and the closing token, so a
        reserve of ``min_episode_tokens - 1`` or more leaves an episode that starts with ``min_episode_tokens`` no
        turn. ``as_flags``: name the settings as eval's flags (``--min-episode-tokens``), not as recipe keys."""
        budget, minimum, reserve = (f"--{key.replace('_', '-')}" if as_flags else key for key in
                                    ("episode_token_budget", "min_episode_tokens", "forced_turn_reserve"))
        if self.episode_token_budget <= self.min_episode_tokens:
            return (f"Error: {budget} {self.episode_token_budget} cannot leave {minimum} ({self.min_episode_tokens}) "
                    "after any prompt, so every episode would end before its first turn; raise the budget, or lower "
                    f"{minimum}")
        if self.forced_turn_reserve >= self.min_episode_tokens - 1:
            return (f"Error: {reserve} {self.forced_turn_reserve} leaves no tool turn to an episode that starts with "
                    f"{minimum} ({self.min_episode_tokens}) of its budget; keep it below {self.min_episode_tokens - 1}"
                    f", or raise {minimum}")
        return None


class Episode:
    """One question's episode. ``start`` -> (``next_max_tokens`` -> ``step`` -> ``add_env_tokens``)* -> ``record``."""

    def __init__(self, row: dict, config: EpisodeConfig | None = None, db=None, *, schema=None, env_tokens=None,
                 special_tokens: tuple[str, ...] = native_reader.CHATML_SPECIAL_TOKENS):
        """``env_tokens(observation) -> int`` counts the environment suffix that will carry an observation (the
        rollout passes the exact count from the tokenizer); without it, a conservative estimate from its length.
        ``special_tokens``: the tokenizer's, which a native turn's reader drops
        (``native_reader.special_tokens_of``)."""
        self.row = row
        self.env_tokens = env_tokens
        self.special_tokens = special_tokens
        self.config = config or EpisodeConfig()
        self.native = tool_schemas.check_tool_format(self.config.tool_format) == "native"
        self.single = self.config.mode == "single"
        self.db = db if db is not None else row_database(row)
        engine = getattr(self.db, "engine", "sqlite")
        offered = self.native and not self.single
        self.tools = tool_schemas.function_schemas(self.config.dialect, engine) if offered else None  # for tools=
        self.toolbox = Toolbox(
            self.db,
            dialect=self.config.dialect,
            tool_timeout=self.config.tool_timeout,
            column_descriptions=self.config.column_descriptions,
        )
        self.setup_error: str | None = None
        if schema is None and self.config.mode in ("full", "single"):
            try:
                schema = self.toolbox.schema
            except Exception as exc:  # a missing or unreadable database: the tools will say so too
                self.setup_error = f"Error: cannot read the database schema: {exc}"
        self._schema = schema
        self._messages: list[dict] | None = None
        self.turns: list[dict] = []
        self.counters = dict.fromkeys(COUNTER_KEYS, 0)
        self.done = False
        self.forced_turn = False  # the next turn is the forced final turn
        self.stop_reason: str | None = None  # why it ended: record.STOP_REASONS
        self.prompt_tokens = 0
        self.tool_seconds = 0.0
        self.tool_turns = 0
        self.failed_streak = 0
        self.tokens_used = 0
        self.started = False
        self.submitted_sql: str | None = None
        self.forced_sql: str | None = None
        self.working_sqls: dict[str, None] = {}  # every run_query that ran without error, the latest last
        self.final_sql: str | None = None
        self.final_sql_source = "none"
        self._runs: dict[str, bool] = {}  # SQL -> ran to its last row without error (the final-SQL check's runs)
        self._finalized = False

    @property
    def messages(self) -> list[dict]:
        """The chat messages the episode starts from, ``[system, user]`` (built on first use)."""
        if self._messages is None and self.single:
            self._messages = single_turn.messages(self.row, self._schema, self.toolbox.engine)
        elif self._messages is None:
            self._messages = protocol.initial_messages(self.row, self.config, self._schema, self.toolbox.engine)
        return self._messages

    # -- tokens -----------------------------------------------------------------------------------------------------

    @property
    def tokens_left(self) -> int:
        return self.config.episode_token_budget - self.tokens_used

    def start(self, prompt_tokens: int = 0) -> None:
        """Account the prompt; a prompt leaving less than ``min_episode_tokens`` (``single``: no token) ends the episode
        at once."""
        self.started = True
        self.tokens_used = self.prompt_tokens = int(prompt_tokens)
        least = 1 if self.single else self.config.min_episode_tokens
        if prompt_tokens and self.tokens_left < least:
            self._finish("prompt_too_long")

    def next_max_tokens(self) -> int:
        """Tokens the next generation call may use (0: the budget is spent and the episode over); one token of the
        budget is always left for the ``<|im_end|>`` that closes a turn cut off by its limit."""
        if self.done:
            return 0
        cfg = self.config
        left = cfg.episode_token_budget - self.tokens_used  # tokens_left, read without the property call
        if self.single:  # the answer may use the whole budget; a prompt of unknown size leaves two turns' worth
            return left if self.tokens_used else min(left, 2 * cfg.max_tokens_per_turn)
        if self.forced_turn:
            allowed = min(cfg.max_tokens_per_turn, left - 1)
        else:
            allowed = min(cfg.max_tokens_per_turn, left - 1 - cfg.forced_turn_reserve)
        if allowed <= 0:
            self.counters["truncated"] = 1
            self._finish("budget")
            return 0
        return allowed

    def add_env_tokens(self, n: int) -> None:
        """The caller's count of the environment suffix tokens that followed the last observation."""
        self.tokens_used += int(n or 0)

    # -- turns ------------------------------------------------------------------------------------------------------

    def step(self, text: str, *, n_tokens: int = 0, cut_off: bool = False,
             parsed: ParsedTurn | None = None) -> str | None:
        """One assistant turn; returns the next observation, or None when the episode is over. Never raises: a turn
        the environment fails on counts as a tool error, and the episode goes on.

        ``parsed``: the turn's calls as a server already read them (``--endpoint-mode tools``); otherwise the turn is
        read in the episode's call format. A native observation is a ``native_calls.Observation``."""
        if self.done:
            return None
        text = turns.valid_text(text) if isinstance(text, str) else ""
        if n_tokens:
            self.tokens_used += int(n_tokens)
        counters = self.counters
        if cut_off:
            counters["turn_cutoffs"] += 1
        if self.single:
            return self._answer_step(text, parsed)
        if parsed is None:
            parsed = self.parse(text)
        counters["format_deviations"] += parsed.deviations
        counters["turns"] += 1
        turns_recorded = len(self.turns)
        try:
            if self.forced_turn:
                return self._forced_step(text, parsed)
            return self._tool_step(text, parsed)
        except Exception as exc:  # noqa: BLE001 - nothing a model writes may stop the run
            del self.turns[turns_recorded:]
            return self._failed_step(text, exc)

    def parse(self, text: str) -> ParsedTurn:
        """Read an assistant turn's calls in the episode's call format."""
        if self.native:
            return native_calls.parse_turn(text, self.config.enable_thinking, self.tools, self.special_tokens)
        return parse_turn(text, self.config.enable_thinking)

    def _observation(self, results: list, tail: str, n_calls: int = 0) -> str:
        """The observation of a turn: results of the calls that ran (``ToolResult``) and the environment's own lines
        (``("", text)`` pairs), then ``tail``; in the native format, one tool message per call and a user message."""
        if not self.native:
            return render_observation(results, tail)
        ran = [r for r in results if isinstance(r, ToolResult)]
        notes = [r[1] for r in results if not isinstance(r, ToolResult)]
        return native_calls.observation(ran, notes, tail, n_calls)

    def _failed_step(self, text: str, exc: Exception) -> str | None:
        """The turn the environment failed on: a tool error, then the next turn (or the end, if none is left)."""
        self.counters["tool_errors"] += 1
        error = f"Error: the environment failed on this turn ({type(exc).__name__}); nothing of it ran."
        tool_turns_left = self.config.max_turns - self.tool_turns
        if self.done or self.forced_turn or tool_turns_left <= 0:
            self._record_turn(text, [], "")
            self._finish(self.stop_reason or "turn_limit")
            return None
        observation = self._observation([("", error)], budget_line(tool_turns_left))
        self._record_turn(text, [], observation)
        return observation

    def _tool_step(self, text: str, parsed) -> str | None:
        cfg = self.config
        counters = self.counters
        call_tool = self.toolbox.call
        self.tool_turns += 1
        results: list[ToolResult] = []
        ran: list[dict] = []
        calls = parsed.calls
        stop_reason = None
        tool_budget = cfg.episode_tool_seconds
        used = self.tool_seconds
        for index, call in enumerate(calls[: cfg.max_calls_per_turn]):
            tool, args = call.tool, call.args
            ran.append({"tool": tool, "args": args})
            result = call_tool(tool, args, timeout=tool_budget - used)
            self.tool_seconds = used = used + result.seconds
            error = result.error
            if error:
                counters["tool_errors"] += 1
                if result.write_attempt:  # only a refused statement is a write attempt
                    counters["write_attempts"] += 1
            role = result.role
            if role != "other":
                if role == "submit":
                    if not error:
                        counters["calls"] += len(ran)
                        self.submitted_sql = result.sql
                        counters["submitted"] = 1
                        self._record_turn(text, ran, "")
                        self._finish("submitted")
                        return None
                elif error:
                    self.failed_streak += 1
                    if self.failed_streak >= cfg.max_failed_queries:
                        stop_reason = "failed_queries"
                else:
                    self.failed_streak = 0
                    self.working_sqls.pop(result.sql, None)  # run_query reads its first rows only: no _runs entry
                    self.working_sqls[result.sql] = None
            results.append(result)
            if used >= tool_budget and stop_reason is None:
                stop_reason = "tool_time"
            if stop_reason:
                skipped = min(len(calls), cfg.max_calls_per_turn) - index - 1
                if skipped > 0:
                    results.append(("", f"Error: {skipped} later call(s) in this turn were not run."))
                break
        counters["calls"] += len(ran)
        if len(calls) > cfg.max_calls_per_turn and stop_reason is None:
            extra = len(calls) - cfg.max_calls_per_turn
            results.append(
                ("", f"Error: only the first {cfg.max_calls_per_turn} calls of a turn run; {extra} more were ignored.")
            )
        if not calls:
            results.extend(("", err) for err in parsed.errors)
            submit = self.toolbox.submit_tool
            if self.native:
                results.append(("", native_calls.no_call_error(submit)))
            else:
                results.append(
                    (
                        "",
                        "Error: no tool call found. After your thinking, write one JSON object such as "
                        f'{{"tool": "{submit}", "args": {{"sql": "SELECT ..."}}}}.',
                    )
                )
        if stop_reason is None and self.tool_turns >= cfg.max_turns:
            stop_reason = "turn_limit"
        n_answered = min(len(calls), cfg.max_calls_per_turn)  # native: a tool message each (past the cap, a note)
        if stop_reason is None:
            observation = self._observation(results, budget_line(cfg.max_turns - self.tool_turns), n_answered)
            if self._room_after(observation) - cfg.forced_turn_reserve > 0:
                self._record_turn(text, ran, observation)
                return observation
            stop_reason = "budget"  # a normal turn would eat into the forced-turn reserve
        observation = self._observation(results, self._forced_message(stop_reason), n_answered)
        self._start_forced_turn(stop_reason)
        if self._room_after(observation) <= 0:  # not even the forced turn fits: the episode ends here
            self.counters["truncated"] = 1
            self._record_turn(text, ran, "")
            self._finish("budget")
            return None
        self._record_turn(text, ran, observation)
        return observation

    def _room_after(self, observation: str) -> float:
        """Tokens a model turn could still use once ``observation`` is shown (one kept for a closing ``<|im_end|>``)."""
        if not self.started or self.tokens_used == 0:  # no token accounting (scripted play without a tokenizer)
            return float("inf")
        if self.env_tokens is not None:
            cost = self.env_tokens(observation)
        else:
            cost = len(observation) // ENV_CHARS_PER_TOKEN + 32
        return self.tokens_left - cost - 1

    def _forced_message(self, reason: str) -> str:
        why = {
            "turn_limit": "You have used all your tool turns.",
            "failed_queries": f"{self.config.max_failed_queries} queries in a row failed.",
            "tool_time": "The tool time budget is used up.",
            "budget": "The token budget is nearly used up.",
        }[reason]
        return forced_message(next(reversed(self.working_sqls), None), why, self.toolbox.submit_tool)

    def _start_forced_turn(self, reason: str) -> None:
        self.forced_turn = True
        self.stop_reason = reason
        self.counters["forced"] = 1
        if reason == "budget":
            self.counters["truncated"] = 1

    def _forced_step(self, text: str, parsed) -> None:
        ran: list[dict] = []
        for call in parsed.calls:
            if call.tool == self.toolbox.submit_tool:
                ran.append(call.as_dict())
                self.counters["calls"] += 1
                sql = call.args.get("sql") if isinstance(call.args, dict) else None
                if isinstance(sql, str) and sql.strip():
                    self.forced_sql = sql
                else:
                    self.counters["tool_errors"] += 1
                break
        if self.forced_sql is None and not parsed.calls:
            self.forced_sql = turns.bare_sql(parsed.body)
        self._record_turn(text, ran, "")
        self._finish(self.stop_reason or "stopped")
        return None

    def _answer_step(self, text: str, parsed: ParsedTurn | None = None) -> None:
        """The single-turn answer: its SQL, as written, is the submitted and final SQL (a reader's ``submit_sql``
        call when ``parsed`` is given: a predictions file's SQL, taken as filed)."""
        if parsed is not None:
            sql, deviations = single_turn.submitted_sql(parsed), parsed.deviations
        else:
            sql, deviations = single_turn.answer_sql(text)
        self.counters["turns"] += 1
        self.counters["format_deviations"] += deviations
        self.counters["submitted"] = int(sql is not None)
        self.submitted_sql = sql
        self._record_turn(text, [], "")
        self._finish("submitted" if sql is not None else "no_answer")

    def _record_turn(self, text: str, calls: list[dict], observation: str) -> None:
        self.turns.append({"assistant": text, "calls": calls, "observation": observation})

    # -- the end ----------------------------------------------------------------------------------------------------

    def finish(self, reason: str = "stopped") -> None:
        """End the episode now (``"error"``: the generation backend failed); the final-SQL rule still applies."""
        self._finish(reason)

    def end_with_error(self, text: str) -> None:
        """End the episode on a turn that ``step`` raised on (a caller's last resort): the turn is recorded with a
        tool error, and the final-SQL rule applies."""
        if self.done:
            return
        self.counters["tool_errors"] += 1
        self.counters["turns"] = len(self.turns) + 1
        self._record_turn(turns.valid_text(text) if isinstance(text, str) else "", [], "")
        self._finish("error")

    def _finish(self, reason: str) -> None:
        if self.done:
            return
        self.done = True
        self.forced_turn = False
        if self.stop_reason is None or reason in ("submitted", "budget", "prompt_too_long", "error"):
            self.stop_reason = reason
        self._choose_final_sql()

    def _executes(self, sql: str | None) -> bool:
        if not isinstance(sql, str) or not sql.strip():
            return False
        if sql not in self._runs:
            ok, write = self.toolbox.executes(sql)
            self.counters["write_attempts"] += int(write)
            self._runs[sql] = ok
        return self._runs[sql]

    def _choose_final_sql(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        if self.single:  # scored as written: nothing runs before scoring
            source = "submitted" if self.submitted_sql is not None else "none"
            self.final_sql, self.final_sql_source = self.submitted_sql, source
        elif self._executes(self.submitted_sql):
            self.final_sql, self.final_sql_source = self.submitted_sql, "submitted"
        elif self._executes(self.forced_sql):
            self.final_sql, self.final_sql_source = self.forced_sql, "forced"
        elif fallback := next((sql for sql in reversed(self.working_sqls) if self._runs.get(sql, True)), None):
            self.final_sql, self.final_sql_source = fallback, "fallback"
            self.counters["fallback_used"] = 1
        elif self.submitted_sql is not None:
            self.final_sql, self.final_sql_source = self.submitted_sql, "submitted"
        elif self.forced_sql is not None:
            self.final_sql, self.final_sql_source = self.forced_sql, "forced"
        else:
            self.final_sql, self.final_sql_source = None, "none"

    def record(self) -> EpisodeRecord:
        """The DESIGN §10 episode record (ends the episode first if it is still running)."""
        if not self.done:
            self._finish("stopped")
        return EpisodeRecord(
            question_id=self.row.get("question_id"), db_id=self.row.get("db_id", getattr(self.db, "db_id", None)),
            mode=self.config.mode, turns=[dict(turn) for turn in self.turns], final_sql=self.final_sql,
            final_sql_source=self.final_sql_source, submitted_sql=self.submitted_sql,
            counters=record_counters(**self.counters), stop_reason=self.stop_reason, prompt_tokens=self.prompt_tokens,
        )  # fmt: skip


__all__ = ["Episode", "EpisodeConfig", "EpisodeRecord", "RECORD_KEYS", "COUNTER_KEYS", "ToolCall"]
