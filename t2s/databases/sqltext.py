"""Reading SQL text without SQLite: what a statement starts with, and whether it holds anything but comments."""

from __future__ import annotations

import re

_LEADING_REINDEX = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*reindex\b", re.I | re.S)


def starts_with_reindex(sql: str) -> bool:
    """True when the statement's first keyword, after whitespace and comments, is ``REINDEX``."""
    return _LEADING_REINDEX.match(sql) is not None


def only_comments(sql: str) -> bool:
    """True when nothing but comments, whitespace and semicolons is left of the statement."""
    stripped = re.sub(r"--[^\n]*|/\*.*?(\*/|$)", " ", sql, flags=re.S).strip().strip(";").strip()
    return not stripped
