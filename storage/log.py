"""The change log: durable, ordered change batches, each with its offset.

Layout: ``DIR/log/<first offset, 20 digits>.log`` segment files, appended in
offset order. Each record is framed as

    length (u32 LE) | CRC32 of payload (u32 LE) | payload
    payload = meta length (u32 LE) | meta (JSON) | body (Arrow IPC stream or empty)

Durability is group commit: ``append`` writes a record to the operating
system (no sync) and ``wait_durable(offset)`` returns once an ``fdatasync``
that started after the record was written has finished. Producers that wait
together share one sync: whoever syncs covers everything written so far.
A batch is acknowledged only after ``wait_durable``.

On open, every segment that may hold records past the checkpoint is scanned.
A record that is incomplete or fails its CRC at the tail of the newest
segment is a torn write of a batch that was never acknowledged: the segment
is truncated there and the event is reported (``truncations``). Anywhere
else it is damage to acknowledged data, and opening fails.

A failed write or sync poisons the log (the state of the file is unknown):
every later append raises, and the database must be reopened.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa

from sql_frontend.errors import IvmError
from storage.hooks import enabled, hook

log = logging.getLogger("ivm.log")

FRAME = struct.Struct("<II")
META_LEN = struct.Struct("<I")
SUFFIX = ".log"
SEGMENT_BYTES = 64 << 20


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
        (n,) = META_LEN.unpack_from(payload, 0)
        meta = json.loads(payload[META_LEN.size:META_LEN.size + n])
        body = memoryview(payload)[META_LEN.size + n:]
        batch = pa.ipc.open_stream(pa.py_buffer(body)).read_all() if with_batch and len(body) else None
        known = {"kind", "offset", "table", "policy", "source", "seq", "ts"}
        return Record(offset=meta["offset"], table=meta["table"], batch=batch, policy=meta["policy"],
                      source=meta["source"], seq=meta["seq"], timestamp=meta["ts"], kind=meta["kind"],
                      extra={k: v for k, v in meta.items() if k not in known})


def _segment_name(first: int) -> str:
    return f"{first:020d}{SUFFIX}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan(data: bytes) -> Iterator[tuple[int, int, bytes | None]]:
    """(start, end, payload) per record; payload None for a bad frame (then stops)."""
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


class ChangeLog:
    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.truncations: list[str] = []  # what opening repaired, for status and logs
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._fd: int | None = None
        self._segment: Path | None = None
        self._size = 0
        self._written = 0  # offset of the last record handed to the OS
        self._durable = 0  # offset of the last record known to be on disk
        self._failed: BaseException | None = None
        self.syncs = 0  # fdatasync calls for acknowledgements (fewer than records when producers share)

    # --- opening -------------------------------------------------------------------
    def segments(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            if path.stem.isdigit():
                found.append((int(path.stem), path))
        return sorted(found)

    def open(self, after: int) -> list[Record]:
        """Repair the tail, remove leftovers of an interrupted compaction, and
        return the change records with an offset above ``after`` (in order)."""
        for tmp in self.dir.glob(f"*{SUFFIX}.tmp"):
            tmp.unlink()  # a compaction interrupted before its rename: the old segments stand
        segments = self._drop_compaction_leftovers(self.segments())
        records: list[Record] = []
        last = after
        for i, (first, path) in enumerate(segments):
            following = segments[i + 1][0] if i + 1 < len(segments) else None
            if following is not None and following <= after + 1:
                continue  # every record here is covered by the checkpoint
            data = path.read_bytes()
            for start, _, payload in _scan(data):
                if payload is None:
                    self._repair(path, start, len(data), newest=following is None)
                    break
                record = Record.decode(payload, with_batch=False)
                if record.kind != "change" or record.offset <= after:
                    last = max(last, record.offset)
                    continue
                if record.offset <= last:
                    raise LogError(f"change log {path.name}: offset {record.offset} follows {last}")
                records.append(Record.decode(payload))
                last = record.offset
        self._written = self._durable = last
        if segments:
            first, path = segments[-1]
            self._open_segment(path)
        return records

    def _repair(self, path: Path, start: int, size: int, newest: bool) -> None:
        if not newest:
            raise LogError(
                f"change log segment {path.name} is damaged at byte {start} and later segments exist: "
                "acknowledged changes would be lost, so the database does not open"
            )
        message = (f"change log {path.name}: truncated a torn or corrupt record at byte {start} "
                   f"({size - start} bytes; a batch that was never acknowledged)")
        log.warning(message)
        self.truncations.append(message)
        with open(path, "r+b") as f:
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())

    def _drop_compaction_leftovers(self, segments: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
        kept: list[tuple[int, Path]] = []
        covered = -1
        for first, path in segments:
            if first <= covered:
                path.unlink()  # replaced by the compacted segment before it
                self.truncations.append(f"change log: removed {path.name}, left over from an interrupted compaction")
                continue
            header = self._header(path)
            if header is not None:
                covered = max(covered, header.extra["last"])
            kept.append((first, path))
        if len(kept) < len(segments):
            _fsync_dir(self.dir)
        return kept

    @staticmethod
    def _header(path: Path) -> Record | None:
        with open(path, "rb") as f:
            head = f.read(FRAME.size)
            if len(head) < FRAME.size:
                return None
            length, crc = FRAME.unpack(head)
            payload = f.read(length)
        if len(payload) < length or zlib.crc32(payload) != crc:
            return None
        record = Record.decode(payload, with_batch=False)
        return record if record.kind == "compacted" else None

    # --- appending -----------------------------------------------------------------
    def _open_segment(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segment = path
        self._size = os.fstat(self._fd).st_size

    def _new_segment(self, first: int) -> None:
        """Sync and close the current segment; start one whose first record is ``first``."""
        if self._fd is not None:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._durable = self._written
        self._open_segment(self.dir / _segment_name(first))
        _fsync_dir(self.dir)

    def check(self) -> None:
        if self._failed is not None:
            raise LogError(f"the change log failed ({self._failed}); no change is accepted until the database is reopened")

    def append(self, record: Record) -> None:
        """Hand one record to the OS (not yet durable: see wait_durable)."""
        frame = record.encode()
        self.check()
        try:
            if self._fd is None or self._size >= self.segment_bytes:
                with self._sync_lock, self._append_lock:
                    self._new_segment(record.offset)
            with self._append_lock:
                if enabled("log.torn_record"):
                    os.write(self._fd, frame[: len(frame) // 2])
                    hook("log.torn_record")
                    os.write(self._fd, frame[len(frame) // 2:])
                else:
                    os.write(self._fd, frame)
                self._size += len(frame)
                self._written = record.offset
        except OSError as e:
            self._failed = e
            raise LogError(f"writing the change log failed: {e}") from e

    def wait_durable(self, offset: int) -> None:
        """Return once the record at ``offset`` (and all before it) is on disk."""
        if self._durable >= offset:
            return
        hook("log.before_sync")
        with self._sync_lock:
            if self._durable >= offset:
                return
            self.check()
            with self._append_lock:
                target, fd = self._written, self._fd
            try:
                os.fdatasync(fd)
            except OSError as e:
                self._failed = e
                raise LogError(f"syncing the change log failed: {e}") from e
            self.syncs += 1
            self._durable = max(self._durable, target)

    @property
    def durable(self) -> int:
        return self._durable

    @property
    def written(self) -> int:
        return self._written

    def roll(self) -> None:
        """Start a new segment (at a checkpoint, so covered segments can go)."""
        with self._sync_lock, self._append_lock:
            if self._size and self._failed is None:
                self._new_segment(self._written + 1)

    def close(self) -> None:
        with self._sync_lock, self._append_lock:
            if self._fd is not None:
                if self._failed is None:
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = None

    # --- retention and compaction ------------------------------------------------------
    def covered(self, upto: int) -> list[tuple[int, Path]]:
        """Segments whose every record is at or below ``upto`` (never the open one)."""
        segments = self.segments()
        return [(first, path) for i, (first, path) in enumerate(segments)
                if i + 1 < len(segments) and segments[i + 1][0] <= upto + 1]

    def delete_covered(self, upto: int, retention_seconds: float | None) -> int:
        """Delete covered segments older than the retention; return how many."""
        if retention_seconds is None:
            return 0
        now = time.time()
        removed = 0
        for _, path in self.covered(upto):
            if now - path.stat().st_mtime >= retention_seconds:
                path.unlink()
                removed += 1
        if removed:
            _fsync_dir(self.dir)
        return removed

    def rewrite_covered(self, upto: int, compact: Callable[[list[Record]], list[Record]]) -> tuple[int, int]:
        """Replace the covered segments by one holding ``compact(their records)``.

        Crash-safe: the new segment is written under a temporary name, synced
        and renamed over the first old one; it starts with a header naming the
        last offset it covers, so old segments left behind by a crash before
        their deletion are recognised and removed on open.
        Returns (records before, records after).
        """
        segments = self.covered(upto)
        if not segments:
            return 0, 0
        records = []
        for _, path in segments:
            for _, _, payload in _scan(path.read_bytes()):
                if payload is None:
                    raise LogError(f"change log segment {path.name} is damaged; compaction stopped")
                record = Record.decode(payload)
                if record.kind == "change":
                    records.append(record)
        last = max((r.offset for r in records), default=segments[-1][0])
        compacted = compact(records)
        first, first_path = segments[0]
        header = Record(offset=first, kind="compacted", extra={"last": max(last, upto)})
        tmp = self.dir / (first_path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(header.encode())
            for record in compacted:
                f.write(record.encode())
                hook("compact.write")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, first_path)
        _fsync_dir(self.dir)
        hook("compact.before_unlink")
        for _, path in segments[1:]:
            path.unlink()
        _fsync_dir(self.dir)
        return len(records), len(compacted)

    def stats(self) -> dict:
        segments = self.segments()
        return {"segments": len(segments), "bytes": sum(p.stat().st_size for _, p in segments), "syncs": self.syncs}
