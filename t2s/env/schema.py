"""Schema knowledge of a database: tables, one-line DDL, columns, foreign keys, join paths and BIRD descriptions.

A :class:`Schema` is read once through a sandboxed tool connection and cached per :class:`DatabaseRef`
(:func:`get_schema`); afterwards it is plain data, safe to share between threads.
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import sqlite3
import threading
from collections import deque
from pathlib import Path

from t2s.env.databases import DatabaseRef, quote_identifier, read_catalog, tool_connection
from t2s.env.databases.sqltext import one_line_ddl

class Schema:
    """Tables, columns, one-line DDL and the foreign-key graph of one database."""

    def __init__(self, tables: list[str], ddl: dict[str, str], columns: dict[str, list[tuple[str, str]]], fks: list,
                 comments: dict[str, dict[str, str]] | None = None, engine: str = "sqlite"):
        self.tables = list(tables)
        self.engine = engine
        self.comments = comments or {}  # {table: {column: text}}: the catalog's column comments (DuckDB, PostgreSQL)
        self._ddl = ddl
        self._columns = columns
        self._by_lower: dict[str, str] = {}  # SQL's folding: ASCII letters only (a Kelvin sign is not a k)
        for name in self.tables:
            self._by_lower.setdefault(ascii_lower(name), name)
        self._column_by_lower: dict[str, dict[str, str]] = {}  # table -> {folded column: first column so named}
        self._column_names: dict[str, set[str]] = {}
        for table, table_columns in columns.items():
            by_lower = self._column_by_lower[table] = {}
            self._column_names[table] = {column for column, _ in table_columns}
            for column, _ in table_columns:
                by_lower.setdefault(ascii_lower(column), column)
        self._fks = list(dict.fromkeys(fks))  # (src_table, src_col, dst_table, dst_col), declaration order
        self._edges: dict[str, list[tuple[str, str]]] = {name: [] for name in self.tables}
        q = functools.partial(quote_identifier, engine=engine)
        for src, src_col, dst, dst_col in self._fks:
            if src in self._edges and dst in self._edges and src != dst:
                self._edges[src].append((dst, f"{q(src)}.{q(src_col)} = {q(dst)}.{q(dst_col)}"))
                self._edges[dst].append((src, f"{q(dst)}.{q(dst_col)} = {q(src)}.{q(src_col)}"))

    @classmethod
    def from_connection(cls, conn) -> Schema:
        """Read the schema through a (sandboxed) connection."""
        rows = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
        ).fetchall()
        tables = [name for name, _ in rows]
        ddl = {name: one_line_ddl(sql or "") for name, sql in rows}
        columns: dict[str, list[tuple[str, str]]] = {}
        primary_keys: dict[str, list[str]] = {}
        for name in tables:  # the name bound as a parameter: a name of any length is never SQL text
            try:
                info = conn.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
            except (sqlite3.Error, MemoryError):  # a virtual table whose module is missing or refused, a view of a
                info = []  # missing table, a name too long for the statement the pragma builds (sqlite3 says
                # MemoryError for SQLITE_TOOBIG): listed with its DDL and no columns; every other table is still read
            columns[name] = [(row[1], row[2] or "") for row in info]
            primary_keys[name] = [row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        by_lower: dict[str, str] = {}
        for name in tables:
            by_lower.setdefault(ascii_lower(name), name)
        fks = []
        for name in tables:
            try:
                keys = conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)).fetchall()
            except (sqlite3.Error, MemoryError):
                keys = []
            for row in keys:
                _, seq, parent, src_col, dst_col = row[:5]
                parent_name = parent if parent in columns else by_lower.get(ascii_lower(str(parent)), parent)
                src_col = _match_column(columns[name], src_col)
                if dst_col is None:  # references the parent's primary key implicitly
                    parent_pk = primary_keys.get(parent_name, [])
                    dst_col = (parent_pk[seq] if seq < len(parent_pk)
                               else ("rowid" if parent_name in columns else src_col))
                else:
                    dst_col = _match_column(columns.get(parent_name, []), dst_col)
                fks.append((name, src_col, parent_name, dst_col))
        return cls(tables, ddl, columns, fks)

    # -- names --------------------------------------------------------------------------------------------------
    def resolve_table(self, name) -> str | None:
        """The table's real name, matched case-insensitively (surrounding quotes ignored), or None."""
        if not isinstance(name, str):
            return None
        if name in self._edges:  # its exact name first: two names may fold to one
            return name
        found = self._by_lower.get(ascii_lower(name))
        if found is None and len(name) >= 2 and name[0] + name[-1] in ('""', "``", "[]", "''"):
            inner = name[1:-1]
            found = inner if inner in self._edges else self._by_lower.get(ascii_lower(inner))
        return found

    def resolve_column(self, table: str, name) -> str | None:
        real = self.resolve_table(table)
        if real is None or not isinstance(name, str):
            return None
        if name in self._column_names[real]:
            return name
        return self._column_by_lower[real].get(ascii_lower(name))

    def closest_tables(self, name, n: int = 3) -> list[str]:
        return _closest(str(name), self.tables, n)

    def closest_columns(self, table: str, name, n: int = 3) -> list[str]:
        return _closest(str(name), self.columns(table), n)

    # -- per table ----------------------------------------------------------------------------------------------
    def ddl(self, table: str) -> str:
        return self._ddl[self.resolve_table(table) or table]

    def columns(self, table: str) -> list[str]:
        real = self.resolve_table(table)
        return [col for col, _ in self._columns.get(real, [])]

    def column_types(self, table: str) -> dict[str, str]:
        real = self.resolve_table(table)
        return dict(self._columns.get(real, []))

    def foreign_keys(self, table: str) -> list[tuple[str, str, str, str]]:
        """(src_table, src_col, dst_table, dst_col) for keys going out of the table, then keys coming in."""
        real = self.resolve_table(table)
        if real is None:
            return []
        outgoing = [fk for fk in self._fks if fk[0] == real]
        incoming = [fk for fk in self._fks if fk[2] == real and fk[0] != real]
        return outgoing + incoming

    @property
    def all_foreign_keys(self) -> list[tuple[str, str, str, str]]:
        return list(self._fks)

    def join_path(self, a: str, b: str) -> list[str] | None:
        """The shortest foreign-key path from ``a`` to ``b`` as join conditions; [] for the same table; None if none.

        Breadth-first over keys in declaration order, so the answer is deterministic.
        """
        start, goal = self.resolve_table(a), self.resolve_table(b)
        if start is None or goal is None:
            return None
        if start == goal:
            return []
        previous: dict[str, tuple[str, str]] = {start: ("", "")}
        queue = deque([start])
        while queue:
            table = queue.popleft()
            for neighbour, condition in self._edges[table]:
                if neighbour in previous:
                    continue
                previous[neighbour] = (table, condition)
                if neighbour == goal:
                    path = []
                    while neighbour != start:
                        neighbour, condition = previous[neighbour]
                        path.append(condition)
                    return path[::-1]
                queue.append(neighbour)
        return None


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(name: str) -> str:
    """``name`` with its ASCII letters lowercased and nothing else: how SQLite folds the case of identifiers."""
    return name.translate(_ASCII_LOWER)


def _match_column(columns: list[tuple[str, str]], name) -> str:
    if name is None:
        return name
    name = str(name)
    if any(col == name for col, _ in columns):
        return name
    return next((col for col, _ in columns if ascii_lower(col) == ascii_lower(name)), name)


def _closest(name: str, options: list[str], n: int) -> list[str]:
    lowered = {option.lower(): option for option in reversed(options)}
    matches = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if len(matches) < n:  # names that contain the query (or the reverse) are close too
        key = name.lower()
        for option in lowered:
            if option not in matches and key and (key in option or option in key):
                matches.append(option)
                if len(matches) == n:
                    break
    return [lowered[match] for match in matches]


_schemas: dict[DatabaseRef, Schema] = {}
_schemas_lock = threading.Lock()


def get_schema(ref: DatabaseRef) -> Schema:
    """The schema of a database, read once per process (raises DatabaseOpenError for a missing file): SQLite's
    ``sqlite_master`` and PRAGMAs, or the catalog of DuckDB (``duckdb_tables()``, ``duckdb_constraints()``) or
    PostgreSQL (``pg_class``, ``pg_attribute``, ``pg_constraint``, column comments)."""
    found = _schemas.get(ref)
    if found is None:
        if ref.engine == "sqlite":
            found = Schema.from_connection(tool_connection(ref))
        else:  # DuckDB and PostgreSQL: each engine's own catalog
            catalog = read_catalog(ref)
            found = Schema(catalog.tables, catalog.ddl, catalog.columns, catalog.fks, catalog.comments, ref.engine)
        with _schemas_lock:
            found = _schemas.setdefault(ref, found)
    return found


# ----------------------------------------------------------------------------------------------------------------
# BIRD column descriptions
# ----------------------------------------------------------------------------------------------------------------
def _decode(data: bytes) -> str:
    """UTF-8 with or without a byte-order mark, else cp1252 (undefined bytes replaced)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def _clean(text) -> str:
    return " ".join(str(text or "").split())


_descriptions_cache: dict[tuple, dict[str, dict[str, str]]] = {}


def read_descriptions(db_folder) -> dict[str, dict[str, str]]:
    """BIRD's ``database_description/*.csv`` as {table: {column: description}}; never raises.

    ``db_folder`` is a database folder (holding ``database_description/``) or that folder itself. Tables are keyed by
    the CSV file name and columns by ``original_column_name``, both as written (look them up case-insensitively).
    A description joins the column's expanded name, its description and its value description. Read once per
    folder (and modification time) in a process.
    """
    folder = Path(db_folder)
    if (folder / "database_description").is_dir():
        folder = folder / "database_description"
    try:
        key = (str(folder.resolve()), folder.stat().st_mtime_ns)
    except OSError:
        return {}
    cached = _descriptions_cache.get(key)
    if cached is None:
        cached = _descriptions_cache[key] = _read_description_files(folder)
    return {table: dict(columns) for table, columns in cached.items()}


def _read_description_files(folder: Path) -> dict[str, dict[str, str]]:
    descriptions: dict[str, dict[str, str]] = {}
    try:
        files = sorted(folder.glob("*.csv"))
    except OSError:
        return descriptions
    for csv_path in files:
        try:
            text = _decode(csv_path.read_bytes())
            reader = csv.reader(io.StringIO(text, newline=""))
            header = [_clean(cell).lower().lstrip("\ufeff") for cell in next(reader, [])]
            columns: dict[str, str] = {}
            for cells in reader:
                row = dict(zip(header, cells))
                original = _clean(row.get("original_column_name"))
                if not original:
                    continue
                parts = []
                expanded = _clean(row.get("column_name"))
                if expanded and expanded.lower() != original.lower():
                    parts.append(expanded)
                for key in ("column_description", "value_description"):
                    value = _clean(row.get(key))
                    if value and value not in parts:
                        parts.append(value)
                columns[original] = "; ".join(parts)
            descriptions[csv_path.stem] = columns
        except (OSError, csv.Error, ValueError):
            continue
    return descriptions


# ----------------------------------------------------------------------------------------------------------------
# Tables a query reads
# ----------------------------------------------------------------------------------------------------------------
# sqlglot's scope walk grows with the square of the number of joins (340,000 characters of JOINs take about 30 s), so
# longer SQL (about ten times the longest benchmark query) is not walked: it reads no tables we can name.
MAX_WALKED_SQL_CHARS = 20_000


@functools.lru_cache(maxsize=8192)
def _tables_in_sql(sql: str, dialect: str = "sqlite") -> tuple[str, ...]:
    if len(sql) > MAX_WALKED_SQL_CHARS:
        return ()
    import sqlglot
    from sqlglot import exp
    from sqlglot.optimizer.scope import traverse_scope

    try:
        tree = sqlglot.parse_one(sql, read=dialect)
        names = set()
        for scope in traverse_scope(tree):
            for source in scope.sources.values():
                if isinstance(source, exp.Table) and source.name:
                    names.add(source.name.lower())
        # a breadth-first walk meets the outer query's FROM and JOINs before any subquery's
        found = (table.name.lower() for table in tree.find_all(exp.Table, bfs=True))
        return tuple(dict.fromkeys(name for name in found if name in names))
    except Exception:  # noqa: BLE001 - anything sqlglot cannot read reads no tables
        return ()


def tables_in_sql(sql, dialect: str = "sqlite") -> set[str]:
    """Lowercased, unquoted names of the tables a query reads (CTE names resolved, subqueries included).

    Empty when the SQL does not parse in ``dialect`` (sqlglot's: sqlite, duckdb, postgres), or is longer than
    ``MAX_WALKED_SQL_CHARS``.
    """
    return set(tables_in_reading_order(sql, dialect))


def tables_in_reading_order(sql, dialect: str = "sqlite") -> list[str]:
    """The tables of ``tables_in_sql`` in the order the query names them, its outer FROM and JOINs first."""
    if not isinstance(sql, str) or not sql.strip():
        return []
    return list(_tables_in_sql(sql, dialect))
