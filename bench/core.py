"""Incremental maintenance versus full recompute (issue 2's first benchmark).

    python -m bench.core --rows 1000000 10000000 --batches 40 --batch-size 1000

For each table size it builds

    orders(id PK, cust, amount, qty, status)          N rows
    customers(id PK, nation, segment)                  N/10 rows
    nations(id PK, name)                               25 rows

and two views: a single-table GROUP BY over orders, and a 3-table join with
GROUP BY. It then streams change batches to orders (inserts of new orders,
updates that move orders between customers, deletes) and times each
``apply_changes`` with a read of the view after it (ingest, maintenance and
the read, as a user sees them), and, in the same run, DuckDB recomputing
each view from native tables holding the same data. Each view runs in its
own database (so its per-batch cost includes ingest), over the same change
stream. Reports median and p95 per batch, the recompute median and the
ratio, and checks at the end that the view equals its recompute.

The read is a prepared point read of the view (``SELECT * FROM v WHERE key
= $1``, a random key, as a server runs one: ``point_read``). A view read
from its operators' state may compute its rows for reads on the first read
of a new version, so without the read that work would leave the clock.

The recompute is timed between the batches, not after them: after each
batch the same change is applied (untimed) to native DuckDB tables and the
view's SELECT is run over them once. This host's speed moves by 2x within
seconds (a 10M-step Python loop: 0.5 to 1.1 s back to back), so a baseline
timed in one stretch after the batches could land on a faster or slower
minute than the batches did; interleaved, each pair meets the same host.
The native tables are also the check: the view must equal their recompute.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

import ivm

VIEWS = {
    "per_customer": """SELECT cust, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS biggest
        FROM orders GROUP BY cust""",
    "nation_segment": """SELECT n.name, c.segment, COUNT(*) AS n, SUM(o.amount) AS total, AVG(o.qty) AS avg_qty
        FROM orders o JOIN customers c ON o.cust = c.id JOIN nations n ON c.nation = n.id
        GROUP BY n.name, c.segment""",
}
# Each view's point read (see the module doc): its key column, and a random key of it.
READ_KEYS = {
    "per_customer": ("cust", lambda rng, customers: pa.scalar(int(rng.integers(customers)), pa.int64())),
    "nation_segment": ("name", lambda rng, customers: pa.scalar(f"nation_{int(rng.integers(25))}", pa.string())),
}
SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, qty INTEGER, status VARCHAR)",
    "CREATE TABLE customers (id BIGINT PRIMARY KEY, nation INTEGER, segment VARCHAR)",
    "CREATE TABLE nations (id INTEGER PRIMARY KEY, name VARCHAR)",
]


def generate(con: duckdb.DuckDBPyConnection, rows: int) -> dict[str, pa.Table]:
    customers = max(10, rows // 10)
    return {
        "nations": con.sql("SELECT i::INTEGER AS id, 'nation_' || i AS name FROM range(25) t(i)").to_arrow_table(),
        "customers": con.sql(
            f"""SELECT i AS id, (hash(i) % 25)::INTEGER AS nation,
                   ['AUTOMOBILE','BUILDING','FURNITURE','HOUSEHOLD','MACHINERY'][((hash(i * 7) % 5) + 1)::BIGINT] AS segment
                FROM range({customers}) t(i)"""
        ).to_arrow_table(),
        "orders": con.sql(
            f"""SELECT i AS id, (hash(i) % {customers})::BIGINT AS cust,
                   round((hash(i * 3) % 100000) / 100.0, 2) AS amount, (hash(i * 5) % 50)::INTEGER AS qty,
                   ['open','shipped','cancelled'][((hash(i * 11) % 3) + 1)::BIGINT] AS status
                FROM range({rows}) t(i)"""
        ).to_arrow_table(),
    }


def change_batch(rng: np.random.Generator, next_id: int, rows: int, customers: int, size: int,
                 deleted: set[int]) -> tuple[pa.Table, int]:
    """40% inserts of new orders, 40% updates (moving customer/amount), 20% deletes."""
    kinds = rng.choice(3, size=size, p=[0.4, 0.4, 0.2])
    n_new = int((kinds == 0).sum())
    existing = rng.choice(rows, size=size - n_new, replace=False)
    existing = np.array([k for k in existing if k not in deleted][: size - n_new], dtype=np.int64)
    ids = np.concatenate([np.arange(next_id, next_id + n_new), existing])
    ops = ["c"] * n_new + ["u" if k == 1 else "d" for k in kinds[kinds != 0][: len(existing)]]
    for k, op in zip(existing, ops[n_new:]):
        if op == "d":
            deleted.add(int(k))
    n = len(ids)
    table = pa.table({
        "id": ids,
        "cust": rng.integers(0, customers, n),
        "amount": np.round(rng.random(n) * 1000, 2),
        "qty": rng.integers(0, 50, n).astype(np.int32),
        "status": rng.choice(["open", "shipped", "cancelled"], n),
        "__op": ops,
    })
    return table, next_id + n_new


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def recompute_times(native: duckdb.DuckDBPyConnection, sql: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        native.sql(sql).to_arrow_table()
        times.append(time.perf_counter() - start)
    return times


def loaded_database(data: dict[str, pa.Table]) -> ivm.Database:
    """An in-memory database holding the tables of ``data``, no view."""
    db = ivm.connect()
    for statement in SCHEMA:
        db.execute(statement)
    for name in ("nations", "customers", "orders"):
        db.apply_changes(name, data[name])
    return db


def database_with_view(data: dict[str, pa.Table], view: str, sql: str) -> tuple[ivm.Database, float]:
    """An in-memory database loaded with ``data`` and holding one view; also the seconds CREATE took."""
    db = loaded_database(data)
    start = time.perf_counter()
    db.execute(f"CREATE MATERIALIZED VIEW {view} AS {sql}")
    return db, time.perf_counter() - start


def recompute_and_check(db: ivm.Database, view: str, sql: str, repeats: int) -> tuple[list[float], bool]:
    """Close ``db`` after timing DuckDB recomputing ``sql`` over the same rows and comparing it with the view.

    The recompute runs in the same process and run, over native DuckDB tables
    holding the tables' current rows, so the ratio compares like with like.
    """
    native = duckdb.connect()
    for name in ("nations", "customers", "orders"):
        current = db.sql(f"SELECT * FROM {name}")  # noqa: F841  (read by DuckDB)
        native.execute(f"CREATE TABLE {name} AS SELECT * FROM current")
    recompute = recompute_times(native, sql, repeats=repeats)
    equal = _equal(db.sql(f"SELECT * FROM {view}"), native.sql(sql).to_arrow_table())
    db.close()
    native.close()
    return recompute, equal


def point_read(db: ivm.Database, view: str, customers: int):
    """The view's prepared point read by ``READ_KEYS`` (as a server runs one): call it with a
    numpy Generator, it reads the rows of one random key."""
    column, pick = READ_KEYS[view]
    template = f"SELECT * FROM {view} WHERE {column} = $1"

    def read(rng: np.random.Generator) -> pa.Table:
        value = pick(rng, customers)
        literal = f"'{value.as_py()}'" if pa.types.is_string(value.type) else str(value.as_py())
        return db.bound_query(template, lambda: template.replace("$1", literal), [value])
    return read


def native_tables(data: dict[str, pa.Table]) -> duckdb.DuckDBPyConnection:
    """Native DuckDB tables holding ``data`` (the recompute's side of the comparison)."""
    native = duckdb.connect()
    for name, table in data.items():
        native.register("loaded", table)
        native.execute(f"CREATE TABLE {name} AS SELECT * FROM loaded")
        native.unregister("loaded")
    return native


def apply_native(native: duckdb.DuckDBPyConnection, batch: pa.Table) -> None:
    """``batch`` (change_batch's orders with ``__op``) applied to the native orders table."""
    native.register("batch", batch)
    native.execute("DELETE FROM orders WHERE id IN (SELECT id FROM batch WHERE __op <> 'c')")
    native.execute("INSERT INTO orders SELECT id, cust, amount, qty, status FROM batch WHERE __op <> 'd'")
    native.unregister("batch")


def run_view(data: dict[str, pa.Table], rows: int, view: str, batches: int, batch_size: int, seed: int) -> dict:
    """One database holding one view: per-batch cost = ingest + that view's maintenance; after each
    batch, one recompute of the view over native tables changed the same way (see the module doc)."""
    customers = data["customers"].num_rows
    db, create = database_with_view(data, view, VIEWS[view])
    native = native_tables(data)
    read = point_read(db, view, customers)

    rng = np.random.default_rng(seed)  # the same change stream for every view
    reads_rng = np.random.default_rng(seed + 1)  # keys to read: the change stream stays the same
    next_id = rows
    deleted: set[int] = set()
    latencies, reads, recompute = [], [], []
    for _ in range(batches):
        batch, next_id = change_batch(rng, next_id, rows, customers, batch_size, deleted)
        start = time.perf_counter()
        db.apply_changes("orders", batch)
        applied = time.perf_counter()
        read(reads_rng)
        done = time.perf_counter()
        latencies.append(done - start)
        reads.append(done - applied)
        apply_native(native, batch)
        recompute.extend(recompute_times(native, VIEWS[view], repeats=1))

    equal = _equal(db.sql(f"SELECT * FROM {view}"), native.sql(VIEWS[view]).to_arrow_table())
    db.close()
    native.close()
    median = statistics.median(latencies) * 1000
    recompute_median = statistics.median(recompute) * 1000
    return {
        "rows": rows, "view": view, "batch_size": batch_size, "batches": batches, "create_s": create,
        "batch_median_ms": median, "batch_p95_ms": percentile(latencies, 95) * 1000,
        "read_median_ms": statistics.median(reads) * 1000,
        "recompute_median_ms": recompute_median, "recompute_p95_ms": percentile(recompute, 95) * 1000,
        "ratio": recompute_median / median, "equal_to_recompute": equal,
        "batch_ms": [round(t * 1000, 2) for t in latencies], "recompute_ms": [round(t * 1000, 2) for t in recompute],
    }


def run_size(rows: int, batches: int, batch_size: int, seed: int) -> list[dict]:
    data = generate(duckdb.connect(), rows)
    return [run_view(data, rows, view, batches, batch_size, seed) for view in VIEWS]


def _equal(got: pa.Table, want: pa.Table) -> bool:
    import math

    def key(row):
        return tuple((0, "") if v is None else (1, round(v, 6) if isinstance(v, float) else v) for v in row.values())

    a = sorted(got.to_pylist(), key=key)
    b = sorted(want.to_pylist(), key=key)
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        for x, y in zip(ra.values(), rb.values()):
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6):
                    return False
            elif x != y:
                return False
    return True


def write_results(out: Path, name: str, results: list[dict], table: str) -> None:
    """Print the Markdown table and keep it, with the raw results and the machine, as ``out/name.{md,json}``."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(), "duckdb": duckdb.__version__}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    (out / f"{name}.md").write_text(table + "\n")


def report(results: list[dict]) -> str:
    lines = [
        "| rows | view | ivm per batch median (ms) | of which the read (ms) | p95 (ms) | recompute median (ms) | ratio"
        " | equal to recompute | create view (s) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {r['view']} | {r['batch_median_ms']:.1f} | {r['read_median_ms']:.2f} | {r['batch_p95_ms']:.1f} | "
            f"{r['recompute_median_ms']:.1f} | {r['ratio']:.1f}x | {r['equal_to_recompute']} | {r['create_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    results = [r for rows in args.rows for r in run_size(rows, args.batches, args.batch_size, args.seed)]
    write_results(Path(args.out), "core", results, report(results))


if __name__ == "__main__":
    main()
