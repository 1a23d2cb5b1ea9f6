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

import itertools
import os
import threading
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

