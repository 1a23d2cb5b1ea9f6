"""Spark in the TPC-H benchmark (``ivm bench tpch --spark``): ivm maintaining the views on Spark, and
Spark recomputing them.

``spark_maintenance``: after the counted refreshes on DuckDB, the database is
switched to ``SET ivm.engine = 'spark'`` and ``SPARK_WARMUP + SPARK_REFRESHES``
more refreshes are applied (the same stream, mirrored in the reference). The
first ships every stored table's runs to Spark (and rebuilds the state of a
view the cost model had moved to recompute), so it is not counted. Each
view's time is the engine's own per-view timer, as on DuckDB. Maintenance is
forced incremental for these refreshes: what is measured is the delta
programs on Spark (the cost model, seeing Spark's first run, would move
every view to DuckDB's recompute). The report names the path taken. The final
check (every view equals its recompute) runs after these refreshes, so it
covers the Spark-maintained views.

``spark_recompute``: a local Spark session (``local[*]``, bound to 127.0.0.1,
no UI) reads Parquet copies of the reference tables as they are after the
last refresh, and runs each view's SELECT (transpiled from DuckDB's dialect by
sqlglot) ``RUNS`` times, collecting the result to Arrow. This is what
recomputing the views on Spark costs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import sqlglot

from bench import tpch

RUNS = 3
SPARK_WARMUP = 1
SPARK_REFRESHES = 3


def spark_maintenance(db, con: duckdb.DuckDBPyConnection, refresh: tpch.Refresh, created: dict, result,  # noqa: ANN001
                      progress, per_table_calls: bool = False) -> str:
    """``SPARK_WARMUP + SPARK_REFRESHES`` refreshes maintained with ``SET ivm.engine = 'spark'``."""
    from bench.tpch_run import maintain
    from ivm import IvmError

    total = SPARK_WARMUP + SPARK_REFRESHES
    settings = db._engine.settings  # bench only: no SQL setting switches the maintenance mode
    mode, settings.maintenance = settings.maintenance, "incremental"
    db.execute("SET ivm.engine = 'spark'")
    try:
        for step in range(total):
            progress(f"SF {result.sf:g}: refresh {step + 1}/{total} maintained on Spark"
                     + (" (warm-up: ships the tables to Spark)" if step < SPARK_WARMUP else ""), step, total)
            batches = refresh.batches()
            try:
                _, spent, paths = maintain(db, batches, per_table_calls)
            except IvmError as e:  # the refresh changed nothing in ivm nor (not applied) in the reference
                return f"ivm with engine = 'spark' failed at refresh {step + 1}: {str(e).splitlines()[0][:200]}"
            for table, changes in batches:
                refresh.apply(table, changes)
            if step < SPARK_WARMUP:
                continue
            used = db._engine.engine_used
            for name, view in result.views.items():
                view.spark_ivm.append(spent[name])
                for path in paths[name]:
                    where = "Spark" if used.get(name) == "spark" and path == "incremental" else "DuckDB"
                    key = f"{path} on {where}"
                    view.spark_paths[key] = view.spark_paths.get(key, 0) + 1
    finally:
        db.execute("SET ivm.engine = 'duckdb'")
        settings.maintenance = mode
    master = (db._engine.settings.spark_conf or {}).get("spark.master", "local[*]")
    return (f"ivm with engine = 'spark' ({master}), maintenance forced incremental, "
            f"median of {SPARK_REFRESHES} refreshes after {SPARK_WARMUP} warm-up")


def spark_recompute(con: duckdb.DuckDBPyConnection, created: dict, result, progress) -> str:  # noqa: ANN001
    """Each view's SELECT on Spark over Parquet copies of the reference's final tables, ``RUNS`` times."""
    from ivm.execute.spark.session import session

    # The process's one Spark session (ivm's, when the views were maintained on Spark), in a
    # session of its own for the temporary views; the Parquet copies are removed afterwards.
    spark = session().newSession()
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    directory = Path(tempfile.mkdtemp(prefix="ivm-spark-tpch"))
    failed = []
    try:
        for table in tpch.TABLES:
            con.execute(f"COPY {table} TO '{directory / table}.parquet' (FORMAT parquet)")
            spark.read.parquet(str(directory / f"{table}.parquet")).createOrReplaceTempView(table)
        for i, (name, (_, sql)) in enumerate(created.items()):
            progress(f"SF {result.sf:g}: Spark recompute of {name}", i, len(created))
            text = sqlglot.transpile(sql, read="duckdb", write="spark")[0]
            try:
                for _ in range(RUNS):
                    started = time.perf_counter()
                    spark.sql(text).toArrow()
                    result.views[name].spark.append(time.perf_counter() - started)
            except Exception as e:  # noqa: BLE001  (reported per view, the run goes on)
                failed.append(f"{name}: {str(e).splitlines()[0][:120]}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    note = f"local Spark {spark.version} over Parquet copies of the final tables, median of {RUNS} runs per view"
    return note + (f"; failed: {'; '.join(failed)}" if failed else "")
