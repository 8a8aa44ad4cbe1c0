"""Copying a SQLite database into DuckDB or PostgreSQL, and transpiling its gold SQL (``data convert``).

**Types follow what SQLite stores**, column by column: only integers (and NULLs) become ``BIGINT``; integers and reals
``DOUBLE``; anything holding text ``TEXT``/``VARCHAR`` (a BIRD ``date`` column holds text, and its gold SQL reads it
as text: ``SUBSTR(date, 1, 4)``); only blobs ``BLOB``/``BYTEA``. An all-NULL column takes its declared type's affinity.

**Keys carry over.** A primary key is declared when its rows are unique and not NULL. Foreign keys:

* PostgreSQL: every foreign key whose target columns are the target's primary key, added ``NOT VALID`` (SQLite
  never enforced them, and BIRD's rows do not always satisfy them; ``NOT VALID`` keeps the rows as they are);
* DuckDB enforces foreign keys on every insert and cannot add one later, so a foreign key is declared when its target
  is the target's primary key, every row satisfies it, and the tables can be created parents first.

Whatever is left out is listed in the report with its reason. **Names**: DuckDB keeps them as written (its names are
case-insensitive); PostgreSQL gets them in lowercase, so that bare names in SQL work as they do in SQLite.

**Gold SQL** is transpiled with sqlglot from ``sqlite`` to the engine's dialect, with two rewrites that keep SQLite's
meaning: ``LIKE`` becomes ``ILIKE`` (SQLite's ``LIKE`` ignores ASCII case) and, on PostgreSQL, identifiers are
lowercased like the tables they name.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

from t2s.env.databases.engine_base import quote

BIRD_TYPES = {"duckdb": {"int": "BIGINT", "real": "DOUBLE", "text": "VARCHAR", "blob": "BLOB"},
              "postgres": {"int": "BIGINT", "real": "DOUBLE PRECISION", "text": "TEXT", "blob": "BYTEA"}}


def transpile(sql: str, engine: str, columns: dict[str, set[str]] | None = None) -> str:
    """SQLite gold SQL in the engine's dialect (raises sqlglot's errors). ``columns``: the database's column names,
    lowercased, with the kinds they store. A double-quoted name that is none of them is a string, as SQLite reads it
    (``WHERE x = "Asia"``); a number compared with a column that holds only text is compared as text, as SQLite's
    text affinity does (``WHERE year_text = 2010``)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="sqlite")
    if columns is not None:
        _numbers_as_text(tree, columns, exp)
        aliases = {a.alias.lower() for a in tree.find_all(exp.Alias)}
        for column in list(tree.find_all(exp.Column)):
            name = column.this
            if (not column.table and isinstance(name, exp.Identifier) and name.quoted
                    and name.this.lower() not in columns and name.this.lower() not in aliases):
                column.replace(exp.Literal.string(name.this))
    for select in list(tree.find_all(exp.Select)):
        _pick_bare_columns(select, exp)
    if engine == "postgres":
        for identifier in tree.find_all(exp.Identifier):
            identifier.set("this", identifier.this.lower())

    def rewrite(node):
        if isinstance(node, exp.Like):
            return exp.ILike(this=node.this, expression=node.expression)
        if isinstance(node, exp.Anonymous) and str(node.this).lower() == "julianday" and len(node.expressions) == 1:
            moment = exp.cast(node.expressions[0].copy(), "timestamp")
            if engine == "duckdb":
                return exp.func("julian", moment)
            return exp.cast(exp.Extract(this=exp.var("JULIAN"), expression=moment), "double")
        return node

    tree = tree.transform(rewrite)
    return tree.sql(dialect=engine)


def _numbers_as_text(tree, columns: dict[str, set[str]], exp) -> None:
    def text_column(node) -> bool:
        return isinstance(node, exp.Column) and columns.get(node.name.lower()) == {"text"}

    def as_text(node) -> None:
        if isinstance(node, exp.Literal) and not node.is_string:
            node.replace(exp.Literal.string(node.this))
        elif isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            node.replace(exp.Literal.string("-" + node.this.this))

    def int_column(node) -> bool:
        return isinstance(node, exp.Column) and columns.get(node.name.lower()) == {"int"}

    for node in list(tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        left, right = node.this, node.expression
        if text_column(left) and int_column(right):  # a key held as text joined to one held as integers
            right.replace(exp.cast(right.copy(), "text"))
        elif int_column(left) and text_column(right):
            left.replace(exp.cast(left.copy(), "text"))
        elif text_column(left):
            as_text(right)
        elif text_column(right):
            as_text(left)
    for node in list(tree.find_all(exp.In, exp.Between)):
        if text_column(node.this):
            for value in list(node.expressions) + [node.args.get("low"), node.args.get("high")]:
                if value is not None:
                    as_text(value)


def _pick_bare_columns(select, exp) -> None:
    """SQLite's bare columns in a grouped query (``SELECT name ... GROUP BY id``) as ``MIN(name)``: the same value
    where the column depends on the group's key, which is how such gold SQL uses them (the comparison with SQLite's
    result drops any question where it is not)."""
    group = select.args.get("group")
    if group is None:
        return
    keys = {key.sql() for key in group.expressions}
    aliases = {e.alias_or_name for e in select.expressions if isinstance(e, exp.Alias)}
    places = [e for e in select.expressions if not (isinstance(e, exp.Alias) and e.alias in keys)]
    if select.args.get("order") is not None:
        places += [o.this for o in select.args["order"].expressions]
    if select.args.get("having") is not None:
        places.append(select.args["having"].this)
    for place in places:
        for column in list(place.find_all(exp.Column)):
            if column.sql() in keys or (not column.table and column.name in aliases):
                continue
            enclosing = column.find_ancestor(exp.Select)
            if enclosing is not select or column.find_ancestor(exp.AggFunc, exp.Window) is not None:
                continue
            if any(ancestor.sql() in keys for ancestor in _ancestors(column, place)):
                continue
            column.replace(exp.Min(this=column.copy()))


def _ancestors(node, stop):
    while node is not None and node is not stop:
        node = node.parent
        if node is not None:
            yield node


def target_name(name: str, engine: str) -> str:
    return name.lower() if engine == "postgres" else name


def _affinity(declared: str) -> str:
    declared = (declared or "").upper()
    if "INT" in declared:
        return "int"
    if any(word in declared for word in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return "real"
    if "BLOB" in declared:
        return "blob"
    return "text"


def _stored_kind(kinds: set[str], declared: str) -> str:
    kinds = kinds - {"null"}
    if not kinds:
        return _affinity(declared)
    if kinds == {"integer"}:
        return "int"
    if kinds <= {"integer", "real"}:
        return "real"
    if kinds == {"blob"}:
        return "blob"
    return "text"


class SourceTable:
    """One SQLite table: its columns with the kind each stores, its primary key, foreign keys and row count."""

    def __init__(self, conn: sqlite3.Connection, name: str):
        self.name = name
        info = conn.execute(f"PRAGMA table_info({quote(name)})").fetchall()
        self.columns = [row[1] for row in info]
        # one scan: the row count, and each column's stored kinds (typeof's words, comma-separated)
        kinds = ", ".join(f"group_concat(DISTINCT typeof({quote(row[1])}))" for row in info)
        self.rows, *found = conn.execute(f"SELECT count(*){', ' if kinds else ''}{kinds} FROM {quote(name)}").fetchone()
        self.kinds = {row[1]: _stored_kind(set(words.split(",")) if words else set(), row[2])
                      for row, words in zip(info, found, strict=True)}
        self.primary_key = [row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        by_lower = {column.lower(): column for column in self.columns}
        self.foreign_keys: list[tuple[list[str], str, list[str]]] = []  # (columns, parent table, parent columns)
        grouped: dict[int, tuple[str, list, list]] = {}
        for row in conn.execute(f"PRAGMA foreign_key_list({quote(name)})").fetchall():
            key_id, _, parent, src, dst = row[:5]
            entry = grouped.setdefault(key_id, (parent, [], []))
            entry[1].append(by_lower.get(str(src).lower(), src))
            entry[2].append(dst)
        for parent, srcs, dsts in grouped.values():
            self.foreign_keys.append((srcs, parent, dsts))

    def key_is_clean(self, conn: sqlite3.Connection) -> bool:
        """Whether the primary key's rows are unique and never NULL."""
        if not self.primary_key:
            return False
        cols = ", ".join(map(quote, self.primary_key))
        nulls = " OR ".join(f"{quote(c)} IS NULL" for c in self.primary_key)
        if conn.execute(f"SELECT 1 FROM {quote(self.name)} WHERE {nulls} LIMIT 1").fetchone():
            return False
        duplicate = conn.execute(f"SELECT 1 FROM {quote(self.name)} GROUP BY {cols} HAVING count(*) > 1 LIMIT 1")
        return duplicate.fetchone() is None


def read_source(conn: sqlite3.Connection) -> list[SourceTable]:
    names = [row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid")]
    return [SourceTable(conn, name) for name in names]


def plan_keys(conn, tables: list[SourceTable], engine: str, notes: list[str]) -> tuple[list, dict, dict]:
    """(tables in creation order, {table: primary key or []}, {table: [(cols, parent, parent cols)]}) to declare."""
    by_lower = {t.name.lower(): t for t in tables}
    keys = {}
    for table in tables:
        clean = table.key_is_clean(conn)
        keys[table.name] = table.primary_key if clean else []
        if table.primary_key and not clean:
            notes.append(f"{table.name}: primary key ({', '.join(table.primary_key)}) left out: its rows are not "
                         "unique and non-NULL")
    foreign: dict[str, list] = {t.name: [] for t in tables}
    for table in tables:
        for srcs, parent_name, dsts in table.foreign_keys:
            parent = by_lower.get(str(parent_name).lower())
            what = f"{table.name}({', '.join(srcs)}) -> {parent_name}"
            if parent is None:
                notes.append(f"foreign key {what} left out: no table {parent_name}")
                continue
            dsts = [d if d is not None else (parent.primary_key[i] if i < len(parent.primary_key) else None)
                    for i, d in enumerate(dsts)]
            lower_key = [c.lower() for c in keys[parent.name]]
            if None in dsts or sorted(str(d).lower() for d in dsts) != sorted(lower_key) or not lower_key:
                notes.append(f"foreign key {what} left out: it does not reference {parent.name}'s primary key")
                continue
            dsts = [next(c for c in parent.columns if c.lower() == str(d).lower()) for d in dsts]
            if [table.kinds.get(s) for s in srcs] != [parent.kinds[d] for d in dsts]:
                notes.append(f"foreign key {what} left out: its columns hold another type than {parent.name}'s key")
                continue
            if engine == "duckdb" and (parent is table or _orphans(conn, table, srcs, parent, dsts)):
                reason = "it references its own table" if parent is table else "some rows break it"
                notes.append(f"foreign key {what} left out: {reason} (DuckDB enforces foreign keys)")
                continue
            foreign[table.name].append((srcs, parent.name, dsts))
    order = tables
    if engine == "duckdb":
        order = _parents_first(tables, foreign, notes)
    return order, keys, foreign


def _orphans(conn, table, srcs, parent, dsts) -> bool:
    join = " AND ".join(f"c.{quote(s)} = p.{quote(d)}" for s, d in zip(srcs, dsts))
    present = " AND ".join(f"c.{quote(s)} IS NOT NULL" for s in srcs)
    missing = f"p.{quote(dsts[0])} IS NULL"
    sql = (f"SELECT 1 FROM {quote(table.name)} c LEFT JOIN {quote(parent.name)} p ON {join} "
           f"WHERE {present} AND {missing} LIMIT 1")
    return conn.execute(sql).fetchone() is not None


def _parents_first(tables, foreign, notes) -> list:
    placed: list = []
    done: set[str] = set()
    pending = list(tables)
    while pending:
        ready = [t for t in pending if all(parent in done for _, parent, _ in foreign[t.name])]
        if not ready:  # a cycle: the first pending table loses its keys to pending tables
            table = pending[0]
            kept = [fk for fk in foreign[table.name] if fk[1] in done]
            for fk in foreign[table.name]:
                if fk not in kept:
                    notes.append(f"foreign key {table.name}({', '.join(fk[0])}) -> {fk[1]} left out: a cycle of keys")
            foreign[table.name] = kept
            ready = [table]
        for table in ready:
            placed.append(table)
            done.add(table.name)
            pending.remove(table)
    return placed


def create_statement(table: SourceTable, engine: str, key: list[str], foreign: list) -> str:
    name = lambda n: quote(target_name(n, engine))  # noqa: E731
    parts = [f"{name(c)} {BIRD_TYPES[engine][table.kinds[c]]}" for c in table.columns]
    if key:
        parts.append(f"PRIMARY KEY ({', '.join(map(name, key))})")
    if engine == "duckdb":
        for srcs, parent, dsts in foreign:
            parts.append(f"FOREIGN KEY ({', '.join(map(name, srcs))}) REFERENCES {name(parent)} "
                         f"({', '.join(map(name, dsts))})")
    return f"CREATE TABLE {name(table.name)} ({', '.join(parts)})"


def foreign_key_statements(table: SourceTable, foreign: list) -> list[str]:
    """PostgreSQL's ``ALTER TABLE ... ADD FOREIGN KEY ... NOT VALID`` for each key of a table."""
    name = lambda n: quote(n.lower())  # noqa: E731
    return [f"ALTER TABLE {name(table.name)} ADD FOREIGN KEY ({', '.join(map(name, srcs))}) REFERENCES "
            f"{name(parent)} ({', '.join(map(name, dsts))}) NOT VALID" for srcs, parent, dsts in foreign]


def cast_row(row, kinds: list[str]) -> tuple:
    """A SQLite row as the target columns take it (text columns get text; real columns floats)."""
    out = []
    for value, kind in zip(row, kinds):
        if value is None:
            out.append(None)
        elif kind == "text" and not isinstance(value, str):
            out.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else _sqlite_text(value))
        elif kind == "real":
            out.append(float(value))
        else:
            out.append(value)
    return tuple(out)


def _sqlite_text(value) -> str:
    """A number as SQLite's CAST(x AS TEXT) writes it (``1.0`` for a real, ``5`` for an integer)."""
    if isinstance(value, float):
        text = repr(value)
        return text if ("e" in text or "." in text or "n" in text) else text + ".0"
    return str(value)


def column_kinds(tables: list[SourceTable]) -> Counter:
    return Counter(kind for table in tables for kind in table.kinds.values())
