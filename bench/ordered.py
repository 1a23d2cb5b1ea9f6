"""Window and top-K views: incremental maintenance versus full recompute (issue 3).

    python -m bench.ordered --rows 1000000 --batches 30 --batch-size 1000

Same tables and change stream as bench/core.py (orders: 40% inserts, 40%
updates moving orders between customers and changing amounts, 20% deletes),
one database per view, timing each ``apply_changes`` (ingest + maintenance)
against DuckDB recomputing the view over native tables in the same run.

Views: a global top-10, a top-10 over an aggregate (TPC-H Q3/Q10/Q18's
shape), per-customer top-3 by QUALIFY, and two window views over all rows.
A last scenario, ``top10_drain``, deletes the current top 20 rows in every
batch: the worst case for the top-K buffer, which then needs a refill (a scan
of the input) every few batches.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

import ivm
from bench.core import (change_batch, database_with_view, generate, percentile, recompute_and_check,
                        write_results)

VIEWS = {
    "top10": "SELECT id, cust, amount FROM orders ORDER BY amount DESC, id LIMIT 10",
    "top10_customers": """SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust
        ORDER BY total DESC, cust LIMIT 10""",
    "top3_per_customer": """SELECT id, cust, amount FROM orders
        QUALIFY ROW_NUMBER() OVER (PARTITION BY cust ORDER BY amount DESC, id) <= 3""",
    "rank_in_customer": """SELECT id, cust, RANK() OVER (PARTITION BY cust ORDER BY amount DESC) AS r,
        SUM(amount) OVER (PARTITION BY cust ORDER BY id ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS recent
        FROM orders""",
    "top10_drain": "SELECT id, cust, amount FROM orders ORDER BY amount DESC, id LIMIT 10",
}


def drain_batch(db: ivm.Database, size: int) -> pa.Table:
    """Delete the current top ``size`` rows by amount (what a queue consumer does)."""
    top = db.sql(f"SELECT id FROM orders ORDER BY amount DESC, id LIMIT {size}")
    return pa.table({"id": top.column("id"), "__op": pa.array(["d"] * top.num_rows)})


def run_view(data: dict[str, pa.Table], rows: int, view: str, batches: int, batch_size: int, seed: int) -> dict:
    customers = data["customers"].num_rows
    db, create = database_with_view(data, view, VIEWS[view])
    rng = np.random.default_rng(seed)
    next_id, deleted, latencies = rows, set(), []
    for _ in range(batches):
        if view == "top10_drain":
            batch = drain_batch(db, 20)
        else:
            batch, next_id = change_batch(rng, next_id, rows, customers, batch_size, deleted)
        start = time.perf_counter()
        db.apply_changes("orders", batch, on_missing_delete="ignore")
        latencies.append(time.perf_counter() - start)
    recompute, equal = recompute_and_check(db, view, VIEWS[view], repeats=max(5, batches // 4))
    median, recompute_median = statistics.median(latencies) * 1000, statistics.median(recompute) * 1000
    return {
        "rows": rows, "view": view, "batch_size": 20 if view == "top10_drain" else batch_size, "batches": batches,
        "create_s": create, "batch_median_ms": median, "batch_p95_ms": percentile(latencies, 95) * 1000,
        "batch_max_ms": max(latencies) * 1000, "recompute_median_ms": recompute_median,
        "ratio": recompute_median / median, "equal_to_recompute": equal,
    }


def report(results: list[dict]) -> str:
    lines = [
        "| rows | view | batch | ivm per batch median (ms) | p95 (ms) | max (ms) | recompute median (ms) | ratio | equal |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {r['view']} | {r['batch_size']} | {r['batch_median_ms']:.1f} | {r['batch_p95_ms']:.1f} | "
            f"{r['batch_max_ms']:.1f} | {r['recompute_median_ms']:.1f} | {r['ratio']:.1f}x | {r['equal_to_recompute']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--views", nargs="*", default=list(VIEWS))
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    data = generate(duckdb.connect(), args.rows)
    results = [run_view(data, args.rows, v, args.batches, args.batch_size, args.seed) for v in args.views]
    write_results(Path(args.out), "ordered", results, report(results))


if __name__ == "__main__":
    main()
