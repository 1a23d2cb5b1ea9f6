"""Interval stream-stream join: incremental with expiring state vs DuckDB recomputing, per batch.

    python -m bench.interval_join --events 1000000 --batch 20000

Two streams (bids, asks; 1,000 events per second of event time each, up to
4 s out of order, WATERMARK 5 s, RETAIN 5 s) get batches in turn; views: an
interval join (same auction, asks within 2 s of the bid) and a tumbling
10 s count/MAX over bids. Per batch: process CPU seconds of the ingest
(which maintains both views), and in the same run DuckDB computing both
SELECTs from scratch over every event so far; the stored stream rows (tables
+ the on-time rows the join keeps) after each batch. The join is checked
against DuckDB at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import duckdb
import numpy as np
import pyarrow as pa

import ivm
from bench.event_time import pct
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows

JOIN = ("SELECT b.auction, b.price AS bid, a.price AS ask, b.ts FROM bids b JOIN asks a ON b.auction = a.auction "
        "AND a.ts BETWEEN b.ts - INTERVAL '2' SECOND AND b.ts + INTERVAL '2' SECOND")
WINDOW = ("SELECT window_start, COUNT(*) AS n, MAX(price) AS top FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) "
          "GROUP BY window_start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000, help="both streams together")
    parser.add_argument("--batch", type=int, default=20_000, help="events per batch (of one stream)")
    parser.add_argument("--rate", type=int, default=1_000, help="events per second of event time, per stream")
    parser.add_argument("--keys", type=int, default=50_000, help="distinct auctions")
    args = parser.parse_args()
    db, ref = ivm.connect(), duckdb.connect()
    for name in ("bids", "asks"):
        db.execute(f"CREATE TABLE {name} (auction BIGINT, price BIGINT, ts TIMESTAMP, "
                   "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY RETAIN INTERVAL '5' SECOND")
        ref.execute(f"CREATE TABLE {name} (auction BIGINT, price BIGINT, ts TIMESTAMP)")
    db.execute(f"CREATE MATERIALIZED VIEW matched AS {JOIN}")
    db.execute(f"CREATE MATERIALIZED VIEW per_window AS {WINDOW}")
    window_sql = expand_time_windows(parse_query(WINDOW), db._engine.catalog.schema()).sql("duckdb")
    rng = np.random.default_rng(3)
    incremental, full, stored = [], [], []
    for first in range(0, args.events // 2, args.batch):
        for name in ("bids", "asks"):
            us = (np.arange(first, first + args.batch) * (1e6 / args.rate)).astype(np.int64)
            us -= rng.integers(0, 4_000_000, args.batch)
            batch = pa.table({"auction": rng.integers(1, args.keys, args.batch),
                              "price": rng.integers(0, 100, args.batch),
                              "ts": pa.array(np.datetime64("2024-01-01", "us") + us.astype("timedelta64[us]"))})
            started = time.process_time()
            db.apply_changes(name, batch)
            incremental.append(time.process_time() - started)
            snapshot = db._engine.store.snapshot
            stored.append(sum(snapshot[t].num_rows for t in ("bids", "asks", "__ontime_bids", "__ontime_asks")))
            ref.execute(f"INSERT INTO {name} SELECT * FROM batch")
            started = time.process_time()
            ref.sql(JOIN).to_arrow_table()
            ref.sql(window_sql).to_arrow_table()
            full.append(time.process_time() - started)
    got = db.sql("SELECT COUNT(*) AS n FROM matched").column(0)[0].as_py()
    want = ref.sql(f"SELECT COUNT(*) FROM ({JOIN})").fetchall()[0][0]
    assert got == want, (got, want)
    print(f"{args.events:,} events (2 streams) in batches of {args.batch:,}, {args.rate:,}/s per stream; "
          f"load average {os.getloadavg()[0]:.1f}")
    for label, values in (("incremental (ingest + join + window)", incremental), ("recompute (2 views, DuckDB)", full)):
        print(f"{label}: CPU s per batch median {statistics.median(values):.4f} p95 {pct(values, .95):.4f} "
              f"p99 {pct(values, .99):.4f}; total {sum(values):.2f}")
    print(f"recompute / incremental (medians): {statistics.median(full) / statistics.median(incremental):.1f}x; "
          f"last batch: {full[-1] / incremental[-1]:.1f}x")
    print(f"stored stream rows (tables + on-time rows kept): max {max(stored):,}, last {stored[-1]:,} "
          f"(of {args.events:,} events); join rows {got:,} (= DuckDB)")


if __name__ == "__main__":
    main()
