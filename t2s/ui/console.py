"""The project's terminal output through rich, which never wraps a path, an id or SQL.

rich wraps at the terminal's width, and at 80 columns when stdout is not a terminal (CI, pipes, logs), so a long path
would break mid-name and could no longer be copied. Here printed lines are soft-wrapped (the terminal folds them, rich
adds no newline), and a table is laid out at its natural width, title included, whatever the terminal's width.
"""

from __future__ import annotations

#: widest table laid out (a table wider than this is cut to it)
MAX_TABLE_WIDTH = 100_000


def console(stderr: bool = False):
    """A rich Console for a command's output (stdout, or stderr for progress and warnings), soft-wrapping lines."""
    from rich.console import Console

    return Console(stderr=stderr, soft_wrap=True)


def print_table(out, table) -> None:
    """Print ``table`` on the console ``out`` at its natural width: no cell or title is wrapped or cut."""
    from rich.measure import Measurement
    from rich.text import Text

    if table.title is not None:
        title = table.title if isinstance(table.title, Text) else Text.from_markup(str(table.title))
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
