"""SESSION windows (issue 8): the oracle over out-of-order and late events, merges, bounded state, errors.

The reference for every view is a second definition of sessions (tests/oracle/sessions.py), evaluated
by DuckDB over the on-time events (late = 'drop'), all events (late = 'correct'), or the sessions the
watermark closed (emit = 'on_close').
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from sql_frontend.errors import SqlSyntaxError
from tests.oracle.fixtures import FIXTURES, read_views
from tests.oracle.sessions import reference_sql
from tests.oracle.streams import StreamHarness, assert_window_call_refused, play, play_fresh

BIDS = ("CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP, "
        "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY")
T0 = datetime(2024, 1, 1)


def session_views(*names):
    views = read_views(FIXTURES / "session_views.sql")
    return [v for v in views if not names or v.name in names]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def bids(*rows) -> pa.Table:
    """rows of (bidder, price, seconds after T0); auction 1."""
    return pa.table({"auction": [1] * len(rows), "bidder": [r[0] for r in rows], "price": [r[1] for r in rows],
                     "ts": [at(r[2]) for r in rows]})


def sessions(db, view):
    return sorted(((-1 if r["bidder"] is None else r["bidder"]), (r["window_start"] - T0).total_seconds(), (r["window_end"] - T0).total_seconds(),
                   r["n"]) for r in db.sql(f"SELECT * FROM {view}").to_pylist())


# --- the oracle -----------------------------------------------------------------------------------------

def _play_fresh(seed: int, batches: int, views=None) -> None:
    play_fresh(seed, batches, views or session_views(), reference_sql)


@settings(max_examples=2)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(3, 10))
def test_session_views_equal_batch_over_on_time_or_all_events(seed, batches):
    _play_fresh(seed, batches)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_session_views_fixed_seeds(seed):
    _play_fresh(seed, 8, session_views("session_per_bidder", "session_global"))


@pytest.mark.slow
@settings(max_examples=1)  # the suite's 25-minute budget (session 22)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(8, 14))
def test_session_views_longer_streams(seed, batches):
    _play_fresh(seed, batches)


def test_session_views_durable_and_reopened(tmp_path):
    from tests.streams.test_event_time import close_without_checkpoint

    harness = StreamHarness(ivm.connect(tmp_path), views=session_views("session_per_bidder"), reference=reference_sql)
    play(21, 6, harness)
    close_without_checkpoint(harness.db)
    harness.db = ivm.connect(tmp_path)
    harness.check("after reopening")
    play(22, 4, harness)
    harness.close()


# --- merges and splits, as deltas ---------------------------------------------------------------------

PER_BIDDER = ("SELECT bidder, window_start, window_end, COUNT(*) AS n "
              "FROM SESSION(bids, ts, INTERVAL '10' SECOND, bidder) GROUP BY bidder, window_start, window_end")


def test_a_late_event_bridging_two_sessions_retracts_both_and_inserts_the_merge():
    db = ivm.connect()
    db.execute(BIDS)
    db.execute(f"CREATE MATERIALIZED VIEW fixed WITH (late = 'correct') AS {PER_BIDDER}")
    db.execute(f"CREATE MATERIALIZED VIEW dropped AS {PER_BIDDER}")
    db.apply_changes("bids", bids((1, 10, 0), (1, 11, 15), (2, 5, 5)))
    db.apply_changes("bids", bids((1, 12, 40)))  # watermark 35
    assert sessions(db, "fixed") == [(1, 0, 10, 1), (1, 15, 25, 1), (1, 40, 50, 1), (2, 5, 15, 1)]
    since = db.offset
    db.apply_changes("bids", bids((1, 13, 7)))  # late (7 < 35): [7, 17) bridges [0, 10) and [15, 25)
    assert sessions(db, "fixed") == [(1, 0, 25, 3), (1, 40, 50, 1), (2, 5, 15, 1)]
    changes = db.changes("fixed", since).rows.to_pylist()
    moved = sorted(((r["window_start"] - T0).total_seconds(), (r["window_end"] - T0).total_seconds(), r["n"],
                    r["__weight"]) for r in changes)
    assert moved == [(0, 10, 1, -1), (0, 25, 3, 1), (15, 25, 1, -1)]
    # the drop view ignored the straggler and counted it
    assert sessions(db, "dropped") == [(1, 0, 10, 1), (1, 15, 25, 1), (1, 40, 50, 1), (2, 5, 15, 1)]
    assert db.status()["streams"]["bids"]["late_events"] == 1


def test_an_on_time_event_merges_open_sessions_and_deletes_split_them():
    db = ivm.connect()
    db.execute("CREATE TABLE clicks (u BIGINT, ts TIMESTAMP)")  # an ordinary table: deletes allowed
    db.execute("CREATE MATERIALIZED VIEW s AS SELECT u AS bidder, window_start, window_end, COUNT(*) AS n "
               "FROM SESSION(clicks, ts, INTERVAL '10' SECOND, u) GROUP BY u, window_start, window_end")
    db.execute(f"INSERT INTO clicks VALUES (1, TIMESTAMP '{at(0)}'), (1, TIMESTAMP '{at(15)}'), "
               f"(1, TIMESTAMP '{at(15)}'), (NULL, TIMESTAMP '{at(3)}'), (2, NULL)")
    assert sessions(db, "s") == [(-1, 3, 13, 1), (1, 0, 10, 1), (1, 15, 25, 2)]
    db.execute(f"INSERT INTO clicks VALUES (1, TIMESTAMP '{at(7)}')")
    assert sessions(db, "s") == [(-1, 3, 13, 1), (1, 0, 25, 4)]
    db.execute(f"DELETE FROM clicks WHERE u = 1 AND ts = TIMESTAMP '{at(7)}'")
    assert sessions(db, "s") == [(-1, 3, 13, 1), (1, 0, 10, 1), (1, 15, 25, 2)]
    db.execute(f"UPDATE clicks SET ts = TIMESTAMP '{at(9)}' WHERE u = 1 AND ts = TIMESTAMP '{at(0)}'")
    assert sessions(db, "s") == [(-1, 3, 13, 1), (1, 9, 25, 3)]
    expected = db.sql("SELECT u AS bidder, window_start, window_end, COUNT(*) AS n "
                      "FROM SESSION(clicks, ts, INTERVAL '10' SECOND, u) GROUP BY ALL").to_pylist()  # ad-hoc read
    assert sorted(map(repr, expected)) == sorted(map(repr, db.sql("SELECT * FROM s").to_pylist()))


# --- bounded state --------------------------------------------------------------------------------------

def test_closed_sessions_drop_their_state_on_a_long_stream():
    """100,000 events of 200 bidders, 1,000 per second, sessions with a 2 s gap (each bidder is active in
    bursts); the session operator keeps only the rows of sessions the watermark has not closed."""
    db = ivm.connect(maintenance="incremental")  # a recompute would empty the state this test bounds
    db.execute(BIDS)
    db.execute("CREATE MATERIALIZED VIEW q AS SELECT bidder, window_start, window_end, COUNT(*) AS n "
               "FROM SESSION(bids, ts, INTERVAL '2' SECOND, bidder) GROUP BY bidder, window_start, window_end")
    rng = np.random.default_rng(3)
    rate, batch, total = 1_000, 10_000, 100_000
    for first in range(0, total, batch):
        seconds = np.arange(first, first + batch) / rate
        us = (seconds * 1e6).astype(np.int64) - rng.integers(0, 3_000_000, batch)
        bidder = (rng.integers(0, 20, batch) + 20 * ((seconds // 7).astype(np.int64) % 10))  # 20 active at a time
        db.apply_changes("bids", pa.table({
            "auction": np.ones(batch, np.int64), "bidder": bidder, "price": rng.integers(0, 100, batch),
            "ts": pa.array(np.datetime64(T0, "us") + us.astype("timedelta64[us]"))}))
        snapshot = db._engine.store.snapshot
        session_state = snapshot["q.session1"].num_rows
        # open sessions hold events of the last lateness + disorder + a batch's span (5 + 3 + 10 s, + the gap)
        assert session_state <= rate * (5 + 3 + 10 + 2), (first, session_state)
    assert db.sql("SELECT SUM(n) AS n FROM q").to_pylist() == [
        {"n": total - db.status()["streams"]["bids"]["late_events"]}]
    assert snapshot["__ontime_bids"].num_rows > 5 * session_state  # the stream grows; the state does not


# --- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, error, message", [
    ("SELECT * FROM SESSION(bids, ts)", SqlSyntaxError, r"SESSION takes at least 3 arguments: SESSION\(table"),
    ("SELECT * FROM SESSION(bids, ts, 10)", SqlSyntaxError, "SESSION expects INTERVAL sizes"),
    ("SELECT * FROM SESSION(bids, price, INTERVAL '1' SECOND)", Exception,
     "the time column bids.price must be a TIMESTAMP, not BIGINT"),
    ("SELECT * FROM SESSION(bids, ts, INTERVAL '0' SECOND)", Exception, "window sizes must be positive"),
    ("SELECT * FROM SESSION(bids, ts, INTERVAL '1' SECOND, nope)", Exception, "SESSION: bids has no column nope"),
    ("SELECT * FROM SESSION(bids, ts, INTERVAL '1' SECOND, bidder, bidder)", Exception, "names a key column twice"),
    ("SELECT * FROM SESSION(bids, ts, INTERVAL '1' SECOND, bidder + 1)", SqlSyntaxError,
     "SESSION key columns must be columns of bids"),
    ("SELECT * FROM SESSION(w, ts, INTERVAL '1' SECOND)", Exception, "adds a column window_start, which w already"),
    ("SELECT * FROM SESSION(nope, ts, INTERVAL '1' SECOND)", Exception, "relation nope does not exist"),
])
def test_bad_session_calls_are_refused(body, error, message):
    assert_window_call_refused(BIDS, body, error, message)


def test_session_is_still_a_keyword_elsewhere():
    db = ivm.connect()
    db.execute("CREATE TABLE t (session BIGINT)")  # a column named session, not a call
    db.execute("INSERT INTO t VALUES (1)")
    assert db.sql("SELECT session FROM t").to_pylist() == [{"session": 1}]
    assert db.sql("SELECT 'SESSION(' AS s").to_pylist() == [{"s": "SESSION("}]


# --- sliding windows: RANGE frames over a stream ----------------------------------------------------------

def test_sliding_range_frames_over_a_stream_equal_batch():
    """``OVER (PARTITION BY k ORDER BY ts RANGE BETWEEN INTERVAL … PRECEDING AND CURRENT ROW)``: the window
    operator recomputes the partitions a batch touches (all of a key's rows: not bounded by the lateness)."""
    play_fresh(31, 8, read_views(FIXTURES / "sliding_views.sql"), reference_sql)


def test_events_tied_on_time_are_in_one_session():
    """Distinct rows with the same ts (the generator's millisecond clock makes many): whichever of them the
    batch SQL orders first, all get the same session (the bench caught a ROWS frame splitting them)."""
    db = ivm.connect()
    db.execute(BIDS)
    db.execute(f"CREATE MATERIALIZED VIEW s AS {PER_BIDDER}")
    tied = [(1, price, 20) for price in range(40)] + [(1, price, 35) for price in range(40)]
    db.apply_changes("bids", bids((1, 0, 0), *tied))
    db.apply_changes("bids", bids(*[(1, p, 44.5) for p in range(30)], *[(2, p, 50) for p in range(30)]))
    assert sessions(db, "s") == [(1, 0, 10, 1), (1, 20, 30, 40), (1, 35, 54.5, 70), (2, 50, 60, 30)]
    schema = db._engine.catalog.schema()
    for sql in (PER_BIDDER, reference_sql(PER_BIDDER, schema)):  # the batch expansion and the reference agree
        assert sorted(map(repr, db.sql(sql).to_pylist())) == sorted(map(repr, db.sql("SELECT * FROM s").to_pylist()))


SHAPES = {
    "over_view": "SELECT u, window_start, COUNT(*) AS n FROM SESSION(base, ts, INTERVAL '10' SECOND, u) "
                 "GROUP BY u, window_start",
    "in_cte": "WITH s AS (SELECT * FROM SESSION(c, ts, INTERVAL '10' SECOND, u)) "
              "SELECT u, window_end, COUNT(*) AS n FROM s GROUP BY u, window_end",
    "two_sessions_joined": "SELECT a.u, a.window_start, b.window_start AS other "
                           "FROM SESSION(c, ts, INTERVAL '10' SECOND, u) a "
                           "JOIN SESSION(c, ts, INTERVAL '5' SECOND, u) b ON a.u = b.u AND a.ts = b.ts",
    "unaliased": "SELECT c.u, c.window_end FROM SESSION(c, ts, INTERVAL '3' SECOND) WHERE c.u IS NOT NULL",
}


def test_session_over_a_view_in_a_cte_and_twice_in_a_join():
    """SESSION over an upstream view, inside a CTE, two sessions of one table joined, the table's own name as
    alias; inserts and deletes of an ordinary table; each view equals its SELECT run ad hoc after every batch."""
    import random

    db = ivm.connect()
    db.execute("CREATE TABLE c (u INT, ts TIMESTAMP)")
    db.execute("CREATE MATERIALIZED VIEW base AS SELECT u, ts FROM c WHERE u > 0")
    for name, sql in SHAPES.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    rng = random.Random(1)
    for step in range(6):
        values = ", ".join(f"({rng.randint(-1, 3)}, TIMESTAMP '{at(rng.uniform(0, 60))}')" for _ in range(8))
        db.execute(f"INSERT INTO c VALUES {values}, (NULL, TIMESTAMP '{at(step)}')")
        if step % 2:
            db.execute("DELETE FROM c WHERE u = 2 AND ts < (SELECT MAX(ts) FROM c WHERE u = 2)")
        for name, sql in SHAPES.items():
            got = sorted(map(repr, db.sql(f"SELECT * FROM {name}").to_pylist()))
            assert got == sorted(map(repr, db.sql(sql).to_pylist())), (name, step)


def test_explain_shows_the_session_operator_and_its_state():
    db = ivm.connect()
    db.execute(BIDS)
    db.execute(f"CREATE MATERIALIZED VIEW s AS {PER_BIDDER}")
    text = "\n".join(r["explain"] for r in db.sql("EXPLAIN s").to_pylist())
    assert "Session by bidder over ts, gap 10 s" in text
    assert "incremental per session: recomputes only the sessions of a key a changed row meets" in text
    assert "state s.session1: input rows with their session bounds, indexed by (bidder)" in text
    assert "lookup s.session1 by (bidder)" in text and "[reads all of" not in text


def test_raw_events_joined_with_their_own_closed_sessions_keep_every_row():
    """Closed sessions drop only the session operator's own rows, which no later event can touch (its
    ts >= W >= their window_end); the per-session counts a raw event joins stay. After every batch
    (sessions of both bidders close between bursts) the join equals DuckDB."""
    import duckdb

    from sql_frontend.statements import parse_query
    from sql_frontend.time_windows import expand_time_windows
    from tests.oracle.compare import multiset_diff

    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE b (bidder BIGINT, price BIGINT, ts TIMESTAMP, "
               "WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) APPEND ONLY")
    query = ("SELECT r.bidder, r.price, s.n, s.window_start FROM b r JOIN "
             "(SELECT bidder, window_start, window_end, COUNT(*) AS n FROM SESSION(b, ts, INTERVAL '2' SECOND, bidder) "
             "GROUP BY bidder, window_start, window_end) s ON r.bidder = s.bidder")
    db.execute(f"CREATE MATERIALIZED VIEW v AS {query}")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE b (bidder BIGINT, price BIGINT, ts TIMESTAMP)")
    expected = expand_time_windows(parse_query(query), db._engine.catalog.schema()).sql("duckdb")
    rng, t0 = np.random.default_rng(1), datetime(2024, 1, 1)
    for burst in range(12):  # bursts 3 s apart, 1.5 s long: each burst's sessions close before the next
        ts = [t0 + timedelta(seconds=3 * burst + float(x)) for x in rng.uniform(0, 1.5, 4)]
        data = pa.table({"bidder": pa.array(rng.integers(1, 3, 4), pa.int64()),  # noqa: F841 (read by DuckDB)
                         "price": pa.array(rng.integers(0, 9, 4), pa.int64()), "ts": pa.array(ts, pa.timestamp("us"))})
        db.apply_changes("b", data)
        ref.execute("INSERT INTO b SELECT * FROM data")
        assert multiset_diff(db.sql("SELECT * FROM v"), ref.sql(expected).to_arrow_table()) is None, burst
    assert db.sql("SELECT COUNT(DISTINCT window_start) AS n FROM v").to_pylist()[0]["n"] >= 12  # sessions closed
    snapshot = db._engine.store.snapshot
    sessions = [s.name for s in db._engine.catalog.views["v"].states if ".session" in s.name]
    assert sessions and snapshot[sessions[0]].num_rows < 12  # of 48 events: closed sessions' rows went
