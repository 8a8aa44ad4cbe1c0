"""The exec_plan protocol (docs/design.md §3): prompts, rendering observations, and the environment's tokens.

A turn is the text the model writes after the generation prompt (for Qwen3.5
``<|im_start|>assistant\\n<think>\\n``): it starts inside the think block when thinking is on. What the chat
template writes around turns is read from it (``t2s.env.chat_format``). Reading a turn into tool calls is
``t2s.env.turns``; the native XML format is ``t2s.env.native_calls``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from t2s.env import tool_schemas
from t2s.env.databases.engine_base import ENGINE_NAMES, check_engine
from t2s.errors import read_text_file
from t2s.env.chat_format import THINK_CLOSE, THINK_OPEN, chat_format  # noqa: F401 - THINK_* are read from here

OBSERVATION_CHAR_CAP = 4000  # all tool results of one observation together (each tool result is capped too)
LABEL_SQL_CHARS = 60  # a run_query label quotes this much of the SQL
FORCED_SQL_CHARS = 1500  # the forced-turn message quotes at most this much of the last working query

_INTRO = {
    "exec_plan": "You answer questions about a SQLite database by writing one SQL query. You may explore the database "
    "with tools before you answer, and you see the real results of every tool call.",
    "sibling": "You answer questions about a SQLite database by writing one SQL query. Use the tools to look at the "
    "database, test your queries, and then submit your answer.",
}
_JSON_RULES = {  # how to call a tool in the json format, and how the episode ends
    "exec_plan": """\
How to call a tool: think first, close your thinking with </think>, then write the call as one JSON object:
{"tool": "run_query", "args": {"sql": "SELECT COUNT(*) FROM orders"}}
Write exactly one such JSON object per turn, and nothing else after your thinking. The result comes back in the \
next message. You have a limited number of tool turns; the remaining count is shown after each result.

When you are confident, call submit_sql with your final query. submit_sql ends the episode at once: nothing after \
it runs. The database is read-only; only SELECT queries work.""",
    "sibling": """\
After your thinking, write one call per turn as one JSON object, for example:
{"tool": "run_sql", "args": {"sql": "SELECT COUNT(*) FROM orders"}}
submit ends the episode at once. The database is read-only.""",
}
_NATIVE_RULES = {  # the same in the native format: the chat template declares the tools and the call syntax
    "exec_plan": """\
Think first, close your thinking with </think>, then call the tools you need; several calls in one turn run in \
order. The results come back in the next message. You have a limited number of tool turns; the remaining count is \
shown after each result.

When you are confident, call submit_sql with your final query. submit_sql ends the episode at once: nothing after \
it runs. The database is read-only; only SELECT queries work.""",
    "sibling": """\
After your thinking, call the tools you need; several calls in one turn run in order. submit ends the episode at \
once. The database is read-only.""",
}


def default_system_prompt(dialect: str = "exec_plan", tool_format: str = "json", engine: str = "sqlite") -> str:
    """The built-in tool instructions. In the json format they list every tool (from ``tool_schemas``) and the call
    syntax; in the native format the chat template renders the tools, so the prompt holds only the task and rules.
    The first line names the engine's SQL dialect: "a SQLite database", "a DuckDB database", "a PostgreSQL database"."""
    tool_schemas.check_dialect(dialect)
    intro = _INTRO[dialect]
    if check_engine(engine) != "sqlite":
        intro = intro.replace("a SQLite database", f"a {ENGINE_NAMES[engine]} database")
        intro += f" Write {ENGINE_NAMES[engine]} SQL."
    if tool_schemas.check_tool_format(tool_format) == "native":
        return f"{intro}\n\n{_NATIVE_RULES[dialect]}"
    return f"{intro}\n\nTools:\n{tool_schemas.prompt_lines(dialect)}\n\n{_JSON_RULES[dialect]}"


def system_prompt(dialect: str = "exec_plan", path: str | Path | None = None, tool_format: str = "json",
                  engine: str = "sqlite") -> str:
    """The tool instructions; ``path`` replaces them with a file's text.

    The published checkpoints are sensitive to the exact wording, which is not public: hence the file.
    """
    if path:
        return read_text_file(path, "system prompt file").strip()
    return default_system_prompt(dialect, tool_format, engine)


def user_prompt(row: dict, mode: str, schema=None) -> str:
    """Question, evidence (BIRD's hint) and, in full mode, the CREATE TABLE statement of every table."""
    if mode not in ("full", "withheld"):
        raise ValueError(f"Error: unknown mode {mode!r}; expected 'full' or 'withheld'")
    parts = [f"Question: {str(row.get('question') or '').strip()}"]
    evidence = str(row.get("evidence") or "").strip()
    if evidence:
        parts.append(f"Evidence: {evidence}")
    if mode == "full":
        parts.append(f"Database schema:\n{schema_block(schema)}")
    else:
        parts.append("The database schema is not shown: explore it with the tools.")
    return "\n\n".join(parts)


@functools.lru_cache(maxsize=256)
def _schema_block(schema) -> str:
    return "\n".join(schema.ddl(t) for t in schema.tables) if schema.tables else "(no tables)"


def schema_block(schema) -> str:
    """Every table's CREATE TABLE statement, one per line (built once per schema)."""
    if schema is None:
        return "(no tables)"
    try:
        return _schema_block(schema)
    except TypeError:  # an unhashable schema-like object
        return _schema_block.__wrapped__(schema)


def initial_messages(row: dict, config, schema=None, engine: str = "sqlite") -> list[dict]:
    """The chat messages the episode starts from: ``[system, user]``; ``engine`` is the database's."""
    system = system_prompt(config.dialect, config.system_prompt_file, getattr(config, "tool_format", "json"), engine)
    return [{"role": "system", "content": system}, {"role": "user", "content": user_prompt(row, config.mode, schema)}]


# ----------------------------------------------------------------------------------------------------------------
# Observations


def budget_line(turns_left: int) -> str:
    noun = "turn" if turns_left == 1 else "turns"
    return f"[{turns_left} tool {noun} left before you must answer]"


def forced_message(last_working_sql: str | None, reason: str, submit_tool: str = "submit_sql") -> str:
    """Replaces the budget line when the next turn is the forced final turn."""
    lines = [
        f"[{reason} Your exploration budget is spent. Reply now with the final SQL only: a {submit_tool} call or the "
        "bare query. No more tools will run.]"
    ]
    if last_working_sql:
        sql = shorten(last_working_sql, FORCED_SQL_CHARS)
        lines.append(f"The last query that ran without error was:\n{sql}\nIf you are unsure, return that query.")
    else:
        lines.append("No query has run without error yet.")
    return "\n".join(lines)


def shorten(text: str, limit: int) -> str:
    """Whitespace runs collapsed to one space, cut to ``limit`` characters with ``...``."""
    if type(text) is not str:
        text = str(text)
    head = text[: limit + 1]
    # the only printable whitespace is " ": a printable head with single inner spaces, none at its ends, is already
    # collapsed, and it is where the collapsed text begins
    if head.isprintable() and "  " not in head and head.strip() == head and limit >= 3:
        return head if len(head) <= limit else head[: limit - 3] + "..."
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cap_text(text: str, limit: int = OBSERVATION_CHAR_CAP) -> str:
    """Cut ``text`` to ``limit`` characters with a visible marker."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    while True:  # the count is of the characters not shown, the marker's own length taken into account
        marker = f"\n... [output cut: {cut} more characters not shown]"
        kept = max(0, limit - len(marker))
        if len(text) - kept == cut:
            return text[:kept] + marker
        cut = len(text) - kept


def render_observation(results, tail: str) -> str:
    """Each result under its ``[label]``, all within the observation cap, then the budget line or forced message.

    ``results`` are objects with ``label`` and ``text`` (tools.ToolResult) or plain ``(label, text)`` pairs.
    """
    blocks = []
    for item in results:
        try:
            label, text = item.label, item.text
        except AttributeError:  # a (label, text) pair
            label, text = item
        blocks.append(f"[{label}]\n{text}" if label else str(text))
    if not blocks:
        return tail.strip()
    body = "\n\n".join(blocks)
    if len(body) > OBSERVATION_CHAR_CAP:
        body = cap_text(body)
    return f"{body}\n\n{tail}".strip()


# ----------------------------------------------------------------------------------------------------------------
# Token ids


def _ids(tokenizer, text: str, *, literal: bool) -> list[int]:
    if not text:
        return []
    if literal:  # the observation: special-token text stays plain text
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def observation_ids(tokenizer, observation: str) -> list[int]:
    """An observation's own tokens: trimmed as the template trims message content, no special-token parsing."""
    return _ids(tokenizer, observation.strip(), literal=True)


def env_suffix_ids(
    tokenizer, observation: str, *, needs_end_of_turn: bool, enable_thinking: bool = True,
    body_ids: list[int] | None = None,
) -> list[int]:
    """The environment's tokens between two model turns, exactly as the chat template renders them.

    The template's end of turn (when the model's turn did not end on it) + the text that opens a user message +
    the observation + the text that closes it and opens the next generation prompt (with its think block when thinking
    is on): for Qwen3.5, ``<|im_end|>`` + ``\\n<|im_start|>user\\n`` + observation +
    ``<|im_end|>\\n<|im_start|>assistant\\n<think>\\n``. All of it is read from the template
    (``chat_format``). ``body_ids`` are the observation's tokens when the caller already has them
    (``observation_ids``).
    """
    fmt = chat_format(tokenizer)
    thinking = fmt.thinking_for(enable_thinking)
    head = (fmt.end_of_turn if needs_end_of_turn else "") + fmt.user_head[thinking]
    body = observation_ids(tokenizer, observation) if body_ids is None else body_ids
    return _ids(tokenizer, head, literal=False) + body + _ids(tokenizer, fmt.user_tail[thinking], literal=False)


def generation_prompt_ids(tokenizer, messages: list[dict], enable_thinking: bool = True,
                          tools: list[dict] | None = None) -> list[int]:
    """The prompt tokens for the first turn, rendered by the chat template with thinking explicitly on (or off, and
    always off where the template has no think block); ``tools`` (function schemas, the native format) are declared
    through the template. A template without a system role gets the system prompt in the first user message."""
    fmt = chat_format(tokenizer)
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(
        fmt.fold_system(messages), tokenize=False, add_generation_prompt=True,
        enable_thinking=fmt.thinking_for(enable_thinking), **extra,
    )
    return _ids(tokenizer, text, literal=False)
