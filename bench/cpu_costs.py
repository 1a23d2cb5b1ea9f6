"""CPU per call on the two hot paths (issues 5 and 4): what the code costs, whatever else runs.

    python -m bench.cpu_costs lookup [--lookups 1000]
    python -m bench.cpu_costs ingest [--initial 200000] [--batches 400] [--producers 4]
                                     [--maintenance auto|incremental] [--fold-delay S]

``lookup``: a real ``ivm serve`` (in memory) with ``items`` (100,000 rows)
and ``by_grp`` (1,000 groups); an ADBC client runs ``SELECT * FROM by_grp
WHERE grp = ?`` (prepare, bind, execute, fetch) N times, no ingest. Reports
the server process's CPU (``/proc/<pid>/stat`` user + system) per lookup.

``ingest``: bench/ingest.py's durable database and three views, P producers
sending 1,000-row batches; reports thread CPU per batch of each phase
(normalize, convert, log append, wait for the sync, fold of the views,
checkpoint) and the process's CPU per batch. Phases are timed by wrapping
the engine's methods in this process only (thread CPU time, so a phase
waiting for a lock or the disk costs nothing).

Wall-clock latency on a shared machine measures the other jobs; CPU per
call measures the code. The two numbers belong side by side.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import tempfile
import time

import numpy as np

from bench.flight import process_cpu

ROWS = 100_000


def lookup(n: int) -> None:
    import adbc_driver_flightsql.dbapi as flight_sql

    from bench.flight import GROUPS, items
    from flight_server.process import ServerProcess

    sql = "SELECT * FROM by_grp WHERE grp = ?"
    with ServerProcess() as server, flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.executescript(
            "CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE);"
            "CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp")
        cur.adbc_ingest("items", items(np.arange(ROWS), np.random.default_rng(0)), mode="append")
        rng = random.Random(2)
        for _ in range(100):  # warm up: caches, pooled cursors, prepared plans
            cur.execute(sql, (rng.randrange(GROUPS),))
            cur.fetchall()
        pid = server.process.pid
        before, started = process_cpu(pid), time.perf_counter()
        for _ in range(n):
            cur.execute(sql, (rng.randrange(GROUPS),))
            assert len(cur.fetchall()) == 1
        cpu, wall = process_cpu(pid) - before, time.perf_counter() - started
    print(f"server CPU per lookup: {1000 * cpu / n:.2f} ms; wall per lookup {1000 * wall / n:.2f} ms "
          f"({n} lookups; 1-minute load average {os.getloadavg()[0]:.1f})")


def ingest(initial: int, batches: int, producers: int, **options) -> None:
    import bench.ingest as bench
    import ivm
    from ivm import changes, durable, engine, ingest_group, maintainer
    from storage import log

    cpu: dict[str, float] = collections.defaultdict(float)

    def timed(owner, name: str, label: str, static: bool = False) -> None:
        function = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                cpu[label] += time.thread_time() - started

        setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    timed(durable.DurableEngine, "ingest", "ingest (producer thread, total)")
    timed(ingest_group, "_normalize", "  normalize")
    timed(engine.Engine, "convert", "  convert to a Z-set delta")
    timed(changes.ChangeApplier, "apply", "    of which the delta rows")
    timed(log.ChangeLog, "append", "  log append")
    timed(log.ChangeLog, "wait_durable", "  wait for the sync")
    timed(maintainer.Maintainer, "fold", "fold of the views (maintainer thread)")
    timed(maintainer.Maintainer, "_sum", "  sum of queued deltas", static=True)
    from ivm import checkpoints
    timed(checkpoints.Checkpointer, "checkpoint", "checkpoint")
    with tempfile.TemporaryDirectory(prefix="ivm-bench-") as directory:
        db = ivm.connect(f"{directory}/db", **options)
        stream = bench.load(db, initial)
        db.sql("SELECT COUNT(*) FROM per_region")
        cpu.clear()
        folds = db._engine.maintainer.folds
        result = bench.throughput(db, stream, producers, batches, 1000)
        folds = db._engine.maintainer.folds - folds
        db.close()
    n = result["rows"] / 1000
    for label, seconds in cpu.items():
        print(f"{label:40s} {1000 * seconds / n:6.2f} ms CPU per batch")
    print(f"{'process (all threads)':40s} {1000 * result['cpu_seconds'] / n:6.2f} ms CPU per batch; "
          f"{result['rows_per_cpu_s']:,.0f} rows per CPU s; {result['rows_per_s']:,.0f} rows/s "
          f"(1-minute load average {os.getloadavg()[0]:.1f})")
    print(f"{folds} folds for {n:.0f} batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["lookup", "ingest"])
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--initial", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--maintenance", default="auto", help="auto, incremental or recompute (ingest)")
    parser.add_argument("--fold-delay", type=float, default=None,
                        help="the maintainer's fold_delay (ingest; default: the engine's)")
    args = parser.parse_args()
    if args.what == "lookup":
        lookup(args.lookups)
    else:
        options = {} if args.fold_delay is None else {"fold_delay": args.fold_delay}
        ingest(args.initial, args.batches, args.producers, maintenance=args.maintenance, **options)


if __name__ == "__main__":
    main()
