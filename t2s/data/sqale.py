"""SQaLe: schema rows (DDL plus a JSON map from table to row dicts) joined to query rows on a schema id, from local
parquet / JSONL / JSON files or a Hub dataset; each schema becomes a row-payload database built in memory
(``schema_id`` instead of ``db_path``). Dataset ids and column names are configurable (``SqaleColumns``)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t2s.data.rows import DataError, RowList, _bird_difficulty, _require, make_row, read_records, refuse_duplicate_ids

log = logging.getLogger(__name__)


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
            raise DataError(
                f"Error: {where}: the row payload is not valid JSON: {exc.msg} (column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:  # an integer past Python's digit limit, nesting past its depth
            raise DataError(f"Error: {where}: the row payload cannot be read: {type(exc).__name__}") from None
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

    A schema whose payload is not a table -> rows map, or that the database layer cannot build (too large, or its id
    already registered with other DDL or rows), is returned in ``{schema_id: reason}``, its questions left out and
    counted as the others' build failures are: one broken schema does not stop the load.
    """
    import sqlite3

    from t2s.env import databases

    failed: dict[str, str] = {}
    for schema_id, (ddl, content) in schemas.items():
        try:
            databases.register_payload(schema_id, ddl, parse_payload(content, f"schema {schema_id}"))
        except DataError as exc:
            failed[schema_id] = str(exc).removeprefix("Error: ")
        except (ValueError, sqlite3.Error, MemoryError) as exc:
            failed[schema_id] = str(exc)
    return failed
