"""What running one statement gives back, whatever the engine (:class:`QueryResult`), and reading its rows in batches
under caps: a tool query's rows and bytes, a scoring result's cells and bytes."""

from __future__ import annotations

import marshal
import operator
from dataclasses import dataclass, field

from t2s.env.databases import limits


@dataclass(slots=True)
class QueryResult:
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    more: bool = False  # more rows existed beyond those fetched
    error: str | None = None
    timed_out: bool = False
    write_attempt: bool = False
    over_cap: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def cell_bytes(rows) -> int:
    """Approximate bytes of fetched rows (their marshalled size: text and blob lengths plus a few bytes a cell)."""
    return len(marshal.dumps(rows))


def fetch_all(cursor, max_cells, max_bytes, convert=None, max_rows=None) -> tuple[list, bool, bool]:
    """(rows, more, over_cap) of a read in batches: at most ``max_rows`` rows (one more is read to learn whether more
    exist), stopping with ``over_cap`` past ``max_cells`` cells or about ``max_bytes`` bytes. A batch never holds more
    rows than the bytes still allowed could take at the longest value (``LIMITS.max_value_length``) a cell, and at
    least one: so a result of wide rows of long values stops after the row that passes the cap, not 16 rows later.
    ``convert`` maps each batch first (other engines' values as sqlite3's: ``engine_base.normalise_rows``)."""
    if max_cells is None and max_bytes is None and max_rows is None:
        rows = cursor.fetchall()
        return (rows if convert is None else convert(rows)), False, False
    width = max(1, len(cursor.description or ()))
    batch_rows, max_value = limits.LIMITS.fetch_batch, limits.LIMITS.max_value_length
    rows: list = []
    size = 0
    while True:
        batch_size = batch_rows
        if max_rows is not None:
            batch_size = min(batch_size, max_rows + 1 - len(rows))
        if max_bytes is not None:
            batch_size = min(batch_size, max(1, (max_bytes - size) // (width * max_value)))
        batch = cursor.fetchmany(batch_size)
        if convert is not None:
            batch = convert(batch)
        if not batch:
            return rows, False, False
        rows.extend(batch)
        if max_rows is not None and len(rows) > max_rows:
            return rows[:max_rows], True, False
        if max_cells is not None and len(rows) * width > max_cells:
            return rows[: max_cells // width], True, True
        if max_bytes is not None:
            size += cell_bytes(batch)
            if size > max_bytes:
                return rows, True, True
        if len(batch) < batch_size:  # a short batch: the statement has no rows left
            return rows, False, False


def tool_caps(max_rows) -> tuple[int, None, int]:
    """(max_rows, max_cells, max_bytes) of a tool query's read: its rows (a whole number, at least 0), no cell cap,
    and ``LIMITS.tool_max_bytes``."""
    if type(max_rows) is not int or max_rows < 0:
        max_rows = max(0, int(max_rows))
    return max_rows, None, limits.LIMITS.tool_max_bytes


_first = operator.itemgetter(0)  # a column's name in cursor.description


def run_statement(conn, sql, max_rows, max_cells, max_bytes) -> QueryResult:
    """One statement's columns and rows; a statement without a result has no columns (raises what SQLite raises).

    ``fetch_all`` reads the rows: with ``max_rows`` (a tool query) that many, under ``LIMITS.tool_max_bytes``.
    """
    cursor = conn.execute(sql)
    description = cursor.description
    if description is None:
        cursor.close()
        return QueryResult()
    columns = list(map(_first, description))
    if max_rows is not None:
        max_rows, max_cells, max_bytes = tool_caps(max_rows)
    rows, more, over_cap = fetch_all(cursor, max_cells, max_bytes, max_rows=max_rows)
    cursor.close()
    return QueryResult(columns, rows, more, over_cap=over_cap)
