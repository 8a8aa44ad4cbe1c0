"""Scripted policies: play an episode without a model. A policy is ``policy(episode) -> str`` (one assistant turn).

- ``ReplayPolicy`` plays recorded assistant turns (``ask --replay TURNS.jsonl``); once they run out it produces empty
  turns, and the episode ends by its own rules.
- ``GoldPolicy`` lists the tables, describes each table the gold SQL reads, runs the gold SQL and submits it: an
  episode that must score 1.0 with no format deviation (the evaluator's self-check, and the warm start's
  trajectories), in either call format (in ``single`` mode: the gold SQL in a fenced block). In the json format every
  turn is one JSON object, as the protocol asks (docs/design.md §3); the native format describes the tables in
  parallel calls, which Qwen3.5's template allows.
- ``submit_policy`` submits a given SQL in its first turn.
"""

from __future__ import annotations

import json
from pathlib import Path

from t2s.env.native_calls import render_call
from t2s.env.protocol import THINK_CLOSE


MAX_TURNS_FILE_BYTES = 64 << 20  # recorded turns of many episodes; /dev/zero is no turns file


def read_turns(path: str | Path) -> list[str]:
    """TURNS.jsonl: each non-blank line is one JSON string, the raw text of one assistant turn."""
    from t2s.data.rows import DataError, jsonl_values
    from t2s.errors import read_text_file

    turns = []
    text = read_text_file(path, "turns file", max_bytes=MAX_TURNS_FILE_BYTES, allow_empty=True)  # a FIFO: refused
    try:
        values = list(jsonl_values(text, path))
    except DataError as exc:  # a line that is not JSON
        raise ValueError(str(exc)) from None
    for number, turn in values:
        if not isinstance(turn, str):
            kind = type(turn).__name__
            raise ValueError(f"Error: {path} line {number} must be a JSON string (one assistant turn), got {kind}")
        turns.append(turn)
    return turns


class ReplayPolicy:
    """Plays the given assistant turns in order, then empty turns."""

    def __init__(self, turns: list[str]):
        self.turns = list(turns)
        self.position = 0

    @classmethod
    def from_file(cls, path: str | Path) -> "ReplayPolicy":
        return cls(read_turns(path))

    def __call__(self, episode=None) -> str:
        if self.position >= len(self.turns):
            return ""
        turn = self.turns[self.position]
        self.position += 1
        return turn


def call_text(tool: str, **args) -> str:
    """One call in the json format."""
    return json.dumps({"tool": tool, "args": args}, ensure_ascii=False)


def native_call_text(tool: str, **args) -> str:
    """One call in the native format (Qwen3.5's ``<tool_call>`` XML)."""
    return render_call(tool, args)


json_call_text = call_text


def call_writer(tool_format: str = "json"):
    """``write(tool, **args) -> call text`` in a call format (json or native)."""
    return native_call_text if tool_format == "native" else json_call_text


def turn_text(thinking: str | None, calls: list[str]) -> str:
    """An assistant turn as the model writes it: thinking (already inside the think block), then the calls; without
    thinking (None: a template with no think block), the calls alone."""
    if thinking is None:
        return "\n".join(calls)
    return f"{thinking}\n{THINK_CLOSE}\n\n" + "\n".join(calls)


GOLD_THINKING = "I look at the tables the question needs, check the query, then submit it."


class ScriptPolicy(ReplayPolicy):
    """Plays a fixed list of turns, each a list of call texts (one JSON object per call)."""

    def __init__(self, turns: list[list[str]], thinking: str | None = "Following the script."):
        super().__init__([turn_text(thinking, calls) for calls in turns])


def gold_tables(gold_sql: str, schema) -> list[str]:
    """The tables the gold SQL reads, as the schema spells them, in the order the SQL names them (outer query first)."""
    from t2s.env.databases import SQLGLOT_DIALECTS
    from t2s.env.schema import tables_in_reading_order

    spelled = {name.lower(): name for name in schema.tables}
    dialect = SQLGLOT_DIALECTS.get(getattr(schema, "engine", "sqlite"), "sqlite")
    return [spelled[name] for name in tables_in_reading_order(gold_sql, dialect) if name in spelled]  # never raises


class GoldPolicy(ScriptPolicy):
    """list_tables and describe_table of the gold's tables, then run_query gold, then submit_sql gold.

    json format: one call a turn, within ``max_turns`` tool turns (the describes that do not fit are left out, the
    tables of the outer query kept first). native format: the exploration in parallel calls, up to
    ``max_calls_per_turn`` a turn. The sibling tool set: inspect_schema, run_sql, submit.
    """

    def __init__(self, row: dict, schema, *, dialect: str = "exec_plan", tool_format: str = "json",
                 max_turns: int = 6, max_calls_per_turn: int = 8, thinking: bool = True):
        gold = row["gold_sql"]
        write = call_writer(tool_format)
        if dialect == "sibling":
            explore = [write("inspect_schema")]
            finish = [write("run_sql", sql=gold), write("submit", sql=gold)]
        else:
            explore = [write("list_tables")] + [write("describe_table", table_name=t)
                                                for t in gold_tables(gold, schema)]
            finish = [write("run_query", sql=gold), write("submit_sql", sql=gold)]
        size = max(1, max_calls_per_turn) if tool_format == "native" else 1
        turns = [explore[i: i + size] for i in range(0, len(explore), size)]
        turns = turns[: max(0, max_turns - len(finish))] + [[call] for call in finish]
        super().__init__(turns, thinking=GOLD_THINKING if thinking else None)

    @classmethod
    def for_episode(cls, row: dict, schema, config) -> ReplayPolicy:
        """The gold policy in an ``EpisodeConfig``'s tool set, call format and turn limits; in ``single`` mode, the gold
        SQL in a fenced block, its one turn."""
        if config.mode == "single":
            return ReplayPolicy([f"```sql\n{row['gold_sql']}\n```"])
        return cls(row, schema, dialect=config.dialect, tool_format=config.tool_format, max_turns=config.max_turns,
                   max_calls_per_turn=config.max_calls_per_turn, thinking=config.enable_thinking)


def submit_policy(sql: str, dialect: str = "exec_plan", tool_format: str = "json",
                  thinking: str | None = "Following the script."):
    """A scripted policy that submits ``sql`` in its first turn (the dialect's submit tool, in its call format);
    ``thinking`` None writes no think block."""
    from t2s.env.tool_schemas import SUBMIT_TOOLS

    turns = [[call_writer(tool_format)(SUBMIT_TOOLS[dialect], sql=sql)]]
    return ScriptPolicy(turns, thinking=thinking)

