"""The PostgreSQL v3 wire format: reading frontend messages, writing backend ones.

Facts from PostgreSQL's "Frontend/Backend Protocol: Message Formats":

* Every message after start-up is ``Byte1(type) Int32(length) body``; the
  length counts itself (4 bytes) and the body, not the type byte. Integers
  are big-endian (network order); strings are NUL-terminated (``String``).
* The first message of a connection has no type byte: ``Int32(length)
  Int32(code)``. The code is the protocol version (3.0 = 196608, i.e.
  major << 16 | minor) followed by ``name\\0value\\0`` pairs and a final
  ``\\0``; or one of the special requests SSLRequest (80877103),
  GSSENCRequest (80877104) or CancelRequest (80877102, then the process id
  and secret key of BackendKeyData).
* ``ErrorResponse``/``NoticeResponse`` bodies are ``Byte1(field) String``
  pairs ending with ``\\0``; S = severity (localized), V = severity (never
  localized), C = SQLSTATE, M = message, D = detail, H = hint.

Bodies are built with ``struct`` into ``bytes``; the hot messages (DataRow
for whole result sets) are assembled in ``flight_server/pgwire/types.py``.

>>> ready_for_query(b"I")
b'Z\\x00\\x00\\x00\\x05I'
>>> command_complete("SELECT 1")
b'C\\x00\\x00\\x00\\rSELECT 1\\x00'
>>> authentication_ok()
b'R\\x00\\x00\\x00\\x08\\x00\\x00\\x00\\x00'
>>> Reader(b"t\\x00\\x00\\x01\\x00\\x00\\x00\\x05").cstring(), Reader(b"\\x00\\x02").int16()
('t', 2)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PROTOCOL_3_0 = 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

_I32 = struct.Struct("!i")
_I16 = struct.Struct("!h")
_HEAD = struct.Struct("!ci")


class ProtocolViolation(Exception):
    """Bytes that break the protocol: the connection is answered with an error and closed."""


# --- reading -----------------------------------------------------------------------------------
class Reader:
    """Reads one message body field by field; running past the end is a ProtocolViolation."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolViolation("message shorter than its fields")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def byte(self) -> bytes:
        return self._take(1)

    def bytes(self, n: int) -> bytes:
        return self._take(n)

    def cstring(self) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolViolation("string without its terminating NUL")
        text = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("a string is not UTF-8") from None

    def rest(self) -> bytes:
        chunk = self.data[self.pos:]
        self.pos = len(self.data)
        return chunk

    def int16s(self) -> list[int]:
        return [self.int16() for _ in range(self._count())]

    def _count(self) -> int:
        count = self.int16()
        if count < 0:
            raise ProtocolViolation("negative count")
        return count


@dataclass(frozen=True)
class Startup:
    """The first message: a protocol version with parameters, or a special request."""

    code: int
    parameters: dict[str, str]
    process_id: int = 0  # CancelRequest
    secret: bytes = b""  # CancelRequest


def parse_startup(body: bytes) -> Startup:
    """Decode a start-up packet's body (the bytes after its length)."""
    reader = Reader(body)
    code = reader.int32()
    if code == CANCEL_REQUEST:
        return Startup(code, {}, reader.int32(), reader.rest())
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        return Startup(code, {})
    if code >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: ivm speaks 3.0")
    parameters = {}
    while True:
        name = reader.cstring()
        if not name:
            break
        parameters[name] = reader.cstring()
    return Startup(code, parameters)


def parse_bind(body: bytes) -> tuple[str, str, list[int], list[bytes | None], list[int]]:
    """Bind: (portal, statement, parameter format codes, values (None = NULL), result format codes)."""
    reader = Reader(body)
    portal, statement = reader.cstring(), reader.cstring()
    formats = reader.int16s()
    values: list[bytes | None] = []
    for _ in range(reader._count()):
        size = reader.int32()
        values.append(None if size == -1 else reader.bytes(size))
    return portal, statement, formats, values, reader.int16s()


def parse_parse(body: bytes) -> tuple[str, str, list[int]]:
    """Parse: (statement name, query text, parameter type OIDs; 0 = unspecified)."""
    reader = Reader(body)
    name, query = reader.cstring(), reader.cstring()
    return name, query, [reader.int32() for _ in range(reader._count())]


# --- writing -----------------------------------------------------------------------------------
def message(kind: bytes, body: bytes = b"") -> bytes:
    return _HEAD.pack(kind, len(body) + 4) + body


def cstring(text: str) -> bytes:
    return text.encode("utf-8").replace(b"\x00", b"") + b"\x00"


def authentication_ok() -> bytes:
    return message(b"R", _I32.pack(0))


def authentication_cleartext() -> bytes:
    return message(b"R", _I32.pack(3))


def authentication_sasl(mechanisms: list[str]) -> bytes:
    return message(b"R", _I32.pack(10) + b"".join(cstring(m) for m in mechanisms) + b"\x00")


def authentication_sasl_continue(data: bytes) -> bytes:
    return message(b"R", _I32.pack(11) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    return message(b"R", _I32.pack(12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def backend_key_data(process_id: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!ii", process_id, secret))


def negotiate_protocol_version(newest_minor: int, unknown: list[str]) -> bytes:
    return message(b"v", struct.pack("!ii", newest_minor, len(unknown)) + b"".join(cstring(u) for u in unknown))


def ready_for_query(status: bytes) -> bytes:
    return message(b"Z", status)


def command_complete(tag: str) -> bytes:
    return message(b"C", cstring(tag))


def empty_query_response() -> bytes:
    return message(b"I")


def parse_complete() -> bytes:
    return message(b"1")


def bind_complete() -> bytes:
    return message(b"2")


def close_complete() -> bytes:
    return message(b"3")


def no_data() -> bytes:
    return message(b"n")


def portal_suspended() -> bytes:
    return message(b"s")


def parameter_description(oids: list[int]) -> bytes:
    return message(b"t", _I16.pack(len(oids)) + b"".join(_I32.pack(o) for o in oids))


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int  # pg_type.typlen: -1 for variable length
    format: int = 0  # 0 text, 1 binary
    type_modifier: int = -1


_FIELD = struct.Struct("!ihihih")


def row_description(fields: list[Field]) -> bytes:
    parts = [_I16.pack(len(fields))]
    for f in fields:
        # table OID and column number 0: the column is not a plain column of a table
        parts.append(cstring(f.name) + _FIELD.pack(0, 0, f.type_oid, f.type_size, f.type_modifier, f.format))
    return message(b"T", b"".join(parts))


def data_row(values: list[bytes | None]) -> bytes:
    parts = [_I16.pack(len(values))]
    for value in values:
        parts.append(_I32.pack(-1) if value is None else _I32.pack(len(value)) + value)
    return message(b"D", b"".join(parts))


def error_response(severity: str, code: str, text: str, *, notice: bool = False, hint: str | None = None) -> bytes:
    body = b"S" + cstring(severity) + b"V" + cstring(severity) + b"C" + cstring(code) + b"M" + cstring(text)
    if hint:
        body += b"H" + cstring(hint)
    return message(b"N" if notice else b"E", body + b"\x00")


def copy_response(kind: bytes, columns: int, fmt: int = 0) -> bytes:
    """CopyInResponse (``G``) or CopyOutResponse (``H``): overall format ``fmt`` (0 text, 1 binary), every
    column the same."""
    return message(kind, bytes([fmt]) + _I16.pack(columns) + _I16.pack(fmt) * columns)


def copy_data(data: bytes) -> bytes:
    return message(b"d", data)


def copy_done() -> bytes:
    return message(b"c")
