"""View change streams (Database.changes): integrating them gives the view.

Every oracle view, over random change streams: a consumer that starts at
offset 0 (before the views exist) and reads the changes after its last
offset at random points must, integrated, equal the view read at the
offset it reached. Plus the retention error and live waiting.
"""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from ivm import OffsetError, UnknownObjectError
from tests.integrate import Integrator
from tests.oracle.compare import multiset_diff
from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.harness import Harness
from tests.oracle.model import generate_batch

TABLES = ["customers", "orders", "items", "events"]


def catch_up(db: ivm.Database, view: str, consumer: Integrator, since: int) -> int:
    changes = db.changes(view, since)
    consumer.add(changes.rows)
    return changes.through


@settings(max_examples=3)  # 51 views per example; the oracle covers maintenance itself
@given(st.data())
def test_integrated_change_stream_equals_every_view(data):
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    views = oracle_views()
    harness = Harness(oracle_schema(), views)
    consumers = {v.name: Integrator() for v in views}
    positions = {v.name: 0 for v in views}
    try:
        for table in TABLES:
            harness.apply(table, generate_batch(rng, harness.model, table, 20))
        harness.create_views()
        for step in range(6):
            table = data.draw(st.sampled_from(TABLES), label=f"table {step}")
            harness.apply(table, generate_batch(rng, harness.model, table, data.draw(st.integers(1, 60))))
            if data.draw(st.booleans(), label=f"read {step}") or step == 5:
                for view in views:
                    positions[view.name] = catch_up(harness.db, view.name, consumers[view.name], positions[view.name])
        offset = harness.db.offset
        for view in views:
            assert positions[view.name] == offset
            current = harness.db.sql(f"SELECT * FROM {view.name}")
            assert not consumers[view.name].negative(), view.name
            got = consumers[view.name].table(current.schema)
            diff = multiset_diff(got, current)
            assert diff is None, f"view {view.name}: {diff}\n    {view.sql}"
    finally:
        harness.close()


@pytest.fixture
def db():
    database = ivm.connect(retain_rows=10)
    database.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g VARCHAR)")
    database.execute("CREATE MATERIALIZED VIEW by_g AS SELECT g, COUNT(*) AS n FROM t GROUP BY g")
    yield database
    database.close()


def test_offsets_older_than_the_retained_history_are_refused(db):
    for i in range(15):  # one new group (one delta row) per batch; 10 rows retained
        db.execute(f"INSERT INTO t VALUES ({2 * i}, 'g{i}'), ({2 * i + 1}, 'g{i}')")
    assert db.offset == 15
    with pytest.raises(OffsetError, match="no longer retained.*read by_g again") as caught:
        db.changes("by_g", 0)
    assert "by_g" in str(caught.value) and "after offset 5" in str(caught.value)
    recent = db.changes("by_g", 12)  # still retained
    assert recent.rows.column("__offset").to_pylist() == [13, 14, 15]
    assert recent.rows.column("g").to_pylist() == ["g12", "g13", "g14"]
    assert db.offset == 15  # reading history changes nothing


def test_other_bad_requests(db):
    db.execute("INSERT INTO t VALUES (1, 'a')")
    with pytest.raises(OffsetError, match="ahead"):
        db.changes("by_g", 5)
    with pytest.raises(OffsetError, match=">= 0"):
        db.changes("by_g", -1)
    with pytest.raises(UnknownObjectError, match="nope"):
        db.changes("nope", 0)


def test_a_tables_changes_are_its_batches(db):
    """Inserts +1, an update -old/+new, a delete -1; retained in a budget of their own; ALTER restarts it."""
    db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    db.execute("UPDATE t SET g = 'c' WHERE id = 1")
    db.execute("DELETE FROM t WHERE id = 2")
    rows = db.changes("t", 0).rows
    assert sorted(rows.to_pylist(), key=lambda r: (r["__offset"], r["__weight"], r["id"])) == [
        {"id": 1, "g": "a", "__weight": 1, "__offset": 1}, {"id": 2, "g": "b", "__weight": 1, "__offset": 1},
        {"id": 1, "g": "a", "__weight": -1, "__offset": 2}, {"id": 1, "g": "c", "__weight": 1, "__offset": 2},
        {"id": 2, "g": "b", "__weight": -1, "__offset": 3}]
    for i in range(3, 7):  # 8 more table rows: over t's budget of 10, within by_g's (4 more groups)
        db.execute(f"INSERT INTO t VALUES ({2 * i}, 'g{i}'), ({2 * i + 1}, 'g{i}')")
    with pytest.raises(OffsetError, match="changes of t after offset 0 are no longer retained.*read t again"):
        db.changes("t", 0)
    assert db.changes("by_g", 0).rows.num_rows == 9  # the view's history is whole
    offset = db.offset
    db.execute("ALTER TABLE t ADD COLUMN x BIGINT")
    with pytest.raises(OffsetError, match="no longer retained"):  # its changes before have other columns
        db.changes("t", offset - 1)
    db.execute("INSERT INTO t VALUES (99, 'z', 5)")
    assert db.changes("t", offset).rows.to_pylist() == [{"id": 99, "g": "z", "x": 5, "__weight": 1, "__offset": offset + 1}]


def test_a_dropped_view_has_no_history(db):
    db.execute("INSERT INTO t VALUES (1, 'a')")
    db.execute("DROP MATERIALIZED VIEW by_g")
    with pytest.raises(UnknownObjectError, match="by_g"):
        db.changes("by_g", 0)


def test_waiting_readers_wake_when_a_change_commits(db):
    result = {}

    def wait():
        result["changes"] = db.changes("by_g", 0, wait=10)

    reader = threading.Thread(target=wait)
    reader.start()
    time.sleep(0.2)
    db.apply_changes("t", pa.table({"id": [1], "g": ["x"]}))
    reader.join(5)
    assert not reader.is_alive()
    rows = result["changes"].rows
    assert rows.to_pylist() == [{"g": "x", "n": 1, "__weight": 1, "__offset": 1}]
    assert result["changes"].through == 1


def test_waiting_gives_up_after_its_timeout(db):
    start = time.monotonic()
    changes = db.changes("by_g", 0, wait=0.2)
    assert changes.rows.num_rows == 0 and changes.through == 0
    assert 0.15 < time.monotonic() - start < 5


def test_durable_change_stream_across_batches_folds_and_a_reopen(tmp_path):
    """Folded batches (durable databases) still integrate to the view; after a
    reopen the history starts at the restored offset: resuming from it works,
    resuming from before it is an error, never a silent gap."""
    path = tmp_path / "db"
    db = ivm.connect(path)
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, g VARCHAR, v BIGINT)")
    db.execute("CREATE MATERIALIZED VIEW s AS SELECT g, COUNT(*) AS n, MAX(v) AS m FROM t GROUP BY g")
    consumer, since = Integrator(), 0
    for i in range(8):
        db.apply_changes("t", pa.table({"k": [i, i + 100, i - 1], "g": [f"g{i % 3}", "x", "y"],
                                        "v": [i, -i, i * 2], "__op": ["u", "u", "d"]}),
                         on_missing_delete="ignore")
        if i % 3 == 0:
            since = catch_up(db, "s", consumer, since)
    since = catch_up(db, "s", consumer, since)
    view = db.sql("SELECT * FROM s")
    assert multiset_diff(consumer.table(view.schema), view) is None
    assert since == db.offset
    early = since - 3
    db.close()

    db = ivm.connect(path)
    try:
        assert db.changes("s", since).rows.num_rows == 0
        with pytest.raises(OffsetError, match="no longer retained"):
            db.changes("s", early)
        db.apply_changes("t", pa.table({"k": [1], "g": ["g9"], "v": [50], "__op": ["u"]}))
        since = catch_up(db, "s", consumer, since)
        view = db.sql("SELECT * FROM s")
        assert multiset_diff(consumer.table(view.schema), view) is None
    finally:
        db.close()


def test_resuming_inside_a_run_folded_after_a_crash_is_an_error_not_a_repeat(tmp_path):
    """Before the crash a consumer reached offset 3 of 6 (each batch folded on
    its own); the checkpoint holds none of them. The reopened database replays
    the log and folds offsets 1-6 in one run: resuming from 3 would repeat 1-3,
    so it is refused; resuming from the restored offset, or from a read, works."""
    path = tmp_path / "db"
    db = ivm.connect(path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, g VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW n AS SELECT g, COUNT(*) AS c FROM t GROUP BY g")
    start = db.offset
    consumer, since = Integrator(), start
    for i in range(6):
        db.apply_changes("t", pa.table({"k": [i], "g": [f"g{i % 2}"]}))
        if i == 2:
            since = catch_up(db, "n", consumer, since)
    assert since == start + 3
    engine = db._engine  # crash: no checkpoint of the batches, only the log has them
    engine.checkpointer.stop()
    engine.checkpointer.checkpoint = lambda force=False: False
    db.close()

    db = ivm.connect(path, fold_delay=2.0)  # the maintainer waits for the whole replay, then folds once
    try:
        assert db.status()["recovered_records"] == 6
        with pytest.raises(OffsetError, match=rf"offset {since} is inside changes of n folded together "
                                              rf"\(offsets {start + 1} to {start + 6}\)"):
            db.changes("n", since)
        fresh = Integrator()
        through = catch_up(db, "n", fresh, start)  # from the restored offset: the whole run, once
        assert through == db.offset == start + 6
        view = db.sql("SELECT * FROM n")
        assert multiset_diff(fresh.table(view.schema), view) is None
    finally:
        db.close()
