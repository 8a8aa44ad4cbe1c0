"""Loaders for BIRD, Spider, SQaLe and SynSQL into the one row shape that training and evaluation share.

Every loader yields plain dicts with exactly these keys (DESIGN §2, §9)::

    {question_id, question, evidence, gold_sql, db_id, db_path, schema_id, difficulty, source}

``db_path`` is the absolute path of a SQLite file, or None for row-payload data (SQaLe), which sets ``schema_id``
instead. ``question_id`` is the data's own id (as a string) where it has one, else ``"<source>:<position>"`` with the
0-based position in the data file. ``databases.ref_from_row(row)`` maps a row to its database.

Rows whose database file is absent keep the path where it was expected; the returned list carries a
``missing_databases`` map (db_id -> number of questions) so callers can count and report them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from t2s.errors import T2SError

log = logging.getLogger(__name__)

ROW_KEYS = ("question_id", "question", "evidence", "gold_sql", "db_id", "db_path", "schema_id", "difficulty", "source")
DIFFICULTIES = ("simple", "moderate", "challenging")
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
# Database folders looked for beside a data file, in order.
_DB_FOLDERS = ("dev_databases", "train_databases", "database", "databases")


class DataError(T2SError, ValueError):
    """A data file that cannot be loaded; the message begins with ``Error:`` and names the file (and row)."""


class RowList(list):
    """The loaded rows, plus what was found missing while loading.

    ``missing_databases``: db_id -> number of questions whose database file is absent.
    ``db_root``: the folder searched for databases (None for row-payload data).
    ``repeated_ids``: question ids whose rows appear more than once, word for word (see ``refuse_duplicate_ids``).
    """

    def __init__(self, rows: Iterable[dict] = (), missing_databases: dict[str, int] | None = None, db_root=None,
                 repeated_ids: list[str] | None = None):
        super().__init__(rows)
        self.repeated_ids: list[str] = list(repeated_ids or [])
        self.missing_databases: dict[str, int] = dict(missing_databases or {})
        self.db_root: str | None = str(db_root) if db_root is not None else None

    @property
    def missing_questions(self) -> int:
        return sum(self.missing_databases.values())

    def missing_summary(self) -> str:
        """One line naming the missing databases and their question counts ('' when none are missing)."""
        if not self.missing_databases:
            return ""
        items = sorted(self.missing_databases.items())
        names = ", ".join(f"{db} ({n} question{'s' if n != 1 else ''})" for db, n in items[:8])
        if len(items) > 8:
            names += f" and {len(items) - 8} more"
        if self.db_root is None:  # row payloads: those questions were left out
            return (f"{self.missing_questions} questions left out, their schemas absent from the schema table "
                    f"or impossible to build: {names}")
        return f"{self.missing_questions} of {len(self)} questions point at databases missing under {self.db_root}: {names}"


def make_row(
    *,
    question_id: str,
    question: str,
    gold_sql: str,
    db_id: str,
    source: str,
    evidence: str = "",
    db_path: str | None = None,
    schema_id: str | None = None,
    difficulty: str | None = None,
) -> dict:
    """One row in the common shape (every key present, plain strings or None)."""
    return {
        "question_id": str(question_id),
        "question": question,
        "evidence": evidence or "",
        "gold_sql": gold_sql,
        "db_id": db_id,
        "db_path": db_path,
        "schema_id": schema_id,
        "difficulty": difficulty,
        "source": source,
    }


# ----------------------------------------------------------------------------------------------------------------
# Reading files


def read_text_file(path: str | Path, what: str = "data file") -> str:
    """A file's UTF-8 text (a byte-order mark dropped); DataError naming ``what`` when it is absent or not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Error: {what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"Error: {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_records(path: str | Path) -> list[dict]:
    """A JSON list of objects, or JSONL (one object a line). Errors name the file and the line or row."""
    return parse_records(read_text_file(path), path)


def parse_records(text: str, path: str | Path) -> list[dict]:
    """:func:`read_records` on text already read from ``path`` (``path`` names the file in errors, and a ``.jsonl``
    suffix means JSONL)."""
    path = Path(path)
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped.startswith("{") and not _is_single_json_object(stripped)):
        records = [value for _, value in jsonl_values(text, path)]
    else:
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"Error: {path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        if isinstance(records, dict):  # a single object holding the list, e.g. {"data": [...]}
            lists = [v for v in records.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"Error: {path}: expected a JSON list of questions, found an object")
            records = lists[0]
        if not isinstance(records, list):
            raise DataError(f"Error: {path}: expected a JSON list of questions, found {type(records).__name__}")
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(
                f"Error: {path}: row {position} (0-based) is {type(record).__name__}, expected a JSON object"
            )
    return records


def jsonl_values(text: str, path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of JSONL text; DataError naming the file and the line."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"Error: {path}: line {number} is not valid JSON: {exc.msg} (column {exc.colno})") from None


def _is_single_json_object(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _require(record: dict, fields: Iterable[str], path, position: int) -> None:
    """Raise naming the file and row when a required field is missing or not a non-empty string."""
    missing = [f for f in fields if not isinstance(record.get(f), str) or not record.get(f).strip()]
    if missing:
        names = ", ".join(repr(f) for f in missing)
        raise DataError(f"Error: {path}: row {position} (0-based) is missing required field(s) {names}")


def refuse_duplicate_ids(rows: Iterable[dict], where) -> list[str]:
    """DataError naming the question ids that two different rows share: ``score``, ``eval``, ``compare`` and resume
    key on them. Returns the ids whose rows repeat word for word (BIRD mini-dev repeats two questions so), which are
    kept: positions in the file stay as they are for BIRD's position-keyed predictions."""
    first: dict[str, dict] = {}
    conflicting: dict[str, int] = {}
    repeated: list[str] = []
    for row in rows:
        question_id = row["question_id"]
        if question_id not in first:
            first[question_id] = row
        elif row != first[question_id]:
            conflicting[question_id] = conflicting.get(question_id, 1) + 1
        elif question_id not in repeated:
            repeated.append(question_id)
    if conflicting:
        named = ", ".join(f"{question_id} ({n} rows)" for question_id, n in list(conflicting.items())[:10])
        more = f" and {len(conflicting) - 10} more" if len(conflicting) > 10 else ""
        raise DataError(f"Error: {where}: {len(conflicting)} question_id(s) name different questions: {named}{more}; "
                        "each question needs its own id")
    return repeated


def _pick(record: dict, names: Iterable[str]) -> str | None:
    for name in names:
        if name in record:
            return name
    return None


def _difficulty(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value if value in DIFFICULTIES else None


# ----------------------------------------------------------------------------------------------------------------
# Files with databases on disk (BIRD, Spider, SynSQL)


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
            present[db_id] = file.is_file()
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
        folders = ", ".join(str(db_root / db) for db in sorted(missing)[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataError(
            f"Error: {len(missing)} database folder(s) missing under {db_root} for {data_file}: {folders}{more}"
        )
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


def _bird_difficulty(record: dict) -> str | None:
    """The labelled difficulty; a file written by `data difficulty` supplies its estimate where no label exists."""
    return _difficulty(record.get("difficulty")) or _difficulty(record.get("difficulty_estimated"))


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


def load_json_rows(path, db_root=None, source=None, *, require_databases=None) -> RowList:
    """A BIRD- or Spider-style JSON file, told apart by its SQL field (``SQL`` or ``query``).

    This is the loader of ``score`` and ``eval``. Files in the common row shape (``gold_sql``) load as they are.
    """
    data_file = Path(path)
    if data_file.is_dir():
        for name in ("dev.json", "train.json", "mini_dev_sqlite.json", "train_spider.json"):
            if (data_file / name).is_file():
                data_file = data_file / name
                break
    records = read_records(data_file)
    first = records[0] if records else {}
    if "gold_sql" in first:
        return _load_common_rows(records, data_file, db_root, source, require_databases)
    if "query" in first and "SQL" not in first:
        return load_spider(data_file, db_root, source=source, require_databases=require_databases)
    if "sql_complexity" in first or ("sql" in first and "SQL" not in first):
        return load_synsql(data_file, db_root, source=source, require_databases=require_databases)
    return load_bird(data_file, db_root, source=source, require_databases=require_databases)


def _load_common_rows(records, data_file, db_root, source, require_databases) -> RowList:
    rows = []
    for position, record in enumerate(records):
        _require(record, ("question", "gold_sql", "db_id"), data_file, position)
        own_id = record.get("question_id")
        row = make_row(
            question_id=own_id if own_id is not None else f"{source or data_file.stem}:{position}",
            question=record["question"],
            gold_sql=record["gold_sql"],
            db_id=record["db_id"],
            evidence=record.get("evidence") or "",
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
# SQaLe: row payloads


@dataclass(frozen=True)
class SqaleColumns:
    """Column names of the SQaLe schema and query tables (the published data renamed them more than once).

    Where a configured name is absent, the first present alias in ``*_aliases`` is used.
    """

    schema_id: str = "schema_id"
    ddl: str = "full_schema"
    content: str = "schema_content"
    question: str = "question"
    sql: str = "query"
    evidence: str | None = None
    ddl_aliases: tuple[str, ...] = ("schema", "ddl", "create_statements")
    content_aliases: tuple[str, ...] = ("rows", "data", "table_rows")
    question_aliases: tuple[str, ...] = ("nl", "natural_language", "prompt")
    sql_aliases: tuple[str, ...] = ("sql", "SQL", "gold_sql", "sql_query")


SQALE_QUERIES = "trl-lab/SQaLe-2-text-to-SQL-Queries"
SQALE_SCHEMAS = "trl-lab/SQaLe-2-text-to-SQL-Schemas"


def open_table(source: str | Path, *, split: str = "train", what: str = "data"):
    """A table from a local parquet / JSONL / JSON file (or a folder of them), or a Hub dataset id.

    Parquet and Hub tables come back as a ``datasets.Dataset`` (columns read lazily), JSON as a list of dicts.
    """
    path = Path(source)
    if path.exists():
        if path.is_dir():
            parquet = sorted(path.glob("*.parquet"))
            if parquet:
                return _parquet(parquet, path, what)
            files = sorted(path.glob("*.jsonl")) or sorted(path.glob("*.json"))
            if not files:
                raise DataError(f"Error: no parquet, JSONL or JSON files in {path} ({what})")
            return [r for f in files for r in read_records(f)]
        if path.suffix == ".parquet":
            return _parquet([path], path, what)
        return read_records(path)
    if str(source).endswith((".parquet", ".json", ".jsonl")) or str(source).startswith((".", "/")):
        raise DataError(f"Error: {what} file not found: {source}")
    import datasets

    try:
        return datasets.load_dataset(str(source), split=split)
    except Exception as exc:  # noqa: BLE001 - any loading failure becomes one clear line
        raise DataError(f"Error: cannot load the Hub dataset {source!r} ({what}): {exc}") from None


def _parquet(files: list[Path], where: Path, what: str):
    import datasets

    try:
        return datasets.Dataset.from_parquet([str(f) for f in files])
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"Error: {where}: cannot read parquet ({what}): {exc}") from None


def table_columns(table) -> list[str]:
    if isinstance(table, list):
        return list(table[0].keys()) if table else []
    return list(table.column_names)


def table_records(table, *, limit: int | None = None, where: tuple[str, set] | None = None) -> list[dict]:
    """The rows of a table as dicts: the first ``limit``, or those whose ``where[0]`` column is in ``where[1]``.

    On a ``datasets.Dataset`` only the selected rows are materialised (a SQaLe schema table is many gigabytes).
    """
    if isinstance(table, list):
        if where is not None:
            column, wanted = where
            table = [r for r in table if str(r.get(column)) in wanted]
        return table[:limit] if limit is not None else table
    if where is not None:
        column, wanted = where
        indices = [i for i, value in enumerate(table[column]) if str(value) in wanted]
        table = table.select(indices)
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    return table.to_list()


def _column(keys: list[str], name: str | None, aliases: tuple[str, ...], where, what: str) -> str:
    if not keys:
        return name or ""
    for candidate in ([name] if name else []) + list(aliases):
        if candidate in keys:
            return candidate
    raise DataError(
        f"Error: {where}: no {what} column {name!r} (columns: {', '.join(map(str, keys))}); set it in SqaleColumns"
    )


def parse_payload(content: Any, where: str) -> dict[str, list[dict]]:
    """The JSON map table -> list of row dicts (a JSON string or an already-decoded mapping)."""
    if content is None or content == "":
        return {}
    if isinstance(content, (bytes, str)):
        try:
            content = json.loads(content)
        except json.JSONDecodeError as exc:
            raise DataError(f"Error: {where}: the row payload is not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(content, dict):
        raise DataError(f"Error: {where}: the row payload is {type(content).__name__}, expected a table -> rows map")
    payload = {}
    for table, table_rows in content.items():
        if table_rows is None:
            table_rows = []
        if not isinstance(table_rows, list) or not all(isinstance(r, dict) for r in table_rows):
            raise DataError(f"Error: {where}: rows of table {table!r} are not a list of objects")
        payload[str(table)] = table_rows
    return payload


def load_sqale(
    path=None,
    db_root=None,
    *,
    schemas=None,
    columns: SqaleColumns | None = None,
    split: str = "train",
    source: str = "sqale",
    limit: int | None = None,
    register: bool = True,
    **_ignored,
) -> RowList:
    """SQaLe: query rows joined on a schema id to schema rows (DDL + JSON map table -> row dicts).

    ``path``: the query table (local parquet/JSONL/JSON, a folder of them, or a Hub id; default the published
    queries). ``schemas``: the schema table, same forms. When the query rows carry the DDL and payload columns
    themselves, ``schemas`` may be omitted (each distinct DDL becomes one schema). Every schema used is registered
    once with ``databases.register_payload``; rows get ``schema_id`` and ``db_path=None``.
    """
    cols = columns or SqaleColumns()
    query_source = path or SQALE_QUERIES
    queries = table_records(open_table(query_source, split=split, what="SQaLe queries"), limit=limit)
    query_columns = table_columns(queries)
    q_col = _column(query_columns, cols.question, cols.question_aliases, query_source, "question")
    s_col = _column(query_columns, cols.sql, cols.sql_aliases, query_source, "SQL")
    inline = any(c in query_columns for c in ([cols.ddl] if cols.ddl else []) + list(cols.ddl_aliases))
    if schemas is None and not inline:
        schemas = SQALE_SCHEMAS

    schema_table: dict[str, tuple[str, Any]] = {}
    if schemas is not None:
        qid_col = _column(query_columns, cols.schema_id, (), query_source, "schema id")
        table = open_table(schemas, split=split, what="SQaLe schemas")
        schema_columns = table_columns(table)
        id_col = _column(schema_columns, cols.schema_id, (), schemas, "schema id")
        ddl_col = _column(schema_columns, cols.ddl, cols.ddl_aliases, schemas, "DDL")
        content_col = _column(schema_columns, cols.content, cols.content_aliases, schemas, "row payload")
        wanted = {str(q.get(qid_col)) for q in queries}
        for record in table_records(table, where=(id_col, wanted)):
            schema_table[str(record[id_col])] = (record.get(ddl_col) or "", record.get(content_col))
    else:
        ddl_col = _column(query_columns, cols.ddl, cols.ddl_aliases, query_source, "DDL")
        content_col = _column(query_columns, cols.content, cols.content_aliases, query_source, "row payload")
        qid_col = cols.schema_id if cols.schema_id in query_columns else None

    rows: list[dict] = []
    needed: dict[str, tuple[str, Any]] = {}
    missing: dict[str, int] = {}
    for position, record in enumerate(queries):
        _require(record, (q_col, s_col), query_source, position)
        if schemas is not None:
            schema_id = record.get(qid_col)
            if schema_id is None:
                raise DataError(f"Error: {query_source}: row {position} (0-based) has no {qid_col!r}")
            schema_id = str(schema_id)
            if schema_id not in schema_table:
                missing[schema_id] = missing.get(schema_id, 0) + 1
                continue
            needed[schema_id] = schema_table[schema_id]
        else:
            ddl = record.get(ddl_col) or ""
            schema_id = str(record[qid_col]) if qid_col and record.get(qid_col) is not None else _ddl_id(ddl)
            needed.setdefault(schema_id, (ddl, record.get(content_col)))
        evidence = record.get(cols.evidence) if cols.evidence else ""
        own_id = record.get("question_id")
        rows.append(
            make_row(
                question_id=str(own_id) if own_id is not None else f"{source}:{position}",
                question=record[q_col],
                gold_sql=record[s_col],
                db_id=schema_id,
                evidence=evidence if isinstance(evidence, str) else "",
                schema_id=schema_id,
                difficulty=_bird_difficulty(record),
                source=source,
            )
        )
    repeated = refuse_duplicate_ids(rows, query_source)
    if missing:
        log.warning("%d SQaLe questions name schemas absent from the schema table: %s",
                    sum(missing.values()), ", ".join(sorted(missing)[:10]))
    if register:
        failed = register_payloads(needed)
        if failed:
            for schema_id, error in sorted(failed.items())[:5]:
                log.warning("SQaLe schema %s could not be built, its questions are left out: %s", schema_id, error)
            dropped = [r for r in rows if r["schema_id"] in failed]
            for row in dropped:
                missing[row["schema_id"]] = missing.get(row["schema_id"], 0) + 1
            rows = [r for r in rows if r["schema_id"] not in failed]
    return RowList(rows, missing, None, repeated)


def _ddl_id(ddl: str) -> str:
    return "schema_" + hashlib.sha256(ddl.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def register_payloads(schemas: dict[str, tuple[str, Any]]) -> dict[str, str]:
    """Register each (DDL, payload) with ``databases.register_payload`` under its schema id.

    A payload that is not a table -> rows map raises (naming the schema); a schema the database layer cannot build
    (too large, or its id already registered with other DDL or rows) is returned in ``{schema_id: reason}`` instead.
    """
    import sqlite3

    from t2s import databases

    failed: dict[str, str] = {}
    for schema_id, (ddl, content) in schemas.items():
        payload = parse_payload(content, f"schema {schema_id}")
        try:
            databases.register_payload(schema_id, ddl, payload)
        except (ValueError, sqlite3.Error, MemoryError) as exc:
            failed[schema_id] = str(exc)
    return failed


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
        return load_sqale(path, db_root, **opts)
    if kind in ("json", "auto"):
        return load_json_rows(path, db_root, opts.get("source"), require_databases=opts.get("require_databases"))
    raise DataError(f"Error: unknown data kind {kind!r} (expected one of {', '.join(KINDS)})")


def database_ref(row: dict):
    """The DatabaseRef of a row (the registry: ``databases.ref_from_row``)."""
    from t2s import databases

    return databases.ref_from_row(row)
