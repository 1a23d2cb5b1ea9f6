"""Spark's side of a shared Z-set (storage/shared_zset.py): executors read and write its files.

The driver names files and commits them; rows never pass through it:

* ``read``: the Parquet files of a version (only those that may hold the
  probe keys, when given) as a DataFrame; the plan is a file scan that the
  executors run.
* ``append``: a change (a DataFrame with ``__weight``) written by the
  executors, sorted by the cluster keys, then committed for its offset.
* ``compact``: the table's consolidated rows written whole, replacing its
  files (a version's content is unchanged by it).
"""

from __future__ import annotations

import shutil
import uuid

import pyarrow as pa

from ivm.execute.spark.dialect import to_spark
from storage.checkpoint import StorageError
from storage.shared_zset import Committed, SharedZSet
from storage.zset import WEIGHT, consolidate_sql


def read(spark, table: SharedZSet, version: int | None = None, keys: dict[str, pa.Array] | None = None):
    """The rows (weights not summed) of ``version`` of ``table``, as a lazy file scan.

    With ``keys``, only the files whose key range holds a probe value
    (``SharedZSet.files``): a superset of the rows holding them, which the
    caller joins with the probe. Pushing the keys into the Parquet scan as
    an IN filter (checked against row group and page statistics) was
    measured slower, not faster: 8.6-13.6 s against 1.5 s for 250 keys in
    6M rows (bench/README.md, session 33).
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema)
    files = table.files(version, keys)
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*files)


def consolidated(frame):
    """Equal rows summed into one, rows whose weights cancel dropped: Z-set consolidation (storage/zset.py).

    The query is the one every engine runs (``consolidate_sql``), rendered for
    Spark; the temporary view it reads is dropped once the query is analysed
    (the DataFrame keeps the resolved plan).
    """
    spark = frame.sparkSession
    name = f"__zset_{uuid.uuid4().hex}"
    frame.createOrReplaceTempView(name)
    try:
        return spark.sql(to_spark(consolidate_sql(name, [c for c in frame.columns if c != WEIGHT])))
    finally:
        spark.catalog.dropTempView(name)


def write(table: SharedZSet, frame, ranges: int = 0):
    """Write ``frame`` (the table's columns) as Parquet files of a new directory; the directory.

    A file per partition of ``frame``, sorted by the cluster keys (callers
    coalesce a small change first). ``ranges`` > 0 splits the rows into that
    many key ranges first (a shuffle), so files hold disjoint ranges: worth
    it for a load or a compaction, which write the whole table, not for a
    change.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    wanted = from_arrow_schema(table.schema)
    got = {field.name: field.dataType for field in frame.schema}
    wrong = [f"{f.name} {got[f.name].simpleString() if f.name in got else 'missing'} (the table's: "
             f"{f.dataType.simpleString()})" for f in wanted if got.get(f.name) != f.dataType]
    if wrong or len(got) != len(wanted):
        extra = sorted(set(got) - set(wanted.names))
        raise StorageError(f"rows do not fit the shared Z-set at {table.path}: " + "; ".join(
            wrong + ([f"extra columns {extra}"] if extra else [])))
    directory = table.new_dir()
    frame = frame.select(*wanted.names)
    if table.cluster_by:  # files sorted by the keys programs probe: their statistics prune (shared_zset.files)
        if ranges:
            frame = frame.repartitionByRange(ranges, *table.cluster_by)
        frame = frame.sortWithinPartitions(*table.cluster_by)
    try:
        frame.write.mode("error").parquet(str(directory))
    except Exception as e:  # a failed job may leave part files: none of them is committed, none stays
        shutil.rmtree(directory, ignore_errors=True)
        raise StorageError(f"writing to the shared Z-set at {table.path} failed: {str(e).strip().splitlines()[0]}") \
            from None
    return directory


def append(table: SharedZSet, change, offset: int) -> Committed:
    """Add ``change`` (with ``__weight``) to the table as the version reflecting ``offset``; once."""
    if not table.accepts(offset):
        return Committed(None, 0, 0)  # replayed: not even written
    return table.commit(write(table, change), offset)


def compact(spark, table: SharedZSet, offset: int, ranges: int | None = None) -> Committed:
    """Rewrite the table as its consolidated rows (one row per distinct row) in ``ranges`` files, for ``offset``.

    ``ranges`` defaults to the session's shuffle partitions.
    """
    if not table.accepts(offset, overwrite=True):
        return Committed(None, 0, 0)
    if ranges is None:
        ranges = int(spark.conf.get("spark.sql.shuffle.partitions"))
    return table.commit(write(table, consolidated(read(spark, table)), ranges=ranges), offset, overwrite=True)
