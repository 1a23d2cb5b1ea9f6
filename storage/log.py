"""The change log: durable, ordered change batches, each with its offset.

Layout: ``DIR/log/<first offset, 20 digits>.log`` segment files, appended in
offset order; records are framed as storage/log_format.py describes. A
segment is named after the offset of the first record written to it (a
segment rolled at a checkpoint may stay empty).

Durability is group commit: ``append`` writes a unit of records to the
operating system (no sync) and ``wait_durable(offset)`` returns once an
``fdatasync`` that started after the record was written has finished.
Producers that wait together share one sync: whoever syncs covers
everything written so far. A batch is acknowledged only after
``wait_durable``.

Writing (disk full and other write errors):

* A unit of records is written whole or not at all. Short writes are
  continued until every byte is written or the write fails; a failed write
  is undone by cutting the segment back to its size before it
  (``ftruncate``). The records' offsets are not used: the next unit gets
  them, so offsets stay contiguous.
* On ENOSPC or EDQUOT the append raises ``DiskFullError`` ("the disk is
  full"). The log stays appendable: every write is refused the same way while
  space is lacking, and writes simply go on once it is back. The same holds
  when a new segment cannot be created. Other write errors undone cleanly
  fail the unit with a ``LogError`` and leave the log appendable too.
* A failure that leaves the file's state unknown poisons the log: a failed
  ``fdatasync`` (the kernel may have dropped the dirty pages, so a later
  sync could succeed without them: PostgreSQL's fsync lesson), a failed
  directory sync, or an ``ftruncate`` that could not undo a partial write.
  Every later append raises until the database is reopened, and the reopen
  reads back what is really on disk.

Opening (``open(after)``, ``after`` = the checkpoint's offset) reads every
segment that may hold records past ``after`` and checks it; a check that
fails raises ``LogError`` naming the segment, the byte and the offsets, and
changes no file:

* Damage vs torn tail. A bad frame (incomplete, or failing its CRC) followed
  by any intact frame in its segment (found by trying every byte position
  after it, ``log_format.next_frame``) is damage. A bad frame in a segment
  that is not the newest is damage too (a segment is synced before the next
  one is created). Only a bad frame with nothing intact after it, at the end
  of the newest segment, is a torn write: it is cut, and the cut is reported
  (``truncations``). It may have been acknowledged only if it was complete
  and synced and then damaged at rest, which a CRC cannot tell from a write
  torn by a crash: like PostgreSQL's WAL and Kafka's active segment, the end
  of the log is where the intact records end.
* No gaps. Change offsets above ``after`` must run ``after + 1``,
  ``after + 2``, ... with none missing, across segments in name order; an
  empty segment's name is the next offset it promises. A deleted segment past
  the checkpoint is therefore found, unless it held the newest records and
  nothing after it remains (then nothing on disk says it existed).
* Legitimately absent or sparse: segments entirely at or below ``after``
  (deleted by retention or never read), records inside a compacted segment
  (all at or below the checkpoint it was made for), a log with no segments at
  all (the next offset is ``after + 1``).

Leftovers (a ``.tmp`` segment of an interrupted compaction, old segments a
compacted one replaced) are removed once the checks pass.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from storage.errors import IvmError
from storage.hooks import enabled, hook
from storage.log_format import LogError, Reader, Record, frame_at, scan

log = logging.getLogger("ivm.log")

SUFFIX = ".log"
SEGMENT_BYTES = 64 << 20
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(IvmError):
    """The disk is full (ENOSPC or EDQUOT): the batch was refused; the log takes writes again once space is back.

    Not a ``LogError`` (an internal failure): a client may retry it later (UNAVAILABLE over Flight)."""


def _segment_name(first: int) -> str:
    return f"{first:020d}{SUFFIX}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (a write may be short, e.g. when the disk fills); OSError if one fails."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[written:]


def _refused(what: str, error: OSError) -> IvmError:
    if error.errno in FULL:
        return DiskFullError(f"{what}: the disk is full ({errno.errorcode[error.errno]}: {error.strerror}); "
                             "the batch was not accepted; writes go on once space is freed")
    return LogError(f"{what}: {error}; the batch was not accepted")


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
        """Check the log past ``after`` (see the module docstring), cut a torn tail, remove
        leftovers of an interrupted compaction, and return the change records above ``after``."""
        leftovers, segments = self._compaction_leftovers(self.segments())
        reader = Reader(after)
        for i, (first, path) in enumerate(segments):
            following = segments[i + 1][0] if i + 1 < len(segments) else None
            if following is not None and following <= after + 1:
                continue  # every record here is covered by the checkpoint
            reader.read(first, path, newest=following is None)
        for tmp in self.dir.glob(f"*{SUFFIX}.tmp"):
            tmp.unlink()  # a compaction interrupted before its rename: the old segments stand
        for path in leftovers:
            path.unlink()  # replaced by the compacted segment before it
            self.truncations.append(f"change log: removed {path.name}, left over from an interrupted compaction")
        if leftovers:
            _fsync_dir(self.dir)
        if reader.torn is not None:
            self._cut(*reader.torn)
        self._written = self._durable = reader.last
        if segments:
            self._open_segment(segments[-1][1])
        return reader.records

    def _cut(self, path: Path, start: int, size: int) -> None:
        message = (f"change log {path.name}: truncated a torn or corrupt record at byte {start} "
                   f"({size - start} bytes at the end of the newest segment, nothing intact after it: "
                   "a write that did not complete)")
        log.warning(message)
        self.truncations.append(message)
        with open(path, "r+b") as f:
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())

    def _compaction_leftovers(self, segments: list[tuple[int, Path]]) -> tuple[list[Path], list[tuple[int, Path]]]:
        """(segments a compacted one before them replaced, the others)."""
        kept: list[tuple[int, Path]] = []
        leftovers: list[Path] = []
        covered = -1
        for first, path in segments:
            if first <= covered:
                leftovers.append(path)
                continue
            header = self._header(path)
            if header is not None:
                covered = max(covered, header.extra["last"])
            kept.append((first, path))
        return leftovers, kept

    @staticmethod
    def _header(path: Path) -> Record | None:
        with open(path, "rb") as f:
            head = f.read(64 << 10)  # a header frame is a few dozen bytes
        record = frame_at(head, 0)
        return record if record is not None and record.kind == "compacted" else None

    # --- appending -----------------------------------------------------------------
    def _open_segment(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segment = path
        self._size = os.fstat(self._fd).st_size

    def _new_segment(self, first: int) -> None:
        """Sync and close the current segment; continue in a new one whose first record is ``first``.

        A segment that cannot be created refuses the batch and the current one goes on; a failed
        sync poisons the log."""
        path = self.dir / _segment_name(first)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise _refused(f"creating change log segment {path.name} failed", e) from e
        try:
            if self._fd is not None:
                os.fdatasync(self._fd)
            _fsync_dir(self.dir)
        except OSError as e:
            os.close(fd)
            self._failed = e
            raise LogError(f"syncing the change log failed: {e}") from e
        if self._fd is not None:
            os.close(self._fd)
            self._durable = self._written
        self._fd, self._segment, self._size = fd, path, os.fstat(fd).st_size

    def check(self) -> None:
        if self._failed is not None:
            raise LogError(f"the change log failed ({self._failed}); no change is accepted until the database is reopened")

    def append(self, records: Record | list[Record]) -> None:
        """Hand records (a unit, in offset order) to the OS, all or none; not yet durable (see wait_durable).

        Raises ``DiskFullError`` when the disk is full, ``LogError`` for other failures; either way
        no record of the unit is in the log (see the module docstring)."""
        records = [records] if isinstance(records, Record) else records
        data = b"".join(record.encode() for record in records)
        self.check()
        if self._fd is None or self._size >= self.segment_bytes:
            with self._sync_lock, self._append_lock:
                self.check()
                self._new_segment(records[0].offset)
        with self._append_lock:
            self.check()
            try:
                if enabled("log.torn_record"):
                    _write_all(self._fd, data[: len(data) // 2])
                    hook("log.torn_record")
                    _write_all(self._fd, data[len(data) // 2:])
                else:
                    _write_all(self._fd, data)
            except OSError as e:
                self._undo_write(e)
            self._size += len(data)
            self._written = records[-1].offset

    def _undo_write(self, error: OSError) -> None:
        """Cut what a failed write left (under the append lock), then raise its error."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as e:
            self._failed = e
            raise LogError(f"writing the change log failed ({error}) and cutting the partial record failed "
                           f"({e}); no change is accepted until the database is reopened") from error
        raise _refused(f"writing the change log failed in segment {self._segment.name}", error) from error

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
        """Start a new segment (at a checkpoint, so covered segments can go); on a full disk
        the current segment goes on."""
        with self._sync_lock, self._append_lock:
            if self._size and self._failed is None:
                try:
                    self._new_segment(self._written + 1)
                except DiskFullError as e:
                    log.warning("change log: no new segment at the checkpoint: %s", e)

    def close(self) -> None:
        with self._sync_lock, self._append_lock:
            if self._fd is not None:
                try:
                    if self._failed is None:
                        os.fdatasync(self._fd)
                finally:
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
            for _, _, payload in scan(path.read_bytes()):
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
        try:
            with open(tmp, "wb") as f:
                f.write(header.encode())
                for record in compacted:
                    f.write(record.encode())
                    hook("compact.write")
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)  # e.g. the disk is full: the old segments stand
            raise
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

