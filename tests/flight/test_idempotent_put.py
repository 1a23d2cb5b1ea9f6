"""Flight DoPut and adbc_ingest take the idempotent producer key (source, seq) of ``apply_changes``.

A client whose acknowledgement was lost sends the same batch again with the
same key: it is applied once and the retry is answered with the first
offset, also when a durable server was killed and restarted in between. A
seq below the source's last one that is not remembered is refused, as in
the Python API.
"""

from __future__ import annotations

import json
import signal

import adbc_driver_manager as adbc
import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import run_script
from tests.flight.server import ServerProcess


def keyed(table: pa.Table, source: str, seq: int) -> pa.Table:
    return table.replace_schema_metadata({"ivm.source": source, "ivm.seq": str(seq)})


def put(client: fl.FlightClient, descriptor: fl.FlightDescriptor, data: pa.Table) -> dict:
    writer, reader = client.do_put(descriptor, data.schema)
    writer.write_table(data)
    writer.done_writing()
    answer = reader.read()
    writer.close()  # raises the server's error, if any
    return json.loads(answer.to_pybytes())


def rows(cur, table: str) -> list:
    cur.execute(f"SELECT * FROM {table} ORDER BY 1")
    return cur.fetchall()


@pytest.fixture(scope="module")
def ready(server):
    run_script(server.uri, "CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR); "
                           "CREATE TABLE bag (a BIGINT); CREATE MATERIALIZED VIEW n AS SELECT COUNT(*) AS n FROM bag")
    return server


def test_a_plain_put_retried_with_its_key_in_schema_metadata_applies_once(ready, client, cur):
    batch = keyed(pa.table({"a": [1, 2, 3]}), "loader", 1)
    first = put(client, fl.FlightDescriptor.for_path("bag"), batch)
    again = put(client, fl.FlightDescriptor.for_path("bag"), batch)
    assert again["offset"] == first["offset"]
    assert rows(cur, "n") == [(3,)]


def test_a_plain_put_takes_its_key_from_a_json_command(ready, client, cur):
    descriptor = fl.FlightDescriptor.for_command(json.dumps({"table": "bag", "source": "cmd", "seq": 5}))
    first = put(client, descriptor, pa.table({"a": [10]}))
    assert put(client, descriptor, pa.table({"a": [10]}))["offset"] == first["offset"]
    later = put(client, fl.FlightDescriptor.for_command(json.dumps({"table": "bag", "source": "cmd", "seq": 6})),
                pa.table({"a": [11]}))
    assert later["offset"] > first["offset"]
    assert rows(cur, "n") == [(5,)]
    bad = fl.FlightDescriptor.for_command(json.dumps({"table": "bag", "seq": 1, "sauce": "x"}))
    with pytest.raises(pa.ArrowInvalid, match="JSON DoPut command"):
        put(client, bad, pa.table({"a": [12]}))


def test_a_lower_seq_is_refused_as_in_the_python_api(ready, client, cur):
    put(client, fl.FlightDescriptor.for_path("bag"), keyed(pa.table({"a": [20]}), "ordered", 10))
    with pytest.raises(pa.ArrowInvalid, match="seq 9 of source 'ordered' is below the last applied seq 10"):
        put(client, fl.FlightDescriptor.for_path("bag"), keyed(pa.table({"a": [21]}), "ordered", 9))
    with pytest.raises(pa.ArrowInvalid, match="ivm.seq must be a non-negative decimal integer"):
        put(client, fl.FlightDescriptor.for_path("bag"),
            pa.table({"a": [22]}).replace_schema_metadata({"ivm.source": "ordered", "ivm.seq": "x"}))
    with pytest.raises(pa.ArrowInvalid, match="source must be a non-empty string"):
        put(client, fl.FlightDescriptor.for_path("bag"),
            pa.table({"a": [23]}).replace_schema_metadata({"ivm.seq": "11"}))
    cur.execute("SELECT count(*) FROM bag WHERE a >= 20")
    assert cur.fetchall() == [(1,)]


def test_adbc_ingest_retried_with_its_key_applies_once(ready, cur):
    batch = keyed(pa.table({"k": [1, 2], "v": ["a", "b"]}), "adbc-loader", 1)
    assert cur.adbc_ingest("kv", batch, mode="append") == 2
    assert cur.adbc_ingest("kv", batch, mode="append") == 2  # the retry: acknowledged, not applied again
    assert rows(cur, "kv") == [(1, "a"), (2, "b")]
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT.*below the last applied seq"):
        cur.adbc_ingest("kv", keyed(pa.table({"k": [3], "v": ["c"]}), "adbc-loader", 0), mode="append")
    # Without a key a repeat is a new batch (here: a duplicate key, refused as such).
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT"):
        cur.adbc_ingest("kv", pa.table({"k": [1], "v": ["a"]}), mode="append")


def test_a_retry_after_a_durable_server_was_killed_applies_once(tmp_path):
    data = str(tmp_path / "db")
    batch = keyed(pa.table({"a": [1, 2, 3]}), "crashy", 7)
    ingest = keyed(pa.table({"k": [1], "v": ["x"]}), "crashy-adbc", 1)
    with ServerProcess("--data", data) as first:
        run_script(first.uri, "CREATE TABLE bag (a BIGINT); CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        client = fl.connect(first.uri)
        offset = put(client, fl.FlightDescriptor.for_path("bag"), batch)["offset"]
        client.close()
        with flight_sql.connect(first.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.adbc_ingest("kv", ingest, mode="append")
        first.stop(signal.SIGKILL)  # the acknowledgement "was lost": the client will retry
    with ServerProcess("--data", data) as second:
        client = fl.connect(second.uri)
        assert put(client, fl.FlightDescriptor.for_path("bag"), batch)["offset"] == offset
        client.close()
        with flight_sql.connect(second.uri, autocommit=True) as conn, conn.cursor() as cur:
            assert cur.adbc_ingest("kv", ingest, mode="append") == 1
            assert rows(cur, "bag") == [(1,), (2,), (3,)]
            assert rows(cur, "kv") == [(1, "x")]
