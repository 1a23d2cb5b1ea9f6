"""A bounded in-memory history of each view's and table's changes, for subscribers.

After every publish the engine appends, per view or table that changed, its
delta (a Z-set: the relation's columns plus ``__weight``; a table's is its
batch, an update as -old/+new) under the offset of the batch that caused
it. A view's first entry is its contents when it was created (the delta from
empty), under the offset it was created at, and a table starts empty, so a
subscriber starting from before either existed integrates to it.

An entry may cover several offsets: a durable database folds a run of
batches into the views at once and records the sum under the run's last
offset, with the run's first offset. A reader resumes only from an entry's
boundary (offsets it was given: a read's offset, ``through``, an
``__offset``); resuming from inside a run is an error, never a repeat of the
part of the run the reader had already seen (after a reopen the log is
folded in runs that differ from the ones before the crash).

Readers ask for a relation's entries after an offset; they may wait for new
ones (live tailing). Retention is by total rows: when the history holds more
than ``retain_rows`` rows the oldest entries go (views and tables each have a
budget of ``retain_rows``, so a busy table never shortens a view's history),
and each relation remembers the newest offset it lost (its *horizon*). Asking for changes after an offset
older than the horizon is an error that tells the client to re-read the view
and subscribe from the offset of that read. A slow subscriber therefore costs
the server nothing beyond the bounded history: it reads at its own pace and
falls off the end if it is too slow.

>>> import pyarrow as pa
>>> log = ViewHistory(retain_rows=3)
>>> log.append(1, {"v": pa.table({"a": [1, 2], "__weight": [1, 1]})})
>>> log.append(2, {"v": pa.table({"a": [3, 4], "__weight": [1, 1]})})
>>> [offset for offset, _ in log.read("v", 1).entries]
[2]
>>> log.read("v", 0)
Traceback (most recent call last):
...
storage.errors.OffsetError: changes of v after offset 0 are no longer retained (history starts after offset 1); read v again and subscribe from the offset of that read
>>> log.append(6, {"v": pa.table({"a": [5], "__weight": [1]})}, first=3)
>>> log.read("v", 4)
Traceback (most recent call last):
...
storage.errors.OffsetError: offset 4 is inside changes of v folded together (offsets 3 to 6); read v again and subscribe from the offset of that read
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

import pyarrow as pa

from storage.errors import OffsetError, UnknownObjectError

DEFAULT_RETAIN_ROWS = 2_000_000


@dataclass
class Changes:
    """Every change of one relation with ``since < offset <= through``, in order."""

    entries: list[tuple[int, pa.Table]]
    through: int  # the log head when read: a consumer may resume from here


@dataclass
class _Pool:
    """The entries of one budget (views', or tables'), oldest first, and their rows."""

    order: deque = field(default_factory=deque)  # (history, rows)
    rows: int = 0


@dataclass
class _History:
    pool: _Pool
    offsets: list[int] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)  # the first offset each entry covers
    deltas: list[pa.Table | None] = field(default_factory=list)
    start: int = 0  # entries before this index were evicted
    horizon: int | None = None  # newest offset evicted (None: nothing lost)
    dropped: bool = False


class ViewHistory:
    def __init__(self, retain_rows: int = DEFAULT_RETAIN_ROWS):
        if retain_rows < 0:
            raise ValueError("retain_rows must be >= 0")
        self.retain_rows = retain_rows
        self._histories: dict[str, _History] = {}
        self._pools = {"view": _Pool(), "table": _Pool()}
        self._head = 0
        self._closed = False
        self._changed = threading.Condition(threading.Lock())

    @property
    def head(self) -> int:
        return self._head

    @property
    def rows(self) -> int:
        return sum(pool.rows for pool in self._pools.values())

    # --- writing (the engine, under its write lock) ------------------------------------
    def append(self, offset: int, deltas: Mapping[str, pa.Table], first: int | None = None) -> None:
        """Record the deltas of the batches ``first`` to ``offset`` (default: one batch), published
        together (offsets never decrease)."""
        with self._changed:
            if offset < self._head:
                raise ValueError(f"offset {offset} is behind the log head {self._head}")
            for relation, delta in deltas.items():
                if delta.num_rows == 0:
                    continue
                history = self._histories.get(relation)
                if history is None or history.dropped:
                    history = self._histories[relation] = _History(self._pools["view"])
                history.offsets.append(offset)
                history.firsts.append(offset if first is None else first)
                history.deltas.append(delta)
                history.pool.order.append((history, delta.num_rows))
                history.pool.rows += delta.num_rows
            self._head = offset
            for pool in self._pools.values():
                self._evict(pool)
            self._changed.notify_all()

    def start(self, relation: str, offset: int, *, complete: bool = True, kind: str = "view") -> None:
        """A relation (re)starts at ``offset`` with no history before it.

        ``complete``: its first entry will be its whole contents (a new view),
        so reading from any earlier offset integrates to the view; a new table's
        is complete too, as it starts empty. ``kind`` ("view" or "table") says
        whose budget its entries count in. Otherwise
        (a database reopened: the history of earlier offsets is gone) reading
        from before ``offset`` is an error, never a silent gap.
        """
        with self._changed:
            self._release(relation)  # entries of an earlier shape (ALTER TABLE) stop counting
            self._histories[relation] = _History(self._pools[kind], horizon=None if complete else offset)
            self._head = max(self._head, offset)
            self._changed.notify_all()

    def drop(self, relation: str) -> None:
        """Forget a dropped relation; waiting readers get an error."""
        with self._changed:
            self._release(relation)
            self._changed.notify_all()

    def _release(self, relation: str) -> None:
        history = self._histories.get(relation)
        if history is not None and not history.dropped:
            history.dropped = True
            history.pool.rows -= sum(d.num_rows for d in history.deltas[history.start:] if d is not None)
            history.offsets, history.firsts, history.deltas, history.start = [], [], [], 0

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _evict(self, pool: _Pool) -> None:
        while pool.rows > self.retain_rows and pool.order:
            history, rows = pool.order.popleft()
            if history.dropped:
                continue  # its rows were released when it was dropped
            # Entries leave a history in the order they entered the log.
            history.horizon = history.offsets[history.start]
            history.deltas[history.start] = None
            history.start += 1
            pool.rows -= rows
            if history.start > 64 and history.start * 2 > len(history.offsets):
                del history.offsets[: history.start], history.firsts[: history.start], history.deltas[: history.start]
                history.start = 0

    # --- reading (any thread) -----------------------------------------------------------
    def read(self, relation: str, since: int, wait: float = 0.0) -> Changes:
        """Entries of ``relation`` after ``since``; wait up to ``wait`` s for one."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                history = self._check(relation, since)
                entries = self._after(relation, history, since)
                remaining = deadline - time.monotonic()
                if entries or remaining <= 0 or self._closed:
                    return Changes(entries, self._head)
                self._changed.wait(remaining)

    def _check(self, relation: str, since: int) -> _History:
        history = self._histories.get(relation)
        if history is None or history.dropped:
            raise UnknownObjectError(f"table or view {relation} does not exist (or was dropped)")
        if since > self._head:
            raise OffsetError(f"offset {since} is ahead of the latest offset {self._head}")
        if history.horizon is not None and since < history.horizon:
            raise OffsetError(
                f"changes of {relation} after offset {since} are no longer retained "
                f"(history starts after offset {history.horizon}); read {relation} again and "
                "subscribe from the offset of that read"
            )
        return history

    @staticmethod
    def _after(relation: str, history: _History, since: int) -> list[tuple[int, pa.Table]]:
        offsets = history.offsets
        lo, hi = history.start, len(offsets)
        while lo < hi:  # first entry with offset > since
            mid = (lo + hi) // 2
            if offsets[mid] <= since:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(offsets) and history.firsts[lo] <= since:
            first, last = history.firsts[lo], offsets[lo]
            raise OffsetError(
                f"offset {since} is inside changes of {relation} folded together (offsets {first} to {last}); "
                f"read {relation} again and subscribe from the offset of that read"
            )
        return [(o, d) for o, d in zip(offsets[lo:], history.deltas[lo:]) if d is not None]
