"""Databases on a PostgreSQL server, with SQLite's sandbox guarantees enforced on our side.

The server and its role are the user's: the role may be able to write, read files or change settings. So:

* every statement first passes :mod:`t2s.env.databases.postgres_guard`: one ``SELECT``, allowed functions only, no
  system catalog, nothing that writes or locks, read from PostgreSQL's own parse;
* it then runs inside ``BEGIN READ ONLY`` with ``SET LOCAL statement_timeout``, as a server-side cursor
  (``DECLARE ... CURSOR FOR``, which accepts nothing but a query), and the transaction always ends in ``ROLLBACK``;
* rows come over in bounded batches (``fetchmany``), capped in rows, cells and bytes, so a huge result is never sent
  whole; the deadline watchdog cancels a statement still running past its deadline (a fetch too);
* no parallel workers, so that a query without ``ORDER BY`` returns its rows in the same order every time, as the
  strict metric needs;
* the session itself is read-only by default (``default_transaction_read_only``), and connects with a 5 s timeout.

docs/engines.md gives the read-only role to create, so that even a bug here could not write.
"""

from __future__ import annotations

import functools

from t2s.env.databases import postgres_guard
from t2s.env.databases.engine_base import Catalog, EngineConnection, fetch_capped, quote_identifier, refused
from t2s.env.databases.results import QueryResult

CONNECT_TIMEOUT = 5  # seconds
# Read-only transactions, and no parallel plans, so that rows come in one order every time (strict EX). The guard
# refuses SET and set_config, so a statement cannot change either.
_OPTIONS = ("-c default_transaction_read_only=on -c idle_in_transaction_session_timeout=60000 "
            "-c max_parallel_workers_per_gather=0")


def connect(dsn: str):
    """A psycopg connection whose transactions are ``READ ONLY`` (raises what psycopg raises)."""
    import psycopg

    conn = psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT, options=_OPTIONS, application_name="t2s")
    conn.read_only = True
    return conn


def redact(dsn: str) -> str:
    """``dsn`` with its password hidden, for messages: a URL's (``user:pw@`` and ``?password=``) and a key-value
    string's (``password=...``, read by libpq's own parser); a string neither parser reads is not shown at all."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    if not dsn.startswith(("postgresql://", "postgres://")):
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            values = conninfo_to_dict(dsn)
        except Exception:  # noqa: BLE001 - psycopg's errors for a string libpq cannot read: show none of it
            return "a PostgreSQL connection string (not shown: libpq cannot read it)"
        return make_conninfo(**{**values, "password": "***"}) if "password" in values else dsn
    try:
        parts = urlsplit(dsn)
        query = parse_qsl(parts.query, keep_blank_values=True)
        hidden = [(key, "***" if key == "password" else value) for key, value in query]
    except ValueError:
        return "postgresql://..."
    netloc = parts.netloc if parts.password is None else parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    if netloc == parts.netloc and hidden == query:
        return dsn
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(hidden, safe="*") if hidden != query else
                                     parts.query))


class PostgresConnection(EngineConnection):
    engine = "postgres"

    def __init__(self, dsn: str, label: str = ""):
        self.conn = connect(dsn)
        self.label = label

    @property
    def broken(self) -> bool:
        return self.conn.closed

    def run(self, sql, timeout, max_rows, max_cells, max_bytes) -> QueryResult:
        refusal = postgres_guard.check(sql)
        if refusal is not None:
            reason, write = refusal
            if reason.startswith("syntax error"):
                return QueryResult(error=f"Error: {reason}")
            return refused(reason, write=write)
        conn = self.conn
        try:
            conn.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
            cursor = conn.cursor(name="t2s_query")
            try:
                cursor.execute(sql)
                if cursor.description is None:
                    return QueryResult()
                columns = [column.name for column in cursor.description]
                rows, more, over_cap = fetch_capped(cursor, max_rows, max_cells, max_bytes)
                return QueryResult(columns, rows, more, None, False, False, over_cap)
            finally:
                try:
                    cursor.close()
                except Exception:  # noqa: BLE001 - a cancelled or failed transaction: the rollback ends it
                    pass
        finally:
            self._rollback()

    def _rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception:  # noqa: BLE001 - a broken connection is reopened on the next use
            pass

    def error(self, exc, timeout) -> QueryResult:
        text = " ".join(str(exc).split())
        if "statement timeout" in text or "canceling statement" in text:
            self.timed_out = True
        result = super().error(exc, timeout)
        if not result.timed_out and "read-only transaction" in text:
            result.write_attempt = True
        return result

    def _interrupt(self) -> None:
        self.conn.cancel_safe(timeout=1.0)

    def read_catalog(self) -> Catalog:
        """Tables of the first schema on the search path (``public`` by default), their columns, keys and comments."""
        conn = self.conn
        try:
            schema = conn.execute("SELECT current_schema()").fetchone()[0] or "public"
            tables = [row[0] for row in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.oid", (schema,)).fetchall()]
            columns: dict[str, list[tuple[str, str]]] = {name: [] for name in tables}
            not_null: dict[str, set[str]] = {name: set() for name in tables}
            comments: dict[str, dict[str, str]] = {}
            for table, column, kind, required, comment in conn.execute(
                "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
                "col_description(c.oid, a.attnum) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND a.attnum > 0 "
                "AND NOT a.attisdropped ORDER BY c.oid, a.attnum", (schema,)).fetchall():
                if table in columns:
                    columns[table].append((column, kind))
                    if required:
                        not_null[table].add(column)
                    if comment:
                        comments.setdefault(table, {})[column] = comment
            keys: dict[str, list[str]] = {}
            constraints = []
            for table, kind, src_cols, parent, dst_cols in conn.execute(
                "SELECT c.relname, k.contype, ARRAY(SELECT attname FROM unnest(k.conkey) WITH ORDINALITY u(n, i) "
                "JOIN pg_attribute ON attrelid = k.conrelid AND attnum = u.n ORDER BY u.i), p.relname, "
                "ARRAY(SELECT attname FROM unnest(k.confkey) WITH ORDINALITY u(n, i) JOIN pg_attribute "
                "ON attrelid = k.confrelid AND attnum = u.n ORDER BY u.i) FROM pg_constraint k "
                "JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_class p ON p.oid = k.confrelid WHERE n.nspname = %s AND k.contype IN ('p', 'f') "
                "ORDER BY c.oid, k.contype DESC, k.oid", (schema,)).fetchall():
                if kind == "p":
                    keys[table] = list(src_cols)
                else:
                    constraints.append((table, list(src_cols), parent, list(dst_cols)))
        finally:
            self._rollback()
        fks = [(table, src, parent, dst) for table, srcs, parent, dsts in constraints for src, dst in zip(srcs, dsts)]
        ddl = {name: _ddl(name, columns[name], not_null[name], keys.get(name, []),
                          [key for key in constraints if key[0] == name]) for name in tables}
        return Catalog(tables, ddl, columns, fks, comments)


_name = functools.partial(quote_identifier, engine="postgres")  # bare when plain, lowercase and not reserved


def _ddl(table, columns, not_null, primary_key, fks) -> str:
    """A one-line ``CREATE TABLE`` rebuilt from the catalog (PostgreSQL keeps no DDL text)."""
    parts = [f"{_name(col)} {kind}" + (" NOT NULL" if col in not_null and col not in primary_key else "")
             for col, kind in columns]
    if primary_key:
        parts.append(f"PRIMARY KEY ({', '.join(map(_name, primary_key))})")
    for _, srcs, parent, dsts in fks:
        parts.append(f"FOREIGN KEY ({', '.join(map(_name, srcs))}) REFERENCES {_name(parent)} "
                     f"({', '.join(map(_name, dsts))})")
    return f"CREATE TABLE {_name(table)} ({', '.join(parts)})"
