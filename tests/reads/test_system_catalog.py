"""ivm's pg_catalog / information_schema (ivm/reads/system_relations.py, sql_frontend/system_queries.py) and SHOW SOURCES,
through the embedded API; the doors' tests are tests/pgwire/test_catalog.py and tests/flight/test_catalog.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlglot

import ivm
from ivm.reads.system_relations import ARRAY_TYPES, format_type, pg_type
from sql_frontend.system_queries import rewrite


@pytest.fixture
def db():
    database = ivm.connect()
    database.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, price DECIMAL(12,2) DEFAULT 0, tags VARCHAR[], "
                     "at TIMESTAMP WITH TIME ZONE)")
    database.execute("CREATE MATERIALIZED VIEW m AS SELECT id, MAX(price) AS top FROM t GROUP BY id")
    try:
        yield database
    finally:
        database.close()


def rows(db, sql):
    return [tuple(r.values()) for r in db.sql(sql).to_pylist()]


@pytest.mark.parametrize("duckdb_type, pg, text", [
    ("BIGINT", (20, -1), "bigint"), ("DECIMAL(12,2)", (1700, 786438), "numeric(12,2)"), ("VARCHAR", (25, -1), "text"),
    ("TIMESTAMP", (1114, -1), "timestamp without time zone"), ("TIMESTAMP WITH TIME ZONE", (1184, -1),
                                                                "timestamp with time zone"),
    ("INTEGER[]", (1007, -1), "integer[]"), ("DECIMAL(12,2)[]", (1231, 786438), "numeric(12,2)[]"),
    ("VARCHAR[]", (1009, -1), "text[]"), ("INTEGER[][]", (25, -1), "text"), ("STRUCT(a INTEGER)[]", (25, -1), "text"),
    ("UINTEGER", (26, -1), "oid"), ("UBIGINT", (1700, -1), "numeric"), ("TINYINT", (21, -1), "smallint")])
def test_types(duckdb_type, pg, text):
    assert pg_type(duckdb_type) == pg and format_type(*pg) == text


def test_array_types_are_the_ones_the_postgresql_door_sends():
    # pg_type's array types (typelem/typarray: asyncpg's introspection reads them) match what a list column is sent as
    from flight_server.pgwire import types as wire

    assert ARRAY_TYPES == wire.ARRAYS
    assert rows(ivm.connect(), "SELECT typname, typelem, typcategory FROM pg_type WHERE oid = 1007") == \
        [("_int4", 23, "A")]
    assert rows(ivm.connect(), "SELECT typarray FROM pg_type WHERE typname = 'int8'") == [(1016,)]


def test_columns_keys_defaults(db):
    assert rows(db, "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef "
                    "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
                    "WHERE c.relname = 't' ORDER BY a.attnum") == [
        ("id", "bigint", True, False), ("price", "numeric(12,2)", False, True), ("tags", "text[]", False, False),
        ("at", "timestamp with time zone", False, False)]
    assert rows(db, "SELECT pg_get_indexdef(i.indexrelid), pg_get_constraintdef(c.oid) FROM pg_catalog.pg_index i "
                    "JOIN pg_catalog.pg_constraint c ON c.conindid = i.indexrelid") == [
        ("CREATE UNIQUE INDEX t_pkey ON public.t USING btree (id)", "PRIMARY KEY (id)")]
    assert rows(db, "SELECT column_default FROM information_schema.columns WHERE column_name = 'price'") == [("0",)]
    assert rows(db, "SELECT pg_get_viewdef(c.oid) FROM pg_catalog.pg_class c WHERE relkind = 'm'") == [
        (" SELECT id, MAX(price) AS top FROM t GROUP BY id;",)]


def test_state_and_inputs_are_not_listed(db):
    db.execute("INSERT INTO t VALUES (1, 2.5, ['a'], NULL)")
    assert rows(db, "SELECT top FROM m") == [(Decimal("2.50"),)]  # a read registers the view's state on a cursor
    assert rows(db, "SELECT relname, relkind FROM pg_catalog.pg_class ORDER BY 1") == [
        ("m", "m"), ("t", "r"), ("t_pkey", "i")]
    assert any(r["name"].startswith("m.") for r in db.status()["relations"])  # the state exists


def test_catalog_follows_ddl(db):
    before = rows(db, "SELECT relname FROM pg_catalog.pg_class ORDER BY 1")
    db.execute("CREATE TABLE u (x INTEGER)")
    assert rows(db, "SELECT relname FROM pg_catalog.pg_class ORDER BY 1") == sorted(before + [("u",)])
    db.execute("DROP TABLE u")
    assert rows(db, "SELECT relname FROM pg_catalog.pg_class ORDER BY 1") == before


def test_a_user_relation_wins_over_a_bare_catalog_name(db):
    db.execute("CREATE TABLE pg_type (x INTEGER)")
    assert rows(db, "SELECT count(*) FROM pg_type") == [(0,)]
    assert rows(db, "SELECT count(*) > 10 FROM pg_catalog.pg_type") == [(True,)]


@pytest.mark.parametrize("sql, error, message", [
    ("SELECT * FROM pg_catalog.pg_stat_activity", ivm.UnknownObjectError, "relation pg_catalog.pg_stat_activity"),
    ("SELECT * FROM x.t", ivm.UnknownObjectError, "relation x.t does not exist"),
    ("SELECT * FROM memory.main.t", ivm.UnknownObjectError, "relation memory.main.t does not exist"),
    ("SELECT 1 WHERE 1 OPERATOR(pg_catalog.&&) 2", ivm.UnknownObjectError, "operator && does not exist"),
    ("SELECT 'a'::pg_catalog.regoperator", ivm.UnknownObjectError, "regoperator does not exist"),
    ("INSERT INTO information_schema.columns (column_name) VALUES ('x')", ivm.AccessDeniedError, "read-only"),
    ("DROP TABLE pg_catalog.pg_type", ivm.AccessDeniedError, "read-only"),
    ("SELECT * FROM pg_catalog.pg_class, read_csv('/etc/passwd')", ivm.AccessDeniedError, "read_csv"),
])
def test_errors(db, sql, error, message):
    with pytest.raises(error, match=message):
        db.sql(sql)


def test_rewrite_leaves_an_untouched_query_alone():
    tree = sqlglot.parse_one("SELECT a FROM t", read="duckdb")
    assert rewrite(tree, {}, "defs", lambda name: True)[0].sql("duckdb") == "SELECT a FROM t"


def test_show_sources_in_memory_and_durable(db, tmp_path):
    db.execute("CREATE TABLE events (ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) APPEND ONLY")
    db.execute("CREATE MATERIALIZED VIEW n AS SELECT COUNT(*) AS c FROM events")  # makes the hidden twins
    db.execute("INSERT INTO t VALUES (1, 2.5, NULL, NULL)")
    table = db.sql("SHOW SOURCES")
    # the first five in the order clients read them by position; the source columns appended after them
    source_columns = ["state", "slot", "confirmed_lsn", "lag_bytes", "lag_seconds", "rows_applied", "last_error",
                      "warning"]
    assert table.column_names == ["name", "type", "written_by", "status", "rows", *source_columns]
    unset = (None,) * len(source_columns)  # a table has none of a source's facts
    assert [tuple(r.values()) for r in table.to_pylist()] == [("events", "table", None, None, 0, *unset),
                                                              ("t", "table", None, None, 1, *unset)]
    with ivm.connect(tmp_path / "d") as durable:
        assert durable.sql("SHOW SOURCES").num_rows == 0
        durable.execute("CREATE TABLE k (x INTEGER)")
        assert durable.sql("SHOW SOURCES").to_pylist() == [
            {"name": "k", "type": "table", "written_by": None, "status": None, "rows": 0,
             **dict.fromkeys(source_columns)}]


def test_show_of_something_else_names_what_exists(db):
    with pytest.raises(ivm.UnsupportedError, match="SHOW SOURCES"):
        db.sql("SHOW CONNECTIONS")


def test_what_dbt_sends(db):
    # three-part names in the one database and schema; REFRESH MATERIALIZED VIEW is a no-op on a view only
    db.execute('CREATE MATERIALIZED VIEW IF NOT EXISTS "ivm"."public"."n" AS SELECT id FROM "ivm"."public"."t"')
    db.execute("INSERT INTO ivm.public.t (id) VALUES (1)")
    db.execute('REFRESH MATERIALIZED VIEW "ivm"."public"."n"')
    assert rows(db, "SELECT * FROM n") == rows(db, 'SELECT id FROM "ivm"."public"."t"') == [(1,)]
    for sql, error in [("REFRESH MATERIALIZED VIEW t", '"t" is not a materialized view'),
                       ("REFRESH MATERIALIZED VIEW nowhere", "does not exist"),
                       ("SELECT * FROM shop.public.t", "relation shop.public.t does not exist"),
                       ("CREATE MATERIALIZED VIEW x AS SELECT id FROM other.t", "does not exist")]:
        with pytest.raises(ivm.IvmError, match=error):
            db.execute(sql)
    # the dependencies dbt reads, with PostgreSQL's LIKE (a backslash escapes) and catalog OIDs
    assert rows(db, r"""SELECT v.relname AS view, t.relname AS reads FROM pg_depend d JOIN pg_class v ON v.oid = (
                            SELECT ev_class FROM pg_rewrite WHERE oid = d.objid)
                        JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace n ON n.oid = t.relnamespace
                        WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
                          AND d.deptype = 'n' AND n.nspname NOT LIKE 'pg\_%' ORDER BY 1""") == [("m", "t"), ("n", "t")]
    assert rows(db, r"SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pg\_%'") == [("pg_catalog",)]
