"""Event-time streaming: Nexmark bids through windowed views, incremental vs recompute.

    python -m bench.event_time --events 1000000 --batch 50000

Streams the Nexmark generator's bids (bench/nexmark.py, in event-time order,
``--rate`` events per second of event time) into ``bid`` (APPEND ONLY,
WATERMARK 4 s) in batches, with three views: q7 windowed (the
highest bid of each 10 s window, joined back to its bids), a hopping count
per auction (q5's inner part) and a tumbling MAX with emit = 'on_close'.
Per batch it measures the process CPU seconds of the ingest (which
maintains every view), and, in the same run, DuckDB recomputing the same
three SELECTs from scratch over every bid so far; and the state held after
every batch (operator state rows; the stream keeps every row here:
q7 joins bid with itself, which a RETAIN table refuses).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import duckdb

import ivm
from bench import nexmark
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows

BID = ("CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, "
       "date_time TIMESTAMP, extra VARCHAR, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) "
       "APPEND ONLY")  # no RETAIN: q7 joins bid with itself, which RETAIN refuses
VIEWS = {
    "q7w": """SELECT b.auction, b.price, b.bidder, b.date_time, b.window_end
              FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) b
              JOIN (SELECT window_start, MAX(price) AS maxprice FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND)
                    GROUP BY window_start) b1 ON b.window_start = b1.window_start AND b.price = b1.maxprice""",
    "hot": """SELECT auction, window_start, COUNT(*) AS n
              FROM HOP(bid, date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) GROUP BY auction, window_start""",
    "closed_max": """SELECT window_start, window_end, MAX(price) AS top, COUNT(*) AS n
                     FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) GROUP BY window_start, window_end""",
}


def state_rows(db: ivm.Database) -> int:
    """Rows of the views' operator state (not their outputs; the stream's rows are counted apart)."""
    snapshot = db._engine.store.snapshot
    return sum(snapshot[s.name].num_rows for v in db._engine.catalog.views.values() for s in v.states
               if s.name != v.name)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=10_000, help="events per second of event time")
    args = parser.parse_args()
    db, ref = ivm.connect(), duckdb.connect()
    db.execute(BID)
    ref.execute("CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, "
                "date_time TIMESTAMP, extra VARCHAR)")
    for name, sql in VIEWS.items():
        option = " WITH (emit = 'on_close')" if name == "closed_max" else ""
        db.execute(f"CREATE MATERIALIZED VIEW {name}{option} AS {sql}")
    schema = db._engine.catalog.schema()
    recompute = [expand_time_windows(parse_query(sql), schema).sql("duckdb") for sql in VIEWS.values()]
    incremental, full, states, bids = [], [], [], 0
    for first in range(0, args.events, args.batch):
        _, _, batch = nexmark.generate(min(args.batch, args.events - first), first_event=first, rate=args.rate)
        bids += batch.num_rows
        started = time.process_time()
        db.apply_changes("bid", batch)
        incremental.append(time.process_time() - started)
        states.append(state_rows(db))
        ref.execute("INSERT INTO bid SELECT * FROM batch")
        started = time.process_time()
        for sql in recompute:
            ref.sql(sql).to_arrow_table()
        full.append(time.process_time() - started)
    print(f"{args.events:,} events ({bids:,} bids) in batches of {args.batch:,}, rate {args.rate:,}/s; "
          f"load average {os.getloadavg()[0]:.1f}")
    for label, values in (("incremental (ingest + 3 views)", incremental), ("recompute (3 views, DuckDB)", full)):
        print(f"{label}: CPU s per batch median {statistics.median(values):.4f} p95 {pct(values, .95):.4f} "
              f"p99 {pct(values, .99):.4f}; total {sum(values):.2f}")
    print(f"recompute / incremental (medians): {statistics.median(full) / statistics.median(incremental):.1f}x; "
          f"last batch: {full[-1] / incremental[-1]:.1f}x")
    print(f"operator state rows per batch: max {max(states):,}, last {states[-1]:,}; "
          f"stream rows stored: {db._engine.store.snapshot['bid'].num_rows:,}")
    print(f"view rows: " + ", ".join(f"{n} {db.sql(f'SELECT COUNT(*) AS c FROM {n}').column(0)[0].as_py():,}"
                                      for n in VIEWS))


if __name__ == "__main__":
    main()
