"""Converting ahead: a second maintainer thread converts queued upserts while the fold runs the views.

Contract: the result is the one the fold would compute converting the same
batches itself (ivm/durable/deferred.py). The thread takes the longest run of queued
entries, starting at the first one holding unconverted batches, that hold
nothing else (no delta converted at ingest, no late-event counts), converts
their batches per table in one conversion against the table's head, and
replaces the run in the queue by one entry: their per-table deltas, the
tables' versions after them, at the offset of the last. A fold takes an
entry whole, so it publishes every batch of the run or none of them.

Invariant kept (ivm/durable/deferred.py, under ``DurableEngine.convert_lock``): the
entries before the run hold no unconverted batch, and the run's entries
hold no eagerly converted version, so the head of each table is exactly at
the start of the run's batches of that table. The fold takes entries under
the same lock, so the run stays in the queue while it is converted;
producers only append behind it (under the write lock, in offset order).

It starts once ``Settings.convert_ahead_rows`` upsert rows wait: below that
the fold converts them (a conversion has a fixed cost, and each one adds a
run to the table's LSM tree that merges rewrite).

Why: per 1,000-row batch the maintainer spent ~1 ms CPU converting (key
lookup, delta rows, the LSM run and its merges) and ~1.3 ms running the 3
views of bench/ingest.py; one thread doing both capped sustained ingest at
~410,000 rows/s. Both are mostly numpy, Arrow and DuckDB work that releases
the GIL, so the two threads overlap on two cores.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, ContextManager, Protocol

import pyarrow as pa

from ivm.durable import deferred
from ivm.durable.entry import Entry
from ivm.execute.worker import Worker
from ivm.settings import Settings
from storage.relation import Relation


class Queue(Protocol):
    """The maintainer as this thread sees it: its queue and condition, and how to put a run back."""

    queue: deque[Entry]
    cond: threading.Condition
    stopping: bool
    error: BaseException | None

    def fail(self, error: BaseException) -> None: ...

    def replace(self, run: list[Entry], deltas: dict[str, list[pa.Table]], versions: dict[str, Relation]) -> None: ...


class Converting(deferred.Heads, Protocol):
    """What converting ahead needs of the durable engine: the heads and the lock that guards them."""

    settings: Settings
    convert_lock: ContextManager


def convertible(queue) -> list[Entry]:
    """The run of entries the thread may convert together (see the module docstring)."""
    run: list[Entry] = []
    for entry in queue:
        if not run and not entry.batches:
            continue
        if not entry.batches or entry.deltas or entry.versions or entry.counts:
            break
        run.append(entry)
    return run


class ConvertAhead:
    def __init__(self, engine: Converting, maintainer: Queue, worker_for: Callable[[int], Worker]):
        self.engine, self.maintainer = engine, maintainer
        self.worker_for = worker_for
        self.conversions = 0
        self.thread = threading.Thread(target=self._run, name="ivm-convert-ahead", daemon=True)

    def _due(self) -> bool:
        """(Under the maintainer's cond.) Enough unconverted rows wait."""
        rows = sum(entry.rows for entry in convertible(self.maintainer.queue))  # batches only: no deltas in a run
        return rows >= max(1, self.engine.settings.convert_ahead_rows)

    def _run(self) -> None:
        maintainer = self.maintainer
        while True:
            with maintainer.cond:
                while not maintainer.stopping and maintainer.error is None and not self._due():
                    maintainer.cond.wait(0.5)
                if maintainer.stopping or maintainer.error is not None:
                    return
            with self.engine.convert_lock:
                try:
                    self.convert()
                except BaseException as e:  # a bug; failed under the lock, so no fold uses the moved heads
                    maintainer.fail(e)
                    return

    def convert(self) -> None:
        """(Under the convert lock.) Convert the queue's convertible run and put it back as one entry."""
        with self.maintainer.cond:
            run = convertible(self.maintainer.queue)
        if not run:
            return
        prepared = deferred.convert_per_table(self.engine, deferred.batches_per_table(run), self.worker_for)
        deltas = {table: [one.change.delta] for table, one in prepared.items()}
        versions = {table: one.updated for table, one in prepared.items()}
        self.maintainer.replace(run, deltas, versions)
        self.conversions += 1
