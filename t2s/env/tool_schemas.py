"""The one declaration of every tool: name, arguments with their types, and descriptions (docs/design.md §3, §4).

Both call formats read it:
- ``json``: the system prompt's tool list (``prompt_lines``) and the toolbox's argument check (``argument_spec``);
- ``native``: the OpenAI-style function schemas (``function_schemas``) that the chat template renders through
  ``tools=`` and that ``--endpoint-mode tools`` sends, and the argument types the native call parser applies.

The tool set is the dialect: ``exec_plan`` (eight tools) or ``sibling`` (the 9B sibling's four).
"""

from __future__ import annotations

from dataclasses import dataclass

DIALECTS = ("exec_plan", "sibling")
TOOL_FORMATS = ("json", "native")
_PROMPT_TYPES = {"string": "TEXT", "integer": "INTEGER"}


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # a JSON-schema type: "string" or "integer"
    description: str
    required: bool = True
    default: int | None = None
    maximum: int | None = None

    def schema(self) -> dict:
        out: dict = {"type": self.type, "description": self.description}
        if self.type == "integer" and self.maximum is not None:
            out.update(minimum=1, maximum=self.maximum)
        if self.default is not None:
            out["default"] = self.default
        return out

    def prompt_text(self) -> str:
        """``"name": TYPE`` as the json-format tool list writes it, with the default and bound when there are some."""
        text = f'"{self.name}": {_PROMPT_TYPES[self.type]}'
        if self.default is not None:
            text += f" (default {self.default}, at most {self.maximum})"
        return text


@dataclass(frozen=True)
class Tool:
    name: str
    description: str  # what the tool does (the native schema's description)
    returns: str  # what it gives back (the text after "->" in the json-format tool list)
    params: tuple[Param, ...] = ()

    def function_schema(self) -> dict:
        """The OpenAI / chat-template function declaration."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.schema() for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                },
            },
        }

    def prompt_line(self) -> str:
        """``- name: {args} -> returns``; a tool whose arguments are all optional shows ``{} or {args}``."""
        args = "{" + ", ".join(p.prompt_text() for p in self.params) + "}"
        if self.params and not any(p.required for p in self.params):
            args = "{} or " + args
        return f"- {self.name}: {args} -> {self.returns}"


_TABLE = Param("table_name", "string", "The table's name, as the database spells it.")
_SQL = Param("sql", "string", "One SQLite SELECT statement.")
_SAMPLE_LIMIT = Param("limit", "integer", "How many rows to show.", required=False, default=5, maximum=20)
_SAMPLE_ROWS = Tool("sample_rows", "Show some rows of a table, pipe-separated, with a header.",
                    "some rows of the table", (_TABLE, _SAMPLE_LIMIT))
_SUBMIT = "submits your final query and ends the episode"

TOOLS: dict[str, tuple[Tool, ...]] = {
    "exec_plan": (
        Tool("list_tables", "List the names of the database's tables.", "the names of the tables"),
        Tool("describe_table", "Show a table's CREATE TABLE statement.", "the table's CREATE TABLE statement",
             (_TABLE,)),
        Tool("foreign_keys", "Show the foreign keys from and to a table, one a.col -> b.col per line.",
             "the foreign keys from and to the table, as a.col -> b.col", (_TABLE,)),
        Tool("join_path", "Show the join conditions that link two tables through foreign keys.",
             "the join conditions that link two tables through foreign keys",
             (Param("table_a", "string", "The first table."), Param("table_b", "string", "The second table."))),
        _SAMPLE_ROWS,
        Tool("distinct_values", "Show a column's distinct values, most frequent first, with their counts.",
             "the column's values, most frequent first, with counts",
             (_TABLE, Param("column_name", "string", "The column's name."),
              Param("limit", "integer", "How many values to show.", required=False, default=20, maximum=50))),
        Tool("run_query", "Run a read-only SELECT query and show its header and first 5 rows.",
             "the header and first 5 rows of a read-only SELECT query", (_SQL,)),
        Tool("submit_sql", "Submit the final query. This ends the episode at once.", _SUBMIT, (_SQL,)),
    ),
    "sibling": (
        Tool("inspect_schema", "Show the CREATE TABLE statements of every table, or of one table.",
             "CREATE TABLE statements of every table, or of one table",
             (Param("table_name", "string", "Only this table (default: every table).", required=False),)),
        _SAMPLE_ROWS,
        Tool("run_sql", "Run a read-only query and show its header and first 5 rows.",
             "the header and first 5 rows of a read-only query", (_SQL,)),
        Tool("submit", "Submit the final query. This ends the episode at once.", _SUBMIT, (_SQL,)),
    ),
}
QUERY_TOOLS = {"exec_plan": "run_query", "sibling": "run_sql"}
SUBMIT_TOOLS = {"exec_plan": "submit_sql", "sibling": "submit"}


def check_dialect(dialect: str) -> str:
    if dialect not in TOOLS:
        raise ValueError(f"Error: unknown tool dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    return dialect


def check_tool_format(tool_format: str) -> str:
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"Error: unknown tool format {tool_format!r}; expected one of {', '.join(TOOL_FORMATS)}")
    return tool_format


def function_schemas(dialect: str, engine: str = "sqlite") -> list[dict]:
    """The dialect's tools as OpenAI-style function declarations (``tools=`` of a chat template or a request); the
    ``sql`` argument names the engine's SQL dialect."""
    schemas = [tool.function_schema() for tool in TOOLS[check_dialect(dialect)]]
    if engine != "sqlite":
        from t2s.env.databases.engine_base import ENGINE_NAMES

        for schema in schemas:
            sql = schema["function"]["parameters"]["properties"].get("sql")
            if sql is not None:
                sql["description"] = sql["description"].replace("SQLite", ENGINE_NAMES[engine])
    return schemas


def prompt_lines(dialect: str) -> str:
    """The json-format system prompt's tool list, one ``- name: {args} -> result`` line per tool."""
    return "\n".join(tool.prompt_line() for tool in TOOLS[check_dialect(dialect)])


def argument_spec(tool: Tool) -> dict[str, tuple[str, bool]]:
    """``{argument: ("text" | "integer", required)}``: what the toolbox checks a call's arguments against."""
    return {p.name: ("text" if p.type == "string" else "integer", p.required) for p in tool.params}


def limit_bounds(dialect: str, tool_name: str) -> tuple[int, int]:
    """(default, maximum) of a tool's ``limit`` argument."""
    tool = next(t for t in TOOLS[dialect] if t.name == tool_name)
    limit = next(p for p in tool.params if p.name == "limit")
    return limit.default, limit.maximum
