"""information_schema and pg_catalog over Flight SQL list exactly the user's relations, and SHOW SOURCES.

DuckDB's own information_schema listed every Arrow input a read registered
(``__ivm_s37_rows``, ``__scan__…``) and none of ivm's tables; these are
ivm's relations (ivm/reads/system_relations.py), the same on both doors.
"""

from __future__ import annotations

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager as adbc
import pytest

from tests.flight.conftest import DURABILITY

pytestmark = DURABILITY


@pytest.fixture(scope="module")
def db(server):
    with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE events (ts TIMESTAMP, v INTEGER, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
                    "APPEND ONLY")  # (a statement of its own)
        cur.executescript(
            "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT NOT NULL, amount DECIMAL(12,2), note VARCHAR);"
            "CREATE MATERIALIZED VIEW low AS SELECT cust, MIN(amount) AS low FROM orders GROUP BY cust;"
            "CREATE MATERIALIZED VIEW per_v AS SELECT v, COUNT(*) AS n FROM events GROUP BY v;"
            "INSERT INTO orders VALUES (1, 7, 9.50, 'a'), (2, 7, 1.25, NULL)")
        cur.execute("SELECT * FROM orders WHERE id = ?", parameters=(1,))  # a point read registers its inputs
        cur.fetchall()
        cur.execute("SELECT * FROM low")  # the view's state (low.agg2) is registered on the cursor
        cur.fetchall()
    return server


def query(cur, sql: str) -> list[tuple]:
    cur.execute(sql)
    return [tuple(row) for row in cur.fetchall()]


def test_information_schema_lists_exactly_the_user_relations(db, cur):
    assert query(cur, "SELECT table_schema, table_name, table_type FROM information_schema.tables ORDER BY 2") == [
        ("public", "events", "BASE TABLE"), ("public", "low", "VIEW"), ("public", "orders", "BASE TABLE"),
        ("public", "per_v", "VIEW")]
    assert query(cur, "SELECT column_name, data_type, numeric_precision, numeric_scale, is_nullable "
                      "FROM information_schema.columns WHERE table_name = 'orders' ORDER BY ordinal_position") == [
        ("id", "bigint", 64, 0, "NO"), ("cust", "bigint", 64, 0, "NO"), ("amount", "numeric", 12, 2, "YES"),
        ("note", "text", None, None, "YES")]
    assert query(cur, "SELECT constraint_name, column_name FROM information_schema.key_column_usage") == [
        ("orders_pkey", "id")]
    everything = query(cur, "SELECT table_name FROM information_schema.columns UNION ALL "
                            "SELECT relname FROM pg_catalog.pg_class UNION ALL SELECT table_name FROM "
                            "information_schema.views")
    assert {name for (name,) in everything} == {"orders", "events", "low", "per_v", "orders_pkey"}


def test_duckdb_catalogs_are_not_reached(db, cur):
    for sql in ("SELECT * FROM information_schema.routines", "SELECT * FROM pg_catalog.pg_settings",
                "SELECT * FROM temp.main.orders", "SELECT * FROM system.main.duckdb_settings"):
        with pytest.raises(adbc.ProgrammingError, match="does not exist"):
            query(cur, sql)
    assert query(cur, "SELECT count(*) FROM public.orders") == [(2,)]  # the user's schema, by either name
    assert query(cur, "SELECT count(*) FROM main.orders") == [(2,)]


def test_catalog_is_read_only(db, cur):
    for sql in ("INSERT INTO information_schema.tables (table_name) VALUES ('x')",
                "DROP TABLE pg_catalog.pg_class"):
        with pytest.raises(adbc.Error, match="read-only"):
            cur.execute(sql)
    assert query(cur, "SELECT count(*) FROM information_schema.tables") == [(4,)]


def test_show_sources(db, cur):
    cur.execute("SHOW SOURCES")
    # the first five as clients read them by position, then the source columns (NULL for a table)
    assert [d[0] for d in cur.description] == ["name", "type", "written_by", "status", "rows", "state", "slot",
                                               "confirmed_lsn", "lag_bytes", "lag_seconds", "rows_applied",
                                               "last_error", "warning"]
    assert [tuple(r) for r in cur.fetchall()] == [("events", "table", None, None, 0) + (None,) * 8,
                                                 ("orders", "table", None, None, 2) + (None,) * 8]
