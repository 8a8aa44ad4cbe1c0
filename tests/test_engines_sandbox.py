"""The attack corpus on DuckDB and PostgreSQL: nothing a model sends changes the database, creates a file, reaches a
file, the network, an extension or a setting, or runs past its deadline.

DuckDB proves it with the file's checksum (and the folder's listing); PostgreSQL with every table's row count and a
snapshot of the catalog (relations, functions, extensions, roles, large objects, settings). The PostgreSQL server runs
as its superuser, so every refusal is the sandbox's own, not a missing privilege.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from t2s.env import databases

DEADLINE = 1.0  # seconds given to each runaway statement
SLACK = 2.0  # what "never past the deadline" allows on a loaded 2-core machine

WRITES = [
    "INSERT INTO clubs (club_id, club_name) VALUES (999, 'x')",
    "UPDATE clubs SET club_name = 'x'",
    "DELETE FROM clubs",
    "DROP TABLE rides",
    "CREATE TABLE evil (a INT)",
    "CREATE TEMP TABLE clubs AS SELECT 1 AS club_id",
    "CREATE VIEW v AS SELECT 1",
    "ALTER TABLE clubs ADD COLUMN evil INT",
    "TRUNCATE clubs",
    "CREATE INDEX i ON clubs (city)",
    "SELECT 1; DELETE FROM clubs",
    "WITH d AS (DELETE FROM clubs RETURNING *) SELECT * FROM d",
    "SELECT * INTO evil FROM clubs",
]
COMMON_OTHERS = [
    "BEGIN",
    "COMMIT",
    "SET memory_limit = '100GB'",
    "SET search_path = evil",
    "RESET ALL",
    "VACUUM",
    "CHECKPOINT",
]
DUCKDB_ATTACKS = WRITES + COMMON_OTHERS + [
    "COPY clubs TO '{tmp}/out.csv'",
    "COPY clubs FROM '{tmp}/in.csv'",
    "EXPORT DATABASE '{tmp}/export'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    "ATTACH '{tmp}/other.duckdb' AS other",
    "ATTACH ':memory:' AS m",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA enable_profiling",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "SELECT * FROM query('DROP TABLE clubs')",
    "CALL checkpoint()",
    "SELECT * FROM sqlite_scan('{tmp}/x.db', 't')",
    "SELECT range(1000000000)",
    "SELECT list_resize([1], 1000000000)",
    "SELECT repeat('x', 1000000000)",
    "SELECT lpad('x', 1000000000, 'y')",
    "SELECT printf('%1000000000d', 1)",
    "SELECT len(x) FROM (SELECT unnest(generate_series(1, 1000000000)) AS x)",
    "SELECT bitstring('1', 1000000000)",
    "SELECT len(x) FROM query('SELECT range(300000000) AS x')",  # 8 s past its deadline and 5 GB, unrefused
    "SELECT * FROM QUERY_TABLE('clubs')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT range(300000000)'))",
    "SELECT length(" + "regexp_replace(" * 8 + "'x'" + ", '', 'xxxxxxxxxx', 'g')" * 8 + ")",  # 17 s, 1 GB
    # a built-in macro that calls generate_series and query_table: 9.6 s past its deadline and 7.9 GB, unrefused
    "SELECT count(*) FROM histogram_values(clubs, club_id, bin_count := 1000000000, technique := 'equi-height')",
]
POSTGRES_ATTACKS = WRITES + COMMON_OTHERS + [
    "COPY clubs TO '{tmp}/out.csv'",
    "COPY clubs FROM '{tmp}/in.csv'",
    "COPY clubs TO PROGRAM 'touch {tmp}/pwned'",
    "COPY (SELECT 1) TO STDOUT",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_catalog.pg_read_binary_file('/etc/passwd')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT lo_export(1, '{tmp}/pwned')",
    "SELECT * FROM pg_ls_dir('.')",
    "DO $$ BEGIN EXECUTE 'DROP TABLE rides'; END $$",
    "SELECT dblink_exec('dbname=postgres', 'CREATE TABLE pwned (a int)')",
    "SELECT * FROM dblink('dbname=postgres', 'SELECT 1') AS t(a int)",
    "SELECT set_config('statement_timeout', '0', false)",
    "SELECT current_setting('data_directory')",
    "SELECT query_to_xml('DELETE FROM clubs RETURNING *', true, true, '')",
    "SELECT pg_terminate_backend(pg_backend_pid())",
    "SELECT * FROM pg_authid",
    "SELECT * FROM pg_catalog.pg_shadow",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM clubs FOR UPDATE",
    "CREATE EXTENSION file_fdw",
    "LOAD 'dblink'",
    "ALTER SYSTEM SET fsync = off",
    "CREATE ROLE evil SUPERUSER",
    "GRANT ALL ON clubs TO PUBLIC",
    "LISTEN x",
    "PREPARE p AS DELETE FROM clubs",
    "SELECT repeat('x', 500000000)",
    "SELECT lpad('x', 500000000)",
    "SELECT format('%500000000s', 'x')",
    "SELECT * FROM other_db.public.clubs",
    "SELECT 16385::regclass, 10::regrole",  # a cast runs the type's input function: catalog names
    "SELECT CAST('pg_authid' AS regclass)",
    "SELECT * FROM XMLTABLE('/a' PASSING '<a>pg_authid</a>' COLUMNS x regclass PATH '.')",
]
RUNAWAYS = [
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT string_agg(CAST(n AS TEXT), ',') FROM r",
    "SELECT length(string_agg(a.route_name || b.route_name, ',')) FROM routes a, routes b, rides c, rides d",
    "SELECT count(*) FROM rides a, rides b, rides c, rides d",
    "SELECT count(*) FROM (SELECT * FROM rides a CROSS JOIN rides b CROSS JOIN rides c CROSS JOIN rides d) x "
    "WHERE random() > 2",
]
POSTGRES_RUNAWAYS = RUNAWAYS + ["SELECT pg_sleep(30)", "SELECT count(*) FROM generate_series(1, 10000000000)"]


def _attack(ref, sqls, tmp) -> list:
    """Every attack through both the tool and the scoring paths; each must come back as an Error: text."""
    results = []
    for sql in sqls:
        sql = sql.replace("{tmp}", str(tmp))
        for run in (lambda s: databases.run_tool_query(ref, s, max_rows=5),
                    lambda s: databases.run_scoring_query(ref, s, timeout=5)):
            result = run(sql)
            assert result.error is not None and result.error.startswith("Error:"), (sql, result)
            results.append((sql, result))
    return results


def _runaways(ref, sqls) -> None:
    for sql in sqls:
        started = time.monotonic()
        result = databases.run_tool_query(ref, sql, max_rows=5, timeout=DEADLINE)
        took = time.monotonic() - started
        assert result.error is not None, sql
        assert took < DEADLINE + SLACK, (sql, took, result.error)


def _listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture()
def duckdb_target(duckdb_demo, tmp_path):
    folder, _ = duckdb_demo
    copy = tmp_path / "db"
    copy.mkdir()
    target = copy / "cycling_club.duckdb"
    shutil.copy(folder / "dev_databases" / "cycling_club" / "cycling_club.duckdb", target)
    os.chmod(target, 0o644)
    databases.close_thread_connections()
    yield databases.benchmark_db(str(target), "cycling_club"), copy
    databases.close_thread_connections()


def test_duckdb_attacks_change_nothing_and_create_no_file(duckdb_target, tmp_path):
    ref, folder = duckdb_target
    before, listing = databases.file_checksum(ref.path), _listing(folder)
    (tmp_path / "in.csv").write_text("club_id,club_name\n999,x\n")
    results = _attack(ref, DUCKDB_ATTACKS, tmp_path)
    writes = {sql for sql, result in results if result.write_attempt}
    expected = {"INSERT INTO clubs (club_id, club_name) VALUES (999, 'x')", "DELETE FROM clubs", "DROP TABLE rides"}
    assert expected <= writes
    assert databases.run_tool_query(ref, "SELECT count(*) FROM clubs", max_rows=1).rows == [(6,)]
    _runaways(ref, RUNAWAYS)
    databases.close_thread_connections()
    assert databases.file_checksum(ref.path) == before
    assert _listing(folder) == listing
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "export").exists()
    assert not (tmp_path / "other.duckdb").exists()


def test_a_duckdb_files_own_views_and_macros_cannot_hide_a_denied_function(tmp_path):
    """A user's file (``ask --db``) may define views and macros over ``range`` or ``repeat``: the statement names only
    the view or macro, so each is refused by what its definition calls, through other views and macros as well
    (each one ran 40 to 60 s past a 5 s deadline); views and macros that call nothing denied still run."""
    import duckdb

    path = tmp_path / "own.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute("""
            CREATE TABLE t AS SELECT 1 AS id;
            CREATE VIEW big AS SELECT "range"(300000000) AS r;
            CREATE VIEW on_big AS SELECT count(*) AS n FROM big;
            CREATE VIEW "Long" AS SELECT repeat('x', 900000000) AS r;
            CREATE MACRO m(n) AS range(n);
            CREATE MACRO through_m(n) AS len(m(n));
            CREATE MACRO tm(n) AS TABLE SELECT * FROM range(n);
            CREATE VIEW fine AS SELECT id, 'range(9)' AS text FROM t;
            CREATE MACRO twice(n) AS n * 2;
            CREATE MACRO from_big() AS TABLE SELECT * FROM big;
            CREATE MACRO count_big() AS (SELECT count(*) FROM on_big);
        """)
    before = databases.file_checksum(path)
    ref = databases.user_db(path)
    refused = [("SELECT count(*) FROM big", "view big"), ("SELECT n FROM on_big", "view on_big"),
               ('SELECT * FROM "long"', "view long"), ("SELECT len(m(300000000))", "function m()"),
               ("SELECT through_m(300000000)", "function through_m()"), ("SELECT * FROM tm(5)", "function tm()"),
               ("SELECT * FROM from_big()", "function from_big()"), ("SELECT count_big()", "function count_big()"),
               ("SELECT * FROM histogram(t, id, bin_count := 1000000000)", "function histogram()")]
    for sql, name in refused:
        for result in (databases.run_tool_query(ref, sql, max_rows=5),
                       databases.run_scoring_query(ref, sql, timeout=5)):
            assert result.error and result.error.startswith(f"Error: not allowed in the read-only sandbox: {name}"), \
                (sql, result)
            assert not result.timed_out
    fine = databases.run_tool_query(ref, "SELECT id, text, twice(id) FROM fine", max_rows=5)
    assert fine.rows == [(1, "range(9)", 2)], fine
    # DuckDB's histogram aggregate shares its name with a table macro over histogram_values: the aggregate runs
    assert databases.run_tool_query(ref, "SELECT histogram(id) FROM t", max_rows=5).rows == [('{"1": 1}',)]
    databases.close_thread_connections()
    assert databases.file_checksum(path) == before


def test_duckdb_caps_rows_and_bytes(duckdb_target, monkeypatch):
    import dataclasses

    from t2s.env.databases import limits

    ref, _ = duckdb_target
    shown = databases.run_tool_query(ref, "SELECT a.ride_id FROM rides a, rides b, rides c, rides d", max_rows=5)
    assert len(shown.rows) == 5 and shown.more and shown.seconds < 5
    big = databases.run_scoring_query(ref, "SELECT a.ride_id, b.ride_id FROM rides a, rides b, rides c", timeout=5)
    assert big.over_cap or big.timed_out
    # rows of long values: a tool query stops after the row that passes its byte cap
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, tool_max_bytes=100_000))
    long = "hex(" * 14 + "club_name" + ")" * 14  # 2**14 times a club's name: over 100,000 characters
    wide = databases.run_tool_query(ref, f"WITH m AS (SELECT {long} AS x FROM clubs) SELECT x, x FROM m", max_rows=5)
    assert wide.ok and len(wide.rows) == 1 and wide.more and wide.over_cap, (wide.error, len(wide.rows))
    assert len(wide.rows[0][0]) > 100_000


def test_postgres_casts_to_ordinary_types_pass_the_guard():
    """Casts to numbers, text, dates, booleans and arrays of them (what converted gold SQL writes) pass; a cast to a
    type whose input function reads the catalog, or to a type of the user's own, is refused (needs no server)."""
    from t2s.env.databases.postgres_guard import check

    ordinary = ("SELECT CAST(a AS REAL), b::text, c::varchar(3), d::timestamp with time zone, e::int[], "
                "CAST(f AS NUMERIC(10, 2)), g::date, h::boolean, i::double precision, j::bigint, CAST(k AS DECIMAL), "
                "l::jsonb, CAST(m AS CHAR(2)), n::interval, o::smallint FROM t")
    assert check(ordinary) is None
    assert check("SELECT 16385::regclass") == ("the type regclass", False)
    assert check("SELECT CAST(x AS public.mood) FROM t") == ("the type public.mood", False)
    assert check("SELECT x::mood FROM t") == ("the type mood", False)


def _pg_snapshot(dsn) -> dict:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace")]
        return {
            "rows": {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables},
            "relations": conn.execute("SELECT relname, relkind FROM pg_class ORDER BY 1, 2").fetchall(),
            "functions": conn.execute("SELECT count(*) FROM pg_proc").fetchone(),
            "extensions": conn.execute("SELECT extname FROM pg_extension ORDER BY 1").fetchall(),
            "roles": conn.execute("SELECT rolname, rolsuper FROM pg_roles ORDER BY 1").fetchall(),
            "large_objects": conn.execute("SELECT count(*) FROM pg_largeobject_metadata").fetchone(),
            "settings": conn.execute("SELECT name, setting FROM pg_settings WHERE source NOT IN ('default', "
                                     "'session', 'client') ORDER BY 1").fetchall(),
            "databases": conn.execute("SELECT datname FROM pg_database ORDER BY 1").fetchall(),
        }


def _fresh_database(dsn: str, name: str, template: str | None = None) -> str:
    """A new database ``name`` on the session's server (a copy of ``template`` when given); returns its URL.

    A copy needs the template to itself. Earlier tests in this worker may have left connections to it open: this
    thread's cached ones are closed, and any other (a finished rollout thread's, not yet collected) is ended by the
    server (``pg_terminate_backend``), then the copy is tried again, for up to 20 s."""
    import time

    import psycopg

    databases.close_thread_connections()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for attempt in range(40):
            try:
                admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
                break
            except psycopg.errors.ObjectInUse:
                if attempt == 39:
                    raise
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", (template,))
                time.sleep(0.5)
    return databases.server_url(dsn, name)


def test_a_template_copy_ends_connections_left_open_to_it(postgres_demo):
    import psycopg

    dsn = postgres_demo[2]
    url = databases.server_url(dsn, "cycling_club")
    left_open = psycopg.connect(url, autocommit=True)  # a connection nothing will close
    left_open.execute("SELECT 1")
    try:
        copied = _fresh_database(dsn, "copy_while_open", template="cycling_club")  # ObjectInUse before
        with psycopg.connect(copied, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
                                ).fetchone()[0] > 0
        assert _ended(left_open)
    finally:
        left_open.close()


def _ended(conn) -> bool:
    try:
        conn.execute("SELECT 1")
    except Exception:  # the server ended it
        return True
    return False


@pytest.fixture()
def postgres_target(postgres_demo):
    """A copy of the demo's cycling_club database with dblink installed, so that dblink attacks meet a real
    function."""
    import psycopg

    url = _fresh_database(postgres_demo[2], "attack", template="cycling_club")
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS dblink")
        except psycopg.Error:
            pass  # postgresql-contrib absent: the dblink attacks still meet the function allowlist
    databases.close_thread_connections()
    yield databases.server_db(url, "attack")
    databases.close_thread_connections()


def test_postgres_attacks_change_nothing(postgres_target, tmp_path):
    ref = postgres_target
    before = _pg_snapshot(ref.path)
    (tmp_path / "in.csv").write_text("999,x\n")
    os.chmod(tmp_path, 0o777)
    results = _attack(ref, POSTGRES_ATTACKS, tmp_path)
    writes = {sql for sql, result in results if result.write_attempt}
    assert {"DELETE FROM clubs", "DROP TABLE rides", "WITH d AS (DELETE FROM clubs RETURNING *) SELECT * FROM d",
            "SELECT * INTO evil FROM clubs"} <= writes
    refused = dict(results)
    assert "function pg_read_file" in refused["SELECT pg_read_file('/etc/passwd')"].error
    assert "system catalog" in refused["SELECT * FROM pg_authid"].error
    _runaways(ref, POSTGRES_RUNAWAYS)
    assert databases.run_tool_query(ref, "SELECT count(*) FROM clubs", max_rows=1).rows == [(6,)]
    databases.close_thread_connections()
    assert _pg_snapshot(ref.path) == before
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "pwned").exists()


def test_postgres_runs_reads_in_a_read_only_transaction(postgres_target):
    ref = postgres_target
    shown = databases.run_tool_query(ref, "SELECT a.ride_id FROM rides a, rides b, rides c, rides d", max_rows=5,
                                     timeout=5)  # a cursor: five rows come over, not the billions
    assert len(shown.rows) == 5 and shown.more and shown.seconds < 5
    mode = databases.run_tool_query(ref, "SELECT 1 WHERE current_setting('transaction_read_only') = 'on'",
                                    max_rows=1)
    assert mode.error is not None  # current_setting is not on the allowlist either
    ok = databases.run_tool_query(ref, "SELECT club_name FROM clubs ORDER BY club_id LIMIT 2", max_rows=5)
    assert ok.error is None and len(ok.rows) == 2
    after_error = databases.run_tool_query(ref, "SELECT nope FROM clubs", max_rows=5)
    assert after_error.error.startswith("Error:")
    again = databases.run_tool_query(ref, "SELECT count(*) FROM clubs", max_rows=5)
    assert again.rows == [(6,)]  # the failed statement's transaction was rolled back


def test_postgres_sessions_are_read_only_and_never_plan_parallel_workers(postgres_target):
    """Set once per session: parallel plans would return rows in a varying order (strict EX)."""
    from t2s.env.databases import postgres_engine

    with postgres_engine.connect(postgres_target.path) as conn:
        assert conn.execute("SHOW max_parallel_workers_per_gather").fetchone() == ("0",)
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)


def test_postgres_ddl_quotes_reserved_and_mixed_case_names(postgres_demo):
    """The DDL a model reads writes each name as PostgreSQL needs it: ``"order"`` and ``"Mixed"`` quoted."""
    import psycopg

    url = _fresh_database(postgres_demo[2], "names")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute('CREATE TABLE "user" (id integer PRIMARY KEY, "order" text, "Mixed" text, plain_name text)')
    catalog = databases.read_catalog(databases.server_db(url, "names"))
    assert catalog.ddl["user"] == ('CREATE TABLE "user" (id integer, "order" text, "Mixed" text, plain_name text, '
                                   'PRIMARY KEY (id))')
    databases.close_thread_connections()


def test_the_readme_read_only_role_works(postgres_target):
    """The role docs/engines.md tells users to create reads and can do nothing else, even without our guard."""
    import psycopg

    with psycopg.connect(postgres_target.path, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS t2s_reader")
        admin.execute("CREATE ROLE t2s_reader LOGIN")
        admin.execute("ALTER ROLE t2s_reader SET default_transaction_read_only = on")
        admin.execute('GRANT CONNECT ON DATABASE "attack" TO t2s_reader')
        admin.execute("GRANT USAGE ON SCHEMA public TO t2s_reader")
        admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO t2s_reader")
    url = postgres_target.path.replace("user=postgres", "user=t2s_reader")
    ref = databases.server_db(url, "attack")
    assert databases.run_tool_query(ref, "SELECT count(*) FROM clubs", max_rows=1).rows == [(6,)]
    with psycopg.connect(url, autocommit=True) as reader:
        with pytest.raises(psycopg.Error):
            reader.execute("DELETE FROM clubs")
    databases.close_thread_connections()
