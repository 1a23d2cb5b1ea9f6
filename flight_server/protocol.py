"""The Flight SQL messages ivm speaks, as a small protobuf codec.

Flight SQL wraps its commands in ``google.protobuf.Any``; the fields we need
are few and flat, so a hand codec (varints and length-delimited fields) is
enough and needs no generated code. Field numbers are those of
``format/FlightSql.proto`` in apache/arrow.

>>> body = pack("CommandStatementQuery", query="SELECT 1")
>>> unpack(body)
('CommandStatementQuery', {'query': 'SELECT 1'})
>>> decode("DoPutUpdateResult", encode("DoPutUpdateResult", record_count=-1))
{'record_count': -1}
"""

from __future__ import annotations

from typing import Any

from flight_server.errors import InvalidArgument

TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

# Field kinds. Scalars are encoded only when set (and bytes only when
# non-empty: the Go client parses a present-but-empty parameter_schema).
STRING, BYTES, BOOL, INT64, INT32, UINT32_LIST, STRING_LIST, STRING_MAP = (
    "string", "bytes", "bool", "int64", "int32", "uint32*", "string*", "map")

MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Any": {1: ("type_url", STRING), 2: ("value", BYTES)},
    "CommandStatementQuery": {1: ("query", STRING), 2: ("transaction_id", BYTES)},
    "CommandStatementUpdate": {1: ("query", STRING), 2: ("transaction_id", BYTES)},
    "TicketStatementQuery": {1: ("statement_handle", BYTES)},
    "ActionCreatePreparedStatementRequest": {1: ("query", STRING), 2: ("transaction_id", BYTES)},
    "ActionCreatePreparedStatementResult": {
        1: ("prepared_statement_handle", BYTES), 2: ("dataset_schema", BYTES),
        3: ("parameter_schema", BYTES), 4: ("is_update", BOOL)},
    "ActionClosePreparedStatementRequest": {1: ("prepared_statement_handle", BYTES)},
    "CommandPreparedStatementQuery": {1: ("prepared_statement_handle", BYTES)},
    "CommandPreparedStatementUpdate": {1: ("prepared_statement_handle", BYTES)},
    "DoPutUpdateResult": {1: ("record_count", INT64)},
    "DoPutPreparedStatementResult": {1: ("prepared_statement_handle", BYTES)},
    "TableDefinitionOptions": {1: ("if_not_exist", INT32), 2: ("if_exists", INT32)},
    "CommandStatementIngest": {
        1: ("table_definition_options", "TableDefinitionOptions"), 2: ("table", STRING),
        3: ("schema", STRING), 4: ("catalog", STRING), 5: ("temporary", BOOL),
        6: ("transaction_id", BYTES), 1000: ("options", STRING_MAP)},
    "CommandGetSqlInfo": {1: ("info", UINT32_LIST)},
    "CommandGetCatalogs": {},
    "CommandGetDbSchemas": {1: ("catalog", STRING), 2: ("db_schema_filter_pattern", STRING)},
    "CommandGetTables": {
        1: ("catalog", STRING), 2: ("db_schema_filter_pattern", STRING),
        3: ("table_name_filter_pattern", STRING), 4: ("table_types", STRING_LIST),
        5: ("include_schema", BOOL)},
    "CommandGetTableTypes": {},
    "CommandGetPrimaryKeys": {1: ("catalog", STRING), 2: ("db_schema", STRING), 3: ("table", STRING)},
    "MapEntry": {1: ("key", STRING), 2: ("value", STRING)},
}

# TableDefinitionOptions enums
IF_NOT_EXIST = {0: "unspecified", 1: "create", 2: "fail"}
IF_EXISTS = {0: "unspecified", 1: "fail", 2: "append", 3: "replace"}


class ProtocolError(InvalidArgument):
    """Bytes that are not the message they claim to be (INVALID_ARGUMENT)."""


# --- wire format -------------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values take ten bytes, as protobuf does
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtocolError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, raw value) for every field in ``data``."""
    out = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ProtocolError("truncated length-delimited field")
            value, pos = bytes(data[pos:pos + length]), pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ProtocolError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


# --- messages ------------------------------------------------------------------------
def decode(name: str, data: bytes) -> dict[str, Any]:
    """The known fields of message ``name``; unknown fields are skipped."""
    spec = MESSAGES[name]
    values: dict[str, Any] = {}
    for number, wire, raw in _fields(data):
        if number not in spec:
            continue
        field, kind = spec[number]
        if kind == STRING:
            values[field] = _text(raw)
        elif kind == BYTES:
            values[field] = raw
        elif kind == BOOL:
            values[field] = bool(raw)
        elif kind == INT64:
            values[field] = _signed(raw, 64)
        elif kind == INT32:
            values[field] = _signed(raw, 32)
        elif kind == UINT32_LIST:  # packed or not
            items = values.setdefault(field, [])
            if wire == 2:
                pos = 0
                while pos < len(raw):
                    item, pos = _read_varint(raw, pos)
                    items.append(item)
            else:
                items.append(raw)
        elif kind == STRING_LIST:
            values.setdefault(field, []).append(_text(raw))
        elif kind == STRING_MAP:
            entry = decode("MapEntry", raw)
            values.setdefault(field, {})[entry.get("key", "")] = entry.get("value", "")
        else:
            values[field] = decode(kind, raw)
    return values


def _text(raw: Any) -> str:
    if not isinstance(raw, bytes):
        raise ProtocolError("expected a length-delimited string")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("a string field is not valid UTF-8") from None


def encode(name: str, **values: Any) -> bytes:
    spec = {field: (number, kind) for number, (field, kind) in MESSAGES.get(name, {}).items()}
    out = bytearray()
    for field, value in values.items():
        if value is None:
            continue
        number, kind = spec[field]
        if kind in (STRING, BYTES):
            raw = value.encode("utf-8") if kind == STRING else bytes(value)
            if raw:
                out += _varint(number << 3 | 2) + _varint(len(raw)) + raw
        elif kind in (BOOL, INT64, INT32):
            out += _varint(number << 3) + _varint(int(value))
        else:
            raise ProtocolError(f"encoding {kind} fields is not implemented")
    return bytes(out)


def pack(name: str, **values: Any) -> bytes:
    """Message ``name`` wrapped in a ``google.protobuf.Any``."""
    return encode("Any", type_url=TYPE_PREFIX + name, value=encode(name, **values))


def unpack(data: bytes) -> tuple[str, dict[str, Any]]:
    """(message name, fields) of a Flight SQL command wrapped in ``Any``.

    Unknown commands come back with their name and no fields, so the caller
    can name them in its error.
    """
    wrapper = decode("Any", data)
    type_url = wrapper.get("type_url", "")
    name = type_url.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    if not type_url or not name:
        raise ProtocolError("not a Flight SQL command (expected a google.protobuf.Any)")
    if name not in MESSAGES:
        return name, {}
    return name, decode(name, wrapper.get("value", b""))
