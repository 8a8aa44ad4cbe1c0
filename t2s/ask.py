"""`python -m t2s ask --db FILE.sqlite QUESTION`: one agentic episode against any SQLite file, read-only.

The policy comes from the command line. ``--replay TURNS.jsonl`` plays recorded assistant turns (DESIGN §10); other
policies (a model, an endpoint) plug in through ``POLICIES``: each entry takes the parsed arguments, the row and
the episode config, and returns the episode record. The user's file opens ``mode=ro`` (never ``immutable``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

RESULT_ROWS = 20  # rows of the final SQL's result shown in the readable view


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--db", required=True, help="the SQLite file to ask (opened read-only)")
    parser.add_argument("--replay", metavar="TURNS.jsonl", help="play recorded assistant turns: one JSON string a line")
    parser.add_argument("--mode", choices=("full", "withheld"), default="full",
                        help="full: the prompt shows the schema; withheld: the model discovers it with tools")
    parser.add_argument("--evidence", default="", help="a hint, as BIRD's evidence field")
    parser.add_argument("--max-turns", type=int, default=None, help="tool turns before the forced final turn (6)")
    parser.add_argument("--system-prompt-file", default=None, help="replace the system prompt with this file's text")
    parser.add_argument("--json", action="store_true", help="print the episode record as one JSON object")


def _replay_policy(args, row: dict, config, db) -> dict:
    from t2s.backends.scripted import ReplayPolicy
    from t2s.episode import run_text_episode

    return run_text_episode(row, config, ReplayPolicy.from_file(args.replay), db=db)


# name -> (is it chosen by these args?, play it). The evaluation commands add model and endpoint policies here.
POLICIES: dict[str, tuple[Callable, Callable]] = {
    "replay": (lambda args: bool(getattr(args, "replay", None)), _replay_policy),
}


def ask_row(question: str, evidence: str, db) -> dict:
    """A data row for a free-form question (no gold SQL)."""
    return {
        "question_id": "ask",
        "question": question,
        "evidence": evidence or "",
        "gold_sql": None,
        "db_id": db.db_id,
        "db_path": db.path,
        "schema_id": None,
        "difficulty": None,
        "source": "ask",
    }


def _fail(message: str) -> int:
    print(message if message.startswith("Error:") else f"Error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from t2s import databases
    from t2s.episode import EpisodeConfig

    path = Path(args.db).expanduser()
    if not path.is_file():
        return _fail(f"Error: database file not found: {args.db}")
    db = databases.user_db(path)
    try:
        databases.tool_connection(db).execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except Exception as exc:  # not a database, unreadable, ...
        return _fail(f"Error: cannot open {args.db} as a SQLite database: {exc}")
    if not str(args.question).strip():
        return _fail("Error: the question is empty")
    chosen = [name for name, (wanted, _) in POLICIES.items() if wanted(args)]
    if not chosen:
        return _fail("Error: choose a policy: --replay TURNS.jsonl" + "".join(
            f" or --{name}" for name in POLICIES if name != "replay"))
    if len(chosen) > 1:
        return _fail(f"Error: choose one policy, got {', '.join(chosen)}")
    config = EpisodeConfig(mode=args.mode, system_prompt_file=args.system_prompt_file)
    if args.max_turns is not None:
        if args.max_turns < 1:
            return _fail("Error: --max-turns must be at least 1")
        config.max_turns = args.max_turns
    row = ask_row(args.question, args.evidence, db)
    try:
        record = POLICIES[chosen[0]][1](args, row, config, db)
    except ValueError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(record, ensure_ascii=False))
    else:
        show_trajectory(record, db)
    return 0


def show_trajectory(record: dict, db, console=None) -> None:
    """The episode, readably: each turn's thinking, calls and observation, then the final SQL and its result."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from t2s import databases
    from t2s.protocol import split_thinking

    console = console or Console()
    for number, turn in enumerate(record["turns"], 1):
        thinking, body, _ = split_thinking(turn["assistant"])
        parts = Text()
        if thinking:
            parts.append(thinking.strip() + "\n", style="dim italic")
        if turn["calls"]:
            for call in turn["calls"]:
                parts.append(json.dumps(call, ensure_ascii=False) + "\n", style="bold cyan")
        elif body.strip():
            parts.append(body.strip() + "\n")
        if not parts:
            parts.append("(empty turn)", style="dim")
        if turn["observation"]:
            parts.append("\n" + turn["observation"], style="green")
        console.print(Panel(parts, title=f"turn {number}", title_align="left"))
    counters = record["counters"]
    final = Text(f"final SQL ({record['final_sql_source']}): ", style="bold")
    final.append(record["final_sql"] or "none", style="bold" if record["final_sql"] else "red")
    console.print(final)
    console.print(
        " ".join(f"{key}={value}" for key, value in counters.items()), style="dim", highlight=False
    )
    if not record["final_sql"]:
        return
    result = databases.run_tool_query(db, record["final_sql"], max_rows=RESULT_ROWS)
    if not result.ok:
        console.print(Text(str(result.error), style="red"))
        return
    table = Table(*[str(c) for c in result.columns], title="result")
    for row in result.rows:
        table.add_row(*["None" if v is None else str(v) for v in row])
    console.print(table)
    if result.more:
        console.print(f"... (showing first {RESULT_ROWS} rows; more rows exist)", style="dim")
