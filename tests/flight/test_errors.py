"""Errors through the ADBC driver: the right status, a clean message, nothing changed.

One case per error class of sql_frontend/errors.py (and the server's own):
the client sees the documented exception type and gRPC code, a message that
names the problem, no Python traceback, and the database is as it was.
"""

from __future__ import annotations

import json

import adbc_driver_manager as adbc
import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import run_script


@pytest.fixture(scope="module")
def data(server):
    run_script(
        server.uri,
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner VARCHAR NOT NULL, balance DOUBLE);"
        "INSERT INTO accounts VALUES (1, 'ann', 10), (2, 'bob', 20);"
        "CREATE MATERIALIZED VIEW rich AS SELECT owner, balance FROM accounts WHERE balance > 15"
    )
    return server


def snapshot(cur) -> tuple:
    cur.execute("SELECT * FROM accounts ORDER BY id")
    accounts = cur.fetchall()
    cur.execute("SELECT * FROM rich ORDER BY owner")
    rich = cur.fetchall()
    cur.execute("SHOW TABLES")
    return accounts, rich, cur.fetchall()


CASES = [
    # (statement, ADBC exception, gRPC code, words in the message)
    ("SELEC owner FROM accounts", adbc.ProgrammingError, "INVALID_ARGUMENT", ["syntax error"]),
    ("SELECT nope FROM accounts", adbc.ProgrammingError, "INVALID_ARGUMENT", ["nope"]),
    ("SELECT * FROM missing_table", adbc.ProgrammingError, "NOT_FOUND", ["missing_table"]),
    ("INSERT INTO missing_table VALUES (1)", adbc.ProgrammingError, "NOT_FOUND", ["missing_table"]),
    ("CREATE MATERIALIZED VIEW w AS SELECT owner, COUNT(*) AS n FROM accounts GROUP BY ROLLUP (owner)",
     adbc.NotSupportedError, "NOT_IMPLEMENTED", ["ROLLUP"]),
    ("CREATE TABLE accounts (x BIGINT)", adbc.ProgrammingError, "INVALID_ARGUMENT", ["accounts", "exists"]),
    ("INSERT INTO accounts VALUES (1, 'dup', 0)", adbc.ProgrammingError, "INVALID_ARGUMENT", ["1"]),
    ("INSERT INTO accounts VALUES (3, NULL, 0)", adbc.ProgrammingError, "INVALID_ARGUMENT", ["owner"]),
    ("SELECT CAST(owner AS INTEGER) FROM accounts", adbc.ProgrammingError, "INVALID_ARGUMENT", ["ann"]),
    ("DROP TABLE accounts", adbc.ProgrammingError, "INVALID_ARGUMENT", ["rich"]),
]


@pytest.mark.parametrize("statement,error,code,words", CASES, ids=[c[0][:40] for c in CASES])
def test_statement_errors(data, cur, statement, error, code, words):
    before = snapshot(cur)
    with pytest.raises(error) as caught:
        cur.execute(statement)
    message = str(caught.value)
    assert code in message, message
    for word in words:
        assert word.lower() in message.lower(), message
    assert "Traceback" not in message and 'File "' not in message
    assert snapshot(cur) == before


def test_bad_ingest_is_rejected_whole(data, cur):
    before = snapshot(cur)
    batch = pa.table({"id": [5, 1], "owner": ["eve", "dup"], "balance": [1.0, 2.0], "__op": ["c", "c"]})
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT") as caught:
        cur.adbc_ingest("accounts", batch, mode="append")
    assert "Traceback" not in str(caught.value)
    with pytest.raises(adbc.ProgrammingError, match="NOT_FOUND"):
        cur.adbc_ingest("nowhere", batch, mode="append")
    assert snapshot(cur) == before


def test_wrong_parameter_count(data, cur):
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT.*2 parameter"):
        cur.execute("SELECT * FROM accounts WHERE id = ? AND owner = ?", (1,))


def test_transactions_are_refused_by_name(data, server):
    with flight_sql.connect(server.uri, autocommit=True) as conn:
        with pytest.raises(adbc.NotSupportedError) as caught:
            conn.adbc_connection.set_autocommit(False)
        assert "Traceback" not in str(caught.value)


def test_plain_flight_errors(data, client):
    with pytest.raises(KeyError, match="nothing_here"):  # NOT_FOUND
        client.get_flight_info(fl.FlightDescriptor.for_path("nothing_here"))
    with pytest.raises(pa.ArrowInvalid, match="not an ivm ticket"):  # INVALID_ARGUMENT
        client.do_get(fl.Ticket(b"\x00garbage")).read_all()
    with pytest.raises(pa.ArrowInvalid, match="ahead of the latest offset") as caught:
        client.do_get(fl.Ticket(json.dumps({"subscribe": "rich", "from": 10**9}).encode())).read_all()
    assert "Traceback" not in str(caught.value)
    with pytest.raises(pa.ArrowInvalid, match="varint|Any"):  # INVALID_ARGUMENT: not a protobuf message
        client.get_flight_info(fl.FlightDescriptor.for_command(b"\xff\xff"))
    with pytest.raises(pa.ArrowNotImplementedError, match="not supported"):  # UNIMPLEMENTED
        list(client.do_action(fl.Action("BeginTransaction", b"")))
    with pytest.raises(pa.ArrowNotImplementedError, match="Flight SQL command CommandGetXdbcTypeInfo"):
        from flight_server import protocol

        client.get_flight_info(fl.FlightDescriptor.for_command(protocol.pack("CommandGetXdbcTypeInfo")))


def test_a_closed_prepared_statement_is_not_found_though_its_command_was_seen(data, client):
    """Commands are decoded once per distinct bytes (flight_server.server.unpack): the same bytes must still
    reach the statement store each time, so closing the statement ends it; malformed bytes fail every time."""
    from flight_server import protocol

    def prepare(sql: str) -> bytes:
        body = protocol.pack("ActionCreatePreparedStatementRequest", query=sql)
        result = list(client.do_action(fl.Action("CreatePreparedStatement", body)))[0].body.to_pybytes()
        return protocol.unpack(result)[1]["prepared_statement_handle"]

    handle = prepare("SELECT owner FROM accounts WHERE id = 1")
    command = fl.FlightDescriptor.for_command(protocol.pack("CommandPreparedStatementQuery",
                                                            prepared_statement_handle=handle))
    for _ in range(2):  # decoded the first time, found in the cache the second
        info = client.get_flight_info(command)
        assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"owner": "ann"}]
    close = protocol.pack("ActionClosePreparedStatementRequest", prepared_statement_handle=handle)
    list(client.do_action(fl.Action("ClosePreparedStatement", close)))
    with pytest.raises(KeyError, match="unknown or expired prepared statement"):  # NOT_FOUND
        client.get_flight_info(command)
    other = prepare("SELECT owner FROM accounts WHERE id = 2")  # another handle: other bytes, its own fields
    info = client.get_flight_info(fl.FlightDescriptor.for_command(
        protocol.pack("CommandPreparedStatementQuery", prepared_statement_handle=other)))
    assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"owner": "bob"}]
    for _ in range(2):
        with pytest.raises(pa.ArrowInvalid, match="varint|Any"):
            client.get_flight_info(fl.FlightDescriptor.for_command(b"\xff\xff"))


def test_executemany_insert_is_one_atomic_batch(data, cur):
    before = snapshot(cur)
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT"):
        cur.executemany("INSERT INTO accounts VALUES (?, ?, ?)", [(7, "gil", 1.0), (1, "dup", 2.0)])
    assert snapshot(cur) == before  # the first row was not applied either
    cur.executemany("INSERT INTO accounts VALUES (?, ?, ?)", [(7, "gil", 1.0), (8, "hal", 99.0)])
    assert cur.rowcount == 2
    cur.execute("SELECT owner FROM rich WHERE owner = ?", ("hal",))
    assert cur.fetchall() == [("hal",)]
    cur.execute("DELETE FROM accounts WHERE id IN (7, 8)")
    assert snapshot(cur) == before
