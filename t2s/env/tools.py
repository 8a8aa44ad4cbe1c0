"""The tools the model calls (docs/design.md §4): the eight exec_plan tools and the sibling dialect, over one database.

Every call returns a ``ToolResult`` and never raises. Errors are text beginning ``Error:``. Identifiers are quoted,
unknown names get "did you mean" suggestions, cells and outputs are capped with visible markers, and a query never
fetches more rows than it shows plus one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from t2s.env import databases, tool_schemas
from t2s.env.protocol import LABEL_SQL_CHARS, OBSERVATION_CHAR_CAP, cap_text, shorten
from t2s.env.schema import get_schema, quote_identifier, read_descriptions

CELL_CHARS = 200
QUERY_ROWS = 5
SAMPLE_LIMIT = tool_schemas.limit_bounds("exec_plan", "sample_rows")  # (default, max)
DISTINCT_LIMIT = tool_schemas.limit_bounds("exec_plan", "distinct_values")
MIN_TOOL_TIMEOUT = 0.05  # seconds: a call near the end of the tool-time budget still gets this much


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


class Outcome(NamedTuple):
    """What a tool method gives back; ``Toolbox.call`` adds the tool, its label and role, and the time taken."""

    text: str
    error: bool = False
    write_attempt: bool = False
    sql: str | None = None  # the SQL of run_query / run_sql / submit calls


# ----------------------------------------------------------------------------------------------------------------
# Formatting


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``, ``\\r``): a value or a name of the database shown on a line of
    its own, which a break inside would make look like two."""
    if "\n" in text or "\r" in text:
        text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text


def format_cell(value) -> str:
    """One cell as the model sees it: a blob by its size, line breaks escaped, long text cut with a marker."""
    kind = type(value)
    if kind is int or kind is float:
        return str(value)
    if value is None:
        return "None"
    if kind is not str:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return f"<blob {len(bytes(value))} bytes>"
        value = str(value)
    value = one_line(value)
    if len(value) > CELL_CHARS:
        value = value[:CELL_CHARS] + f"...[+{len(value) - CELL_CHARS} chars]"
    return value


def format_row(row) -> str:
    """One row, pipe-separated, with every cell formatted by ``format_cell``."""
    return " | ".join(map(format_cell, row))


def format_table(columns, rows) -> str:
    """Header plus rows, pipe-separated (each line as ``format_row`` writes it)."""
    text = "\n".join([format_row(columns), *map(format_row, rows)])
    return text if rows else text + "\n(no rows)"


def _suggest(kind: str, name, options: list[str]) -> str:
    hint = f" Did you mean: {', '.join(options)}?" if options else ""
    return f"Error: no {kind} named {str(name)!r}.{hint}"


# ----------------------------------------------------------------------------------------------------------------
# Argument checking

_STR = "text"  # a text argument's type in an argument spec (t2s.env.tool_schemas.argument_spec)


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
    number = None
    if isinstance(value, bool):
        pass
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


class ToolSpec(NamedTuple):
    method: str  # the Toolbox method that runs the tool
    arguments: dict[str, tuple[str, bool]]  # {name: (type, required)}, from t2s.env.tool_schemas


class Dialect(NamedTuple):
    tools: dict[str, ToolSpec]
    query_tool: str
    submit_tool: str


_METHODS = {  # tool -> the Toolbox method that runs it (arguments and descriptions: t2s.env.tool_schemas)
    "list_tables": "_list_tables", "describe_table": "_describe_table", "foreign_keys": "_foreign_keys",
    "join_path": "_join_path", "sample_rows": "_sample_rows", "distinct_values": "_distinct_values",
    "run_query": "_run_query", "submit_sql": "_submit",
    "inspect_schema": "_inspect_schema", "run_sql": "_run_query", "submit": "_submit",
}  # fmt: skip

DIALECTS: dict[str, Dialect] = {
    dialect: Dialect(
        {tool.name: ToolSpec(_METHODS[tool.name], tool_schemas.argument_spec(tool)) for tool in tools},
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
        started = time.perf_counter()
        name = tool if isinstance(tool, str) else str(tool)
        spec = self.tools.get(name)
        if spec is None:
            text = cap_text(f"Error: unknown tool {name!r}. The tools are: {', '.join(self.tools)}.")
            return ToolResult(tool=name, label=name, text=text, error=True, seconds=time.perf_counter() - started)
        role = self.role(name)
        label = name
        try:
            checked = _check_args(name, args, spec.arguments)
            if checked:
                label = _label(name, checked)
            outcome = getattr(self, spec.method)(name, checked, timeout)
        except Exception as exc:  # an argument error, or any failure: a tool never raises into the rollout
            text = str(exc) if isinstance(exc, ArgumentError) else f"Error: {name} failed: {type(exc).__name__}: {exc}"
            sql = args.get("sql") if role != "other" and isinstance(args, dict) else None  # the SQL as sent, if text
            outcome = Outcome(text, error=True, sql=sql if isinstance(sql, str) else None)
        text = outcome.text
        room = OBSERVATION_CHAR_CAP - len(label) - 3  # its "[label]" line: a lone result is never cut again there
        if len(text) > room:
            text = cap_text(text, max(room, OBSERVATION_CHAR_CAP // 2))
        return ToolResult(tool=name, label=label, text=text, error=outcome.error, write_attempt=outcome.write_attempt,
                          seconds=time.perf_counter() - started, sql=outcome.sql, role=role)

    def _timeout(self, timeout: float | None) -> float:
        """The tool timeout, shortened to ``timeout`` (near the episode's time budget) but never under the minimum."""
        if timeout is None:
            return self.tool_timeout
        return max(min(self.tool_timeout, timeout), MIN_TOOL_TIMEOUT)

    def _table(self, name: str) -> str:
        table = self.schema.resolve_table(name)
        if table is None:
            raise ArgumentError(_suggest("table", name, self.schema.closest_tables(name)))
        return table

    def _column(self, table: str, name: str) -> str:
        column = self.schema.resolve_column(table, name)
        if column is None:
            raise ArgumentError(_suggest(f"column in table {table!r}", name, self.schema.closest_columns(table, name)))
        return column

    def _query(self, sql: str, max_rows: int, timeout: float | None):
        """A query on the tool connection, under the tool timeout: its ``QueryResult``."""
        return databases.run_tool_query(self.db, sql, max_rows=max_rows, timeout=self._timeout(timeout))

    @staticmethod
    def _failed(raw, sql: str | None = None) -> Outcome:
        text = str(raw.error or "Error: the query failed.")
        if not text.startswith("Error:"):
            text = "Error: " + text
        return Outcome(text, error=True, write_attempt=bool(raw.write_attempt), sql=sql)

    # -- exec_plan tools --------------------------------------------------------------------------------------------
    # Each takes (tool, checked args, time left in the episode's tool budget or None) and returns its Outcome or
    # raises ArgumentError; ``call`` builds the result.

    def _list_tables(self, tool, args, timeout) -> Outcome:
        tables = self.schema.tables
        return Outcome("\n".join(map(one_line, tables)) if tables else "(the database has no tables)")

    def _describe_table(self, tool, args, timeout) -> Outcome:
        table = self._table(args["table_name"])
        text = self.schema.ddl(table)
        if self.column_descriptions:
            notes = self._column_notes(table)
            if notes:
                text += "\n" + notes
        return Outcome(text)

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
        return "\n".join(f"-- {one_line(col)}: {' '.join(str(text).split())}" for col, text in notes.items()
                         if text)  # one line each

    def _foreign_keys(self, tool, args, timeout) -> Outcome:
        table = self._table(args["table_name"])
        keys = self.schema.foreign_keys(table)
        if not keys:
            return Outcome(f"(no foreign keys from or to {table})")
        return Outcome("\n".join(one_line(f"{a}.{b} -> {c}.{d}") for a, b, c, d in keys))

    def _join_path(self, tool, args, timeout) -> Outcome:
        table_a, table_b = self._table(args["table_a"]), self._table(args["table_b"])
        path = self.schema.join_path(table_a, table_b)
        if path is None:
            return Outcome(f"no foreign-key path between {table_a} and {table_b}")
        if not path:
            return Outcome(f"{table_a} and {table_b} are the same table: no join needed")
        return Outcome("\n".join(map(one_line, path)))

    def _sample_rows(self, tool, args, timeout) -> Outcome:
        table = self._table(args["table_name"])
        limit, note = _limit(tool, args.get("limit"), SAMPLE_LIMIT)
        raw = self._query(f"SELECT * FROM {quote_identifier(table, self.engine)} LIMIT {limit}", limit, timeout)
        if raw.error is not None:
            return self._failed(raw)
        cut = f"\n... (showing {len(raw.rows)} rows; the rows are too large to read further)" if raw.over_cap else ""
        return Outcome(note + format_table(raw.columns, raw.rows) + cut)

    def _distinct_values(self, tool, args, timeout) -> Outcome:
        table = self._table(args["table_name"])
        column = self._column(table, args["column_name"])
        limit, note = _limit(tool, args.get("limit"), DISTINCT_LIMIT)
        col = quote_identifier(column, self.engine)
        sql = (
            f"SELECT {col}, COUNT(*) AS count FROM {quote_identifier(table, self.engine)} GROUP BY {col} "
            f"ORDER BY count DESC, {col} LIMIT {limit + 1}"
        )
        raw = self._query(sql, limit, timeout)
        if raw.error is not None:
            return self._failed(raw)
        text = note + format_table(raw.columns, raw.rows)
        if raw.over_cap:
            text += f"\n... (showing the {len(raw.rows)} most frequent values; they are too large to read further)"
        elif raw.more:
            text += f"\n... (showing the {limit} most frequent values; more exist)"
        return Outcome(text)

    def _run_query(self, tool, args, timeout) -> Outcome:
        sql = args["sql"]
        if not sql or sql.isspace():
            return Outcome(f"Error: {tool} needs a non-empty 'sql' string.", error=True, sql=sql)
        raw = self._query(sql, QUERY_ROWS, timeout)
        if raw.error is not None:
            return self._failed(raw, sql)
        text = format_table(raw.columns, raw.rows)
        if raw.over_cap:
            text += f"\n... (showing the first {len(raw.rows)} rows; the result is too large to read further)"
        elif raw.more:
            text += f"\n... (showing first {QUERY_ROWS} rows; more rows exist)"
        return Outcome(text, sql=sql)

    def _submit(self, tool, args, timeout) -> Outcome:
        sql = args["sql"]
        if not sql or sql.isspace():
            return Outcome(f"Error: {tool} needs a non-empty 'sql' string.", error=True, sql=sql)
        return Outcome("Submitted.", sql=sql)

    # -- sibling dialect --------------------------------------------------------------------------------------------

    def _inspect_schema(self, tool, args, timeout) -> Outcome:
        if args.get("table_name") is not None:
            return Outcome(self.schema.ddl(self._table(args["table_name"])))
        return Outcome("\n".join(self.schema.ddl(t) for t in self.schema.tables) or "(the database has no tables)")

    # -- the final-SQL check ------------------------------------------------------------------------------------------

    def executes(self, sql, *, timeout: float | None = None) -> tuple[bool, bool]:
        """(runs without error, was a write attempt) on the tool connection, under the tool's time limit: its first
        rows; then, where more rows follow, the whole of it under the scoring caps, so that an error at a later row
        rules it out. That whole run running out of time, or past the caps, is no error: the query's first rows came,
        and scoring gives it its own, longer deadline."""
        if not isinstance(sql, str) or not sql.strip():
            return False, False
        timeout = timeout or self.tool_timeout
        try:
            first = databases.run_tool_query(self.db, sql, max_rows=1, timeout=timeout)
            if not first.ok or not first.more:  # it failed, or its first rows were all of it
                return first.ok, bool(first.write_attempt)
            whole = databases.run_tool_query(self.db, sql, max_rows=None, timeout=timeout)
        except Exception:
            return False, False
        return whole.ok or bool(whole.timed_out), bool(first.write_attempt or whole.write_attempt)


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
