"""The change log's record format: frames, and how segments are read back and checked on open.

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
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from storage.errors import IvmError

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


class Reader:
    """Reads a log's segments in name order on open, checking them (the rules: storage/log.py)."""

    def __init__(self, after: int):
        self.after = after
        self.records: list[Record] = []
        self.seen: int | None = None  # the last change offset read
        self.last = after  # the log's head: the highest offset read, at least the checkpoint's
        self.where = "the checkpoint"  # where the offset before the next one is, for messages
        self.torn: tuple[Path, int, int] | None = None  # (segment, byte, size) to cut

    def read(self, first: int, path: Path, newest: bool) -> None:
        data = path.read_bytes()
        changes = 0
        for start, _, payload in scan(data):
            if payload is None:
                self._bad_frame(path, data, start, newest)
                break
            try:
                record = Record.decode(payload, with_batch=False)
            except ValueError as e:
                raise LogError(f"change log segment {path.name} is damaged at byte {start}: an intact frame "
                               f"holds no record ({e}); the database does not open") from e
            if record.kind != "change":
                continue  # a compacted segment's header
            changes += 1
            self._check(record.offset, path, start)
            if record.offset > self.after:
                self.records.append(Record.decode(payload))
        if not changes and first > self.last + 1:
            # an empty segment promises that every offset before its name is in earlier ones
            self._missing(first - 1, f"empty segment {path.name} is named for offset {first}")

    def _check(self, offset: int, path: Path, start: int) -> None:
        if self.seen is not None and offset <= self.seen:
            raise LogError(f"change log {path.name}: offset {offset} at byte {start} follows offset {self.seen} "
                           f"({self.where}): the log is out of order; the database does not open")
        if offset > self.last + 1:
            self._missing(offset - 1, f"segment {path.name} continues with offset {offset} at byte {start}")
        self.seen, self.last = offset, max(self.last, offset)
        self.where = f"in {path.name}"

    def _missing(self, upto: int, found: str) -> None:
        first = self.last + 1
        span = f"offset {first}" if first == upto else f"offsets {first} to {upto}"
        raise LogError(f"the change log is missing {span}: the checkpoint is at offset {self.after}, "
                       f"the log holds up to offset {first - 1} ({self.where}) and {found}. A log segment "
                       "was deleted or lost, so acknowledged changes would be lost; the database does not open")

    def _bad_frame(self, path: Path, data: bytes, start: int, newest: bool) -> None:
        after = f"the record after offset {self.last}" if self.last > 0 else "the first record"
        found = next_frame(data, start)
        if found is not None:
            pos, record = found
            raise LogError(
                f"change log segment {path.name} is damaged at byte {start} ({after}): an intact record "
                f"follows at byte {pos} (offset {record.offset}), so this is not a torn write; acknowledged "
                "changes would be lost, so the database does not open")
        if not newest:
            raise LogError(
                f"change log segment {path.name} is damaged at byte {start} and later segments exist ({after}): "
                "acknowledged changes would be lost, so the database does not open")
        self.torn = (path, start, len(data))
