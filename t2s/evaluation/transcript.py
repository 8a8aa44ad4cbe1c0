"""One episode, readably, in a terminal: the question, each turn's thinking (folded unless asked for), tool calls and
observations, the final SQL formatted with sqlparse, the counters and scores, and the gold and predicted rows.

Used by ``ask`` (as the episode happens) and ``show`` (from an eval folder or a training run's logged episodes). Every
text of the record is untrusted: it goes through ``t2s.ui.console.safe_text`` (controls and bidi characters shown as
escapes) and is never read as markup.
"""

from __future__ import annotations

import json

FOLDED_THINKING_CHARS = 160


def format_sql(sql: str | None) -> str:
    """``sql`` re-indented with upper-case keywords (sqlparse); the text as it is when it cannot be formatted."""
    if not isinstance(sql, str) or not sql.strip():
        return "" if sql is None else str(sql)
    import sqlparse

    try:
        return sqlparse.format(sql, reindent=True, keyword_case="upper").strip()
    except Exception:  # noqa: BLE001 - sqlparse refuses some inputs (too many tokens): show them unformatted
        return sql.strip()


def _call_text(call) -> str:
    if not isinstance(call, dict):  # not a call as episodes write them: shown as it is
        return json.dumps(call, ensure_ascii=False, default=str)
    args = call.get("args")
    if isinstance(args, dict) and isinstance(args.get("sql"), str):
        rest = {k: v for k, v in args.items() if k != "sql"}
        extra = f" {json.dumps(rest, ensure_ascii=False)}" if rest else ""
        return f"{call.get('tool')}{extra}:\n{format_sql(args['sql'])}"
    return f"{call.get('tool')} {json.dumps(args, ensure_ascii=False)}"


def _thinking_text(thinking: str, fold: bool) -> str:
    thinking = thinking.strip()
    if not fold or len(thinking) <= FOLDED_THINKING_CHARS:
        return thinking
    return f"{thinking[:FOLDED_THINKING_CHARS]}… [{len(thinking)} characters of thinking folded; --thinking shows them]"


def result_table(title: str, preview: dict | None):
    """A rich Table of a result preview (``records.result_preview``), or a Text saying why there is none."""
    from rich.table import Table
    from rich.text import Text

    from t2s.ui.console import untrusted

    if preview is None:
        return Text(f"{title}: not run", style="dim")
    if preview.get("error"):
        return untrusted(f"{title}: {preview['error']}", style="red")
    table = Table(title=title)
    for column in preview.get("columns") or ["(no columns)"]:
        table.add_column(untrusted(column))
    for row in preview.get("rows") or []:  # database text as written, escaped, never read as markup
        table.add_row(*[untrusted("NULL" if v is None else v) for v in row])
    if preview.get("more"):
        table.caption = "more rows not shown"
    return table


def print_heading(record: dict, console) -> None:
    """The episode's heading: question id, database, mode (difficulty, sample), then the question and its evidence."""
    from rich.text import Text

    from t2s.ui.console import safe_text, untrusted

    head = Text()
    head.append(safe_text(f"question {record.get('question_id')}"), style="bold")
    head.append(safe_text(f"  db {record.get('db_id')}  mode {record.get('mode')}"))
    if record.get("difficulty"):
        head.append(safe_text(f"  {record['difficulty']}"))
    if record.get("sample"):
        head.append(safe_text(f"  sample {record['sample']}"))
    console.print(head)
    if record.get("question"):
        console.print(untrusted(record["question"]))
    if record.get("evidence"):
        console.print(untrusted(f"evidence: {record['evidence']}", style="dim"))


def print_transcript(record: dict, console, *, fold_thinking: bool = True, heading: bool = True) -> None:
    """Print an episode record (an eval line, a training episode or an ``ask`` record) on ``console``; ``heading``
    False leaves out the heading (``print_heading``, printed before the episode ran)."""
    from rich.text import Text

    from t2s.env.turns import split_thinking
    from t2s.ui.console import print_table, safe_text, untrusted

    if heading:
        print_heading(record, console)
    for number, turn in enumerate(record.get("turns") or [], 1):
        thinking, body, _ = split_thinking(turn.get("assistant") or "")
        parts = Text()
        if thinking:
            parts.append(safe_text(_thinking_text(thinking, fold_thinking)) + "\n", style="dim italic")
        if turn.get("calls"):
            for call in turn["calls"]:
                parts.append(safe_text(_call_text(call)) + "\n", style="bold cyan")
        elif body.strip():
            parts.append(safe_text(body.strip()) + "\n")
        if not parts:
            parts.append("(empty turn)", style="dim")
        if turn.get("observation"):
            parts.append("\n" + safe_text(turn["observation"]), style="green")
        console.rule(f"turn {number}", align="left")
        console.print(parts)
    console.rule("result", align="left")
    final = untrusted(f"final SQL ({record.get('final_sql_source')}):\n", style="bold")
    final.append(safe_text(format_sql(record.get("final_sql")) or "none"),
                 style="bold" if record.get("final_sql") else "red")
    console.print(final)
    if record.get("gold_sql"):
        console.print(Text("gold SQL:\n", style="bold").append(safe_text(format_sql(record["gold_sql"]))))
    counters = record.get("counters") or {}
    console.print(" ".join(f"{key}={value}" for key, value in counters.items()), style="dim", highlight=False)
    scores = [f"{key}={record[key]}" for key in ("official", "strict", "soft_f1", "reward", "tier", "f1", "join",
                                                 "consensus") if record.get(key) is not None]
    if scores:
        console.print(" ".join(scores), style="bold", highlight=False)
    if record.get("error"):
        console.print(untrusted(record["error"], style="red"))
    for title, key in (("gold rows", "gold_result"), ("predicted rows", "pred_result")):
        if key in record:
            table = result_table(title, record[key])
            if hasattr(table, "columns"):
                print_table(console, table)
            else:
                console.print(table)
