"""One TPC-H benchmark run: ivm maintaining the TPC-H views versus DuckDB recomputing them.

    ivm bench tpch --sf 1 --batch 1000                 # all supported views, report + plots
    ivm bench tpch --sf 0.1,0.3,1 --views q1,q3,q6     # a scaling sweep over three scale factors

``run_scale`` does, for one scale factor, in one process:

1. generate the eight tables with ``tpchgen-cli`` (cached per SF under the data
   directory) and load them into a reference DuckDB database and into ivm;
2. create the views (the 22 TPC-H queries as written; a query whose LIMIT the
   engine rejects runs without it, and is labelled so);
3. stream refreshes of about ``batch`` changed rows each (new orders with
   their lineitems, deletes of old orders with theirs, updates of prices,
   dates and statuses: ``bench/tpch.py``), each as one atomic ``apply_batch``
   call over the six changed tables (``--per-table``: six ``apply_changes`` calls, one per
   table), mixing inserts, updates and deletes. Per refresh it records the
   end-to-end time of the calls (ingest + maintenance of every view; in
   memory the call returns when its change is visible), each view's own
   maintenance time (the engine's per-view timer, ``db.status()``) and the
   path the engine chose for it; then applies the refresh to the reference
   and times DuckDB recomputing each view's SELECT there (to Arrow, as ivm
   produces it);
4. after the last refresh, checks every view equals its recompute
   (multisets; floats within 1e-9 relative: tests/oracle/compare.py).

The first ``warmup`` refreshes (programs compile, statements prepare, the
cost model settles each view's path) are run and checked but not counted. With ``--spark``, ivm then maintains the
views on Spark (``SET ivm.engine = 'spark'``) for a few more refreshes, which the final check covers too
(``bench/tpch_spark.py``), and each view's SELECT is run on a local Spark session over Parquet copies of the final
tables (Spark full recompute).
"""

from __future__ import annotations

import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import duckdb

from bench import tpch

ROOT = Path(__file__).resolve().parent.parent

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class ViewResult:
    name: str
    label: str  # the name, with "(without LIMIT)" when the engine rejected the LIMIT
    create_seconds: float
    ivm: list[float] = field(default_factory=list)  # seconds per counted refresh
    recompute: list[float] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)  # path -> maintenance runs (calls) that took it
    estimates: dict[str, float | None] = field(default_factory=dict)
    state_bytes: int = 0
    rows: int = 0
    spark: list[float] = field(default_factory=list)  # Spark full recompute, seconds per run
    spark_ivm: list[float] = field(default_factory=list)  # ivm maintaining it on Spark, seconds per refresh
    spark_paths: dict[str, int] = field(default_factory=dict)  # engine/path -> refreshes, on Spark
    problem: str | None = None  # a difference from the recompute at the end, if any


@dataclass
class ScaleResult:
    sf: float
    batch: int
    refreshes: int
    warmup: int
    load_seconds: float
    changed_rows: list[int] = field(default_factory=list)  # per counted refresh
    refresh_seconds: list[float] = field(default_factory=list)  # end to end, all views
    call_seconds: list[float] = field(default_factory=list)  # per apply_changes call
    views: dict[str, ViewResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # view -> why it was not created
    table_rows: dict[str, int] = field(default_factory=dict)
    table_bytes: int = 0
    rss_after_load: int = 0
    rss_end: int = 0
    peak_rss: int = 0
    spark_note: str = "not requested"
    spark_ivm_note: str = "not requested"
    # (phase, seconds since the scale factor's start, RSS after it, peak RSS of the process so far,
    #  anonymous RSS after it, peak anonymous RSS so far (sampled)); earlier results have the first four
    phases: list[tuple] = field(default_factory=list)
    reference: str = "in memory"  # where DuckDB's reference tables live
    peak_anon: int = 0  # largest anonymous RSS sampled (spilled runs are file-backed: not in it)
    spill: str = "off"  # where ivm's large runs were spilled (storage/spill.py)
    spilled_bytes: int = 0  # of the tables' and views' bytes, those held in mapped files at the end


class Phases:
    """RSS after each phase of a run and the peak so far (``ru_maxrss`` never goes down), and the
    anonymous part of both. Spilled runs are file-backed pages, counted in RSS while resident but
    evictable; anonymous memory is what the OOM killer counts. The kernel keeps no peak of it, so
    a thread samples it every ``every`` seconds."""

    def __init__(self, every: float = 0.2) -> None:
        self.started = time.perf_counter()
        self.log: list[tuple] = []
        self.peak_anon = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(every,), name="rss-anon", daemon=True)
        self._sampler.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            self.peak_anon = max(self.peak_anon, rss("RssAnon"))

    def stop(self) -> None:
        self._stop.set()

    def __call__(self, phase: str) -> None:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()  # freed Arrow memory back to the system first
        now, anon = rss(), rss("RssAnon")  # the kernel's counters are approximate: the peak is at least the RSS just read
        self.peak_anon = max(self.peak_anon, anon)
        self.log.append((phase, time.perf_counter() - self.started, now, max(now, peak_rss()), anon, self.peak_anon))


def rss(field_name: str = "VmRSS") -> int:
    """A /proc/self/status size in bytes: VmRSS (all resident), RssAnon (anonymous), RssFile (file-backed)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss() -> int:
    """The process's largest RSS so far: VmHWM (ru_maxrss lags: the kernel updates it lazily)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def refresh_sizes(batch: int) -> dict[str, int]:
    """New and deleted orders (each ~5 rows with its lineitems) and updated rows per table (6 tables)."""
    orders = max(1, round(batch * 0.3 / 5))
    return {"new_orders": orders, "deleted_orders": orders, "updates": max(1, round(batch * 0.4 / 6))}


def create_views(db, names: list[str] | None) -> tuple[dict[str, tuple[str, str]], dict[str, float], dict[str, str]]:  # noqa: ANN001
    """name -> (label, SQL) of the views created; seconds each took; why the others were not."""
    from ivm import IvmError

    queries = tpch.query_files()
    wanted = view_names(names)
    created, seconds, skipped = {}, {}, {}
    for name in wanted:
        for label, sql in ((name, queries[name]), (f"{name} (without LIMIT)", tpch.without_limit(queries[name]))):
            started = time.perf_counter()
            try:
                db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            except IvmError as e:  # unsupported constructs, chiefly
                skipped[name] = str(e)
                continue
            created[name] = (label, sql)
            seconds[name] = time.perf_counter() - started
            skipped.pop(name, None)
            break
    return created, seconds, skipped


def view_names(names: list[str] | None) -> list[str]:
    """The views to create: q1 and q01 both name TPC-H query 1; None: all 22."""
    known = list(tpch.query_files())
    if not names:
        return known
    wanted = [f"q{int(n[1:]):02d}" if n[:1] == "q" and n[1:].isdigit() else n for n in names]
    unknown = [n for n, w in zip(names, wanted) if w not in known]
    if unknown:
        raise SystemExit(f"ivm bench tpch: unknown view(s) {', '.join(unknown)} (known: q1 .. q22)")
    return wanted


def maintained(db) -> dict[str, tuple[dict, dict]]:  # noqa: ANN001
    """view -> (cumulative seconds per path, batches per path) from the engine's status."""
    views = db.status()["maintenance"]["views"]
    return {name: (facts["seconds"], facts["batches"]) for name, facts in views.items()}


def run_scale(sf: float, batch: int, refreshes: int, warmup: int, names: list[str] | None, data_dir: Path,
              progress: Progress, spark: bool = False, seed: int = 1, per_table: bool = False,
              memory: Memory | None = None) -> ScaleResult:
    import ivm

    memory = memory or Memory()
    phases = Phases()
    directory = data_dir / f"sf{sf:g}"
    progress(f"SF {sf:g}: generating data (tpchgen-cli, cached)", 0, 1)
    tpch.generate(sf, directory)
    phases("generated")
    progress(f"SF {sf:g}: loading the DuckDB reference", 0, 1)
    database = directory / "reference.duckdb" if memory.reference_file else None
    con = tpch.reference(directory, database, memory.reference_limit)
    phases("DuckDB reference loaded")
    db = ivm.connect(**memory.spill_options(directory))
    try:
        progress(f"SF {sf:g}: loading ivm's tables", 0, 1)
        started = time.perf_counter()
        tpch.create_tables(db)
        tpch.load_files(db, directory, con, lambda table: phases(f"ivm table {table} loaded"), memory.load_rows)
        result = ScaleResult(sf, batch, refreshes, warmup, time.perf_counter() - started)
        result.phases, result.reference = phases.log, memory.describe(database)
        result.spill = memory.describe_spill(directory)
        result.rss_after_load = rss()
        created, seconds, result.skipped = _create_with_progress(db, names, sf, progress)
        phases("views created")
        for name, (label, _) in created.items():
            result.views[name] = ViewResult(name, label, seconds[name])
        refresh = tpch.Refresh(con, seed=seed, **refresh_sizes(batch))
        total = warmup + refreshes
        for step in range(total):
            progress(f"SF {sf:g}: refresh {step + 1}/{total}" + (" (warm-up)" if step < warmup else ""), step, total)
            _one_refresh(db, con, refresh, created, result, counted=step >= warmup, per_table_calls=per_table)
        phases("refreshes done")
        if spark:  # before the check: the views maintained on Spark are checked too
            from bench.tpch_spark import spark_maintenance

            result.spark_ivm_note = spark_maintenance(db, con, refresh, created, result, progress, per_table)
            phases("refreshes on Spark done")
        progress(f"SF {sf:g}: checking every view against its recompute", total, total)
        _finish(db, con, created, result)
        phases("checked")
        if spark:
            from bench.tpch_spark import spark_recompute

            result.spark_note = spark_recompute(con, created, result, progress)
    finally:
        phases.stop()
        db.close()
        con.close()
    result.peak_rss = peak_rss()
    result.peak_anon = phases.peak_anon
    return result


@dataclass
class Memory:
    """Where the memory goes: DuckDB's reference in a file with a capped buffer pool, and a cap
    on the ivm engine's DuckDB (its first computations and recomputes spill beyond it)."""

    reference_file: bool = True
    reference_limit: str | None = "4GB"
    engine_limit: str | None = None
    spill: bool = True  # ivm's runs of at least spill_rows rows in mapped files (ivm.connect(spill_dir=...))
    spill_rows: int = 1_000_000
    load_rows: int = 4_000_000  # rows per apply_changes call of the initial load (bounds its transient)

    def spill_options(self, directory: Path) -> dict:
        """ivm.connect options: runs spilled under ``directory``, and ivm's DuckDB capped at ``engine_limit``
        (past it DuckDB spills to the engine's scratch directory under $TMPDIR)."""
        return {"spill_dir": str(directory / "ivm-runs") if self.spill else False, "spill_rows": self.spill_rows,
                "memory_limit": self.engine_limit}

    def describe_spill(self, directory: Path) -> str:
        return f"runs of >= {self.spill_rows:,} rows in {directory / 'ivm-runs'}" if self.spill else "off"

    def describe(self, database: Path | None) -> str:
        where = f"a DuckDB file ({database.name}, buffer pool {self.reference_limit or 'DuckDB default'})" \
            if database else "in memory"
        return where + (f"; ivm's DuckDB memory_limit {self.engine_limit}" if self.engine_limit else "")


def _create_with_progress(db, names, sf, progress):  # noqa: ANN001, ANN202
    wanted = view_names(names)
    created, seconds, skipped = {}, {}, {}
    for i, name in enumerate(wanted):
        progress(f"SF {sf:g}: creating view {name}", i, len(wanted))
        c, s, k = create_views(db, [name])
        created.update(c)
        seconds.update(s)
        skipped.update(k)
    return created, seconds, skipped


def _one_refresh(db, con: duckdb.DuckDBPyConnection, refresh: tpch.Refresh, created: dict, result: ScaleResult,  # noqa: ANN001
                 counted: bool, per_table_calls: bool = False) -> None:
    batches = refresh.batches()
    calls, spent, paths = maintain(db, batches, per_table_calls)
    for table, changes in batches:
        refresh.apply(table, changes)
    recompute = {}
    for name, (_, sql) in created.items():
        started = time.perf_counter()
        con.sql(sql).to_arrow_table()
        recompute[name] = time.perf_counter() - started
    if not counted:
        return
    result.changed_rows.append(sum(c.num_rows for _, c in batches))
    result.refresh_seconds.append(sum(calls))
    result.call_seconds.extend(calls)
    for name, view in result.views.items():
        view.ivm.append(spent[name])
        view.recompute.append(recompute[name])
        for path, runs in paths[name].items():
            view.paths[path] = view.paths.get(path, 0) + runs


def maintain(db, batches: list[tuple[str, "pa.Table"]], per_table_calls: bool = False  # noqa: ANN001
             ) -> tuple[list[float], dict[str, float], dict[str, dict[str, int]]]:
    """Apply one refresh to ivm: (seconds per call, each view's maintenance seconds, its runs per path)."""
    before = maintained(db)
    calls = []
    if per_table_calls:
        for table, changes in per_table(batches):
            started = time.perf_counter()
            db.apply_changes(table, changes)
            calls.append(time.perf_counter() - started)
    else:  # one atomic call: every view is maintained once per refresh
        started = time.perf_counter()
        db.apply_batch(per_table(batches))
        calls.append(time.perf_counter() - started)
    after = maintained(db)
    spent, paths = {}, {}
    for name, (seconds, runs) in after.items():
        old, old_runs = before[name]
        spent[name] = sum(seconds[p] - old[p] for p in seconds)
        paths[name] = {p: runs[p] - old_runs[p] for p in runs if runs[p] - old_runs[p]}
    return calls, spent, paths


def per_table(batches: list[tuple[str, "pa.Table"]]) -> list[tuple[str, "pa.Table"]]:
    """One batch per table (its inserts, updates and deletes in stream order, mixed ``__op``).

    A view pays a fixed cost per batch that changes its sources, so a refresh
    is sent as one call per table (six) rather than one per table and kind
    (ten). Tables are independent, so the state after the refresh is the same.
    """
    import pyarrow as pa

    grouped: dict[str, list] = {}
    for table, changes in batches:
        grouped.setdefault(table, []).append(changes)
    return [(table, pa.concat_tables(parts) if len(parts) > 1 else parts[0]) for table, parts in grouped.items()]


def _finish(db, con: duckdb.DuckDBPyConnection, created: dict, result: ScaleResult) -> None:  # noqa: ANN001
    sys.path.insert(0, str(ROOT))  # the oracle's multiset comparison lives with the tests
    from tests.oracle.compare import multiset_diff

    facts = db.status()["maintenance"]["views"]
    snapshot = db._engine.store.snapshot  # sizes of what the engine holds (in memory)
    for name, (_, sql) in created.items():
        view = result.views[name]
        got = db.sql(f"SELECT * FROM {name}")
        view.rows = got.num_rows
        view.problem = multiset_diff(got, con.sql(sql).to_arrow_table())
        view.estimates = {"incremental": facts[name]["estimate_incremental"],
                          "recompute": facts[name]["estimate_recompute"]}
        view.state_bytes = sum(snapshot[s.name].num_bytes for s in db._engine.catalog.views[name].states)
    for table in tpch.TABLES:
        result.table_rows[table] = snapshot[table].num_rows
        result.table_bytes += snapshot[table].num_bytes
    result.spilled_bytes = sum(relation.spilled_bytes for relation in snapshot.relations.values())
    result.rss_end = rss()


def machine() -> dict[str, str]:
    import duckdb as d
    import pyarrow
    import sqlglot

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import os

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpu": f"{cpu} ({os.cpu_count()} cores)", "memory": f"{memory / 2**30:.1f} GiB",
        "os": platform.platform(), "python": platform.python_version(), "duckdb": d.__version__,
        "pyarrow": pyarrow.__version__, "sqlglot": sqlglot.__version__,
    }


def default_data_dir() -> Path:
    return ROOT / "data" / "tpch" if (ROOT / ".git").exists() else Path(tempfile.gettempdir()) / "ivm-tpch"


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")
