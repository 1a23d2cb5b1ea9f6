"""Spark full recompute of the TPC-H views (``ivm bench tpch --spark``).

A local Spark session (``local[*]``, bound to 127.0.0.1, no UI) reads Parquet
copies of the reference tables as they are after the last refresh, and runs
each view's SELECT (transpiled from DuckDB's dialect by sqlglot) ``RUNS``
times, collecting the result to Arrow. This is what recomputing the views on
Spark costs; ivm maintaining them on Spark is issue 6 (not available here).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import duckdb
import sqlglot

from bench import tpch

RUNS = 3


def spark_recompute(con: duckdb.DuckDBPyConnection, created: dict, result, progress) -> str:  # noqa: ANN001
    from pyspark.sql import SparkSession

    directory = Path(tempfile.mkdtemp(prefix="ivm-spark-tpch"))
    for table in tpch.TABLES:
        con.execute(f"COPY {table} TO '{directory / table}.parquet' (FORMAT parquet)")
    spark = (SparkSession.builder.master("local[*]").appName("ivm-bench-tpch")
             .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    failed = []
    try:
        for table in tpch.TABLES:
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
        spark.stop()
    note = f"local Spark {spark.version} over Parquet copies of the final tables, median of {RUNS} runs per view"
    return note + (f"; failed: {'; '.join(failed)}" if failed else "")
