"""The differential oracle: ivm's views against DuckDB recomputing them.

A Harness owns an ivm database and a plain DuckDB database with the same
schema. Every batch goes to ivm through ``apply_changes`` and to the model,
which rebuilds DuckDB's tables; then every view read from ivm must equal
DuckDB evaluating the view's SELECT over those tables, as a multiset, and
every table must equal the model.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref
from typing import Callable, Sequence

import duckdb
import sqlglot
from hypothesis import strategies as st

import ivm
from tests.oracle.compare import multiset_diff, tie_aware_diff
from tests.oracle.fixtures import ViewFixture
from tests.oracle.model import Model, generate_batch, ops_to_arrow


TABLES = ["customers", "orders", "items", "events"]  # the oracle schema's tables

# Batch sizes: mostly small, sometimes large (a 1,000-row batch over these key
# domains repeats keys many times, exercising in-batch ordering).
SIZES = st.one_of(st.integers(1, 12), st.integers(13, 200), st.sampled_from([500, 1000]))


def drawn_batches(data) -> Callable[[int], tuple[str, int]]:
    """``play``'s ``next_batch``: the table and the size of each batch, drawn by hypothesis (so it shrinks them)."""

    def next_batch(step: int) -> tuple[str, int]:
        return data.draw(st.sampled_from(TABLES), label=f"table {step}"), data.draw(SIZES, label=f"size {step}")

    return next_batch


def connect(spill_rows: int | None = None) -> ivm.Database:
    """An in-memory database; with ``spill_rows`` (or IVM_ORACLE_SPILL_ROWS set, e.g. for a soak), runs of
    that many rows are spilled to memory-mapped files (storage/spill.py) in a fresh temporary directory."""
    spill_rows = spill_rows or int(os.environ.get("IVM_ORACLE_SPILL_ROWS", "0"))
    if not spill_rows:
        return ivm.connect()
    directory = tempfile.mkdtemp(prefix="ivm-oracle-spill-")
    db = ivm.connect(spill_dir=directory, spill_rows=spill_rows)
    weakref.finalize(db, shutil.rmtree, directory, True)  # empty but for files being written
    return db


class Harness:
    def __init__(self, schema: list[str], views: list[ViewFixture], db: ivm.Database | None = None):
        self.db = db or connect()
        self.ref = duckdb.connect()
        self.model = Model()
        self.views = views
        self.created: list[ViewFixture] = []
        for statement in schema:
            self.db.execute(statement)
            self.ref.execute(statement)

    def close(self) -> None:
        self.db.close()
        self.ref.close()

    def create_views(self) -> None:
        for view in self.views:
            self.db.execute(f"CREATE MATERIALIZED VIEW {view.name} AS {view.sql}")
            self.ref.execute(f"CREATE VIEW {view.name} AS {view.sql}")
            self.created.append(view)

    def apply(self, table: str, ops: list) -> None:
        spec = self.model.specs[table]
        self.db.apply_changes(table, ops_to_arrow(spec, ops))
        self.model.apply(table, ops)
        self._reload(table)

    def apply_batch(self, batches: dict[str, list]) -> None:
        """Several tables' ops as one atomic ``apply_batch`` (distinct tables)."""
        self.db.apply_batch({t: ops_to_arrow(self.model.specs[t], ops) for t, ops in batches.items()})
        for table, ops in batches.items():
            self.model.apply(table, ops)
            self._reload(table)

    def _reload(self, table: str) -> None:
        data = self.model.arrow(table)  # noqa: F841  (read by DuckDB below)
        self.ref.execute(f"DELETE FROM {table}")
        self.ref.execute(f"INSERT INTO {table} SELECT * FROM data")

    def check(self, context: str = "") -> None:
        problems = []
        for table in self.model.specs:
            diff = multiset_diff(
                self.db.sql(f"SELECT * FROM {table}"), self.ref.sql(f"SELECT * FROM {table}").to_arrow_table()
            )
            if diff:
                problems.append(f"table {table}: {diff}")
        for view in self.created:
            got = self.db.sql(f"SELECT * FROM {view.name}")
            want = self.ref.sql(f"SELECT * FROM {view.name}").to_arrow_table()
            diff = self._tie_aware(view, got, want) if view.ties else multiset_diff(got, want)
            if diff:
                problems.append(f"view {view.name}: {diff}\n    {view.sql}")
        assert not problems, f"{context}\n" + "\n".join(problems)


    def _tie_aware(self, view: ViewFixture, got, want) -> str | None:
        candidates = self.ref.sql(view.candidates or without_limit(view.sql)).to_arrow_table()
        return tie_aware_diff(got, want, candidates, view.ties, view.ranks)


def without_limit(sql: str) -> str:
    """The query without its outermost LIMIT/OFFSET: every row it may choose from."""
    tree = sqlglot.parse_one(sql, dialect="duckdb")
    for key in ("limit", "offset"):
        tree.set(key, None)
    return tree.sql("duckdb")


def play(
    harness: Harness,
    rng: random.Random,
    tables: Sequence[str],
    batches: int,
    initial_rows: int,
    next_batch: Callable[[int], tuple[str, int]],
    label: str = "",
) -> None:
    """Load data, create the views (their first computation must see it), then
    apply ``batches`` random batches, checking every view after each one.

    ``next_batch(step)`` picks the table and the size of each batch.
    """
    for table in tables:
        if initial_rows:
            harness.apply(table, generate_batch(rng, harness.model, table, initial_rows))
    harness.create_views()
    harness.check(f"after creating the views {label}")
    for step in range(batches):
        table, size = next_batch(step)
        ops = generate_batch(rng, harness.model, table, size)
        harness.apply(table, ops)
        harness.check(f"after batch {step}: {len(ops)} ops on {table} {label}")
