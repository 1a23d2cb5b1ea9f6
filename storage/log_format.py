"""The change log's record format: frames, and how a segment's bytes are read back.

A segment is a sequence of frames:

    length (u32 LE) | CRC32 of payload (u32 LE) | payload
    payload = meta length (u32 LE) | meta (JSON object) | body (Arrow IPC stream or empty)

The meta always begins with ``{"kind":`` (``Record.encode`` writes the kind
first), so a reader can find where intact frames start after damage without
trusting any length field: ``next_frame`` searches for that text and checks
the frame around each hit (its length fits, its CRC matches, its meta parses).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa

from sql_frontend.errors import IvmError

FRAME = struct.Struct("<II")
META_LEN = struct.Struct("<I")
META_START = b'{"kind":'
HEADER = FRAME.size + META_LEN.size  # bytes before the meta


class LogError(IvmError, RuntimeError):
    """The change log cannot be written or read."""


@dataclass
class Record:
    """One entry of the log: a change batch (kind "change") or a segment header."""

    offset: int
    table: str = ""
    batch: pa.Table | None = None
    policy: str = "error"
    source: str | None = None
    seq: int | None = None
    timestamp: float = 0.0
    kind: str = "change"
    extra: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        meta = {"kind": self.kind, "offset": self.offset, "table": self.table, "policy": self.policy,
                "source": self.source, "seq": self.seq, "ts": self.timestamp, **self.extra}
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        body = b""
        if self.batch is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self.batch.schema) as writer:
                writer.write_table(self.batch)
            body = sink.getvalue().to_pybytes()
        payload = META_LEN.pack(len(meta_bytes)) + meta_bytes + body
        return FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    @staticmethod
    def decode(payload: bytes, with_batch: bool = True) -> "Record":
        meta, n = _meta(payload)
        body = memoryview(payload)[META_LEN.size + n:]
        batch = pa.ipc.open_stream(pa.py_buffer(body)).read_all() if with_batch and len(body) else None
        known = {"kind", "offset", "table", "policy", "source", "seq", "ts"}
        return Record(offset=meta["offset"], table=meta["table"], batch=batch, policy=meta["policy"],
                      source=meta["source"], seq=meta["seq"], timestamp=meta["ts"], kind=meta["kind"],
                      extra={k: v for k, v in meta.items() if k not in known})


def _meta(payload: bytes | memoryview) -> tuple[dict, int]:
    """The meta of a payload and its length; ValueError when it is not one ``encode`` wrote."""
    if len(payload) < META_LEN.size:
        raise ValueError("payload shorter than its meta length")
    (n,) = META_LEN.unpack_from(payload, 0)
    if n > len(payload) - META_LEN.size:
        raise ValueError("meta length past the payload")
    meta = json.loads(bytes(payload[META_LEN.size:META_LEN.size + n]))
    if not (isinstance(meta, dict) and isinstance(meta.get("kind"), str) and isinstance(meta.get("offset"), int)
            and {"table", "policy", "source", "seq", "ts"} <= meta.keys()):
        raise ValueError("meta is not a record's")
    return meta, n


def scan(data: bytes) -> Iterator[tuple[int, int, bytes | None]]:
    """(start, end, payload) per frame; payload None for a bad frame (then stops).

    A frame is bad when it is incomplete (its header or its payload runs past
    the end) or its CRC does not match."""
    pos = 0
    while pos < len(data):
        if pos + FRAME.size > len(data):
            yield pos, len(data), None
            return
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        payload = data[pos + FRAME.size:end]
        if end > len(data) or zlib.crc32(payload) != crc or length < META_LEN.size:
            yield pos, len(data), None
            return
        yield pos, end, payload
        pos = end


def frame_at(data: bytes, pos: int) -> Record | None:
    """The record (without its batch) of an intact frame starting at byte ``pos``, else None."""
    if pos < 0 or pos + FRAME.size > len(data):
        return None
    length, crc = FRAME.unpack_from(data, pos)
    end = pos + FRAME.size + length
    if length < META_LEN.size or end > len(data):
        return None
    payload = memoryview(data)[pos + FRAME.size:end]
    if zlib.crc32(payload) != crc:
        return None
    try:
        return Record.decode(payload, with_batch=False)
    except (ValueError, UnicodeDecodeError):
        return None


def next_frame(data: bytes, after: int) -> tuple[int, Record] | None:
    """The first intact frame starting after byte ``after`` (its start and record), if any.

    Every byte position after ``after`` where a frame could start is tried (the
    search for ``META_START`` finds them all at C speed): a damaged length
    field cannot hide the frames behind it."""
    hit = data.find(META_START, after + 1 + HEADER)
    while hit != -1:
        record = frame_at(data, hit - HEADER)
        if record is not None:
            return hit - HEADER, record
        hit = data.find(META_START, hit + 1)
    return None
