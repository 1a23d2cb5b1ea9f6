"""Profile the TPC-H views' maintenance: CPU time and rows per program step.

    python -m bench.tpch_profile --sf 0.1 --views q5,q16 --refreshes 2

Loads TPC-H (cached under data/tpch like ``ivm bench tpch``), creates the
views, runs one warm-up refresh, then times every step of every view's
programs over ``--refreshes`` refreshes (thread CPU seconds, rows out) and
prints, per view, the total CPU and its most expensive steps. Steps marked
``ALL`` read a whole stored relation (a scan, or a lookup without index).
"""

from __future__ import annotations

import argparse
import resource
import time
from collections import defaultdict

from bench import tpch
from bench.tpch_run import ROOT, Memory, per_table, refresh_sizes, view_names
from delta_operators.program import Lookup, Query, Stack, describe_steps, scan_name
from ivm.execute import executor as ex


def _describe(step) -> str:  # noqa: ANN001
    line = describe_steps([step])[0].strip()
    whole = (isinstance(step, Lookup) and not step.index and step.between is None) or (
        isinstance(step, Query) and any(t.name.startswith(scan_name("")) for t in step.sql.find_all(ex.exp.Table)))
    return ("ALL " if whole else "    ") + line[:150]


def instrument(stats: dict) -> None:
    """Wrap StepRunner._steps_run so every top-level step is timed (by the view being run)."""
    original_run, original_steps = ex.StepRunner.run, ex.StepRunner._steps_run

    def run(self, program, inputs, snapshot, label="", progress=None):  # noqa: ANN001, ANN202
        self._profile_label = label
        return original_run(self, program, inputs, snapshot, label, progress)

    def steps_run(self, steps, temps, snapshot, registered, label):  # noqa: ANN001, ANN202
        for step in steps:
            cpu, wall, usage = time.thread_time(), time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
            original_steps(self, [step], temps, snapshot, registered, label)
            after = resource.getrusage(resource.RUSAGE_THREAD)
            out = getattr(step, "out", None)
            rows = temps[out].num_rows if out in temps else 0
            entry = stats[label][id(step)]
            entry["what"] = entry.get("what") or _describe(step)
            entry["cpu"] = entry.get("cpu", 0.0) + time.thread_time() - cpu
            entry["wall"] = entry.get("wall", 0.0) + time.perf_counter() - wall
            entry["rows"] = entry.get("rows", 0) + rows
            entry["n"] = entry.get("n", 0) + 1
            entry["sys"] = entry.get("sys", 0.0) + after.ru_stime - usage.ru_stime  # in the kernel: faults, reclaim
            entry["faults"] = entry.get("faults", 0) + after.ru_minflt - usage.ru_minflt + after.ru_majflt - usage.ru_majflt

    ex.StepRunner.run, ex.StepRunner._steps_run = run, steps_run


def load_views(sf: float, views: str, engine_memory: str | None, maintenance: str = "incremental",
               announce=print):  # noqa: ANN001, ANN201
    """(ivm database, DuckDB reference, query texts, view names): TPC-H at ``sf`` loaded and its views created,
    with memory set up as ``ivm bench tpch`` sets it (the reference in a file, runs spilled)."""
    import ivm

    directory = ROOT / "data" / "tpch" / f"sf{sf:g}"
    tpch.generate(sf, directory)
    memory = Memory(engine_limit=engine_memory)
    con = tpch.reference(directory, directory / "reference.duckdb", memory.reference_limit)
    db = ivm.connect(maintenance=maintenance, **memory.spill_options(directory))
    tpch.create_tables(db)
    tpch.load_files(db, directory, con, lambda table: None, memory.load_rows)
    queries = tpch.query_files()
    names = view_names(views.split(",") if views else None)
    for name in names:
        started = time.perf_counter()
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {queries[name]}")
        announce(f"created {name} in {time.perf_counter() - started:.2f} s")
    return db, con, queries, names


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--views", default="")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=2)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="refreshes before timing (the second prepares)")
    parser.add_argument("--maintenance", default="incremental")
    parser.add_argument("--atomic", action="store_true", help="one apply_batch per refresh (as ivm bench tpch)")
    parser.add_argument("--cprofile", default="", help="write a cProfile of the timed refreshes here")
    parser.add_argument("--engine-memory", default=None, help="cap ivm's DuckDB (as ivm bench tpch --engine-memory)")
    args = parser.parse_args()
    db, con, queries, names = load_views(args.sf, args.views, args.engine_memory, args.maintenance,
                                         lambda line: print(line, flush=True))
    refresh = tpch.Refresh(con, seed=1, **refresh_sizes(args.batch))
    recompute: dict[str, float] = {}

    walls: list[float] = []

    def one(timed: dict | None) -> float:
        batches = refresh.batches()
        cpu, wall = time.thread_time(), time.perf_counter()
        if args.atomic:
            db.apply_batch(per_table(batches))
        else:
            for table, changes in per_table(batches):  # as ivm bench tpch --per-table
                db.apply_changes(table, changes)
        spent = time.thread_time() - cpu
        walls.append(time.perf_counter() - wall)
        for table, changes in batches:
            refresh.apply(table, changes)
        if timed is not None:  # DuckDB recomputing each view over the reference: process CPU (all its threads)
            for name in names:
                cpu = time.process_time()
                con.sql(queries[name]).to_arrow_table()
                recompute[name] = recompute.get(name, 0.0) + time.process_time() - cpu
        return spent

    for _ in range(args.warmup):
        one(None)
    stats: dict = defaultdict(lambda: defaultdict(dict))
    instrument(stats)
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    total = sum(one(stats) for _ in range(args.refreshes))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.cprofile)
    print(f"\nrefresh CPU total {total / args.refreshes * 1000:.0f} ms per refresh "
          f"(wall {sum(walls[-args.refreshes:]) / args.refreshes * 1000:.0f} ms)")
    per_view = sorted(((sum(e["cpu"] for e in steps.values()), label, steps) for label, steps in stats.items()),
                      reverse=True)
    for cpu, label, steps in per_view:
        view = label.split()[1] if label.startswith("view ") else ""
        versus = (f" (DuckDB recompute {recompute[view] / args.refreshes * 1000:.1f} ms process CPU)"
                  if view in recompute else "")
        wall = sum(e["wall"] for e in steps.values())
        kernel = sum(e["sys"] for e in steps.values())
        print(f"\n{label}: {cpu / args.refreshes * 1000:.1f} ms CPU ({wall / args.refreshes * 1000:.1f} ms wall, "
              f"{kernel / args.refreshes * 1000:.1f} ms in the kernel) per refresh, "
              f"{sum(e['n'] for e in steps.values()) / args.refreshes:.0f} steps{versus}")
        for e in sorted(steps.values(), key=lambda e: -e["cpu"])[: args.top]:
            print(f"  {e['cpu'] / args.refreshes * 1000:8.1f} ms ({e['wall'] / args.refreshes * 1000:6.1f} wall, "
                  f"{e['sys'] / args.refreshes * 1000:5.1f} kernel, {e['faults'] / args.refreshes:6.0f} faults) "
                  f"{e['rows'] / args.refreshes:8.0f} rows "
                  f"x{e['n'] / args.refreshes:.0f}  {e['what']}")
    from tests.oracle.compare import multiset_diff

    for name in names:
        problem = multiset_diff(db.sql(f"SELECT * FROM {name}"), con.sql(queries[name]).to_arrow_table())
        if problem:
            print(f"MISMATCH {name}: {problem}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
