"""SUBSCRIBE over Flight SQL (the ADBC driver): a statement whose result stream stays open.

The same rows as pgwire's SUBSCRIBE (mz_timestamp, [mz_progressed,] mz_diff,
columns), of a view or a table; reading the stream blocks for the next
batch; closing the cursor ends it on the server. Also: a table over the
plain-Flight subscription ticket.
"""

from __future__ import annotations

import json
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import run_script
from tests.flight.server import ServerProcess
from tests.flight.test_metrics import open_streams, open_streams_once_closed
from tests.integrate import Integrator
from tests.oracle.compare import multiset_diff

WAIT = 20  # seconds for anything expected


@pytest.fixture(scope="module")
def server():
    """This module's server also serves metrics: ``ivm_subscriptions_open`` says what streams are open."""
    with ServerProcess("--metrics-port", "0") as process:
        yield process


@pytest.fixture(scope="module")
def data(server):
    run_script(server.uri, "CREATE TABLE q_orders (id BIGINT PRIMARY KEY, cust BIGINT, amount BIGINT);"
               "CREATE MATERIALIZED VIEW q_totals AS SELECT cust, SUM(amount) AS total FROM q_orders GROUP BY cust;"
               "INSERT INTO q_orders VALUES (1, 7, 10), (2, 8, 3)")
    return server


def as_changes(rows: pa.Table) -> pa.Table:
    """SUBSCRIBE rows as changefeed rows (no progress rows): what tests.integrate sums."""
    if "mz_progressed" in rows.column_names:
        rows = rows.filter(pc.invert(rows.column("mz_progressed"))).drop_columns(["mz_progressed"])
    rows = rows.rename_columns(["__offset", "__weight", *rows.column_names[2:]])
    return rows.select([*rows.column_names[2:], "__weight", "__offset"])


def read_until(reader: pa.RecordBatchReader, done) -> pa.Table:
    """Batches (heartbeats are empty ones) until ``done(rows so far)``."""
    batches, deadline = [], time.monotonic() + WAIT
    while time.monotonic() < deadline:
        batches.append(reader.read_next_batch())
        rows = pa.Table.from_batches(batches, reader.schema)
        if done(rows):
            return rows
    raise AssertionError(f"not done after {WAIT} s: {pa.Table.from_batches(batches, reader.schema).to_pylist()}")


def progressed_to(offset: int):
    return lambda rows: any(r["mz_progressed"] and r["mz_timestamp"] >= offset for r in rows.to_pylist())


def test_live_changes_of_a_view_then_close_frees_the_server(data, conn, cur):
    assert open_streams(data) == 0
    sub = conn.cursor()
    sub.execute("SUBSCRIBE TO q_totals")
    assert [d[0] for d in sub.description] == ["mz_timestamp", "mz_diff", "cust", "total"]
    reader = sub.fetch_record_batch()
    snapshot = read_until(reader, lambda rows: rows.num_rows == 2)
    assert sorted(snapshot.select(["mz_diff", "cust", "total"]).to_pylist(), key=lambda r: r["cust"]) == [
        {"mz_diff": 1, "cust": 7, "total": 10}, {"mz_diff": 1, "cust": 8, "total": 3}]
    cur.execute("INSERT INTO q_orders VALUES (3, 7, 5)")
    offset = data_offset(cur)
    changes = read_until(reader, lambda rows: rows.num_rows == 2)
    assert sorted(changes.to_pylist(), key=lambda r: r["mz_diff"]) == [
        {"mz_timestamp": offset, "mz_diff": -1, "cust": 7, "total": 10},
        {"mz_timestamp": offset, "mz_diff": 1, "cust": 7, "total": 15}]
    assert open_streams(data) == 1  # the stream is open on the server ...
    sub.close()
    assert open_streams_once_closed(data, WAIT) == 0  # ... until its next heartbeat finds the client gone
    cur.execute("SELECT total FROM q_totals WHERE cust = 7")
    assert cur.fetchall() == [(15,)]


def data_offset(cur) -> int:
    """The latest offset (a read's ``ivm.offset``)."""
    cur.execute("SELECT * FROM q_orders")
    return int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])


def test_a_table_resumed_as_of_an_offset_integrates_to_it(data, conn, cur):
    cur.execute("SELECT * FROM q_orders")
    start_rows = cur.fetch_arrow_table()
    since = int(start_rows.schema.metadata[b"ivm.offset"])
    cur.execute("INSERT INTO q_orders VALUES (10, 1, 1), (11, 2, 2)")
    cur.execute("UPDATE q_orders SET amount = amount + 100 WHERE id IN (1, 10)")
    cur.execute("DELETE FROM q_orders WHERE id = 11")
    latest = data_offset(cur)
    with conn.cursor() as sub:
        sub.execute(f"SUBSCRIBE q_orders AS OF {since} WITH (PROGRESS)")
        rows = read_until(sub.fetch_record_batch(), progressed_to(latest))
    first = rows.slice(0, 1).to_pylist()[0]
    assert first["mz_progressed"] and first["mz_timestamp"] == since  # no snapshot: progress from `since` on
    changes = as_changes(rows)
    assert set(changes.column("__offset").to_pylist()) == {since + 1, since + 2, since + 3}
    update = [r for r in changes.to_pylist() if r["__offset"] == since + 2]
    assert sorted((r["id"], r["amount"], r["__weight"]) for r in update) == [
        (1, 10, -1), (1, 110, 1), (10, 1, -1), (10, 101, 1)]  # an update is -old/+new
    consumer = Integrator()
    n = start_rows.num_rows
    consumer.add(start_rows.append_column("__weight", pa.repeat(pa.scalar(1, pa.int64()), n))
                 .append_column("__offset", pa.repeat(pa.scalar(since, pa.int64()), n)))
    consumer.add(changes)
    cur.execute("SELECT * FROM q_orders")
    current = cur.fetch_arrow_table()
    assert multiset_diff(consumer.table(current.schema), current) is None


def test_errors_are_the_statements(data, cur):
    with pytest.raises(flight_sql.ProgrammingError, match="NOT_FOUND.*table or view nope does not exist"):
        cur.execute("SUBSCRIBE TO nope")
    with pytest.raises(flight_sql.ProgrammingError, match="INVALID_ARGUMENT.*offset 99999 is ahead"):
        cur.execute("SUBSCRIBE TO q_totals AS OF 99999")
    with pytest.raises(flight_sql.ProgrammingError, match="INVALID_ARGUMENT.*option 'color' is not known"):
        cur.execute("SUBSCRIBE TO q_totals WITH (COLOR)")
    run_script(data.uri, "CREATE TABLE q_altered (id BIGINT PRIMARY KEY); INSERT INTO q_altered VALUES (1)")
    since = data_offset(cur)
    run_script(data.uri, "ALTER TABLE q_altered ADD COLUMN note VARCHAR")  # its earlier changes had other columns
    with pytest.raises(flight_sql.ProgrammingError, match="INVALID_ARGUMENT.*changes of q_altered after offset "
                                                           f"{since - 1} are no longer retained.*read q_altered again"):
        cur.execute(f"SUBSCRIBE q_altered AS OF {since - 1}")
    cur.execute("SELECT COUNT(*) FROM q_altered")
    assert cur.fetchall() == [(1,)]


def test_a_table_over_the_plain_flight_ticket(data, cur):
    since = data_offset(cur)
    cur.execute("INSERT INTO q_orders VALUES (20, 3, 30)")
    cur.execute("DELETE FROM q_orders WHERE id = 20")
    with fl.connect(data.uri) as client:
        ticket = {"subscribe": "q_orders", "from": since, "until": since + 2}
        rows = client.do_get(fl.Ticket(json.dumps(ticket).encode())).read_all()
    assert rows.to_pylist() == [{"id": 20, "cust": 3, "amount": 30, "__weight": 1, "__offset": since + 1},
                                {"id": 20, "cust": 3, "amount": 30, "__weight": -1, "__offset": since + 2}]
