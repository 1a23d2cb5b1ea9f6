"""How many DuckDB statements each TPC-H view runs per refresh, what they cost, and what that bounds.

    python -m bench.tpch_statements --sf 1
    bench/guard.sh 14 -- python -m bench.tpch_statements --sf 10 --engine-memory 2GB --views q1,q2,...

Sets up like ``ivm bench tpch`` (reference in a file, runs spilled), creates
the views, runs ``--warmup`` refreshes, then over ``--refreshes`` refreshes
counts per view the statements its programs ran in DuckDB and the wall time
in them and in the whole program (the rest is lookups, stacks and the
driver's bookkeeping), and times DuckDB recomputing each view over the
reference. Maintenance is forced incremental, so every view runs its
program.

The last column is a bound: the speedup the view would reach if each of its
statements cost no more than the cheapest one DuckDB runs here (a SELECT of
three rows from one registered Arrow input, one thread) and nothing else
cost anything. A target above it cannot be reached by making statements
cheaper; only by running fewer of them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from bench import tpch
from bench.tpch_profile import load_views
from bench.tpch_run import per_table, refresh_sizes
from ivm.execute import executor as ex


def trivial_statement_seconds(runs: int = 300) -> float:
    """Wall seconds of the cheapest statement: three rows from one registered Arrow input, one thread."""
    import duckdb
    import pyarrow as pa

    from ivm.execute import duck

    con = duckdb.connect(config={"threads": 1})
    con.register("h", duck.Holder(pa.table({"k": [1, 2, 3]})))
    for _ in range(20):
        duck.arrow(con, "SELECT * FROM h")
    started = time.perf_counter()
    for _ in range(runs):
        duck.arrow(con, "SELECT * FROM h")
    return (time.perf_counter() - started) / runs


def count_statements(stats: dict) -> None:
    """Wrap the executor so ``stats[label]`` gathers [statements, seconds in them, seconds in the program]."""
    execute, run = ex.Executor._execute, ex.StepRunner.run
    current: list[str | None] = [None]

    def counted_execute(self, step, temps, snapshot, registered):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        try:
            return execute(self, step, temps, snapshot, registered)
        finally:
            if current[0] is not None:
                stats[current[0]][0] += 1
                stats[current[0]][1] += time.perf_counter() - started

    def timed_run(self, program, inputs, snapshot, label="", progress=None):  # noqa: ANN001, ANN202
        current[0], started = label, time.perf_counter()
        try:
            return run(self, program, inputs, snapshot, label, progress)
        finally:
            stats[label][2] += time.perf_counter() - started
            current[0] = None

    ex.Executor._execute, ex.StepRunner.run = counted_execute, timed_run


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sf", type=float, default=1)
    parser.add_argument("--views", default="")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--engine-memory", default=None, help="cap ivm's DuckDB (as ivm bench tpch --engine-memory)")
    args = parser.parse_args()
    db, con, queries, names = load_views(args.sf, args.views, args.engine_memory, announce=lambda line: None)
    refresh = tpch.Refresh(con, seed=1, **refresh_sizes(args.batch))
    stats: dict = defaultdict(lambda: [0, 0.0, 0.0])
    recompute: dict[str, list[float]] = defaultdict(list)
    for step in range(args.warmup + args.refreshes):
        if step == args.warmup:
            count_statements(stats)
        batches = refresh.batches()
        db.apply_batch(per_table(batches))
        for table, changes in batches:
            refresh.apply(table, changes)
        if step >= args.warmup:
            for name in names:
                started = time.perf_counter()
                con.sql(queries[name]).to_arrow_table()
                recompute[name].append(time.perf_counter() - started)
    trivial = trivial_statement_seconds()
    n = args.refreshes
    print(f"SF {args.sf:g}, {n} refreshes of ~{args.batch} changed rows; the cheapest statement: "
          f"{trivial * 1000:.2f} ms\n")
    print("view  statements  ms in them  ms each  ms program  recompute ms  speedup  bound")
    speedups, bounds = [], []
    for name in names:
        statements, in_statements, in_program = stats[f"view {name}"]
        per_refresh = statements / n
        program_ms = in_program / n * 1000
        recompute_ms = statistics.median(recompute[name]) * 1000
        speedup = recompute_ms / program_ms if program_ms else float("inf")
        bound = recompute_ms / (per_refresh * trivial * 1000) if per_refresh else float("inf")
        speedups.append(speedup)
        bounds.append(bound)
        print(f"{name}  {per_refresh:10.1f}  {in_statements / n * 1000:10.1f}  "
              f"{in_statements / max(statements, 1) * 1000:7.2f}  {program_ms:10.1f}  {recompute_ms:12.1f}  "
              f"{speedup:6.1f}x  {bound:6.1f}x")
    print(f"\nmedian speedup {statistics.median(speedups):.1f}x; median bound {statistics.median(bounds):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
