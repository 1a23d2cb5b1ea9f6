"""Upstream ALTER TABLE while a PostgreSQL source streams (ivm/cdc/stream.py, issue 27), against a real server.

ADD COLUMN (with and without a default), DROP COLUMN and a widening type
change are applied to the ivm table in order with the data, while a workload
writes; afterwards every table equals upstream's and every view equals both
PostgreSQL running its SELECT and DuckDB recomputing it over ivm's tables. A
change ivm cannot follow fails only its table.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

import ivm
from ivm.cdc.postgres import SourceConfig
from tests.cdc import workload as w
from tests.cdc.test_postgres import Running, slot
from tests.test_alter_table import assert_views_equal_recompute

TABLES = ("customers", "products", "orders", "audit", "marker", "ticks")


def upstream_rows(dsn: str, table: str) -> list:
    with contextlib.closing(w.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        return w.normalized(cur.fetchall())


def ivm_rows(db, table: str) -> list:
    return w.normalized(tuple(r.values()) for r in db.sql(f"SELECT * FROM {table}").to_pylist())


def run_sql(dsn: str, sql: str) -> None:
    with contextlib.closing(w.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(sql)


def test_add_drop_and_widen_upstream_under_streaming_writes(upstream, tmp_path):
    # ticks: a table only this test writes, after each change, to see the unchanged tables go on.
    run_sql(upstream, "CREATE TABLE ticks (i integer PRIMARY KEY); ALTER PUBLICATION shop ADD TABLE ticks")
    db = ivm.connect(tmp_path / "db")
    running = Running(db, SourceConfig("shop", upstream, "shop", slot(upstream)))
    load = w.Workload(upstream, seed=11)
    stop = threading.Event()
    errors: list[BaseException] = []

    def generate() -> None:
        try:
            while not stop.is_set():
                load.transaction(statements=4)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    generator = threading.Thread(target=generate, daemon=True)
    try:
        running.wait_streaming()
        w.create_views(db)
        db.execute("CREATE MATERIALIZED VIEW names AS SELECT id, name FROM customers")  # never reads vip
        generator.start()
        changes = [
            "ALTER TABLE customers ADD COLUMN vip boolean NOT NULL DEFAULT false",
            "UPDATE customers SET vip = true WHERE id % 7 = 0",
            # One transaction: a row of the old shape, the change, a row of the new one.
            "INSERT INTO customers VALUES (888001, 'before', 'r1'); ALTER TABLE customers ADD COLUMN tier int "
            "DEFAULT 1; INSERT INTO customers VALUES (888002, 'after', 'r2', true, 2)",
            "ALTER TABLE orders ADD COLUMN memo text",  # no default: NULL for the rows before
            "UPDATE orders SET memo = 'm' || id WHERE id % 5 = 0",
            "ALTER TABLE products DROP COLUMN label",  # no view reads it
            "ALTER TABLE products ALTER COLUMN price TYPE numeric(14,2)",  # by_region reads it: a widening
            "UPDATE products SET price = price + 1000000 WHERE id = 3",  # fits only the wider type
        ]
        for i, change in enumerate(changes):
            time.sleep(0.3)  # writes stream between the changes
            run_sql(upstream, change)
            run_sql(upstream, f"INSERT INTO ticks VALUES ({i})")
            w.wait_for(lambda: db.sql(f"SELECT COUNT(*) AS n FROM ticks WHERE i = {i}").column("n")[0].as_py(),
                     f"the tick after change {i}")
        time.sleep(0.3)
        stop.set()
        generator.join(30)
        assert not errors, errors
        lsn = load.mark()
        expected = load.expected()
        w.wait_applied(running.progress, lsn)

        for table in TABLES:
            assert ivm_rows(db, table) == upstream_rows(upstream, table), table
        assert [c for c, _ in db.table_columns("customers")] == ["id", "name", "region", "vip", "tier"]
        assert dict(db.table_columns("products")) == {"id": "INTEGER", "price": "DECIMAL(14,2)"}
        assert db.sql("SELECT COUNT(*) AS n FROM customers WHERE vip IS NULL").column("n")[0].as_py() == 0
        assert w.ivm_views(db) == expected
        assert_views_equal_recompute(db)
        [source] = db.status()["sources"]
        assert (source["status"], source["failed_tables"]) == ("ok", {})
    finally:
        stop.set()
        running.close()
        load.close()
        db.close()
    with ivm.connect(tmp_path / "db") as db:  # the new shapes are stored
        for table in TABLES:
            assert ivm_rows(db, table) == upstream_rows(upstream, table), table


def test_a_change_ivm_cannot_follow_fails_only_its_table(upstream, tmp_path):
    db = ivm.connect(tmp_path / "db")
    running = Running(db, SourceConfig("shop", upstream, "shop", slot(upstream)))
    try:
        running.wait_streaming()
        w.create_views(db)
        # audit_counts reads audit.note; a narrower price is a narrowing.
        run_sql(upstream, "ALTER TABLE audit DROP COLUMN note; INSERT INTO audit VALUES (5)")
        run_sql(upstream, "ALTER TABLE products ALTER COLUMN price TYPE numeric(6,2); "
                          "UPDATE products SET price = 1 WHERE id = 1")
        run_sql(upstream, "INSERT INTO customers VALUES (777777, 'still flowing', 'r1')")
        w.wait_for(lambda: len(db.status()["sources"][0]["failed_tables"]) == 2, "both tables to fail")
        w.wait_for(lambda: db.sql("SELECT COUNT(*) AS n FROM customers WHERE id = 777777").column("n")[0].as_py(),
                 "a later change of another table")
        [source] = db.status()["sources"]
        assert source["status"] == "ok" and source["phase"] == "streaming"
        failed = source["failed_tables"]
        assert "upstream table public.audit changed in a way ivm cannot follow: cannot drop column note of " \
               "table audit: materialized view(s) audit_counts read it" in failed["audit"]
        assert "column price of products cannot change from DECIMAL(10,2) to DECIMAL(6,2)" in failed["products"]
        shown = {r["name"]: r["status"] for r in db.sql("SHOW SOURCES").to_pylist()}
        assert shown["audit"] == "failed: " + failed["audit"] and shown["customers"] is None
        for read, words in [("SELECT * FROM audit", "table audit is not readable: upstream table public.audit"),
                            ("SELECT * FROM audit_counts", "it reads table audit, which failed"),
                            ("SELECT * FROM by_region", "it reads table products, which failed")]:
            with pytest.raises(ivm.ExecutionError, match=words):
                db.sql(read)
        assert db.sql("SELECT COUNT(*) AS n FROM big_orders").column("n")[0].as_py() > 0  # not over them: fine
        status = {r["name"]: r["status"] for r in db.status()["relations"]}
        assert status["audit"].startswith("failed: upstream table public.audit") and status["orders"] == "ok"
    finally:
        running.close()
        db.close()
