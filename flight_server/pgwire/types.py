"""PostgreSQL types of ivm's Arrow columns: OIDs, and each column's text and binary encodings.

A result column is described by its type OID (pg_type.oid of PostgreSQL's
built-in catalog, stable across versions) and sent in the format the client
asked for in Bind (0 text, 1 binary). Text is what PostgreSQL's output
functions print (``t``/``f``, ISO dates, ``Infinity``); binary is the
``typsend`` format: big-endian integers and IEEE floats, dates as days and
timestamps as microseconds since 2000-01-01, intervals as (microseconds,
days, months), numeric as base-10000 digits with weight, sign and scale.

Each encoder turns a whole Arrow column into ``Cells`` (one byte buffer,
per-row start and length, -1 for NULL) with Arrow compute or numpy where it
can, so a 100k-row result is not a Python loop per value; the rarer types
(interval, bytea text, numeric binary, lists) go value by value.

Lists of scalars are PostgreSQL arrays (``text[]``, ``int4[]``…: in text
``{a,"b c",NULL}`` or binary ``array_send`` format), so drivers return Python
lists (SQLAlchemy's reflection reads an ``array_agg`` of key columns; see
``ARRAYS``). Columns of types PostgreSQL has no counterpart for here (lists
of lists, structs, maps) are sent as ``text`` in PostgreSQL's array/record
literal style.

>>> oid_of(pa.int64()), oid_of(pa.decimal128(12, 2)), oid_of(pa.list_(pa.string())), oid_of(pa.list_(pa.int32()))
(20, 1700, 1009, 1007)
>>> oid_of(pa.list_(pa.list_(pa.int32()))), oid_of(pa.list_(pa.struct([("a", pa.int8())])))
(25, 25)
>>> numeric_binary(decimal.Decimal("-12.345")).hex()
'0002000040000003000c0d7a'
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flight_server.pgwire.messages import Field
from sql_frontend.errors import ChangeError, UnsupportedError

BOOL, BYTEA, INT8, INT2, INT4, TEXT, OID, FLOAT4, FLOAT8, UNKNOWN = 16, 17, 20, 21, 23, 25, 26, 700, 701, 705
VARCHAR, BPCHAR, NAME, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = 1043, 1042, 19, 1082, 1083, 1114, 1184, 1186, 1700
SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8, TIMESTAMP: 8, TIMESTAMPTZ: 8,
         INTERVAL: 16, OID: 4}
EPOCH_DAYS = 10957  # days from 1970-01-01 to 2000-01-01, PostgreSQL's epoch
EPOCH_MICROS = EPOCH_DAYS * 86_400_000_000


# Lists of these element types are sent as PostgreSQL arrays (element OID -> array OID), so drivers return
# lists (SQLAlchemy's reflection reads an array_agg of key column names). pg_type lists them
# (ivm/reads/system_relations.py): asyncpg decodes text[] by itself, but for the others it first runs its type
# introspection query over pg_type (typelem, typarray) and pg_range. Other lists (of lists, structs, maps)
# are sent as text.
ARRAYS = {BOOL: 1000, BYTEA: 1001, INT2: 1005, INT4: 1007, TEXT: 1009, INT8: 1016, OID: 1028, FLOAT4: 1021,
          FLOAT8: 1022, TIMESTAMP: 1115, DATE: 1182, TIME: 1183, TIMESTAMPTZ: 1185, INTERVAL: 1187, NUMERIC: 1231}
ELEMENTS = {array: element for element, array in ARRAYS.items()}


def oid_of(kind: pa.DataType) -> int:
    """The PostgreSQL type OID a column of Arrow type ``kind`` is sent as."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = kind.value_type
        if pa.types.is_string(element) or pa.types.is_large_string(element):
            return ARRAYS[TEXT]
        if pa.types.is_nested(element) or pa.types.is_dictionary(element) or oid_of(element) == TEXT:
            return TEXT  # (a list of structs, of lists, of NULLs...)
        return ARRAYS.get(oid_of(element), TEXT)
    if pa.types.is_boolean(kind):
        return BOOL
    if kind in (pa.int8(), pa.int16()):
        return INT2
    if kind in (pa.int32(), pa.uint8(), pa.uint16()):
        return INT4
    if kind == pa.uint32():
        # PostgreSQL's unsigned 4-byte type: the catalog's OID columns are uint32 (ivm/reads/system_relations.py), and
        # asyncpg's type introspection needs its oid[] results typed as oid[] (it decodes that one without asking)
        return OID
    if kind == pa.int64():
        return INT8
    if pa.types.is_floating(kind):
        return FLOAT8 if kind == pa.float64() else FLOAT4
    if pa.types.is_decimal(kind) or kind == pa.uint64():
        return NUMERIC
    if pa.types.is_date(kind):
        return DATE
    if pa.types.is_timestamp(kind):
        return TIMESTAMPTZ if kind.tz else TIMESTAMP
    if pa.types.is_time(kind):
        return TIME
    if kind == pa.month_day_nano_interval():
        return INTERVAL
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return BYTEA
    return TEXT  # strings, lists, structs, maps, NULL


def fields(schema: pa.Schema, formats: list[int]) -> list[Field]:
    """RowDescription fields of a result with these column formats."""
    out = []
    for f, fmt in zip(schema, formats):
        oid = oid_of(f.type)
        modifier = -1
        if oid == NUMERIC and pa.types.is_decimal(f.type):
            modifier = ((f.type.precision << 16) | f.type.scale) + 4  # how PostgreSQL stores numeric(p, s)
        out.append(Field(f.name, oid, SIZES.get(oid, -1), fmt, modifier))
    return out


def formats_for(count: int, codes: list[int]) -> list[int]:
    """Bind's result format codes, one per column: none = all text, one = all alike, else one each."""
    if not codes:
        return [0] * count
    if len(codes) == 1:
        return codes * count
    if len(codes) != count:
        raise ChangeError(f"{len(codes)} result format codes for {count} columns")
    return list(codes)


@dataclass
class Cells:
    """A column's encoded values: ``data[starts[i]:starts[i] + lengths[i]]``; length -1 = NULL."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int32


def _strings(array: pa.Array) -> Cells:
    """Cells of a string (or binary) array: its own buffers, no copy of the text."""
    array = array.cast(pa.large_binary()) if not pa.types.is_large_binary(array.type) else array
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[array.offset:array.offset + len(array) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets).astype(np.int32)
    if array.null_count:
        lengths[np.asarray(array.is_null())] = -1
    return Cells(data, offsets[:-1], lengths)


def _fixed(values: np.ndarray, valid: np.ndarray | None) -> Cells:
    """Cells of fixed-width big-endian values (``values`` already in network byte order)."""
    width = values.dtype.itemsize
    n = len(values)
    lengths = np.full(n, width, np.int32)
    if valid is not None:
        lengths[~valid] = -1
    return Cells(np.ascontiguousarray(values).view(np.uint8), np.arange(n, dtype=np.int64) * width, lengths)


def _python(array: pa.Array, encode) -> Cells:
    """Cells built value by value (for the rarer types)."""
    values = [None if v is None else encode(v) for v in array.to_pylist()]
    return _strings(pa.array(values, pa.large_binary()))


def _valid(array: pa.Array) -> np.ndarray | None:
    return np.asarray(array.is_valid()) if array.null_count else None


def _numbers(array: pa.Array, dtype: str) -> np.ndarray:
    """Native-order values (NULLs as 0) of the type ``dtype`` names in network order."""
    return np.asarray(array.fill_null(0) if array.null_count else array, dtype=dtype.lstrip(">"))


def encode_column(array: pa.Array, fmt: int) -> Cells:
    """Encode one result column in format ``fmt`` (0 text, 1 binary)."""
    kind = array.type
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(kind):
        return encode_column(array.dictionary_decode(), fmt)
    oid = oid_of(kind)
    if fmt == 1:
        return _binary(array, oid)
    return _text(array, oid)


def fixed_values(array: pa.Array, oid: int) -> tuple[np.ndarray, str] | None:
    """A fixed-width column's values as PostgreSQL's binary form holds them, in native byte order
    (NULLs as 0), and the big-endian dtype they are sent as; None for other types."""
    kind = array.type
    if oid in (INT2, INT4, INT8, OID, FLOAT4, FLOAT8) and kind != pa.uint64():
        dtype = {INT2: ">i2", INT4: ">i4", INT8: ">i8", OID: ">u4", FLOAT4: ">f4", FLOAT8: ">f8"}[oid]
        return _numbers(array, dtype), dtype
    if oid == BOOL:
        return _numbers(array.cast(pa.uint8()), ">u1"), ">u1"
    if oid == DATE:
        return np.asarray(array.cast(pa.int32()).fill_null(0), np.int64) - EPOCH_DAYS, ">i4"
    if oid in (TIMESTAMP, TIMESTAMPTZ, TIME):
        unit = pa.timestamp("us", kind.tz) if oid != TIME else pa.time64("us")
        micros = np.asarray(array.cast(unit).cast(pa.int64()).fill_null(0), np.int64)
        return micros - (EPOCH_MICROS if oid != TIME else 0), ">i8"
    return None


def _binary(array: pa.Array, oid: int) -> Cells:
    kind = array.type
    fixed = fixed_values(array, oid)
    if fixed is not None:
        values, dtype = fixed
        return _fixed(values.astype(dtype), _valid(array))
    if oid == INTERVAL:
        return _python(array, lambda v: struct.pack("!qii", v.nanoseconds // 1000, v.days, v.months))
    if oid == NUMERIC:
        return _python(array, lambda v: numeric_binary(decimal.Decimal(v)))
    if oid == BYTEA or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return _strings(array)
    if oid in ELEMENTS:
        return _array_binary(array, ELEMENTS[oid])
    return _text(array, oid)  # text-typed columns (other lists, structs): binary text is the UTF-8 text


def _array_binary(array: pa.Array, element: int) -> Cells:
    """PostgreSQL's binary array (array_send): dimensions, NULL flag, element OID, then each element's bytes."""
    values = _binary(array.flatten(), element)  # every list's elements, in order
    data = values.data.tobytes()
    offsets = np.asarray(array.offsets)
    out, at = [], 0
    for valid, start, end in zip(np.asarray(array.is_valid()), offsets[:-1], offsets[1:]):
        if not valid:
            out.append(None)
            continue
        lengths = values.lengths[at:at + end - start]
        starts = values.starts[at:at + end - start]
        at += end - start
        header = struct.pack("!iii", 1 if end > start else 0, int((lengths < 0).any()), element)
        parts = [header + (struct.pack("!ii", end - start, 1) if end > start else b"")]
        for begin, length in zip(starts.tolist(), lengths.tolist()):
            parts.append(struct.pack("!i", length) + (data[begin:begin + length] if length > 0 else b""))
        out.append(b"".join(parts))
    return _strings(pa.array(out, pa.large_binary()))


def _text(array: pa.Array, oid: int) -> Cells:
    kind = array.type
    if oid == BOOL:
        return _strings(pc.if_else(array, "t", "f"))
    if oid in (INT2, INT4, INT8, OID) or (oid == NUMERIC and pa.types.is_decimal(kind)) or kind == pa.uint64():
        return _strings(array.cast(pa.string()))
    if oid in (FLOAT4, FLOAT8):
        floats = array.cast(pa.float64())
        if pc.any(pc.invert(pc.is_finite(floats))).as_py():
            return _python(floats, lambda v: _float_text(v).encode())
        return _strings(array.cast(pa.string()))
    if oid == DATE:
        return _strings(array.cast(pa.string()))
    if oid in (TIMESTAMP, TIMESTAMPTZ, TIME):
        if oid == TIME:
            text = array.cast(pa.time64("us")).cast(pa.string())
        else:
            text = pc.strftime(array.cast(pa.timestamp("us", kind.tz)), "%Y-%m-%d %H:%M:%S")
        # PostgreSQL prints no trailing zeros of the fraction ("05.5", "05")
        text = pc.replace_substring_regex(text, r"\.0+$", "")
        text = pc.replace_substring_regex(text, r"(\.\d*?)0+$", r"\1")
        if oid == TIMESTAMPTZ:
            text = pc.binary_join_element_wise(text, pa.scalar("+00"), "")
        return _strings(text)
    if oid == INTERVAL:
        return _python(array, lambda v: interval_text(v.months, v.days, v.nanoseconds // 1000).encode())
    if oid == BYTEA:
        return _python(array, lambda v: b"\\x" + bytes(v).hex().encode())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return _strings(array)
    if pa.types.is_null(kind):
        return _strings(pa.nulls(len(array), pa.large_binary()))
    return _python(array, lambda v: literal_text(v).encode())


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def interval_text(months: int, days: int, micros: int) -> str:
    """PostgreSQL's default (``IntervalStyle postgres``) output: ``1 year 2 mons 3 days 04:05:06``."""
    parts = []
    years, months = divmod(abs(months), 12) if months >= 0 else (-(-months // 12), -(-months % 12))
    for amount, unit in ((years if months >= 0 else years, "year"), (months, "mon"), (days, "day")):
        if amount:
            parts.append(f"{amount} {unit}{'s' if abs(amount) != 1 else ''}")
    if micros or not parts:
        sign = "-" if micros < 0 else ""
        seconds, fraction = divmod(abs(micros), 1_000_000)
        hours, seconds = divmod(seconds, 3600)
        minutes, seconds = divmod(seconds, 60)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        parts.append(clock + (f".{fraction:06d}".rstrip("0") if fraction else ""))
    return " ".join(parts)


def literal_text(value) -> str:
    """PostgreSQL's text of a value inside an array or record literal (lists become ``{1,2,NULL}``)."""
    if isinstance(value, list):
        return "{" + ",".join("NULL" if v is None else _element(v) for v in value) + "}"
    if isinstance(value, dict):
        return "(" + ",".join("" if v is None else _element(v) for v in value.values()) + ")"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return str(value)


def _element(value) -> str:
    text = literal_text(value)
    if isinstance(value, (list, dict)) or (text and not any(c in text for c in ',{}()" \\') and text.upper() != "NULL"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def numeric_binary(value: decimal.Decimal) -> bytes:
    """PostgreSQL's binary numeric: ndigits, weight, sign, dscale (int16 each), then base-10000 digits.

    The digits are groups of four decimal digits aligned on the decimal
    point; ``weight`` is the power of 10000 of the first group. Leading and
    trailing zero groups are left out (implied by weight and ndigits).
    """
    if value.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    scale = max(0, -value.as_tuple().exponent)
    whole, _, fraction = format(value.copy_abs(), "f").partition(".")
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction += "0" * (-len(fraction) % 4)
    groups = [int(whole[i:i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    sign = 0x4000 if value.is_signed() and groups else 0
    return struct.pack(f"!hhHh{len(groups)}h", len(groups), weight, sign, scale, *groups)


def numeric_from_binary(data: bytes) -> decimal.Decimal:
    """The value of a binary numeric (a parameter sent in binary)."""
    count, weight, sign, scale = struct.unpack_from("!hhHh", data)
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    groups = struct.unpack_from(f"!{count}h", data, 8)
    digits = "".join(f"{g:04d}" for g in groups) or "0"
    value = decimal.Decimal(digits).scaleb(4 * (weight - count + 1), _WIDE)
    value = value.quantize(decimal.Decimal(1).scaleb(-scale), context=_WIDE)
    return -value if sign == 0x4000 else value


_WIDE = decimal.Context(prec=1000)  # numeric has up to 131072 digits before the point; parameters are far smaller


def text_values(array: pa.Array) -> list[str | None]:
    """A column's values as PostgreSQL prints them (for COPY TO), None for NULL."""
    cells = encode_column(array, 0)
    data = cells.data.tobytes()
    return [None if n < 0 else data[s:s + n].decode("utf-8") for s, n in zip(cells.starts.tolist(), cells.lengths.tolist())]


_BOOL_WORDS = {"t": True, "true": True, "1": True, "on": True, "yes": True, "y": True,
               "f": False, "false": False, "0": False, "off": False, "no": False, "n": False}


def from_text(values: list[str | None], kind: pa.DataType) -> pa.Array:
    """A column of type ``kind`` from PostgreSQL text values (COPY FROM); a bad value is a ChangeError."""
    strings = pa.array(values, pa.string())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return strings.cast(kind)
    if pa.types.is_boolean(kind):
        try:
            return pa.array([None if v is None else _BOOL_WORDS[v.strip().lower()] for v in values], pa.bool_())
        except KeyError as e:
            raise ChangeError(f"invalid input syntax for type boolean: {e.args[0]!r}") from None
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        if any(v is not None and not v.startswith("\\x") for v in values):
            raise ChangeError("bytea values must be in hex format (\\x...)")
        return pa.array([None if v is None else bytes.fromhex(v[2:]) for v in values], kind)
    if kind == pa.month_day_nano_interval() or pa.types.is_nested(kind):
        raise UnsupportedError(f"COPY FROM into a column of type {kind} is not supported")
    try:
        return strings.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ChangeError(f"invalid input for a column of type {kind}: {e}") from None
