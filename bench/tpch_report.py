"""``ivm bench tpch``: run the TPC-H benchmark, write a Markdown report, PNG plots and JSON.

    ivm bench tpch --sf 1 --batch 1000 --out bench/results/tpch
    ivm bench tpch --sf 0.1,0.3,1 --views q1,q3,q6,q14 --refreshes 10

Files in the out directory:

* ``report.md``  machine, versions, parameters; per scale factor a table per
  view (ivm median/p95/p99, recompute median, speedup, the engine's choice);
  throughput, freshness, memory, sizes; the correctness check.
* ``latency_by_view.png``  per view, ivm's median maintenance time per refresh
  (bar; whisker to p95) beside DuckDB's full recompute, log scale.
* ``scaling.png``  (with several SFs) median over views of both, and the
  per-refresh total, against the scale factor, log-log.
* ``results.json``  every measurement, for other plots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ivm.maintain.maintenance import LEAVE_MARGIN, SWITCH_AFTER
from bench.tpch_run import Memory, ScaleResult, ViewResult, default_data_dir, machine, run_scale, view_names

SLOWER = "slower than DuckDB's recompute"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def speedup(view: ViewResult) -> float:
    ivm, recompute = statistics.median(view.ivm), statistics.median(view.recompute)
    return recompute / ivm if ivm > 0 else math.inf


def choice(view: ViewResult) -> str:
    paths = {p: n for p, n in view.paths.items() if n}
    if not paths:
        return "-"
    if len(paths) == 1:
        return next(iter(paths))
    if "recompute" in paths:
        return f"recompute in {paths['recompute']} of {sum(paths.values())} runs"
    return ", ".join(f"{path} in {n} of {sum(paths.values())} runs" for path, n in paths.items())


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def runs_per_refresh(view: ViewResult) -> float:
    return sum(view.paths.values()) / max(len(view.ivm), 1)


def switched(view: ViewResult, inc: float | None, rec: float | None) -> str:
    """Why the engine's fallback recomputes a view: its estimates (ivm/maintain/maintenance.py)."""
    estimates = (f"incremental estimated {_ms(inc)} ms per call, recompute {_ms(rec)} ms"
                 if inc is not None and rec is not None else "by its estimates")
    runs = f"{view.paths.get('recompute', 0)} of {sum(view.paths.values())} runs recomputed"
    return f"the engine switched it to recompute: {estimates}; {runs}"


def why_path(view: ViewResult, inc: float | None, rec: float | None) -> str:
    """Why a view slower than DuckDB's recompute is on the path it is on."""
    if view.paths.get("recompute"):
        per_refresh = runs_per_refresh(view)
        if per_refresh <= 1.0:  # one apply_batch per refresh: the engine recomputes once, as DuckDB does
            return f": {switched(view, inc, rec)}; the engine's recompute also keeps its native copies of the tables up to date and computes the view's delta"
        return (f": {switched(view, inc, rec)}; ivm recomputes once per call that changes its sources "
                f"({per_refresh:.1f} per refresh), DuckDB once per refresh")
    if inc is None or rec is None:
        return ""
    if inc <= rec:
        return (": the engine's recompute (the SELECT over the sources and the difference with the old rows) "
                "is estimated dearer per call, so it stays incremental")
    if inc <= LEAVE_MARGIN * rec:
        return (f": the engine's recompute (the SELECT over the sources and the difference with the old rows) "
                f"is estimated {_ms(rec)} ms per call, within {LEAVE_MARGIN}x of incremental ({_ms(inc)} ms): "
                "too close to be worth leaving (a way back costs a rebuild), so it stays incremental")
    # Beyond the margin at the end of the run, yet never recomputed: the rule had not left by the last batch.
    return (f": the engine's estimates at the end of the run favour its recompute ({_ms(rec)} ms per call against "
            f"{_ms(inc)} ms incremental, beyond the {LEAVE_MARGIN}x margin), but it had not switched by then: "
            f"leaving takes {SWITCH_AFTER} such batches in a row, and a recompute estimate timed at CREATE is "
            "first measured by a trial refresh")


def view_table(result: ScaleResult) -> list[str]:
    spark = any(v.spark for v in result.views.values())
    on_spark = any(v.spark_ivm for v in result.views.values())
    lines = ["| view | ivm median ms | p95 | p99 | recompute median ms | speedup | engine chose | "
             "estimates incr./recompute ms | state MB | rows | note |" + (" Spark recompute ms |" if spark else "")
             + (" ivm on Spark ms | path on Spark |" if on_spark else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |" + (" ---: |" if spark else "")
             + (" ---: | --- |" if on_spark else "")]
    for view in result.views.values():
        if not view.ivm:
            continue
        factor = speedup(view)
        note = []
        inc, rec = view.estimates.get("incremental"), view.estimates.get("recompute")
        if factor < 1:
            note.append(SLOWER + why_path(view, inc, rec))
        if view.problem:
            note.append("WRONG RESULT")
        estimates = f"{_ms(inc) if inc is not None else '-'} / {_ms(rec) if rec is not None else '-'}"
        lines.append(
            f"| {view.label} | {_ms(statistics.median(view.ivm))} | {_ms(percentile(view.ivm, 95))} | "
            f"{_ms(percentile(view.ivm, 99))} | {_ms(statistics.median(view.recompute))} | {factor:.1f}x | "
            f"{choice(view)} | {estimates} | {view.state_bytes / 2**20:.1f} | {view.rows} | {'; '.join(note)} |"
            + (f" {_ms(statistics.median(view.spark)) if view.spark else 'failed'} |" if spark else "")
            + (f" {_ms(statistics.median(view.spark_ivm)) if view.spark_ivm else '-'} | "
               f"{', '.join(f'{p} {n}/{len(view.spark_ivm)}' for p, n in view.spark_paths.items()) or '-'} |"
               if on_spark else ""))
    return lines


def summary(result: ScaleResult) -> list[str]:
    views = [v for v in result.views.values() if v.ivm]
    factors = [speedup(v) for v in views]
    rows = sum(result.changed_rows)
    seconds = sum(result.refresh_seconds)
    recompute_all = [sum(v.recompute[i] for v in views) for i in range(len(result.refresh_seconds))]
    wrong = [v.label for v in views if v.problem]
    slower = [v.label for v in views if speedup(v) < 1]
    recomputed = [f"{v.label} ({switched(v, v.estimates.get('incremental'), v.estimates.get('recompute'))})"
                  for v in views if v.paths.get("recompute")]
    out = [
        f"- views: {len(views)} maintained; not created: "
        + (", ".join(f"{n} ({why})" for n, why in result.skipped.items()) or "none"),
        f"- **median speedup over DuckDB full recompute across views: {statistics.median(factors):.1f}x** "
        f"(min {min(factors):.1f}x, max {max(factors):.1f}x)" if factors else "- no view was maintained",
        f"- one refresh end to end (ingest + maintenance of all {len(views)} views, ~{statistics.median(result.changed_rows):.0f} "
        f"changed rows in {len(result.call_seconds) // max(len(result.refresh_seconds), 1)} calls): median {_ms(statistics.median(result.refresh_seconds))} ms, "
        f"p95 {_ms(percentile(result.refresh_seconds, 95))} ms; DuckDB recomputing all of them: median "
        f"{_ms(statistics.median(recompute_all))} ms "
        f"({statistics.median(recompute_all) / statistics.median(result.refresh_seconds):.1f}x)",
        f"- sustained change throughput (all views maintained): {rows / seconds:,.0f} changed rows/s "
        f"({rows:,} rows in {seconds:.1f} s)",
        f"- freshness, acknowledged to visible: 0 by construction in memory (``apply_changes`` returns once the "
        f"change is visible in every view); submit-to-visible per call: median "
        f"{_ms(statistics.median(result.call_seconds))} ms, p99 {_ms(percentile(result.call_seconds, 99))} ms",
        f"- memory: RSS {result.rss_after_load / 2**30:.2f} GiB after load, {result.rss_end / 2**30:.2f} GiB at the "
        f"end, peak {result.peak_rss / 2**30:.2f} GiB (the process also holds the DuckDB reference copy); "
        f"peak anonymous RSS {result.peak_anon / 2**30:.2f} GiB (sampled; RSS less file-backed pages); "
        f"tables held by ivm: {result.table_bytes / 2**30:.2f} GiB (Arrow); view state: "
        f"{sum(v.state_bytes for v in views) / 2**20:.0f} MiB; in spilled, memory-mapped runs: "
        f"{result.spilled_bytes / 2**30:.2f} GiB (spilling: {result.spill})",
        f"- memory by phase (RSS after it / peak so far [/ anonymous RSS after it / its sampled peak], GiB): "
        + (", ".join(f"{p[0]} " + " / ".join(f"{b / 2**30:.2f}" for b in p[2:]) for p in result.phases)
           or "not recorded"),
        f"- DuckDB reference: {result.reference}",
        f"- load of the generated tables into ivm: {result.load_seconds:.1f} s",
        f"- views slower than DuckDB's recompute per refresh: {', '.join(slower) or 'none'}",
        f"- views the engine's cost-based fallback recomputes: {'; '.join(recomputed) or 'none'}",
        f"- correctness (each view equals its recompute at the end): "
        + ("all equal" if not wrong else "DIFFERENCES in " + ", ".join(wrong)),
        f"- Spark full recompute: {result.spark_note}",
        f"- ivm maintaining the views on Spark: {result.spark_ivm_note}",
    ]
    return out


def scaling_table(results: list[ScaleResult]) -> list[str]:
    """Per view maintained at every scale factor: median ms per refresh, and growth from the first SF to the last."""
    first, last = results[0], results[-1]
    common = [n for n in last.views if all(r.views.get(n) and r.views[n].ivm for r in results)]
    if not common:
        return [f"## Scaling SF {first.sf:g} -> {last.sf:g}", "", "- no view was maintained at every scale factor"]
    sfs = [f"{r.sf:g}" for r in results]
    head = ["view"] + [f"ivm ms SF {s}" for s in sfs] + [f"recompute ms SF {s}" for s in sfs] + [
        f"ivm growth {sfs[0]} -> {sfs[-1]}", "recompute growth", f"speedup SF {sfs[-1]}"]
    lines = [f"## Scaling SF {first.sf:g} -> {last.sf:g} ({last.sf / first.sf:g}x the data)", "",
             "| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 1) + "|"]
    grow_ivm, grow_rec = [], []
    for name in common:
        ivm = [statistics.median(r.views[name].ivm) for r in results]
        rec = [statistics.median(r.views[name].recompute) for r in results]
        grow_ivm.append(ivm[-1] / ivm[0])
        grow_rec.append(rec[-1] / rec[0])
        lines.append(f"| {name} | " + " | ".join(_ms(x) for x in ivm + rec)
                     + f" | {grow_ivm[-1]:.2f}x | {grow_rec[-1]:.2f}x | {rec[-1] / ivm[-1]:.1f}x |")
    lines += ["", f"- median growth over {len(common)} views: ivm **{statistics.median(grow_ivm):.2f}x**, DuckDB recompute "
              f"**{statistics.median(grow_rec):.2f}x** (wall time per refresh; each scale factor from its own run)"]
    return lines


def write_report(results: list[ScaleResult], args: argparse.Namespace, out: Path, started: float,
                 figures: list[str]) -> Path:
    lines = ["# ivm TPC-H benchmark: incremental maintenance versus full recompute", ""]
    lines += [f"- {k}: {v}" for k, v in machine().items()]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [f"- load average (1, 5, 15 min) when the report was written: {load} on {os.cpu_count()} cores "
              "(other work on the machine slows both sides; compare ratios, not absolute times)"]
    lines += [f"- command: `ivm bench tpch {' '.join(sys.argv[3:]) if len(sys.argv) > 3 else ''}`".rstrip(),
              "- parameters: " + "; ".join(
                  f"SF {r.sf:g}: ~{r.batch} changed rows per refresh, {r.refreshes} counted refreshes after "
                  f"{r.warmup} warm-up" for r in results) + f"; seed {args.seed}; wall time {time.time() - started:.0f} s"
              + (" (report from earlier runs' results.json)" if args.from_json else ""),
              "- ivm: in-memory database, DuckDB compute (1 thread for small deltas, all cores for recomputes "
              "and large batches); recompute: the view's SELECT in DuckDB (all cores) over native tables "
              "holding the same data (" + "; ".join(sorted({f"SF {r.sf:g}: {r.reference}" for r in results}))
              + "), to Arrow, timed after every refresh in the same run",
              "- ivm median etc. = the view's own maintenance time per refresh (" + ("one `apply_changes` call per changed table"
              if getattr(args, "per_table", False) else "one atomic `apply_batch` call over the changed tables") + "); "
              "the shared ingest of the changes into the tables is in the end-to-end line",
              ""]
    for result in results:
        lines += [f"## SF {result.sf:g}", ""] + summary(result) + [""] + view_table(result) + [""]
        for view in result.views.values():
            if view.problem:
                lines.append(f"- {view.label}: {view.problem}")
        lines.append("")
    if len(results) > 1:
        lines += scaling_table(results) + [""]
    lines += ["## Figures", ""] + [f"![{f}]({f})" for f in figures]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_json(results: list[ScaleResult], out: Path) -> None:
    (out / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))


def read_json(paths: list[str]) -> list[ScaleResult]:
    """Results of earlier runs (their results.json), ordered by scale factor."""
    results = []
    for path in paths:
        for raw in json.loads(Path(path).read_text()):
            views = {n: ViewResult(**v) for n, v in raw.pop("views").items()}
            results.append(ScaleResult(**raw, views=views))
    return sorted(results, key=lambda r: r.sf)


def main(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if args.from_json:
        return _write_outputs(read_json(args.from_json), args, Path(args.out), time.time())
    scales = [float(s) for s in str(args.sf).split(",")]
    names = view_names([n.strip() for n in args.views.split(",")]) if args.views else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task("starting", total=1)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=max(total, 1))

        for sf in scales:
            results.append(run_scale(sf, args.batch, args.refreshes, args.warmup, names,
                                     Path(args.data) if args.data else default_data_dir(), progress,
                                     spark=args.spark, seed=args.seed, per_table=args.per_table,
                                     memory=memory(args)))
            write_json(results, out)
    return _write_outputs(results, args, out, started)


def _write_outputs(results: list[ScaleResult], args: argparse.Namespace, out: Path, started: float) -> int:
    from bench.tpch_plots import plot_latency, plot_scaling

    out.mkdir(parents=True, exist_ok=True)
    write_json(results, out)
    figures = [plot_latency(results[-1], out)]
    if len(results) > 1:
        figures.append(plot_scaling(results, out))
    path = write_report(results, args, out, started, figures)
    print(path.read_text())
    print(f"report: {path}; plots: {', '.join(str(out / f) for f in figures)}")
    return 1 if any(v.problem for r in results for v in r.views.values()) else 0


def memory(args: argparse.Namespace) -> Memory:
    return Memory(reference_file=not args.reference_in_memory, reference_limit=args.reference_memory or None,
                  engine_limit=args.engine_memory or None, spill=args.spill, spill_rows=args.spill_rows,
                  load_rows=args.load_rows or None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sf", default="1", help="scale factor, or several separated by commas (a sweep)")
    parser.add_argument("--batch", type=int, default=1000, help="changed rows per refresh (about)")
    parser.add_argument("--views", default=None, help="comma-separated: q1,q3,... (default: all 22)")
    parser.add_argument("--refreshes", type=int, default=10, help="counted refreshes per scale factor")
    parser.add_argument("--warmup", type=int, default=4,
                        help="refreshes run first and not counted (4: the engine times the first two runs of a "
                             "program as warm-up and switches a view's path after two votes in a row)")
    parser.add_argument("--out", default="bench/results/tpch", help="directory for the report and plots")
    parser.add_argument("--data", default=None, help="directory caching generated data (default: data/tpch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-table", action="store_true",
                        help="apply each refresh as one apply_changes call per table (default: one apply_batch)")
    parser.add_argument("--spark", action="store_true",
                        help="also time ivm maintaining the views on Spark (a few more refreshes with engine = "
                             "'spark') and Spark full recompute (local session)")
    parser.add_argument("--reference-memory", default="4GB",
                        help="DuckDB buffer pool of the reference database, a file under the data directory "
                             "(default 4GB; '' for DuckDB's default, 80%% of RAM)")
    parser.add_argument("--reference-in-memory", action="store_true",
                        help="keep the reference in memory (native tables) instead of a file")
    parser.add_argument("--engine-memory", default="",
                        help="memory_limit of ivm's DuckDB (e.g. 6GB; its queries spill to a scratch directory under $TMPDIR "
                             "beyond it; default: DuckDB's, 80%% of RAM)")
    parser.add_argument("--spill", action=argparse.BooleanOptionalAction, default=True,
                        help="spill ivm's large runs to memory-mapped files under the data directory "
                             "(ivm.connect(spill_dir=...); default on; --no-spill keeps them in memory)")
    parser.add_argument("--spill-rows", type=int, default=1_000_000, help="spill runs of at least this many rows")
    parser.add_argument("--load-rows", type=int, default=4_000_000,
                        help="rows of the first apply_changes call per table at load; later calls are smaller "
                             "(0: one call per table)")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", default=None,
                        help="no run: report and plot the results.json of earlier runs together (a sweep)")
