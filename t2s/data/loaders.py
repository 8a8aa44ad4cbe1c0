"""Loaders for BIRD, Spider, SQaLe and SynSQL into the one row shape that training and evaluation share.

Every loader yields plain dicts of one shape (``t2s.data.rows``, docs/design.md §2, §9).
``db_path`` is the absolute path of a SQLite file, or None for row-payload data (SQaLe), which sets ``schema_id``
instead. ``question_id`` is the data's own id (as a string) where it has one, else ``"<source>:<position>"`` with the
0-based position in the data file. ``databases.ref_from_row(row)`` maps a row to its database.

Rows whose database file is absent keep the path where it was expected; the returned list carries a
``missing_databases`` map (db_id -> number of questions) so callers can count and report them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from t2s.data.rows import (
    DataError, RowList, _bird_difficulty, _pick, _require, make_row, read_records, refuse_duplicate_ids,
)

log = logging.getLogger(__name__)

KINDS = ("bird", "spider", "sqale", "synsql")

# SynSQL-2.5M's `sql_complexity` labels, mapped onto BIRD's three levels.
SYNSQL_DIFFICULTY = {
    "simple": "simple",
    "moderate": "moderate",
    "complex": "challenging",
    "highly complex": "challenging",
}

# Data file names looked for when a loader is given a folder, in order.
_DATA_FILES = {
    "bird": ("dev.json", "train.json", "mini_dev_sqlite.json"),
    "spider": ("dev.json", "train_spider.json"),
    "synsql": ("data.json", "synsql.json"),
}
# The data file a JSON loader reads when it is given a folder: the first of these in it.
_JSON_DATA_FILES = ("dev.json", "train.json", "mini_dev_sqlite.json", "train_spider.json")
# Database folders looked for beside a data file, in order.
_DB_FOLDERS = ("dev_databases", "train_databases", "database", "databases")


# ----------------------------------------------------------------------------------------------------------------
# Files with databases on disk (BIRD, Spider, SynSQL)


#: the databases of BIRD dev (all 1,534 questions are on these 11): the data the published figures were measured on
BIRD_DEV_DATABASES = frozenset({
    "california_schools", "card_games", "codebase_community", "debit_card_specializing", "european_football_2",
    "financial", "formula_1", "student_club", "superhero", "thrombosis_prediction", "toxicology"})
BIRD_DEV = "BIRD dev"


def data_label(rows, data_file) -> str:
    """What data a run played: ``BIRD dev`` when every question is from a BIRD ``dev.json`` (source ``bird_dev``) on
    BIRD dev's databases, else the data file's name with its folder."""
    if rows and all(row.get("source") == "bird_dev" and row.get("db_id") in BIRD_DEV_DATABASES for row in rows):
        return BIRD_DEV
    data_file = Path(data_file)
    return f"{data_file.parent.name}/{data_file.name}"


def _data_file(kind: str, path: Path) -> Path:
    if path.is_dir():
        for name in _DATA_FILES.get(kind, ()):
            if (path / name).is_file():
                return path / name
        expected = " or ".join(_DATA_FILES.get(kind, ("a .json file",)))
        raise DataError(f"Error: no {kind} data file in {path} (expected {expected})")
    return path


def default_db_root(data_file: str | Path, kind: str | None = None) -> Path:
    """The folder beside the data file that holds one sub-folder per db_id (it may not exist)."""
    data_file = Path(data_file).resolve()
    parent = data_file.parent
    stem = data_file.stem.lower()
    preferred = []
    if kind == "spider":
        preferred.append("database")
    elif kind == "synsql":
        preferred.append("databases")
    elif "train" in stem:
        preferred.append("train_databases")
    elif "dev" in stem:
        preferred.append("dev_databases")
    for name in preferred + [n for n in _DB_FOLDERS if n not in preferred]:
        if (parent / name).is_dir():
            return parent / name
    return parent / (preferred[0] if preferred else "databases")


def database_file(db_root: str | Path, db_id: str) -> Path:
    """``<db_root>/<db_id>/<db_id>.sqlite``."""
    return Path(db_root) / db_id / f"{db_id}.sqlite"


def _source_name(kind: str, data_file: Path) -> str:
    stem = data_file.stem.lower()
    if stem.startswith("mini_dev"):
        split = "minidev"
    elif stem in ("dev", "train", "test"):
        split = stem
    elif stem == "train_spider":
        split = "train"
    else:
        split = stem
    return f"{kind}_{split}"


def _attach_databases(rows: list[dict], db_root: Path, data_file: Path, require_databases: bool | None) -> RowList:
    """Set db_path on every row and collect the db_ids whose files are absent."""
    db_root = db_root.resolve()
    missing: dict[str, int] = {}
    present: dict[str, bool] = {}
    for row in rows:
        db_id = row["db_id"]
        file = database_file(db_root, db_id)
        if db_id not in present:
            # a pipe or folder there is unreadable: db_probe says so; a name too long for a path is no file
            present[db_id] = os.path.exists(file)
        if not present[db_id]:
            missing[db_id] = missing.get(db_id, 0) + 1
        row["db_path"] = str(file)
    result = RowList(rows, missing, db_root)
    if not missing or require_databases is False:
        if missing:
            log.warning(result.missing_summary())
        return result
    nothing_there = len(missing) == len(present)
    if require_databases or nothing_there:
        if not db_root.is_dir():
            raise DataError(
                f"Error: the database folder {db_root} does not exist (needed by {data_file}). "
                f"Download the databases and unpack them there, or pass --db-root."
            )
        files = ", ".join(str(database_file(db_root, db)) for db in sorted(missing)[:5])  # the folder may be there
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataError(f"Error: {len(missing)} database file(s) missing under {db_root} for {data_file}: "
                        f"{files}{more}")
    log.warning(result.missing_summary())
    return result


def _load_with_databases(
    kind: str,
    path,
    db_root,
    *,
    sql_fields: tuple[str, ...],
    evidence_fields: tuple[str, ...],
    difficulty_of,
    source: str | None,
    require_databases: bool | None,
    limit: int | None,
) -> RowList:
    data_file = _data_file(kind, Path(path))
    records = read_records(data_file)
    if limit is not None:
        records = records[:limit]
    source = source or _source_name(kind, data_file)
    rows = []
    for position, record in enumerate(records):
        sql_field = _pick(record, sql_fields) or sql_fields[0]
        _require(record, ("db_id", "question", sql_field), data_file, position)
        own_id = record.get("question_id")
        rows.append(
            make_row(
                question_id=str(own_id) if own_id is not None else f"{source}:{position}",
                question=record["question"],
                gold_sql=record[sql_field],
                db_id=record["db_id"],
                evidence=next((record[f] for f in evidence_fields if isinstance(record.get(f), str)), ""),
                difficulty=difficulty_of(record),
                source=source,
            )
        )
    repeated = refuse_duplicate_ids(rows, data_file)
    root = Path(db_root) if db_root is not None else default_db_root(data_file, kind)
    result = _attach_databases(rows, root, data_file, require_databases)
    result.repeated_ids = repeated
    return result


def load_bird(path, db_root=None, *, source=None, require_databases=None, limit=None) -> RowList:
    """BIRD's official layout: ``dev.json`` + ``dev_databases/`` or ``train/train.json`` + ``train_databases/``."""
    return _load_with_databases(
        "bird", path, db_root, sql_fields=("SQL", "sql", "query"), evidence_fields=("evidence",),
        difficulty_of=_bird_difficulty, source=source, require_databases=require_databases, limit=limit,
    )


def load_spider(path, db_root=None, *, source=None, require_databases=None, limit=None) -> RowList:
    """Spider: ``dev.json`` or ``train_spider.json`` + ``database/<db_id>/<db_id>.sqlite``."""
    return _load_with_databases(
        "spider", path, db_root, sql_fields=("query", "SQL", "sql"), evidence_fields=("evidence",),
        difficulty_of=_bird_difficulty, source=source, require_databases=require_databases, limit=limit,
    )


def synsql_difficulty(label: Any) -> str | None:
    """SynSQL's ``sql_complexity`` (Simple, Moderate, Complex, Highly Complex) as simple/moderate/challenging."""
    if not isinstance(label, str):
        return None
    return SYNSQL_DIFFICULTY.get(" ".join(label.strip().lower().replace("_", " ").split()))


def load_synsql(path, db_root=None, *, source=None, require_databases=None, limit=None) -> RowList:
    """SynSQL-2.5M: its JSON list (db_id, question, sql, external_knowledge, sql_complexity) + ``databases/``."""
    return _load_with_databases(
        "synsql", path, db_root, sql_fields=("sql", "SQL", "query"), evidence_fields=("external_knowledge", "evidence"),
        difficulty_of=lambda r: synsql_difficulty(r.get("sql_complexity")) or _bird_difficulty(r),
        source=source or "synsql", require_databases=require_databases, limit=limit,
    )


def rows_on_engine(load, engine: str, dsn: str | None, require_databases=None) -> RowList:
    """The rows ``load()`` reads (called with no SQLite files expected, so quietly) pointed at ``engine``'s databases:
    DuckDB files or a PostgreSQL server, as ``data convert`` writes them (``with_engine``)."""
    disabled, log.disabled = log.disabled, True  # the SQLite files are not expected beside converted data
    try:
        rows = load()
    finally:
        log.disabled = disabled
    return with_engine(rows, engine, dsn, require_databases)


def json_data_file(path) -> Path:
    """The file a JSON loader reads for ``path``: ``path`` itself, or for a folder the first of ``_JSON_DATA_FILES`` in
    it (``path`` as it is when none is there: reading it then fails with the usual error)."""
    path = Path(path)
    if path.is_dir():
        return next((path / name for name in _JSON_DATA_FILES if (path / name).is_file()), path)
    return path


def writes_over(written: Path, data) -> bool:
    """Whether writing the file ``written`` would replace the data file that ``data`` names (:func:`json_data_file`)."""
    try:
        read = json_data_file(data)
        return written.is_file() and read.is_file() and os.path.samefile(written, read)
    except (OSError, RuntimeError):  # a path that cannot be followed (a symlink loop) is reported where it is read
        return False


def load_json_rows(path, db_root=None, source=None, *, require_databases=None, engine: str = "sqlite",
                   dsn: str | None = None) -> RowList:
    """A BIRD- or Spider-style JSON file, told apart by its SQL field (``SQL`` or ``query``).

    This is the loader of ``score`` and ``eval``. Files in the common row shape (``gold_sql``) load as they are.
    ``engine`` ``duckdb`` points each row at ``<db_root>/<db_id>/<db_id>.duckdb``; ``postgres`` at the database
    ``<db_id>`` on the server at ``dsn`` (as ``data convert`` writes them).
    """
    if engine != "sqlite":
        return rows_on_engine(lambda: load_json_rows(path, db_root, source, require_databases=False), engine, dsn,
                              require_databases)
    data_file = json_data_file(path)
    records = read_records(data_file)
    first = records[0] if records else {}
    if "gold_sql" in first:
        return _load_common_rows(records, data_file, db_root, source, require_databases)
    if "query" in first and "SQL" not in first:
        return load_spider(data_file, db_root, source=source, require_databases=require_databases)
    if "sql_complexity" in first or ("sql" in first and "SQL" not in first):
        return load_synsql(data_file, db_root, source=source, require_databases=require_databases)
    return load_bird(data_file, db_root, source=source, require_databases=require_databases)


def with_engine(rows: RowList, engine: str, dsn: str | None, require_databases: bool | None = None) -> RowList:
    """Rows pointed at ``engine``'s databases instead of the SQLite files (see :func:`load_json_rows`)."""
    from t2s.env import databases

    missing: dict[str, int] = {}
    if engine == "duckdb":
        present: dict[str, bool] = {}
        for row in rows:
            if row.get("db_path"):
                row["db_path"] = str(Path(row["db_path"]).with_suffix(".duckdb"))
                found = present.setdefault(row["db_id"], Path(row["db_path"]).exists())
                if not found:
                    missing[row["db_id"]] = missing.get(row["db_id"], 0) + 1
        where = rows.db_root
    elif engine == "postgres":
        if not dsn:
            raise DataError("Error: the postgres engine needs --dsn postgresql://... (the server holding one "
                            "database per db_id)")
        try:
            names = databases.server_databases(dsn)
        except databases.DatabaseOpenError as exc:
            raise DataError(str(exc)) from None
        for row in rows:
            row["db_path"], row["schema_id"] = databases.server_url(dsn, row["db_id"]), None
            if row["db_id"] not in names:
                missing[row["db_id"]] = missing.get(row["db_id"], 0) + 1
        from t2s.env.databases.postgres_engine import redact

        where = redact(dsn)
    else:
        raise DataError(f"Error: unknown engine {engine!r}; expected sqlite, duckdb or postgres")
    result = RowList(rows, missing, where, rows.repeated_ids)
    if (missing and (require_databases or len(missing) == len({r["db_id"] for r in rows}))
            and require_databases is not False):
        raise DataError(f"Error: {len(missing)} {engine} database(s) missing from {where}: "
                        f"{', '.join(sorted(missing)[:5])} (run `python -m t2s data convert --engine {engine}` first)")
    return result


def _load_common_rows(records, data_file, db_root, source, require_databases) -> RowList:
    rows = []
    for position, record in enumerate(records):
        _require(record, ("question", "gold_sql", "db_id"), data_file, position,
                 optional=("db_path", "schema_id", "source"))
        own_id = record.get("question_id")
        row = make_row(
            question_id=own_id if own_id is not None else f"{source or data_file.stem}:{position}",
            question=record["question"],
            gold_sql=record["gold_sql"],
            db_id=record["db_id"],
            evidence=record["evidence"] if isinstance(record.get("evidence"), str) else "",  # as BIRD's
            db_path=record.get("db_path"),
            schema_id=record.get("schema_id"),
            difficulty=_bird_difficulty(record),
            source=source or record.get("source") or data_file.stem,
        )
        rows.append(row)
    repeated = refuse_duplicate_ids(rows, data_file)
    if db_root is None and all(r["db_path"] or r["schema_id"] for r in rows):
        return RowList(rows, repeated_ids=repeated)
    root = Path(db_root) if db_root is not None else default_db_root(data_file)
    result = _attach_databases(rows, root, data_file, require_databases)
    result.repeated_ids = repeated
    return result


# ----------------------------------------------------------------------------------------------------------------
# Dispatch


def load_rows(kind: str, path=None, db_root=None, **opts) -> RowList:
    """Load data of one kind (``bird``, ``spider``, ``sqale``, ``synsql``) into the common row shape.

    Options: ``require_databases`` (True: any missing database is an error; False: never; default: an error only
    when none of the databases is present), ``source`` (the prefix of generated question ids), ``limit``; SQaLe also
    takes ``schemas``, ``columns`` (a :class:`SqaleColumns`) and ``split``.
    """
    kind = kind.lower()
    if kind == "bird":
        return load_bird(path, db_root, **opts)
    if kind == "spider":
        return load_spider(path, db_root, **opts)
    if kind == "synsql":
        return load_synsql(path, db_root, **opts)
    if kind == "sqale":
        from t2s.data.sqale import load_sqale

        return load_sqale(path, db_root, **opts)
    if kind in ("json", "auto"):
        return load_json_rows(path, db_root, opts.get("source"), require_databases=opts.get("require_databases"))
    raise DataError(f"Error: unknown data kind {kind!r} (expected one of {', '.join(KINDS)})")
