"""Flight SQL through the ADBC driver against a real ``ivm serve`` (acceptance 1).

Tables and views are created over a SQL connection, CDC batches stream in
with ``adbc_ingest``, and every view read through the server equals DuckDB
recomputing it from the tables read through the same server.
"""

from __future__ import annotations

import json
import random

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import DURABILITY
from tests.oracle.compare import multiset_diff

pytestmark = DURABILITY

VIEWS = {
    "cust_totals": "SELECT cust, COUNT(*) AS n, SUM(amount) AS total, MIN(amount) AS low FROM orders GROUP BY cust",
    "open_orders": "SELECT o.id, o.amount, c.region FROM orders o JOIN customers c ON o.cust = c.id "
                   "WHERE o.status = 'open'",
    "regions": "SELECT DISTINCT region FROM customers",
}


@pytest.fixture(scope="module")
def schema(server):
    with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR)")
        assert cur.rowcount == 0
        cur.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, status VARCHAR)")
        for name, sql in VIEWS.items():
            cur.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    return server


def read(cur, sql: str) -> pa.Table:
    cur.execute(sql)
    return cur.fetch_arrow_table()


def recompute(cur, view: str) -> pa.Table:
    con = duckdb.connect()
    for table in ("customers", "orders"):
        con.register(table, read(cur, f"SELECT * FROM {table}"))
    return con.sql(VIEWS[view]).to_arrow_table()


def assert_views_equal_recompute(cur) -> None:
    for view in VIEWS:
        diff = multiset_diff(read(cur, f"SELECT * FROM {view}"), recompute(cur, view))
        assert diff is None, f"{view}: {diff}"


def cdc_batch(rng: random.Random, live: dict[int, float], next_id: int, size: int) -> tuple[pa.Table, int]:
    rows = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.5 or not live:
            key, op = next_id, "c"
            next_id += 1
        elif roll < 0.8:
            key, op = rng.choice(sorted(live)), "u"
        else:
            key, op = rng.choice(sorted(live)), "d"
        amount = rng.choice([None, round(rng.uniform(0, 50), 2), 10.0])
        rows.append({"id": key, "cust": rng.randint(1, 6), "amount": amount,
                     "status": rng.choice(["open", "shipped"]), "__op": op})
        if op == "d":
            live.pop(key)
        else:
            live[key] = amount
    schema = pa.schema([("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.float64()),
                        ("status", pa.string()), ("__op", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema), next_id


def test_ddl_dml_and_cdc_ingest_keep_views_equal_to_recompute(schema, cur):
    cur.execute("INSERT INTO customers VALUES (1, 'north'), (2, 'south'), (3, 'north'), (4, 'east'), (5, NULL)")
    assert cur.rowcount == 5
    cur.adbc_ingest("customers", pa.table({"id": [6], "region": ["west"]}), mode="append")
    rng = random.Random(5)
    live: dict[int, float] = {}
    next_id = 1
    for step in range(12):
        batch, next_id = cdc_batch(rng, live, next_id, rng.choice([1, 7, 60]))
        assert cur.adbc_ingest("orders", batch, mode="append") == batch.num_rows
        if step % 4 == 3:
            assert_views_equal_recompute(cur)
    cur.execute("UPDATE orders SET amount = amount + 1 WHERE cust = 2")
    cur.execute("DELETE FROM customers WHERE id = 3")
    assert cur.rowcount == 1
    assert_views_equal_recompute(cur)
    assert read(cur, "SELECT COUNT(*) AS n FROM orders").column("n")[0].as_py() == len(live)


def flight_read(client: fl.FlightClient, name: str) -> pa.Table:
    info = client.get_flight_info(fl.FlightDescriptor.for_path(name))
    return client.do_get(info.endpoints[0].ticket).read_all()


def test_plain_flight_cdc_keeps_views_equal_to_recompute(schema, cur, client):
    """The same with pyarrow.flight only: CDC batches by DoPut, views and tables by DoGet."""
    rng = random.Random(17)
    live = {row["id"]: row["amount"] for row in read(cur, "SELECT id, amount FROM orders").to_pylist()}
    next_id = 1_000_000
    for step in range(10):
        batch, next_id = cdc_batch(rng, live, next_id, rng.choice([1, 9, 80]))
        writer, reader = client.do_put(fl.FlightDescriptor.for_path("orders"), batch.schema)
        writer.write_table(batch)
        writer.done_writing()
        ack = json.loads(reader.read().to_pybytes())
        writer.close()
        assert ack["rows"] == batch.num_rows
        if step % 3 == 2:
            con = duckdb.connect()
            for table in ("customers", "orders"):
                con.register(table, flight_read(client, table))
            for view, sql in VIEWS.items():
                got = flight_read(client, view)
                assert int(got.schema.metadata[b"ivm.offset"]) >= ack["offset"]
                diff = multiset_diff(got, con.sql(sql).to_arrow_table())
                assert diff is None, f"{view}: {diff}"
    assert flight_read(client, "orders").num_rows == len(live)


def test_prepared_statements_bind_parameters_by_type(schema, cur):
    cur.execute("CREATE TABLE typed (id BIGINT PRIMARY KEY, name VARCHAR, x DOUBLE, ok BOOLEAN, d DATE)")
    cur.execute("INSERT INTO typed VALUES (?, ?, ?, ?, ?)", (1, "it's; DROP TABLE typed; --", 1.5, True, None))
    assert cur.rowcount == 1
    cur.executemany("INSERT INTO typed VALUES (?, ?, ?, ?, CAST(? AS DATE))",
                    [(2, "b", float("nan"), False, "2024-02-29"), (3, None, -0.0, None, "1999-12-31")])
    assert cur.rowcount == 2
    cur.execute("SELECT id, name FROM typed WHERE name = ?", ("it's; DROP TABLE typed; --",))
    assert cur.fetchall() == [(1, "it's; DROP TABLE typed; --")]
    cur.execute("SELECT id FROM typed WHERE isnan(x) OR ok = ? ORDER BY id", (True,))
    assert cur.fetchall() == [(1,), (2,)]
    cur.execute("SELECT COUNT(*) FROM typed WHERE name = ? OR name LIKE '%?%'", ("b",))
    assert cur.fetchall() == [(1,)]
    cur.execute("UPDATE typed SET x = ? WHERE id = ?", (9.25, 3))
    assert cur.rowcount == 1
    assert read(cur, "SELECT x FROM typed WHERE id = 3").column(0).to_pylist() == [9.25]


def test_queries_stream_arrow_with_the_offset(schema, cur, conn):
    cur.execute("INSERT INTO customers VALUES (100, 'far')")
    table = read(cur, "SELECT * FROM regions")
    assert b"ivm.offset" in table.schema.metadata
    assert "far" in table.column("region").to_pylist()
    assert [d[0] for d in cur.description] == ["region"]


def test_executescript_runs_every_statement(schema, cur):
    cur.executescript("CREATE TABLE script (a BIGINT); INSERT INTO script VALUES (1), (2); "
                      "CREATE MATERIALIZED VIEW script_sum AS SELECT SUM(a) AS s FROM script")
    assert read(cur, "SELECT s FROM script_sum").column(0).to_pylist() == [3]


def test_ingest_with_op_codes_and_missing_delete_policy(schema, cur):
    cur.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    cur.adbc_ingest("kv", pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}), mode="append")
    changes = pa.table({"k": [1, 2, 9], "v": ["A", None, None], "__op": ["u", "d", "d"]})
    changes = changes.replace_schema_metadata({"ivm.on_missing_delete": "ignore"})
    assert cur.adbc_ingest("kv", changes, mode="append") == 3
    assert read(cur, "SELECT * FROM kv ORDER BY k").to_pylist() == [{"k": 1, "v": "A"}, {"k": 3, "v": "c"}]


def test_ingest_modes_other_than_append_are_refused_by_name(schema, cur):
    import adbc_driver_manager

    before = read(cur, "SELECT COUNT(*) FROM customers").column(0)[0].as_py()
    for mode in ("create", "replace"):
        with pytest.raises(adbc_driver_manager.NotSupportedError, match=f"mode '{mode}' is not supported"):
            cur.adbc_ingest("customers", pa.table({"id": [77], "region": ["x"]}), mode=mode)
    with pytest.raises(adbc_driver_manager.NotSupportedError, match="CREATE TABLE"):
        cur.adbc_ingest("brand_new", pa.table({"id": [1]}), mode="create_append")
    assert read(cur, "SELECT COUNT(*) FROM customers").column(0)[0].as_py() == before
    assert cur.adbc_ingest("customers", pa.table({"id": [78], "region": ["y"]}), mode="create_append") == 1


def test_catalog_commands(schema, conn):
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "ivm"
    assert conn.adbc_get_table_schema("orders") == pa.schema(
        [("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.float64()), ("status", pa.string())])
    assert conn.adbc_get_table_schema("cust_totals").names == ["cust", "n", "total", "low"]
    objects = conn.adbc_get_objects().read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["ivm"]
    tables = {t["table_name"]: t for t in objects[0]["catalog_db_schemas"][0]["db_schema_tables"]}
    assert tables["orders"]["table_type"] == "TABLE"
    assert tables["cust_totals"]["table_type"] == "MATERIALIZED VIEW"
    assert [c["column_name"] for c in tables["orders"]["table_columns"]] == ["id", "cust", "amount", "status"]
    views_only = conn.adbc_get_objects(table_types_filter=["MATERIALIZED VIEW"], table_name_filter="%s").read_all()
    names = [t["table_name"] for t in views_only.to_pylist()[0]["catalog_db_schemas"][0]["db_schema_tables"]]
    assert sorted(names) == ["cust_totals", "open_orders", "regions"]  # views ending in "s"; not "orders"


def test_read_your_writes_acknowledged_is_visible(schema, cur, client):
    """An acknowledged write is in every read issued after it: zero delay by construction."""
    for i in range(25):
        cur.execute(f"INSERT INTO customers VALUES ({1000 + i}, 'ryw{i}')")
        assert read(cur, f"SELECT COUNT(*) FROM regions WHERE region = 'ryw{i}'").column(0)[0].as_py() == 1
        writer, reader = client.do_put(fl.FlightDescriptor.for_path("customers"),
                                       pa.schema([("id", pa.int64()), ("region", pa.string())]))
        writer.write_table(pa.table({"id": [2000 + i], "region": [f"put{i}"]}))
        writer.done_writing()
        ack = json.loads(reader.read().to_pybytes())
        writer.close()
        info = client.get_flight_info(fl.FlightDescriptor.for_path("regions"))
        assert json.loads(info.app_metadata)["offset"] >= ack["offset"]
        rows = client.do_get(info.endpoints[0].ticket).read_all()
        assert f"put{i}" in rows.column("region").to_pylist()


def test_a_prepared_query_reflects_writes_made_after_it_was_prepared(schema, cur, conn, server):
    query = "SELECT COUNT(*) AS n FROM customers WHERE region = 'late'"
    cur.adbc_prepare(query)  # runs the query once, to describe it
    with flight_sql.connect(server.uri, autocommit=True) as other, other.cursor() as writer:
        writer.execute("INSERT INTO customers VALUES (5000, 'late')")
    cur.execute(query)
    assert cur.fetchall() == [(1,)]
    cur.execute(query)  # the same statement again: runs again
    assert cur.fetchall() == [(1,)]
