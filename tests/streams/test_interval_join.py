"""Interval joins of event streams (issue 8): bounded stored rows, oracle over on-time events."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import ivm
from ivm.streams.interval_join import interval_join
from ivm.streams.event_time import view_query
from sql_frontend.errors import UnsupportedError
from sql_frontend.statements import parse_query
from tests.oracle.interval_streams import SCHEMA, IntervalHarness, play


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_interval_joins_equal_batch_over_on_time_events(seed):
    _oracle(seed, 25)


@settings(max_examples=1, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_interval_joins_over_retained_streams(seed):
    _oracle(seed, 25, retain="1")  # RETAIN shorter than the joins' bounds: the joins' needs win


@pytest.mark.slow
@settings(max_examples=2, deadline=None)  # the suite's 25-minute budget (session 22)
@given(seed=st.integers(0, 10_000))
def test_interval_joins_longer_streams(seed):
    _oracle(seed, 60)


def _oracle(seed: int, batches: int, retain: str = "") -> None:
    harness = IntervalHarness(retain=retain)
    try:
        play(seed, batches, harness)
        kept = harness.kept()
        total = {s: len(harness.model.on_time[s]) for s in kept}
        # the joins let go of rows: the streams keep fewer on-time rows than arrived
        assert all(kept[s] < total[s] for s in kept), (kept, total)
    finally:
        harness.close()


def test_interval_joins_durable_and_reopened(tmp_path):
    harness = IntervalHarness(ivm.connect(tmp_path / "db"))
    clock = play(1, 15, harness)
    harness.db.close()
    reopened = IntervalHarness(ivm.connect(tmp_path / "db"), create=False)
    reopened.model = harness.model
    for stream, rows in reopened.model.on_time.items():  # the reference gets the events again
        names = ("user_id", "query" if stream == "searches" else "url", "ts")
        data = pa.table({n: pa.array([e[i] for e in rows], pa.timestamp("us") if n == "ts" else None)  # noqa: F841
                         for i, n in enumerate(names)})
        reopened.ref.execute(f"INSERT INTO {stream} SELECT * FROM data")
    try:
        reopened.check("after reopen")
        play(2, 15, reopened, start=clock)
    finally:
        reopened.close()
        harness.ref.close()


def _spec(sql: str, late: str | None = None):
    db = ivm.connect()
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("CREATE TABLE users (id BIGINT PRIMARY KEY, name VARCHAR)")
    catalog = db._engine.catalog
    return interval_join(view_query(parse_query(sql), catalog, late), catalog, late)


def test_bounds_derived_from_the_condition():
    spec = _spec("SELECT * FROM searches s JOIN clicks c ON s.user_id = c.user_id "
                 "AND c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' HOUR")
    # searches rows go once W(clicks) > s.ts + 1 h; clicks rows once W(searches) > c.ts
    assert [(x.stream, x.other, x.slack_us) for x in spec.sides] == [
        ("searches", "clicks", 3_600_000_000), ("clicks", "searches", 0)]
    spec = _spec("SELECT * FROM searches s, clicks c WHERE c.ts >= s.ts - INTERVAL '2' SECOND "
                 "AND s.ts + INTERVAL '5' SECOND > c.ts AND c.ts <= s.ts + INTERVAL '9' SECOND")
    assert [x.slack_us for x in spec.sides] == [5_000_000, 2_000_000]  # the tighter of two upper bounds


@pytest.mark.parametrize("sql, late", [
    ("SELECT * FROM searches s JOIN clicks c ON c.ts >= s.ts", None),  # one side unbounded
    ("SELECT * FROM searches s JOIN clicks c ON c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND", "correct"),
    ("SELECT * FROM searches s LEFT JOIN clicks c ON c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND", None),
    ("SELECT * FROM searches s JOIN clicks c ON c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND "
     "JOIN users u ON u.id = s.user_id", None),  # a table that changes looks up any stream row
    ("SELECT * FROM searches s JOIN clicks c ON c.user_id BETWEEN s.user_id AND s.user_id + 1", None),
    ("SELECT * FROM searches s JOIN (SELECT * FROM clicks) c ON c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND",
     None),
])
def test_joins_that_cannot_be_bounded_are_not_interval_joins(sql, late):
    assert _spec(sql, late) is None


def _send(db, stream, second, n=1, user=1):
    ts = [datetime(2024, 1, 1) + timedelta(seconds=second)] * n
    word = "query" if stream == "searches" else "url"
    db.apply_changes(stream, pa.table({"user_id": [user] * n, word: ["x"] * n, "ts": ts}))


def _joined(*more: str) -> ivm.Database:
    """The two streams, an interval join j over them, then ``more`` statements, then ten events each."""
    db = ivm.connect()
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT s.user_id FROM searches s JOIN clicks c "
               "ON s.user_id = c.user_id AND c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND")
    for statement in more:
        db.execute(statement)
    for second in range(0, 100, 10):
        _send(db, "searches", second)
        _send(db, "clicks", second)
    return db


def test_an_unbounded_reader_keeps_every_row():
    db = _joined("CREATE MATERIALIZED VIEW ever AS SELECT s.user_id FROM searches s JOIN clicks c "
                 "ON s.user_id = c.user_id AND c.ts >= s.ts")
    snapshot = db._engine.store.snapshot
    assert snapshot["__ontime_searches"].table().num_rows == 10  # 'ever' may match any of them
    assert not [k for k in snapshot.counters if k.startswith("expired:searches")]


def test_a_view_created_after_rows_went_is_refused_and_nothing_changes():
    db = _joined()
    before = db.objects()
    with pytest.raises(UnsupportedError, match="reads the on-time rows of searches, but .* of them are gone"):
        db.execute("CREATE MATERIALIZED VIEW late_comer AS SELECT COUNT(*) AS n FROM searches")
    assert db.objects() == before
    # all events are still in the table itself: a view correcting for late events may be created
    db.execute("CREATE MATERIALIZED VIEW every WITH (late = 'correct') AS SELECT COUNT(*) AS n FROM searches")
    assert db.sql("SELECT n FROM every").column(0).to_pylist() == [10]


def test_retain_with_an_interval_join_is_accepted_and_bounded():
    db = ivm.connect()
    db.execute("CREATE TABLE a (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
               "APPEND ONLY RETAIN INTERVAL '5' SECOND")
    db.execute("CREATE TABLE b (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
               "APPEND ONLY RETAIN INTERVAL '5' SECOND")
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT a.k, a.ts AS ats, b.ts AS bts FROM a JOIN b "
               "ON a.k = b.k AND b.ts BETWEEN a.ts - INTERVAL '2' SECOND AND a.ts + INTERVAL '2' SECOND")
    with pytest.raises(UnsupportedError, match="would look up stored rows of [ab], which keeps only recent rows"):
        db.execute("CREATE MATERIALIZED VIEW unbounded AS SELECT a.k FROM a JOIN b ON a.k = b.k")
    t0 = datetime(2024, 1, 1)
    for second in range(60):
        for name in ("a", "b"):
            db.apply_changes(name, pa.table({"k": [1, 2], "ts": [t0 + timedelta(seconds=second)] * 2}))
    snapshot = db._engine.store.snapshot
    for name in ("a", "b", "__ontime_a", "__ontime_b"):
        assert snapshot[name].table().num_rows <= 2 * 8, name
    # every pair of equal k at most 2 s apart: 2 keys x (1 + 2 x 2 neighbours at 1 s and 2 s) per second
    assert db.sql("SELECT COUNT(*) FROM j").column(0)[0].as_py() == 2 * (60 + 2 * 59 + 2 * 58)


# --- acceptance 2: a million events, state proportional to rate x (lateness + bound) ---------------------

@pytest.mark.slow
def test_a_million_events_keep_join_and_window_state_bounded():
    """1,000,000 events (two streams of 500,000, 1,000 per second of event time each, up to 4 s out of
    order, batches of 10,000 in turn) through a tumbling-window view and an interval join.

    After every batch: each stream's stored rows (the table, RETAIN 5 s) and the on-time rows the
    join keeps stay within rate x (lateness + bound + disorder + a batch's span), the window view's
    value multisets within the open windows. At the end the join equals DuckDB over the events."""
    import duckdb
    import numpy as np

    db = ivm.connect()
    for name in ("bids", "asks"):
        db.execute(f"CREATE TABLE {name} (auction BIGINT, price BIGINT, ts TIMESTAMP, "
                   "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY RETAIN INTERVAL '5' SECOND")
    db.execute("CREATE MATERIALIZED VIEW per_window AS SELECT window_start, COUNT(*) AS n, MAX(price) AS top "
               "FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) GROUP BY window_start")
    db.execute("CREATE MATERIALIZED VIEW matched AS SELECT b.auction, b.price AS bid, a.price AS ask, b.ts "
               "FROM bids b JOIN asks a ON b.auction = a.auction "
               "AND a.ts BETWEEN b.ts - INTERVAL '2' SECOND AND b.ts + INTERVAL '2' SECOND")
    rng = np.random.default_rng(11)
    rate, batch, per_stream = 1_000, 10_000, 500_000
    lateness, bound, disorder, retain, span = 5, 2, 4, 5, batch // rate
    kept_bound = rate * (lateness + bound + disorder + span)  # on-time rows an interval join may still need
    table_bound = rate * (lateness + retain + disorder)
    sent = {"bids": [], "asks": []}
    for first in range(0, per_stream, batch):
        for name in ("bids", "asks"):
            us = (np.arange(first, first + batch) * (1e6 / rate)).astype(np.int64) - rng.integers(0, 4_000_000, batch)
            data = pa.table({"auction": rng.integers(1, 50_000, batch), "price": rng.integers(0, 100, batch),
                             "ts": pa.array(np.datetime64("2024-01-01", "us") + us.astype("timedelta64[us]"))})
            db.apply_changes(name, data)
            sent[name].append(data)
            snapshot = db._engine.store.snapshot
            for stream in ("bids", "asks"):
                assert snapshot[stream].num_rows <= 2 * table_bound, (first, stream, snapshot[stream].num_rows)
                kept = snapshot[f"__ontime_{stream}"].num_rows
                assert kept <= 2 * kept_bound, (first, stream, kept)
            state = {s.name: snapshot[s.name].num_rows for s in db._engine.catalog.views["per_window"].states}
            state.pop("per_window.agg2")  # one row per window: the view's rows
            assert max(state.values()) <= 3 * 100, state  # MAX's multiset: open windows x 100 prices
    assert db.status()["streams"]["bids"]["late_events"] == 0  # disorder 4 s < lateness 5 s
    ref = duckdb.connect()
    bids, asks = pa.concat_tables(sent["bids"]), pa.concat_tables(sent["asks"])  # noqa: F841
    want = ref.sql("SELECT COUNT(*), SUM(b.price * 1000 + a.price) FROM bids b JOIN asks a ON b.auction = a.auction "
                   "AND a.ts BETWEEN b.ts - INTERVAL '2' SECOND AND b.ts + INTERVAL '2' SECOND").fetchall()
    got = db.sql("SELECT COUNT(*) AS n, SUM(bid * 1000 + ask) AS s FROM matched").to_pylist()[0]
    assert (got["n"], got["s"]) == want[0] and got["n"] > 0
    windows = db.sql("SELECT SUM(n) AS n FROM per_window").to_pylist()[0]["n"]
    assert windows == per_stream


def test_rows_that_went_are_remembered_after_reopen(tmp_path):
    db = ivm.connect(tmp_path / "db")
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT s.user_id, c.ts FROM searches s JOIN clicks c "
               "ON s.user_id = c.user_id AND c.ts BETWEEN s.ts AND s.ts + INTERVAL '1' SECOND")
    for second in range(0, 100, 10):
        _send(db, "searches", second)
        _send(db, "clicks", second)
        # A read waits for a fold: each second's events are folded apart, so the watermarks move
        # between folds and the join lets old rows go. (Left to the maintainer, all twenty batches
        # may fold at once within fold_delay, before any watermark is known, and none go.)
        db.sql("SELECT * FROM j")
    rows = db.sql("SELECT * FROM j").num_rows
    db.close()
    db = ivm.connect(tmp_path / "db")
    try:
        assert db._engine.catalog.views["j"].interval is not None
        assert db.sql("SELECT * FROM j").num_rows == rows == 10
        with pytest.raises(UnsupportedError, match="of them are gone"):
            db.execute("CREATE MATERIALIZED VIEW late_comer AS SELECT COUNT(*) AS n FROM clicks")
        _send(db, "searches", 100)
        _send(db, "clicks", 100.5)
        assert db.sql("SELECT * FROM j").num_rows == 11
        assert db._engine.store.snapshot["__ontime_searches"].num_rows <= 2
    finally:
        db.close()
