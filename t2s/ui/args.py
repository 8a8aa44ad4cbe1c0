"""Command-line argument checking shared by every command: ``type=`` functions that refuse numbers and paths which
mean nothing, and the parser that reports a usage error as one ``Error:`` line (exit status 2).

Use them as ``parser.add_argument("--batch-size", type=positive_int)``; argparse names the flag in the message.
"""

from __future__ import annotations

import argparse
import math
import sys
from argparse import BooleanOptionalAction  # noqa: F401 - the option groups below commands/ take it from here


def _number(text, kind):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        expected = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _bounded(name: str, kind, accepts, requirement: str):
    """A ``type=`` function reading ``kind`` and refusing a value ``accepts`` rejects ("must be <requirement>")."""

    def parse(text):
        value = _number(text, kind)
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    parse.__name__ = parse.__qualname__ = name
    parse.__doc__ = f"{'An integer' if kind is int else 'A finite number'} {requirement}."
    return parse


positive_int = _bounded("positive_int", int, lambda v: v >= 1, "at least 1")
non_negative_int = _bounded("non_negative_int", int, lambda v: v >= 0, "0 or more")
positive_float = _bounded("positive_float", float, lambda v: v > 0, "above 0")
non_negative_float = _bounded("non_negative_float", float, lambda v: v >= 0, "0 or more")
unit_float = _bounded("unit_float", float, lambda v: 0 < v <= 1, "above 0 and at most 1")  # a share: top-p, ...
MAX_SAMPLES = 1024  # samples per question (--k): the published vote@32 and pass@k studies stay far below it
sample_count = _bounded("sample_count", int, lambda v: 1 <= v <= MAX_SAMPLES, f"from 1 to {MAX_SAMPLES}")


def non_empty_path(text) -> str:
    """A path that is not empty or blank (an empty ``--output`` would otherwise mean the current folder)."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("must name a path, got an empty string")
    return str(text)


def add_hidden_alias(parser, flag: str, old: str, **kwargs) -> None:
    """Accept ``old``, an earlier spelling of ``flag``, without listing it in the help."""
    dest = next(a.dest for a in parser._actions if flag in a.option_strings)
    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says it (``default ...``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.nargs == 0:  # a switch: off unless given
            shown = "on" if action.default else "off"
        elif action.default is None or action.default == [] or action.default == "":
            shown = "none"
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, ``Error: <command>: <problem>``, and exit status 2; its help
    shows every option's default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """Name a misspelt option, with its closest match, before argparse asks for a required one it hid."""
        self.check_options(list(sys.argv[1:] if args is None else args))
        return super().parse_known_args(args, namespace)

    def check_options(self, args: list[str]) -> None:
        """Refuse the first ``--option`` this parser does not take (whole or as an abbreviation), naming it."""
        import difflib

        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return  # the command's own parser checks the options after its name
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for token in args:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("--") or any(k.startswith(name) for k in known):
                continue
            close = difflib.get_close_matches(name, known, n=1)
            self.error(f"unrecognized option {name}" + (f"; did you mean {close[0]}?" if close else ""))

    def error(self, message: str):
        from t2s.ui.console import print_error_once

        print_error_once(f"Error: {self.prog}: {message} (see `{self.prog} --help`)")  # once for a launch's processes
        sys.exit(2)


def output_dir_alias(flag: str) -> str:
    """``--output`` (every other verb's name for where results go) as the recipe key ``--output_dir`` (TRL's name)."""
    if flag == "--output":
        return "--output_dir"
    return "--output_dir=" + flag.removeprefix("--output=") if flag.startswith("--output=") else flag


def add_recipe_arguments(parser: argparse.ArgumentParser, epilog: str, keys_help, examples: str) -> None:
    """``--config RECIPE`` (``examples``: the command's own shipped recipes); every other flag is kept in
    ``args.overrides`` as a recipe-key override for TrlParser (``train``, ``sft``), ``--output`` as ``--output_dir``.
    ``--help`` appends ``keys_help()``, the recipe keys, read only when help is asked for."""
    parser.add_argument("--config", required=True, help=f"recipe YAML ({examples}, ...)")
    parser.epilog = epilog
    parser.set_defaults(overrides=[])
    def parse_known(args, namespace):  # argparse's own: the options it does not take are recipe keys, not misspellings
        return argparse.ArgumentParser.parse_known_args(parser, args, namespace)

    def keep_overrides(args=None, namespace=None):
        """Recipe overrides are not this parser's options: keep them for TrlParser instead of rejecting them."""
        namespace, extras = parse_known(args, namespace)
        namespace.overrides = [*namespace.overrides, *(output_dir_alias(a) for a in extras if a != "--")]
        return namespace, []

    parser.parse_known_args = keep_overrides
    format_help = parser.format_help
    parser.format_help = lambda: format_help() + "\n" + keys_help()

