"""Spark incremental maintenance vs Spark full recompute vs DuckDB incremental (issue 6, acceptance 3).

    python -m bench.spark --scale 1 --batches 5        # TPC-H SF1, 1% of lineitem per batch

One ivm database holds TPC-H's lineitem and orders (from ``tpchgen-cli``) and
a join-aggregate view (revenue by order priority and return flag). Each
change batch updates 1% of lineitem's rows (new price, discount, quantity
and return flag: rows move across groups, every group's sums change). The
same stream runs, batch by batch, alternately with ``SET ivm.engine =
'spark'`` and ``'duckdb'`` on the same database, and after every Spark batch
the view is recomputed from scratch on Spark over the current tables (the
same cached DataFrames the engine uses, so the recompute pays no loading)
and compared with the maintained view. Maintenance is forced incremental
(the cost model would otherwise recompute on DuckDB). Reported: medians and
p95 (wall seconds, and CPU seconds of the driver plus the Spark JVM) of

* spark incremental: ``apply_changes`` of the batch, maintenance on Spark
  (includes the engine's own ingest work, the same on both engines);
* spark recompute: the view's SELECT on Spark over the current tables;
* duckdb incremental: ``apply_changes`` with maintenance on DuckDB;

with ``--join-lookups`` the Spark runs look stored rows up with Spark joins
instead of the driver's index (what a probe set above JOIN_PROBES does).

Warm-up, the same for every measurement: the first ``--warmup`` rounds (2 by
default) of each of the three are run and reported apart, not counted. The
first Spark batch ships the tables' runs to Spark; after it the JVM still
compiles (JIT, whole-stage codegen) for a batch or two, and so does the
recompute. Batches are ``--fraction`` of lineitem's rows, so they grow with
the scale factor (1% is 60k rows at SF 1, 180k at SF 3), like the data the
recompute reads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import duckdb
import pyarrow as pa

import ivm
from bench.tpch import SCHEMA, generate

VIEW = (
    "SELECT o.o_orderpriority, l.l_returnflag, COUNT(*) AS n, SUM(l.l_quantity) AS qty, "
    "SUM(l.l_extendedprice * (1 - l.l_discount)) AS revenue, MAX(l.l_extendedprice) AS top_price "
    "FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey GROUP BY o.o_orderpriority, l.l_returnflag"
)


def load(db: ivm.Database, directory: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for table in ("orders", "lineitem"):
        db.execute(f"CREATE TABLE {table} ({SCHEMA[table]})")
        con.execute(f"CREATE TABLE {table} ({SCHEMA[table]})")
        con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet('{directory / (table + '.parquet')}')")
        db.apply_changes(table, con.sql(f"SELECT * FROM {table}").to_arrow_table())
    return con


def batch(con: duckdb.DuckDBPyConnection, fraction: float, step: int) -> pa.Table:
    """Upserts of ``fraction`` of lineitem's rows, applied to ``con`` too."""
    rows = con.sql(
        f"""SELECT * REPLACE (
                CAST(l_extendedprice * (0.9 + h / 5000) AS DECIMAL(15,2)) AS l_extendedprice,
                CAST((h % 11) / 100 AS DECIMAL(15,2)) AS l_discount,
                CAST(1 + h % 50 AS DECIMAL(15,2)) AS l_quantity,
                ['R', 'A', 'N'][1 + h % 3] AS l_returnflag)
            FROM (SELECT *, CAST(hash(l_orderkey, l_linenumber, {step}) % 1000 AS INTEGER) AS h
                  FROM lineitem USING SAMPLE {fraction * 100}% (bernoulli, {step}))"""
    ).to_arrow_table().drop_columns(["h"])
    con.execute("INSERT OR REPLACE INTO lineitem SELECT * FROM rows")
    return rows.append_column("__op", pa.repeat(pa.scalar("u"), rows.num_rows))


def spark_recompute(db: ivm.Database) -> tuple[float, pa.Table]:
    """The view's SELECT on Spark over the tables' current DataFrames (cached runs)."""
    engine = db._engine
    executor = engine.large.spark(engine.settings.spark_conf)
    snapshot = engine.store.snapshot
    for table in ("lineitem", "orders"):
        executor.frames.relation(snapshot[table]).createOrReplaceTempView(table)
    start = time.perf_counter()
    result = executor.spark.sql(VIEW).toArrow()
    return time.perf_counter() - start, result


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's descendants: the Spark JVM (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
            times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, list(parents.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0.0)
        stack.extend(parents.get(pid, []))
    return total


def same(a: pa.Table, b: pa.Table) -> bool:
    def rows(t: pa.Table) -> list:
        t = t.select(sorted(t.column_names))
        return sorted((tuple(str(v) if not isinstance(v, float) else round(v, 2) for v in r.values())
                       for r in t.to_pylist()), key=str)
    return rows(a) == rows(b.cast(a.schema))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=5, help="batches per engine, counted")
    parser.add_argument("--warmup", type=int, default=2, help="batches per engine run first and not counted")
    parser.add_argument("--fraction", type=float, default=0.01, help="share of lineitem changed per batch")
    parser.add_argument("--data", default=None, help="directory for the generated Parquet files")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (the JVM heap of local Spark)")
    parser.add_argument("--join-lookups", action="store_true", help="Spark joins instead of index lookups")
    args = parser.parse_args()
    directory = Path(args.data or f"/tmp/ivm-bench-tpch-sf{args.scale:g}")
    generate(args.scale, directory)
    if args.join_lookups:
        from ivm.execute.spark import executor

        executor.JOIN_PROBES = 0
    conf = {"spark.master": args.master, "spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "4"}
    timings: dict[str, list[float]] = {"spark incremental": [], "spark recompute": [], "duckdb incremental": []}
    cpu: dict[str, list[float]] = {name: [] for name in timings}  # driver + JVM CPU seconds
    with ivm.connect(engine="duckdb", spark_conf=conf, maintenance="incremental") as db:
        start = time.perf_counter()
        con = load(db, directory)
        db.execute(f"CREATE MATERIALIZED VIEW revenue AS {VIEW}")
        rows = con.sql("SELECT count(*) FROM lineitem").fetchall()[0][0]
        print(f"loaded SF{args.scale:g} ({rows:,} lineitem rows) and created the view in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        for step in range(2 * (args.warmup + args.batches)):
            engine = "spark" if step % 2 == 0 else "duckdb"
            counted = step // 2 >= args.warmup
            changes = batch(con, args.fraction, step)
            db.execute(f"SET ivm.engine = '{engine}'")
            start, cpu_start = time.perf_counter(), time.process_time() + children_cpu()
            db.apply_changes("lineitem", changes)
            took = time.perf_counter() - start
            used = time.process_time() + children_cpu() - cpu_start
            assert db._engine.engine_used["revenue"] == engine
            assert db._engine.catalog.views["revenue"].cost.last == "incremental"
            line = f"batch {step} ({changes.num_rows:,} rows) {engine}: {took:.2f} s (cpu {used:.2f} s)"
            if engine == "spark":
                cpu_start = time.process_time() + children_cpu()
                recompute, result = spark_recompute(db)
                recompute_cpu = time.process_time() + children_cpu() - cpu_start
                assert same(db.sql("SELECT * FROM revenue"), result), "maintained view differs from recompute"
                line += f", spark recompute {recompute:.2f} s (cpu {recompute_cpu:.2f} s)"
                if counted:
                    timings["spark recompute"].append(recompute)
                    cpu["spark recompute"].append(recompute_cpu)
            if counted:
                timings[f"{engine} incremental"].append(took)
                cpu[f"{engine} incremental"].append(used)
            print(line + ("" if counted else "  [warm-up, not counted]"), flush=True)
        want = con.sql(VIEW).to_arrow_table()
        assert same(db.sql("SELECT * FROM revenue"), want), "maintained view differs from DuckDB's recompute"
    print(f"\nTPC-H SF{args.scale:g}, batches of {args.fraction:.0%} of lineitem, spark.master={args.master}, "
          f"{args.warmup} warm-up batches per engine not counted"
          + (", lookups as Spark joins" if args.join_lookups else ""))
    for name, values in timings.items():
        print(f"  {name:20s} median {statistics.median(values):7.2f} s  p95 {percentile(values, 95):7.2f} s  "
              f"cpu median {statistics.median(cpu[name]):7.2f} s  (n={len(values)})")
    ratio = statistics.median(timings["spark recompute"]) / statistics.median(timings["spark incremental"])
    print(f"  spark recompute / spark incremental (medians): {ratio:.1f}x wall, "
          f"{statistics.median(cpu['spark recompute']) / statistics.median(cpu['spark incremental']):.1f}x cpu")
    print(f"  spark incremental / duckdb incremental (medians): "
          f"{statistics.median(timings['spark incremental']) / statistics.median(timings['duckdb incremental']):.1f}x")


if __name__ == "__main__":
    main()
