"""Which databases can be read: a cheap probe of each database file once, before a run starts.

A file that is not SQLite, a truncated or damaged file, a half-written one, or a WAL database that cannot be opened
would otherwise make every question on it score 0 (or a wrong score) in silence. The probe, per distinct database:
- asks ``databases.database_problem`` (a hot journal beside the file: a writer stopped mid-transaction);
- compares the file's size with the size its header declares (a truncated copy is shorter), and refuses an empty
  file (0 bytes, which SQLite would open as a database without tables);
- opens it through the sandbox (``databases.scoring_connection``), which reads ``sqlite_master``, and refuses a
  database that holds no tables;
- reads the first row of every table, which touches each table's root page.
It costs a few page reads per table, whatever the database's size. Missing files are not its business (the loaders
count them) and row-payload databases are built in memory, so both are passed over.
"""

from __future__ import annotations

import os
from typing import Iterable

PROBE_TIMEOUT = 5.0  # seconds for each probe query
_HEADER = b"SQLite format 3\x00"


def _declared_size_problem(path: str) -> str | None:
    """Why the file is shorter than its header says, or None (also None when the header does not say)."""
    from t2s.env.databases.opening import regular_file

    try:
        with regular_file(path) as handle:
            header = handle.read(100)
        size = os.path.getsize(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if size == 0:  # SQLite opens an empty file as a database without tables
        return f"{path} is empty (0 bytes), not a database"
    if len(header) < 100 or not header.startswith(_HEADER):
        return None  # not SQLite at all: opening it says so
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    declared_valid = header[24:28] == header[92:96]  # the in-header page count is trusted only then
    if declared_valid and pages and size < pages * page_size:
        return (f"{path} is truncated: its header declares {pages} pages of {page_size} bytes "
                f"({pages * page_size} bytes), the file has {size}")
    return None


def _probe(ref) -> str | None:
    from t2s.env import databases
    from t2s.env.schema import quote_identifier

    if ref.engine != "sqlite":
        return _probe_engine(ref)
    problem = databases.database_problem(ref) or _declared_size_problem(ref.path)
    if problem:
        return problem
    try:
        databases.scoring_connection(ref)
    except databases.DatabaseOpenError as exc:
        return str(exc).removeprefix("Error: ")
    tables = databases.run_scoring_query(ref, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
                                         timeout=PROBE_TIMEOUT)
    if not tables.ok:
        return f"cannot read the schema of {ref.path}: {tables.error.removeprefix('Error: ')}"
    if not any(not str(name).startswith("sqlite_") for (name,) in tables.rows):
        views = databases.run_scoring_query(ref, "SELECT 1 FROM sqlite_master WHERE type = 'view' LIMIT 1",
                                            timeout=PROBE_TIMEOUT)
        if views.ok and not views.rows:
            return f"{ref.path} holds no tables"  # a question on it can only fail
    for (name,) in tables.rows:
        if str(name).startswith("sqlite_"):
            continue
        first = databases.run_scoring_query(ref, f"SELECT * FROM {quote_identifier(str(name))} LIMIT 1",
                                            timeout=PROBE_TIMEOUT)
        if not first.ok and not first.timed_out:
            return f"cannot read table {name} of {ref.path}: {first.error.removeprefix('Error: ')}"
    return None


def _probe_engine(ref) -> str | None:
    """A DuckDB or PostgreSQL database: its catalog reads and each table gives its first row."""
    from t2s.env import databases
    from t2s.env.schema import get_schema, quote_identifier

    try:
        schema = get_schema(ref)
    except databases.DatabaseOpenError as exc:
        return str(exc).removeprefix("Error: ")
    for name in schema.tables:
        first = databases.run_scoring_query(ref, f"SELECT * FROM {quote_identifier(name, ref.engine)} LIMIT 1",
                                            timeout=PROBE_TIMEOUT)
        if not first.ok and not first.timed_out:
            return f"cannot read table {name} of {ref.db_id}: {first.error.removeprefix('Error: ')}"
    return None


def database_problems(rows: Iterable[dict]) -> dict[str, str]:
    """db_id -> why its database cannot be used, over the distinct database files the rows name (absent files and
    row-payload databases are left out; a path that is no regular file, such as a pipe, is a problem)."""
    from t2s.env import databases

    problems: dict[str, str] = {}
    seen = set()
    for row in rows:
        path = row.get("db_path")
        if not path or not (databases.is_dsn(path) or os.path.exists(path)):
            continue
        ref = databases.ref_from_row(row)
        if ref in seen:
            continue
        seen.add(ref)
        problem = _probe(ref)
        if problem:
            problems[str(row["db_id"])] = problem
    return problems


def problems_text(problems: dict[str, str], limit: int = 5) -> str:
    """The problems on one line: ``db (reason); ...`` for the first ``limit``, then how many more."""
    items = sorted(problems.items())
    text = "; ".join(f"{db_id} ({reason})" for db_id, reason in items[:limit])
    return text + (f"; and {len(items) - limit} more" if len(items) > limit else "")
