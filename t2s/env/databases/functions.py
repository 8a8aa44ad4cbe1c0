"""The SQL functions the sandbox replaces: ``printf``/``format`` that refuse huge widths, and linear ``trim``.

SQLite's own versions can spend seconds or minutes inside a single opcode, out of reach of the progress handler.
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading

from t2s.env.databases import limits

_PRINTF_SPEC = re.compile(r"%([-+ #!0,l.*\d]*)(.|$)", re.S)  # flags, widths, precisions, then the conversion
_PRINTF_SIZES = re.compile(r"\*|\d+")
_LEADING_NUMBER = re.compile(r"\s*[-+]?\d+")

_local = threading.local()


def _as_int(value) -> int:
    """SQLite's integer reading of a printf argument (text and blobs take their leading digits, else 0)."""
    if isinstance(value, bool) or isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        match = _LEADING_NUMBER.match(value)
        return _digits_value(match.group()) if match else 0
    return 0


def _digits_value(digits: str) -> int:
    """An integer written in decimal; one too long to matter (or for Python to read) is read as a huge width."""
    digits = digits.strip()
    sign = -1 if digits[:1] == "-" else 1
    digits = digits.lstrip("+-").lstrip("0") or "0"
    return sign * (int(digits) if len(digits) <= 18 else 10**18)


def printf_too_wide(fmt, args) -> bool:
    """True when a printf format asks for a width or precision above ``LIMITS.printf_max_width``.

    Every digit run and every ``*`` argument between a ``%`` and its conversion letter is checked, whatever the
    order SQLite would read them in.
    """
    if not isinstance(fmt, str) or "%" not in fmt:
        return False
    next_arg = 0
    for match in _PRINTF_SPEC.finditer(fmt):
        body, kind = match.group(1), match.group(2)
        for size in _PRINTF_SIZES.findall(body):
            if size == "*":
                value = _as_int(args[next_arg]) if next_arg < len(args) else 0
                next_arg += 1
            else:
                value = _digits_value(size)
            if abs(value) > limits.LIMITS.printf_max_width:
                return True
        if kind not in ("%", "n", ""):
            next_arg += 1
    return False


def _helper() -> sqlite3.Connection:
    """This thread's private in-memory connection, without our overrides, for SQLite's own formatting."""
    helper = getattr(_local, "helper_conn", None)
    if helper is None:
        helper = _local.helper_conn = sqlite3.connect(":memory:", check_same_thread=True)
        helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.LIMITS.max_value_length)
    return helper


def plain_printf(fmt, args):
    """SQLite's own printf, run on the helper connection once the widths are known to be safe."""
    placeholders = ", ".join("?" * (len(args) + 1))
    return _helper().execute(f"SELECT printf({placeholders})", (fmt, *args)).fetchone()[0]


def _sql_text(value) -> str:
    """A value as SQLite would turn it into text (REAL formatting is SQLite's own)."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    if type(value) is bytes:
        return value.decode("utf-8", "replace")
    return _helper().execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0]


def linear_trim(value, chars, left: bool, right: bool):
    """``trim``/``ltrim``/``rtrim`` with a character set, in linear time.

    SQLite's own compares every character with the whole set, which reaches minutes inside one opcode when both are
    near the length limit.
    """
    if value is None or chars is None:
        return None
    text, chars = _sql_text(value), _sql_text(chars)
    if len(chars) <= 64:
        return text.strip(chars) if left and right else text.lstrip(chars) if left else text.rstrip(chars)
    members = set(chars)
    start, end = 0, len(text)
    while left and start < end and text[start] in members:
        start += 1
    while right and end > start and text[end - 1] in members:
        end -= 1
    return text[start:end]


class ValueTooLong(ValueError):
    """A function result longer than the connection's length limit."""


def linear_instr(haystack, needle):
    """``instr`` in linear time: the 1-based position of ``needle`` in ``haystack`` (0 when absent, NULL with NULL).

    Two blobs are searched as bytes, anything else as text (positions in characters), as SQLite does. SQLite's own
    compares the needle at every position: two values near the length limit take seconds in a single call.
    """
    if haystack is None or needle is None:
        return None
    if type(haystack) is bytes and type(needle) is bytes:
        return haystack.find(needle) + 1
    return _sql_text(haystack).find(_sql_text(needle)) + 1


def linear_replace(value, old, new, max_length: int):
    """``replace`` in linear time, refusing (``ValueTooLong``) a result longer than ``max_length`` before building it.

    NULL in any argument gives NULL; an empty ``old`` gives ``value`` unchanged; otherwise the result is text.
    """
    if value is None or old is None:
        return None
    old = _sql_text(old)
    if old == "":
        return value
    if new is None:
        return None
    text, new = _sql_text(value), _sql_text(new)
    if len(new) > len(old):
        count = text.count(old)
        if len(text) + count * (len(new) - len(old)) > max_length:
            raise ValueTooLong(f"Error: replace() would build a value longer than {max_length} characters")
    return text.replace(old, new)
