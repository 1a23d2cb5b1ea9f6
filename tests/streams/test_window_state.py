"""Closed windows drop their state in views over several streams (ivm/streams/window_state.py).

Two streams with different lateness, out of order and with stragglers, feed q8-like views (each stream
grouped by TUMBLE/HOP, joined on a key and the window). After every batch each view equals DuckDB over
the on-time events (judged here, independently: ts >= the stream's max ts before the batch - lateness),
no state row is of a window the slower watermark closed, and the state stays bounded as the stream
grows. Views where dropping would be wrong (a stream joined with an ordinary table, windows joined on
the key alone) keep every window.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import ivm
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows
from tests.oracle.compare import multiset_diff
from tests.streams.test_event_time import close_without_checkpoint

T0 = np.datetime64(datetime(2024, 1, 1), "us")
T0_US = int(T0.astype(np.int64))
LATENESS = {"p": 2, "a": 5}  # seconds: the streams' watermarks differ
STREAMS = {"p": "CREATE TABLE p (id BIGINT, name VARCHAR, ts TIMESTAMP, WATERMARK FOR ts AS ts - "
                "INTERVAL '2' SECOND) APPEND ONLY",
           "a": "CREATE TABLE a (seller BIGINT, price BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - "
                "INTERVAL '5' SECOND) APPEND ONLY"}

Q8 = """SELECT P.id, P.name, P.starttime
FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(p, ts, INTERVAL '10' SECOND) GROUP BY id, name, window_start, window_end) P
JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(a, ts, INTERVAL '10' SECOND) GROUP BY seller, window_start, window_end) A
  ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"""
PER_WINDOW = """SELECT P.window_start, COUNT(*) AS pairs, SUM(A.total) AS total
FROM (SELECT id, window_start FROM TUMBLE(p, ts, INTERVAL '10' SECOND) GROUP BY id, window_start) P
JOIN (SELECT seller, window_start, SUM(price) AS total
      FROM TUMBLE(a, ts, INTERVAL '10' SECOND) GROUP BY seller, window_start) A
  ON P.id = A.seller AND P.window_start = A.window_start
GROUP BY P.window_start"""
HOPPED = """SELECT P.id, P.window_start, P.n, A.m
FROM (SELECT id, window_start, COUNT(*) AS n FROM HOP(p, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
      GROUP BY id, window_start) P
JOIN (SELECT seller, window_start, MAX(price) AS m FROM HOP(a, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
      GROUP BY seller, window_start) A
  ON P.id = A.seller AND P.window_start = A.window_start"""
UNIONED = """SELECT window_start, COUNT(*) AS n, COUNT(DISTINCT k) AS keys, MAX(k) AS top
FROM (SELECT id AS k, window_start FROM TUMBLE(p, ts, INTERVAL '10' SECOND)
      UNION ALL SELECT seller, window_start FROM TUMBLE(a, ts, INTERVAL '10' SECOND)) u
GROUP BY window_start"""
CLOSABLE = {"q8": Q8, "per_window": PER_WINDOW, "hopped": HOPPED, "unioned": UNIONED}
SIZE_US = 10_000_000


def _events(rng, stream: str, first_s: float, span_s: float, n: int, high: float) -> pa.Table:
    """n events spread over [first_s, first_s + span_s), up to 3 s out of order; 3 % stragglers up to 8 s
    behind the newest event so far (``high``), most of them late for the stream."""
    seconds = first_s + rng.uniform(0, span_s, n) - rng.uniform(0, 3, n)
    late = rng.random(n) < (0.03 if high >= 0 else 0)  # (the first batch has no watermark to be late for)
    seconds[late] = high - rng.uniform(0, 8, late.sum())
    ts = pa.array(T0 + (seconds * 1e6).astype(np.int64).astype("timedelta64[us]"))
    keys = rng.integers(0, 40, n)
    if stream == "p":
        return pa.table({"id": keys, "name": pa.array([f"n{k % 7}" for k in keys]), "ts": ts})
    return pa.table({"seller": keys, "price": rng.integers(0, 1000, n), "ts": ts})


def _on_time(batch: pa.Table, high_us: int | None, lateness_s: int) -> pa.Table:
    if high_us is None:
        return batch
    us = batch.column("ts").cast(pa.int64()).to_numpy()
    return batch.filter(pa.array(us >= high_us - lateness_s * 1_000_000))


def _closed_rows(db, view: str, watermark_us: int) -> int:
    """State rows of windows the watermark closed (window_start + size <= W): must be none."""
    snapshot, rows = db._engine.store.snapshot, 0
    for spec in db._engine.catalog.views[view].states:
        if spec.name != view and "window_start" in [c.name for c in spec.columns]:
            starts = snapshot[spec.name].table().column("window_start").cast(pa.int64()).to_numpy()
            rows += int((starts + SIZE_US <= watermark_us).sum())
    return rows


def rows(db, sql):
    return db.sql(sql).to_pylist()


def _state_rows(db, view: str) -> int:
    snapshot = db._engine.store.snapshot
    return sum(snapshot[s.name].num_rows for s in db._engine.catalog.views[view].states if s.name != view)


def _play(views: dict[str, str], batches: int, seed: int, extra_ddl=(), check=None, path=None, reopen=()):
    """Feed both streams ``batches`` times; at each batch in ``reopen`` close (or crash: 'crash' in the
    tuple) and reopen the database at ``path``."""
    # Incremental: a recompute empties operator state (stale), which would make the bounds below hold trivially.
    db = ivm.connect(path, maintenance="incremental")
    ref, rng = duckdb.connect(), np.random.default_rng(seed)
    for table, ddl in STREAMS.items():
        db.execute(ddl)
        ref.execute(ddl.split(", WATERMARK")[0] + ")")
    for ddl in extra_ddl:
        db.execute(ddl)
        ref.execute(ddl)
    for name, sql in views.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    schema = db._engine.catalog.schema()
    expected = {name: expand_time_windows(parse_query(sql), schema).sql("duckdb") for name, sql in views.items()}
    high: dict[str, int | None] = {"p": None, "a": None}
    late = {"p": 0, "a": 0}
    for b in range(batches):
        if b in reopen:
            close_without_checkpoint(db) if "crash" in reopen else db.close()
            db = ivm.connect(path, maintenance="incremental")
        for stream, n in (("p", 60), ("a", 180)):  # 30 and 90 events per second of event time
            high_s = -1.0 if high[stream] is None else (high[stream] - T0_US) / 1e6
            batch = _events(rng, stream, 2.0 * b, 2.0, n, high_s)
            on_time = _on_time(batch, high[stream], LATENESS[stream])  # noqa: F841 (DuckDB reads it)
            late[stream] += batch.num_rows - on_time.num_rows
            db.apply_changes(stream, batch)
            ref.execute(f"INSERT INTO {stream} SELECT * FROM on_time")
            top = int(batch.column("ts").cast(pa.int64()).to_numpy().max())
            high[stream] = top if high[stream] is None else max(high[stream], top)
        for name, sql in expected.items():
            assert multiset_diff(db.sql(f"SELECT * FROM {name}"), ref.sql(sql).to_arrow_table()) is None, (name, b)
        if check is not None:
            check(db, b, min(high[s] - LATENESS[s] * 1_000_000 for s in high))
    streams = db.status()["streams"]
    assert {s: streams[s]["late_events"] for s in late} == late and min(late.values()) > 0
    return db


def test_q8_like_views_over_two_streams_equal_batch_and_drop_closed_windows():
    """30 batches (60 s of event time): equal to DuckDB over on-time events after every batch, and no
    state row of a window the slower stream's watermark closed."""
    def check(db, b, watermark_us):
        for name in CLOSABLE:
            assert db._engine.catalog.views[name].closed is not None, name
            assert _closed_rows(db, name, watermark_us) == 0, (name, b)

    db = _play(CLOSABLE, 30, seed=3, check=check)
    for name in CLOSABLE:
        assert db.sql(f"SELECT COUNT(*) AS n FROM {name}").to_pylist()[0]["n"] > 0
        assert db._engine.catalog.views[name].stored_output  # its rows outlive the dropped state


@pytest.mark.parametrize("batches", [40, pytest.param(100, marks=pytest.mark.slow)])  # the suite's 25-minute budget (session 22)
def test_state_of_a_two_stream_join_stays_bounded_on_a_long_stream(batches):
    """40 (slow: 150) batches of 2 s, 240 events each: the state holds only windows still open for the slower
    stream: lateness 5 s + disorder 3 s + a batch's 2 s + one 10 s window = 20 s, i.e. 3 tumbling windows
    or 6 hopping ones (slide 5 s), at most 40 keys per stream and window (and MAX's values of the open
    windows), checked after every batch."""
    # windows open x streams x keys; MAX(price) also keeps its values: <= 2 windows x a's 90 events/s x 25 s
    bound = {"q8": 3 * 2 * 40, "hopped": 6 * 2 * 40 + 2 * 90 * 25}
    total = batches * 180 * 2  # a's events x 2 windows each: what MAX's values would hold if nothing went
    sizes = []

    def check(db, b, watermark_us):
        for name, most in bound.items():
            state = _state_rows(db, name)
            assert state <= most, (name, b, state)
            assert _closed_rows(db, name, watermark_us) == 0, (name, b)
        sizes.append((_state_rows(db, "q8"), _state_rows(db, "hopped")))

    db = _play({"q8": Q8, "hopped": HOPPED}, batches, seed=batches, check=check)
    windows = db.sql("SELECT COUNT(DISTINCT starttime) AS n FROM q8").to_pylist()[0]["n"]
    assert windows >= batches * 2 // 10 - 2  # the view keeps the rows of every window
    print("max state rows q8, hopped:", max(s[0] for s in sizes), max(s[1] for s in sizes))
    assert max(s[1] for s in sizes) * 4 < total  # (the bound above does not grow with the stream)


@pytest.mark.parametrize("how", ["close", "crash"])
def test_a_reopened_database_keeps_dropping_closed_windows(tmp_path, how):
    """Closed, or crashed with batches only in the log, and reopened twice: still equal to DuckDB after
    every batch, still storing its rows and dropping closed windows (checkpoint and replay agree)."""
    def check(db, b, watermark_us):
        view = db._engine.catalog.views["q8"]
        assert view.closed is not None and view.stored_output
        assert _closed_rows(db, "q8", watermark_us) == 0, b

    db = _play({"q8": Q8}, 16, seed=8, check=check, path=tmp_path / "db", reopen=(6, 11, how))
    db.close()


TABLE = "CREATE TABLE sellers (seller BIGINT PRIMARY KEY, region VARCHAR)"
KEEPS = {
    # an ordinary table's update may reach any window's groups
    "with_table": """SELECT A.window_start, S.region, COUNT(*) AS n
                     FROM TUMBLE(a, ts, INTERVAL '10' SECOND) A JOIN sellers S ON A.seller = S.seller
                     GROUP BY A.window_start, S.region""",
    # windows matched on the key alone: a new window of one stream pairs with old windows of the other
    "key_only": """SELECT P.id, P.window_start AS ps, A.window_start AS wa
                   FROM (SELECT id, window_start FROM TUMBLE(p, ts, INTERVAL '10' SECOND) GROUP BY id, window_start) P
                   JOIN (SELECT seller, window_start FROM TUMBLE(a, ts, INTERVAL '10' SECOND)
                         GROUP BY seller, window_start) A
                     ON P.id = A.seller AND P.id < 3""",
    # a stream joined without its window
    "raw_side": """SELECT P.id, P.window_start, COUNT(*) AS n
                   FROM (SELECT id, window_start FROM TUMBLE(p, ts, INTERVAL '10' SECOND) GROUP BY id, window_start) P
                   JOIN a ON P.id = a.seller AND a.price < 50 GROUP BY P.id, P.window_start""",
}


def test_views_where_dropping_would_be_wrong_keep_their_state():
    """Equal to DuckDB after every batch (so nothing they need went), and they drop nothing."""
    db = _play(KEEPS, 12, seed=5, extra_ddl=[TABLE, "INSERT INTO sellers SELECT i, 'r' || (i % 3) "
                                                    "FROM range(40) t(i)"])
    for name in KEEPS:
        assert db._engine.catalog.views[name].closed is None, name
    db.execute("UPDATE sellers SET region = 'moved' WHERE seller < 20")  # reaches the first windows
    first = "SELECT MIN(window_start) AS first FROM with_table"
    assert rows(db, first + " WHERE region = 'moved'") == rows(db, first) != [{"first": None}]


RAW_JOIN = """SELECT P.k, P.window_start, P.top, b.price
FROM (SELECT k, window_start, MAX(price) AS top FROM TUMBLE(b, ts, INTERVAL '10' SECOND)
      GROUP BY k, window_start) P JOIN b ON P.k = b.k"""


def test_one_stream_joined_raw_with_its_closed_windows():
    """A raw stream joined with its own windowed groups on the key alone: a later bid looks up groups of
    windows the watermark closed, so the one-stream path keeps their state (it used to drop it)."""
    db = ivm.connect()
    db.execute("CREATE TABLE b (k BIGINT, price BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - "
               "INTERVAL '1' SECOND) APPEND ONLY")
    db.execute(f"CREATE MATERIALIZED VIEW v AS {RAW_JOIN}")
    start = T0.astype(datetime)
    events = pa.table({"k": [1, 2, 1], "price": [5, 7, 9],  # the last bid pairs with window 0's group
                       "ts": [start + timedelta(seconds=s) for s in (1, 30, 31)]})
    for i in range(events.num_rows):
        db.apply_changes("b", events.slice(i, 1))
    ref = duckdb.connect()
    ref.execute("CREATE TABLE b (k BIGINT, price BIGINT, ts TIMESTAMP)")
    ref.execute("INSERT INTO b SELECT * FROM events")  # all on time: each ts >= the last one - 1 s
    expected = expand_time_windows(parse_query(RAW_JOIN), db._engine.catalog.schema()).sql("duckdb")
    assert multiset_diff(db.sql("SELECT * FROM v"), ref.sql(expected).to_arrow_table()) is None
    assert {"k": 1, "window_start": start, "top": 5, "price": 9} in db.sql("SELECT * FROM v").to_pylist()
    assert db._engine.catalog.views["v"].closed is None  # not window-local: the raw b reads any window


# --- one stream: raw rows pinned to the windows they can reach (Nexmark q7) ---------------------------------

PINNED = {
    # q7 as published: the bids at each window's highest price, the bid's time within the window
    "q7": """SELECT b.seller, b.price, b.ts
             FROM a b JOIN (SELECT MAX(price) AS maxprice, window_end AS date_time
                            FROM TUMBLE(a, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end) b1
               ON b.price = b1.maxprice
             WHERE b.ts >= b1.date_time - INTERVAL '10' SECOND AND b.ts < b1.date_time""",
    # window_start <= ts < window_end, on the key
    "within": """SELECT W.seller, W.window_start, W.top, r.price
                 FROM (SELECT seller, window_start, window_end, MAX(price) AS top
                       FROM TUMBLE(a, ts, INTERVAL '10' SECOND) GROUP BY seller, window_start, window_end) W
                 JOIN a r ON W.seller = r.seller AND r.ts >= W.window_start AND r.ts < W.window_end
                 WHERE r.price * 2 > W.top""",
}
UNPINNED = {  # only a lower bound: a later bid reaches every closed window of its key
    "from_start": """SELECT W.seller, W.window_start, W.top, r.price
                     FROM (SELECT seller, window_start, window_end, MAX(price) AS top
                           FROM TUMBLE(a, ts, INTERVAL '10' SECOND) GROUP BY seller, window_start, window_end) W
                     JOIN a r ON W.seller = r.seller AND r.ts >= W.window_start AND r.seller < 3""",
}


def test_one_stream_raw_rows_pinned_to_their_window_drop_closed_windows():
    """A raw stream joined with its own windows by ``ts < window_end`` (q7): a later event reaches only open
    windows, so closed windows' state goes; equal to DuckDB over on-time events after every batch. With only
    a lower bound the view keeps its state (and is equal too)."""
    db, ref, rng = ivm.connect(), duckdb.connect(), np.random.default_rng(11)
    db.execute(STREAMS["a"])
    ref.execute(STREAMS["a"].split(", WATERMARK")[0] + ")")
    views = {**PINNED, **UNPINNED}
    for name, sql in views.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    schema = db._engine.catalog.schema()
    expected = {name: expand_time_windows(parse_query(sql), schema).sql("duckdb") for name, sql in views.items()}
    high, late = None, 0
    for b in range(25):
        batch = _events(rng, "a", 2.0 * b, 2.0, 120, -1.0 if high is None else (high - T0_US) / 1e6)
        on_time = _on_time(batch, high, LATENESS["a"])  # noqa: F841 (DuckDB reads it)
        late += batch.num_rows - on_time.num_rows
        db.apply_changes("a", batch)
        ref.execute("INSERT INTO a SELECT * FROM on_time")
        top = int(batch.column("ts").cast(pa.int64()).to_numpy().max())
        high = top if high is None else max(high, top)
        for name, sql in expected.items():
            assert multiset_diff(db.sql(f"SELECT * FROM {name}"), ref.sql(sql).to_arrow_table()) is None, (name, b)
        for name in PINNED:
            assert db._engine.catalog.views[name].closed is not None, name
            assert _closed_rows(db, name, high - LATENESS["a"] * 1_000_000) == 0, (name, b)
        assert db._engine.catalog.views["from_start"].closed is None
    assert db.status()["streams"]["a"]["late_events"] == late > 0
    assert min(db.sql(f"SELECT COUNT(*) AS n FROM {name}").to_pylist()[0]["n"] for name in views) > 0


def test_explain_of_a_create_shows_the_view_that_create_makes():
    """EXPLAIN CREATE MATERIALIZED VIEW defines the view as CREATE does (ivm/view_definition.py): a
    window-local view over two streams switches to stored rows when its closed windows may go, and its
    EXPLAIN before creating it says so as EXPLAIN of the created view does (it used to plan the view
    without closing windows, and so showed rows computed on read)."""
    db = ivm.connect()
    for ddl in STREAMS.values():
        db.execute(ddl)
    for name, sql in CLOSABLE.items():
        before = db.sql(f"EXPLAIN CREATE MATERIALIZED VIEW {name} AS {sql}").column(0).to_pylist()
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        after = db.sql(f"EXPLAIN {name}").column(0).to_pylist()
        assert db._engine.catalog.views[name].stored_output
        # The first line names what ran last, the last the cost model's word: both about the created view.
        assert before[1:-1] == after[1:-1], name
