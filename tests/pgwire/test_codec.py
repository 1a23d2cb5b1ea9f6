"""The codec, byte for byte against PostgreSQL's protocol documentation and RFC 7677's SCRAM example."""

from __future__ import annotations

import base64
import decimal
import struct

import pyarrow as pa
import pytest

import ivm
from flight_server.pgwire import copy_binary, messages, parameters, rows, types
from flight_server.pgwire.auth import AuthFailed, Scram
from flight_server.pgwire.parameters import decode


def test_special_request_codes():
    # "The SSL request code. The value is chosen to contain 1234 in the most significant 16 bits,
    # and 5679 in the least significant 16 bits"; cancel 1234/5678, GSSENC 1234/5680; protocol 3.0 = 196608.
    assert messages.SSL_REQUEST == (1234 << 16) | 5679
    assert messages.CANCEL_REQUEST == (1234 << 16) | 5678
    assert messages.GSSENC_REQUEST == (1234 << 16) | 5680
    assert messages.PROTOCOL_3_0 == 196608
    startup = messages.parse_startup(struct.pack("!i", 196608) + b"user\x00bob\x00database\x00shop\x00\x00")
    assert startup.parameters == {"user": "bob", "database": "shop"}
    cancel = messages.parse_startup(struct.pack("!iii", messages.CANCEL_REQUEST, 4242, 99))
    assert (cancel.process_id, cancel.secret) == (4242, struct.pack("!i", 99))


def test_backend_messages_bytes():
    assert messages.authentication_ok() == b"R\x00\x00\x00\x08\x00\x00\x00\x00"
    assert messages.authentication_cleartext() == b"R\x00\x00\x00\x08\x00\x00\x00\x03"
    assert messages.authentication_sasl(["SCRAM-SHA-256"]) == \
        b"R\x00\x00\x00\x17\x00\x00\x00\x0aSCRAM-SHA-256\x00\x00"
    assert messages.parameter_status("TimeZone", "UTC") == b"S\x00\x00\x00\x11TimeZone\x00UTC\x00"
    assert messages.backend_key_data(7, 9) == b"K\x00\x00\x00\x0c\x00\x00\x00\x07\x00\x00\x00\x09"
    assert messages.ready_for_query(b"I") == b"Z\x00\x00\x00\x05I"
    assert messages.empty_query_response() == b"I\x00\x00\x00\x04"
    assert messages.parse_complete() + messages.bind_complete() + messages.close_complete() == \
        b"1\x00\x00\x00\x042\x00\x00\x00\x043\x00\x00\x00\x04"
    assert messages.no_data() == b"n\x00\x00\x00\x04" and messages.portal_suspended() == b"s\x00\x00\x00\x04"
    assert messages.parameter_description([23, 25]) == b"t\x00\x00\x00\x0e\x00\x02\x00\x00\x00\x17\x00\x00\x00\x19"
    assert messages.data_row([b"12", None]) == b"D\x00\x00\x00\x10\x00\x02\x00\x00\x00\x0212\xff\xff\xff\xff"
    field = messages.Field("a", 23, 4, 1)
    assert messages.row_description([field]) == (
        b"T\x00\x00\x00\x1a\x00\x01a\x00" + b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x00\x00\x00\x17"
        + b"\x00\x04" + b"\xff\xff\xff\xff" + b"\x00\x01")
    assert messages.error_response("ERROR", "42601", "bad") == \
        b"E\x00\x00\x00\x1fSERROR\x00VERROR\x00C42601\x00Mbad\x00\x00"
    assert messages.copy_response(b"G", 2) == b"G\x00\x00\x00\x0b\x00\x00\x02\x00\x00\x00\x00"


def test_bind_and_parse_decoding():
    body = (b"portal\x00stmt\x00" + struct.pack("!hh", 1, 1) + struct.pack("!h", 2)
            + struct.pack("!i", 4) + struct.pack("!i", 42) + struct.pack("!i", -1) + struct.pack("!hh", 1, 1))
    assert messages.parse_bind(body) == ("portal", "stmt", [1], [struct.pack("!i", 42), None], [1])
    assert messages.parse_parse(b"s\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17") == ("s", "SELECT $1", [23])
    with pytest.raises(messages.ProtocolViolation):
        messages.parse_bind(b"p\x00s\x00\x00\x01")  # cut short


@pytest.mark.parametrize("text, hexed", [
    # ndigits, weight, sign, dscale, digits (base 10000)
    ("0", "0000" "0000" "0000" "0000"),
    ("1", "0001" "0000" "0000" "0000" "0001"),
    ("-12.345", "0002" "0000" "4000" "0003" "000c" "0d7a"),
    ("10000", "0001" "0001" "0000" "0000" "0001"),
    ("0.0001", "0001" "ffff" "0000" "0004" "0001"),
    ("1.50", "0002" "0000" "0000" "0002" "0001" "1388"),
])
def test_numeric_binary(text, hexed):
    assert types.numeric_binary(decimal.Decimal(text)).hex() == hexed
    assert types.numeric_from_binary(bytes.fromhex(hexed)) == decimal.Decimal(text)


def test_binary_date_timestamp_interval_epochs():
    table = pa.table({"d": pa.array([0], pa.int32()).cast(pa.date32()),
                      "t": pa.array([946684800000000], pa.timestamp("us")),
                      "i": pa.array([pa.scalar((1, 2, 3000), pa.month_day_nano_interval())])})
    data = rows.data_rows(table, [1, 1, 1])
    # 1970-01-01 is -10957 days from 2000-01-01; 2000-01-01 00:00 is 0 microseconds; interval = (us, days, months)
    assert data == messages.data_row([struct.pack("!i", -10957), struct.pack("!q", 0), struct.pack("!qii", 3, 2, 1)])


def test_text_output_like_postgresql():
    table = pa.table({"b": [True, None], "f": [float("inf"), 1.5], "ts": pa.array([1, 1_500_000], pa.timestamp("us")),
                      "l": [[1, None], []], "by": [b"\x01\xff", b""]})
    got = rows.data_rows(table, [0] * 5)
    assert got == (messages.data_row([b"t", b"Infinity", b"1970-01-01 00:00:00.000001", b"{1,NULL}", b"\\x01ff"])
                   + messages.data_row([None, b"1.5", b"1970-01-01 00:00:01.5", b"{}", b"\\x"]))
    assert types.interval_text(14, 3, 4 * 3600_000_000 + 5) == "1 year 2 mons 3 days 04:00:00.000005"


def test_parameter_decoding():
    batch = decode([struct.pack("!q", -5), b"2.50", b"t", struct.pack("!d", 0.25), "é".encode()],
                   [1, 0, 0, 1, 0], [types.INT8, types.NUMERIC, types.BOOL, types.FLOAT8, 0])
    assert batch.to_pylist() == [{"0": -5, "1": decimal.Decimal("2.50"), "2": True, "3": 0.25, "4": "é"}]


def test_scram_rfc7677_example():
    # RFC 7677 section 3: user "user", password "pencil"
    keys = Scram("pencil", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    exchange = keys.exchange(server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = exchange.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    wrong = Scram("pencil!", salt=keys.salt).exchange(server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    wrong.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(AuthFailed):
        wrong.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")


@pytest.mark.parametrize("table", [pa.table({"a": [""]}), pa.table({"a": ["", ""], "b": pa.array([1, 2], pa.int64())})])
def test_rows_of_empty_strings(table):
    # Every value of a column the same width 0 (psql's \d selects '' AS a column): the packed fixed-width
    # path cannot hold a zero-width value, the general one sends each as a 0-byte value (not NULL).
    expected = b"".join(messages.data_row([b"" if k == "a" else str(row[k]).encode() for k in table.column_names])
                        for row in table.to_pylist())
    assert rows.data_rows(table, [0] * table.num_columns) == expected


def test_arrays_text_and_binary():
    # PostgreSQL's array_send: ndim, has-NULL flag, element OID, (length, lower bound 1) per dimension,
    # then each element as a length (-1: NULL) and its binary value; an empty array has no dimensions.
    table = pa.table({"t": pa.array([["a", None, "b c"], None, []], pa.list_(pa.string()))})
    assert types.fields(table.schema, [0])[0].type_oid == 1009
    assert rows.data_rows(table, [0]) == (messages.data_row([b'{a,NULL,"b c"}']) + messages.data_row([None])
                                          + messages.data_row([b"{}"]))
    first = (struct.pack("!iiiii", 1, 1, 25, 3, 1) + struct.pack("!i", 1) + b"a" + struct.pack("!i", -1)
             + struct.pack("!i", 3) + b"b c")
    assert rows.data_rows(table, [1]) == (messages.data_row([first]) + messages.data_row([None])
                                          + messages.data_row([struct.pack("!iii", 0, 0, 25)]))
    numbers = pa.table({"i": pa.array([[1, None]], pa.list_(pa.int32())), "o": pa.array([[7]], pa.list_(pa.uint32()))})
    assert [f.type_oid for f in types.fields(numbers.schema, [1, 1])] == [1007, 1028]  # int4[], oid[]
    assert rows.data_rows(numbers, [1, 1]) == messages.data_row([
        struct.pack("!iiiii", 1, 1, 23, 2, 1) + struct.pack("!ii", 4, 1) + struct.pack("!i", -1),
        struct.pack("!iiiii", 1, 0, 26, 1, 1) + struct.pack("!iI", 4, 7)])
    assert rows.data_rows(numbers, [0, 0]) == messages.data_row([b"{1,NULL}", b"{7}"])
    nested = pa.table({"n": pa.array([[[1], [2]]], pa.list_(pa.list_(pa.int32())))})  # lists of lists stay text
    assert types.fields(nested.schema, [1])[0].type_oid == 25
    assert rows.data_rows(nested, [1]) == messages.data_row([b"{{1},{2}}"])


def test_array_parameters():
    # array_recv's input (asyncpg binds $1::oid[] so) and array_in's one-dimensional text, as Arrow lists
    oids = struct.pack("!iiIii", 1, 1, 26, 3, 1) + struct.pack("!iI", 4, 1007) + struct.pack("!i", -1) \
        + struct.pack("!iI", 4, 23)
    empty = struct.pack("!iiI", 0, 0, 23)
    batch = parameters.decode([oids, empty, b'{a,"b, c","d\\"e",NULL}', b"{ 1 , 2 }"], [1, 1, 0, 0],
                              [1028, 1007, 1009, 1016])
    assert batch.to_pylist() == [{"0": [1007, None, 23], "1": [], "2": ["a", "b, c", 'd"e', None], "3": [1, 2]}]
    for raw, fmt, oid in [(b'{"a', 0, 1009), (b"{{1}}", 0, 1007),
                          (struct.pack("!iiIii", 1, 0, 20, 1, 1) + struct.pack("!iq", 8, 5), 1, 1007)]:
        with pytest.raises(ivm.IvmError):
            parameters.decode([raw], [fmt], [oid])


def _fixed_width_table(n: int) -> tuple[pa.Table, list[list[bytes]]]:
    """A table of every fixed-width binary type over ``n`` rows (two Arrow chunks per column),
    and each row's values packed one by one as PostgreSQL sends them."""
    import datetime
    import random
    rng = random.Random(7)
    epoch = datetime.datetime(2000, 1, 1)
    ints = [rng.randrange(-2**15, 2**15) for _ in range(n)]
    bigs = [rng.randrange(-2**63, 2**63) for _ in range(n)]
    floats = [rng.uniform(-1e9, 1e9) for _ in range(n)]
    days = [rng.randrange(-20000, 20000) for _ in range(n)]
    micros = [rng.randrange(-2**50, 2**50) for _ in range(n)]
    dates = [datetime.date(1970, 1, 1) + datetime.timedelta(days=d) for d in days]
    stamps = [datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=m) for m in micros]
    times = [datetime.time(m % 24, m % 60, m % 59, m % 999_999) for m in (abs(x) for x in ints)]
    columns = {
        "i2": pa.array(ints, pa.int16()), "i4": pa.array(bigs, pa.int64()).cast(pa.int32(), safe=False),
        "i8": pa.array(bigs, pa.int64()), "f4": pa.array(floats, pa.float32()), "f8": pa.array(floats),
        "b": pa.array([i % 3 == 0 for i in ints]), "d": pa.array(dates, pa.date32()),
        "ts": pa.array(stamps, pa.timestamp("us")), "tz": pa.array(stamps, pa.timestamp("us", "UTC")),
        "t": pa.array(times, pa.time64("us")),
    }
    half = n // 2
    table = pa.table({k: pa.chunked_array([v.slice(0, half), v.slice(half)]) for k, v in columns.items()})
    i4 = columns["i4"].to_pylist()
    f4 = columns["f4"].to_pylist()
    expected = []
    for k in range(n):
        t = times[k]
        expected.append([
            struct.pack("!h", ints[k]), struct.pack("!i", i4[k]), struct.pack("!q", bigs[k]),
            struct.pack("!f", f4[k]), struct.pack("!d", floats[k]), struct.pack("!?", ints[k] % 3 == 0),
            struct.pack("!i", (dates[k] - epoch.date()).days),
            struct.pack("!q", (stamps[k] - epoch) // datetime.timedelta(microseconds=1)),
            struct.pack("!q", (stamps[k] - epoch) // datetime.timedelta(microseconds=1)),
            struct.pack("!q", ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond),
        ])
    return table, expected


def test_fixed_width_rows_are_packed_as_each_row_alone_would_be():
    """Results of only fixed-width binary values are packed a chunk at a time from whole columns
    (rows.py): the bytes are those of each row encoded on its own, over several chunks, for
    DataRow and for binary COPY (whose first message carries the header), and the same when a
    NULL sends the result down the general path."""
    n = 2 * rows.CHUNK_ROWS + 7
    table, expected = _fixed_width_table(n)
    assert rows.data_rows(table, [1] * table.num_columns) == b"".join(messages.data_row(r) for r in expected)
    copied = b"".join(bytes(m) for m in copy_binary.messages(table))
    framed = []
    for k, r in enumerate(expected):
        body = struct.pack("!h", len(r)) + b"".join(struct.pack("!i", len(v)) + v for v in r)
        framed.append(messages.copy_data((copy_binary.HEADER if k == 0 else b"") + body))
    assert copied == b"".join(framed) + messages.copy_data(copy_binary.TRAILER)
    with_null = table.set_column(2, "i8", pa.chunked_array([pa.array([None] + [0] * (n - 1), pa.int64())]))
    expected[0][2] = None
    for r in expected[1:]:
        r[2] = struct.pack("!q", 0)
    assert rows.data_rows(with_null, [1] * table.num_columns) == b"".join(messages.data_row(r) for r in expected)
