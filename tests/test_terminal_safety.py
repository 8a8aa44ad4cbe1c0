"""Untrusted text (model output, database cells, questions, evidence, SQL, paths) never drives the terminal.

Every printer is fed random text full of control characters, escape sequences, bidi characters and rich markup, with
the terminal forced on and off: no raw C0 (other than newline and tab), ESC, DEL, C1 or bidi control reaches the
output bytes (rich's own colour codes aside), no markup is read (no OSC 8 link), and the offending characters show as
escapes. Ordinary text (letters of any script, CJK, emoji, SQL with brackets, markup-looking text) prints unchanged.
The forbidden set and the escape form are written out here again, not imported, so that the test checks the console
layer rather than repeating it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: rich's own styling when the terminal is on: SGR sequences only
SGR = re.compile("\x1b\\[[0-9;]*m")
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HOSTILE_PIECES = [
    "\x1b]0;pwned\x07", "\x1b[2J", "\x1b]8;;https://evil.example/x\x1b\\click\x1b]8;;\x1b\\", "\x9b31m", "\x9d",
    "[link=https://evil.example/x]click me[/link]", "[bold red]x[/]", ":smile:", "\r", "\x08", "\x7f", "\x00",
    "\u202e", "\u2066", "\u200f", "\u061c", "SELECT [a] FROM t", "\\x1b",
]
ORDINARY_PIECES = ["SELECT name FROM \"t\" WHERE a[1] = 'x'", "[link=https://evil.example/x]click me[/link]",
                   "[bold]not bold[/bold]", "東京都の人口", "Ünïcödé", "👩‍💻🎉", "مرحبا", ":smile:", "x := [1, 2]"]

hostile_text = st.lists(
    st.one_of(st.sampled_from(HOSTILE_PIECES), st.characters(codec="utf-8", exclude_categories=("Cs",)),
              st.sampled_from([chr(c) for c in range(0x00, 0x20)] + [chr(c) for c in range(0x7f, 0xa0)] + list(BIDI))),
    min_size=1, max_size=25,
).map("".join)
ordinary_text = st.lists(
    st.one_of(st.sampled_from(ORDINARY_PIECES),
              st.characters(categories=("L", "N", "P", "S"), exclude_characters="\u00ad")),
    min_size=1, max_size=20,
).map(lambda parts: " ".join(parts).strip()).filter(bool)


def escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


@contextlib.contextmanager
def terminal(on: bool):
    """stdout and stderr captured; rich's consoles made inside believe they are (on) or are not (off) a terminal."""
    saved = {key: os.environ.get(key) for key in ("TTY_COMPATIBLE", "COLORTERM", "FORCE_COLOR", "NO_COLOR")}
    os.environ.update(TTY_COMPATIBLE="1" if on else "0", COLORTERM="truecolor")
    os.environ.pop("FORCE_COLOR", None)
    os.environ.pop("NO_COLOR", None)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield lambda: out.getvalue() + err.getvalue()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def record(text: str) -> dict:
    sql = f"SELECT '{text}' FROM t"
    preview = {"columns": [text, "n"], "rows": [[text, 1], [None, 2]], "more": True}
    return {
        "question_id": text, "db_id": text, "mode": "full", "difficulty": text, "sample": 1, "question": text,
        "evidence": text, "final_sql": sql, "final_sql_source": text, "gold_sql": sql, "error": text,
        "turns": [{"assistant": f"{text}</think>{{\"tool\": \"run_query\", \"args\": {{\"sql\": {json.dumps(sql)}}}}}",
                   "calls": [{"tool": "run_query", "args": {"sql": sql, "limit": text}}], "observation": text},
                  {"assistant": f"<think>{text}</think>{text}", "calls": [], "observation": ""}],
        "counters": {"turns": 2, "note": text}, "official": 0, "gold_result": preview,
        "pred_result": {"error": f"Error: {text}"},
    }


# every printer of untrusted text, fed ``text``; the ones marked True print ``text`` whole, where it must be visible
def _transcript(text):
    from t2s.evaluation.transcript import print_transcript
    from t2s.ui.console import console

    print_transcript(record(text), console(), fold_thinking=False)


def _show_list(text):
    from t2s.evaluation.browse import print_list, print_pairs
    from t2s.ui.console import console

    line = {"question_id": text, "db_id": text, "mode": "full", "difficulty": text, "official": 0,
            "question": text, "final_sql_source": text, "counters": {"turns": 1}}
    print_list(console(), [line, line], f"{text} episodes")
    print_pairs(console(), [("only_b", line, {**line, "official": 1})], f"flipped: {text}")


def _ask_live(text):
    from t2s.commands import ask
    from t2s.ui.console import console

    out = console()
    ask._show_turn(out, f"{text}</think>{text}")
    ask._show_turn(out, f"{text}</think>{{\"tool\": \"run_query\", \"args\": {{\"sql\": {json.dumps(text)}}}}}")
    ask._show_turn(out, f"{text}</think><tool_call>\n<function=run_query>\n<parameter=sql>\n{text}\n"
                        f"</parameter>\n</function>\n</tool_call>", "native")
    ask._show_observation(out, f"[run_query]\n{text}")


def _ask_json(text):
    from t2s.ui.console import safe_json

    value = record(text)
    printed = safe_json(value)
    assert json.loads(printed) == value  # valid JSON that reads back as the record
    print(printed)


def _eval_summary(text):
    from t2s.evaluation.report import print_summaries

    summary = {"n": 3, "execution_accuracy_official": 0.5, "skipped_missing_dbs": 1, "missing_db_ids": [text],
               "config": {"model": text, "policy": "model", "sampling": {"temperature": 0.0}}}
    print_summaries({text: summary, "withheld": summary})


def _data_check(text):
    from t2s.data import hygiene
    from t2s.ui.console import console, print_table

    counts = {name: 1 for name in hygiene.OUTCOMES}
    print_table(console(), hygiene.summary_table({"per_db": {text: counts}, "overall": counts},
                                                 title=f"gold SQL check: {text}"))


def _train_steps(text):
    from t2s.training.progress import STEP_COLUMNS, step_printer
    from t2s.ui.console import console, print_table

    class State:
        global_step, max_steps = 1, 2

    out = console()
    printer = step_printer(out)
    printer.on_log(None, State(), None, logs={key: 0.5 for key, _, _ in STEP_COLUMNS})
    print_table(out, printer.table())
    out.print(f"trained 1 steps; model in {text}", highlight=False)  # the demo's closing line names a path


def _error_lines(text):
    from t2s.errors import error_line
    from t2s.ui.console import console, print_line

    print_line(error_line(ValueError(f"cannot run {text}")), stderr=True)
    console(stderr=True).print(error_line(OSError(2, "No such file or directory", text)), style="red")


def _log_warning(text):
    import logging

    from t2s.ui.console import escape_log_records

    escape_log_records()  # as python -m t2s does before a command runs
    logger = logging.getLogger("t2s.tests.terminal")
    logger.propagate = False
    handler = logging.StreamHandler()  # the stderr of this moment, as a command's handler writes to
    logger.addHandler(handler)
    try:
        logger.warning("skipped %s: its database is missing", text)
    finally:
        logger.removeHandler(handler)


def _usage_error(text):
    from t2s.ui.args import CommandParser

    with pytest.raises(SystemExit):
        CommandParser(prog="t2s show").error(f"argument RUN: {text}")


PRINTERS = {"transcript": (_transcript, True), "show list": (_show_list, True), "ask live": (_ask_live, False),
            "ask --json": (_ask_json, False), "eval summary": (_eval_summary, True),
            "data check": (_data_check, True), "train and demo": (_train_steps, True),
            "error lines": (_error_lines, False), "usage error": (_usage_error, False),
            "log warning": (_log_warning, True)}


def _printed(printer, text: str, on: bool) -> str:
    with terminal(on) as captured:
        printer(text)
    out = captured()
    if not on:
        assert "\x1b" not in out, "a colour code with the terminal off"
    return SGR.sub("", out)


@pytest.mark.parametrize("name", list(PRINTERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=hostile_text, on=st.booleans())
def test_nothing_unsafe_reaches_the_terminal(name, text, on):
    printer, whole = PRINTERS[name]
    out = _printed(printer, text, on)
    unsafe = FORBIDDEN.findall(out)
    assert not unsafe, f"{name} printed {unsafe!r} raw"
    assert "\x1b" not in out and "\x1b]8;" not in out and "\x9d8;" not in out  # no escape sequence, no OSC 8 link
    if whole:  # each offending character shows as its escape
        for char in set(FORBIDDEN.findall(text)):
            assert escaped(char) in out, f"{name}: {char!r} is not visible as {escaped(char)}"
    if "[link=https://evil.example/x]click me[/link]" in text and whole:
        assert "[link=https://evil.example/x]click me[/link]" in out  # brackets print as brackets


@pytest.mark.parametrize("name", list(PRINTERS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=ordinary_text, on=st.booleans())
def test_ordinary_text_prints_unchanged(name, text, on):
    printer, _ = PRINTERS[name]
    out = _printed(printer, text, on)
    expected = json.dumps(text, ensure_ascii=False)[1:-1] if name == "ask --json" else text  # JSON: as JSON writes it
    assert expected in out, f"{name} changed {text!r}"


def test_the_escapes_are_python_style_and_json_stays_json():
    from t2s.ui.console import safe_json, safe_text

    raw = "a\x1b]0;t\x07b\x9d\u202e\x7f\n\tc"
    assert safe_text(raw) == "a\\x1b]0;t\\x07b\\x9d\\u202e\\x7f\n\tc"
    assert safe_json({"v": raw}) == '{"v": "a\\u001b]0;t\\u0007b\\u009d\\u202e\\u007f\\n\\tc"}'
    assert json.loads(safe_json({"v": raw})) == {"v": raw}
    assert safe_text("東京 [bold]x[/bold] 👩‍💻") == "東京 [bold]x[/bold] 👩‍💻"


# ------------------------------------------------------------------------------------------------- on a real TTY
HOSTILE_CELL = "Ann \x1b]0;pwned-by-db\x07\x1b[2J\u202e evil"
HOSTILE_SQL = "SELECT '\x1b]0;pwned\x07\x1b[2J' AS x, '[link=https://evil.example/x]click me[/link]' AS y"
HOSTILE_QUESTION = "Who is \x1b[2J\u202eevil\u202c and \x9d0;t\x9c?"
LINK = "[link=https://evil.example/x]click me[/link]"


def on_a_pty(*args, timeout: float = 240.0) -> str:
    """``python -m t2s ARGS`` with stdin, stdout and stderr on a pseudo-terminal; everything it wrote, decoded."""
    import pty
    import selectors
    import subprocess
    import sys
    import time

    from t2s.settings import REPO_ROOT

    controller, device = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    env.update(TERM="xterm-256color", COLORTERM="truecolor", COLUMNS="160", LINES="50")
    process = subprocess.Popen([sys.executable, "-m", "t2s", *map(str, args)], stdin=device, stdout=device,
                               stderr=device, cwd=REPO_ROOT, env=env, close_fds=True)
    os.close(device)
    chunks, deadline = [], time.monotonic() + timeout
    selector = selectors.DefaultSelector()  # epoll: select() refuses descriptors past 1023, which a long run reaches
    selector.register(controller, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if selector.select(1.0):
                try:
                    data = os.read(controller, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
        selector.close()
        os.close(controller)
    raw = b"".join(chunks)
    assert process.returncode == 0, raw.decode("utf-8", "replace")
    return raw.decode("utf-8")


#: rich's own live-display controls (a progress bar): hide and show the cursor, go up a line, erase the line
LIVE = re.compile("\x1b\\[\\?25[lh]|\r?\x1b\\[2K|\x1b\\[[0-9]*A")


def assert_safe_on_a_tty(out: str, *visible: str) -> None:
    plain = SGR.sub("", out)
    leftover = sorted(set(FORBIDDEN.findall(LIVE.sub("", plain).replace("\r\n", "\n"))))
    assert not leftover, f"raw {leftover!r} on the terminal"
    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x1b]8;" not in out  # no title, no clear, no link
    for piece in visible:
        assert piece in plain, f"{piece!r} is not shown"


def test_show_of_a_hostile_prediction_on_a_tty(tmp_path):
    line = record("x")
    line.update(question_id="q1", db_id="shop", question=HOSTILE_QUESTION, final_sql=HOSTILE_SQL,
                final_sql_source="submitted", error=None, evidence=HOSTILE_CELL,
                turns=[{"assistant": f"Look.</think>{json.dumps({'tool': 'run_query', 'args': {'sql': HOSTILE_SQL}})}",
                        "calls": [{"tool": "run_query", "args": {"sql": HOSTILE_SQL}}],
                        "observation": f"[run_query]\nx | y\n{HOSTILE_CELL} | {LINK}"}],
                pred_result={"columns": ["x", "y"], "rows": [[HOSTILE_CELL, LINK]], "more": False})
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(line) + "\n" + json.dumps({**line, "question_id": "q2"}) + "\n")
    transcript = on_a_pty("show", episodes, "--id", "q1")
    assert_safe_on_a_tty(transcript, "\\x1b]0;pwned\\x07\\x1b[2J", "\\u202eevil\\u202c", "\\x9d0;t\\x9c",
                         "\\x1b]0;pwned-by-db\\x07", LINK)
    listing = on_a_pty("show", episodes)
    assert_safe_on_a_tty(listing, "q1", "q2")


def test_ask_on_a_hostile_database_on_a_tty(tmp_path):
    import sqlite3

    path = tmp_path / "people.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.executemany("INSERT INTO people VALUES (?)", [(HOSTILE_CELL,), ("Bob",)])
    conn.commit()
    conn.close()
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(json.dumps(t) + "\n" for t in [
        'Look.</think>{"tool": "run_query", "args": {"sql": "SELECT name FROM people"}}',
        '</think>{"tool": "submit_sql", "args": {"sql": "SELECT name FROM people"}}',
    ]))
    out = on_a_pty("ask", "--db", path, "--replay", turns, HOSTILE_QUESTION)
    plain = SGR.sub("", out)
    # the cell, then the question
    assert_safe_on_a_tty(out, "\\x1b]0;pwned-by-db\\x07\\x1b[2J\\u202e evil", "\\x1b[2J\\u202eevil\\u202c")
    assert plain.count("\\x1b]0;pwned-by-db") >= 2  # in the tool result and in the predicted rows
    printed = on_a_pty("ask", "--db", path, "--replay", turns, "--json", HOSTILE_QUESTION)
    assert_safe_on_a_tty(printed, "\\u001b]0;pwned-by-db\\u0007\\u001b[2J\\u202e evil")
    value = json.loads(printed.replace("\r\n", "\n"))  # the terminal's line discipline writes CR LF
    assert HOSTILE_CELL in value["turns"][0]["observation"]  # the JSON reads back as the cell held it
    assert value["question"] == HOSTILE_QUESTION


def test_eval_compare_and_show_of_a_hostile_run_on_a_tty(demo_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dev_databases").symlink_to(demo_dir / "dev_databases")
    rows = json.loads((demo_dir / "dev.json").read_text())[:4]
    rows[0]["question"] = HOSTILE_QUESTION
    (data / "dev.json").write_text(json.dumps(rows))
    predictions = tmp_path / "p.jsonl"
    predictions.write_text("\n".join(json.dumps({"question_id": r["question_id"],
                                                 "sql": HOSTILE_SQL if r is rows[0] else r["SQL"]}) for r in rows))
    gold = on_a_pty("eval", "--policy", "gold", "--data", data, "--output", tmp_path / "gold")
    assert_safe_on_a_tty(gold, "t2s eval")
    hostile = on_a_pty("eval", "--policy", "predictions", "--predictions", predictions, "--data", data,
                       "--output", tmp_path / "hostile")
    assert_safe_on_a_tty(hostile, "t2s eval")
    compared = on_a_pty("compare", tmp_path / "gold", tmp_path / "hostile")
    assert_safe_on_a_tty(compared, "only_a")
    wrong = on_a_pty("show", tmp_path / "hostile", "--wrong")
    assert_safe_on_a_tty(wrong, "\\x1b]0;pwned\\x07\\x1b[2J", "\\x1b[2J\\u202eevil", LINK)
