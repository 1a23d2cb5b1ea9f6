"""Bound parameter values: from PostgreSQL's text or binary format to one Arrow row.

Bind sends each value as bytes in text (format 0) or binary (format 1) with
the type OID the client gave in Parse (0 = let the server infer). The
values become an Arrow row and then SQL literals through
``flight_server.params`` — the path Flight SQL uses — so a value never
reaches the SQL as pasted text.

Types: integers, floats, numeric and booleans become typed values; text and
unspecified (0) values become strings, which DuckDB casts implicitly where
the context wants another type (``id = '7'``), as PostgreSQL does with
``unknown``-typed literals. Dates and timestamps become typed values in
binary, strings in text (DuckDB parses the ISO text).

``describe`` answers ParameterDescription: a type the client gave, else one
read from the statement's context (``col = $1`` takes the column's type,
``INSERT INTO t (a, b) VALUES ($1, $2)`` the target columns', ``$1::INT``
the cast's, ``LIMIT $1`` bigint), else text. Drivers such as asyncpg pick
their encoders from it.

>>> decode([b"7", None, b"\\x00\\x00\\x00\\x2a"], [0, 0, 1], [types.INT8, types.TEXT, types.INT4]).to_pylist()
[{'0': 7, '1': None, '2': 42}]
"""

from __future__ import annotations

import datetime
import struct

import pyarrow as pa
import sqlglot
from sqlglot import exp

import ivm
from flight_server import params
from flight_server.pgwire import types
from sql_frontend.errors import BindError, UnsupportedError

_INTS = {types.INT2: "!h", types.INT4: "!i", types.INT8: "!q", types.OID: "!I"}
_FLOATS = {types.FLOAT4: "!f", types.FLOAT8: "!d"}
_EPOCH = datetime.datetime(2000, 1, 1)
_TRUE = {"t", "true", "1", "on", "yes", "y"}
_FALSE = {"f", "false", "0", "off", "no", "n"}


def _text_value(raw: bytes, oid: int) -> pa.Scalar:
    if oid in types.ELEMENTS:
        return _array([None if item is None else _text_value(item.encode(), types.ELEMENTS[oid])
                        for item in _array_items(raw.decode("utf-8"), oid)], types.ELEMENTS[oid])
    text = raw.decode("utf-8")
    try:
        if oid in _INTS:
            return pa.scalar(int(text), pa.int64())
        if oid in _FLOATS:
            return pa.scalar(float(text), pa.float64())
        if oid == types.NUMERIC:
            return _numeric(types.decimal.Decimal(text))
        if oid == types.BOOL:
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError(text)
            return pa.scalar(word in _TRUE, pa.bool_())
    except (ValueError, ArithmeticError):
        raise BindError(f"invalid input syntax for type {_name(oid)}: {text[:60]!r}") from None
    if oid == types.BYTEA:
        if not text.startswith("\\x"):
            raise UnsupportedError("bytea parameters in text format must use the hex format (\\x...)")
        return pa.scalar(bytes.fromhex(text[2:]), pa.binary())
    return pa.scalar(text, pa.string())


def _binary_value(raw: bytes, oid: int) -> pa.Scalar:
    if oid in types.ELEMENTS:
        return _array_binary(raw, oid)
    try:
        if oid in _INTS:
            return pa.scalar(struct.unpack(_INTS[oid], raw)[0], pa.int64())
        if oid in _FLOATS:
            return pa.scalar(struct.unpack(_FLOATS[oid], raw)[0], pa.float64())
        if oid == types.BOOL:
            return pa.scalar(raw != b"\x00", pa.bool_())
        if oid == types.NUMERIC:
            return _numeric(types.numeric_from_binary(raw))
        if oid == types.DATE:
            days = struct.unpack("!i", raw)[0]
            return pa.scalar(days + types.EPOCH_DAYS, pa.int32()).cast(pa.date32())
        if oid in (types.TIMESTAMP, types.TIMESTAMPTZ):
            micros = struct.unpack("!q", raw)[0] + types.EPOCH_MICROS
            return pa.scalar(micros, pa.int64()).cast(pa.timestamp("us", "UTC" if oid == types.TIMESTAMPTZ else None))
        if oid == types.TIME:
            return pa.scalar(struct.unpack("!q", raw)[0], pa.int64()).cast(pa.time64("us"))
        if oid == types.INTERVAL:
            micros, days, months = struct.unpack("!qii", raw)
            return pa.scalar(types.interval_text(months, days, micros), pa.string())
        if oid == types.BYTEA:
            return pa.scalar(raw, pa.binary())
        if oid in (types.TEXT, types.VARCHAR, types.BPCHAR, types.NAME, types.UNKNOWN, 0):
            return pa.scalar(raw.decode("utf-8"), pa.string())
    except (struct.error, UnicodeDecodeError, ArithmeticError):
        raise BindError(f"incorrect binary data format for a parameter of type {_name(oid)}") from None
    raise UnsupportedError(f"parameters of type OID {oid} in binary format are not supported; send them as text")


def _array_binary(raw: bytes, oid: int) -> pa.Scalar:
    """A one-dimensional array in array_send format (asyncpg sends ``$1::oid[]`` so), as an Arrow list."""
    try:
        dimensions, _, element = struct.unpack_from("!iiI", raw)
        if dimensions > 1:
            raise UnsupportedError("array parameters of more than one dimension are not supported")
        if dimensions == 1 and element != types.ELEMENTS[oid]:
            raise BindError(f"a parameter of type {_name(oid)} holds elements of type {_name(element)}")
        at, count = 12, 0
        if dimensions:
            count, _ = struct.unpack_from("!ii", raw, at)
            at += 8
        items = []
        for _ in range(count):
            length = struct.unpack_from("!i", raw, at)[0]
            at += 4
            items.append(None if length < 0 else _binary_value(raw[at:at + length], element))
            at += max(length, 0)
    except struct.error:
        raise BindError(f"incorrect binary data format for a parameter of type {_name(oid)}") from None
    return _array(items, types.ELEMENTS[oid])


def _array_items(text: str, oid: int) -> list[str | None]:
    """The elements of a one-dimensional array literal ``{1,"a b",NULL}`` (PostgreSQL's array_in)."""
    try:
        return _split_array(text.strip(), oid)
    except IndexError:  # an unterminated quote or escape
        raise BindError(f"invalid input syntax for type {_name(oid)}: {text[:60]!r}") from None


def _split_array(text: str, oid: int) -> list[str | None]:
    if not (text.startswith("{") and text.endswith("}")) or "{" in text[1:-1]:
        raise BindError(f"invalid input syntax for type {_name(oid)} (one-dimensional arrays only): {text[:60]!r}")
    items: list[str | None] = []
    body, i = text[1:-1], 0
    while i < len(body) and body.strip():
        while body[i] == " ":
            i += 1
        if body[i] == '"':
            i, value = i + 1, []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                value.append(body[i])
                i += 1
            items.append("".join(value))
            i += 1
        else:
            end = body.find(",", i)
            end = len(body) if end < 0 else end
            word = body[i:end].strip()
            items.append(None if word.upper() == "NULL" else word)
            i = end
        while i < len(body) and body[i] == " ":
            i += 1
        if i < len(body):
            if body[i] != ",":
                raise BindError(f"invalid input syntax for type {_name(oid)}: {text[:60]!r}")
            i += 1
    return items


def _array(items: list[pa.Scalar | None], element: int) -> pa.Scalar:
    kinds = {item.type for item in items if item is not None}
    kind = kinds.pop() if len(kinds) == 1 else arrow_type(element)
    return pa.scalar([None if item is None else item.as_py() for item in items], pa.list_(kind))


def _numeric(value) -> pa.Scalar:
    if value.is_nan() or value.is_infinite():
        return pa.scalar(float(value), pa.float64())
    digits, exponent = len(value.as_tuple().digits), value.as_tuple().exponent
    scale = max(0, -exponent)
    precision = max(digits + max(0, exponent), scale, 1)
    if precision > 38:
        return pa.scalar(float(value), pa.float64())
    return pa.scalar(value, pa.decimal128(precision, scale))


def _name(oid: int) -> str:
    if oid in types.ELEMENTS:
        return _name(types.ELEMENTS[oid]) + "[]"
    return {types.INT2: "smallint", types.INT4: "integer", types.INT8: "bigint", types.FLOAT4: "real",
            types.FLOAT8: "double precision", types.NUMERIC: "numeric", types.BOOL: "boolean", types.OID: "oid",
            types.TEXT: "text",
            types.DATE: "date", types.TIMESTAMP: "timestamp", types.TIMESTAMPTZ: "timestamptz"}.get(oid, f"OID {oid}")


def decode(values: list[bytes | None], formats: list[int], oids: list[int]) -> pa.RecordBatch:
    """One Arrow row: parameter n (column ``str(n - 1)``) from its bytes, format and type OID."""
    if len(formats) not in (0, 1, len(values)):
        raise BindError(f"{len(formats)} parameter format codes for {len(values)} parameters")
    columns = []
    for i, raw in enumerate(values):
        fmt = formats[i] if len(formats) > 1 else (formats[0] if formats else 0)
        oid = oids[i] if i < len(oids) else 0
        if raw is None:
            columns.append(pa.nulls(1))
            continue
        if fmt not in (0, 1):
            raise BindError(f"unknown parameter format code {fmt}")
        scalar = _binary_value(raw, oid) if fmt == 1 else _text_value(raw, oid)
        columns.append(pa.array([scalar.as_py()], scalar.type))
    return pa.record_batch(columns, names=[str(i) for i in range(len(values))])


# --- ParameterDescription ------------------------------------------------------------------------
_SQL_TYPES = {"BIGINT": types.INT8, "INT": types.INT4, "INTEGER": types.INT4, "SMALLINT": types.INT2,
              "TINYINT": types.INT2, "DOUBLE": types.FLOAT8, "FLOAT": types.FLOAT4, "REAL": types.FLOAT4,
              "DECIMAL": types.NUMERIC, "BOOLEAN": types.BOOL, "DATE": types.DATE, "TIMESTAMP": types.TIMESTAMP,
              "TIMESTAMPTZ": types.TIMESTAMPTZ, "INTERVAL": types.INTERVAL, "VARBINARY": types.BYTEA,
              "BLOB": types.BYTEA, "TIME": types.TIME}


def describe(db: ivm.Database, sql: str, count: int, given: list[int]) -> list[int]:
    """Parameter type OIDs for ParameterDescription (see the module docstring)."""
    oids = [given[i] if i < len(given) and given[i] else 0 for i in range(count)]
    if all(oids) or not count:
        return oids
    try:
        tree = sqlglot.parse_one(params.numbered(sql), dialect=params.DIALECT)
    except (sqlglot.errors.ParseError, ivm.IvmError):
        tree = None
    if tree is not None:
        columns = {}
        for info in db.objects():
            for f in info.schema:
                columns.setdefault(f.name, types.oid_of(f.type))
        for number, oid in _inferred(tree, columns, db).items():
            if 1 <= number <= count and not oids[number - 1]:
                oids[number - 1] = oid
    return [oid or types.TEXT for oid in oids]


def _cast_type(to: exp.DataType) -> int:
    """The type OID of a cast's target (``$1::INT``, ``$1::oid[]``: asyncpg's type query), 0 if not known."""
    if to.this == exp.DataType.Type.ARRAY and len(to.expressions) == 1:
        element = _cast_type(to.expressions[0])
        return types.ARRAYS.get(element, 0)
    if to.this == exp.DataType.Type.USERDEFINED:
        return types.OID if str(to.args.get("kind") or "").lower() in ("oid", "pg_catalog.oid") else 0
    return _SQL_TYPES.get(to.this.name, 0)


def _number(node: exp.Expression) -> int | None:
    if isinstance(node, exp.Placeholder) and str(node.this).isdigit():
        return int(node.this)
    return None


def _inferred(tree: exp.Expression, columns: dict[str, int], db: ivm.Database) -> dict[int, int]:
    found: dict[int, int] = {}
    for node in tree.find_all(exp.Placeholder):
        number = _number(node)
        parent = node.parent
        if number is None or parent is None:
            continue
        if isinstance(parent, exp.Cast):
            oid = _cast_type(parent.to)
            if oid:
                found[number] = oid
        elif isinstance(parent, (exp.Limit, exp.Offset)):
            found[number] = types.INT8
        elif isinstance(parent, (exp.Binary, exp.In, exp.Between)):
            for other in parent.find_all(exp.Column):
                if other.name in columns:
                    found[number] = columns[other.name]
                    break
    insert = tree if isinstance(tree, exp.Insert) else None
    if insert is not None and isinstance(insert.expression, exp.Values):
        found.update(_insert_types(insert, db))
    return found


def _insert_types(insert: exp.Insert, db: ivm.Database) -> dict[int, int]:
    target = insert.this
    table = target.this if isinstance(target, exp.Schema) else target
    name = table.name.lower() if isinstance(table, exp.Table) else ""
    info = next((o for o in db.objects() if o.name == name), None)
    if info is None:
        return {}
    names = [c.name.lower() for c in target.expressions] if isinstance(target, exp.Schema) else info.schema.names
    kinds = {f.name: types.oid_of(f.type) for f in info.schema}
    found = {}
    for row in insert.expression.expressions:
        for column, value in zip(names, row.expressions):
            number = _number(value)
            if number is not None and column in kinds:
                found[number] = kinds[column]
    return found


_ARROW = {types.BOOL: pa.bool_(), types.INT2: pa.int64(), types.INT4: pa.int64(), types.INT8: pa.int64(),
          types.OID: pa.int64(),
          types.FLOAT4: pa.float64(), types.FLOAT8: pa.float64(), types.NUMERIC: pa.decimal128(38, 10),
          types.DATE: pa.date32(), types.TIMESTAMP: pa.timestamp("us"), types.TIMESTAMPTZ: pa.timestamp("us", "UTC"),
          types.BYTEA: pa.binary(), types.TIME: pa.time64("us")}


def arrow_type(oid: int) -> pa.DataType:
    """The Arrow type a parameter of type ``oid`` is bound as (for typing NULLs before values are known)."""
    if oid in types.ELEMENTS:
        return pa.list_(arrow_type(types.ELEMENTS[oid]))
    return _ARROW.get(oid, pa.string())
