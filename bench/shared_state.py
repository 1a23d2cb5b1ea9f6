"""What a batch costs when state lives on shared storage (issue 28): the floor under a Spark engine.

    python -m bench.shared_state --sf 1 --batches 8 --orders 250

TPC-H's lineitem is loaded into a shared Z-set (storage/shared_zset.py)
clustered by ``l_orderkey``: Spark reads the generated Parquet file and
writes the table's files, the driver commits them (it never holds rows).
Then each batch updates every line of ``--orders`` random orders (a new
quantity), as a CDC batch would, the way the engine would have to:

1. look the old rows up: the probe keys (the change, shipped from the
   driver) name the files whose key range holds one (file statistics), and
   Spark joins those files' rows with the keys;
2. write the change: the old rows with weight -1 and the new rows with +1,
   sorted by the key, as new files;
3. commit them for the batch's offset (deltalake, by the driver).

Steps 1-2 are one Spark job. Reported per batch (medians over the batches
after ``--warmup``): wall seconds of the job and of the commit, files read
of the table's files, rows changed; then the same lookup without file
pruning (every file), the Python driver's and the JVM's peak RSS, and a
check that the table's content is what the batches made (row count kept,
quantity sum grown by the rows updated), computed by Spark from the files.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.tpch import generate
from ivm.execute.spark import shared_state
from ivm.execute.spark.session import session
from storage.shared_zset import SharedZSet
from storage.zset import WEIGHT

KEY = "l_orderkey"


def jvm_peak_rss(spark) -> int:
    """Peak resident bytes of the Spark JVM this process started (local mode: driver and executors)."""
    pid = spark.sparkContext._gateway.proc.pid
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sf", type=float, default=1)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--orders", type=int, default=250, help="orders whose lines each batch updates")
    parser.add_argument("--files", type=int, default=64, help="files the load writes (key ranges)")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--root", type=Path, default=None, help="storage root (default: a temporary directory)")
    args = parser.parse_args(argv)

    source = Path("data/tpch") / f"sf{args.sf:g}"
    generate(args.sf, source)
    spark = session({"spark.master": "local[2]", "spark.driver.memory": args.driver_memory,
                     "spark.sql.shuffle.partitions": "2"})
    root = args.root or Path(tempfile.mkdtemp(prefix="ivm-shared-"))
    schema = pq.read_schema(source / "lineitem.parquet")  # the footer only
    schema = pa.schema([pa.field(f.name, f.type) for f in schema])
    table = SharedZSet.create(root / f"lineitem-sf{args.sf:g}-{time.time_ns()}", schema, cluster_by=(KEY,))

    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    quantity_type = from_arrow_schema(table.schema)["l_quantity"].dataType

    started = time.perf_counter()
    rows = spark.read.parquet(str(source / "lineitem.parquet")).withColumn(WEIGHT, F.lit(1).cast("bigint"))
    loaded = table.commit(shared_state.write(table, rows, ranges=args.files), 1)
    print(f"load: {loaded.rows:,} rows in {loaded.files} files, {time.perf_counter() - started:.1f} s")

    low, high = (int(v) for v in spark.read.parquet(str(source / "orders.parquet"))
                 .agg(F.min("o_orderkey"), F.max("o_orderkey")).first())
    rng = np.random.default_rng(28)
    measured, updated = [], 0
    for batch in range(args.warmup + args.batches):
        keys = pa.array(rng.integers(low, high + 1, args.orders), pa.int64())
        probe = spark.createDataFrame(pa.table({KEY: keys})).distinct()  # the change: bounded by the batch
        t0 = time.perf_counter()
        stored = shared_state.read(spark, table, keys={KEY: keys})
        old = shared_state.consolidated(stored.join(F.broadcast(probe), KEY, "left_semi"))
        # each old row twice, from one scan: with weight -w as it was, with +w and the new quantity
        signed = old.select("*", F.explode(F.array(F.lit(-1), F.lit(1))).alias("__sign"))
        added = F.col("__sign") > 0
        change = signed.select(
            *[c for c in table.schema.names if c not in ("l_quantity", WEIGHT)],
            F.when(added, F.col("l_quantity") + 1).otherwise(F.col("l_quantity")).cast(quantity_type)
            .alias("l_quantity"),
            (F.col(WEIGHT) * F.col("__sign")).alias(WEIGHT),
        ).coalesce(1)  # one file per batch (write() puts the columns in the table's order)
        directory = shared_state.write(table, change)
        t1 = time.perf_counter()
        done = table.commit(directory, batch + 2)
        t2 = time.perf_counter()
        read = (len(table.files(done.version - 1, keys={KEY: keys})), len(table.files(done.version - 1)))
        updated += done.rows // 2
        if batch >= args.warmup:
            measured.append((t1 - t0, t2 - t1, read, done.rows))
    job = statistics.median(m[0] for m in measured)
    commit = statistics.median(m[1] for m in measured)
    print(f"per batch ({args.orders} orders updated, median of {len(measured)}): job {job * 1000:.0f} ms, "
          f"commit {commit * 1000:.0f} ms, files read {statistics.median(m[2][0] for m in measured):.0f} "
          f"of {statistics.median(m[2][1] for m in measured):.0f}, rows changed {statistics.median(m[3] for m in measured):.0f}")

    keys = pa.array(rng.integers(low, high + 1, args.orders), pa.int64())
    probe = spark.createDataFrame(pa.table({KEY: keys})).distinct()
    timings = {}
    for label, pruned in (("pruned", {KEY: keys}), ("every file", None)):
        t0 = time.perf_counter()
        shared_state.read(spark, table, keys=pruned).join(F.broadcast(probe), KEY, "left_semi").count()
        timings[label] = time.perf_counter() - t0
    print("lookup of one batch's keys: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items()))

    content = shared_state.consolidated(shared_state.read(spark, table))
    count, quantity = content.agg(F.sum(WEIGHT), F.sum(F.col("l_quantity") * F.col(WEIGHT))).first()
    base_count, base_quantity = (spark.read.parquet(str(source / "lineitem.parquet"))
                                 .agg(F.count("*"), F.sum("l_quantity")).first())
    ok = count == base_count and quantity == base_quantity + updated
    print(f"content: {count:,} rows, quantity {quantity} = {base_quantity} + {updated} updated: "
          f"{'equal' if ok else 'NOT EQUAL'}")
    print(f"peak RSS: python driver {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB, "
          f"Spark JVM {jvm_peak_rss(spark) / 2**30:.2f} GiB")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
