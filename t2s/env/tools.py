"""The tools the model calls (docs/design.md §4): the eight exec_plan tools and the sibling dialect, over one database.

Every call returns a ``ToolResult`` and never raises. Errors are text beginning ``Error:``. Identifiers are quoted,
unknown names get "did you mean" suggestions, cells and outputs are capped with visible markers, and a query never
fetches more rows than it shows plus one.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

from t2s.env import databases, tool_schemas
from t2s.env.protocol import LABEL_SQL_CHARS, OBSERVATION_CHAR_CAP, cap_text, shorten
from t2s.env.schema import get_schema, quote_identifier, read_descriptions

CELL_CHARS = 200
QUERY_ROWS = 5
SAMPLE_LIMIT = tool_schemas.limit_bounds("exec_plan", "sample_rows")  # (default, max)
DISTINCT_LIMIT = tool_schemas.limit_bounds("exec_plan", "distinct_values")
MIN_TOOL_TIMEOUT = 0.05  # seconds: a call near the end of the tool-time budget still gets this much
_clock = time.perf_counter


@dataclass(slots=True)
class ToolResult:
    tool: str
    label: str  # "[label]" heading in the observation: the tool with its table or shortened SQL
    text: str
    error: bool = False
    write_attempt: bool = False
    seconds: float = 0.0
    sql: str | None = None  # the SQL of run_query / run_sql / submit calls
    role: str = "other"  # "query" (counts for failed-query streaks and fallback), "submit" or "other"


# ----------------------------------------------------------------------------------------------------------------
# Formatting


def format_cell(value) -> str:
    kind = type(value)
    if kind is int or kind is float:
        return str(value)
    if value is None:
        return "None"
    if kind is not str:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return f"<blob {len(bytes(value))} bytes>"
        value = str(value)
    if "\n" in value or "\r" in value:
        value = value.replace("\r", "\\r").replace("\n", "\\n")
    if len(value) > CELL_CHARS:
        value = value[:CELL_CHARS] + f"...[+{len(value) - CELL_CHARS} chars]"
    return value


def format_row(row) -> str:
    """One row, pipe-separated, with every cell formatted by ``format_cell``."""
    line = " | ".join(map(str, row))  # SQLite gives int, float, str, bytes or None; only str and bytes need care
    if _plain(line, 0) and (len(line) <= CELL_CHARS or _short_cells(row)):
        return line
    return " | ".join([format_cell(v) for v in row])


def _plain(text: str, newlines: int) -> bool:
    """No cell in ``text`` (``newlines`` line breaks expected) has a line break or shows a blob: ``str`` is exact.

    Each two- or seven-character search runs only when its last or first character occurs at all (a one-character
    search is a plain memory scan, several times quicker).
    """
    return (
        text.count("\n") == newlines and "\r" not in text
        and ("'" not in text or "b'" not in text) and ('"' not in text or 'b"' not in text)
        and ("<" not in text or "<memory" not in text)
    )


def _short_cells(row) -> bool:
    return max(map(len, map(str, row)), default=0) <= CELL_CHARS


_ROW_TEMPLATES = [" | ".join(["%s"] * width) for width in range(40)]  # %s formats a cell exactly as str() does


def _joined(rows: list) -> list[str]:
    """Each row's cells as ``str``, joined by `` | `` (tuples of one width, as SQLite gives them: one %-template)."""
    width = len(rows[0])
    template = _ROW_TEMPLATES[width] if width < len(_ROW_TEMPLATES) else " | ".join(["%s"] * width)
    # a row that is no tuple, or of another width, fails the template (up to one cell wide, it is checked first)
    if type(rows[0]) is tuple and (width > 1 or set(map(type, rows)) == {tuple}):
        try:
            return list(map(template.__mod__, rows))
        except TypeError:
            pass
    return [" | ".join(map(str, row)) for row in rows]


def format_table(columns, rows) -> str:
    """Header plus rows, pipe-separated (each line as ``format_row`` writes it)."""
    lines = _joined([tuple(columns), *rows])
    text = "\n".join(lines)
    if not _plain(text, len(lines) - 1):
        text = "\n".join([format_row(columns), *map(format_row, rows)])
    elif len(text) > CELL_CHARS and max(map(len, lines)) > CELL_CHARS:  # only long lines need their cells measured
        for index, line in enumerate(lines):
            if len(line) > CELL_CHARS:
                lines[index] = format_row(rows[index - 1] if index else columns)
        text = "\n".join(lines)
    return text if rows else text + "\n(no rows)"


def _suggest(kind: str, name, options: list[str]) -> str:
    hint = f" Did you mean: {', '.join(options)}?" if options else ""
    return f"Error: no {kind} named {str(name)!r}.{hint}"


# ----------------------------------------------------------------------------------------------------------------
# Argument checking

_STR, _INT = "text", "integer"


class ArgumentError(Exception):
    pass


def _usage(spec: dict[str, tuple[str, bool]]) -> str:
    return ", ".join(f"{k} ({t}{'' if req else ', optional'})" for k, (t, req) in spec.items()) or "no arguments"


def _check_args(tool: str, args, spec: dict[str, tuple[str, bool]]) -> dict:
    """Validate ``args`` against ``spec`` {name: (type, required)}; raises ArgumentError with an `Error:` text."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ArgumentError(f"Error: {tool} args must be a JSON object; {tool} takes {_usage(spec)}.")
    extra = [k for k in args if k not in spec]
    if extra:
        raise ArgumentError(
            f"Error: {tool} got unexpected argument(s) {', '.join(map(repr, extra))}; it takes {_usage(spec)}."
        )
    for key, (kind, required) in spec.items():
        if key not in args:
            if required:
                missing = [k for k, (_, req) in spec.items() if req and k not in args]
                raise ArgumentError(
                    f"Error: {tool} is missing argument(s) {', '.join(map(repr, missing))}; it takes {_usage(spec)}."
                )
        elif kind == _STR and not isinstance(args[key], str):
            raise ArgumentError(f"Error: {tool} argument {key!r} must be a string, got {type(args[key]).__name__}.")
    return args


def _limit(tool: str, value, bounds: tuple[int, int]) -> tuple[int, str]:
    """A row limit clamped to [1, max] (with a note when clamped); a non-number is an ArgumentError."""
    default, most = bounds
    if value is None:
        return default, ""
    if type(value) is int and 1 <= value <= most:  # the usual: a limit in range
        return value, ""
    number = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value == value and abs(value) < 1e18:
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value.strip()) < 19:
        number = int(value.strip())
    if number is None:
        raise ArgumentError(f"Error: {tool} argument 'limit' must be an integer from 1 to {most}, got {value!r}.")
    clamped = min(max(number, 1), most)
    note = f"(limit {number} is outside 1..{most}; using {clamped})\n" if clamped != number else ""
    return clamped, note


# ----------------------------------------------------------------------------------------------------------------
# The toolbox


_METHODS = {  # tool -> the Toolbox method that runs it (arguments and descriptions: t2s.env.tool_schemas)
    "list_tables": "_list_tables", "describe_table": "_describe_table", "foreign_keys": "_foreign_keys",
    "join_path": "_join_path", "sample_rows": "_sample_rows", "distinct_values": "_distinct_values",
    "run_query": "_run_query", "submit_sql": "_submit",
    "inspect_schema": "_inspect_schema", "run_sql": "_run_query", "submit": "_submit",
}  # fmt: skip

# dialect -> {tool: (method, argument spec {name: (type, required)})}, the query tool, the submit tool
DIALECTS: dict[str, tuple[dict[str, tuple[str, dict]], str, str]] = {
    dialect: (
        {tool.name: (_METHODS[tool.name], tool_schemas.argument_spec(tool)) for tool in tools},
        tool_schemas.QUERY_TOOLS[dialect],
        tool_schemas.SUBMIT_TOOLS[dialect],
    )
    for dialect, tools in tool_schemas.TOOLS.items()
}


class Toolbox:
    """The tools of one dialect over one database. ``call(name, args, timeout)`` never raises."""

    def __init__(self, db, *, dialect: str = "exec_plan", tool_timeout: float = 5.0, column_descriptions: bool = False):
        if dialect not in DIALECTS:
            raise ValueError(f"Error: unknown tool dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
        self.db = db
        self.engine = getattr(db, "engine", "sqlite")  # sqlite, duckdb or postgres (t2s.env.databases.engines)
        self.dialect = dialect
        self.tool_timeout = tool_timeout
        self.column_descriptions = column_descriptions
        self._schema = None
        self._descriptions = None
        self.tools, self.query_tool, self.submit_tool = DIALECTS[dialect]
        self._entries = _dispatch(type(self), dialect)

    # -- plumbing ---------------------------------------------------------------------------------------------------

    @property
    def schema(self):
        if self._schema is None:
            self._schema = get_schema(self.db)
        return self._schema

    def role(self, tool: str) -> str:
        if tool == self.submit_tool:
            return "submit"
        return "query" if tool == self.query_tool else "other"

    def call(self, tool, args, *, timeout: float | None = None) -> ToolResult:
        """Run one tool call; ``timeout`` (seconds) may shorten the tool timeout (near the episode's time budget)."""
        started = _clock()
        entry = self._entries.get(tool) if type(tool) is str else None
        if entry is None:
            name = tool if isinstance(tool, str) else str(tool)
            entry = self._entries.get(name)
            if entry is None:
                text = cap_text(f"Error: unknown tool {name!r}. The tools are: {', '.join(self.tools)}.")
                return ToolResult(name, name, text, True, False, _clock() - started, None, "other")
            tool = name
        method, spec, role, text_keys = entry
        label = tool
        try:
            checked = args
            if type(args) is not dict or args.keys() != spec.keys():  # the usual call has exactly the spec's keys
                checked = _check_args(tool, args, spec)
            else:
                for key in text_keys:
                    if type(args[key]) is not str:  # a text argument that is no str: the full check says so
                        checked = _check_args(tool, args, spec)
            if checked:
                label = _label(tool, checked)
            text, error, write_attempt, sql = method(self, tool, checked, timeout)
        except Exception as exc:  # an argument error, or any failure: a tool never raises into the rollout
            if isinstance(exc, ArgumentError):
                text = str(exc)
            else:
                text = f"Error: {tool} failed: {type(exc).__name__}: {exc}"
            error, write_attempt, sql = True, False, None
            if role != "other" and isinstance(args, dict):  # the SQL as sent, when it is text
                sql = args.get("sql")
                sql = sql if isinstance(sql, str) else None
        if len(text) > OBSERVATION_CHAR_CAP:
            text = cap_text(text, OBSERVATION_CHAR_CAP)
        return ToolResult(tool, label, text, error, write_attempt, _clock() - started, sql, role)

    def _timeout(self, timeout: float | None) -> float:
        """The tool timeout, shortened to ``timeout`` (near the episode's time budget) but never under the minimum."""
        limit = self.tool_timeout
        if timeout is None:
            return limit
        if timeout < limit:
            limit = timeout
        return limit if limit > MIN_TOOL_TIMEOUT else MIN_TOOL_TIMEOUT

    def _table(self, name: str) -> str:
        schema = self._schema if self._schema is not None else self.schema
        table = schema.resolve_table(name)
        if table is None:
            raise ArgumentError(_suggest("table", name, schema.closest_tables(name)))
        return table

    def _column(self, table: str, name: str) -> str:
        column = self.schema.resolve_column(table, name)
        if column is None:
            raise ArgumentError(_suggest(f"column in table {table!r}", name, self.schema.closest_columns(table, name)))
        return column

    @staticmethod
    def _failed(raw, sql: str | None = None) -> tuple:
        text = str(raw.error or "Error: the query failed.")
        if not text.startswith("Error:"):
            text = "Error: " + text
        return text, True, bool(raw.write_attempt), sql

    # -- exec_plan tools --------------------------------------------------------------------------------------------
    # Each takes (tool, checked args, time left in the episode's tool budget or None) and returns its outcome
    # (text, error, write_attempt, sql) or raises ArgumentError; ``call`` builds the result.

    def _list_tables(self, tool, args, timeout):
        tables = self.schema.tables
        return ("\n".join(tables) if tables else "(the database has no tables)"), False, False, None

    def _describe_table(self, tool, args, timeout):
        table = self._table(args["table_name"])
        text = self.schema.ddl(table)
        if self.column_descriptions:
            notes = self._column_notes(table)
            if notes:
                text += "\n" + notes
        return text, False, False, None

    def _column_notes(self, table: str) -> str:
        if self._descriptions is None:
            self._descriptions = {}
            path = getattr(self.db, "path", None)
            if self.engine != "sqlite" and self.schema.comments:  # the catalog's column comments (data convert
                self._descriptions = {k.lower(): v for k, v in self.schema.comments.items()}  # writes BIRD's there)
            elif path and self.engine != "postgres":
                try:
                    self._descriptions = {k.lower(): v for k, v in read_descriptions(Path(path).parent).items()}
                except Exception:
                    self._descriptions = {}
        notes = self._descriptions.get(table.lower(), {})
        return "\n".join(f"-- {col}: {text}" for col, text in notes.items() if text)

    def _foreign_keys(self, tool, args, timeout):
        table = self._table(args["table_name"])
        keys = self.schema.foreign_keys(table)
        if not keys:
            return f"(no foreign keys from or to {table})", False, False, None
        return "\n".join(f"{a}.{b} -> {c}.{d}" for a, b, c, d in keys), False, False, None

    def _join_path(self, tool, args, timeout):
        table_a, table_b = self._table(args["table_a"]), self._table(args["table_b"])
        path = self.schema.join_path(table_a, table_b)
        if path is None:
            return f"no foreign-key path between {table_a} and {table_b}", False, False, None
        if not path:
            return f"{table_a} and {table_b} are the same table: no join needed", False, False, None
        return "\n".join(path), False, False, None

    def _sample_rows(self, tool, args, timeout):
        table = self._table(args["table_name"])
        limit, note = _limit(tool, args.get("limit"), SAMPLE_LIMIT)
        sql = f"SELECT * FROM {quote_identifier(table, self.engine)} LIMIT {limit}"
        raw = databases.run_tool_query(self.db, sql, max_rows=limit, timeout=self._timeout(timeout))
        if raw.error is not None:
            return self._failed(raw)
        return note + format_table(raw.columns, raw.rows), False, False, None

    def _distinct_values(self, tool, args, timeout):
        table = self._table(args["table_name"])
        column = self._column(table, args["column_name"])
        limit, note = _limit(tool, args.get("limit"), DISTINCT_LIMIT)
        col = quote_identifier(column, self.engine)
        sql = (
            f"SELECT {col}, COUNT(*) AS count FROM {quote_identifier(table, self.engine)} GROUP BY {col} "
            f"ORDER BY count DESC, {col} LIMIT {limit + 1}"
        )
        raw = databases.run_tool_query(self.db, sql, max_rows=limit, timeout=self._timeout(timeout))
        if raw.error is not None:
            return self._failed(raw)
        text = note + format_table(raw.columns, raw.rows)
        if raw.more:
            text += f"\n... (showing the {limit} most frequent values; more exist)"
        return text, False, False, None

    def _run_query(self, tool, args, timeout):
        sql = args["sql"]
        if not sql or sql.isspace():
            return f"Error: {tool} needs a non-empty 'sql' string.", True, False, sql
        raw = databases.run_tool_query(self.db, sql, max_rows=QUERY_ROWS, timeout=self._timeout(timeout))
        if raw.error is not None:
            return self._failed(raw, sql)
        text = format_table(raw.columns, raw.rows)
        if raw.more:
            text += f"\n... (showing first {QUERY_ROWS} rows; more rows exist)"
        return text, False, False, sql

    def _submit(self, tool, args, timeout):
        sql = args["sql"]
        if not sql or sql.isspace():
            return f"Error: {tool} needs a non-empty 'sql' string.", True, False, sql
        return "Submitted.", False, False, sql

    # -- sibling dialect --------------------------------------------------------------------------------------------

    def _inspect_schema(self, tool, args, timeout):
        if args.get("table_name") is not None:
            return self.schema.ddl(self._table(args["table_name"])), False, False, None
        tables = self.schema.tables
        text = "\n".join(self.schema.ddl(t) for t in tables) or "(the database has no tables)"
        return text, False, False, None

    # -- the final-SQL check ------------------------------------------------------------------------------------------

    def executes(self, sql, *, timeout: float | None = None) -> tuple[bool, bool]:
        """(runs without error, was a write attempt): a cheap, row-capped run on the tool connection."""
        if not isinstance(sql, str) or not sql.strip():
            return False, False
        try:
            result = databases.run_tool_query(self.db, sql, max_rows=1, timeout=timeout or self.tool_timeout)
        except Exception:
            return False, False
        return result.ok, bool(result.write_attempt)


def _label(tool: str, args: dict) -> str:
    """The ``[label]`` heading of a call: the tool with its table(s) or its shortened SQL."""
    sql = args.get("sql")
    if sql is not None:
        return f"{tool}: {shorten(sql, LABEL_SQL_CHARS)}"
    table = args.get("table_name")
    if table is not None:
        column = args.get("column_name")
        if column is not None:
            return f"{tool}: {shorten(table, 40)}.{shorten(column, 40)}"
        return f"{tool}: {shorten(table, 40)}"
    if "table_a" in args:
        return f"{tool}: {shorten(args['table_a'], 40)} -> {shorten(args['table_b'], 40)}"
    return tool


@functools.lru_cache(maxsize=None)
def _dispatch(toolbox_class: type, dialect: str) -> dict[str, tuple]:
    """{tool: (method, argument spec, role, text arguments)} of one dialect, looked up once per Toolbox class."""
    tools, query_tool, submit_tool = DIALECTS[dialect]
    roles = {query_tool: "query", submit_tool: "submit"}
    return {
        name: (
            getattr(toolbox_class, method), spec, roles.get(name, "other"),
            tuple(key for key, (kind, _) in spec.items() if kind == _STR),
        )
        for name, (method, spec) in tools.items()
    }

