"""The project's terminal output: one console layer through which every printed line passes.

**Untrusted text is data.** Model output, database cells, questions, evidence, SQL and paths can hold anything. On a
terminal, a raw ESC starts a control sequence (set the window title, clear the screen, an OSC 8 hyperlink), and a
bidi override reverses the text after it. :func:`safe_text` shows each such character as a visible Python-style
escape (``\\x1b``, ``\\x9d``, ``\\u202e``): C0 controls other than newline and tab, DEL, C1 controls
(0x80-0x9F), the bidi overrides, isolates and marks (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C), and lone
surrogates (which a terminal's encoding cannot write). :func:`console` returns a rich console that never parses
rich markup or emoji codes (brackets print as brackets; our own styling is given as ``style=``), escapes every string
it renders, and escapes again, as a last guard, every text segment on its way out (so a ``Text`` built elsewhere
cannot slip a control through). :func:`safe_json` is JSON for stdout: the same characters as ``\\u001b`` and so on.
Plain ``print`` of untrusted text goes through :func:`safe_text` (or :func:`print_line`).

**Nothing is wrapped.** rich wraps at the terminal's width, and at 80 columns when stdout is not a terminal (CI,
pipes, logs), so a long path would break mid-name and could no longer be copied. Here printed lines are soft-wrapped
(the terminal folds them, rich adds no newline), and a table is laid out at its natural width, title included,
whatever the terminal's width.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import sys
import time

#: widest table laid out (a table wider than this is cut to it)
MAX_TABLE_WIDTH = 100_000

#: the characters never written raw to a terminal (see the module docstring)
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _python_escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_escape(match: re.Match) -> str:
    return f"\\u{ord(match.group()):04x}"


def safe_text(text) -> str:
    """``text`` (any object, as ``str``) with every unsafe character shown as a Python-style escape; ordinary text,
    newlines and tabs unchanged."""
    text = text if isinstance(text, str) else str(text)
    return UNSAFE.sub(_python_escape, text) if UNSAFE.search(text) else text


def untrusted(text, style: str = ""):
    """A rich ``Text`` of untrusted ``text``: escaped by :func:`safe_text`, never parsed as markup."""
    from rich.text import Text

    return Text(safe_text(text), style=style)


def safe_json(value, **dumps_options) -> str:
    """``json.dumps(value)`` (UTF-8 kept) with every unsafe character written as a ``\\uXXXX`` escape: valid JSON
    that reads back equal, and safe on a terminal."""
    text = json.dumps(value, ensure_ascii=False, **dumps_options)
    return UNSAFE.sub(_json_escape, text) if UNSAFE.search(text) else text


def escape_log_records() -> None:
    """Make every log message (a library's warning naming a path, a cell or a SQL) escaped by :func:`safe_text`,
    whichever handler writes it: the process's log records are made by a LogRecord whose message is escaped."""
    if logging.getLogRecordFactory() is logging.LogRecord:  # not over a library's own factory
        logging.setLogRecordFactory(EscapedLogRecord)


class EscapedLogRecord(logging.LogRecord):
    """A log record whose message is escaped by :func:`safe_text`."""

    def getMessage(self) -> str:
        return safe_text(super().getMessage())


def print_line(*parts, stderr: bool = False) -> None:
    """``print`` for lines that may quote untrusted text (an error naming a SQL or a path): escaped by
    :func:`safe_text`."""
    print(safe_text(" ".join(map(str, parts))), file=sys.stderr if stderr else sys.stdout)


#: the folder in which the processes of one launch (``t2s.training.launch`` sets it) mark the Error lines they print
LAUNCH_ERRORS_DIR = "T2S_LAUNCH_ERRORS"
#: how long a process waits for the one that marked a line first to say it printed it
ERROR_PRINTED_WAIT_S = 2.0


def print_error_once(line: str) -> None:
    """:func:`print_line` of an ``Error:`` line on stderr, once for the processes of one launch (a recipe or config
    error that every rank meets alike is one line, not one per rank). The first process to create the line's marker
    (named by its hash, created exclusively in the ``T2S_LAUNCH_ERRORS`` folder) prints it, then writes to the marker;
    another waits up to ``ERROR_PRINTED_WAIT_S`` for that write and prints nothing, or prints the line itself when the
    write never comes (the first was stopped before it could print). Outside a launch, or where the folder cannot be
    written, the line is printed."""
    folder = os.environ.get(LAUNCH_ERRORS_DIR)
    marker = os.path.join(folder, hashlib.sha256(line.encode("utf-8", "replace")).hexdigest()) if folder else None
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600) if marker else None
    except FileExistsError:
        deadline = time.monotonic() + ERROR_PRINTED_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if os.path.getsize(marker):
                    return
            time.sleep(0.01)
        fd = None
    except OSError:
        fd = None
    print_line(line, stderr=True)
    if fd is not None:
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(fd, b"printed\n")
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _console_class():
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        """A rich Console that escapes untrusted text and never reads markup (see the module docstring)."""

        def render_str(self, text, **options):
            options["markup"] = False
            options["emoji"] = False
            return super().render_str(safe_text(text), **options)

        def render(self, renderable, options=None):
            for segment in super().render(renderable, options):
                if segment.control:
                    yield segment  # rich's own cursor and screen controls
                    continue
                style = segment.style
                if style is not None and style.link:
                    style = style.update_link(None)
                text = segment.text
                if UNSAFE.search(text):
                    text = UNSAFE.sub(_python_escape, text)
                yield Segment(text, style) if text is not segment.text or style is not segment.style else segment

    return SafeConsole


def console(stderr: bool = False, **options):
    """A console for a command's output (stdout, or stderr for progress and warnings): soft-wrapping lines, escaping
    untrusted text, reading no markup. ``options`` go to rich's Console (``file``, ``force_terminal``, ``width``)."""
    options.setdefault("soft_wrap", True)
    return _console_class()(stderr=stderr, markup=False, emoji=False, **options)


def print_table(out, table) -> None:
    """Print ``table`` on the console ``out`` at its natural width: no cell or title is wrapped or cut."""
    from rich.measure import Measurement
    from rich.text import Text

    if table.title is not None:
        title = table.title if isinstance(table.title, Text) else out.render_str(str(table.title))
        table.min_width = max(table.min_width or 0, title.cell_len)
    natural = Measurement.get(out, out.options.update_width(MAX_TABLE_WIDTH), table).maximum
    width = out.width
    if natural <= width:
        out.print(table, soft_wrap=False)
        return
    out.width = natural
    try:
        out.print(table, soft_wrap=False)
    finally:
        out.width = width


def some(values, limit: int = 10) -> str:
    """The first ``limit`` of ``values`` joined by commas, then how many more: ``a, b, c and 12 more``."""
    values = [str(value) for value in values]
    more = f" and {len(values) - limit} more" if len(values) > limit else ""
    return ", ".join(values[:limit]) + more
