"""PostgreSQL's binary COPY format: Arrow columns out as tuples, tuples back in as Arrow columns.

The format (PostgreSQL's "COPY" reference page, "Binary Format"):

* a header: the 11-byte signature ``PGCOPY\\n\\377\\r\\n\\0``, Int32 flags
  (bit 16: each tuple carries an OID, which ivm refuses; bits 17-31 are
  critical and must be 0), then Int32 length of a header extension, which
  is skipped;
* per tuple: Int16 field count, then per field Int32 length (-1 for NULL)
  and that many bytes of the type's binary (``typsend``) representation,
  the format results use in binary (types.py);
* a trailer: Int16 -1.

Out (``COPY ... TO STDOUT (FORMAT binary)``): PostgreSQL sends one tuple
per CopyData message, the header in front of the first tuple and the
trailer in a message of its own, and clients rely on it (ADBC's PostgreSQL
driver reads the header and the first row from the first message, then one
row per message). A tuple is a DataRow's body, so rows.py assembles the
messages with type byte ``d`` without a Python loop over rows.

In (``COPY t FROM STDIN (FORMAT binary)``, ADBC's ``adbc_ingest``): the
stream is split into fields (``split``), then each column is decoded at
once from its fields' offsets (``column``). Splitting is vectorized when
every tuple has one layout (no NULLs, fixed-width types: the common
numeric table), else a loop over tuples that reads only the lengths.
A malformed stream is ``22P04`` (bad_copy_file_format) and a field that is
not its column type's binary form ``22P03`` (invalid_binary_representation),
as PostgreSQL answers; nothing is applied.

>>> import pyarrow as pa
>>> table = pa.table({"a": pa.array([1, None], pa.int32()), "b": ["x", "yz"]})
>>> data = b"".join(bytes(part) for part in messages(table))
>>> data[:5], data[5:24] == HEADER, data[24:39]  # CopyData of 38 bytes: the header, then the first tuple
(b'd\\x00\\x00\\x00&', True, b'\\x00\\x02\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x01\\x00\\x00\\x00\\x01x')
>>> data[-7:]  # the trailer, alone in the last CopyData
b'd\\x00\\x00\\x00\\x06\\xff\\xff'
>>> stream = b"".join(data[at + 5:at + 1 + int.from_bytes(data[at + 1:at + 5], "big")] for at in _frames(data))
>>> [c.to_pylist() for c in read(stream, table.schema)]
[[1, None], ['x', 'yz']]
>>> numbers = pa.table({"a": pa.array([1, 2], pa.int16()), "b": [0.5, -1.0]})  # one layout: split at once
>>> data = b"".join(bytes(part) for part in messages(numbers))
>>> stream = b"".join(data[at + 5:at + 1 + int.from_bytes(data[at + 1:at + 5], "big")] for at in _frames(data))
>>> [c.to_pylist() for c in read(stream, numbers.schema)]
[[1, 2], [0.5, -1.0]]
>>> [a.tolist() for a in _uniform(stream, 19, len(stream) - 2, 2)] == [a.tolist() for a in _walk(stream, 19, 2)]
True
"""

from __future__ import annotations

import decimal
import struct
from typing import Iterator

import numpy as np
import pyarrow as pa

from flight_server.pgwire import messages as wire
from flight_server.pgwire import rows, types
from flight_server.pgwire.errors import PgError
from sql_frontend.errors import ChangeError, UnsupportedError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
HEADER = SIGNATURE + struct.pack("!ii", 0, 0)  # no flags, no header extension
TRAILER = struct.pack("!h", -1)
BAD_FORMAT = "22P04"  # bad_copy_file_format
BAD_BINARY = "22P03"  # invalid_binary_representation
_WITH_OIDS = 1 << 16
_FIXED = {types.INT2: ">i2", types.INT4: ">i4", types.INT8: ">i8", types.OID: ">u4", types.FLOAT4: ">f4",
          types.FLOAT8: ">f8", types.BOOL: ">u1", types.DATE: ">i4", types.TIMESTAMP: ">i8",
          types.TIMESTAMPTZ: ">i8", types.TIME: ">i8"}


# --- out -----------------------------------------------------------------------------------------
def messages(table: pa.Table) -> Iterator[bytes | memoryview]:
    """The CopyData messages of ``table`` in binary COPY format, in pieces (rows.CHUNK_ROWS rows each).

    The first row's message also holds the header: its length grows by the
    header's, and the header goes between that length and the tuple.
    """
    first = True
    for data in rows.chunks(table, [1] * table.num_columns, b"d"):
        if first:
            length = int.from_bytes(bytes(data[1:5]), "big") + len(HEADER)
            yield b"d" + length.to_bytes(4, "big") + HEADER
            data, first = data[5:], False
        yield data
    yield wire.copy_data(HEADER + TRAILER if first else TRAILER)


def _frames(data: bytes) -> Iterator[int]:
    """Where each message of ``data`` (CopyData messages back to back) starts (for the doctest)."""
    at = 0
    while at < len(data):
        yield at
        at += 1 + int.from_bytes(data[at + 1:at + 5], "big")


# --- in ------------------------------------------------------------------------------------------
def read(data: bytes, schema: pa.Schema) -> list[pa.Array]:
    """The columns (of ``schema``'s types, in its order) of the tuples of a binary COPY stream."""
    start = _header(data)
    starts, lengths = split(data, start, len(schema))
    buffer = np.frombuffer(data, np.uint8)
    return [column(buffer, starts[:, k], lengths[:, k], f) for k, f in enumerate(schema)]


def _header(data: bytes) -> int:
    """Where the first tuple starts, after the header (checked)."""
    if not data.startswith(SIGNATURE):
        raise PgError(BAD_FORMAT, "COPY file signature not recognized; nothing was applied")
    if len(data) < len(HEADER):
        raise PgError(BAD_FORMAT, "invalid COPY file header (missing flags or extension length); nothing was applied")
    flags, extension = struct.unpack_from("!ii", data, len(SIGNATURE))
    if flags & _WITH_OIDS:
        raise PgError(BAD_FORMAT, "invalid COPY file header (WITH OIDS); nothing was applied")
    if flags >> 17 or flags < 0:
        raise PgError(BAD_FORMAT, "unrecognized critical flags in COPY file header; nothing was applied")
    if extension < 0 or len(HEADER) + extension > len(data):
        raise PgError(BAD_FORMAT, "invalid COPY file header (wrong length); nothing was applied")
    return len(HEADER) + extension


def split(data: bytes, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Each field's start and length (-1: NULL), shape (tuples, count), of the tuples from ``start`` on.

    A stream may end with the trailer or, as PostgreSQL accepts, at a tuple's end.
    """
    end = len(data) - 2 if data.endswith(TRAILER) else len(data)
    found = _uniform(data, start, end, count)
    return found if found is not None else _walk(data, start, count)


def _uniform(data: bytes, start: int, end: int, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The fields when every tuple has the first one's layout (checked on every tuple), else None."""
    if end - start < 2 or count == 0:
        return None
    widths, at = [], start + 2
    if struct.unpack_from("!h", data, start)[0] != count:
        return None
    for _ in range(count):
        if at + 4 > end:
            return None
        width = struct.unpack_from("!i", data, at)[0]
        if width < 0:
            return None
        widths.append(width)
        at += 4 + width
    size = at - start
    if (end - start) % size:
        return None
    layout = [("count", ">i2")]
    for k, width in enumerate(widths):
        layout += [(f"n{k}", ">i4"), (f"v{k}", f"V{width}")]
    tuples = np.frombuffer(data, np.dtype(layout), (end - start) // size, start)
    if (tuples["count"] != count).any() or any((tuples[f"n{k}"] != w).any() for k, w in enumerate(widths)):
        return None
    offsets = 2 + np.cumsum([4 + w for w in widths]) - np.asarray(widths)  # each value's place in a tuple
    starts = start + np.arange(len(tuples), dtype=np.int64)[:, None] * size + offsets[None, :]
    return starts, np.broadcast_to(np.asarray(widths, np.int32), starts.shape)


def _walk(data: bytes, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The fields, tuple by tuple (only the lengths are read here; values are decoded a column at a time)."""
    starts: list[int] = []
    lengths: list[int] = []
    int16, int32 = struct.Struct("!h").unpack_from, struct.Struct("!i").unpack_from
    at, size, tuples = start, len(data), 0
    while at < size:
        if at + 2 > size:
            raise PgError(BAD_FORMAT, f"unexpected EOF in COPY data, tuple {tuples + 1}; nothing was applied")
        fields = int16(data, at)[0]
        at += 2
        if fields == -1:
            if at != size:
                raise PgError(BAD_FORMAT, "received copy data after EOF marker; nothing was applied")
            break
        tuples += 1
        if fields != count:
            raise PgError(BAD_FORMAT, f"row field count is {fields}, expected {count} (tuple {tuples}); "
                                      "nothing was applied")
        for _ in range(count):
            if at + 4 > size:
                raise PgError(BAD_FORMAT, f"unexpected EOF in COPY data, tuple {tuples}; nothing was applied")
            length = int32(data, at)[0]
            at += 4
            if length < -1:
                raise PgError(BAD_FORMAT, f"invalid field size {length} in tuple {tuples}; nothing was applied")
            if at + length > size:
                raise PgError(BAD_FORMAT, f"unexpected EOF in COPY data: a field of {length} bytes in tuple "
                                          f"{tuples} ends past the data; nothing was applied")
            starts.append(at)
            lengths.append(length)
            at += max(length, 0)
    shape = (len(starts) // count if count else 0, count)
    return np.asarray(starts, np.int64).reshape(shape), np.asarray(lengths, np.int32).reshape(shape)


def column(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, field: pa.Field) -> pa.Array:
    """One column of type ``field.type`` from its fields' bytes (``data[start:start + length]``)."""
    kind = field.type
    oid = types.oid_of(kind)
    valid = lengths >= 0
    mask = None if valid.all() else ~valid
    if oid in _FIXED and kind != pa.uint64():
        width = np.dtype(_FIXED[oid]).itemsize
        if (lengths[valid] != width).any():
            raise PgError(BAD_BINARY, f"incorrect binary data format in column {field.name}: a value of type "
                                      f"{kind} is {width} bytes; nothing was applied")
        at = np.where(valid, starts, 0)[:, None] + np.arange(width)
        values = data[at].view(_FIXED[oid]).reshape(-1).astype(_FIXED[oid][1:])
        return _typed(values, mask, oid, kind, field.name)
    if oid == types.INTERVAL:
        return _intervals(data, starts, lengths, valid, field.name)
    if pa.types.is_nested(kind):
        raise UnsupportedError(f"COPY FROM into a column of type {kind} is not supported")
    if oid == types.NUMERIC:
        return _numeric(data, starts, lengths, kind, field.name)
    return _strings(data, starts, lengths, valid, mask, kind, field.name)


def _typed(values: np.ndarray, mask: np.ndarray | None, oid: int, kind: pa.DataType, name: str) -> pa.Array:
    if oid == types.BOOL:
        values = values != 0
    elif oid == types.DATE:
        return pa.array(values + types.EPOCH_DAYS, pa.int32(), mask=mask).cast(pa.date32()).cast(kind)
    elif oid in (types.TIMESTAMP, types.TIMESTAMPTZ):
        return pa.array(values + types.EPOCH_MICROS, pa.int64(), mask=mask).cast(pa.timestamp("us", kind.tz)).cast(kind)
    elif oid == types.TIME:
        return pa.array(values, pa.int64(), mask=mask).cast(pa.time64("us")).cast(kind)
    try:
        return pa.array(values, mask=mask).cast(kind)  # checked: an int4 of 70000 into a SMALLINT column fails
    except pa.ArrowInvalid as e:
        raise ChangeError(f"COPY {name}: value out of range for a column of type {kind}: {e}") from None


def _intervals(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray, name: str) -> pa.Array:
    """interval_send's (Int64 microseconds, Int32 days, Int32 months) as Arrow's (months, days, nanoseconds)."""
    if (lengths[valid] != 16).any():
        raise PgError(BAD_BINARY, f"incorrect binary data format in column {name}: an interval is 16 bytes; "
                                  "nothing was applied")
    sent = data[np.where(valid, starts, 0)[:, None] + np.arange(16)].view([("us", ">i8"), ("days", ">i4"),
                                                                            ("months", ">i4")]).reshape(-1)
    out = np.empty(len(sent), [("months", "<i4"), ("days", "<i4"), ("ns", "<i8")])
    out["months"], out["days"], out["ns"] = sent["months"], sent["days"], sent["us"] * 1000
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.month_day_nano_interval(), len(out), [validity, pa.py_buffer(out.tobytes())])


def _gather(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The bytes of every field, back to back (one fancy-indexing pass, as rows.py's assembly)."""
    offsets = np.cumsum(sizes) - sizes
    return data[np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(starts - offsets, sizes)]


def _strings(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray,
             mask: np.ndarray | None, kind: pa.DataType, name: str) -> pa.Array:
    sizes = np.maximum(lengths, 0).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    validity = None if mask is None else pa.array(valid).buffers()[1]
    array = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(sizes), [validity, pa.py_buffer(offsets),
                                             pa.py_buffer(_gather(data, starts, sizes))],
                                             null_count=-1 if mask is not None else 0)
    try:
        return array.cast(kind)
    except pa.ArrowInvalid:
        raise PgError("22021", f"COPY {name}: invalid byte sequence for encoding UTF8; nothing was applied") from None


def _numeric(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType, name: str) -> pa.Array:
    raw = data.tobytes()
    values: list[decimal.Decimal | None] = []
    try:
        for start, length in zip(starts.tolist(), lengths.tolist()):
            values.append(None if length < 0 else types.numeric_from_binary(raw[start:start + length]))
    except (struct.error, decimal.InvalidOperation):
        raise PgError(BAD_BINARY, f"incorrect binary data format in column {name} (numeric); "
                                  "nothing was applied") from None
    try:
        if kind == pa.uint64():
            return pa.array([None if v is None else int(v) for v in values], kind)
        return pa.array(values, kind)
    except (pa.ArrowInvalid, ValueError, decimal.InvalidOperation) as e:
        raise ChangeError(f"COPY {name}: numeric value does not fit a column of type {kind}: {e}") from None
