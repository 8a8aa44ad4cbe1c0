"""DuckDB files, read-only, with SQLite's sandbox guarantees.

Layers, each tested (``tests/test_engines_sandbox.py``):

* **Opening**: ``read_only``, so DuckDB refuses every write and creates no WAL. ``enable_external_access=false``: no
  file, URL or other database is read or written (``read_csv``, ``COPY``, ``ATTACH``, ``glob``, ``INSTALL``).
  Extensions are neither installed nor loaded automatically, community extensions are off, and
  ``lock_configuration`` then forbids every ``SET``/``PRAGMA`` that would change a setting. ``temp_directory`` is empty,
  so a large query never spills files next to the database; ``memory_limit`` and ``threads`` bound its work.
* **Statements**: DuckDB's own parser (``extract_statements``) must find exactly one statement, of type ``SELECT``
  (which covers ``WITH``, ``VALUES``, ``FROM t``, ``DESCRIBE`` and ``SUMMARIZE``). So ``CREATE TEMP TABLE``, which a
  read-only database still allows and which would shadow a real table for later queries, is refused too.
* **Functions**: DuckDB's own parse of the statement (``json_serialize_sql``) must call none of
  :data:`DENIED_FUNCTIONS`, which build values as large as their arguments ask inside one call that no interrupt
  reaches (``range(1000000000)``, ``list_resize``, ``repeat``, ``lpad``, ``printf``, ``regexp_replace``...), nor any
  that runs SQL given as a string (``query``, ``query_table``), where the calls inside would go unseen; nor any macro
  whose definition calls one (DuckDB's own ``histogram_values``, a file's own macros), nor read a view of the file
  whose definition does, since the parse shows a macro or view only by its name.
* **Deadlines**: the watchdog of :mod:`t2s.env.databases.deadlines` calls ``interrupt()`` on a statement past its
  deadline; fetching is capped in rows, cells and bytes (:func:`engine_base.fetch_capped`).
"""

from __future__ import annotations

import json

from t2s.env.databases.engine_base import Catalog, EngineConnection, fetch_capped, refused
from t2s.env.databases.results import QueryResult
from t2s.env.databases.sqltext import one_line_ddl
from t2s.errors import file_problem

MEMORY_LIMIT = "1GB"
THREADS = 1  # one thread: a query without ORDER BY returns its rows in the same order every time (strict EX)
CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "temp_directory": "",
    "memory_limit": MEMORY_LIMIT,
    "threads": THREADS,
    "lock_configuration": True,
}
# Functions that build a value as large as an argument asks, inside one call that no interrupt reaches (measured:
# `SELECT range(1000000000)` ran 79 s past an interrupt sent at 1 s, `list_resize([1], 1000000000)` 40 s; eight
# nested `regexp_replace(..., '', 'xxxxxxxxxx', 'g')` 17 s past a 5 s deadline), and the table functions that run
# SQL given as a string, whose calls this check cannot see (`query('SELECT range(300000000)')`: 8 s and 5 GB).
RUNS_SQL = frozenset({"query", "query_table", "json_execute_serialized_sql"})
DENIED_FUNCTIONS = RUNS_SQL | {"range", "generate_series", "list_resize", "array_resize", "repeat", "repeat_row",
                               "lpad", "rpad", "printf", "format", "bitstring", "regexp_replace"}
_WRITE_TYPES = {"INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "ATTACH", "DETACH", "COPY", "COPY_DATABASE",
                "EXPORT", "LOAD", "VACUUM", "TRANSACTION", "ANALYZE", "MERGE_INTO", "UPDATE_EXTENSIONS"}


def connect(path: str):
    """A read-only DuckDB connection under the sandbox's configuration (raises what DuckDB raises)."""
    import duckdb

    problem = file_problem(path, "database file")
    if problem:
        raise FileNotFoundError(problem)
    return duckdb.connect(path, read_only=True, config=dict(CONFIG))


def statement_refusal(sql: str) -> QueryResult | None:
    """None for one SELECT statement; else the refusal (DuckDB's parser decides what the statement is)."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        return QueryResult(error="Error: " + " ".join(str(exc).split()))
    if not statements:
        return QueryResult(error="Error: empty SQL")
    if len(statements) > 1:
        return QueryResult(error="Error: only one SQL statement per call is allowed")
    kind = str(statements[0].type).rpartition(".")[2]
    if kind == "SELECT":
        return None
    return refused(kind.replace("_", " "), write=kind in _WRITE_TYPES)


def _names(text: str, *, calls_only: bool) -> set[str]:
    """The lower-cased identifiers in ``text``, bare or double-quoted as DuckDB writes its definitions (``"range"(n)``),
    only those followed by ``(`` with ``calls_only``: one linear scan. Text in single quotes is no name."""
    found, i, end = set(), 0, len(text)
    while i < end:
        char = text[i]
        if char == "'":  # a string literal ('' inside is an escaped quote: two literals read as one)
            close = text.find("'", i + 1)
            i = end if close < 0 else close + 1
            continue
        if char == '"':
            close = text.find('"', i + 1)
            name, i = text[i + 1:close if close >= 0 else end], end if close < 0 else close + 1
        elif char.isalpha() or char == "_":
            start = i
            while i < end and (text[i].isalnum() or text[i] == "_"):
                i += 1
            name = text[start:i]
        else:
            i += 1
            continue
        after = i
        while after < end and text[after].isspace():
            after += 1
        if not calls_only or (after < end and text[after] == "("):
            found.add(name.lower())
    return found


def _denied_definitions(definitions: list[tuple[str, str, str]], functions: set[str], views: set[str]
                        ) -> tuple[set[str], set[str], set[str]]:
    """Which of ``definitions`` ((kind, name, SQL): kind "macro", "table_macro" or "view") call a function of
    ``functions`` or read a view of ``views``, directly or through one another: (scalar macros, table macros,
    views), the given sets included, found together until nothing more is."""
    read = [(kind, name.lower(), _names(sql or "", calls_only=True), _names(sql or "", calls_only=False))
            for kind, name, sql in definitions]
    scalars, tables, views = set(functions), set(functions), set(views)
    grew = True
    while grew:
        grew = False
        for kind, name, calls, words in read:
            found = {"macro": scalars, "table_macro": tables, "view": views}[kind]
            if name not in found and (calls & (scalars | tables) or words & views):
                found.add(name)
                grew = True
    return scalars, tables, views


_BUILT_IN: tuple[set[str], set[str]] | None = None  # DuckDB's own macros that call a denied function (scalar, table)


class DuckDBConnection(EngineConnection):
    engine = "duckdb"

    def __init__(self, path: str, label: str = ""):
        global _BUILT_IN
        self.conn = connect(path)
        self.label = label
        self._cursor = None
        macros = self.conn.execute("SELECT function_type, function_name, macro_definition, internal FROM "
                                   "duckdb_functions() WHERE macro_definition IS NOT NULL").fetchall()
        if _BUILT_IN is None:  # histogram_values, and histogram's table form (its aggregate form is harmless)
            _BUILT_IN = _denied_definitions([(k, n, d) for k, n, d, internal in macros if internal],
                                            set(DENIED_FUNCTIONS), set())[:2]
        # the file's own macros and views, which the statement's parse shows only by name
        own = [(k, n, d) for k, n, d, internal in macros if not internal]
        own += [("view", n, d) for n, d in self.conn.execute("SELECT view_name, sql FROM duckdb_views() "
                                                             "WHERE NOT internal").fetchall()]
        scalars, tables, self.denied_views = _denied_definitions(own, set(DENIED_FUNCTIONS), set())
        self.denied_scalars = scalars | _BUILT_IN[0]
        self.denied_tables = tables | _BUILT_IN[1] | self.denied_scalars

    def function_refusal(self, sql: str) -> QueryResult | None:
        """None when DuckDB's parse of the SELECT calls no denied function; else the refusal."""
        cursor = self.conn.cursor()
        try:
            tree = json.loads(cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
        finally:
            cursor.close()
        if tree.get("error"):
            return QueryResult(error="Error: " + str(tree.get("error_message") or "the query cannot be read"))
        stack = [(tree, False)]  # (a part of the parse, whether it is a table function's call)
        while stack:
            item, as_table = stack.pop()
            if isinstance(item, list):
                stack.extend((value, False) for value in item)
            elif isinstance(item, dict):
                name = item.get("function_name")
                if isinstance(name, str) and name.lower() in (self.denied_tables if as_table else self.denied_scalars):
                    why = ("it runs SQL given as text" if name.lower() in RUNS_SQL else "it builds values of any size"
                           if name.lower() in DENIED_FUNCTIONS else "it calls a function that builds values of any "
                           "size or runs SQL given as text")
                    return refused(f"function {name}() ({why})")
                table = item.get("table_name")
                if isinstance(table, str) and table.lower() in self.denied_views:
                    return refused(f"view {table} (it calls a function that builds values of any size or runs SQL "
                                   "given as text)")
                table_call = item.get("type") == "TABLE_FUNCTION"
                stack.extend((value, table_call and key == "function") for key, value in item.items()
                             if isinstance(value, (dict, list)))
        return None

    def run(self, sql, timeout, max_rows, max_cells, max_bytes) -> QueryResult:
        refusal = statement_refusal(sql) or self.function_refusal(sql)
        if refusal is not None:
            return refusal
        cursor = self.conn.cursor()
        self._cursor = cursor
        try:
            cursor.execute(sql)
            if cursor.description is None:
                return QueryResult()
            columns = [column[0] for column in cursor.description]
            rows, more, over_cap = fetch_capped(cursor, max_rows, max_cells, max_bytes)
            return QueryResult(columns, rows, more, None, False, False, over_cap)
        finally:
            self._cursor = None
            cursor.close()

    def error(self, exc, timeout) -> QueryResult:
        result = super().error(exc, timeout)
        lowered = (result.error or "").lower()
        if not result.timed_out and ("read-only mode" in lowered or "read only" in lowered):
            result.write_attempt = True
        return result

    def _interrupt(self) -> None:
        (self._cursor or self.conn).interrupt()

    def read_catalog(self) -> Catalog:
        cursor = self.conn.cursor()
        try:
            rows = [(name, sql) for name, sql, _, _ in cursor.execute(  # the tables, then the views
                "SELECT table_name, sql, 0, table_oid FROM duckdb_tables() WHERE NOT internal AND NOT temporary "
                "AND schema_name = current_schema() UNION ALL SELECT view_name, sql, 1, view_oid FROM duckdb_views() "
                "WHERE NOT internal AND NOT temporary AND schema_name = current_schema() ORDER BY 3, 4"
            ).fetchall()]
            tables = [name for name, _ in rows]
            ddl = {name: one_line_ddl(sql or "").rstrip(";") for name, sql in rows}
            columns: dict[str, list[tuple[str, str]]] = {name: [] for name in tables}
            comments: dict[str, dict[str, str]] = {}
            for table, column, kind, comment in cursor.execute(
                "SELECT table_name, column_name, data_type, comment FROM duckdb_columns() WHERE NOT internal "
                "AND schema_name = current_schema() ORDER BY table_oid, column_index"
            ).fetchall():
                if table in columns:
                    columns[table].append((column, kind or ""))
                    if comment:
                        comments.setdefault(table, {})[column] = str(comment)
            fks = []
            for table, src_cols, parent, dst_cols in cursor.execute(
                "SELECT table_name, constraint_column_names, referenced_table, referenced_column_names "
                "FROM duckdb_constraints() WHERE constraint_type = 'FOREIGN KEY' AND schema_name = current_schema() "
                "ORDER BY table_oid, constraint_index"
            ).fetchall():
                for src, dst in zip(src_cols or [], dst_cols or []):
                    fks.append((table, src, parent, dst))
            return Catalog(tables, ddl, columns, fks, comments)
        finally:
            cursor.close()
