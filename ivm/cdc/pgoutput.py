"""Decoding PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

Each message is one byte of kind and a body (PostgreSQL docs, "Logical
Replication Message Formats"). Values arrive in their text form; they are
collected per column as strings and cast in bulk later (DuckDB casting rules,
the same as ``apply_changes``), so decoding does no per-value conversion.

    >>> decode(b"B" + (16).to_bytes(8, "big") + (0).to_bytes(8, "big") + (7).to_bytes(4, "big"))
    Begin(final_lsn=16, commit_time=946684800.0, xid=7)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EPOCH_2000 = 946684800.0  # PostgreSQL timestamps count microseconds from 2000-01-01


@dataclass
class Begin:
    final_lsn: int
    commit_time: float  # Unix seconds
    xid: int


@dataclass
class Commit:
    lsn: int
    end_lsn: int
    commit_time: float


@dataclass
class RelationInfo:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # d(efault), f(ull), i(ndex), n(othing)
    columns: list[tuple[str, int, int, bool]]  # (name, type oid, typmod, part of the key)


@dataclass
class Change:
    """An insert, update or delete: new and old tuples as lists of text (None = NULL, UNCHANGED = TOAST)."""

    kind: str  # "I" | "U" | "D"
    oid: int
    new: list | None
    old: list | None
    old_kind: str | None  # "K" (key only) | "O" (whole old row) | None


@dataclass
class Truncate:
    oids: list[int]


@dataclass
class Other:
    kind: str


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()  # an unchanged TOASTed value: pgoutput does not resend it


class Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 1

    def int(self, size: int, signed: bool = False) -> int:
        value = int.from_bytes(self.data[self.pos:self.pos + size], "big", signed=signed)
        self.pos += size
        return value

    def u64(self) -> int:
        (value,) = struct.unpack_from(">Q", self.data, self.pos)
        self.pos += 8
        return value

    def i64(self) -> int:
        (value,) = struct.unpack_from(">q", self.data, self.pos)
        self.pos += 8
        return value

    def byte(self) -> str:
        value = chr(self.data[self.pos])
        self.pos += 1
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.pos)
        value = self.data[self.pos:end].decode()
        self.pos = end + 1
        return value

    def tuple(self) -> list:
        (count,) = struct.unpack_from(">h", self.data, self.pos)
        self.pos += 2
        values: list = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            else:  # "t" text (we never ask for binary)
                (size,) = struct.unpack_from(">i", self.data, self.pos)
                self.pos += 4
                values.append(self.data[self.pos:self.pos + size].decode())
                self.pos += size
        return values

    def time(self) -> float:
        return EPOCH_2000 + self.i64() / 1e6


def decode(data: bytes):
    """One pgoutput message -> Begin | Commit | RelationInfo | Change | Truncate | Other."""
    kind = chr(data[0])
    r = Reader(data)
    if kind == "B":
        return Begin(r.u64(), r.time(), r.int(4))
    if kind == "C":
        r.pos += 1  # flags
        return Commit(r.u64(), r.u64(), r.time())
    if kind == "R":
        oid, namespace, name = r.int(4), r.string(), r.string()
        identity = r.byte()
        (count,) = struct.unpack_from(">h", data, r.pos)
        r.pos += 2
        columns = []
        for _ in range(count):
            flags = data[r.pos]
            r.pos += 1
            column = r.string()
            columns.append((column, r.int(4), r.int(4, signed=True), bool(flags & 1)))
        return RelationInfo(oid, namespace, name, identity, columns)
    if kind == "I":
        oid = r.int(4)
        r.byte()  # "N"
        return Change("I", oid, r.tuple(), None, None)
    if kind == "U":
        oid = r.int(4)
        part = r.byte()
        old, old_kind = None, None
        if part in ("K", "O"):
            old, old_kind = r.tuple(), part
            r.byte()  # "N"
        return Change("U", oid, r.tuple(), old, old_kind)
    if kind == "D":
        oid = r.int(4)
        part = r.byte()
        return Change("D", oid, None, r.tuple(), part)
    if kind == "T":
        count = r.int(4)
        r.pos += 1  # options (CASCADE / RESTART IDENTITY)
        return Truncate([r.int(4) for _ in range(count)])
    return Other(kind)
