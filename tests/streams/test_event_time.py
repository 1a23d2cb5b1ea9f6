"""Event time (issue 8): append-only streams, watermarks, windows, stragglers.

DDL and its errors, append-only enforcement (in memory and durable),
watermarks (monotonic, recovered after reopen, in status).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

import ivm
from sql_frontend.errors import CatalogError, ChangeError, SqlSyntaxError, UnsupportedError

BIDS = ("CREATE TABLE bids (auction BIGINT, price BIGINT, ts TIMESTAMP, "
        "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY")
T0 = datetime(2024, 1, 1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def bids(*rows, op=None) -> pa.Table:
    """rows of (auction, price, seconds after T0)."""
    data = {"auction": [r[0] for r in rows], "price": [r[1] for r in rows], "ts": [at(r[2]) for r in rows]}
    if op is not None:
        data["__op"] = [op] * len(rows)
    return pa.table(data, schema=None)


def rows(db, sql):
    return sorted(db.sql(sql).to_pylist(), key=repr)


def stream(db):
    return db.status()["streams"]["bids"]


def close_without_checkpoint(db) -> None:
    """Close like a crash would leave it: batches only in the log."""
    engine = db._engine
    engine.checkpointer.stop()
    engine.checkpointer.checkpoint = lambda force=False: False
    db.close()


@pytest.fixture(params=["memory", "durable"])
def db(request, tmp_path):
    database = ivm.connect() if request.param == "memory" else ivm.connect(tmp_path / "db")
    database.execute(BIDS)
    yield database
    database.close()


# --- DDL ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ddl, lateness", [
    (BIDS, 5.0),
    ("CREATE TABLE bids (auction BIGINT, price BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts) APPEND ONLY", 0.0),
    ("create table bids (auction bigint, price bigint, ts timestamp, "
     "watermark for ts as ts - interval '2 minutes') append only;", 120.0),
    ("CREATE TABLE bids (auction BIGINT, price BIGINT, ts TIMESTAMP, "
     "WATERMARK FOR ts AS ts - INTERVAL '1500' MILLISECOND) APPEND ONLY", 1.5),
])
def test_watermark_ddl_forms(ddl, lateness):
    db = ivm.connect()
    db.execute(ddl)
    table = db._engine.catalog.tables["bids"]
    assert (table.append_only, table.event_time, table.lateness_us) == (True, "ts", int(lateness * 1e6))
    assert "ts" in table.not_null
    assert stream(db) == {"event_time": "ts", "lateness_seconds": lateness, "max_event_time": None,
                          "watermark": None, "late_events": 0}


def test_append_only_without_watermark():
    db = ivm.connect()
    db.execute("CREATE TABLE clicks (id BIGINT PRIMARY KEY, url VARCHAR) APPEND ONLY")
    table = db._engine.catalog.tables["clicks"]
    assert table.append_only and table.event_time is None
    assert db.status()["streams"] == {}
    db.execute("INSERT INTO clicks VALUES (1, 'a')")
    with pytest.raises(ChangeError, match=r"clicks is APPEND ONLY: __op 'r' \(insert or replace\)"):
        db.apply_changes("clicks", pa.table({"id": [1], "url": ["b"], "__op": ["r"]}))
    with pytest.raises(ChangeError, match="clicks is APPEND ONLY: INSERT OR REPLACE|APPEND ONLY"):
        db.execute("INSERT OR REPLACE INTO clicks VALUES (1, 'b')")
    assert rows(db, "SELECT * FROM clicks") == [{"id": 1, "url": "a"}]


@pytest.mark.parametrize("ddl, error, message", [
    ("CREATE TABLE b (a INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)", SqlSyntaxError,
     "a WATERMARK needs an APPEND ONLY table"),
    ("CREATE TABLE b (a INT, ts TIMESTAMP, WATERMARK FOR ts AS a - INTERVAL '5' SECOND) APPEND ONLY",
     SqlSyntaxError, "WATERMARK FOR ts must subtract from the same column"),
    ("CREATE TABLE b (a INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' MONTH) APPEND ONLY",
     SqlSyntaxError, "expected an interval such as INTERVAL '5' SECOND"),
    ("CREATE TABLE b (a INT, ts TIMESTAMP, WATERMARK FOR ts) APPEND ONLY", SqlSyntaxError,
     "malformed WATERMARK clause 'WATERMARK FOR ts'"),
    ("CREATE TABLE b (WATERMARK FOR ts AS ts, a INT, ts TIMESTAMP) APPEND ONLY", SqlSyntaxError,
     "the WATERMARK clause must come last"),
    ("CREATE TABLE b (a INT, ts TIMESTAMP) APPEND ONLY NOW", SqlSyntaxError, "APPEND ONLY must end"),
    ("CREATE TABLE b (a INT, ts TIMESTAMP, WATERMARK FOR t2 AS t2) APPEND ONLY", CatalogError,
     "b has no column t2"),
    ("CREATE TABLE b (a INT, ts DATE, WATERMARK FOR ts AS ts) APPEND ONLY", CatalogError,
     "the event-time column must be a TIMESTAMP, not DATE"),
    ("CREATE TABLE b (a INT) APPEND ONLY; CREATE TABLE c (a INT)", SqlSyntaxError, "statement of its own"),
    ("CREATE TABLE b APPEND ONLY AS SELECT 1 AS a", SqlSyntaxError, "APPEND ONLY must end|syntax error"),
])
def test_bad_stream_ddl_is_refused_and_creates_nothing(tmp_path, ddl, error, message):
    db = ivm.connect(tmp_path)
    with pytest.raises(error, match=message):
        db.execute(ddl)
    assert db.sql("SHOW TABLES").num_rows == 0
    db.close()
    assert ivm.connect(tmp_path).sql("SHOW TABLES").num_rows == 0


def test_a_column_named_watermark_is_just_a_column():
    db = ivm.connect()
    db.execute("CREATE TABLE t (watermark INT, x INT)")
    db.execute("INSERT INTO t VALUES (1, 2)")
    assert rows(db, "SELECT watermark FROM t") == [{"watermark": 1}]


# --- append only ----------------------------------------------------------------------------------

@pytest.mark.parametrize("statement, message", [
    ("UPDATE bids SET price = 0", "bids is APPEND ONLY: UPDATE is not allowed"),
    ("UPDATE bids SET price = 0 WHERE auction = 12345", "bids is APPEND ONLY: UPDATE is not allowed"),
    ("DELETE FROM bids", "bids is APPEND ONLY: DELETE is not allowed"),
])
def test_update_and_delete_statements_are_refused(db, statement, message):
    db.execute("INSERT INTO bids VALUES (1, 10, TIMESTAMP '2024-01-01 00:00:10')")
    before, offset = rows(db, "SELECT * FROM bids"), db.offset
    with pytest.raises(ChangeError, match=message):
        db.execute(statement)
    assert rows(db, "SELECT * FROM bids") == before and db.offset == offset


@pytest.mark.parametrize("op, word", [("d", "delete"), ("u", "upsert")])
def test_update_and_delete_changes_are_refused(db, op, word):
    db.apply_changes("bids", bids((1, 10, 10)))
    before, offset, mark = rows(db, "SELECT * FROM bids"), db.offset, stream(db)
    mixed = pa.concat_tables([bids((2, 20, 30)), bids((1, 10, 10), op=op).drop(["__op"])]).append_column(
        "__op", pa.array(["c", op]))
    with pytest.raises(ChangeError, match=f"bids is APPEND ONLY: __op '{op}' \\({word}\\) is not allowed"):
        db.apply_changes("bids", mixed)
    assert rows(db, "SELECT * FROM bids") == before and db.offset == offset and stream(db) == mark


def test_null_event_time_is_refused(db):
    with pytest.raises(ChangeError, match="column ts of bids is NOT NULL"):
        db.apply_changes("bids", pa.table({"auction": [1], "price": [1], "ts": pa.array([None], pa.timestamp("us"))}))
    assert stream(db)["max_event_time"] is None


# --- watermarks -----------------------------------------------------------------------------------

def test_watermark_moves_forward_only_and_counts_late_events(db):
    db.apply_changes("bids", bids((1, 10, 10), (2, 5, 20)))  # max 20 -> watermark 15
    assert (stream(db)["watermark"], stream(db)["late_events"]) == ("2024-01-01 00:00:15", 0)
    db.apply_changes("bids", bids((1, 10, 14), (1, 10, 15), (1, 10, 16)))  # 14 is late; max stays 20
    assert (stream(db)["watermark"], stream(db)["late_events"]) == ("2024-01-01 00:00:15", 1)
    db.apply_changes("bids", bids((3, 1, 40), (3, 1, 16)))  # a batch does not make its own events late
    assert (stream(db)["watermark"], stream(db)["late_events"]) == ("2024-01-01 00:00:35", 1)
    assert stream(db)["max_event_time"] == "2024-01-01 00:00:40"
    status = db.sql("SHOW STATUS").to_pylist()
    assert [r["watermark"] for r in status if r["name"] == "bids"] == ["2024-01-01 00:00:35"]
    assert db.sql("SELECT COUNT(*) AS n FROM bids").to_pylist() == [{"n": 7}]  # the table keeps late events


@pytest.mark.parametrize("crash", [False, True])
def test_watermark_is_recovered_after_reopen(tmp_path, crash):
    db = ivm.connect(tmp_path)
    db.execute(BIDS)
    db.apply_changes("bids", bids((1, 10, 10), (2, 5, 20)))
    db.apply_changes("bids", bids((1, 10, 2)))
    mark = stream(db)
    close_without_checkpoint(db) if crash else db.close()
    db = ivm.connect(tmp_path)
    assert db.status()["recovered_records"] == (2 if crash else 0)
    got = stream(db)
    assert got["watermark"] == mark["watermark"] == "2024-01-01 00:00:15"
    assert got["late_events"] == mark["late_events"] == 1  # stored with the checkpoint, or replayed
    db.apply_changes("bids", bids((1, 1, 12)))  # still late after the reopen
    assert stream(db)["late_events"] == got["late_events"] + 1
    db.close()


# --- windows and stragglers: the oracle -----------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from sql_frontend.statements import parse_query  # noqa: E402
from sql_frontend.time_windows import expand_time_windows  # noqa: E402
from tests.oracle.compare import multiset_diff  # noqa: E402
from tests.oracle.streams import StreamHarness, assert_window_call_refused, play, play_fresh, stream_views  # noqa: E402


def _play_fresh(seed: int, batches: int) -> None:
    play_fresh(seed, batches)


@settings(max_examples=2)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(3, 10))
def test_windowed_views_equal_batch_over_on_time_or_all_events(seed, batches):
    _play_fresh(seed, batches)


@pytest.mark.slow
@settings(max_examples=2)  # the suite's 25-minute budget (session 22)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(8, 16))
def test_windowed_views_longer_streams(seed, batches):
    _play_fresh(seed, batches)


def test_windowed_views_durable_and_reopened(tmp_path):
    chosen = ("tumble_totals", "hop_counts", "tumble_join_category")
    harness = StreamHarness(ivm.connect(tmp_path), views=[v for v in stream_views() if v.name in chosen])
    play(11, 6, harness)
    close_without_checkpoint(harness.db)
    harness.db = ivm.connect(tmp_path)  # replays the log: same watermarks, same late events
    harness.check("after reopening")
    play(12, 4, harness)
    harness.db.close()
    harness.db = ivm.connect(tmp_path)
    harness.check("after a clean reopen")
    harness.close()


# --- errors of windows and view options -----------------------------------------------------------

@pytest.mark.parametrize("body, error, message", [
    ("SELECT * FROM TUMBLE(bids, ts)", SqlSyntaxError, r"TUMBLE takes 3 arguments: TUMBLE\(table, time_column"),
    ("SELECT * FROM HOP(bids, ts, INTERVAL '1' SECOND)", SqlSyntaxError, "HOP takes 4 arguments"),
    ("SELECT * FROM TUMBLE(nope, ts, INTERVAL '1' SECOND)", Exception, "relation nope does not exist"),
    ("SELECT * FROM TUMBLE(bids, nope, INTERVAL '1' SECOND)", Exception, "TUMBLE: bids has no column nope"),
    ("SELECT * FROM TUMBLE(bids, price, INTERVAL '1' SECOND)", Exception,
     "the time column bids.price must be a TIMESTAMP, not BIGINT"),
    ("SELECT * FROM TUMBLE(bids, ts, 10)", SqlSyntaxError, "TUMBLE expects INTERVAL sizes"),
    ("SELECT * FROM TUMBLE(bids, ts, INTERVAL '1' MONTH)", SqlSyntaxError, "expected an interval such as"),
    ("SELECT * FROM TUMBLE(bids, ts, INTERVAL '0' SECOND)", Exception, "window sizes must be positive"),
    ("SELECT * FROM TUMBLE((SELECT * FROM bids), ts, INTERVAL '1' SECOND)", SqlSyntaxError,
     "the first argument of TUMBLE must be a table or view name"),
    ("SELECT * FROM HOP(bids, ts, INTERVAL '3' SECOND, INTERVAL '10' SECOND)", Exception,
     "HOP size INTERVAL '10' SECOND must be a whole multiple of its slide"),
    ("SELECT * FROM HOP(bids, ts, INTERVAL '1' SECOND, INTERVAL '1' HOUR)", UnsupportedError,
     r"HOP with more than 100 windows per event \(size / slide = 3600\)"),
    ("SELECT * FROM TUMBLE(w, ts, INTERVAL '1' SECOND)", Exception, "adds a column window_start, which w already"),
])
def test_bad_window_calls_are_refused(body, error, message):
    assert_window_call_refused(BIDS, body, error, message)


@pytest.mark.parametrize("ddl, error, message", [
    ("CREATE MATERIALIZED VIEW v WITH (late = 'ignore') AS SELECT * FROM bids", UnsupportedError,
     "late must be one of 'drop', 'correct'; got 'ignore'"),
    ("CREATE MATERIALIZED VIEW v WITH (late = 'drop') AS SELECT * FROM plain", UnsupportedError,
     "late = 'drop' applies to views reading a table with a WATERMARK; this view reads none"),
    ("CREATE MATERIALIZED VIEW v WITH (lateness = 'drop') AS SELECT * FROM bids", UnsupportedError,
     "unknown option 'lateness' for CREATE MATERIALIZED VIEW; valid options: engine, late, emit"),
])
def test_bad_view_options_are_refused(tmp_path, ddl, error, message):
    db = ivm.connect(tmp_path)
    db.execute(BIDS)
    db.execute("CREATE TABLE plain (a INT)")
    with pytest.raises(error, match=message):
        db.execute(ddl)
    assert [r["name"] for r in db.sql("SHOW TABLES").to_pylist()] == ["bids", "plain"]
    db.close()


def test_window_columns_and_alignment():
    db = ivm.connect()
    db.execute(BIDS)
    db.apply_changes("bids", bids((1, 10, 13.5), (2, 20, 6.999999)))
    got = rows(db, "SELECT auction, window_start, window_end FROM TUMBLE(bids, ts, INTERVAL '7' SECOND)")
    # aligned to the epoch: 2024-01-01 00:00 is 1704067200 s after it, 3 s past a multiple of 7 s
    assert [(r["auction"], r["window_start"], r["window_end"]) for r in got] == [
        (1, at(11), at(18)), (2, at(4), at(11))]
    hops = rows(db, "SELECT window_start, window_end FROM HOP(bids, ts, INTERVAL '5' SECOND, INTERVAL '15' SECOND) b "
                    "WHERE b.auction = 1")
    assert sorted((r["window_start"], r["window_end"]) for r in hops) == [(at(s), at(s + 15)) for s in (0, 5, 10)]


# --- bounded state: RETAIN ----------------------------------------------------------------------------

RETAINED = ("CREATE TABLE bids (auction BIGINT, price BIGINT, ts TIMESTAMP, "
            "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY RETAIN INTERVAL '10' SECOND")


@pytest.mark.parametrize("maintenance", ["auto", "recompute"])
def test_retain_drops_rows_the_watermark_passed_and_views_keep_their_windows(tmp_path, maintenance):
    # "recompute" (also what "auto" may pick on tiny tables) must not apply: the dropped rows still count.
    db = ivm.connect(tmp_path, maintenance=maintenance)
    db.execute(RETAINED)
    db.execute("CREATE MATERIALIZED VIEW counts AS SELECT window_start, COUNT(*) AS n, MAX(price) AS top "
               "FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) GROUP BY window_start")
    db.execute("CREATE MATERIALIZED VIEW fixed WITH (late = 'correct') AS SELECT window_start, COUNT(*) AS n "
               "FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) GROUP BY window_start")
    db.apply_changes("bids", bids((1, 10, 1), (1, 20, 12), (2, 5, 18)))  # watermark 13: keeps ts >= 3
    assert [r["ts"] for r in rows(db, "SELECT ts FROM bids")] == [at(12), at(18)]
    db.apply_changes("bids", bids((1, 7, 2), (3, 1, 40)))  # 2 is late; watermark 35 keeps ts >= 25
    assert [r["ts"] for r in rows(db, "SELECT ts FROM bids")] == [at(40)]
    windows = {(r["window_start"], r["n"], r["top"]) for r in db.sql("SELECT * FROM counts").to_pylist()}
    assert windows == {(at(0), 1, 10), (at(10), 2, 20), (at(40), 1, 1)}
    assert {(r["window_start"], r["n"]) for r in db.sql("SELECT * FROM fixed").to_pylist()} == {
        (at(0), 2), (at(10), 2), (at(40), 1)}  # the late event corrected window 0
    assert stream(db)["late_events"] == 1
    close_without_checkpoint(db)
    db = ivm.connect(tmp_path, maintenance=maintenance)  # replay drops the same rows
    assert [r["ts"] for r in rows(db, "SELECT ts FROM bids")] == [at(40)]
    assert {(r["window_start"], r["n"]) for r in db.sql("SELECT * FROM fixed").to_pylist()} == {
        (at(0), 2), (at(10), 2), (at(40), 1)}
    assert stream(db)["late_events"] == 1
    db.close()


@pytest.mark.parametrize("body", [
    "SELECT w.window_start, a.category, COUNT(*) AS n FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) AS w "
    "JOIN auctions a ON w.auction = a.id GROUP BY w.window_start, a.category",
    "SELECT x.auction, y.price FROM bids x JOIN bids y ON x.auction = y.auction",
])
def test_views_that_look_up_retained_rows_are_refused(body):
    db = ivm.connect()
    db.execute(RETAINED)
    db.execute("CREATE TABLE auctions (id BIGINT PRIMARY KEY, category VARCHAR)")
    with pytest.raises(UnsupportedError, match="would look up stored rows of bids, which keeps only recent rows"):
        db.execute(f"CREATE MATERIALIZED VIEW v AS {body}")
    assert not db._engine.catalog.views and [r["name"] for r in db.sql("SHOW TABLES").to_pylist()] == [
        "auctions", "bids"]


def test_retain_needs_a_watermark():
    db = ivm.connect()
    with pytest.raises(SqlSyntaxError, match="RETAIN needs a WATERMARK"):
        db.execute("CREATE TABLE b (a INT) APPEND ONLY RETAIN INTERVAL '1' MINUTE")
    assert db.sql("SHOW TABLES").num_rows == 0


def _state_rows(db, view: str) -> dict[str, int]:
    snapshot = db._engine.store.snapshot
    return {s.name: snapshot[s.name].num_rows for s in db._engine.catalog.views[view].states}


def test_a_long_stream_keeps_stream_rows_bounded_by_lateness_and_retain():
    """200,000 events, 1,000 per second of event time, up to 4 s out of order, in batches of 20,000.

    State = stored rows of the stream (and its on-time twin) + the view's operator state: the
    stream's rows stay within lateness + retain, the value multisets within the open windows,
    and the view keeps one row per window (its result)."""
    db = ivm.connect()
    db.execute(RETAINED)
    db.execute("CREATE MATERIALIZED VIEW q AS SELECT window_start, COUNT(*) AS n, SUM(price) AS total, "
               "MAX(price) AS top, COUNT(DISTINCT auction) AS auctions "
               "FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) GROUP BY window_start")
    rng = np.random.default_rng(7)
    rate, batch, total = 1_000, 20_000, 200_000
    bound = rate * (5 + 10 + 4)  # events within lateness + retain (+ disorder) of the newest one
    for first in range(0, total, batch):
        us = (np.arange(first, first + batch) * (1e6 / rate)).astype(np.int64) - rng.integers(0, 4_000_000, batch)
        db.apply_changes("bids", pa.table({
            "auction": rng.integers(1, 100, batch), "price": rng.integers(0, 100, batch),
            "ts": pa.array(np.datetime64(T0, "us") + us.astype("timedelta64[us]"))}))
        snapshot = db._engine.store.snapshot
        stored = snapshot["bids"].num_rows + snapshot["__ontime_bids"].num_rows
        assert stored <= 2 * bound, (first, stored)
        windows = db.sql("SELECT COUNT(*) AS n FROM q").to_pylist()[0]["n"]
        state = _state_rows(db, "q")
        assert state.pop("q.agg2") == windows  # one state row per window: the view's rows
        # MAX's and COUNT(DISTINCT)'s value multisets hold only windows not closed yet: at most
        # 3 windows (lateness + disorder + a batch's 20 s span) of 100 values each
        assert set(state) == {"q.vals2_0", "q.vals2_1"} and max(state.values()) <= 3 * 100, state
    assert windows == total // rate // 10 + 1
    assert db.sql("SELECT SUM(n) AS n FROM q").to_pylist() == [{"n": total - stream(db)["late_events"]}]


# --- emit = 'on_close' ---------------------------------------------------------------------------------

def test_on_close_subscribers_see_each_window_once_final():
    harness = StreamHarness(views=[v for v in stream_views() if v.name == "tumble_totals"])
    try:
        play(5, 8, harness)
        final = harness.db.sql("SELECT * FROM tumble_totals_closed").to_pylist()
        changes = harness.db.changes("tumble_totals_closed", 0).rows
        assert changes.num_rows == len(final) > 0
        assert set(changes.column("__weight").to_pylist()) == {1}  # inserts only: never retracted
        mark = harness.model.watermark()
        assert all(r["window_end"] <= mark for r in final)
        # the on-update twin has the open windows too
        assert harness.db.sql("SELECT COUNT(*) AS n FROM tumble_totals_drop").to_pylist()[0]["n"] > len(final)
    finally:
        harness.close()


@pytest.mark.parametrize("ddl, message", [
    ("CREATE MATERIALIZED VIEW v WITH (emit = 'on_close') AS SELECT window_start, COUNT(*) AS n "
     "FROM TUMBLE(bids, ts, INTERVAL '1' SECOND) GROUP BY window_start", "needs the view to output the window_end"),
    ("CREATE MATERIALIZED VIEW v WITH (emit = 'sometimes') AS SELECT * FROM bids",
     "emit must be one of 'on_update', 'on_close'; got 'sometimes'"),
    ("CREATE MATERIALIZED VIEW v WITH (emit = 'on_close') AS SELECT * FROM plain",
     "emit = 'on_close' applies to views reading a table with a WATERMARK"),
])
def test_bad_emit_options_are_refused(ddl, message):
    db = ivm.connect()
    db.execute(BIDS)
    db.execute("CREATE TABLE plain (a INT)")
    with pytest.raises(UnsupportedError, match=message):
        db.execute(ddl)
    assert not db._engine.catalog.views


# --- Nexmark q7 (tumbling max) over the generator -----------------------------------------------------

NEXMARK_BID = ("CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, "
               "date_time TIMESTAMP, extra VARCHAR, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) "
               "APPEND ONLY")
# q7 as published (the highest bid of each 10-second window, as a self-join on the price) ...
Q7 = """SELECT b.auction, b.price, b.bidder, b.date_time
FROM bid b JOIN (SELECT MAX(price) AS maxprice, window_end AS date_time
                 FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) GROUP BY window_start, window_end) b1
  ON b.price = b1.maxprice
WHERE b.date_time >= b1.date_time - INTERVAL '10' SECOND AND b.date_time < b1.date_time"""
# ... and with both sides windowed, joined on the window (an equi-join)
Q7_WINDOWED = """SELECT b.auction, b.price, b.bidder, b.date_time, b.window_end
FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) b
JOIN (SELECT window_start, MAX(price) AS maxprice FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND)
      GROUP BY window_start) b1 ON b.window_start = b1.window_start AND b.price = b1.maxprice"""


def test_nexmark_q7_over_the_generator():
    import duckdb

    from bench import nexmark

    db, ref = ivm.connect(), duckdb.connect()
    db.execute(NEXMARK_BID)
    ref.execute("CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, "
                "date_time TIMESTAMP, extra VARCHAR)")
    db.execute(f"CREATE MATERIALIZED VIEW q7 AS {Q7}")
    db.execute(f"CREATE MATERIALIZED VIEW q7w AS {Q7_WINDOWED}")
    schema = db._engine.catalog.schema()
    expected = {name: expand_time_windows(parse_query(sql), schema).sql("duckdb")
                for name, sql in (("q7", Q7), ("q7w", Q7_WINDOWED))}
    for first in range(0, 60_000, 15_000):  # 4 batches of 13,800 bids, 2,000 events per second: 30 s
        _, _, batch = nexmark.generate(15_000, first_event=first, rate=2_000)
        db.apply_changes("bid", batch)
        ref.execute("INSERT INTO bid SELECT * FROM batch")
        for name, sql in expected.items():
            assert multiset_diff(db.sql(f"SELECT * FROM {name}"), ref.sql(sql).to_arrow_table()) is None, name
    assert db.sql("SELECT COUNT(DISTINCT window_end) AS n FROM q7w").to_pylist() == [{"n": 3}]
    assert db.status()["streams"]["bid"]["late_events"] == 0  # the generator's events are in order
