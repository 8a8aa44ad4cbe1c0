"""``data convert``: a SQLite benchmark (BIRD or Spider layout) as DuckDB files or PostgreSQL databases.

* Each ``db_id`` becomes ``OUT/dev_databases/<db_id>/<db_id>.duckdb`` (its ``database_description/`` copied beside
  it), or the database ``<db_id>`` on the server at ``--dsn`` (BIRD's column descriptions become column comments).
  Tables, types, keys and foreign keys as :mod:`t2s.data.engine_copy` says.
* ``OUT/dev.json`` holds the questions with the gold SQL transpiled, the original kept as ``gold_sql_sqlite``.
* Every transpiled gold runs on the new engine and is compared with the SQLite gold's result: the same rows, as a
  multiset, and in the same order when the SQLite query orders its rows. A question that disagrees (or fails to
  transpile, or fails to run) is left out of ``OUT/dev.json`` and listed in ``OUT/convert_report.json`` with why.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

from t2s.data import engine_copy
from t2s.data.rows import DataError, read_records, write_text_whole
from t2s.env.databases.engine_base import quote

_SQL_FIELDS = ("SQL", "query", "sql", "gold_sql")
_MARK = "made by t2s data convert"  # the comment on each database convert makes: only those are ever replaced


def database_url(dsn: str, db_id: str) -> str:
    """The URL of ``db_id``'s database on the server at ``dsn`` (where ``data convert`` puts it)."""
    from t2s.env.databases import server_url

    return server_url(dsn, db_id)


def _copy_duckdb(source: sqlite3.Connection, tables, plan, target: Path) -> None:
    import duckdb
    import pyarrow as pa

    order, keys, foreign = plan
    if target.exists():
        target.unlink()
    conn = duckdb.connect(str(target))
    try:
        for table in order:
            conn.execute(engine_copy.create_statement(table, "duckdb", keys[table.name], foreign[table.name]))
            kinds = [table.kinds[c] for c in table.columns]
            types = {"int": pa.int64(), "real": pa.float64(), "text": pa.string(), "blob": pa.binary()}
            cursor = source.execute(f"SELECT {', '.join(map(quote, table.columns))} FROM {quote(table.name)}")
            while True:
                batch = cursor.fetchmany(50_000)
                if not batch:
                    break
                rows = [engine_copy.cast_row(row, kinds) for row in batch]
                arrays = [pa.array([row[i] for row in rows], type=types[kind]) for i, kind in enumerate(kinds)]
                frame = pa.Table.from_arrays(arrays, names=[f"c{i}" for i in range(len(kinds))])  # noqa: F841
                conn.execute(f"INSERT INTO {quote(table.name)} SELECT * FROM frame")
        conn.execute("CHECKPOINT")
    finally:
        conn.close()


def _copy_postgres(source: sqlite3.Connection, tables, plan, dsn: str, db_id: str, descriptions: dict) -> None:
    import psycopg

    order, keys, foreign = plan
    with psycopg.connect(dsn, autocommit=True) as admin:
        found = admin.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                              (db_id,)).fetchone()
        if found is not None and found[0] != _MARK:
            raise DataError(f"Error: the server already has a database {db_id!r} that data convert did not make; "
                            "it is left as it is (drop it yourself, or convert to another server)")
        admin.execute(f"DROP DATABASE IF EXISTS {quote(db_id)} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {quote(db_id)} ENCODING 'UTF8' TEMPLATE template0")
        admin.execute(f"COMMENT ON DATABASE {quote(db_id)} IS '{_MARK}'")
    with psycopg.connect(database_url(dsn, db_id)) as conn:
        for table in order:
            conn.execute(engine_copy.create_statement(table, "postgres", keys[table.name], []))
            kinds = [table.kinds[c] for c in table.columns]
            names = ", ".join(quote(c.lower()) for c in table.columns)
            cursor = source.execute(f"SELECT {', '.join(map(quote, table.columns))} FROM {quote(table.name)}")
            with conn.cursor().copy(f"COPY {quote(table.name.lower())} ({names}) FROM STDIN") as copy:
                for row in cursor:
                    copy.write_row([_no_nul(v) for v in engine_copy.cast_row(row, kinds)])
        for table in order:
            for statement in engine_copy.foreign_key_statements(table, foreign[table.name]):
                conn.execute(statement)
            notes = {k.lower(): v for k, v in descriptions.get(table.name.lower(), {}).items()}
            for column in table.columns:
                text = notes.get(column.lower())
                if text:
                    conn.execute(f"COMMENT ON COLUMN {quote(table.name.lower())}.{quote(column.lower())} IS "
                                 + "'" + text.replace("'", "''") + "'")
        conn.execute("ANALYZE")


def _no_nul(value):
    """PostgreSQL text cannot hold NUL characters; they are dropped (SQLite's text can)."""
    return value.replace("\x00", "") if isinstance(value, str) and "\x00" in value else value


class _Source(sqlite3.Connection):
    """The database being copied (a subclass, so that a copy read through its ``-wal`` can hang its folder on it)."""


def _open_source(sqlite_path: Path, db_id: str) -> sqlite3.Connection:
    """The source file opened as the sandbox opens a benchmark file (``databases.open_file``): nothing is created,
    written or removed beside it, its ``-wal`` included (raises DataError when it cannot be opened)."""
    from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef, open_file

    try:
        return open_file(DatabaseRef(db_id, path=str(sqlite_path.resolve())), _Source)
    except DatabaseOpenError as exc:
        raise DataError(f"Error: {db_id}: {str(exc).removeprefix('Error: ')}") from None


def convert_database(sqlite_path: Path, db_id: str, engine: str, output: Path, dsn: str | None) -> dict:
    """Copy one SQLite database; returns what was copied and what was left out (``notes``)."""
    from t2s.env.schema import read_descriptions

    source = _open_source(sqlite_path, db_id)
    source.text_factory = lambda data: data.decode("utf-8", "replace")
    try:
        tables = engine_copy.read_source(source)
        notes: list[str] = []
        plan = engine_copy.plan_keys(source, tables, engine, notes)
        if engine == "postgres":
            lowered = Counter(c.lower() for t in tables for c in [t.name])
            clashes = [name for name, n in lowered.items() if n > 1]
            if clashes:
                raise DataError(f"Error: {db_id}: tables {clashes} differ only in case; PostgreSQL lowercases names")
            descriptions = {k.lower(): v for k, v in read_descriptions(sqlite_path.parent).items()}
            _copy_postgres(source, tables, plan, dsn, db_id, descriptions)
        else:
            folder = output / "dev_databases" / db_id
            folder.mkdir(parents=True, exist_ok=True)
            _copy_duckdb(source, tables, plan, folder / f"{db_id}.duckdb")
            described = sqlite_path.parent / "database_description"
            if described.is_dir():
                shutil.copytree(described, folder / "database_description", dirs_exist_ok=True)
    finally:
        source.close()
    kinds: dict[str, set[str]] = {}
    for table in tables:
        for column, kind in table.kinds.items():
            kinds.setdefault(column.lower(), set()).add(kind)
    return {
        "columns": kinds,  # for transpiling; not written to the report
        "tables": len(tables),
        "rows": sum(t.rows for t in tables),
        "column_types": dict(engine_copy.column_kinds(tables)),
        "primary_keys": sum(bool(k) for k in plan[1].values()),
        "foreign_keys": sum(len(v) for v in plan[2].values()),
        "notes": notes,
    }


def _ordered(sql: str) -> bool:
    """Whether the outermost query orders its rows (then the order must agree too)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except Exception:  # noqa: BLE001
        return False
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def compare(sqlite_result, engine_result, ordered: bool) -> tuple[str, str] | None:
    """None when the engine's result agrees with SQLite's; else (reason, detail)."""
    if sqlite_result.error or sqlite_result.timed_out:
        return "sqlite_gold_failed", str(sqlite_result.error or "timed out")
    if engine_result.timed_out:
        return "timeout", str(engine_result.error)
    if engine_result.error:
        return "engine_error", str(engine_result.error)
    if engine_result.over_cap or sqlite_result.over_cap:
        return "over_cap", "a result is over the scoring cap"
    a, b = [tuple(r) for r in sqlite_result.rows], [tuple(r) for r in engine_result.rows]
    if Counter(a) != Counter(b):
        return "different_rows", f"SQLite {len(a)} rows, engine {len(b)}; first SQLite row {a[:1]}, engine {b[:1]}"
    if ordered and a != b:
        return "different_order", "the same rows in another order"
    return None


def convert(data, engine: str, output, *, dsn: str | None = None, db_root=None, progress=None) -> dict:
    """Convert a data file's databases and questions; writes OUT/dev.json and OUT/convert_report.json."""
    from t2s.data.loaders import json_data_file, load_json_rows
    from t2s.env import databases

    if engine not in ("duckdb", "postgres"):
        raise DataError(f"Error: --engine must be duckdb or postgres, not {engine!r}")
    if engine == "postgres" and not dsn:
        raise DataError("Error: --engine postgres needs --dsn postgresql://... (a role that may create databases)")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    rows = load_json_rows(data, db_root, require_databases=False)
    data_file = json_data_file(data)
    records = read_records(data_file)
    db_reports: dict[str, dict] = {}
    refs: dict[str, object] = {}
    for row in rows:
        db_id = row["db_id"]
        if db_id in db_reports:
            continue
        path = Path(row["db_path"])
        if not path.is_file():
            db_reports[db_id] = {"error": f"database file not found: {path}"}
            continue
        if progress:
            progress(f"copying {db_id} to {engine}")
        try:
            db_reports[db_id] = convert_database(path, db_id, engine, output, dsn)
        except shutil.Error:  # copytree's, whose text is a list of every file's (source, destination, reason)
            db_reports[db_id] = {"error": f"could not copy {db_id}'s database_description files"}
            continue
        except Exception as exc:  # noqa: BLE001 - one database failing leaves out its questions, with the reason
            db_reports[db_id] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            continue
        if engine == "duckdb":
            refs[db_id] = databases.benchmark_db(str(output / "dev_databases" / db_id / f"{db_id}.duckdb"), db_id)
        else:
            refs[db_id] = databases.server_db(database_url(dsn, db_id), db_id)
    kept, dropped = [], []
    for position, (record, row) in enumerate(zip(records, rows)):
        reason = _question(record, row, engine, refs, db_reports)
        if reason is None:  # the source's id goes with the question: ids made from positions would shift on a drop
            kept.append(record if "question_id" in record else {"question_id": row["question_id"], **record})
        else:
            dropped.append({"question_id": row["question_id"], "position": position, "db_id": row["db_id"],
                            "reason": reason[0], "detail": reason[1][:500], "sql": reason[2]})
    databases.close_thread_connections()
    for db_report in db_reports.values():
        db_report.pop("columns", None)
    write_text_whole(output / "dev.json", json.dumps(kept, indent=2, ensure_ascii=False) + "\n")
    report = {
        "engine": engine,
        "source": str(data_file),
        "server": _redacted(dsn) if dsn else None,
        "questions": len(records),
        "kept": len(kept),
        "dropped": len(dropped),
        "share_kept": round(len(kept) / len(records), 4) if records else 0.0,
        "reasons": dict(Counter(d["reason"] for d in dropped).most_common()),
        "databases": db_reports,
        "dropped_questions": dropped,
    }
    write_text_whole(output / "convert_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def _redacted(dsn: str) -> str:
    from t2s.env.databases.postgres_engine import redact

    return redact(dsn)


def _question(record: dict, row: dict, engine: str, refs: dict, db_reports: dict):
    """None for a kept question (its record rewritten in place), else (reason, detail, transpiled SQL or None)."""
    from t2s.env import databases

    db_id = row["db_id"]
    if db_id not in refs:
        return "database_not_converted", str(db_reports.get(db_id, {}).get("error", "")), None
    field = next(f for f in _SQL_FIELDS if isinstance(record.get(f), str))
    original = record[field]
    try:
        sql = engine_copy.transpile(original, engine, db_reports[db_id]["columns"])
    except Exception as exc:  # noqa: BLE001 - sqlglot's parse or generate errors
        return "transpile_error", f"{type(exc).__name__}: {' '.join(str(exc).split())}", None
    sqlite_result = databases.gold_result(databases.ref_from_row(row), original)
    engine_result = databases.run_scoring_query(refs[db_id], sql, timeout=databases.limits.LIMITS.scoring_max_timeout)
    verdict = compare(sqlite_result, engine_result, _ordered(original))
    if verdict is not None:
        return verdict[0], verdict[1], sql
    record[field] = sql
    record["gold_sql_sqlite"] = original
    return None
