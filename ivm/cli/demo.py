"""A small demo: tables, views, and a change stream you can watch.

Used by ``ivm demo`` (and ``./dev start``): it creates an orders/customers
schema, defines three materialized views, streams random change batches and
prints each view after every batch next to DuckDB recomputing it.
"""

from __future__ import annotations

import math
import random

import duckdb
import pyarrow as pa
from rich.console import Console
from rich.table import Table

import ivm

SCHEMA = [
    "CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, status VARCHAR)",
]
VIEWS = {
    "region_sales": """SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MAX(o.amount) AS biggest
        FROM orders o JOIN customers c ON o.cust = c.id
        WHERE o.status <> 'cancelled' GROUP BY c.region HAVING COUNT(*) > 1""",
    "open_orders": "SELECT status, COUNT(*) AS n, AVG(amount) AS avg_amount FROM orders GROUP BY status",
    "big_spenders": """SELECT c.id, c.region, SUM(o.amount) AS spent FROM customers c
        JOIN orders o ON o.cust = c.id GROUP BY c.id, c.region HAVING SUM(o.amount) > 150""",
}
REGIONS = ["north", "south", "east", "west"]
STATUSES = ["open", "shipped", "cancelled"]


def setup(db: ivm.Database, rows: int, rng: random.Random) -> None:
    for statement in SCHEMA:
        db.execute(statement)
    db.apply_changes("customers", pa.table({"id": list(range(1, 21)), "region": [rng.choice(REGIONS) for _ in range(20)]}))
    db.apply_changes("orders", pa.table({
        "id": list(range(1, rows + 1)),
        "cust": [rng.randint(1, 20) for _ in range(rows)],
        "amount": [round(rng.uniform(1, 100), 2) for _ in range(rows)],
        "status": [rng.choice(STATUSES) for _ in range(rows)],
    }))
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")


def change_batch(rng: random.Random, next_id: int, live: list[int], size: int) -> tuple[pa.Table, int]:
    ids, custs, amounts, statuses, ops = [], [], [], [], []
    for _ in range(size):
        kind = rng.random()
        if kind < 0.5 or not live:
            ids.append(next_id); next_id += 1; ops.append("c")
        elif kind < 0.8:
            ids.append(rng.choice(live)); ops.append("u")
        else:
            victim = rng.choice(live); live.remove(victim)
            ids.append(victim); ops.append("d")
        custs.append(rng.randint(1, 20))
        amounts.append(round(rng.uniform(1, 100), 2))
        statuses.append(rng.choice(STATUSES))
        if ops[-1] == "c":
            live.append(ids[-1])
    return pa.table({"id": ids, "cust": custs, "amount": amounts, "status": statuses, "__op": ops}), next_id


def show(console: Console, title: str, data: pa.Table) -> None:
    table = Table(title=title)
    for name in data.column_names:
        table.add_column(name)
    for row in data.to_pylist():
        table.add_row(*[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)


def run(batches: int = 3, rows: int = 200, seed: int = 7, shell: bool = False) -> None:
    console = Console()
    rng = random.Random(seed)
    db = ivm.connect()
    console.print(f"[bold]ivm demo[/bold]: in-memory database, {rows} orders, views: {', '.join(VIEWS)}")
    setup(db, rows, rng)
    live = list(range(1, rows + 1))
    next_id = rows + 1
    show(console, "region_sales (initial)", db.sql("SELECT * FROM region_sales ORDER BY region"))
    for i in range(batches):
        batch, next_id = change_batch(rng, next_id, live, 25)
        offset = db.apply_changes("orders", batch)
        view = db.sql("SELECT * FROM region_sales ORDER BY region")
        show(console, f"region_sales after batch {i + 1} (offset {offset}, {batch.num_rows} changes)", view)
        same = close(view, duckdb_recompute(db))
        console.print(f"  equal to recomputing from scratch: [{'green' if same else 'red'}]{same}[/]")
    console.print("\nEXPLAIN region_sales:")
    for line in db.sql("EXPLAIN region_sales").column(0).to_pylist()[:14]:
        console.print(f"  {line}")
    if shell:
        repl(db, console)
    db.close()


def close(a: pa.Table, b: pa.Table) -> bool:
    """Equal rows; DOUBLE sums may differ in the last bits (summation order)."""
    rows_a, rows_b = a.to_pylist(), b.to_pylist()
    return len(rows_a) == len(rows_b) and all(
        all(math.isclose(x, y, rel_tol=1e-12) if isinstance(x, float) else x == y for x, y in zip(ra.values(), rb.values()))
        for ra, rb in zip(rows_a, rows_b)
    )


def duckdb_recompute(db: ivm.Database) -> pa.Table:
    con = duckdb.connect()
    for name in ("customers", "orders"):
        con.register(name, db.sql(f"SELECT * FROM {name}"))
    return con.sql(VIEWS["region_sales"] + " ORDER BY region").to_arrow_table()


def repl(db: ivm.Database, console: Console) -> None:
    console.print("\nSQL shell (statements end with ';', Ctrl-D to quit)")
    buffer = ""
    while True:
        try:
            line = input("ivm> " if not buffer else "...> ")
        except EOFError:
            console.print()
            return
        buffer += line + "\n"
        if not buffer.strip().endswith(";"):
            continue
        try:
            show(console, "", db.sql(buffer))
        except ivm.IvmError as e:
            console.print(f"[red]{type(e).__name__}: {e}[/red]")
        buffer = ""
