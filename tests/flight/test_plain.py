"""Plain Arrow Flight (``pyarrow.flight``) against a real ``ivm serve``."""

from __future__ import annotations

import json
import threading

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import DURABILITY, run_script

pytestmark = DURABILITY  # every test in memory and with --data


def put(client: fl.FlightClient, table: str, data: pa.Table) -> dict:
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(table), data.schema)
    writer.write_table(data)
    writer.done_writing()
    ack = json.loads(reader.read().to_pybytes())
    writer.close()
    return ack


@pytest.fixture(scope="module")
def data(server):
    run_script(
        server.uri,
        "CREATE TABLE ledger (id BIGINT PRIMARY KEY, amount BIGINT);"
        "CREATE MATERIALIZED VIEW total AS SELECT SUM(amount) AS s FROM ledger;"
        "CREATE MATERIALIZED VIEW entries AS SELECT COUNT(id) AS n FROM ledger;"
        "CREATE MATERIALIZED VIEW big AS SELECT id, amount FROM ledger WHERE amount > 5"
    )
    return server


def test_path_descriptor_reads_a_view_with_its_offset(data, client):
    ack = put(client, "ledger", pa.table({"id": [1, 2, 3], "amount": [1, 7, 9]}))
    assert ack == {"offset": ack["offset"], "rows": 3} and ack["offset"] >= 1
    info = client.get_flight_info(fl.FlightDescriptor.for_path("big"))
    offset = json.loads(info.app_metadata)["offset"]
    assert offset >= ack["offset"]
    assert info.schema.metadata[b"ivm.offset"] == str(offset).encode()
    assert info.total_records == 2 and len(info.endpoints) == 1
    table = client.do_get(info.endpoints[0].ticket).read_all()
    assert table.schema == info.schema
    assert sorted(table.column("id").to_pylist()) == [2, 3]
    with pytest.raises(KeyError, match="fetched once"):  # NOT_FOUND
        client.do_get(info.endpoints[0].ticket).read_all()


def test_list_flights_lists_tables_and_views(data, client):
    flights = {f.descriptor.path[0].decode(): f for f in client.list_flights()}
    assert {"ledger", "total", "entries", "big"} <= set(flights)
    assert json.loads(flights["ledger"].app_metadata) == {"kind": "table"}
    assert json.loads(flights["big"].app_metadata) == {"kind": "view"}
    assert flights["big"].schema.names == ["id", "amount"]
    rows = client.do_get(flights["entries"].endpoints[0].ticket).read_all()
    assert rows.column_names == ["n"] and b"ivm.offset" in rows.schema.metadata


def test_get_schema_of_a_path(data, client):
    assert client.get_schema(fl.FlightDescriptor.for_path("total")).schema.names == ["s"]


def test_all_views_in_one_read_come_from_one_offset(data, server):
    """While rows of amount 1 stream in, SUM and COUNT read together always agree."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with fl.connect(server.uri) as writer_client:
                for i in range(60):
                    put(writer_client, "ledger", pa.table({"id": [10_000 + 2 * i, 10_001 + 2 * i], "amount": [1, 1]}))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    consistent = ("SELECT COALESCE(total.s, 0) - entries.n AS gap, "
                  "entries.n - (SELECT COUNT(*) FROM ledger WHERE id BETWEEN 10000 AND 10119) AS unstreamed "
                  "FROM total, entries")
    with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        # Whatever other tests of this module wrote before (xdist may run them
        # elsewhere, or later): every streamed row adds 1 to SUM, COUNT and the
        # table, so both differences stay constant in a consistent read.
        cur.execute(consistent)
        base = cur.fetchall()[0]
        writer = threading.Thread(target=write)
        writer.start()
        reads = 0
        while not stop.is_set() or reads < 5:
            cur.execute(consistent)
            table = cur.fetch_arrow_table()
            row = tuple(table.to_pylist()[0].values())
            assert row == base, f"views and table from different offsets: (gap, unstreamed) = {row}, expected {base}"
            assert b"ivm.offset" in table.schema.metadata
            reads += 1
        writer.join()
        cur.execute("SELECT COUNT(*) FROM ledger WHERE id BETWEEN 10000 AND 10119")
        assert cur.fetchall()[0][0] == 120  # every write landed
    assert not errors


def test_stalled_readers_do_not_block_ingest(data, client):
    """A full read and a subscription that stop reading midway hold no lock on ingest.

    Each stalled stream has megabytes left to send (more than gRPC's flow
    control window), so its server side waits to write. Writes still get
    acknowledged (a call timeout turns a block into a failure instead of a
    hang) and are visible; afterwards the stalled full read finishes with
    exactly the rows of its own offset.
    """
    first = 1_000_000
    rows = 500_000  # 8 MB for each stalled stream
    bulk = pa.table({"id": pa.array(range(first, first + rows), pa.int64()),
                     "amount": pa.array([10] * rows, pa.int64())})
    put(client, "ledger", bulk)
    info = client.get_flight_info(fl.FlightDescriptor.for_path("big"))
    expected_rows = info.total_records
    stalled_read = client.do_get(info.endpoints[0].ticket)
    head = stalled_read.read_chunk().data  # then nothing, for now
    with fl.connect(data.uri) as subscriber:
        stalled_sub = subscriber.do_get(fl.Ticket(json.dumps({"subscribe": "big", "from": 0}).encode()))
        stalled_sub.read_chunk()
        options = fl.FlightCallOptions(timeout=60)
        with fl.connect(data.uri) as writer_client, flight_sql.connect(data.uri, autocommit=True) as conn, \
                conn.cursor() as cur:
            for i in range(20):
                writer, reader = writer_client.do_put(fl.FlightDescriptor.for_path("ledger"),
                                                      bulk.schema, options=options)
                writer.write_table(pa.table({"id": pa.array([first - 1 - i], pa.int64()),
                                             "amount": pa.array([100], pa.int64())}))
                writer.done_writing()
                ack = json.loads(reader.read().to_pybytes())
                writer.close()
                cur.execute("SELECT COUNT(*) FROM big WHERE id = ?", (first - 1 - i,))
                assert cur.fetchall() == [(1,)] and ack["rows"] == 1
        stalled_sub.cancel()
    rest = stalled_read.read_all()
    ids = pa.concat_arrays([head.column("id"), *rest.column("id").chunks])
    assert len(ids) == expected_rows >= rows  # the rows of its own offset ...
    written_meanwhile = pa.array(range(first - 20, first), pa.int64())
    assert not pc.any(pc.is_in(ids, value_set=written_meanwhile)).as_py()  # ... none written after it
