"""Change subscriptions over plain Flight (acceptance 2).

A consumer reads a view's change stream from offset 0 while changes commit,
disconnects, resumes from the last offset it saw, and its integrated result
equals the view. Also: starting from the view's current rows, live delivery
and heartbeats, and stopping at an offset.
"""

from __future__ import annotations

import json
import random
import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import DURABILITY, run_script
from tests.flight.test_sql import cdc_batch
from tests.integrate import Integrator
from tests.oracle.compare import multiset_diff

VIEWS = {
    "by_cust": "SELECT cust, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS top FROM orders GROUP BY cust",
    "open_by_region": "SELECT c.region, o.id, o.amount FROM orders o JOIN customers c ON o.cust = c.id "
                      "WHERE o.status = 'open'",
}

pytestmark = DURABILITY  # every test in memory and with --data


@pytest.fixture(scope="module")
def data(server):
    run_script(server.uri, "CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR);"
               "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, status VARCHAR);"
               "INSERT INTO customers VALUES (1, 'n'), (2, 's'), (3, 'e'), (4, 'w'), (5, 'n'), (6, NULL);"
               + "".join(f"CREATE MATERIALIZED VIEW {name} AS {sql};" for name, sql in VIEWS.items()))
    return server


def subscribe(client: fl.FlightClient, **ticket) -> fl.FlightStreamReader:
    return client.do_get(fl.Ticket(json.dumps(ticket).encode()))


def consume(reader: fl.FlightStreamReader, consumer: Integrator, stop_at: int) -> int:
    """Integrate chunks until the stream says it is complete through ``stop_at``."""
    through = -1
    while through < stop_at:
        chunk = reader.read_chunk()
        consumer.add(pa.Table.from_batches([chunk.data]))
        through = json.loads(chunk.app_metadata.to_pybytes())["through"]
    return through


def write_batches(uri: str, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    live: dict[int, float] = {}
    next_id = seed * 1_000_000
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for _ in range(count):
            batch, next_id = cdc_batch(rng, live, next_id, rng.choice([1, 5, 40]))
            cur.adbc_ingest("orders", batch, mode="append")
            time.sleep(0.01)
        cur.execute("SELECT 1")
        return [int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])]


def read_view(uri: str, view: str) -> pa.Table:
    with fl.connect(uri) as client:
        info = client.get_flight_info(fl.FlightDescriptor.for_path(view))
        return client.do_get(info.endpoints[0].ticket).read_all()


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_resume_after_disconnect_integrates_to_the_view(data, view):
    seed = 1 + sorted(VIEWS).index(view)
    consumer = Integrator()
    writer_result: list[int] = []
    writer = threading.Thread(target=lambda: writer_result.extend(write_batches(data.uri, 40, seed)))
    writer.start()
    try:
        # First connection: from offset 0 until a few batches have committed.
        with fl.connect(data.uri) as client:
            reader = subscribe(client, subscribe=view, **{"from": 0}, heartbeat=0.1)
            time.sleep(0.3)
            first_stop = consume(reader, consumer, stop_at=0)
            reader.cancel()
        last = max(first_stop, consumer.last_offset)
    finally:
        writer.join(120)
    final = writer_result[0]
    assert last < final, "the consumer should disconnect before the writer is done"
    # Second connection: resume from the last offset seen, until the final offset.
    with fl.connect(data.uri) as client:
        reader = subscribe(client, subscribe=view, **{"from": last, "until": final})
        rest = reader.read_all()
    assert rest.num_rows == 0 or min(rest.column("__offset").to_pylist()) > last
    consumer.add(rest)
    current = read_view(data.uri, view)
    assert int(current.schema.metadata[b"ivm.offset"]) == final
    assert not consumer.negative()
    diff = multiset_diff(consumer.table(current.schema), current)
    assert diff is None, diff


def test_from_the_current_rows_then_live(data, client):
    reader = subscribe(client, subscribe="by_cust", heartbeat=0.1)
    start = reader.read_chunk()
    state = Integrator()
    state.add(pa.Table.from_batches([start.data]))
    through = json.loads(start.app_metadata.to_pybytes())["through"]
    assert start.data.schema.names == ["cust", "n", "total", "top", "__weight", "__offset"]
    assert start.data.schema.field("__weight").type == pa.int64()
    # A change commits; the open stream delivers it without a new request.
    with flight_sql.connect(data.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO orders VALUES (987654321, 6, 1234.5, 'open')")
        cur.execute("SELECT * FROM by_cust")
        expected = cur.fetch_arrow_table()
    offset = int(expected.schema.metadata[b"ivm.offset"])
    consume(reader, state, stop_at=offset)
    reader.cancel()
    assert through < offset
    assert multiset_diff(state.table(expected.schema), expected) is None


def test_heartbeats_report_progress_when_the_view_is_quiet(data, client):
    with flight_sql.connect(data.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO customers VALUES (99, 'z')")  # no order references customer 99
        cur.execute("SELECT * FROM by_cust")
        offset = int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])
    reader = subscribe(client, subscribe="by_cust", heartbeat=0.05, **{"from": offset - 1})
    chunk = reader.read_chunk()
    assert chunk.data.num_rows == 0
    assert json.loads(chunk.app_metadata.to_pybytes())["through"] >= offset
    reader.cancel()


def test_bad_subscriptions(data, client):
    with pytest.raises(KeyError, match="no_such_view"):
        subscribe(client, subscribe="no_such_view", **{"from": 0}).read_all()
    # (A table is subscribable: tests/flight/test_sql_subscribe.py.)
    with pytest.raises(pa.ArrowInvalid, match='"from" must be an offset'):
        subscribe(client, subscribe="by_cust", **{"from": -3}).read_all()
    with pytest.raises(pa.ArrowInvalid, match='"until" \\(2\\) is before "from" \\(5\\)'):
        subscribe(client, subscribe="by_cust", **{"from": 5, "until": 2}).read_all()


def test_until_ends_exactly_at_its_offset(data, client):
    # Several batches commit before the subscription is read, so the history it reads runs past "until":
    # the stream still ends at "until", and a resume from there repeats nothing and misses nothing.
    with flight_sql.connect(data.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM by_cust")
        start = int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])
        for i in range(4):
            cur.execute(f"INSERT INTO orders VALUES ({876543210 + i}, {1 + i}, {10.0 + i}, 'open')")
        cur.execute("SELECT * FROM by_cust")
        end = int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])
    until = start + (end - start) // 2
    assert start < until < end
    first = subscribe(client, subscribe="by_cust", **{"from": start, "until": until}).read_all()
    rest = subscribe(client, subscribe="by_cust", **{"from": until, "until": end}).read_all()
    assert first.num_rows and rest.num_rows
    assert max(first.column("__offset").to_pylist()) <= until < min(rest.column("__offset").to_pylist())
    whole = subscribe(client, subscribe="by_cust", **{"from": start, "until": end}).read_all()
    assert multiset_diff(pa.concat_tables([first, rest]), whole) is None
