"""Spilling large runs to memory-mapped files, so the kernel can evict them.

Contract: ``Spill(directory, rows)`` turns the columns and index arrays of a
new run of at least ``rows`` rows into read-only arrays backed by files: each
Arrow column is written once to an uncompressed Arrow IPC file (one record
batch, so the run keeps one chunk per column) and each numpy array to a
``.npy`` file; both are re-opened memory-mapped (zero copy) and the file is
unlinked at once. Linux keeps an unlinked file's pages until its last mapping
goes, so nothing is left to clean up when a run is dropped, and nothing is
left after a crash except files caught between write and unlink, which
``Spill`` removes when it is made (only files of processes that are gone:
two databases may share a directory).

Why: runs are immutable (deletes only touch the in-memory ``live`` bitmap),
so a mapped run never changes. Its pages are file-backed, and once written
back they are clean: under memory pressure the kernel drops them and reads
them back on use, instead of the OOM killer ending the process. Lookups touch
a few pages of a run; whole reads stream through it. In-memory (anonymous)
memory then holds the bitmaps, the caches and the transients of one change.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

PREFIX = "ivm-spill-"


@dataclass(frozen=True, eq=False)
class Spill:
    directory: Path
    rows: int = 1_000_000  # runs of at least this many rows are spilled
    _counter: itertools.count = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"spill_rows must be at least 1, not {self.rows!r}")
        os.makedirs(self.directory, exist_ok=True)
        _remove_strays(Path(self.directory))

    def wants(self, n_rows: int) -> bool:
        return n_rows >= self.rows

    def _path(self, suffix: str) -> Path:
        with self._lock:
            n = next(self._counter)
        return Path(self.directory) / f"{PREFIX}{os.getpid()}-{threading.get_ident()}-{n}{suffix}"

    def array(self, array: pa.Array) -> pa.Array:
        """``array`` (one chunk) backed by an unlinked, memory-mapped Arrow IPC file."""
        path = self._path(".arrow")
        schema = pa.schema([pa.field("c", array.type)])
        try:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(pa.record_batch([array], schema=schema))
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            return reader.get_batch(0).column(0)
        finally:
            path.unlink(missing_ok=True)

    def numpy(self, array: np.ndarray) -> np.ndarray:
        """``array`` backed by an unlinked, memory-mapped .npy file (read-only)."""
        path = self._path(".npy")
        try:
            np.save(path, np.ascontiguousarray(array), allow_pickle=False)
            # np.asarray: a plain ndarray whose base keeps the mapping alive.
            return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
        finally:
            path.unlink(missing_ok=True)


def _remove_strays(directory: Path) -> None:
    """Files left by a process that died between writing a file and unlinking it."""
    for path in directory.glob(PREFIX + "*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- Reading a few rows of a spilled run: ask for all their pages at once ---------------------------
#
# A lookup into a spilled run gathers a few rows from each column. Every page the kernel has dropped is
# then a major fault that waits for its read, one after another: ~50 us each at TPC-H SF 10 beside a
# DuckDB holding its own copy, up to ~200 in one lookup. MADV_WILLNEED on all the pages first starts
# those reads together, so they overlap. It is only a hint (the gather reads the same values either
# way), and not free where the pages are in memory (~0.3 us per range asked for): it is taken only
# while gathers from spilled runs have been waiting on the disk (``faulting``), never at SF 1, where
# every page stays in memory.
_MADV_WILLNEED = 3
_PAGE = mmap.PAGESIZE
_IOV_MAX = 1024  # ranges per process_madvise call
_SYS_PROCESS_MADVISE = 440  # the same number on x86-64 and on arm64 (asm-generic)
FAULTING_SECONDS = 10.0  # after a gather waited on the disk, prefetch for this long
_faulting_until = 0.0
_advisor: dict[str, int] = {}  # pid -> pidfd of this process (a forked child opens its own)
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):
    _syscall = None


def major_faults() -> int:
    """Major page faults of the calling thread so far (reads that waited on the disk)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_majflt


def note_faults(before: int) -> None:
    """After a gather from spilled runs: when it waited on the disk (``major_faults`` grew since
    ``before``), lookups prefetch for the next FAULTING_SECONDS."""
    global _faulting_until
    if major_faults() > before:
        _faulting_until = time.monotonic() + FAULTING_SECONDS


def faulting() -> bool:
    return _syscall is not None and time.monotonic() < _faulting_until


def prefetch(address: int, itemsize: int, positions: np.ndarray) -> int:
    """Ask the kernel to read in the pages holding the values at ``positions`` (in any order) of the
    array whose values start at ``address``, ``itemsize`` bytes each, with one process_madvise call
    per 1,024 stretches of adjacent pages; return the number of stretches (0: nothing asked)."""
    if _syscall is None or not len(positions):
        return 0
    starts_at = address + positions.astype(np.int64) * itemsize
    pages = np.union1d(starts_at // _PAGE, (starts_at + (itemsize - 1)) // _PAGE)  # a value may straddle two
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    ranges = np.empty((len(breaks) + 1, 2), dtype=np.uint64)  # struct iovec: base, length
    first = pages[np.concatenate(([0], breaks))]
    ranges[:, 0] = first * _PAGE
    ranges[:, 1] = (pages[np.concatenate((breaks - 1, [len(pages) - 1]))] + 1 - first) * _PAGE
    fd = _pidfd()
    if fd is None:
        return 0
    for at in range(0, len(ranges), _IOV_MAX):  # (a loop over calls of 1,024 ranges, not over rows)
        chunk = ranges[at:at + _IOV_MAX]
        if _syscall(_SYS_PROCESS_MADVISE, fd, ctypes.c_void_p(chunk.ctypes.data), len(chunk), _MADV_WILLNEED, 0) < 0:
            _disable()  # e.g. a kernel before 5.10: the gathers fault as they did
            return 0
    return len(ranges)


def _pidfd() -> int | None:
    pid = os.getpid()
    fd = _advisor.get("fd") if _advisor.get("pid") == pid else None
    if fd is None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            _disable()
            return None
        _advisor.update(pid=pid, fd=fd)
    return fd


def _disable() -> None:
    global _syscall
    _syscall = None


def prefetch_rows(array: pa.Array, rows: np.ndarray) -> None:
    """``prefetch`` the pages of ``array`` (memory-mapped) that a gather of ``rows`` reads: validity
    bits, values, and a string's offsets, then its bytes."""
    if not len(rows):
        return
    buffers = array.buffers()
    positions = rows.astype(np.int64) + array.offset
    if buffers[0] is not None:
        prefetch(buffers[0].address, 1, positions >> 3)
    t = array.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        width = 8 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else 4
        prefetch(buffers[1].address, width, np.concatenate((positions, positions + 1)))
        offsets = np.frombuffer(buffers[1], dtype=np.int64 if width == 8 else np.int32)
        begin, end = offsets[positions], offsets[positions + 1]  # waits for the offsets' pages only
        if buffers[2] is not None:
            prefetch(buffers[2].address, 1, np.concatenate((begin, np.maximum(end - 1, begin))))
    elif len(buffers) == 2 and buffers[1] is not None and t.bit_width >= 8:
        prefetch(buffers[1].address, t.bit_width // 8, positions)
    elif len(buffers) == 2 and buffers[1] is not None:  # booleans: bits
        prefetch(buffers[1].address, 1, positions >> 3)
