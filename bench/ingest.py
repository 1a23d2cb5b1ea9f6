"""Durable ingest: acknowledgement latency and sustained throughput (issue 4, acceptance 4).

    python -m bench.ingest --initial 1000000 --batches 300 --producers 1 4 8 [--fold-delay 0.02]

Measures, on a database in a fresh temporary directory:

* the machine's sync cost: ``fdatasync`` after appending 40 KB (about one
  1,000-row record), median and p99;
* acknowledgement latency of 1,000-row batches (``apply_changes`` until it
  returns the offset, i.e. the record is on disk), one producer, with three
  views maintained in the background: median, p95, p99;
* sustained rows/s with the three views maintained: P producer threads send
  batches for the whole run, the clock stops when the views reflect the last
  acknowledged batch (a read returns), so maintenance is included; also the
  process's CPU time over that run (rows per CPU second: what the work costs
  on a shared machine, whatever else runs);
* read-your-writes wait: a read issued right after an acknowledgement waits
  for the maintainer to fold it: median and p99 of that read;
* per throughput run, the background checkpoints that ended in it: how
  many, median, max and total seconds, rows appended and rows overwritten;
* per throughput run, the issue's two targets read off that one run (one
  operating point: rows/s sustained and the ack median/p99 of the same
  batches), and how many batches each view took incrementally or recomputed;
* the same stream on an in-memory database (synchronous maintenance, no log),
  for comparison;
* full recompute: DuckDB computing the three views from the final tables,
  i.e. the cost per batch of keeping them fresh without incremental
  maintenance, and the rows/s that would allow (ratio against the best
  durable rows/s).

Views: a per-customer aggregate (computed on read from its state), a join of
orders and customers grouped by region, and a filter/projection (stored).
Batches: 1,000 upserts each, 80% new order ids and 20% updates of existing
ones. The views are checked against DuckDB recomputing them at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

import ivm

SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, status VARCHAR)",
    "CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR)",
]
VIEWS = {
    "per_customer": "SELECT cust, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY cust",
    "per_region": """SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total
        FROM orders o JOIN customers c ON o.cust = c.id GROUP BY c.region""",
    "large_orders": "SELECT id, cust, amount FROM orders WHERE amount > 990",
}
CUSTOMERS = 10_000
STATUSES = np.array(["open", "closed", "cancelled"], dtype=object)


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values), p)) if values else float("nan")


def sync_cost(directory: Path, n: int = 200) -> dict:
    path = directory / "sync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    data = b"x" * 40_000
    times = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            times.append((time.perf_counter() - start) * 1e3)
    finally:
        os.close(fd)
        path.unlink()
    return {"median_ms": statistics.median(times), "p99_ms": pct(times, 99)}


class Stream:
    """Batches of 1,000 upserts with fresh and existing ids (thread-safe id allocation)."""

    def __init__(self, first_id: int, seed: int):
        self.next_id = first_id
        self.lock = threading.Lock()
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> pa.Table:
        with self.lock:
            new = int(size * 0.8)
            ids = np.arange(self.next_id, self.next_id + new)
            old = self.rng.choice(self.next_id, size=size - new, replace=False)
            self.next_id += new
            rng = np.random.default_rng(self.rng.integers(1 << 62))
        ids = np.concatenate([ids, old])
        return pa.table({
            "id": ids,
            "cust": rng.integers(0, CUSTOMERS, size),
            "amount": np.round(rng.uniform(0, 1000, size), 2),
            "status": STATUSES[rng.integers(0, 3, size)],
            "__op": pa.array(["u"] * size),
        })


def load(db: ivm.Database, initial: int) -> Stream:
    for statement in SCHEMA:
        db.execute(statement)
    rng = np.random.default_rng(0)
    db.apply_changes("customers", pa.table({
        "id": np.arange(CUSTOMERS), "region": np.array(["north", "south", "east", "west"], dtype=object)[
            rng.integers(0, 4, CUSTOMERS)]}))
    stream = Stream(0, seed=1)
    stream.next_id = 0
    if initial:
        start = 0
        while start < initial:
            n = min(100_000, initial - start)
            db.apply_changes("orders", pa.table({
                "id": np.arange(start, start + n), "cust": rng.integers(0, CUSTOMERS, n),
                "amount": np.round(rng.uniform(0, 1000, n), 2), "status": STATUSES[rng.integers(0, 3, n)]}))
            start += n
        stream.next_id = initial
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    return stream


def latency(db: ivm.Database, stream: Stream, batches: int, size: int) -> dict:
    acks, reads = [], []
    for i in range(batches):
        batch = stream.batch(size)
        start = time.perf_counter()
        db.apply_changes("orders", batch)
        acks.append((time.perf_counter() - start) * 1e3)
        if i % 10 == 9:  # now and then, read right after the ack: the wait for the fold
            start = time.perf_counter()
            db.sql("SELECT COUNT(*) FROM large_orders")
            reads.append((time.perf_counter() - start) * 1e3)
    return {"ack_median_ms": statistics.median(acks), "ack_p95_ms": pct(acks, 95), "ack_p99_ms": pct(acks, 99),
            "ack_max_ms": max(acks), "read_after_ack_median_ms": statistics.median(reads),
            "read_after_ack_p99_ms": pct(reads, 99)}


def throughput(db: ivm.Database, stream: Stream, producers: int, batches: int, size: int) -> dict:
    per = batches // producers
    prepared = [[stream.batch(size) for _ in range(per)] for _ in range(producers)]
    acks: list[float] = []
    lock = threading.Lock()

    def produce(mine: list[pa.Table]) -> None:
        local = []
        for batch in mine:
            start = time.perf_counter()
            db.apply_changes("orders", batch)
            local.append((time.perf_counter() - start) * 1e3)
        with lock:
            acks.extend(local)

    threads = [threading.Thread(target=produce, args=(mine,)) for mine in prepared]
    checkpointer = getattr(db._engine, "checkpointer", None)  # bench-only peek (durable databases)
    checkpoints = checkpointer.count if checkpointer is not None else 0
    cpu = process_cpu()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acked = time.perf_counter() - start
    db.sql("SELECT COUNT(*) FROM per_region")  # waits until the views hold every acknowledged batch
    folded = time.perf_counter() - start
    cpu = process_cpu() - cpu
    rows = per * producers * size
    result = {"producers": producers, "rows": rows, "rows_per_s": rows / folded, "acked_rows_per_s": rows / acked,
              "seconds": folded, "ack_median_ms": statistics.median(acks), "ack_p99_ms": pct(acks, 99),
              "cpu_seconds": cpu, "rows_per_cpu_s": rows / cpu}
    if checkpointer is not None:
        result.update(checkpoint_stats(checkpointer, checkpoints))
    return result


def checkpoint_stats(checkpointer, before: int) -> dict:
    """The background checkpoints that ended during a run: how many, their seconds (median,
    max, sum: the checkpointer's share of the window)."""
    done = checkpointer.count - before
    seconds = list(checkpointer.durations)[-done:] if done else []
    written = list(checkpointer.written)[-done:] if done else []
    return {"checkpoints": done, "checkpoint_median_s": statistics.median(seconds) if seconds else None,
            "checkpoint_max_s": max(seconds, default=None), "checkpoint_total_s": sum(seconds),
            "checkpoint_rows_appended": sum(a for a, _ in written),
            "checkpoint_rows_overwritten": sum(o for _, o in written)}


TARGET_ROWS_PER_S = 500_000  # issue 4, acceptance 4: both at one operating point
TARGET_ACK_P99_MS = 20.0


def operating_point(result: dict) -> dict:
    """Both targets of the issue, read off one throughput run (the same producers, the same seconds)."""
    rate_met = result["rows_per_s"] >= TARGET_ROWS_PER_S
    p99_met = result["ack_p99_ms"] < TARGET_ACK_P99_MS
    summary = (f"{result['producers']} producer(s): {result['rows_per_s']:,.0f} rows/s sustained "
               f"({'>=' if rate_met else '<'} {TARGET_ROWS_PER_S:,}), ack median {result['ack_median_ms']:.2f} ms, "
               f"p99 {result['ack_p99_ms']:.2f} ms ({'<' if p99_met else '>='} {TARGET_ACK_P99_MS:g}): "
               f"{'both targets met' if rate_met and p99_met else 'targets not both met'}")
    return {"producers": result["producers"], "rows_per_s": result["rows_per_s"],
            "ack_median_ms": result["ack_median_ms"], "ack_p99_ms": result["ack_p99_ms"],
            "both_met": rate_met and p99_met, "summary": summary}


def maintenance_paths(db: ivm.Database) -> dict:
    """Per view, the batches (folds) since CREATE maintained incrementally and recomputed (the cost model may
    switch a view; a recompute reads whole tables, so it shows in the rows/s)."""
    views = db._engine.catalog.views  # bench-only peek, like bench/cpu_costs.py
    return {name: dict(views[name].cost.batches, rebuilds=views[name].cost.rebuilds) for name in VIEWS}


def process_cpu() -> float:
    """CPU seconds this process used (all threads): on a shared machine, rows per CPU
    second says what the code costs regardless of what else runs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def check(db: ivm.Database) -> dict:
    """Each view equals DuckDB recomputing it over the database's tables (DOUBLE sums to 1e-9).

    Returns how long that recompute takes (all three views, from in-memory
    Arrow tables, median of 3): what keeping the views fresh by recomputing
    them after every batch would cost per batch."""
    ref = duckdb.connect()
    orders = db.sql("SELECT * FROM orders")  # noqa: F841  (read by DuckDB)
    customers = db.sql("SELECT * FROM customers")  # noqa: F841
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for sql in VIEWS.values():
            ref.sql(sql).to_arrow_table()
        times.append((time.perf_counter() - start) * 1e3)
    for name, sql in VIEWS.items():
        want = sorted(ref.sql(sql).fetchall())
        got = sorted(tuple(r.values()) for r in db.sql(f"SELECT * FROM {name}").to_pylist())
        same = len(got) == len(want) and all(
            all(math.isclose(a, b, rel_tol=1e-9) if isinstance(a, float) else a == b for a, b in zip(g, w))
            for g, w in zip(got, want))
        if not same:
            raise AssertionError(f"view {name} differs from its recompute")
    return {"orders": orders.num_rows, "recompute_3_views_ms": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--initial", type=int, default=1_000_000, help="orders loaded before the views exist")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--fold-delay", type=float, default=None,
                        help="the maintainer's fold_delay in seconds (default: the engine's, 0.1)")
    parser.add_argument("--convert-ahead-rows", type=int, default=None,
                        help="the maintainer's convert_ahead_rows (default: the engine's, 20,000)")
    parser.add_argument("--dir", default=None, help="where the temporary database goes (default: the system's temp dir)")
    parser.add_argument("--out", default="")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the in-memory comparison (long windows: it takes as long again)")
    args = parser.parse_args()
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)", "args": vars(args),
                     "load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results["fdatasync_40KB"] = sync_cost(Path(tmp))
        print("fdatasync 40 KB:", json.dumps(results["fdatasync_40KB"]), flush=True)
        options = {} if args.fold_delay is None else {"fold_delay": args.fold_delay}
        if args.convert_ahead_rows is not None:
            options["convert_ahead_rows"] = args.convert_ahead_rows
        db = ivm.connect(Path(tmp) / "db", **options)
        stream = load(db, args.initial)
        results["durable_latency"] = latency(db, stream, args.batches, args.batch_size)
        print("durable, 1 producer:", json.dumps(results["durable_latency"]), flush=True)
        results["durable_throughput"] = []
        for producers in args.producers:
            result = throughput(db, stream, producers, args.batches, args.batch_size)
            results["durable_throughput"].append(result)
            print("durable throughput:", json.dumps(result), flush=True)
        results["operating_points"] = [operating_point(r) for r in results["durable_throughput"]]
        for point in results["operating_points"]:
            print("operating point:", point["summary"], flush=True)
        results["maintenance_paths"] = maintenance_paths(db)
        print("views' maintenance paths (batches):", json.dumps(results["maintenance_paths"]), flush=True)
        results["recompute"] = check(db)
        best = max(r["rows_per_s"] for r in results["durable_throughput"])
        results["recompute"]["recompute_rows_per_s"] = args.batch_size / (results["recompute"]["recompute_3_views_ms"] / 1e3)
        results["recompute"]["incremental_over_recompute"] = best / results["recompute"]["recompute_rows_per_s"]
        print("recompute after every batch instead:", json.dumps(results["recompute"]), flush=True)
        results["status"] = {k: v for k, v in db.status().items() if k != "relations"}
        db.close()
    if args.no_memory:
        print("load average at start / end:", results["load_average_at_start"], os.getloadavg())
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        return
    memory = ivm.connect()
    stream = load(memory, args.initial)
    results["memory_throughput"] = throughput(memory, stream, 1, args.batches, args.batch_size)
    print("in memory (synchronous):", json.dumps(results["memory_throughput"]), flush=True)
    check(memory)
    memory.close()
    results["load_average_at_end"] = os.getloadavg()
    print("load average at start / end:", results["load_average_at_start"], results["load_average_at_end"])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
