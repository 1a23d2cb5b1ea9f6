"""CPU per call on the two hot paths (issues 5 and 4): what the code costs, whatever else runs.

    python -m bench.cpu_costs lookup [--lookups 1000]
    python -m bench.cpu_costs ingest [--initial 200000] [--batches 400] [--producers 4]
                                     [--maintenance auto|incremental] [--fold-delay S]
    python -m bench.cpu_costs memory-ingest [--batches 400] [--batch 1000] [--producers 1 4]
    python -m bench.cpu_costs lookup-waits [--batch 5000] [--switch 0.005 0.0005] [--seconds 6]

``lookup``: a real ``ivm serve`` (in memory) with ``items`` (100,000 rows)
and ``by_grp`` (1,000 groups); an ADBC client runs ``SELECT * FROM by_grp
WHERE grp = ?`` (prepare, bind, execute, fetch) N times, no ingest. Reports
the server process's CPU (``/proc/<pid>/stat`` user + system) per lookup.

``ingest``: bench/ingest.py's durable database and three views, P producers
sending 1,000-row batches; reports thread CPU per batch of each phase
(normalize, convert, log append, wait for the sync, fold of the views,
checkpoint), the CPU of the maintainer's two threads (folding, converting
ahead: ivm/durable/ahead.py) and the process's CPU per batch. Phases are timed by wrapping
the engine's methods in this process only (thread CPU time, so a phase
waiting for a lock or the disk costs nothing).

``memory-ingest``: an in-memory database with bench/flight.py's ``items``
(100,000 rows), ``by_grp`` and ``all_items``; P producer threads upsert
B-row batches as fast as they can (N batches in all). Reports the process's
CPU per 1,000 ingested rows and how many maintenance runs the batches took
(batches queued behind a commit are maintained together: ivm/ingest/group_commit.py),
for each P given, in one process.

``lookup-waits``: where a point read's time goes while the same process
ingests (in memory, bench/flight.py's tables; one thread upserts B-row
batches at 10 batches/s, another runs ``SELECT * FROM by_grp WHERE grp =
$1`` point reads every 3 ms). Each read's wall time is split, from the
thread's CPU clock and ``/proc/self/task/<tid>/schedstat``, into its own
CPU, run-queue wait (runnable, no core: the OS) and the rest, blocked (in
a process without I/O: waiting for the GIL). One round without ingest,
then alternating rounds per ``sys.setswitchinterval`` value.

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
    from ivm import engine
    from ivm.ingest import changes, ingest_group
    from ivm.durable import durable, maintainer
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
    timed(ingest_group, "zset_sum", "  sum of queued deltas")
    from ivm.durable import checkpoints
    timed(checkpoints.Checkpointer, "checkpoint", "checkpoint")
    with tempfile.TemporaryDirectory(prefix="ivm-bench-") as directory:
        db = ivm.connect(f"{directory}/db", **options)
        stream = bench.load(db, initial)
        db.sql("SELECT COUNT(*) FROM per_region")
        cpu.clear()
        maintainer = db._engine.maintainer
        threads = {"maintainer thread (all)": maintainer.thread, "convert-ahead thread (all)": maintainer.ahead.thread}
        before = {label: thread_cpu(t) for label, t in threads.items()}
        folds, ahead = maintainer.folds, maintainer.ahead.conversions
        result = bench.throughput(db, stream, producers, batches, 1000)
        folds, ahead = maintainer.folds - folds, maintainer.ahead.conversions - ahead
        for label, t in threads.items():
            cpu[label] = thread_cpu(t) - before[label]
        db.close()
    n = result["rows"] / 1000
    for label, seconds in cpu.items():
        print(f"{label:40s} {1000 * seconds / n:6.2f} ms CPU per batch")
    print(f"{'process (all threads)':40s} {1000 * result['cpu_seconds'] / n:6.2f} ms CPU per batch; "
          f"{result['rows_per_cpu_s']:,.0f} rows per CPU s; {result['rows_per_s']:,.0f} rows/s "
          f"(1-minute load average {os.getloadavg()[0]:.1f})")
    print(f"{folds} folds for {n:.0f} batches; {ahead} conversions ahead of the fold")


def thread_cpu(thread) -> float:
    """CPU seconds a live thread has used (Linux: its CPU clock)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def memory_ingest(batches: int, batch: int, producers: list[int]) -> None:
    import threading

    import ivm
    from bench.flight import items, prepared_batches

    prepared = prepared_batches(ROWS, batch, min(batches, 100))
    for p in producers:
        db = ivm.connect(maintenance="incremental")
        db.execute("CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE)")
        db.execute("CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp")
        db.execute("CREATE MATERIALIZED VIEW all_items AS SELECT id, grp, amount FROM items WHERE amount >= 0")
        db.apply_changes("items", items(np.arange(ROWS), np.random.default_rng(0)))
        for table in prepared[:5]:  # warm up: prepared statements, indexes
            db.apply_changes("items", table)
        engine = db._engine
        runs = [0]
        maintain = engine._maintain

        def counted(*args, **kwargs):
            runs[0] += 1
            return maintain(*args, **kwargs)

        engine._maintain = counted
        per_producer = batches // p

        def produce(first: int) -> None:
            for i in range(per_producer):
                db.apply_changes("items", prepared[(first + i * p) % len(prepared)])

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(p)]
        before, started = process_cpu(os.getpid()), time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu, wall = process_cpu(os.getpid()) - before, time.perf_counter() - started
        rows = per_producer * p * batch
        print(f"{p} producer(s), {per_producer * p} batches of {batch:,} rows: {1000 * cpu / (rows / 1000):.2f} ms CPU "
              f"per 1,000 rows, {rows / cpu:,.0f} rows per CPU s, {rows / wall:,.0f} rows/s; "
              f"{runs[0]} maintenance runs (1-minute load average {os.getloadavg()[0]:.1f})")
        db.close()


def lookup_waits(batch: int, switch: list[float], seconds: float, rounds: int = 2) -> None:
    import sys
    import threading

    import pyarrow as pa

    import ivm
    from bench.flight import GROUPS, items, prepared_batches

    db = ivm.connect()
    db.execute("CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE)")
    db.execute("CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp")
    db.execute("CREATE MATERIALIZED VIEW all_items AS SELECT id, grp, amount FROM items WHERE amount >= 0")
    db.apply_changes("items", items(np.arange(ROWS), np.random.default_rng(0)))
    batches = prepared_batches(ROWS, batch, 40)
    for table in batches[:3]:
        db.apply_changes("items", table)
    template = "SELECT * FROM by_grp WHERE grp = $1"

    def clocks() -> tuple[float, float]:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return time.thread_time(), int(f.read().split()[1]) / 1e9

    def one_round(interval: float, ingest: bool) -> str:
        sys.setswitchinterval(interval)
        stop, ingest_cpu = threading.Event(), []

        def writer() -> None:
            next_at, i = time.perf_counter(), 0
            while not stop.is_set():
                started = time.thread_time()
                db.apply_changes("items", batches[i % len(batches)])
                ingest_cpu.append(time.thread_time() - started)
                i += 1
                next_at += 0.1
                time.sleep(max(0.0, next_at - time.perf_counter()))

        thread = threading.Thread(target=writer)
        if ingest:
            thread.start()
        parts: dict[str, list[float]] = {"wall": [], "cpu": [], "run-queue": [], "blocked (GIL)": []}
        rng = random.Random(3)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            grp = rng.randrange(GROUPS)
            started = time.perf_counter()  # the wall covers the clock reads too, as the CPU does
            cpu0, queue0 = clocks()
            assert db.bound_query(template, f"SELECT * FROM by_grp WHERE grp = {grp}", [pa.scalar(grp)]).num_rows == 1
            cpu1, queue1 = clocks()
            wall = time.perf_counter() - started
            parts["wall"].append(wall)
            parts["cpu"].append(cpu1 - cpu0)
            parts["run-queue"].append(queue1 - queue0)
            parts["blocked (GIL)"].append(max(0.0, wall - (cpu1 - cpu0) - (queue1 - queue0)))
            time.sleep(0.003)  # the client's share of a lookup
        stop.set()
        if ingest:
            thread.join()
        shown = "; ".join(f"{name} p50 {1000 * np.median(v):.2f} p99 {1000 * np.percentile(v, 99):.2f} "
                          f"max {1000 * max(v):.2f}" for name, v in parts.items())
        cpu = f"{1000 * np.median(ingest_cpu):.1f} ms" if ingest_cpu else "-"
        return (f"switch {1000 * interval:g} ms, {'ingesting' if ingest else 'no ingest'}: {len(parts['wall'])} reads (ms): "
                f"{shown}; ingest CPU per batch {cpu} (1-minute load average {os.getloadavg()[0]:.1f})")

    print(one_round(switch[0], False), flush=True)
    for _ in range(rounds):
        for interval in switch:
            print(one_round(interval, True), flush=True)
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["lookup", "ingest", "memory-ingest", "lookup-waits"])
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--initial", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--producers", type=int, nargs="+", default=None, help="ingest: 4; memory-ingest: 1 4")
    parser.add_argument("--maintenance", default="auto", help="auto, incremental or recompute (ingest)")
    parser.add_argument("--fold-delay", type=float, default=None,
                        help="the maintainer's fold_delay (ingest; default: the engine's)")
    parser.add_argument("--batch", type=int, default=None, help="rows per batch (memory-ingest: 1000, lookup-waits: 5000)")
    parser.add_argument("--switch", type=float, nargs="+", default=[0.005, 0.0005], help="lookup-waits: switch intervals")
    parser.add_argument("--seconds", type=float, default=6.0, help="lookup-waits: seconds per round")
    args = parser.parse_args()
    if args.what == "lookup":
        lookup(args.lookups)
    elif args.what == "memory-ingest":
        memory_ingest(args.batches, args.batch or 1000, args.producers or [1, 4])
    elif args.what == "lookup-waits":
        lookup_waits(args.batch or 5000, args.switch, args.seconds)
    else:
        options = {} if args.fold_delay is None else {"fold_delay": args.fold_delay}
        ingest(args.initial, args.batches, (args.producers or [4])[0], maintenance=args.maintenance, **options)


if __name__ == "__main__":
    main()
