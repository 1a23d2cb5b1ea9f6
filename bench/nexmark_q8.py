"""Nexmark q8 (monitor new users): people who opened an auction in the same 10 s window they registered.

    python -m bench.nexmark_q8 --events 1000000 --batch 50000

q8 as published (Beam's and Flink's Nexmark suites) groups ``person`` and
``auction`` each by a 10-second tumbling window and joins them on the
person id = the seller and the window; here TUMBLE in FROM gives the window
columns (README, "Event streams"). The generator (bench/nexmark.py) feeds
``person`` and ``auction`` as two watermarked APPEND ONLY streams, batch by
batch in event-time order; per batch this measures the process CPU seconds
of the ingest (which maintains the view) and, in the same run, DuckDB
computing the same SELECT from scratch over every event so far, and checks
the view against that result after every batch (``--check``, the default).

For ``ivm bench nexmark`` (bench/nexmark_queries.py, another branch) q8 is one
entry: ``register(NexmarkQuery("q8", TITLE, Q8, ("person", "auction")))``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import duckdb

import ivm
from bench import nexmark
from bench.event_time import pct
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows

TITLE = "monitor new users (person and auction grouped by TUMBLE 10 s, joined on id = seller and window)"
Q8 = """SELECT P.id, P.name, P.starttime
FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(person, date_time, INTERVAL '10' SECOND)
      GROUP BY id, name, window_start, window_end) P
JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(auction, date_time, INTERVAL '10' SECOND)
      GROUP BY seller, window_start, window_end) A
  ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"""
COLUMNS = {
    "person": ("id BIGINT, name VARCHAR, email VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, "
               "date_time TIMESTAMP, extra VARCHAR"),
    "auction": ("id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, "
                "date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR"),
}


def setup(db: ivm.Database, ref: duckdb.DuckDBPyConnection) -> str:
    """Create the two streams and the q8 view in ``db``, plain tables in ``ref``; the reference SELECT."""
    for table, columns in COLUMNS.items():
        db.execute(f"CREATE TABLE {table} ({columns}, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) "
                   "APPEND ONLY")
        ref.execute(f"CREATE TABLE {table} ({columns})")
    db.execute(f"CREATE MATERIALIZED VIEW q8 AS {Q8}")
    return expand_time_windows(parse_query(Q8), db._engine.catalog.schema()).sql("duckdb")


def feed(db: ivm.Database, ref: duckdb.DuckDBPyConnection, events: int, first: int, rate: int) -> float:
    """One batch of generator events into both; the CPU seconds of ivm's ingests (view maintenance included)."""
    person, auction, _ = nexmark.generate(events, first_event=first, rate=rate)
    spent = 0.0
    for name, batch in (("person", person), ("auction", auction)):
        started = time.process_time()
        db.apply_changes(name, batch)
        spent += time.process_time() - started
        ref.execute(f"INSERT INTO {name} SELECT * FROM batch")
    return spent


def main() -> None:
    from tests.oracle.compare import multiset_diff

    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=10_000, help="events per second of event time")
    parser.add_argument("--no-check", action="store_true", help="skip comparing with DuckDB after every batch")
    args = parser.parse_args()
    db, ref = ivm.connect(), duckdb.connect()
    reference = setup(db, ref)
    incremental, full = [], []
    for first in range(0, args.events, args.batch):
        incremental.append(feed(db, ref, min(args.batch, args.events - first), first, args.rate))
        started = time.process_time()
        expected = ref.sql(reference).to_arrow_table()
        full.append(time.process_time() - started)
        if not args.no_check:
            diff = multiset_diff(db.sql("SELECT * FROM q8"), expected)
            assert diff is None, f"q8 differs from DuckDB after the batch at event {first}: {diff}"
    snapshot = db._engine.store.snapshot
    state = sum(snapshot[s.name].num_rows for s in db._engine.catalog.views["q8"].states if s.name != "q8")
    print(f"q8 over {args.events:,} events in batches of {args.batch:,}, rate {args.rate:,}/s; "
          f"load average {os.getloadavg()[0]:.1f}; checked against DuckDB after every batch: {not args.no_check}")
    for label, values in (("incremental (ingest + q8)", incremental), ("recompute (q8, DuckDB)", full)):
        print(f"{label}: CPU s per batch median {statistics.median(values):.4f} p95 {pct(values, .95):.4f} "
              f"p99 {pct(values, .99):.4f}; total {sum(values):.2f}")
    print(f"recompute / incremental (medians): {statistics.median(full) / statistics.median(incremental):.1f}x; "
          f"last batch: {full[-1] / incremental[-1]:.1f}x")
    print(f"q8 rows {db.sql('SELECT COUNT(*) AS c FROM q8').column(0)[0].as_py():,}; operator state rows {state:,}; "
          f"stream rows person {snapshot['person'].num_rows:,}, auction {snapshot['auction'].num_rows:,}")


if __name__ == "__main__":
    main()
