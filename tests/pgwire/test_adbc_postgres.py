"""ADBC's PostgreSQL driver over the PostgreSQL door: Arrow in and out through binary COPY.

The driver learns type OIDs from pg_type on connect, reads every result
with ``COPY (query) TO STDOUT (FORMAT binary)`` and bulk-ingests with
``COPY t FROM STDIN (FORMAT binary)``; here each path is checked against
Flight SQL (the same rows through ADBC's Flight SQL driver) or against the
format's bytes built by hand.
"""

from __future__ import annotations

import datetime
import decimal
import struct

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_postgresql.dbapi as adbc_pg
import psycopg
import pyarrow as pa
import pytest

from tests.pgwire.conftest import TIMEOUT, connect

EVERY_TYPE = ("CREATE TABLE every (id BIGINT PRIMARY KEY, bo BOOLEAN, t8 TINYINT, i2 SMALLINT, i4 INTEGER, r REAL, "
              "g DOUBLE, d DECIMAL(12,2), big DECIMAL(38,10), v VARCHAR, b BLOB, dt DATE, ts TIMESTAMP, "
              "tz TIMESTAMPTZ, tm TIME, iv INTERVAL, li INTEGER[], ls VARCHAR[], lg BIGINT[])")
EVERY_ROW = ("INSERT INTO every VALUES "
             "(1, true, -128, -32768, 2147483647, 1.5, -0.1, -12.34, 1234567890123456789012345678.0123456789, "
             "'x''y é', '\\x00\\xff'::BLOB, DATE '2024-02-29', TIMESTAMP '2024-01-02 03:04:05.123456', "
             "TIMESTAMPTZ '2030-06-07 08:09:10.5+00', TIME '23:59:59.999999', INTERVAL '1 month 2 days 3 hours', "
             "[1, NULL, 3], ['a', 'b c', NULL], []), "
             "(2, false, 0, 0, 0, CAST('NaN' AS REAL), CAST('Infinity' AS DOUBLE), 0, 0, '', ''::BLOB, DATE '1999-12-31', TIMESTAMP '1970-01-01', "
             "TIMESTAMPTZ '1900-01-01 00:00:00+00', TIME '00:00:00', INTERVAL '-5 seconds', [], [], [9223372036854775807]), "
             "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
             "NULL)")
# What ADBC's PostgreSQL driver makes of each column (by the type OID the door sends): numeric comes as
# strings (an arrow.opaque extension type over string, so no digits are lost), int8 lists as int64 lists.
ADBC_TYPES = {"id": pa.int64(), "bo": pa.bool_(), "t8": pa.int16(), "i2": pa.int16(), "i4": pa.int32(),
              "r": pa.float32(), "g": pa.float64(), "d": pa.string(), "big": pa.string(), "v": pa.string(),
              "b": pa.binary(), "dt": pa.date32(), "ts": pa.timestamp("us"), "tz": pa.timestamp("us", "UTC"),
              "tm": pa.time64("us"), "iv": pa.month_day_nano_interval(), "li": pa.list_(pa.int32()),
              "ls": pa.list_(pa.string()), "lg": pa.list_(pa.int64())}


@pytest.fixture(scope="module")
def pg(server):
    """One ADBC PostgreSQL connection for the module (connecting reads pg_type and pg_attribute)."""
    with connect(server) as conn:
        conn.execute(EVERY_TYPE)
        conn.execute(EVERY_ROW)
        conn.execute("CREATE MATERIALIZED VIEW every_v AS SELECT * FROM every")
    with adbc_pg.connect(f"postgresql://ivm@127.0.0.1:{server.pg_port}/ivm?connect_timeout={TIMEOUT}",
                         autocommit=True) as conn:
        yield conn


def _read(conn, sql: str, parameters=None) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(sql, parameters)
        return cur.fetch_arrow_table()


def _plain(value):
    """A value as both drivers agree on it: numeric text as Decimal, timestamps with a zone in UTC."""
    if isinstance(value, str) and value[:1] in "-0123456789" and value.lstrip("-").replace(".", "", 1).isdigit():
        return decimal.Decimal(value)
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.timezone.utc)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def test_every_type_reads_as_through_flight(server, pg):
    got = _read(pg, "SELECT * FROM every_v ORDER BY id")
    assert {f.name: f.type.storage_type if isinstance(f.type, pa.BaseExtensionType) else f.type
            for f in got.schema} == ADBC_TYPES
    assert got.schema.field("d").type.extension_name == "arrow.opaque"  # numeric: ADBC's opaque type over text
    with flight_sql.connect(server.uri, autocommit=True) as flight, flight.cursor() as cur:
        cur.execute("SELECT * FROM every_v ORDER BY id")
        expected = cur.fetch_arrow_table()
    assert got.column_names == expected.column_names
    for name in got.column_names:
        ours = [_plain(v) if not isinstance(v, list) else v for v in got.column(name).to_pylist()]
        theirs = [_plain(v) if not isinstance(v, list) else v for v in expected.column(name).to_pylist()]
        assert ours == theirs, name
    assert got.column("d").to_pylist()[:2] == ["-12.34", "0.00"]  # numeric text keeps the scale


def test_parameterized_query(pg):
    got = _read(pg, "SELECT id, v FROM every_v WHERE i4 > $1 AND v = $2 ORDER BY id", (5, "x'y é"))
    assert got.to_pylist() == [{"id": 1, "v": "x'y é"}]
    assert _read(pg, "SELECT count(*) AS n FROM every_v WHERE dt < $1",
                 (datetime.date(2000, 1, 1),)).to_pylist() == [{"n": 1}]


def test_ingest_appends_one_batch_and_views_follow(server, pg):
    with connect(server) as conn:
        conn.execute("CREATE TABLE sales (id BIGINT PRIMARY KEY, region VARCHAR, amount DECIMAL(10,2), "
                     "qty INTEGER, day DATE, at TIMESTAMPTZ, took INTERVAL, ok BOOLEAN, note BLOB, w DOUBLE)")
        conn.execute("CREATE MATERIALIZED VIEW by_region AS SELECT region, count(*) AS n, sum(amount) AS total, "
                     "sum(qty) AS qty FROM sales GROUP BY region")
        offset = int(conn.info.parameter_status("ivm_offset"))
    day, at = datetime.date(1999, 12, 31), datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, datetime.timezone.utc)
    mixed = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()), "region": ["north", "south", None],
        "amount": pa.array([decimal.Decimal("1.50"), decimal.Decimal("-0.25"), None], pa.decimal128(10, 2)),
        "qty": pa.array([2, None, 5], pa.int32()), "day": pa.array([day, None, day]),
        "at": pa.array([at, None, at], pa.timestamp("us", "UTC")),
        "took": pa.array([pa.MonthDayNano([1, 2, 3_000]), None, pa.MonthDayNano([0, -1, 0])],
                         pa.month_day_nano_interval()),
        "ok": [True, None, False], "note": pa.array([b"\x00\x01", b"", None]), "w": [0.5, float("inf"), None]})
    numbers = pa.table({"id": pa.array([4, 5], pa.int64()), "qty": pa.array([10, 20], pa.int32()),
                        "w": [1.0, 2.0]})  # every value one width: the vectorized split
    with pg.cursor() as cur:
        assert cur.adbc_ingest("sales", mixed, mode="append") == 3
        assert cur.adbc_ingest("sales", numbers, mode="append") == 2
    with flight_sql.connect(server.uri, autocommit=True) as flight, flight.cursor() as cur:
        cur.execute("SELECT * FROM sales ORDER BY id")
        stored = cur.fetch_arrow_table()
    assert stored.slice(0, 3).select(mixed.column_names).to_pylist() == mixed.to_pylist()
    assert stored.column("qty").to_pylist()[3:] == [10, 20]
    got = _read(pg, "SELECT region, n, total, qty FROM by_region ORDER BY region NULLS LAST")
    assert got.to_pylist() == [{"region": "north", "n": 1, "total": "1.50", "qty": 2},
                               {"region": "south", "n": 1, "total": "-0.25", "qty": None},
                               {"region": None, "n": 3, "total": None, "qty": 35}]
    with connect(server) as conn:
        assert int(conn.execute("SHOW ivm_offset").fetchone()[0]) == offset + 2  # one change batch per ingest


HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)


def _field(value: bytes | None) -> bytes:
    return struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value


def test_copy_binary_out_is_the_documented_format(conn):
    conn.execute("CREATE TABLE small (id INTEGER PRIMARY KEY, name VARCHAR, ok BOOLEAN, x DOUBLE, day DATE)")
    conn.execute("INSERT INTO small VALUES (1, 'ab', true, 1.5, DATE '2000-01-03'), (2, NULL, false, NULL, NULL)")
    with conn.cursor().copy("COPY (SELECT * FROM small ORDER BY id) TO STDOUT (FORMAT binary)") as copy:
        messages = [bytes(data) for data in copy]  # each CopyData message's payload
    tuples = [struct.pack("!h", 5) + _field(struct.pack("!i", 1)) + _field(b"ab") + _field(b"\x01")
              + _field(struct.pack("!d", 1.5)) + _field(struct.pack("!i", 2)),  # days since 2000-01-01
              struct.pack("!h", 5) + _field(struct.pack("!i", 2)) + _field(None) + _field(b"\x00")
              + _field(None) + _field(None)]
    # As PostgreSQL sends it: one tuple per message, the header with the first, the trailer alone
    assert messages == [HEADER + tuples[0], tuples[1], struct.pack("!h", -1)]
    with conn.cursor().copy("COPY small (name) TO STDOUT (FORMAT binary)") as copy:
        assert b"".join(bytes(data) for data in copy).startswith(HEADER + struct.pack("!h", 1))
    with conn.cursor().copy("COPY (SELECT * FROM small WHERE id < 0) TO STDOUT (FORMAT binary)") as copy:
        assert [bytes(data) for data in copy] == [HEADER + struct.pack("!h", -1)]


@pytest.mark.parametrize("data, state", [
    (b"PGCOPY\n\xff\r\n\x01" + struct.pack("!ii", 0, 0), "22P04"),  # a bad signature
    (HEADER + struct.pack("!h", 2) + _field(struct.pack("!q", 1)) + struct.pack("!i", 8) + b"\x00", "22P04"),
    (HEADER + struct.pack("!h", 1) + _field(struct.pack("!q", 1)), "22P04"),  # one field for two columns
    (HEADER + struct.pack("!h", 2) + _field(struct.pack("!q", 1)) + struct.pack("!i", -2), "22P04"),
    (HEADER + struct.pack("!hh", -1, 2), "22P04"),  # data after the trailer
    (HEADER + struct.pack("!h", 2) + _field(struct.pack("!i", 1)) + _field(b"x"), "22P03"),  # int4 in int8
], ids=["signature", "truncated", "field-count", "length", "after-trailer", "width"])
def test_malformed_binary_copy_applies_nothing(conn, data, state):
    conn.execute("CREATE TABLE IF NOT EXISTS into_me (id BIGINT PRIMARY KEY, v VARCHAR)")
    with pytest.raises(psycopg.Error) as raised:
        with conn.cursor().copy("COPY into_me FROM STDIN (FORMAT binary)") as copy:
            copy.write(data)
    assert raised.value.sqlstate == state
    assert conn.execute("SELECT count(*) FROM into_me").fetchone() == (0,)  # the connection still works
    with pytest.raises(psycopg.errors.SyntaxError, match="cannot specify DELIMITER in BINARY mode"):
        conn.execute("COPY into_me TO STDOUT (FORMAT binary, DELIMITER ',')")
