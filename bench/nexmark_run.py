"""``ivm bench nexmark``: the Nexmark queries as views over the generator, incremental vs DuckDB recompute.

    ivm bench nexmark                                   # q5, q7, q8, q11; 1,000,000 events in batches of 50,000
    ivm bench nexmark --events 200000 --batch 10000 --queries q5,q11

One run, in one process:

1. the generator (bench/nexmark.py; person : auction : bid = 1 : 3 : 46, ``--rate``
   events per second of event time) makes each batch of events; the tables the
   chosen queries read are ivm event streams (APPEND ONLY, watermark 4 s) and
   plain tables of a reference DuckDB database;
2. every query of the registry (bench/nexmark_queries.py) is a materialized view;
3. per batch: the ``apply_changes`` calls (ingest + maintenance of every view),
   timed as process CPU and wall seconds; each view's own maintenance time
   (the engine's per-view timer, wall); the batch is inserted into the reference
   and DuckDB recomputes each view's SELECT from scratch (to Arrow, as ivm
   produces it), timed as wall and process CPU; operator state rows per view;
4. after the last batch every view is compared with its recompute (multisets).

The first ``--warmup`` batches (programs compile, statements prepare) are run
but not counted. Maintenance is forced incremental unless ``--maintenance
auto`` (then the engine may recompute a view when it estimates that cheaper;
the report lists the paths taken). The report (Markdown) is printed and written
to ``--out``/report.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import nexmark
from bench.nexmark_queries import GENERATED, QUERIES, reference_ddl, reference_sql, stream_ddl

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ViewRun:
    name: str
    ivm: list[float] = field(default_factory=list)  # engine timer, seconds per counted batch
    recompute: list[float] = field(default_factory=list)  # DuckDB wall seconds
    recompute_cpu: list[float] = field(default_factory=list)  # DuckDB process CPU seconds
    paths: dict[str, int] = field(default_factory=dict)
    state_rows: list[int] = field(default_factory=list)
    rows: int = 0
    problem: str | None = None


@dataclass
class Run:
    events: int
    batch: int
    rate: int
    warmup: int
    maintenance: str
    call_cpu: list[float] = field(default_factory=list)  # apply_changes of one batch, all views
    call_wall: list[float] = field(default_factory=list)
    views: dict[str, ViewRun] = field(default_factory=dict)
    stream_rows: dict[str, int] = field(default_factory=dict)
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=1_000_000, help="generator events in all (1,000,000)")
    parser.add_argument("--batch", type=int, default=50_000, help="events per batch (50,000)")
    parser.add_argument("--rate", type=int, default=10_000, help="events per second of event time (10,000)")
    parser.add_argument("--queries", default=None, help=f"comma-separated, of: {', '.join(QUERIES)} (all)")
    parser.add_argument("--warmup", type=int, default=1, help="batches run first and not counted (1)")
    parser.add_argument("--maintenance", choices=("incremental", "auto"), default="incremental")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "nexmark")


def chosen(names: str | None) -> list[str]:
    if not names:
        return list(QUERIES)
    wanted = [n.strip().lower() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in QUERIES]
    if unknown:
        raise SystemExit(f"ivm bench nexmark: unknown query {', '.join(unknown)} (known: {', '.join(QUERIES)})")
    return wanted


def engine_seconds(db) -> dict[str, tuple[float, dict[str, int]]]:  # noqa: ANN001
    views = db.status()["maintenance"]["views"]
    return {name: (sum(f["seconds"].values()), dict(f["batches"])) for name, f in views.items()}


def state_rows(db, view: str) -> int:  # noqa: ANN001
    snapshot = db._engine.store.snapshot
    return sum(snapshot[s.name].num_rows for s in db._engine.catalog.views[view].states if s.name != view)


def run(events: int, batch: int, rate: int, names: list[str], warmup: int = 1,
        maintenance: str = "incremental", progress=print) -> Run:  # noqa: ANN001
    import duckdb

    import ivm

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the oracle's multiset comparison lives with the tests
    from tests.oracle.compare import multiset_diff

    queries = [QUERIES[n] for n in names]
    tables = [t for t in GENERATED if any(t in q.tables for q in queries)]
    db, ref = ivm.connect(maintenance=maintenance), duckdb.connect()
    for table in tables:
        db.execute(stream_ddl(table))
        ref.execute(reference_ddl(table))
    for q in queries:
        options = f" WITH ({q.options})" if q.options else ""
        db.execute(f"CREATE MATERIALIZED VIEW {q.name}{options} AS {q.sql}")
    schema = db._engine.catalog.schema()
    recompute = {q.name: reference_sql(q, schema) for q in queries}
    result = Run(events, batch, rate, warmup, maintenance, views={n: ViewRun(n) for n in names})
    before = engine_seconds(db)
    for number, first in enumerate(range(0, events, batch)):
        generated = dict(zip(GENERATED, nexmark.generate(min(batch, events - first), first_event=first, rate=rate)))
        counted = number >= warmup
        wall, cpu = time.perf_counter(), time.process_time()
        for table in tables:
            db.apply_changes(table, generated[table])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = engine_seconds(db)
        for table in tables:
            data = generated[table]  # noqa: F841 (read by DuckDB's replacement scan)
            ref.execute(f"INSERT INTO {table} SELECT * FROM data")
        for name, view in result.views.items():
            seconds, paths = after[name]
            took = seconds - before[name][0]
            for path, n in paths.items():
                moved = n - before[name][1].get(path, 0)
                if moved and counted:
                    view.paths[path] = view.paths.get(path, 0) + moved
            started, started_cpu = time.perf_counter(), time.process_time()
            ref.sql(recompute[name]).to_arrow_table()
            if counted:
                view.ivm.append(took)
                view.recompute.append(time.perf_counter() - started)
                view.recompute_cpu.append(time.process_time() - started_cpu)
            view.state_rows.append(state_rows(db, name))
        before = after
        if counted:
            result.call_cpu.append(cpu)
            result.call_wall.append(wall)
        progress(f"batch {number + 1}/{-(-events // batch)}: ingest + maintenance {wall * 1e3:.0f} ms wall, "
                 f"{cpu * 1e3:.0f} ms CPU")
    for name, view in result.views.items():
        got = db.sql(f"SELECT * FROM {name}")
        view.rows = got.num_rows
        view.problem = multiset_diff(got, ref.sql(recompute[name]).to_arrow_table())
    result.stream_rows = {t: db._engine.store.snapshot[t].num_rows for t in tables}
    result.load = os.getloadavg()
    db.close()
    return result


def _ms(values: list[float], q: float | None = None) -> str:
    if not values:
        return "–"
    if q is None:
        return f"{statistics.median(values) * 1e3:.1f}"
    return f"{sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e3:.1f}"


def report(run_: Run) -> str:
    counted = len(run_.call_cpu)
    lines = [
        "# Nexmark: incremental maintenance vs DuckDB recompute",
        "",
        f"{run_.events:,} generator events (person : auction : bid = 1 : 3 : 46) at {run_.rate:,} events per "
        f"second of event time, batches of {run_.batch:,}; {counted} batches counted after {run_.warmup} "
        f"warm-up. Maintenance: {run_.maintenance}. Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {run_.load[0]:.1f} / {run_.load[1]:.1f} / {run_.load[2]:.1f} (1/5/15 min) at the end.",
        "",
        "Per batch, milliseconds. ivm: the engine's per-view maintenance timer (wall). Recompute: DuckDB "
        "evaluating the view's SELECT over all events so far, to Arrow (wall, and process CPU).",
        "",
        "| view | ivm median | p95 | p99 | recompute median | p95 | p99 | recompute CPU median | "
        "recompute / ivm (medians) | state rows (max) | rows | paths | check |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, v in run_.views.items():
        ratio = (statistics.median(v.recompute) / statistics.median(v.ivm)
                 if v.ivm and statistics.median(v.ivm) > 0 else float("nan"))
        paths = ", ".join(f"{p} {n}" for p, n in sorted(v.paths.items())) or "–"
        check = "equal" if v.problem is None else f"DIFFERS: {v.problem}"
        lines.append(f"| {name} | {_ms(v.ivm)} | {_ms(v.ivm, .95)} | {_ms(v.ivm, .99)} | {_ms(v.recompute)} | "
                     f"{_ms(v.recompute, .95)} | {_ms(v.recompute, .99)} | {_ms(v.recompute_cpu)} | {ratio:.1f}x | "
                     f"{max(v.state_rows):,} | {v.rows:,} | {paths} | {check} |")
    recompute_cpu = [sum(v.recompute_cpu[i] for v in run_.views.values()) for i in range(counted)]
    lines += [
        "",
        f"All views together, per batch: ivm ingest + maintenance (the apply_changes calls) median "
        f"{_ms(run_.call_wall)} ms wall, {_ms(run_.call_cpu)} ms CPU (p95 {_ms(run_.call_cpu, .95)}, p99 "
        f"{_ms(run_.call_cpu, .99)}); DuckDB recomputing all of them median {_ms(recompute_cpu)} ms CPU.",
        "",
        "Stream rows stored at the end: " + ", ".join(f"{t} {n:,}" for t, n in run_.stream_rows.items())
        + " (no RETAIN: q7 joins bid with itself).",
        "",
        "Queries (bench/nexmark_queries.py):",
        "",
    ]
    lines += [f"* {name}: {QUERIES[name].title}" for name in run_.views]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    names = chosen(args.queries)
    if args.events <= 0 or args.batch <= 0 or args.rate <= 0:
        raise SystemExit("ivm bench nexmark: --events, --batch and --rate must be positive")
    if args.warmup >= -(-args.events // args.batch):
        raise SystemExit("ivm bench nexmark: --warmup must leave at least one counted batch")
    result = run(args.events, args.batch, args.rate, names, args.warmup, args.maintenance)
    text = report(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text)
    print(text)
    print(f"report: {args.out / 'report.md'}")
    return 0 if all(v.problem is None for v in result.views.values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
