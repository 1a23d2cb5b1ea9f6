"""A program run's temporaries on Spark: lazy DataFrames until the driver needs rows.

Every Spark job costs a fixed second or so (scheduling, Arrow conversion both
ways), far more than the work on a change batch. So a Query step's result
read by one later query stays a lazy DataFrame that the reader's plan
includes: a chain of such queries runs as one Spark job. Rows come to the
driver where a step needs them there (``temps[name]``, a ``dict`` read): a
Lookup in a large relation's index, a Stack, a loop's emptiness test, the
Replace steps, the view's output, and results read by several steps (the
executor collects those at once rather than have Spark compute them twice).
A small such result that queries read is collected from a Spark checkpoint
(``Lazy.cached``): its Spark readers read the checkpoint, not its rows
shipped back from the driver.

Temporaries on the driver (change batches, lookups, collected results)
become a DataFrame once per run, however many queries read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
from sqlglot import exp

from delta_operators.program import (Lookup, Loop, Program, Query, Stack, Step, guard_reads, need, need_results,
                                     probe_reads, query_columns)
from ivm.execute.spark.frames import SMALL_ROWS


@dataclass
class Lazy:
    """A temporary computed by Spark, brought to the driver on first read."""

    frame: object  # pyspark DataFrame
    schema: pa.Schema | None = None  # cast the driver rows to this (stored relations' types)
    arrow: pa.Table | None = None
    # Every input of its plan is a small driver table (frames.SMALL_ROWS) or
    # such a Lazy: it runs as one stage with broadcasts off (executor.py).
    small: bool = False
    # ``frame`` is cached in Spark (one partition): collecting it fills the
    # cache, and readers read the cache rather than its rows shipped back.
    cached: bool = False
    # The columns to bring to the driver (None: all). Only for a cached
    # frame: its Spark readers read the cache, so the driver's copy needs
    # only what driver steps read (driver_columns).
    columns: tuple[str, ...] | None = None
    # Rows of a stored relation (its whole DataFrame, or a Spark join
    # lookup): as large as the relation, so steps reading it stay on Spark.
    stored: bool = False


class SparkTemps(dict):
    """Temporaries by name: Arrow tables or Lazy frames; ``[name]`` always gives Arrow."""

    def __init__(self, inputs: dict[str, pa.Table], spark_frame: Callable[[pa.Table], object],
                 collect: Callable[[Lazy], pa.Table], columns: dict[str, set[str] | None] | None = None):
        super().__init__(inputs)
        self._spark_frame = spark_frame
        self._columns = columns or {}  # spark_columns_read(program): what Spark reads of each temporary
        self._collect = collect
        self._frames: dict[str, tuple[pa.Table, object]] = {}  # driver temp -> its DataFrame this run

    def __getitem__(self, name: str) -> pa.Table:
        value = super().__getitem__(name)
        if not isinstance(value, Lazy):
            return value
        if value.arrow is None:
            value.arrow = self._collect(value)
        return value.arrow

    def lazy(self, name: str) -> bool:
        """True while ``name`` has not been brought to the driver (reading it costs a job)."""
        value = super().__getitem__(name)
        return isinstance(value, Lazy) and value.arrow is None

    def stored(self, name: str) -> bool:
        """True when ``name`` is rows of a stored relation still in Spark (Lazy.stored)."""
        value = super().__getitem__(name)
        return isinstance(value, Lazy) and value.arrow is None and value.stored

    def small(self, name: str) -> bool:
        """True when ``name``'s plan reads only small driver tables (one partition each)."""
        value = super().__getitem__(name)
        if isinstance(value, Lazy):
            if value.arrow is None:
                return value.small
            value = value.arrow
        return value.num_rows <= SMALL_ROWS

    def frame(self, name: str):
        """``name`` as a DataFrame: its lazy plan, or its driver rows shipped once per run."""
        value = super().__getitem__(name)
        if isinstance(value, Lazy):
            if value.arrow is None or value.cached:
                return value.frame
            # Collected (read by several steps): its rows, which Spark plans
            # with exact sizes, not its plan computed again by every reader.
            value = value.arrow
        known = self._frames.get(name)
        if known is None or known[0] is not value:
            known = self._frames[name] = (value, self._spark_frame(self._shipped(name, value)))
        return known[1]

    def _shipped(self, name: str, table: pa.Table) -> pa.Table:
        """The columns of a driver temporary that Spark reads (at least one: a frame needs one)."""
        needed = self._columns.get(name)
        if needed is None:
            return table
        keep = [c for c in table.column_names if c.lower() in needed]
        return table.select(keep or table.column_names[:1])


def spark_columns_read(program: Program) -> dict[str, set[str] | None]:
    """Columns Spark may read of each temporary (None: all of them).

    A driver temporary is shipped with these columns only: a change batch of
    lineitem has 16 columns, a join term reads 5 of them, and shipping rows
    to Spark costs in proportion to their bytes. A superset is safe: what
    ``query_columns`` finds for the queries that read the temporary, and
    the probe columns of lookups joined on Spark (steps on the driver are
    not counted: ``driver_columns``). Programs with loops ship whole
    temporaries (loop variables take other temporaries' rows).
    """
    if any(isinstance(step, Loop) for step in program.steps):
        return {}
    needed: dict[str, set[str] | None] = {}
    for step in program.steps:
        if isinstance(step, Lookup):  # a probe joined on Spark (executor._join_lookup)
            need(needed, step.probe, {c.lower() for c in probe_reads(step)})
        elif isinstance(step, Query):
            for table, columns in query_columns(step.sql).items():
                need(needed, table, columns)
    return needed


def driver_columns(program: Program) -> dict[str, set[str] | None] | None:
    """Columns steps on the driver read of each temporary (None: all; absent: none; None for all: loops).

    Index lookups read their probe columns (and filter), a MIN/MAX guard
    its probe's value and weight and its values' value columns; a Stack, a
    Replace, the view's output and loops read whole temporaries, and so do
    steps on stored state (``Query.beside_state``), which run on the driver
    when their lookups did. Other Query steps are not counted: on Spark they read the
    temporary's DataFrame.
    Names are as the program spells them (lookups and guards name columns
    exactly).
    """
    if any(isinstance(step, Loop) for step in program.steps):
        return None  # loop variables take other temporaries' rows: keep everything
    needed: dict[str, set[str] | None] = {}
    for step in program.steps:
        if isinstance(step, Lookup):
            need(needed, step.probe, probe_reads(step))
        elif isinstance(step, Stack):
            need(needed, step.source, None)
        elif isinstance(step, Query):
            if step.guard is not None:
                for name, columns in guard_reads(step.guard):
                    need(needed, name, columns)
            if step.beside_state:
                for table in step.sql.find_all(exp.Table):
                    need(needed, table.name, None)
    need_results(needed, program)
    return needed


def queried(program: Program) -> set[str]:
    """Temporaries some Query reads (Spark reads them; other readers want driver rows)."""
    names: set[str] = set()

    def walk(steps: list[Step]) -> None:
        for step in steps:
            if isinstance(step, Query):
                names.update(t.name for t in step.sql.find_all(exp.Table))
            elif isinstance(step, Loop):
                walk(step.body)

    walk(program.steps)
    return names
