"""A subscription survives a restart of a durable server (``--data``), acceptance 2.

A consumer reads a view's change stream from offset 0, the server stops
(SIGTERM) and starts again on the same directory, and the consumer resumes
from the last offset it saw: the history restarts at the restored offset, so
resuming from there (or later) continues the stream, and the integrated
result equals the view. Resuming from before the restored offset is a clear
INVALID_ARGUMENT that says what to do (read the view again), never a silent
gap; doing what it says also integrates to the view.
"""

from __future__ import annotations

import random
import re

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import run_script
from tests.flight.server import ServerProcess
from tests.flight.test_sql import cdc_batch
from tests.flight.test_subscriptions import VIEWS, consume, read_view, subscribe
from tests.integrate import Integrator
from tests.oracle.compare import multiset_diff


def write(uri: str, rng: random.Random, live: dict, next_id: int, batches: int) -> tuple[int, int]:
    """Ingest ``batches`` CDC batches; returns (next id, offset after the last one)."""
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for _ in range(batches):
            batch, next_id = cdc_batch(rng, live, next_id, rng.choice([1, 5, 40]))
            cur.adbc_ingest("orders", batch, mode="append")
        cur.execute("SELECT 1")
        return next_id, int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])


def integrate(uri: str, consumer: Integrator, view: str, since: int | None, until: int) -> int:
    ticket = {"subscribe": view, "until": until, "heartbeat": 0.1}
    if since is not None:
        ticket["from"] = since
    with fl.connect(uri) as client:
        reader = subscribe(client, **ticket)
        through = consume(reader, consumer, stop_at=until)
        reader.cancel()
    return through


def assert_integrates_to_view(consumer: Integrator, uri: str, view: str, offset: int) -> None:
    current = read_view(uri, view)
    assert int(current.schema.metadata[b"ivm.offset"]) == offset
    assert not consumer.negative()
    diff = multiset_diff(consumer.table(current.schema), current)
    assert diff is None, diff


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_resume_across_a_restart_from_the_restored_offset(tmp_path, view):
    data = str(tmp_path / "db")
    rng, live = random.Random(11), {}
    consumer = Integrator()
    with ServerProcess("--data", data) as server:
        run_script(server.uri,
                   "CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR);"
                   "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, status VARCHAR);"
                   "INSERT INTO customers VALUES (1, 'n'), (2, 's'), (3, 'e'), (4, 'w'), (5, 'n'), (6, NULL);"
                   + "".join(f"CREATE MATERIALIZED VIEW {name} AS {sql};" for name, sql in VIEWS.items()))
        next_id, before_stop = write(server.uri, rng, live, 1, 15)
        last = integrate(server.uri, consumer, view, 0, before_stop)
        assert last == before_stop
    with ServerProcess("--data", data) as server:  # the same directory: a restart
        restored = int(read_view(server.uri, view).schema.metadata[b"ivm.offset"])
        assert restored == last  # a clean stop loses no acknowledged batch
        next_id, final = write(server.uri, rng, live, next_id, 15)
        assert final > restored
        # From before the restored offset: refused, saying what to do.
        with fl.connect(server.uri) as client:
            with pytest.raises(pa.ArrowInvalid) as caught:
                subscribe(client, subscribe=view, **{"from": 0}).read_all()
        message = str(caught.value)
        assert re.search(rf"changes of {view} after offset 0 are no longer retained \(history starts after "
                         rf"offset {restored}\); read {view} again", message), message
        assert "Traceback" not in message
        # From the consumer's last offset (the restored one): the stream continues.
        integrate(server.uri, consumer, view, last, final)
        assert_integrates_to_view(consumer, server.uri, view, final)
        # A consumer that follows the error's advice: the view's rows now, then live.
        fresh = Integrator()
        integrate(server.uri, fresh, view, None, final)
        assert_integrates_to_view(fresh, server.uri, view, final)
