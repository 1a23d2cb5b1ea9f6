"""Stored relations and temporaries as Spark DataFrames.

A relation is a tuple of immutable Arrow runs plus a live-row bitmap per run
(storage/relation.py). Its DataFrame is the union of one DataFrame per run,
minus the run's deleted positions (an anti join with a small list). The
per-run DataFrames are created once and cached (``.cache()`` above
CACHE_ROWS rows), keyed by the run's Arrow table, so a new relation version
costs Spark only its new runs: a 6M-row table changed by a 60k-row batch
ships 60k rows, not 6M. Entries go when their Arrow table is freed.

With ``positions`` the frame carries RUN (the run's index in this version)
and POS (the row's position in the run), as ``Relation.lookup`` returns them,
so a Replace can delete rows found by a Spark join.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pyarrow as pa

from storage.zset import POS, RUN
from storage.relation import Relation, unpack_live

# Runs and inputs at least this large are cached in Spark's memory (columnar);
# smaller ones are re-read from the Arrow batches Spark already holds.
CACHE_ROWS = 50_000
# Driver tables up to this many rows become one-partition DataFrames. One
# partition already satisfies every grouping and join requirement, so a query
# over such inputs alone plans without exchanges: one stage, one task, one
# job (the executor also turns broadcasts off for it). Spark's fixed cost per
# stage and per job, not the rows, is what a change batch's query pays.
SMALL_ROWS = 1_000_000


class Frames:
    def __init__(self, spark):
        self.spark = spark
        self._lock = threading.Lock()
        self._cached: dict[int, object] = {}  # id(Arrow table) -> DataFrame (POS appended for runs)

    def arrow(self, table: pa.Table):
        """A DataFrame of an Arrow table (one partition when small; cached while the table lives, when large)."""
        def create():
            frame = self.spark.createDataFrame(table)
            if table.num_rows <= SMALL_ROWS:
                frame = frame.coalesce(1)
            return frame.cache() if table.num_rows >= CACHE_ROWS else frame

        if table.num_rows < CACHE_ROWS:
            return create()
        return self._remember(table, create)

    def relation(self, relation: Relation, positions: bool = False):
        """The live rows of ``relation`` (with RUN/POS when ``positions``)."""
        from pyspark.sql import functions as F

        names = list(relation.schema.names) + ([RUN, POS] if positions else [])
        parts = []
        for r, run in enumerate(relation.runs):
            if not run.n_live:
                continue
            frame = self._run_frame(run.table)
            if run.live is not None:
                dead = pa.table({POS: pa.array(np.flatnonzero(~unpack_live(run.live, run.n_rows)).astype(np.int64))})
                frame = frame.join(F.broadcast(self.spark.createDataFrame(dead)), on=POS, how="left_anti")
            if positions:
                frame = frame.withColumn(RUN, F.lit(r).cast("int"))
            parts.append(frame.select(*names))
        if not parts:
            schema = relation.schema
            if positions:
                schema = schema.append(pa.field(RUN, pa.int32())).append(pa.field(POS, pa.int64()))
            return self.spark.createDataFrame(schema.empty_table())
        frame = parts[0]
        for part in parts[1:]:
            frame = frame.unionByName(part)
        return frame

    def _run_frame(self, table: pa.Table):
        def create():
            with_pos = table.append_column(POS, pa.array(np.arange(table.num_rows, dtype=np.int64)))
            frame = self.spark.createDataFrame(with_pos)
            return frame.cache() if table.num_rows >= CACHE_ROWS else frame

        return self._remember(table, create, tag="run")

    def _remember(self, table: pa.Table, create, tag: str = "arrow"):
        key = (id(table), tag)
        with self._lock:
            entry = self._cached.get(key)
            if entry is not None and entry[0]() is table:
                return entry[1]
        frame = create()
        with self._lock:
            self._cached[key] = (weakref.ref(table, lambda _, key=key: self._forget(key)), frame)
        return frame

    def _forget(self, key) -> None:
        with self._lock:
            entry = self._cached.pop(key, None)
        if entry is not None:
            try:
                entry[1].unpersist(blocking=False)
            except Exception:  # the session may be gone at interpreter exit; nothing to free then
                pass

    def clear(self) -> None:
        for key in list(self._cached):
            self._forget(key)
