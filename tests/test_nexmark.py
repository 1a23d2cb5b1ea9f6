"""Nexmark q5 (hopping windows), q8 (tumbling join) and q11 (session windows) over the generator, against DuckDB.

The queries are bench/nexmark_queries.py's (the registry ``ivm bench nexmark`` runs). After every batch
each view equals DuckDB evaluating its SELECT over the same events; q11 is checked against both the
engine's batch expansion of SESSION and an independent definition (tests/oracle/sessions.py).
"""

from __future__ import annotations

import duckdb
import pytest

import ivm
from bench import nexmark
from bench.nexmark_queries import GENERATED, QUERIES, reference_ddl, reference_sql, stream_ddl
from tests.oracle.compare import multiset_diff
from tests.oracle.sessions import reference_sql as sessions_reference


def _run(names, events, batch, rate):
    db, ref = ivm.connect(), duckdb.connect()
    tables = [t for t in GENERATED if any(t in QUERIES[n].tables for n in names)]
    for table in tables:
        db.execute(stream_ddl(table))
        ref.execute(reference_ddl(table))
    for name in names:
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {QUERIES[name].sql}")
    schema = db._engine.catalog.schema()
    expected = {name: [reference_sql(QUERIES[name], schema)] for name in names}
    if "q11" in names:
        expected["q11"].append(sessions_reference(QUERIES["q11"].sql, schema))
    for first in range(0, events, batch):
        generated = dict(zip(GENERATED, nexmark.generate(batch, first_event=first, rate=rate)))
        for table in tables:
            data = generated[table]  # noqa: F841 (read by DuckDB's replacement scan)
            db.apply_changes(table, data)
            ref.execute(f"INSERT INTO {table} SELECT * FROM data")
        for name, queries in expected.items():
            got = db.sql(f"SELECT * FROM {name}")
            for sql in queries:
                assert multiset_diff(got, ref.sql(sql).to_arrow_table()) is None, (name, first, sql)
    return db


def test_nexmark_q5_hot_items_over_the_generator():
    db = _run(["q5"], 40_000, 10_000, 2_000)  # 20 s of events: windows open, close and slide
    assert db.sql("SELECT COUNT(*) AS n FROM q5").to_pylist()[0]["n"] >= 10


def test_nexmark_q11_user_sessions_over_the_generator():
    db = _run(["q11"], 40_000, 10_000, 1_000)  # 40 s: sessions of the active bidders open and close
    sessions = db.sql("SELECT COUNT(*) AS n, COUNT(DISTINCT bidder) AS bidders, MAX(bid_count) AS top "
                      "FROM q11").to_pylist()[0]
    assert sessions["n"] > sessions["bidders"] > 100 and sessions["top"] > 100  # hot bidders bid a lot


def test_nexmark_q8_new_users_over_the_generator():
    db = _run(["q8"], 60_000, 15_000, 2_000)  # 30 s of events: three 10 s windows
    rows = db.sql("SELECT COUNT(*) AS n, COUNT(DISTINCT starttime) AS windows FROM q8").to_pylist()[0]
    assert rows["n"] > 0 and rows["windows"] == 3  # new sellers in each of the three windows
    assert db.status()["streams"]["person"]["late_events"] == 0  # the generator's events are in order


def test_the_registry_names_the_published_queries():
    assert {"q5", "q7", "q8", "q11"} <= set(QUERIES)
    for query in QUERIES.values():
        assert set(query.tables) <= {"person", "auction", "bid"}, query.name
