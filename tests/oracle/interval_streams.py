"""An oracle for interval joins of two event streams (ivm/streams/interval_join.py).

Two watermarked APPEND ONLY streams (searches, lateness 5 s; clicks,
lateness 3 s) get batches in turn, with out-of-order events (within the
lateness), stragglers (below the watermark when they arrive) and duplicate
events. After every batch each view must equal DuckDB evaluating its
SELECT over the events that were on time when they arrived (late = 'drop'),
while the engine lets go of stored on-time rows the joins can no longer
match: the harness also reports how many rows the streams keep.
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

LATENESS = {"searches": 5.0, "clicks": 3.0}
SCHEMA = [
    "CREATE TABLE searches (user_id BIGINT, query VARCHAR, ts TIMESTAMP, "
    "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY",
    "CREATE TABLE clicks (user_id BIGINT, url VARCHAR, ts TIMESTAMP, "
    "WATERMARK FOR ts AS ts - INTERVAL '3' SECOND) APPEND ONLY",
]
REF_SCHEMA = ["CREATE TABLE searches (user_id BIGINT, query VARCHAR, ts TIMESTAMP)",
              "CREATE TABLE clicks (user_id BIGINT, url VARCHAR, ts TIMESTAMP)"]
COLUMNS = {"searches": ("user_id", "query", "ts"), "clicks": ("user_id", "url", "ts")}
T0 = datetime(2024, 1, 1)


def interval_views():
    return read_views(FIXTURES / "interval_join_views.sql")


class TwoStreams:
    """Each stream's events split into on time and late as the engine judges them."""

    def __init__(self) -> None:
        self.on_time = {s: [] for s in COLUMNS}
        self.late = {s: 0 for s in COLUMNS}
        self.max_ts: dict[str, datetime] = {}

    def watermark(self, stream: str) -> datetime | None:
        top = self.max_ts.get(stream)
        return None if top is None else top - timedelta(seconds=LATENESS[stream])

    def add(self, stream: str, events: list[tuple]) -> None:
        mark = self.watermark(stream)
        kept = [e for e in events if mark is None or e[2] >= mark]
        self.on_time[stream].extend(kept)
        self.late[stream] += len(events) - len(kept)
        top = max(e[2] for e in events)
        self.max_ts[stream] = max(self.max_ts.get(stream, top), top)


def events(rng: random.Random, stream: str, clock: float, size: int) -> list[tuple]:
    out = []
    for _ in range(size):
        if rng.random() < 0.15:
            at = clock - rng.uniform(6, 30)  # a straggler
        else:
            at = clock - rng.uniform(0, LATENESS[stream] - 0.5)  # out of order within the lateness
        ts = T0 + timedelta(microseconds=int(max(at, 0) * 1e6))
        word = rng.choice(["q1", "q2", "q3"]) if stream == "searches" else rng.choice(["/a", "/b"])
        out.append((rng.randint(1, 4), word, ts))
        if rng.random() < 0.1:
            out.append(out[-1])  # a duplicate event
    return out


class IntervalHarness:
    def __init__(self, db: ivm.Database | None = None, views=None, create: bool = True, retain: str = ""):
        self.db = db or ivm.connect()
        self.ref = duckdb.connect()
        self.model = TwoStreams()
        self.views = views if views is not None else interval_views()
        if create:
            for statement in SCHEMA:  # RETAIN: the tables keep recent rows only (views read on-time rows)
                self.db.execute(statement + (f" RETAIN INTERVAL '{retain}' SECOND" if retain else ""))
            for view in self.views:
                self.db.execute(f"CREATE MATERIALIZED VIEW {view.name} AS {view.sql}")
        for statement in REF_SCHEMA:
            self.ref.execute(statement)
        schema = self.db._engine.catalog.schema()
        self.expected = {v.name: expand_time_windows(parse_query(v.sql), schema).sql("duckdb") for v in self.views}

    def close(self) -> None:
        self.db.close()
        self.ref.close()

    def send(self, stream: str, batch: list[tuple]) -> None:
        names = COLUMNS[stream]
        self.db.apply_changes(stream, pa.table({n: [e[i] for e in batch] for i, n in enumerate(names)}))
        self.model.add(stream, batch)
        data = pa.table({n: pa.array([e[i] for e in self.model.on_time[stream]],  # noqa: F841
                                     pa.timestamp("us") if n == "ts" else None)
                         for i, n in enumerate(names)})
        self.ref.execute(f"DELETE FROM {stream}")
        self.ref.execute(f"INSERT INTO {stream} SELECT * FROM data")

    def kept(self) -> dict[str, int]:
        """Stored on-time rows per stream (what the joins keep)."""
        snapshot = self.db._engine.store.snapshot
        return {s: snapshot[f"__ontime_{s}"].table().num_rows for s in COLUMNS}

    def check(self, context: str = "") -> None:
        problems = []
        for name, sql in self.expected.items():
            diff = multiset_diff(self.db.sql(f"SELECT * FROM {name}"), self.ref.sql(sql).to_arrow_table())
            if diff:
                problems.append(f"view {name}: {diff}")
        for stream in COLUMNS:
            got = self.db.status()["streams"][stream]["late_events"]
            if got != self.model.late[stream]:
                problems.append(f"{stream}: late_events {got} != {self.model.late[stream]}")
        if problems:
            raise AssertionError(f"{context}\n" + "\n".join(problems))


def play(seed: int, batches: int, harness: IntervalHarness, start: float = 0.0) -> float:
    """Batches of either stream, the clock moving on; checked after each. Returns the clock."""
    rng = random.Random(seed)
    clock = start
    for step in range(batches):
        clock += rng.uniform(0, 3)
        stream = rng.choice(list(COLUMNS))
        harness.send(stream, events(rng, stream, clock, rng.randint(1, 10)))
        harness.check(f"seed {seed}, after batch {step} ({stream})")
    return clock
