"""`python -m t2s bench report`: the eval artifacts at the size of a full BIRD dev run.

A synthetic eval folder as large as BIRD dev played in both modes: 1,534 questions × 2 modes = 3,068 episodes of 6
turns, each at least 14 KB of text (thinking, calls, tool results up to the row cap, the gold and predicted row
previews), seeded. Then it measures:

- ``write_s``: the time to write ``report.html`` (``t2s.evaluation.report_html.write_report``), and ``size_mb``;
- ``list_s``: the time until headless Chromium has parsed the page and laid out the episode list, read from the
  page's own clock (``performance.now()`` from navigation start, written into ``#status`` as ``data-list-ms``);
- ``open_s``: the time to open one transcript (``#open=N``; ``data-open-ms``);
- ``show RUN --wrong`` and ``compare RUN/full RUN/withheld`` on that folder, as subprocesses.

The last line is ``report: episodes=N episodes_mb=E write_s=W size_mb=M list_s=L open_s=O`` (E: the size of the
``episodes.jsonl`` files the report was built from; L and O are ``nan`` without Chromium). It exits 1 when a target
is missed: the list within 3 s, a transcript within 0.5 s, the page under 60 MB.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS = 1534  # BIRD dev
MODES = ("full", "withheld")
TURNS = 6
MIN_EPISODE_BYTES = 14_000  # measured: eight 7-turn demo episodes made a 114 KB report.html
TARGETS = {"list_s": 3.0, "open_s": 0.5, "size_mb": 60.0}
WORDS = ("the", "table", "column", "join", "on", "member", "club", "ride", "count", "distinct", "where", "group", "by",
         "order", "name", "date", "between", "league", "player", "school", "molecule", "atom", "bond", "account",
         "district", "loan", "client", "race", "driver", "circuit", "card", "set", "rating", "post", "user", "badge")
TABLES = ("members", "clubs", "rides", "routes", "bikes", "payments", "schools", "satscores", "frpm", "account")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _sql(rng: random.Random) -> str:
    a, b = rng.sample(TABLES, 2)
    return (f"SELECT T1.{rng.choice(WORDS)}_id, COUNT(DISTINCT T2.{rng.choice(WORDS)}) FROM {a} AS T1 INNER JOIN {b} "
            f"AS T2 ON T1.id = T2.{a}_id WHERE T2.{rng.choice(WORDS)} = '{_words(rng, 2)}' AND T1.year BETWEEN "
            f"{rng.randint(1990, 2010)} AND {rng.randint(2011, 2024)} GROUP BY T1.{rng.choice(WORDS)} ORDER BY 2 DESC "
            f"LIMIT {rng.randint(1, 20)}")


def _rows(rng: random.Random, count: int, cell_words: int = 12) -> list[list]:
    return [[rng.randint(1, 99999), _words(rng, rng.randint(3, cell_words)), round(rng.random() * 1000, 3), None if
             rng.random() < 0.1 else f"{rng.randint(1990, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"]
            for _ in range(count)]


def _table(rng: random.Random, rows: int, cell_words: int) -> str:
    body = "\n".join(" | ".join("NULL" if v is None else str(v) for v in row) for row in _rows(rng, rows, cell_words))
    return f"id | name | value | date\n{body}"


def _observation(rng: random.Random, tool: str, sql: str) -> str:
    """A tool result as the environment writes it, up to the row cap and OBSERVATION_CHAR_CAP."""
    from t2s.env.protocol import OBSERVATION_CHAR_CAP
    from t2s.env.tools import QUERY_ROWS, SAMPLE_LIMIT

    if tool == "list_tables":
        text = "[list_tables]\n" + "\n".join(TABLES)
    elif tool == "describe_table":
        text = f"[describe_table {rng.choice(TABLES)}]\n" + "\n".join(
            f"{rng.choice(WORDS)}_{n} {rng.choice(('INTEGER', 'TEXT', 'REAL'))}: {_words(rng, rng.randint(6, 14))}"
            for n in range(rng.randint(12, 22)))
    elif tool == "sample_rows":
        text = f"[sample_rows {rng.choice(TABLES)}]\n" + _table(rng, SAMPLE_LIMIT[1], 10)
    else:
        text = f"[run_query {sql[:60]}…]\n" + _table(rng, QUERY_ROWS, 30) + "\n(more rows not shown)"
    return text[:OBSERVATION_CHAR_CAP]


def _tools(turns: int) -> list[str]:
    middle = ["describe_table", "sample_rows", "run_query", "run_query", "describe_table", "run_query"]
    return (["list_tables"] + [middle[n % len(middle)] for n in range(turns - 2)] + ["submit_sql"])[-turns:]


def synthetic_line(rng: random.Random, question_id: int, mode: str, turns: int = TURNS) -> dict:
    """One eval line (``t2s.evaluation.records.eval_line``'s keys) of ``turns`` turns, at least 14 KB as JSON."""
    gold_sql = _sql(rng)
    played = []
    for tool in _tools(turns):
        sql = gold_sql if tool in ("submit_sql", "run_query") and rng.random() < 0.3 else _sql(rng)
        args = {"sql": sql} if tool in ("run_query", "submit_sql") else (
            {} if tool == "list_tables" else {"table": rng.choice(TABLES)})
        call = {"tool": tool, "args": args}
        played.append({"assistant": f"{_words(rng, rng.randint(60, 110))}\n</think>\n\n{json.dumps(call)}",
                       "calls": [call], "observation": "" if tool == "submit_sql" else _observation(rng, tool, sql)})
    official = int(rng.random() < 0.6)
    final_sql = gold_sql if official else _sql(rng)
    preview = lambda: {"columns": ["id", "name", "value", "date"], "rows": _rows(rng, 10), "more": True,  # noqa: E731
                       "error": None}
    counters = {"turns": turns, "calls": turns, "tool_errors": 0, "format_deviations": 0, "write_attempts": 0,
                "turn_cutoffs": 0, "submitted": True, "forced": False, "fallback_used": False, "truncated": False}
    line = {"question_id": question_id, "db_id": TABLES[question_id % len(TABLES)], "mode": mode, "turns": played,
            "final_sql": final_sql, "final_sql_source": "submitted", "submitted_sql": final_sql, "counters": counters,
            "stop_reason": "submitted", "prompt_tokens": 900 + 40 * len(TABLES),
            "question": f"What is the {_words(rng, 14)}?", "evidence": _words(rng, 20), "gold_sql": gold_sql,
            "gold_result": preview(), "pred_result": preview(), "sample": 0,
            "difficulty": ("simple", "moderate", "challenging")[question_id % 3], "official": official,
            "strict": official, "soft_f1": float(official) if official else round(rng.random() * 0.5, 3),
            "executes": True, "error": None}
    while len(json.dumps(line, ensure_ascii=False).encode()) < MIN_EPISODE_BYTES:  # think longer, as a model would
        first = played[0]
        first["assistant"] = f"{_words(rng, 40)} {first['assistant']}"
    return line


def build_folder(folder: Path, questions: int, turns: int, seed: int) -> tuple[int, int]:
    """The synthetic eval folder (every file an eval writes but report.html); returns (episodes, episode bytes)."""
    from t2s.evaluation.records import score_line
    from t2s.evaluation.report import plot_summaries, summarise
    from t2s.evaluation.run_folders import EPISODES, SCORES, SUMMARY, write_jsonl

    rng = random.Random(seed)
    summaries, count, size = {}, 0, 0
    for mode in MODES:
        (folder / mode).mkdir(parents=True, exist_ok=True)
        lines = [synthetic_line(rng, question, mode, turns) for question in range(questions)]
        write_jsonl(folder / mode / EPISODES, lines)
        write_jsonl(folder / mode / SCORES, [score_line(line) for line in lines])
        config = {"policy": "predictions", "predictions": "synthetic", "mode": mode, "k": 1, "seed": seed,
                  "n": questions}
        (folder / mode / "eval_config.json").write_text(json.dumps(config), encoding="utf-8")
        summaries[mode] = summarise(lines, config=config)
        count += len(lines)
        size += (folder / mode / EPISODES).stat().st_size
    (folder / SUMMARY).write_text(json.dumps({"modes": summaries}, indent=2) + "\n", encoding="utf-8")
    plot_summaries(summaries, folder / "summary.png")
    return count, size


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium_run(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="t2s-chromium-") as profile:
        return subprocess.run([chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                               f"--user-data-dir={profile}", "--window-size=1400,1000", *args],
                              capture_output=True, text=True, timeout=600)


def page_clock(url: str, key: str) -> tuple[float, dict]:
    """Seconds the page's own clock wrote into ``#status`` as ``data-<key>`` in headless Chromium, and the status."""
    done = _chromium_run("--dump-dom", url)  # the dump itself, of a 40 MB DOM, takes longer than the page
    tag = re.search(r'<div id="status"[^>]*>', done.stdout)
    status = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag.group(0))) if tag else {}
    if key not in status:
        raise RuntimeError(f"Error: Chromium did not report {key} for {url}: {done.stderr.strip()[-400:]}")
    return float(status[key]) / 1000, status


def screenshot_seconds(page: Path) -> float:
    """A cross-check from outside the page: the wall time of a screenshot of ``page`` (loaded, laid out, painted) less
    that of an empty page (Chromium's own start)."""
    with tempfile.TemporaryDirectory(prefix="t2s-shot-") as folder:
        empty = Path(folder) / "empty.html"
        empty.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
        times = []
        for url in (empty.as_uri(), page.as_uri()):
            started = time.perf_counter()
            _chromium_run(f"--screenshot={Path(folder) / 'shot.png'}", url)
            times.append(time.perf_counter() - started)
    return times[1] - times[0]


def timed(*args: str) -> tuple[float, int]:
    """Wall seconds and exit status of ``python -m t2s ARGS``, its output discarded."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "t2s", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=1800)
    return time.perf_counter() - started, done.returncode


def run(*, questions=QUESTIONS, turns=TURNS, seed=0, output=None) -> int:
    from rich.table import Table

    from t2s.evaluation.report_html import write_report
    from t2s.ui import console as consoles

    console = consoles.console(stderr=True)
    folder = Path(output) if output else Path(tempfile.mkdtemp(prefix="t2s-bench-report-"))
    try:
        if folder.exists() and any(folder.iterdir()):
            consoles.print_line(f"Error: --output {folder} is not empty", stderr=True)
            return 2
        console.print(f"building {questions} questions × {len(MODES)} modes of {turns} turns in {folder}",
                      highlight=False)
        episodes, episode_bytes = build_folder(folder, questions, turns, seed)
        started = time.perf_counter()
        page = write_report(folder)
        write_s = time.perf_counter() - started
        size_mb = page.stat().st_size / 1e6
        list_s = open_s = shot_s = float("nan")
        status: dict = {}
        if chromium():
            list_s, status = page_clock(page.as_uri(), "list-ms")
            open_s, _ = page_clock(f"{page.as_uri()}#open={episodes // 2}", "open-ms")
            shot_s = screenshot_seconds(page)
        else:
            print("Chromium is not installed (Debian: apt-get install chromium): list_s and open_s not measured")
        show_s, show_rc = timed("show", str(folder), "--wrong")
        compare_s, compare_rc = timed("compare", str(folder / MODES[0]), str(folder / MODES[1]))
        table = Table(title=f"bench report: {episodes} episodes of {turns} turns")
        for column in ("figure", "value", "target"):
            table.add_column(column)
        rows = [("episodes.jsonl", f"{episode_bytes / 1e6:.1f} MB ({episode_bytes / episodes / 1e3:.1f} KB an episode)",
                 f"≥ {MIN_EPISODE_BYTES / 1e3:.0f} KB an episode"),
                ("write report.html", f"{write_s:.2f} s", ""), ("report.html", f"{size_mb:.1f} MB", "< 60 MB"),
                ("Chromium: episode list", f"{list_s:.2f} s ({status.get('shown', '?')} rows)", "≤ 3 s"),
                ("Chromium: a screenshot, start-up subtracted", f"{shot_s:.2f} s", ""),
                ("Chromium: open a transcript", f"{open_s:.3f} s", "≤ 0.5 s"),
                ("show RUN --wrong", f"{show_s:.2f} s (exit {show_rc})", ""),
                ("compare RUN/full RUN/withheld", f"{compare_s:.2f} s (exit {compare_rc})", "")]
        for row in rows:
            table.add_row(*row)
        consoles.print_table(console, table)
        missed = [f"{key} {value:.3f} (target {TARGETS[key]:g})" for key, value in
                  (("list_s", list_s), ("open_s", open_s), ("size_mb", size_mb)) if value > TARGETS[key]]
        if episode_bytes / episodes < MIN_EPISODE_BYTES:
            missed.append(f"episodes of {episode_bytes / episodes:.0f} bytes (at least {MIN_EPISODE_BYTES})")
        if show_rc or compare_rc:
            missed.append(f"show exited {show_rc}, compare exited {compare_rc}")
        if chromium() and status.get("total") != str(episodes):
            missed.append(f"the page lists {status.get('total')} episodes, not {episodes}")
        for line in missed:
            print(f"target missed: {line}")
        print(f"report: episodes={episodes} episodes_mb={episode_bytes / 1e6:.1f} write_s={write_s:.2f} "
              f"size_mb={size_mb:.1f} list_s={list_s:.2f} open_s={open_s:.3f}")
        return 1 if missed else 0
    finally:
        if not output:
            shutil.rmtree(folder, ignore_errors=True)
