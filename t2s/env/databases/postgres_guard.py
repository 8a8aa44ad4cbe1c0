"""What a model's statement may be on PostgreSQL, decided from PostgreSQL's own parse (``pglast``, libpg_query).

The server is a user's, and its role may be able to do more than it should, so read-only is enforced on our side
first. A statement runs only when all of these hold:

* it is exactly one statement, a ``SELECT`` (which covers ``WITH``, ``VALUES`` and set operations);
* it writes nowhere: no ``SELECT ... INTO``, no row locks (``FOR UPDATE``/``FOR SHARE``), no data-modifying ``WITH``;
* every function it calls, in any expression or ``FROM``, is on :data:`ALLOWED_FUNCTIONS` (written bare or in
  ``pg_catalog``): ordinary scalar, aggregate and window functions. So ``pg_sleep``, ``pg_read_file``, ``lo_import``,
  ``dblink``, ``set_config``, ``query_to_xml``, ``pg_terminate_backend`` and any function of the user's own are refused;
  so are ``repeat``, ``lpad``, ``rpad`` and ``format``, which build values as long as their argument says;
* it reads no system catalog (``pg_catalog``, ``information_schema``, ``pg_toast``, or a ``pg_*`` relation), where
  a powerful role could read password hashes or settings;
* every type it names (a cast, ``XMLTABLE``'s columns) is on :data:`ALLOWED_TYPES`: a cast runs the type's input
  function, which no function check sees. So ``16385::regclass`` and ``10::regrole`` (catalog names) and casts to
  types of the user's own are refused.

:mod:`t2s.env.databases.postgres_engine` then runs it inside ``BEGIN READ ONLY ... ROLLBACK`` as a cursor
(``DECLARE ... CURSOR FOR``), under a local ``statement_timeout``.
"""

from __future__ import annotations

import json

ALLOWED_FUNCTIONS = frozenset("""
count sum avg min max stddev stddev_pop stddev_samp variance var_pop var_samp string_agg array_agg bool_and bool_or
every bit_and bit_or corr covar_pop covar_samp regr_slope regr_intercept percentile_cont percentile_disc mode
json_agg jsonb_agg json_object_agg jsonb_object_agg
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
abs ceil ceiling floor round trunc sign sqrt cbrt power pow exp ln log log10 mod div pi degrees radians sin cos tan
asin acos atan atan2 random greatest least width_bucket scale factorial gcd lcm
length char_length character_length octet_length bit_length lower upper initcap substr substring trim btrim ltrim
rtrim replace translate position strpos split_part left right concat concat_ws reverse md5 ascii chr starts_with
to_char to_number to_date to_timestamp regexp_replace regexp_match regexp_matches regexp_like regexp_count
regexp_substr regexp_instr regexp_split_to_array regexp_split_to_table quote_literal quote_ident
date_part date_trunc extract age make_date make_time make_timestamp make_interval justify_days justify_hours
justify_interval isfinite date_bin timezone now
int2 int4 int8 float4 float8 numeric text date time timestamp bool varchar
generate_series unnest array_length cardinality array_position array_to_string string_to_array
json_extract_path json_extract_path_text jsonb_extract_path jsonb_extract_path_text json_array_length
jsonb_array_length json_typeof jsonb_typeof to_json to_jsonb row_to_json json_build_object jsonb_build_object
json_build_array jsonb_build_array json_each json_each_text jsonb_each jsonb_each_text json_array_elements
jsonb_array_elements json_array_elements_text jsonb_array_elements_text
""".split())
# the types a statement may name (as PostgreSQL's parser spells them: ``integer`` is ``int4``, ``double precision``
# ``float8``), arrays of them included
ALLOWED_TYPES = frozenset("""
bool int2 int4 int8 float4 float8 numeric money text varchar bpchar char name date time timetz timestamp timestamptz
interval json jsonb bytea uuid bit varbit
""".split())
SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_toast"})
_WRITE_STATEMENTS = {"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "TruncateStmt", "CopyStmt"}
_PREFIX_WRITES = ("Create", "Drop", "Alter", "Grant", "Rename", "Comment", "Reindex", "Vacuum", "Cluster", "Refresh",
                  "Import", "Lock", "Security", "Reassign")


def _kind_words(kind: str) -> str:
    """``CreateTableAsStmt`` as ``CREATE TABLE AS``."""
    name = kind[:-4] if kind.endswith("Stmt") else kind
    words, current = [], ""
    for char in name:
        if char.isupper() and current:
            words.append(current)
            current = ""
        current += char
    words.append(current)
    return " ".join(words).upper()


def _is_write(kind: str) -> bool:
    return kind in _WRITE_STATEMENTS or kind.startswith(_PREFIX_WRITES)


def check(sql: str) -> tuple[str, bool] | None:
    """None when the statement may run; else (the reason in words, whether it is a write attempt)."""
    from pglast import parser

    try:
        tree = json.loads(parser.parse_sql_json(sql))
    except Exception as exc:  # noqa: BLE001 - pglast's ParseError, or anything its parser raises
        message = " ".join(str(exc).split())
        return f"syntax error: {message}", False
    statements = tree.get("stmts") or []
    if not statements:
        return "an empty statement", False
    if len(statements) > 1:
        return "more than one statement (one SQL statement per call)", False
    top = statements[0].get("stmt") or {}
    kind = next(iter(top), "")
    if kind != "SelectStmt":
        if kind == "VariableSetStmt":
            return "changing settings (SET)", False
        if kind in ("TransactionStmt", "DoStmt", "CallStmt", "ExplainStmt", "VariableShowStmt", "LoadStmt",
                    "ListenStmt", "NotifyStmt", "DeclareCursorStmt", "FetchStmt", "PrepareStmt", "ExecuteStmt"):
            return _kind_words(kind), kind in ("DoStmt", "CallStmt", "LoadStmt")
        return _kind_words(kind) or "this statement", _is_write(kind)
    return _walk(top)


def _walk(node) -> tuple[str, bool] | None:
    """The first thing in a parsed SELECT that the sandbox refuses, or None."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key in _WRITE_STATEMENTS:
                return f"a data-modifying statement inside the query ({_kind_words(key)})", True
            if key == "intoClause":
                return "SELECT INTO (it creates a table)", True
            if key == "lockingClause":
                return "row locks (FOR UPDATE / FOR SHARE)", True
            if key == "FuncCall":
                refusal = _function(value)
                if refusal:
                    return refusal
            elif key == "RangeVar":
                refusal = _relation(value)
                if refusal:
                    return refusal
            elif key == "typeName" and isinstance(value, dict):
                refusal = _type(value)
                if refusal:
                    return refusal
            if isinstance(value, (dict, list)):
                stack.append(value)
    return None


def _names(parts) -> list[str]:
    return [str((part.get("String") or {}).get("sval", "")) for part in parts or [] if isinstance(part, dict)]


def _allowed(parts, allowed: frozenset) -> tuple[bool, str]:
    """(whether a parsed name, bare or in ``pg_catalog``, is in ``allowed``; the name as written)."""
    names = _names(parts)
    name = names[-1].lower() if names else ""
    schema = names[-2].lower() if len(names) > 1 else "pg_catalog"
    return schema == "pg_catalog" and name in allowed, ".".join(names) or "?"


def _function(call: dict) -> tuple[str, bool] | None:
    allowed, written = _allowed(call.get("funcname"), ALLOWED_FUNCTIONS)
    return None if allowed else (f"function {written}()", False)


def _type(type_name: dict) -> tuple[str, bool] | None:
    allowed, written = _allowed(type_name.get("names"), ALLOWED_TYPES)
    return None if allowed else (f"the type {written}", False)


def _relation(relation: dict) -> tuple[str, bool] | None:
    schema = str(relation.get("schemaname") or "").lower()
    name = str(relation.get("relname") or "")
    if relation.get("catalogname"):
        return f"another database ({relation['catalogname']})", False
    if schema in SYSTEM_SCHEMAS or (not schema and name.lower().startswith("pg_")):
        return f"the system catalog ({'.'.join(filter(None, (schema, name)))})", False
    return None
