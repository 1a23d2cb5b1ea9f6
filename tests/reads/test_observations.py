"""The latencies and counts the engine records where they happen (ivm/reads/observations.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa

import ivm

ROOT = Path(__file__).resolve().parents[2]


def counts(db: ivm.Database, name: str) -> int:
    return db.observations()["histograms"][name].count


def setup(db: ivm.Database) -> None:
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, v DOUBLE)")
    db.execute("CREATE MATERIALIZED VIEW s AS SELECT g, SUM(v) AS total, COUNT(*) AS n FROM t GROUP BY g")


def batch(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "g": [i % 3 for i in ids], "v": [float(i) for i in ids]})


def test_in_memory_batches_are_timed_and_counted_per_table():
    with ivm.connect() as db:
        setup(db)
        db.apply_changes("t", batch(0, 10))
        db.execute("INSERT INTO t VALUES (100, 1, 1.0), (101, 2, 2.0)")
        db.apply_batch({"t": batch(200, 5)})
        seen = db.observations()
        assert seen["ingested"] == {"t": (3, 17)}
        batches = seen["histograms"]["batch_seconds"]
        assert batches.count == 3 and batches.total > 0 and batches.cumulative[-1] <= 3
        # in memory a batch is maintained before its acknowledgement: no folds, nothing to wait for
        assert counts(db, "fold_seconds") == counts(db, "visible_seconds") == 0


def test_a_failed_batch_is_not_counted():
    with ivm.connect() as db:
        setup(db)
        db.apply_changes("t", batch(0, 3))
        try:
            db.apply_changes("t", batch(0, 3).append_column("__op", pa.array(["c"] * 3)))  # keys exist
        except ivm.IvmError:
            pass
        else:
            raise AssertionError("inserting existing keys with 'c' must fail")
        assert db.observations()["ingested"] == {"t": (1, 3)}
        assert counts(db, "batch_seconds") == 1


def test_durable_folds_and_visibility_are_timed(tmp_path):
    with ivm.connect(tmp_path / "db", fold_delay=0.0) as db:
        setup(db)
        checkpoints = counts(db, "checkpoint_seconds")
        assert checkpoints >= 2  # CREATE TABLE and CREATE VIEW each checkpoint
        for i in range(4):
            db.apply_changes("t", batch(10 * i, 10))
            db.sql("SELECT * FROM s")  # waits for the fold that shows the batch
        assert counts(db, "batch_seconds") == 4
        assert counts(db, "fold_seconds") >= 1
        assert 1 <= counts(db, "visible_seconds") <= 4  # once per queued unit a fold took
        assert db.observations()["ingested"] == {"t": (4, 40)}
        db.checkpoint()
        assert counts(db, "checkpoint_seconds") == checkpoints + 1


def test_replayed_batches_are_not_counted_as_late(tmp_path):
    """Batches replayed from the log at open were acknowledged by an earlier process: their age
    says when they were logged, not how late a fold made them visible."""
    path = tmp_path / "db"
    with ivm.connect(path) as db:
        setup(db)
    child = textwrap.dedent("""
        import os, sys, pyarrow as pa, ivm
        db = ivm.connect(sys.argv[1], checkpoint_seconds=3600)
        db.apply_changes("t", pa.table({"id": [1, 2], "g": [1, 1], "v": [1.0, 2.0]}))
        os._exit(0)  # no close, no checkpoint: only the log has the batch
    """)
    done = subprocess.run([sys.executable, "-c", child, str(path)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with ivm.connect(path) as db:
        assert db.status()["recovered_records"] == 1
        assert db.sql("SELECT total, n FROM s").to_pylist() == [{"total": 3.0, "n": 2}]
        assert counts(db, "fold_seconds") >= 1  # the replay was folded ...
        assert counts(db, "visible_seconds") == 0  # ... but is no late batch
        assert db.observations()["ingested"] == {}  # and no batch this process acknowledged


def test_two_databases_keep_their_own():
    with ivm.connect() as one, ivm.connect() as two:
        setup(one)
        setup(two)
        one.apply_changes("t", batch(0, 5))
        assert counts(one, "batch_seconds") == 1 and counts(two, "batch_seconds") == 0
        assert two.observations()["ingested"] == {}
