"""Reading a statement's rows: a bounded ``fetchmany`` for tool queries, batches under the scoring caps otherwise."""

from __future__ import annotations

import marshal
import operator

from t2s.env.databases import limits


def _cell_bytes(rows) -> int:
    """Approximate bytes of fetched rows (their marshalled size: text and blob lengths plus a few bytes a cell)."""
    return len(marshal.dumps(rows))


def _fetch(cursor, max_cells, max_bytes, convert=None) -> tuple[list, bool, bool]:
    """(rows, more, over_cap) of a full read, in batches, stopping past ``max_cells`` cells or about ``max_bytes``.
    ``convert`` maps each batch first (other engines' values as sqlite3's: ``engine_base.normalise_rows``)."""
    if max_cells is None and max_bytes is None:
        rows = cursor.fetchall()
        return (rows if convert is None else convert(rows)), False, False
    width = max(1, len(cursor.description or ()))
    rows: list = []
    size = 0
    while True:
        batch_size = limits.FETCH_BATCH
        if max_bytes is not None:  # a batch can never hold much more than the bytes still allowed
            batch_size = min(limits.FETCH_BATCH, max(16, (max_bytes - size) // (width * limits.MAX_VALUE_LENGTH)))
        batch = cursor.fetchmany(batch_size)
        if convert is not None:
            batch = convert(batch)
        if not batch:
            return rows, False, False
        rows.extend(batch)
        if max_cells is not None and len(rows) * width > max_cells:
            return rows[: max_cells // width], True, True
        if max_bytes is not None:
            size += _cell_bytes(batch)
            if size > max_bytes:
                return rows, True, True
        if len(batch) < batch_size:  # a short batch: the statement has no rows left
            return rows, False, False


_first = operator.itemgetter(0)  # a column's name in cursor.description


def run_statement(conn, sql, max_rows, max_cells, max_bytes) -> tuple[list, list, bool, bool]:
    """(columns, rows, more, over_cap) of one statement; a statement without a result has no columns.

    With ``max_rows`` (a tool query) one ``fetchmany(max_rows + 1)`` reads the rows; else ``_fetch`` reads them all.
    """
    cursor = conn.execute(sql)
    description = cursor.description
    if description is None:
        cursor.close()
        return [], [], False, False
    if max_rows is not None:
        if type(max_rows) is not int or max_rows < 0:
            max_rows = max(0, int(max_rows))
        rows = cursor.fetchmany(max_rows + 1)
        cursor.close()
        if len(rows) > max_rows:
            return list(map(_first, description)), rows[:max_rows], True, False
        return list(map(_first, description)), rows, False, False
    rows, more, over_cap = _fetch(cursor, max_cells, max_bytes)
    cursor.close()
    return list(map(_first, description)), rows, more, over_cap
