"""Command-line argument checking shared by every command: ``type=`` functions that refuse numbers and paths which
mean nothing, and the parser that reports a usage error as one ``Error:`` line (exit status 2).

Use them as ``parser.add_argument("--batch-size", type=positive_int)``; argparse names the flag in the message.
"""

from __future__ import annotations

import argparse
import math
import sys


def _number(text, kind):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text) -> int:
    """An integer of at least 1."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text) -> int:
    """An integer of at least 0."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text) -> float:
    """A finite number above 0."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def non_negative_float(text) -> float:
    """A finite number of at least 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def unit_float(text) -> float:
    """A number in (0, 1]: a share such as top-p or a memory fraction."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def non_empty_path(text) -> str:
    """A path that is not empty or blank (an empty ``--output`` would otherwise mean the current folder)."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("must name a path, got an empty string")
    return str(text)


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, ``Error: <command>: <problem>``, and exit status 2."""

    def error(self, message: str):
        sys.stderr.write(f"Error: {self.prog}: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)
