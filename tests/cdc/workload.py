"""A random OLTP workload on PostgreSQL tables with foreign keys, and views to check against it.

Tables: customers, products, orders (FKs to both, ON DELETE CASCADE from
customers), audit (no key, REPLICA IDENTITY FULL: a bag, so a change applied
twice shows), marker (one row; bumped to mark a point in the stream).
"""

from __future__ import annotations

import contextlib
import random
import time
from decimal import Decimal

import psycopg2

SCHEMA = """
CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, region text);
CREATE TABLE products (id integer PRIMARY KEY, price numeric(10,2) NOT NULL, label varchar(20));
CREATE TABLE orders (id bigint PRIMARY KEY, cust integer NOT NULL REFERENCES customers(id) ON DELETE CASCADE,
                     product integer NOT NULL REFERENCES products(id), qty integer NOT NULL,
                     placed timestamptz NOT NULL DEFAULT now(), paid boolean);
CREATE TABLE audit (cust integer, note text);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE TABLE marker (id integer PRIMARY KEY, round integer NOT NULL);
INSERT INTO marker VALUES (1, 0);
INSERT INTO customers SELECT i, 'c' || i, 'r' || (i % 4) FROM generate_series(1, 200) i;
INSERT INTO products SELECT i, (i * 1.25)::numeric(10,2), 'p' || i FROM generate_series(1, 50) i;
INSERT INTO orders SELECT i, 1 + i % 200, 1 + i % 50, 1 + i % 9, now(), i % 3 = 0 FROM generate_series(1, 2000) i;
INSERT INTO audit SELECT 1 + i % 200, 'seed' FROM generate_series(1, 300) i;
CREATE PUBLICATION shop FOR TABLE customers, products, orders, audit, marker;
"""

VIEWS = {
    "by_region": "SELECT c.region, COUNT(*) AS n, SUM(o.qty * p.price) AS revenue "
                 "FROM orders o JOIN customers c ON o.cust = c.id JOIN products p ON o.product = p.id "
                 "GROUP BY c.region",
    "big_orders": "SELECT o.id, c.name, o.qty, o.paid FROM orders o JOIN customers c ON o.cust = c.id WHERE o.qty > 6",
    "audit_counts": "SELECT cust, note, COUNT(*) AS n FROM audit GROUP BY cust, note",
}


def connect(dsn: str):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def create_database(admin_dsn: str, name: str) -> str:
    with contextlib.closing(connect(admin_dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    dsn = admin_dsn.replace("dbname=postgres", f"dbname={name}")
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
    return dsn


class Workload:
    """Random transactions of inserts, updates and deletes that respect the foreign keys."""

    def __init__(self, dsn: str, seed: int):
        self.dsn = dsn
        self.conn = psycopg2.connect(dsn)
        self.rng = random.Random(seed)
        self.next_order = 10_000_000 + seed * 1_000_000
        self.next_customer = 1_000_000 + seed * 100_000
        self.round = 0

    def close(self) -> None:
        self.conn.close()

    def transaction(self, statements: int = 5) -> None:
        cur = self.conn.cursor()
        for _ in range(statements):
            self._statement(cur)
        self.conn.commit()

    def _statement(self, cur) -> None:
        r = self.rng
        choice = r.random()
        if choice < 0.30:
            self.next_order += 1
            cur.execute("INSERT INTO orders (id, cust, product, qty, paid) SELECT %s, id, %s, %s, %s "
                        "FROM customers ORDER BY random() LIMIT 1",
                        (self.next_order, r.randint(1, 50), r.randint(1, 12), r.choice([True, False, None])))
        elif choice < 0.45:
            cur.execute("UPDATE orders SET qty = qty + %s, paid = NOT coalesce(paid, false) "
                        "WHERE id IN (SELECT id FROM orders ORDER BY random() LIMIT %s)", (r.randint(-1, 3), r.randint(1, 3)))
        elif choice < 0.55:
            cur.execute("DELETE FROM orders WHERE id IN (SELECT id FROM orders ORDER BY random() LIMIT %s)",
                        (r.randint(1, 3),))
        elif choice < 0.62:
            self.next_customer += 1
            cur.execute("INSERT INTO customers VALUES (%s, %s, %s)",
                        (self.next_customer, f"n{self.next_customer}", r.choice(["r0", "r1", "r2", "r3", None])))
        elif choice < 0.70:
            cur.execute("UPDATE customers SET region = %s WHERE id = (SELECT id FROM customers ORDER BY random() LIMIT 1)",
                        (r.choice(["r0", "r1", "r2", "r3", "r9", None]),))
        elif choice < 0.74:  # cascades to the customer's orders
            cur.execute("DELETE FROM customers WHERE id = (SELECT id FROM customers ORDER BY random() LIMIT 1)")
        elif choice < 0.78:  # a key change: the new id must not exist yet
            self.next_customer += 1
            cur.execute("UPDATE customers SET id = %s WHERE id = (SELECT id FROM customers WHERE id NOT IN "
                        "(SELECT cust FROM orders) ORDER BY random() LIMIT 1)", (self.next_customer,))
        elif choice < 0.84:
            cur.execute("UPDATE products SET price = price + %s WHERE id = %s",
                        (Decimal(r.randint(-100, 300)) / 100, r.randint(1, 50)))
        elif choice < 0.94:
            cur.execute("INSERT INTO audit VALUES (%s, %s)", (r.randint(1, 220), r.choice(["a", "b", "a"])))
        else:
            cur.execute("DELETE FROM audit WHERE ctid = (SELECT ctid FROM audit ORDER BY random() LIMIT 1)")

    def mark(self) -> int:
        """Bump the marker; return an LSN below its commit and above every earlier one.

        The WAL insert position (not the write position, which can trail it)
        is past every earlier commit record, so a source whose applied commit
        LSN reaches it has applied the marker's group, and so everything before.
        """
        cur = self.conn.cursor()
        cur.execute("SELECT pg_current_wal_insert_lsn()::text")
        (lsn,) = cur.fetchone()
        self.round += 1
        cur.execute("UPDATE marker SET round = %s", (self.round,))
        self.conn.commit()
        from ivm.cdc.postgres import lsn_int

        return lsn_int(lsn)

    def expected(self) -> dict[str, list]:
        """Each view's SELECT run in PostgreSQL now."""
        cur = self.conn.cursor()
        found = {}
        for name, sql in VIEWS.items():
            cur.execute(sql)
            found[name] = normalized(cur.fetchall())
        self.conn.commit()
        return found


def normalized(rows) -> list:
    def value(v):
        if isinstance(v, (Decimal, float)):
            return round(float(v), 4)
        return v
    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


def ivm_views(db) -> dict[str, list]:
    return {name: normalized(tuple(r.values()) for r in db.sql(f"SELECT * FROM {name}").to_pylist())
            for name in VIEWS}


def create_views(db) -> None:
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")


def wait_for(condition, what: str, timeout: float = 60.0):
    """Poll ``condition`` until it holds something truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def wait_applied(progress, lsn: int, timeout: float = 60.0) -> None:
    """Wait until ``progress()`` (a dict with applied_lsn) reaches ``lsn``."""
    from ivm.cdc.postgres import lsn_int

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = progress() or {}
        if found.get("error"):
            raise AssertionError(f"the source failed: {found['error']}")
        applied = found.get("applied_lsn")
        if applied and lsn_int(applied) >= lsn:
            return
        time.sleep(0.05)
    raise AssertionError(f"the source did not reach LSN {lsn} within {timeout} s: {progress()}")
