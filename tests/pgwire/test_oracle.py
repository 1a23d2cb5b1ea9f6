"""The differential oracle through psycopg: random changes over pgwire, every view equal to recompute.

Random inserts, updates and deletes (seeded, bounded; with NULLs, duplicate
values, and deletes of a group's current MIN) go to two tables over the
PostgreSQL door (simple and extended protocol, COPY); after each batch every
view read over pgwire must equal DuckDB evaluating the view's SELECT over the
tables' current rows, as multisets.
"""

from __future__ import annotations

import decimal
import random
from collections import Counter

import duckdb
import pytest

from tests.flight.server import ServerProcess
from tests.pgwire.conftest import connect

TABLES = {
    "o_orders": "CREATE TABLE o_orders (id BIGINT PRIMARY KEY, cust BIGINT, amount INTEGER, note TEXT)",
    "o_custs": "CREATE TABLE o_custs (cust BIGINT PRIMARY KEY, region TEXT)",
}
VIEWS = {
    "o_minmax": "SELECT cust, MIN(amount) AS lo, MAX(amount) AS hi, COUNT(*) AS n FROM o_orders GROUP BY cust",
    "o_sums": "SELECT cust, SUM(amount) AS s, COUNT(amount) AS c FROM o_orders GROUP BY cust",
    "o_joined": "SELECT o.id, o.amount, c.region FROM o_orders o JOIN o_custs c ON o.cust = c.cust",
    "o_regions": "SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MIN(o.note) AS first_note "
                 "FROM o_orders o JOIN o_custs c ON o.cust = c.cust GROUP BY c.region",
}
BATCHES = 12


def _normal(value):
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value():
        return int(value)
    return value


def _multiset(rows) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in rows)


def _recompute(orders: dict, custs: dict, sql: str) -> Counter:
    with duckdb.connect() as duck:
        duck.execute("CREATE TABLE o_orders (id BIGINT, cust BIGINT, amount INTEGER, note TEXT)")
        duck.execute("CREATE TABLE o_custs (cust BIGINT, region TEXT)")
        if orders:
            duck.executemany("INSERT INTO o_orders VALUES (?, ?, ?, ?)", [(k, *v) for k, v in orders.items()])
        if custs:
            duck.executemany("INSERT INTO o_custs VALUES (?, ?)", list(custs.items()))
        return _multiset(duck.execute(sql).fetchall())


def _batch(conn, rng: random.Random, orders: dict, custs: dict, next_id: list[int]) -> None:
    kind = rng.choice(["insert", "insert", "update", "delete", "delete_min", "copy", "custs"])
    if kind in ("insert", "copy"):
        rows = []
        for _ in range(rng.randint(1, 6)):
            next_id[0] += 1
            rows.append((next_id[0], rng.choice([None, 1, 2, 3, 4]), rng.choice([None, 5, 5, 7, -3, 10]),
                         rng.choice([None, "a", "b", "b"])))
        if kind == "insert":
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO o_orders VALUES (%s, %s, %s, %s)", rows)
        else:
            with conn.cursor().copy("COPY o_orders (id, cust, amount, note) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        orders.update({r[0]: r[1:] for r in rows})
    elif kind == "update" and orders:
        for key in rng.sample(sorted(orders), min(len(orders), rng.randint(1, 3))):
            amount = rng.choice([None, 0, 5, 12])
            conn.execute("UPDATE o_orders SET amount = %s WHERE id = %s", (amount, key), prepare=True)
            orders[key] = (orders[key][0], amount, orders[key][2])
    elif kind == "delete" and orders:
        key = rng.choice(sorted(orders))
        conn.execute(f"DELETE FROM o_orders WHERE id = {key}")  # simple protocol
        del orders[key]
    elif kind == "delete_min":
        groups = {}
        for key, (cust, amount, _) in orders.items():
            if amount is not None and (cust not in groups or amount < groups[cust][1]):
                groups[cust] = (key, amount)
        if groups:
            key, _ = groups[rng.choice(sorted(groups, key=str))]
            conn.execute("DELETE FROM o_orders WHERE id = %s", (key,))
            del orders[key]
    elif kind == "custs":
        cust = rng.randint(1, 4)
        region = rng.choice(["north", "south", None])
        if cust in custs and rng.random() < 0.4:
            conn.execute("DELETE FROM o_custs WHERE cust = %s", (cust,))
            del custs[cust]
        elif cust in custs:
            conn.execute("UPDATE o_custs SET region = %s WHERE cust = %s", (region, cust))
            custs[cust] = region
        else:
            conn.execute("INSERT INTO o_custs VALUES (%s, %s)", (cust, region))
            custs[cust] = region


@pytest.fixture(params=[1, 2])
def seed(request):
    return request.param


@pytest.fixture
def fresh(seed):
    """A server per seed: each starts from empty tables."""
    process = ServerProcess("--pg-port", "0")
    try:
        yield process
    finally:
        process.stop()


def test_views_equal_recompute_over_pgwire(fresh, seed):
    server = fresh
    rng = random.Random(seed)
    with connect(server) as conn:
        for name, ddl in TABLES.items():
            conn.execute(ddl)
        for name, sql in VIEWS.items():
            conn.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        orders: dict = {}
        custs: dict = {}
        next_id = [0]
        for step in range(BATCHES):
            _batch(conn, rng, orders, custs, next_id)
            for name, sql in VIEWS.items():
                got = _multiset(conn.execute(f"SELECT * FROM {name}").fetchall())
                assert got == _recompute(orders, custs, sql), f"seed {seed}, batch {step}: view {name}"
