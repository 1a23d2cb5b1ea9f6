"""Durable databases (issue 4): log, recovery, idempotent producers, failed views, status, compaction.

Crashes are real: a child process is killed (os._exit without closing, or
SIGKILL in tests/crash) and the directory is reopened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import ivm
from storage.log import ChangeLog, Record

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, note VARCHAR)",
    "CREATE TABLE events (kind VARCHAR, val INTEGER)",
    "CREATE MATERIALIZED VIEW totals AS SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust",
    "CREATE MATERIALIZED VIEW big AS SELECT id, amount FROM orders WHERE amount > 5",
    "CREATE MATERIALIZED VIEW kinds AS SELECT kind, val FROM events",
]


def orders(ids, cust=7, amount=9.5, op=None):
    data = {"id": list(ids), "cust": [cust] * len(ids), "amount": [amount] * len(ids), "note": ["x"] * len(ids)}
    if op:
        data["__op"] = [op] * len(ids)
    return pa.table(data)


def rows(db, sql):
    return sorted(db.sql(sql).to_pylist(), key=repr)


def make(path, **options):
    db = ivm.connect(path, **options)
    for statement in SCHEMA:
        db.execute(statement)
    return db


def close_without_checkpoint(db) -> None:
    """Close like a crash would leave it: batches only in the log."""
    engine = db._engine
    engine.checkpointer.stop()
    engine.checkpointer.checkpoint = lambda force=False: False
    db.close()


def run_child(code: str, path: Path) -> subprocess.CompletedProcess:
    """Run Python in a child process (PYTHONPATH = this checkout) and return its result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = "import ivm, pyarrow as pa, os, sys\npath = sys.argv[1]\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_reopen_keeps_tables_views_and_offsets(tmp_path):
    db = make(tmp_path)
    assert db.apply_changes("orders", orders(range(1, 4))) == 1
    db.execute("UPDATE orders SET amount = 1.0 WHERE id = 2")
    db.execute("INSERT INTO events VALUES ('a', 1), ('a', 1)")
    before = {name: rows(db, f"SELECT * FROM {name}") for name in ("orders", "events", "totals", "big", "kinds")}
    db.close()
    db = ivm.connect(tmp_path)
    assert {name: rows(db, f"SELECT * FROM {name}") for name in before} == before
    assert db.offset == 3
    assert db.apply_changes("orders", orders([9])) == 4  # offsets go on
    assert rows(db, "SELECT * FROM big WHERE id = 9") == [{"id": 9, "amount": 9.5}]
    db.close()


def test_acknowledged_batches_survive_a_crash_without_close(tmp_path):
    make(tmp_path, checkpoint_seconds=3600).close()
    result = run_child("""
        db = ivm.connect(path, checkpoint_seconds=3600)
        for i in range(5):
            print(db.apply_changes("orders", pa.table({"id": [i], "cust": [i % 2], "amount": [float(i)], "note": ["n"]})))
        sys.stdout.flush()
        os._exit(0)  # no close, no checkpoint: only the log has the batches
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "2", "3", "4", "5"]
    db = ivm.connect(tmp_path)
    assert db.status()["recovered_records"] == 5
    assert rows(db, "SELECT id FROM orders") == [{"id": i} for i in range(5)]
    assert rows(db, "SELECT * FROM totals") == [{"cust": 0, "total": 6.0, "n": 3}, {"cust": 1, "total": 4.0, "n": 2}]
    db.close()


def test_a_repeated_source_seq_applies_once_even_after_reopen(tmp_path):
    db = make(tmp_path)
    first = db.apply_changes("orders", orders([1, 2]), source="orders-cdc", seq=41)
    assert db.apply_changes("orders", orders([1, 2]), source="orders-cdc", seq=41) == first
    second = db.apply_changes("orders", orders([3]), source="orders-cdc", seq=42)
    assert second == first + 1
    with pytest.raises(ivm.ChangeError, match="seq 7 of source 'orders-cdc' is below the last applied seq 42"):
        db.apply_changes("orders", orders([4]), source="orders-cdc", seq=7)
    with pytest.raises(ivm.ChangeError, match="seq must be a non-negative integer"):
        db.apply_changes("orders", orders([4]), source="orders-cdc", seq=-1)
    assert db.sql("SELECT COUNT(*) AS n FROM orders").to_pylist() == [{"n": 3}]
    db.close()
    db = ivm.connect(tmp_path)
    assert db.apply_changes("orders", orders([1, 2]), source="orders-cdc", seq=41) == first
    assert db.apply_changes("orders", orders([3]), source="orders-cdc", seq=42) == second
    assert db.sql("SELECT COUNT(*) AS n FROM orders").to_pylist() == [{"n": 3}]
    assert db.status()["producers"] == {"orders-cdc": {"seq": 42, "offset": second}}
    db.close()


def test_a_source_seq_replayed_after_a_crash_applies_once(tmp_path):
    """The producer sent seq 41 and 42 and the process died (no close, no
    checkpoint): recovery rebuilds the producers' table from the log, so
    re-sending both returns their original offsets and changes nothing."""
    make(tmp_path, checkpoint_seconds=3600).close()
    result = run_child("""
        db = ivm.connect(path, checkpoint_seconds=3600)
        for seq, ids in ((41, [1, 2]), (42, [3])):
            batch = pa.table({"id": ids, "cust": [7] * len(ids), "amount": [9.5] * len(ids), "note": ["x"] * len(ids)})
            print(db.apply_changes("orders", batch, source="orders-cdc", seq=seq))
        sys.stdout.flush()
        os._exit(0)
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    first, second = map(int, result.stdout.split())
    db = ivm.connect(tmp_path)
    try:
        assert db.status()["recovered_records"] == 2
        assert db.apply_changes("orders", orders([1, 2]), source="orders-cdc", seq=41) == first
        assert db.apply_changes("orders", orders([3]), source="orders-cdc", seq=42) == second
        assert db.offset == second
        assert rows(db, "SELECT * FROM totals") == [{"cust": 7, "total": 28.5, "n": 3}]
        assert db.apply_changes("orders", orders([4]), source="orders-cdc", seq=43) == second + 1
    finally:
        db.close()


def test_rejected_batches_get_no_offset_and_change_nothing(tmp_path):
    db = make(tmp_path)
    db.apply_changes("orders", orders([1]))
    with pytest.raises(ivm.ChangeError, match="duplicate key"):
        db.apply_changes("orders", orders([1, 2]), source="s", seq=1)
    with pytest.raises(ivm.ChangeError, match="missing"):
        db.apply_changes("orders", orders([5], op="d"))
    # the rejected (source, seq) was never applied, so a corrected retry goes through
    assert db.apply_changes("orders", orders([2]), source="s", seq=1) == 2
    db.close()
    db = ivm.connect(tmp_path)
    assert rows(db, "SELECT id FROM orders") == [{"id": 1}, {"id": 2}]
    assert db.offset == 2
    db.close()


def test_a_torn_log_tail_is_truncated_and_reported(tmp_path):
    db = make(tmp_path, checkpoint_seconds=3600)
    db.apply_changes("orders", orders([1]))
    db.apply_changes("orders", orders([2]))
    segment = db._engine.log.segments()[-1][1]
    close_without_checkpoint(db)  # then half a record at the tail, as a crash mid-write leaves it
    torn = Record(3, "orders", orders([3]), source=None).encode()
    with open(segment, "ab") as f:
        f.write(torn[: len(torn) - 7])
    db = ivm.connect(tmp_path)
    status = db.status()
    assert len(status["log_truncations"]) == 1 and "torn or corrupt record" in status["log_truncations"][0]
    assert rows(db, "SELECT id FROM orders") == [{"id": 1}, {"id": 2}]
    assert db.apply_changes("orders", orders([3])) == 3
    db.close()


def test_damage_before_the_last_segment_refuses_to_open(tmp_path):
    log = ChangeLog(tmp_path / "log", segment_bytes=1)  # one record per segment
    log.open(after=0)
    for offset in (1, 2, 3):
        log.append(Record(offset, "t", pa.table({"a": [offset]})))
    log.wait_durable(3)
    log.close()
    first = log.segments()[0][1]
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(ivm.IvmError, match="damaged at byte 0 and later segments exist"):
        ChangeLog(tmp_path / "log").open(after=0)


def test_a_view_failing_after_the_ack_is_marked_failed_and_keeps_the_data(tmp_path):
    db = make(tmp_path)
    db.execute("CREATE TABLE raw (id BIGINT PRIMARY KEY, s VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW parsed AS SELECT id, CAST(s AS INTEGER) AS i FROM raw")
    db.execute("CREATE MATERIALIZED VIEW parsed_sum AS SELECT SUM(i) AS total FROM parsed")
    db.execute("INSERT INTO raw VALUES (1, '5')")
    offset = db.apply_changes("raw", pa.table({"id": [2], "s": ["not a number"]}))  # acknowledged
    db.apply_changes("orders", orders([1]))
    assert rows(db, "SELECT id, s FROM raw") == [{"id": 1, "s": "5"}, {"id": 2, "s": "not a number"}]
    for view in ("parsed", "parsed_sum"):
        with pytest.raises(ivm.ExecutionError, match=f"materialized view {view} failed"):
            db.sql(f"SELECT * FROM {view}")
        with pytest.raises(ivm.ExecutionError, match=f"materialized view {view} failed"):
            db.changes(view, offset - 1)  # its change history stopped
    assert rows(db, "SELECT * FROM big") == [{"id": 1, "amount": 9.5}]  # other views go on
    status = {r["name"]: r["status"] for r in db.status()["relations"]}
    assert status["parsed"].startswith("failed: ExecutionError") and "not a number" in status["parsed"]
    assert "parsed, which failed" in status["parsed_sum"]
    assert db.offset >= offset
    db.close()
    db = ivm.connect(tmp_path)  # the failure is part of the stored state
    with pytest.raises(ivm.ExecutionError, match="materialized view parsed failed"):
        db.sql("SELECT * FROM parsed")
    db.execute("DROP MATERIALIZED VIEW parsed CASCADE")
    db.execute("DELETE FROM raw WHERE id = 2")
    db.execute("CREATE MATERIALIZED VIEW parsed AS SELECT id, CAST(s AS INTEGER) AS i FROM raw")
    assert rows(db, "SELECT * FROM parsed") == [{"id": 1, "i": 5}]
    db.close()


def test_a_view_created_late_sees_stored_and_logged_data(tmp_path):
    db = make(tmp_path, checkpoint_seconds=3600, checkpoint_rows=10**9)
    db.apply_changes("orders", orders(range(10), cust=3, amount=1.0))
    db.checkpoint()
    db.apply_changes("orders", orders(range(10, 15), cust=4, amount=2.0))  # only in the log
    db.execute("CREATE MATERIALIZED VIEW late AS SELECT cust, SUM(amount) AS s FROM orders GROUP BY cust")
    assert rows(db, "SELECT * FROM late") == [{"cust": 3, "s": 10.0}, {"cust": 4, "s": 10.0}]
    db.close()


def test_status_checkpoint_and_compaction(tmp_path):
    db = make(tmp_path, log_retention_seconds=None, checkpoint_seconds=3600)
    for i in range(6):
        db.apply_changes("orders", orders([1, 2, 3], amount=float(i), op="u"))
    db.execute("DELETE FROM orders WHERE id = 3")
    table = db.sql("SHOW STATUS")
    assert table.column_names == ["name", "kind", "rows", "stored_offset", "published_offset", "log_head",
                                  "lag_changes", "lag_seconds", "stored_bytes", "buffer_rows", "status",
                                  "maintenance", "engine", "watermark", "memory_bytes"]
    memory = {r["name"]: r["memory_bytes"] for r in table.to_pylist()}
    assert memory["orders"] > 0 and memory["totals"] is None  # a view computed on read holds no rows
    head = db.offset
    assert db.sql("CHECKPOINT").to_pylist() == [{"offset": head}]
    result = db.sql("COMPACT").to_pylist()[0]
    assert result["log_records_before"] == 7 and result["log_records_after"] == 1
    status = db.status()
    assert all(r["stored_offset"] == head and r["lag_changes"] == 0 for r in status["relations"])
    db.close()
    db = ivm.connect(tmp_path)
    assert rows(db, "SELECT id, amount FROM orders") == [{"id": 1, "amount": 5.0}, {"id": 2, "amount": 5.0}]
    (record,) = [r for r in _all_records(tmp_path)]
    assert sorted(zip(record.batch.column("id").to_pylist(), record.batch.column("__op").to_pylist())) == [
        (1, "r"), (2, "r"), (3, "d")]
    db.close()


def _all_records(path: Path) -> list[Record]:
    from storage.log_format import scan as _scan

    out = []
    for _, segment in ChangeLog(path / "log").segments():
        for _, _, payload in _scan(segment.read_bytes()):
            record = Record.decode(payload)
            if record.kind == "change":
                out.append(record)
    return out


def test_in_memory_databases_have_status_but_no_storage():
    db = ivm.connect()
    db.execute(SCHEMA[0])
    db.apply_changes("orders", orders([1]), source="s", seq=1)
    assert db.apply_changes("orders", orders([1]), source="s", seq=1) == 1
    assert db.sql("SHOW STATUS").to_pylist()[0]["stored_offset"] is None
    with pytest.raises(ivm.UnsupportedError, match="COMPACT needs a durable database"):
        db.execute("COMPACT")
    with pytest.raises(ivm.UnsupportedError, match="COMPACT takes no arguments"):
        db.execute("COMPACT LOG")
    db.close()


def test_one_process_at_a_time_and_unknown_options(tmp_path):
    db = ivm.connect(tmp_path)
    with pytest.raises(ivm.IvmError, match="is open in another process"):
        ivm.connect(tmp_path)
    db.close()
    with pytest.raises(TypeError, match="unknown option"):
        ivm.connect(tmp_path, fold_rowz=3)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ivm.IvmError, match=r"cannot use .*a_file/db as a database directory: Not a directory"):
        ivm.connect(blocker / "db")
    assert blocker.read_text() == "not a directory"


def test_types_delta_lacks_are_stored_losslessly_or_refused(tmp_path):
    db = ivm.connect(tmp_path)
    db.execute("CREATE TABLE t (id UINTEGER PRIMARY KEY, big UBIGINT, at TIME, ts TIMESTAMPTZ, s TIMESTAMP_S)")
    db.execute("INSERT INTO t VALUES (4294967295, 18446744073709551615, '23:59:59.123456', "
               "'2024-01-02 03:04:05+00', '2024-01-02 03:04:05')")
    db.execute("CREATE MATERIALIZED VIEW v AS SELECT at, COUNT(*) AS n FROM t GROUP BY at")
    before = {name: db.sql(f"SELECT * FROM {name}") for name in ("t", "v")}
    with pytest.raises(ivm.UnsupportedError, match="materialized view w cannot be stored durably: column d has type "
                                                   "month_day_nano_interval"):
        db.execute("CREATE MATERIALIZED VIEW w AS SELECT s - TIMESTAMP '2024-01-01' AS d FROM t")
    with pytest.raises(ivm.UnknownObjectError):
        db.sql("SELECT * FROM w")  # nothing was created
    db.checkpoint()
    db.close()
    db = ivm.connect(tmp_path)
    for name, table in before.items():
        assert db.sql(f"SELECT * FROM {name}").equals(table), name
    db.close()


def test_concurrent_producers_share_syncs(tmp_path, monkeypatch):
    import threading

    from storage import hooks

    db = make(tmp_path)
    monkeypatch.setitem(hooks._HOOKS, "log.before_sync", 0.05)  # producers arrive while one syncs
    offsets: list[int] = []

    def produce(first: int) -> None:
        for i in range(5):
            offsets.append(db.apply_changes("orders", orders([first + i])))

    threads = [threading.Thread(target=produce, args=(100 * t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(offsets) == list(range(1, 31))
    assert db.status()["log_syncs"] < 30
    assert db.sql("SELECT COUNT(*) AS n FROM big").to_pylist() == [{"n": 30}]
    db.close()


def test_reads_wait_for_every_acknowledged_batch(tmp_path):
    import time

    db = make(tmp_path, fold_delay=60.0)  # the maintainer waits for more changes before it folds ...
    for i in range(5):
        db.apply_changes("orders", orders([i], cust=1, amount=float(i + 6)))
    assert db.status()["relations"][0]["buffer_rows"] > 0  # status does not wait: the buffer is visible
    start = time.monotonic()
    assert rows(db, "SELECT * FROM totals") == [{"cust": 1, "total": 40.0, "n": 5}]
    assert time.monotonic() - start < 30  # ... but a waiting read makes it fold at once
    assert db.offset == 5
    assert all(r["buffer_rows"] == 0 for r in db.status()["relations"])
    db.close()


def test_batches_converted_together_keep_their_own_outcomes(tmp_path):
    from ivm.ingest.ingest_group import Ticket

    db = make(tmp_path)
    engine = db._engine
    tickets = [
        Ticket("orders", orders([1, 2], op="c"), None, None, None),
        Ticket("orders", orders([1], amount=20.0, op="u"), None, None, None),
        Ticket("orders", orders([2], op="c"), None, None, None),  # 2 exists by now: fails alone
        Ticket("events", pa.table({"kind": ["k"], "val": [1]}), None, "src", 7),
        Ticket("orders", orders([2], op="d"), None, None, None),
        Ticket("orders", orders([3], op="c"), None, "src", 7),  # same (source, seq): next unit, deduplicated
    ]
    for ticket in tickets:
        engine.pending.add(ticket)
    last = db.apply_changes("orders", orders([5], op="c"))  # converts everything pending first
    assert [t.offset for t in tickets] == [1, 2, 0, 3, 4, 3]
    assert "duplicate key" in str(tickets[2].error) and all(t.error is None for t in tickets if t is not tickets[2])
    assert last == 5
    assert rows(db, "SELECT id, amount FROM orders") == [{"id": 1, "amount": 20.0}, {"id": 5, "amount": 9.5}]
    assert rows(db, "SELECT * FROM big") == [{"id": 1, "amount": 20.0}, {"id": 5, "amount": 9.5}]
    close_without_checkpoint(db)
    db = ivm.connect(tmp_path)  # the log replays batch by batch to the same state
    assert db.status()["recovered_records"] == 5
    assert rows(db, "SELECT id, amount FROM orders") == [{"id": 1, "amount": 20.0}, {"id": 5, "amount": 9.5}]
    assert rows(db, "SELECT * FROM kinds") == [{"kind": "k", "val": 1}]
    db.close()


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in_memory"])
def test_repeated_keys_in_a_batch_take_each_keys_last_operation(tmp_path, durable):
    """Upserts (and deletes that may miss) resolve to each key's last row
    (ivm/ingest/changes.py: _last_per_key); inserts and strict deletes are still
    checked against the state just before them."""
    db = ivm.connect(tmp_path) if durable else ivm.connect()
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW by_v AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
    db.execute("INSERT INTO t VALUES (1, 'o'), (2, 'o'), (3, 'o')")
    db.apply_changes("t", pa.table({"k": [1, 4, 1, 2, 4, 5], "v": ["a", "x", "b", None, "y", None],
                                    "__op": ["u", "u", "u", "d", "u", "d"]}), on_missing_delete="ignore")
    assert rows(db, "SELECT * FROM t") == rows_of([(1, "b"), (3, "o"), (4, "y")])
    db.apply_changes("t", pa.table({"k": [3, 3, 3], "v": ["p", "q", "r"], "__op": ["u", "r", "u"]}))
    db.apply_changes("t", pa.table({"k": [6, 6], "v": ["n", None], "__op": ["u", "d"]}))  # strict: 6 exists by then
    before = rows(db, "SELECT * FROM t")
    with pytest.raises(ivm.ChangeError, match=r"delete \('d'\) from t of missing \(k\) = \(7\)"):
        db.apply_changes("t", pa.table({"k": [7, 7], "v": [None, "z"], "__op": ["d", "u"]}))
    assert rows(db, "SELECT * FROM t") == before == rows_of([(1, "b"), (3, "r"), (4, "y")])
    assert rows(db, "SELECT * FROM by_v") == [{"v": "b", "n": 1}, {"v": "r", "n": 1}, {"v": "y", "n": 1}]
    db.close()


def rows_of(pairs):
    return sorted(({"k": k, "v": v} for k, v in pairs), key=repr)


def test_last_per_key_refuses_keys_that_share_a_code():
    from ivm.ingest.changes import _last_per_key

    batch = pa.table({"k": ["a", "b", "a", "c"], "__seq": [0, 1, 2, 3]})
    assert _last_per_key(batch, np.array([10, 20, 10, 30]), ["k"]).tolist() == [1, 2, 3]
    assert _last_per_key(batch, np.array([10, 10, 10, 30]), ["k"]) is None  # "a" and "b" collide


def test_stale_state_survives_a_checkpoint_and_a_crash(tmp_path):
    """Views refreshed by recompute leave their operator state stale (ivm/maintain/recompute.py).

    A checkpoint stores the stale flag with its offset, and the rows of a view
    computed on read (its state is empty): a reopen reads them. A crash after
    more batches replays them; reopened in incremental mode, the stale views
    rebuild their state once, then run incrementally.
    """
    from ivm.maintain.recompute import is_stale

    db = make(tmp_path, maintenance="recompute", checkpoint_seconds=3600)
    db.apply_changes("orders", orders(range(1, 6)))
    db.apply_changes("orders", orders([7, 8], cust=3, amount=1.0))
    db._engine.wait_visible()
    snapshot = db._engine.store.snapshot
    assert is_stale(snapshot, "totals") and not is_stale(snapshot, "big")  # big owns no state but its rows
    want = rows(db, "SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust")
    db.close()  # checkpoints
    db = ivm.connect(tmp_path, maintenance="recompute", checkpoint_seconds=3600)
    assert is_stale(db._engine.store.snapshot, "totals") and db.status()["recovered_records"] == 0
    assert rows(db, "SELECT * FROM totals") == want  # the stored rows: the operator state is empty
    db.close()
    result = run_child("""
        db = ivm.connect(path, maintenance="recompute", checkpoint_seconds=3600)
        db.apply_changes("orders", pa.table({"id": [1, 9], "cust": [3, 4], "amount": [2.0, 4.0], "note": ["u", "n"],
                                          "__op": ["u", "c"]}))
        db.apply_changes("orders", pa.table({"id": [2], "cust": [7], "amount": [9.5], "note": ["x"], "__op": ["d"]}))
        os._exit(0)  # no close, no checkpoint: the two batches are only in the log
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    db = ivm.connect(tmp_path, maintenance="incremental")
    engine = db._engine
    totals = engine.catalog.views["totals"].cost
    assert db.status()["recovered_records"] == 2 and totals.rebuilds == 1  # the replay rebuilt it first
    assert not is_stale(engine.store.snapshot, "totals")
    expected = "SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust"
    assert rows(db, "SELECT * FROM totals") == rows(db, expected)
    assert rows(db, "SELECT * FROM big") == rows(db, "SELECT id, amount FROM orders WHERE amount > 5")
    db.apply_changes("orders", orders([10, 11], cust=4, amount=6.0))
    assert rows(db, "SELECT * FROM totals") == rows(db, expected) and totals.batches["incremental"] == 1
    db.close()


def test_large_runs_spill_to_the_database_directory_or_where_asked(tmp_path):
    """Durable databases spill runs of >= spill_rows rows to <dir>/spill by default (unlinked files:
    the directory stays empty), in-memory ones only when asked; bad settings are refused up front."""
    db = make(tmp_path / "db", spill_rows=50)
    db.apply_changes("orders", orders(range(200)))
    assert rows(db, "SELECT cust, total, n FROM totals") == [{"cust": 7, "total": 1900.0, "n": 200}]
    spill = db.status()["spill"]
    assert spill["dir"] == str(tmp_path / "db" / "spill") and spill["rows"] == 50 and spill["bytes"] > 0
    assert list((tmp_path / "db" / "spill").iterdir()) == []
    db.close()
    db = ivm.connect(tmp_path / "db", spill_dir=False)  # off; reopening reads the same data
    assert db.status()["spill"] == {"dir": None, "rows": None, "bytes": 0}
    assert rows(db, "SELECT count(*) AS n FROM orders") == [{"n": 200}]
    db.close()
    memory = ivm.connect()
    assert memory.status()["spill"]["dir"] is None
    memory.close()
    memory = ivm.connect(spill_dir=tmp_path / "mine", spill_rows=1)
    memory.execute(SCHEMA[0])
    memory.apply_changes("orders", orders([1, 2]))
    assert memory.status()["spill"]["bytes"] > 0 and list((tmp_path / "mine").iterdir()) == []
    memory.close()
    for bad, message in (({"spill_rows": 0}, "spill_rows must be a positive integer, not 0"),
                         ({"spill_dir": 3}, "spill_dir must be a directory path, None or False, not 3"),
                         ({"spill_dir": tmp_path / "a_file"}, r"cannot spill to .*a_file")):
        (tmp_path / "a_file").write_text("x")
        with pytest.raises(ValueError, match=message):
            ivm.connect(**bad)
        with pytest.raises(ValueError, match=message):
            ivm.connect(tmp_path / "refused", **bad)
        assert not (tmp_path / "refused").exists()
