"""Nexmark q8 (issue 8): two streams grouped by the same tumbling window and joined, against DuckDB."""

from __future__ import annotations

import duckdb

import ivm
from bench import nexmark_q8
from tests.oracle.compare import multiset_diff


def test_nexmark_q8_over_the_generator():
    db, ref = ivm.connect(), duckdb.connect()
    reference = nexmark_q8.setup(db, ref)
    for first in range(0, 60_000, 15_000):  # 4 batches, 2,000 events per second of event time: 30 s
        nexmark_q8.feed(db, ref, 15_000, first, rate=2_000)
        assert multiset_diff(db.sql("SELECT * FROM q8"), ref.sql(reference).to_arrow_table()) is None, first
    rows = db.sql("SELECT COUNT(*) AS n, COUNT(DISTINCT starttime) AS windows FROM q8").to_pylist()[0]
    assert rows["n"] > 0 and rows["windows"] == 3  # new sellers in each of the three 10 s windows
    assert db.status()["streams"]["person"]["late_events"] == 0  # the generator's events are in order
