"""``Database.apply_batch``: change batches of several tables applied atomically, as one offset.

Every view is maintained once per call over all the tables' deltas (the
delta programs of a set of changed sources, as a durable fold runs them),
so the oracle proves it over every catalogue and each maintenance path;
a bad batch of any table changes nothing.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from tests.oracle.fixtures import VIEW_SETS, oracle_schema, oracle_views
from tests.oracle.harness import TABLES, Harness
from tests.oracle.model import generate_batch

SIZES = st.one_of(st.integers(1, 12), st.integers(13, 120))  # per table: a multi-table batch is their sum


@pytest.mark.parametrize("mode", ["incremental", "recompute", "auto"])
@pytest.mark.parametrize("view_set", VIEW_SETS)
@settings(max_examples=1, deadline=None)  # 12 streams (view sets x modes): the suite's time budget
@given(data=st.data())
def test_multi_table_batches_keep_every_view_equal_to_its_recompute(view_set, mode, data):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = random.Random(seed)
    harness = Harness(oracle_schema(), oracle_views(view_set), db=ivm.connect(maintenance=mode))
    try:
        harness.apply_batch({t: generate_batch(rng, harness.model, t, 20) for t in TABLES})
        harness.create_views()
        for step in range(5):
            tables = data.draw(st.lists(st.sampled_from(TABLES), min_size=2, max_size=4, unique=True),
                               label=f"tables {step}")
            before = harness.db.offset
            harness.apply_batch({t: generate_batch(rng, harness.model, t, data.draw(SIZES)) for t in tables})
            assert harness.db.offset == before + 1  # one offset for the whole batch
            harness.check(f"after batch {step} on {tables} (seed {seed}, maintenance={mode})")
    finally:
        harness.close()


def two_tables(mode: str = "incremental") -> ivm.Database:
    db = ivm.connect(maintenance=mode)
    db.execute("CREATE TABLE a (id BIGINT PRIMARY KEY, k BIGINT)")
    db.execute("CREATE TABLE b (k BIGINT PRIMARY KEY, name VARCHAR)")
    db.execute("INSERT INTO a VALUES (1, 10), (2, 20)")
    db.execute("INSERT INTO b VALUES (10, 'x'), (20, 'y')")
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT a.id, b.name FROM a JOIN b ON a.k = b.k")
    return db


def test_one_maintenance_run_per_view_and_one_history_entry():
    db = two_tables()
    runs = db.status()["maintenance"]["views"]["j"]["batches"]["incremental"]
    since = db.offset
    offset = db.apply_batch({"a": pa.table({"id": [3], "k": [30]}), "B": pa.table({"k": [30], "name": ["z"]})})
    assert offset == since + 1 == db.offset
    assert db.status()["maintenance"]["views"]["j"]["batches"]["incremental"] == runs + 1
    assert sorted(db.sql("SELECT * FROM j").to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "x"}, {"id": 2, "name": "y"}, {"id": 3, "name": "z"}]
    changes = db.changes("j", since)  # a subscriber sees the joined row appear at that one offset
    assert changes.through == offset
    assert changes.rows.to_pylist() == [{"id": 3, "name": "z", "__weight": 1, "__offset": offset}]


@pytest.mark.parametrize("mode", ["incremental", "recompute"])
def test_a_bad_batch_of_one_table_changes_nothing(mode):
    db = two_tables(mode)
    before = (db.offset, db.sql("SELECT * FROM a ORDER BY id"), db.sql("SELECT * FROM b ORDER BY k"),
              db.sql("SELECT * FROM j ORDER BY id"))
    good = pa.table({"id": [3], "k": [10]})
    duplicate = pa.table({"k": [10], "name": ["again"], "__op": ["c"]})  # 'c' of an existing key
    with pytest.raises(ivm.IvmError, match="(?i)exist"):
        db.apply_batch({"a": good, "b": duplicate})
    with pytest.raises(ivm.IvmError, match="(?i)unknown|no such|does not exist"):
        db.apply_batch({"a": good, "nosuch": duplicate})
    after = (db.offset, db.sql("SELECT * FROM a ORDER BY id"), db.sql("SELECT * FROM b ORDER BY k"),
             db.sql("SELECT * FROM j ORDER BY id"))
    assert after[0] == before[0] and all(x.equals(y) for x, y in zip(after[1:], before[1:]))
    db.apply_batch({"a": good})  # the database goes on
    assert db.sql("SELECT count(*) AS n FROM j").to_pylist() == [{"n": 3}]


def test_repeated_or_no_tables_are_errors():
    db = two_tables()
    before = db.offset
    with pytest.raises(ivm.IvmError, match="each table appears once; repeated: a"):
        db.apply_batch([("a", pa.table({"id": [3], "k": [10]})), ("A", pa.table({"id": [4], "k": [10]}))])
    with pytest.raises(ivm.IvmError, match="at least one table"):
        db.apply_batch({})
    assert db.offset == before and db.sql("SELECT count(*) AS n FROM a").to_pylist() == [{"n": 2}]


def test_durable_database_says_not_supported(tmp_path):
    db = ivm.connect(tmp_path / "db")
    try:
        db.execute("CREATE TABLE a (id BIGINT PRIMARY KEY, k BIGINT)")
        before = db.offset
        with pytest.raises(ivm.UnsupportedError, match="apply_batch on a durable database is not supported"):
            db.apply_batch({"a": pa.table({"id": [1], "k": [1]})})
        assert db.offset == before and db.sql("SELECT count(*) AS n FROM a").to_pylist() == [{"n": 0}]
    finally:
        db.close()
