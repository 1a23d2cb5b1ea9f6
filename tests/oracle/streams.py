"""An oracle for event streams: windowed views against DuckDB over the events that count.

The stream has out-of-order events (within the lateness), stragglers (below
the watermark when they arrive) and an ordinary table that changes beside
it. After every batch, each view with ``late = 'drop'`` must equal DuckDB
evaluating its SELECT (TUMBLE/HOP expanded as the planner does) over the
events that were on time when they arrived, each view with ``late =
'correct'`` the same SELECT over all events, and each view with ``emit =
'on_close'`` (views with a window_end column) the drop result restricted to
windows whose end the watermark has reached.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import duckdb
import pyarrow as pa

import ivm
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows
from tests.oracle.compare import multiset_diff
from tests.oracle.fixtures import FIXTURES, read_views

LATENESS = 5.0  # seconds, as in the schema below
SCHEMA = [
    "CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP, "
    "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY",
    "CREATE TABLE auctions (id BIGINT PRIMARY KEY, category VARCHAR)",
]
REF_SCHEMA = ["CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP)",
              "CREATE TABLE auctions (id BIGINT PRIMARY KEY, category VARCHAR)"]
T0 = datetime(2024, 1, 1)
BID_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("ts", pa.timestamp("us"))])


def stream_views():
    return read_views(FIXTURES / "event_time_views.sql")


class StreamModel:
    """Events split into on time and late as the engine judges them (per batch, watermark before it)."""

    def __init__(self) -> None:
        self.all: list[tuple] = []
        self.on_time: list[tuple] = []
        self.max_ts: datetime | None = None
        self.auctions: dict[int, str] = {}

    def watermark(self) -> datetime | None:
        return None if self.max_ts is None else self.max_ts - timedelta(seconds=LATENESS)

    def add(self, events: list[tuple]) -> None:
        mark = self.watermark()
        self.all.extend(events)
        self.on_time.extend(e for e in events if mark is None or e[3] >= mark)
        top = max(e[3] for e in events)
        self.max_ts = top if self.max_ts is None else max(self.max_ts, top)


def bid_batch(rng: random.Random, model: StreamModel, clock: float, size: int) -> list[tuple]:
    """Events around ``clock`` seconds: mostly a little out of order, some far behind (late)."""
    events = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.15:
            at = clock - rng.uniform(6, 40)  # a straggler (late once the watermark passed it)
        else:
            at = clock - rng.uniform(0, 4.5)  # out of order within the lateness
        ts = T0 + timedelta(microseconds=int(max(at, 0) * 1e6))
        price = rng.choice([1, 5, 10, 11, 20, 20, 35, rng.randint(0, 50)])
        events.append((rng.randint(1, 6), rng.randint(1, 4), price, ts))
    return events


def auction_ops(rng: random.Random, model: StreamModel) -> pa.Table:
    rows, ops = [], []
    for _ in range(rng.randint(1, 3)):
        key = rng.randint(1, 6)
        if key in model.auctions and rng.random() < 0.3:
            rows.append((key, None))
            ops.append("d")
            del model.auctions[key]
        else:
            category = rng.choice(["art", "books", "cars"])
            rows.append((key, category))
            ops.append("r")
            model.auctions[key] = category
    return pa.table({"id": [r[0] for r in rows], "category": [r[1] for r in rows], "__op": ops})


class StreamHarness:
    def __init__(self, db: ivm.Database | None = None, views=None, reference=None):
        self.db = db or ivm.connect()
        self.refs = {"drop": duckdb.connect(), "correct": duckdb.connect()}
        self.model = StreamModel()
        for statement in SCHEMA:
            self.db.execute(statement)
        for ref in self.refs.values():
            for statement in REF_SCHEMA:
                ref.execute(statement)
        self.views = views if views is not None else stream_views()
        self.expected_sql = {}
        schema = self.db._engine.catalog.schema()
        for view in self.views:
            expanded = (reference(view.sql, schema) if reference is not None
                        else expand_time_windows(parse_query(view.sql), schema).sql("duckdb"))
            for policy in ("drop", "correct", "closed"):
                if policy == "closed" and "window_end" not in [c.name for c in self.db.sql(
                        f"SELECT * FROM ({expanded}) LIMIT 0").schema]:
                    continue  # emit = 'on_close' needs a window_end column
                name = f"{view.name}_{policy}"
                option = {"drop": "", "correct": " WITH (late = 'correct')",
                          "closed": " WITH (emit = 'on_close')"}[policy]
                self.db.execute(f"CREATE MATERIALIZED VIEW {name}{option} AS {view.sql}")
                self.expected_sql[name] = (policy, expanded)

    def close(self) -> None:
        self.db.close()
        for ref in self.refs.values():
            ref.close()

    def bids(self, events: list[tuple]) -> None:
        self.db.apply_changes("bids", pa.Table.from_pylist(
            [dict(zip(BID_SCHEMA.names, e)) for e in events], schema=BID_SCHEMA))
        self.model.add(events)
        for policy, rows in (("drop", self.model.on_time), ("correct", self.model.all)):
            data = pa.Table.from_pylist([dict(zip(BID_SCHEMA.names, e)) for e in rows], schema=BID_SCHEMA)  # noqa: F841
            ref = self.refs[policy]
            ref.execute("DELETE FROM bids")
            ref.execute("INSERT INTO bids SELECT * FROM data")

    def auctions(self, batch: pa.Table) -> None:
        self.db.apply_changes("auctions", batch)
        data = pa.table({"id": list(self.model.auctions), "category": list(self.model.auctions.values())})  # noqa: F841
        for ref in self.refs.values():
            ref.execute("DELETE FROM auctions")
            ref.execute("INSERT INTO auctions SELECT * FROM data")

    def check(self, context: str = "") -> None:
        problems = []
        mark = self.model.watermark()
        for name, (policy, sql) in self.expected_sql.items():
            if policy == "closed":  # only windows the watermark has passed the end of
                bound = "NULL" if mark is None else f"TIMESTAMP '{mark.isoformat(sep=' ')}'"
                sql, policy = f"SELECT * FROM ({sql}) WHERE window_end <= {bound}", "drop"
            diff = multiset_diff(self.db.sql(f"SELECT * FROM {name}"), self.refs[policy].sql(sql).to_arrow_table())
            if diff:
                problems.append(f"view {name}: {diff}")
        late = len(self.model.all) - len(self.model.on_time)
        got = self.db.status()["streams"]["bids"]
        if got["late_events"] != late:
            problems.append(f"late_events {got['late_events']} != {late}")
        if problems:
            raise AssertionError(f"{context}\n" + "\n".join(problems))


def play(seed: int, batches: int, harness: StreamHarness) -> None:
    rng = random.Random(seed)
    clock = 0.0
    for step in range(batches):
        if rng.random() < 0.25:
            harness.auctions(auction_ops(rng, harness.model))
        else:
            clock += rng.uniform(0, 8)
            harness.bids(bid_batch(rng, harness.model, clock, rng.randint(1, 12)))
        harness.check(f"seed {seed}, after batch {step}")


def play_fresh(seed: int, batches: int, views=None, reference=None) -> None:
    """``play`` on a new in-memory database and references, closed afterwards."""
    harness = StreamHarness(views=views, reference=reference)
    try:
        play(seed, batches, harness)
    finally:
        harness.close()


def assert_window_call_refused(bids_ddl: str, body: str, error: type, message: str) -> None:
    """A bad TUMBLE/HOP/SESSION call is refused with ``message`` in CREATE and in an ad-hoc read; nothing is created."""
    import pytest

    db = ivm.connect()
    db.execute(bids_ddl)
    db.execute("CREATE TABLE w (window_start TIMESTAMP, ts TIMESTAMP)")  # a table that already has window_start
    with pytest.raises(error, match=message):
        db.execute(f"CREATE MATERIALIZED VIEW v AS {body}")
    with pytest.raises(error, match=message):
        db.sql(body)  # ad-hoc reads expand windows the same way
    assert [r["name"] for r in db.sql("SHOW TABLES").to_pylist()] == ["bids", "w"]
