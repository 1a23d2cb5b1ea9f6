"""Group commit in memory (ivm/ingest/group_commit.py): batches that queue for the write lock are
maintained together, each keeping its own offset and outcome, acknowledged once readable."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

import ivm
from ivm.ingest.ingest_group import Ticket


def make(**options):
    db = ivm.connect(maintenance="incremental", **options)
    db.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, code VARCHAR)")
    db.execute("CREATE TABLE events (kind VARCHAR, val BIGINT)")
    db.execute("CREATE MATERIALIZED VIEW totals AS SELECT cust, SUM(amount) AS total, COUNT(*) AS n "
               "FROM orders GROUP BY cust")
    db.execute("CREATE MATERIALIZED VIEW big AS SELECT id, amount FROM orders WHERE amount > 9")
    db.execute("CREATE MATERIALIZED VIEW kinds AS SELECT kind, SUM(val) AS val FROM events GROUP BY kind")
    return db


def orders(ids, cust=7, amount=9.5, op=None, code="1"):
    data = {"id": list(ids), "cust": [cust] * len(ids), "amount": [amount] * len(ids), "code": [code] * len(ids)}
    if op:
        data["__op"] = [op] * len(ids)
    return pa.table(data)


def rows(db, sql):
    return sorted(db.sql(sql).to_pylist(), key=repr)


def recomputed(db, view, select):
    """The view read, and its SELECT evaluated by DuckDB over the current tables."""
    tables = {name: db.sql(f"SELECT * FROM {name}") for name in ("orders", "events")}
    import duckdb

    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    expected = sorted(con.sql(select).to_arrow_table().to_pylist(), key=repr)
    return rows(db, f"SELECT * FROM {view}"), expected


def counting_maintenance(db, monkeypatch, delay=0.0):
    engine = db._engine
    calls = []
    original = engine._maintain

    def maintain(deltas, *args, **kwargs):
        calls.append(sorted(deltas))
        time.sleep(delay)  # producers arrive meanwhile
        return original(deltas, *args, **kwargs)

    monkeypatch.setattr(engine, "_maintain", maintain)
    return calls


def test_queued_batches_are_maintained_once_and_keep_their_own_outcomes(monkeypatch):
    db = make()
    db.execute("INSERT INTO orders VALUES (9, 1, 50.0, '1')")
    calls = counting_maintenance(db, monkeypatch)
    tickets = [
        Ticket("orders", orders([1, 2], op="c"), None, None, None),
        Ticket("orders", orders([1], amount=20.0, op="u"), None, None, None),
        Ticket("orders", orders([2], op="c"), None, None, None),  # 2 exists by now: fails alone
        Ticket("events", pa.table({"kind": ["k"], "val": [1]}), None, "src", 7),
        Ticket("orders", orders([2, 9], op="d"), None, None, None),
        Ticket("orders", orders([3], op="c"), None, "src", 7),  # same (source, seq): next unit, deduplicated
    ]
    for ticket in tickets:
        db._engine.pending.add(ticket)
    last = db.apply_changes("orders", orders([5], op="c"))  # commits everything pending first
    assert [t.offset for t in tickets] == [2, 3, 0, 4, 5, 4]
    assert "duplicate key" in str(tickets[2].error) and all(t.error is None for t in tickets if t is not tickets[2])
    assert last == 6 == db.offset
    # Two units (the repeated source ends the first), each maintained once for all its tables.
    assert calls == [["events", "orders"], ["orders"]]
    assert rows(db, "SELECT id, amount FROM orders") == [{"id": 1, "amount": 20.0}, {"id": 5, "amount": 9.5}]
    assert rows(db, "SELECT * FROM big") == [{"id": 1, "amount": 20.0}, {"id": 5, "amount": 9.5}]
    assert rows(db, "SELECT * FROM totals") == [{"cust": 7, "total": 29.5, "n": 2}]
    assert rows(db, "SELECT * FROM kinds") == [{"kind": "k", "val": 1}]
    assert int(db.sql("SELECT * FROM totals").schema.metadata[b"ivm.offset"]) == 6
    db.close()


def integrated(changes, base=()):
    """The view's rows: ``base`` plus the weighted change rows."""
    net: dict = {}
    for row in [dict(r, __weight=1) for r in base] + changes.rows.to_pylist():
        key = (row["cust"], row["total"], row["n"])
        net[key] = net.get(key, 0) + row["__weight"]
    return sorted(k for k, w in net.items() for _ in range(w))


def test_a_subscriber_gets_a_units_changes_once():
    db = make()
    db.execute("INSERT INTO orders VALUES (9, 1, 50.0, '1')")  # offset 1
    at_1 = rows(db, "SELECT * FROM totals")
    for i, amount in enumerate([10.0, 11.0, 12.0]):
        db._engine.pending.add(Ticket("orders", orders([i], cust=i, amount=amount), None, None, None))
    assert db.apply_changes("orders", orders([9], cust=1, amount=1.0, op="u")) == 5  # offsets 2..5, one unit
    now = sorted((r["cust"], r["total"], r["n"]) for r in rows(db, "SELECT * FROM totals"))
    assert now == [(0, 10.0, 1), (1, 12.0, 2), (2, 12.0, 1)]
    assert integrated(db.changes("totals", 0)) == now
    assert integrated(db.changes("totals", 1), at_1) == now
    assert db.changes("totals", 5).rows.num_rows == 0
    # No read ever reports an offset inside the unit; resuming from one is refused by name.
    with pytest.raises(ivm.OffsetError, match="inside changes of totals folded together"):
        db.changes("totals", 3)
    db.close()


def test_a_view_failing_on_one_batch_of_a_unit_fails_that_batch_alone(monkeypatch):
    db = make()
    db.execute("CREATE MATERIALIZED VIEW codes AS SELECT id, CAST(code AS INTEGER) AS c FROM orders")
    calls = counting_maintenance(db, monkeypatch)
    tickets = [Ticket("orders", orders([1]), None, None, None),
               Ticket("orders", orders([2], code="not a number"), None, None, None),
               Ticket("orders", orders([3]), None, None, None)]
    for ticket in tickets:
        db._engine.pending.add(ticket)
    assert db.apply_changes("orders", orders([4])) == 3
    assert [t.offset for t in tickets] == [1, 0, 2]
    assert isinstance(tickets[1].error, ivm.IvmError) and "not a number" in str(tickets[1].error)
    # The unit was tried together, then batch by batch: nothing of the failed try was published.
    assert calls[0] == ["orders"] and len(calls) == 1 + 4
    assert rows(db, "SELECT id FROM orders") == [{"id": 1}, {"id": 3}, {"id": 4}]
    assert rows(db, "SELECT * FROM codes") == [{"id": 1, "c": 1}, {"id": 3, "c": 1}, {"id": 4, "c": 1}]
    view, expected = recomputed(db, "totals", "SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust")
    assert view == expected
    assert db.changes("codes", 0).rows.column("id").to_pylist() == [1, 3, 4]  # no change recorded twice
    db.close()


@pytest.mark.parametrize("nice", [0, 10], ids=["callers_commit", "committer_thread"])
def test_concurrent_producers_read_their_writes_and_share_maintenance(monkeypatch, nice):
    db = make(ingest_nice=nice)
    calls = counting_maintenance(db, monkeypatch, delay=0.02)
    offsets: list[int] = []
    unseen: list[int] = []

    def produce(first: int) -> None:
        for i in range(5):
            offset = db.apply_changes("orders", orders([first + i], cust=first, amount=10.0))
            offsets.append(offset)
            read = db.sql(f"SELECT id FROM big WHERE id = {first + i}")
            if read.num_rows != 1 or int(read.schema.metadata[b"ivm.offset"]) < offset:
                unseen.append(first + i)

    threads = [threading.Thread(target=produce, args=(100 * t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(offsets) == list(range(1, 31)) and unseen == []
    assert len(calls) < 30  # batches queued behind a commit were maintained together
    view, expected = recomputed(db, "totals", "SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust")
    assert view == expected and len(view) == 6
    db.close()


def test_create_table_as_inside_the_write_lock_still_commits():
    db = make()
    db.execute("INSERT INTO orders VALUES (1, 7, 10.0, '1'), (2, 8, 11.0, '2')")
    assert db.execute("CREATE TABLE copy (id BIGINT PRIMARY KEY, amount DOUBLE) AS SELECT id, amount FROM orders") == 2
    assert rows(db, "SELECT * FROM copy") == [{"id": 1, "amount": 10.0}, {"id": 2, "amount": 11.0}]
    assert db.offset == 2
    db.close()


@pytest.mark.parametrize("bad", ["unknown", "bad_type"])
def test_a_bad_batch_among_queued_ones_changes_nothing(bad):
    db = make()
    before = rows(db, "SELECT * FROM orders")
    table = "nope" if bad == "unknown" else "orders"
    data = orders([1]) if bad == "unknown" else pa.table({"id": ["x"], "cust": [1], "amount": [1.0], "code": ["1"]})
    ticket = Ticket(table, data, None, None, None)
    db._engine.pending.add(ticket)
    assert db.apply_changes("orders", orders([2])) == 1
    assert ticket.done and ticket.offset == 0 and isinstance(ticket.error, ivm.IvmError)
    assert rows(db, "SELECT id FROM orders") == [{"id": 2}] and before == []
    db.close()


def test_a_committer_thread_applies_batches_at_lower_priority(monkeypatch):
    import os

    db = make(ingest_nice=10)
    committer = db._engine.committer
    assert committer is not None and committer.thread.is_alive()
    threads = []
    original = db._engine._maintain

    def maintain(*args, **kwargs):
        threads.append(threading.get_native_id())
        return original(*args, **kwargs)

    monkeypatch.setattr(db._engine, "_maintain", maintain)
    assert db.apply_changes("orders", orders([1, 2])) == 1
    assert threads == [committer.thread.native_id] != [threading.get_native_id()]
    assert os.getpriority(os.PRIO_PROCESS, committer.thread.native_id) == 10
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # the caller's is untouched
    # Errors reach the caller and change nothing; read your writes holds.
    with pytest.raises(ivm.ChangeError, match="duplicate key"):
        db.apply_changes("orders", orders([2, 3], op="c"))
    assert rows(db, "SELECT id FROM orders") == [{"id": 1}, {"id": 2}]
    assert db.execute("CREATE TABLE copy (id BIGINT PRIMARY KEY) AS SELECT id FROM orders") == 2  # holds the lock
    assert rows(db, "SELECT * FROM copy") == [{"id": 1}, {"id": 2}]
    db.close()
    assert not committer.thread.is_alive()


@pytest.mark.parametrize("nice", [-1, 20, "5"])
def test_ingest_nice_out_of_range_is_refused(nice):
    with pytest.raises(ValueError, match="ingest_nice must be an integer from 0 to 19"):
        ivm.connect(ingest_nice=nice)


def test_producers_commit_themselves_when_the_committer_does_not_take_their_batches(monkeypatch):
    """A committer starved of CPU (here: stopped) must not stall ingest: producers take over."""
    from ivm.ingest import group_commit

    db = make(ingest_nice=10)
    committer = db._engine.committer
    monkeypatch.setattr(group_commit, "TAKE_OVER_AFTER", 0.01)
    committer.stop()
    committer.stopping = False  # the thread is gone, but producers go on
    on_committer = []
    original = db._engine._maintain

    def maintain(*args, **kwargs):
        on_committer.append(threading.get_native_id() == committer.thread.native_id)
        return original(*args, **kwargs)

    monkeypatch.setattr(db._engine, "_maintain", maintain)
    offsets = []
    threads = [threading.Thread(target=lambda i=i: offsets.append(db.apply_changes("orders", orders([i]))))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(offsets) == [1, 2, 3, 4] and on_committer and not any(on_committer)
    assert rows(db, "SELECT * FROM totals") == [{"cust": 7, "total": 38.0, "n": 4}]
    committer.stopping = True
    db.close()


def test_serve_refuses_a_niceness_out_of_range():
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", "ivm", "serve", "--port", "0", "--ingest-nice", "25"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--ingest-nice: an OS niceness from 0 to 19, not '25'" in done.stderr
