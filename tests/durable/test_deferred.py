"""Deferred conversion (ivm/durable/deferred.py): upsert-only batches are acknowledged unconverted and
converted at the fold; every other batch is still checked (and rejected) at apply_changes time."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

import ivm
from tests.durable.test_durable import run_child

SCHEMA = [
    "CREATE TABLE t (k BIGINT PRIMARY KEY, g VARCHAR, v DOUBLE)",
    "CREATE TABLE s (name VARCHAR PRIMARY KEY, g VARCHAR)",
    "CREATE MATERIALIZED VIEW by_g AS SELECT g, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY g",
    "CREATE MATERIALIZED VIEW joined AS SELECT t.k, s.name FROM t JOIN s ON t.g = s.g",
]


def make(path=None, **options):
    db = ivm.connect(path, **options)
    for statement in SCHEMA:
        db.execute(statement)
    return db


def batch(keys, op, g="a", v=1.0):
    return pa.table({"k": list(keys), "g": [g] * len(keys), "v": [float(v)] * len(keys), "__op": [op] * len(keys)})


def rows(db, sql):
    return sorted(db.sql(sql).to_pylist(), key=repr)


def unconverted(db, table="t") -> int:
    """Rows of ``table`` queued and not converted yet (the path under test is taken)."""
    with db._engine.maintainer.cond:
        return sum(b.num_rows for e in db._engine.maintainer.queue for b, _ in e.batches.get(table, []))


def test_upserts_are_acknowledged_unconverted_and_folded_in_one_conversion(tmp_path):
    db = make(tmp_path, fold_delay=60.0)  # nothing folds until a read asks
    folds = db._engine.maintainer.folds
    db.apply_changes("t", batch([1, 2, 3], "u"))
    db.apply_changes("t", batch([2], "r", g="b", v=5))
    db.apply_changes("t", batch([3, 4], "d"), on_missing_delete="ignore")  # 4 is missing: ignored
    assert unconverted(db) == 6
    assert db._engine.head("t").num_rows == 0  # the producers did not convert them
    assert {r["name"]: r["buffer_rows"] for r in db.status()["relations"]}["t"] == 6  # status counts them
    assert rows(db, "SELECT k, g, v FROM t") == [{"k": 1, "g": "a", "v": 1.0}, {"k": 2, "g": "b", "v": 5.0}]
    assert rows(db, "SELECT * FROM by_g") == [{"g": "a", "n": 1, "total": 1.0}, {"g": "b", "n": 1, "total": 5.0}]
    assert db._engine.maintainer.folds == folds + 1 and unconverted(db) == 0
    db.close()


def test_a_checked_batch_after_unconverted_upserts_sees_them_and_fails_alone(tmp_path):
    db = make(tmp_path, fold_delay=60.0)
    db.apply_changes("s", pa.table({"name": ["x"], "g": ["a"]}))
    db.apply_changes("t", batch([1, 2, 3], "u"))
    offset = db._engine.offset  # (db.offset would wait for the fold)
    assert unconverted(db) == 3
    with pytest.raises(ivm.ChangeError, match=r"duplicate key: insert \('c'\) into t of existing \(k\) = \(2\)"):
        db.apply_changes("t", batch([9, 2], "c"))
    with pytest.raises(ivm.ChangeError, match=r"delete \('d'\) from t of missing \(k\) = \(7\)"):
        db.apply_changes("t", batch([7], "d"))
    assert db._engine.offset == offset
    assert unconverted(db) == 0  # converted (not folded) so the inserts could be checked against them
    db.apply_changes("t", batch([3], "d"))  # strict: 3 exists, from an upsert
    db.apply_changes("t", batch([9], "c", v=4))
    db.apply_changes("t", batch([1], "u", v=2))  # deferred again, after the checked batches
    assert unconverted(db) == 1
    assert rows(db, "SELECT k, v FROM t") == [{"k": 1, "v": 2.0}, {"k": 2, "v": 1.0}, {"k": 9, "v": 4.0}]
    assert rows(db, "SELECT * FROM by_g") == [{"g": "a", "n": 3, "total": 7.0}]
    assert rows(db, "SELECT * FROM joined") == [{"k": k, "name": "x"} for k in (1, 2, 9)]
    db.close()


def test_unconverted_batches_come_back_after_a_crash(tmp_path):
    result = run_child("""
        db = ivm.connect(path, fold_delay=60.0)
        db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, g VARCHAR, v DOUBLE)")
        db.execute("CREATE MATERIALIZED VIEW by_g AS SELECT g, COUNT(*) AS n, SUM(v) AS total FROM t GROUP BY g")
        for i in range(4):
            db.apply_changes("t", pa.table({"k": [i, i + 1], "g": ["a", "b"], "v": [1.0, 2.0], "__op": ["u", "u"]}))
        queued = sum(b.num_rows for e in db._engine.maintainer.queue for b, _ in e.batches.get("t", []))
        print(queued, flush=True)
        os._exit(0)  # acknowledged, never folded, never checkpointed
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[0]) > 0
    db = ivm.connect(tmp_path)
    assert db.status()["recovered_records"] == 4
    assert rows(db, "SELECT k, g FROM t") == [{"k": k, "g": "a" if k < 4 else "b"} for k in range(5)]
    assert rows(db, "SELECT * FROM by_g") == [{"g": "a", "n": 4, "total": 4.0}, {"g": "b", "n": 1, "total": 2.0}]
    db.close()


OPS = [("u", None), ("r", None), ("d", "ignore"), ("c", None), ("d", None), ("mixed", None)]


@pytest.mark.parametrize("seed", range(6))
def test_deferred_and_checked_batches_equal_the_in_memory_database(tmp_path, seed):
    """Random upsert, insert and delete batches (some rejected) on a durable database folding
    at random moments give the same tables, views and errors as an in-memory database.
    Seeds 4 and 5 also convert upserts ahead of the fold (ivm/durable/ahead.py) from 1 or 10 rows."""
    rng = random.Random(seed)
    ahead = {4: 1, 5: 10}.get(seed, 10**9)
    durable = make(tmp_path, fold_delay=60.0 if seed not in (3, 5) else 0.0,  # 60: folds only when a read asks
                   convert_ahead_rows=ahead)
    memory = make()
    for db in (durable, memory):
        db.apply_changes("s", pa.table({"name": ["x", "y", "z"], "g": ["a", "b", "b"]}))
    for step in range(40):
        op, policy = rng.choice(OPS)
        keys = rng.sample(range(30), rng.choice([1, 3, 8]))
        if op == "mixed":
            data = pa.table({"k": keys, "g": [rng.choice("abc") for _ in keys],
                             "v": [float(rng.randrange(9)) for _ in keys],
                             "__op": [rng.choice("ur") for _ in keys]})
        else:
            data = batch(keys, op, g=rng.choice("abc"), v=rng.randrange(9))
        outcomes = []
        for db in (durable, memory):
            try:
                db.apply_changes("t", data, on_missing_delete=policy)
                outcomes.append(None)
            except ivm.ChangeError as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1], f"step {step}"
        if rng.random() < 0.15:
            for sql in ("SELECT * FROM t", "SELECT * FROM by_g", "SELECT * FROM joined"):
                assert rows(durable, sql) == rows(memory, sql), f"{sql} at step {step}"
    for sql in ("SELECT * FROM t", "SELECT * FROM by_g", "SELECT * FROM joined"):
        assert rows(durable, sql) == rows(memory, sql)
    durable.close()
    memory.close()


def test_upserts_are_converted_ahead_of_the_fold_into_one_entry(tmp_path):
    """From ``convert_ahead_rows`` queued upsert rows a second thread converts them (ivm/durable/ahead.py):
    the queued entries become one, at the last offset, and the fold publishes them all."""
    db = make(tmp_path, fold_delay=60.0, convert_ahead_rows=5)
    maintainer = db._engine.maintainer
    folds = maintainer.folds
    db.apply_changes("t", batch([1, 2], "u"))  # below the threshold: left for the fold
    assert unconverted(db) == 2
    db.apply_changes("t", batch([2, 3], "u", g="b", v=3))
    assert unconverted(db) == 4
    db.apply_changes("t", batch([1], "d"), on_missing_delete="ignore")
    deadline = time.monotonic() + 10
    while unconverted(db) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert unconverted(db) == 0 and maintainer.ahead.conversions == 1
    with maintainer.cond:
        assert [e.offset for e in maintainer.queue] == [db._engine.offset]  # one entry, at the last offset
    assert db._engine.head("t").num_rows == 2  # the head moved: 2 (b, 3.0) and 3 (b, 3.0)
    assert maintainer.folds == folds  # nothing published yet
    assert rows(db, "SELECT k, g, v FROM t") == [{"k": 2, "g": "b", "v": 3.0}, {"k": 3, "g": "b", "v": 3.0}]
    assert rows(db, "SELECT * FROM by_g") == [{"g": "b", "n": 2, "total": 6.0}]
    assert maintainer.folds == folds + 1
    db.close()


def test_an_upsert_producer_never_waits_for_a_conversion(tmp_path):
    """Upserts take no convert lock, so a conversion running ahead of the fold (which holds it)
    does not hold up their acknowledgement; a checked batch waits for it."""
    db = make(tmp_path, fold_delay=60.0)
    done = []
    with db._engine.convert_lock:  # as a long conversion would
        upsert = threading.Thread(target=lambda: done.append(db.apply_changes("t", batch([1], "u"))))
        upsert.start()
        upsert.join(10)
        assert done, "an upsert waited for the convert lock"
        checked = threading.Thread(target=lambda: done.append(db.apply_changes("t", batch([5], "c"))))
        checked.start()
        checked.join(0.3)
        assert len(done) == 1, "a checked batch must wait for the heads"
    checked.join(10)
    assert len(done) == 2
    assert rows(db, "SELECT k FROM t") == [{"k": 1}, {"k": 5}]
    db.close()


def test_a_failed_conversion_ahead_stops_maintenance_and_reads_say_so(tmp_path, monkeypatch):
    """A conversion cannot fail on validated upserts; if one did (a bug), no fold may publish
    over the moved heads: maintenance stops and reads raise the error instead of waiting."""
    from ivm.durable import ahead

    def broken(*args, **kwargs):
        raise RuntimeError("conversion bug")

    db = make(tmp_path, fold_delay=60.0, convert_ahead_rows=1)
    folds = db._engine.maintainer.folds
    monkeypatch.setattr(ahead.deferred, "convert", broken)
    db.apply_changes("t", batch([1], "u"))
    with pytest.raises(ivm.InternalError, match="view maintenance stopped: conversion bug"):
        db.sql("SELECT * FROM by_g")
    assert db._engine.maintainer.folds == folds
    monkeypatch.undo()
    db._engine.maintainer.stop()


def test_a_fold_while_a_conversion_holds_the_heads_folds_the_converted_entries_only(tmp_path):
    """While another thread holds the convert lock (converting ahead, or a producer converting a
    batch now), a fold takes the converted entries at the head of the queue without waiting and
    leaves the unconverted ones; a read then folds the rest."""
    db = make(tmp_path, fold_delay=60.0)
    maintainer = db._engine.maintainer
    db.apply_changes("t", batch([1, 2], "c"))  # checked: converted at once
    checked = db._engine.offset
    db.apply_changes("t", batch([2, 3], "u", g="b"))  # queued unconverted
    held, release = threading.Event(), threading.Event()

    def hold():
        with db._engine.convert_lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        maintainer.fold(everything=False)  # must not wait for the lock
        assert db._engine.store.snapshot.offset == checked
        assert unconverted(db) == 2
        assert sorted(r["k"] for r in db._engine.store.snapshot["t"].table().to_pylist()) == [1, 2]
    finally:
        release.set()
        holder.join(10)
    assert rows(db, "SELECT * FROM by_g") == [{"g": "a", "n": 1, "total": 1.0}, {"g": "b", "n": 2, "total": 2.0}]
    db.close()


def test_summing_keyed_deltas_by_key_first_equals_grouping_every_row():
    """ingest_group.zset_sum with a key: only rows whose key is in two deltas or more are
    grouped in DuckDB. Over random consolidated deltas of a keyed table (per key at most
    one -old and one +new, distinct), the result equals the GROUP BY over every row, and
    deltas sharing no key are concatenated without a query."""
    from ivm.ingest import ingest_group

    db = ivm.connect()
    worker = db._engine.worker(10)
    rng = random.Random(7)

    def delta(keys):
        out = []
        for k in keys:
            old, new = rng.randint(0, 3), rng.randint(0, 3)
            if rng.random() < 0.5:
                out.append((k, old, -1))
            if rng.random() < 0.7 and not (out and out[-1][0] == k and old == new):
                out.append((k, new, 1))
        return pa.table({"k": pa.array([r[0] for r in out], pa.int64()),
                         "g": pa.array([f"g{r[1]}" for r in out], pa.string()),
                         "__weight": pa.array([r[2] for r in out], pa.int64())})

    def multiset(table):
        return sorted(tuple(r.values()) for r in table.to_pylist())

    shared = 0
    for _ in range(200):
        parts = [delta(rng.sample(range(30), rng.randint(0, 12))) for _ in range(rng.randint(2, 4))]
        by_key = ingest_group.zset_sum(parts, worker, "k")
        assert multiset(by_key) == multiset(ingest_group.zset_sum(parts, worker, None))
        shared += by_key.num_rows < sum(p.num_rows for p in parts)
    assert shared > 50  # many trials had keys in several deltas that cancelled or merged
    runs = []
    worker.runner.run = lambda *a, **k: runs.append(a)  # no DuckDB query when no key is shared
    apart = ingest_group.zset_sum([delta(range(0, 10)), delta(range(10, 20))], worker, "k")
    assert not runs and apart.num_rows > 0
    db.close()
