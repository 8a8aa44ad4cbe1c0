"""The single-turn protocol (``single`` mode, DESIGN §3): one turn under its own system prompt, schema in, SQL out, no
tools. ``Episode`` plays it as a mode of its own, so every policy that plays tool episodes plays it too; the SQL is
read from a ``submit_sql`` call, a fenced block or a bare SELECT/WITH after the thinking."""

from __future__ import annotations

from t2s.env import protocol, turns
from t2s.env.databases.engine_base import ENGINE_NAMES

SYSTEM_PROMPT = """\
You are an expert SQLite analyst. You are given a question, optional evidence (hints about the data) and the \
CREATE TABLE statements of a SQLite database. Write one SQLite SELECT query that answers the question.
Think first if you need to, then give the final query in a ```sql fenced block. Return only one query; no tools \
are available and the query is not run before it is scored."""


def system_prompt(engine: str = "sqlite") -> str:
    """The single-turn prompt, naming the database engine's SQL dialect (SQLite's text as it always was)."""
    return SYSTEM_PROMPT.replace("SQLite", ENGINE_NAMES[engine])


def messages(row: dict, schema, engine: str = "sqlite") -> list[dict]:
    """The single-turn system prompt and the full-mode user message (question, evidence, schema)."""
    return [{"role": "system", "content": system_prompt(engine)},
            {"role": "user", "content": protocol.user_prompt(row, "full", schema)}]


def answer_sql(text: str) -> tuple[str | None, int]:
    """(SQL, format deviations) of a single-turn answer: a submit_sql call, else a fenced block or bare SQL."""
    parsed = turns.parse_turn(text)
    sql = submitted_sql(parsed)
    if sql is not None:
        return sql, parsed.deviations
    return turns.bare_sql(parsed.body), 0


def submitted_sql(parsed: turns.ParsedTurn) -> str | None:
    """The SQL of a read turn's first ``submit_sql`` call with a string ``sql``, else None."""
    for call in parsed.calls:
        if call.tool == "submit_sql" and isinstance(call.args, dict) and isinstance(call.args.get("sql"), str):
            return call.args["sql"]
    return None
