"""pg_catalog and information_schema over the PostgreSQL door: psql's describe commands and SQLAlchemy's inspector.

Both list exactly the user's tables and materialized views, with PostgreSQL
type names and primary keys, and never one of ivm's own relations (operator
state, hidden twins of watermarked tables, the Arrow inputs a read
registers). The relations are ivm's (ivm/reads/system_relations.py), read-only,
and reading them reaches no file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.flight.server import ServerProcess
from tests.pgwire.conftest import TIMEOUT, connect

FIXTURES = Path(__file__).parent / "fixtures"


def psql(server, *args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("psql")
    assert binary, "psql is missing: ./dev test installs postgresql-client"
    env = {**os.environ, "PGCONNECT_TIMEOUT": str(TIMEOUT), "PGPASSWORD": "", "PSQLRC": "/dev/null"}
    return subprocess.run([binary, "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(server.pg_port),
                           "-U", "any", "shop", *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def described(server):
    """psql's output of fixtures/psql_catalog.sql (it creates the relations the other tests read)."""
    return psql(server, "-f", str(FIXTURES / "psql_catalog.sql"))


def test_psql_describe_commands(described):
    assert described.returncode == 0, described.stderr
    assert described.stdout == (FIXTURES / "psql_catalog.out").read_text()
    # \dv: ivm has no plain views, and psql says so on stderr (line 13 of the script)
    assert described.stderr == f"psql:{FIXTURES / 'psql_catalog.sql'}:13: error: Did not find any relations.\n"


def test_internal_relations_exist_but_are_never_listed(server, described):
    with connect(server) as conn:
        names = [r[0] for r in conn.execute("SELECT relname FROM pg_catalog.pg_class ORDER BY 1")]
        assert names == ["big", "cheapest", "clicks", "orders", "orders_pkey", "per_page"]
        tables = conn.execute("SELECT table_name, table_type FROM information_schema.tables ORDER BY 1").fetchall()
        assert tables == [("big", "VIEW"), ("cheapest", "VIEW"), ("clicks", "BASE TABLE"), ("orders", "BASE TABLE"),
                          ("per_page", "VIEW")]
        columns = {r[0] for r in conn.execute("SELECT DISTINCT table_name FROM information_schema.columns")}
        assert columns == {"big", "cheapest", "clicks", "orders", "per_page"}
        # ... while the status shows the state and the hidden twins are there (so the test above could fail)
        relations = conn.execute("SHOW STATUS").fetchall()
        assert any(any(str(value).startswith("__ontime_clicks") for value in row) for row in relations)


def test_sqlalchemy_reflects_tables_views_columns_and_keys(server, described):
    # The default (not autocommit) mode: psycopg's type lookup on connect sends SAVEPOINT inside the transaction.
    engine = sa.create_engine(f"postgresql+psycopg://any@127.0.0.1:{server.pg_port}/shop",
                              connect_args={"connect_timeout": TIMEOUT})
    try:
        inspector = sa.inspect(engine)
        assert inspector.default_schema_name == "public"
        assert inspector.get_schema_names() == ["information_schema", "public"]
        assert inspector.get_table_names() == ["clicks", "orders"]
        assert inspector.get_view_names() == []  # ivm has no plain views
        assert inspector.get_materialized_view_names() == ["big", "cheapest", "per_page"]
        columns = {c["name"]: c for c in inspector.get_columns("orders")}
        assert list(columns) == ["id", "cust", "amount", "status", "placed"]
        assert [str(c["type"]) for c in columns.values()] == ["BIGINT", "BIGINT", "NUMERIC(12, 2)", "TEXT",
                                                             "TIMESTAMP"]
        assert isinstance(columns["placed"]["type"], sa.TIMESTAMP) and not columns["placed"]["type"].timezone
        assert [c["nullable"] for c in columns.values()] == [False, False, True, True, True]
        assert columns["status"]["default"] == "'new'"
        assert inspector.get_pk_constraint("orders") == {"constrained_columns": ["id"], "name": "orders_pkey",
                                                         "comment": None, "dialect_options": {"postgresql_include": []}}
        assert inspector.get_pk_constraint("big")["constrained_columns"] == []
        assert [(c["name"], str(c["type"])) for c in inspector.get_columns("big")] == [
            ("cust", "BIGINT"), ("total", "NUMERIC(38, 2)"), ("n", "BIGINT")]
        assert inspector.has_table("orders") and not inspector.has_table("__ontime_clicks")
        with pytest.raises(sa.exc.NoSuchTableError):
            inspector.get_columns("__ontime_clicks")
        # a reflected table is queried like any other
        orders = sa.Table("orders", sa.MetaData(), autoload_with=engine)
        with engine.connect() as conn:
            rows = conn.execute(sa.select(orders.c.id, orders.c.amount).where(orders.c.cust == 7)).all()
        assert [(r.id, str(r.amount)) for r in rows] == [(1, "9.50")]
    finally:
        engine.dispose()


@pytest.mark.parametrize("sql, code, message", [
    ("SELECT * FROM pg_catalog.pg_settings", "42P01", "relation pg_catalog.pg_settings does not exist"),
    ("SELECT * FROM information_schema.routines", "42P01", "relation information_schema.routines does not exist"),
    ("SELECT * FROM temp.main.orders", "42P01", "relation temp.main.orders does not exist"),
    ("SELECT * FROM secret.orders", "42P01", "relation secret.orders does not exist"),
    ("SELECT 1 WHERE 'a' OPERATOR(pg_catalog.@@) 'b'", "42P01", "operator @@ does not exist"),
    ("SELECT 1::pg_catalog.tsvector", "42P01", "tsvector does not exist"),
])
def test_what_ivm_does_not_answer_is_an_error(server, described, sql, code, message):
    with connect(server) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        assert caught.value.sqlstate == code and message in str(caught.value)


@pytest.mark.parametrize("sql, code", [
    ("INSERT INTO pg_catalog.pg_class (relname) VALUES ('x')", "42501"),
    ("DELETE FROM information_schema.tables", "42501"),
    ("UPDATE pg_catalog.pg_attribute SET attname = 'x'", "42501"),
    ("DROP TABLE pg_catalog.pg_class", "42501"),
    ("DELETE FROM other.tables", "42P01"),
    ("COPY (SELECT * FROM pg_catalog.pg_class) TO '/tmp/ivm-catalog-copy'", "42501"),
    ("SELECT c.relname, f.* FROM pg_catalog.pg_class c, read_csv('/etc/passwd') f", "42501"),
    ("SELECT * FROM pg_catalog.read_text('/etc/passwd')", "42501"),
    ("SELECT * FROM information_schema.tables, glob('/etc/*')", "42501"),
])
def test_catalog_relations_are_read_only_and_reach_no_file(server, described, sql, code):
    with connect(server) as conn:
        conn.execute("CREATE TABLE tables (x INT)")  # a write to information_schema.tables once went here
        try:
            conn.execute("INSERT INTO tables VALUES (1)")
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(sql)
            assert caught.value.sqlstate == code, str(caught.value)
            assert "root:" not in str(caught.value)
            assert conn.execute("SELECT x FROM tables").fetchall() == [(1,)]
            assert [r[0] for r in conn.execute("SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r' "
                                               "ORDER BY 1")] == ["clicks", "orders", "tables"]
        finally:
            conn.execute("DROP TABLE tables")
    assert not Path("/tmp/ivm-catalog-copy").exists()


def test_catalog_follows_ddl(server, described):
    with connect(server) as conn:
        conn.execute("CREATE TABLE later (k TEXT PRIMARY KEY, v DOUBLE)")
        try:
            row = conn.execute("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull "
                               "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
                               "WHERE c.relname = %s ORDER BY a.attnum", ("later",)).fetchall()
            assert row == [("k", "text", True), ("v", "double precision", False)]
        finally:
            conn.execute("DROP TABLE later")
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'later'").fetchone() == (0,)


def test_catalog_queries_as_prepared_statements(server, described):
    # psycopg prepares a statement after it ran a few times: Describe of the statement must give the catalog's columns
    with connect(server) as conn:
        conn.prepare_threshold = 0  # every statement is prepared (Parse with a name, Describe of the statement)
        for name in ("orders", "big"):
            rows = conn.execute("SELECT c.oid, c.relkind FROM pg_catalog.pg_class c WHERE c.relname = %s",
                                (name,)).fetchall()
            assert [kind for _, kind in rows] == ["r" if name == "orders" else "m"]
        assert conn.execute("SELECT current_schema(), current_schemas(true)").fetchone() == \
            ("public", ["pg_catalog", "public"])


def test_show_sources(server, described):
    with connect(server) as conn:
        cursor = conn.execute("SHOW SOURCES")
        # the first five as clients read them by position, then the source columns (NULL for a table)
        assert [c.name for c in cursor.description] == ["name", "type", "written_by", "status", "rows", "state",
                                                        "slot", "confirmed_lsn", "lag_bytes", "lag_seconds",
                                                        "rows_applied", "last_error", "warning"]
        assert cursor.fetchall() == [("clicks", "table", None, None, 0) + (None,) * 8,
                                     ("orders", "table", None, None, 1) + (None,) * 8]


def _oids(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT relname, oid FROM pg_catalog.pg_class").fetchall())


def test_oids_are_stable_across_ddl_and_restarts(tmp_path):
    # Drivers and BI tools cache pg_class OIDs: a relation keeps its OID for its life (ivm/catalog.py), while
    # others are created and dropped, and across a restart of a durable database.
    process = ServerProcess("--data", str(tmp_path / "db"), "--pg-port", "0")
    try:
        with connect(process) as conn:
            for name in "abc":
                conn.execute(f"CREATE TABLE {name} (k BIGINT PRIMARY KEY, v TEXT)")
            conn.execute("CREATE MATERIALIZED VIEW v AS SELECT k FROM c")
            before = _oids(conn)
            conn.execute("DROP TABLE b")
            conn.execute("CREATE TABLE d (x BIGINT)")
            conn.execute("ALTER TABLE a ADD COLUMN w DOUBLE")  # a changed definition keeps its OID too
            after = _oids(conn)
            assert {n: after[n] for n in ("a", "a_pkey", "c", "c_pkey", "v")} == \
                {n: before[n] for n in ("a", "a_pkey", "c", "c_pkey", "v")}
            assert after["d"] not in before.values()  # b's OID is not handed out again
            assert conn.execute("SELECT 'c'::regclass::oid, 'v'::regclass::oid").fetchone() == (after["c"], after["v"])
    finally:
        process.stop()
    process = ServerProcess("--data", str(tmp_path / "db"), "--pg-port", "0")
    try:
        with connect(process) as conn:
            assert _oids(conn) == after
            conn.execute("CREATE TABLE e (x BIGINT)")  # and new ones still get new OIDs
            assert _oids(conn)["e"] not in {*before.values(), *after.values()}
    finally:
        process.stop()
