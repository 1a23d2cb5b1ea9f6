"""The maintainer: folds acknowledged changes into the views, in micro-batches.

In a durable database an ingest only converts the batch to a Z-set delta of
its table, logs it and queues the delta (``Entry``); the batch is
acknowledged once the log record is on disk. This thread takes every queued
entry that is durable (up to ``fold_rows`` changed rows), runs the view
programs once over the per-table sums of their deltas (Z-sets add), and
publishes one snapshot in which tables and views are at the same offset.

The view programs read base tables as NEW (after the delta), so a fold must
use, per table, exactly the version that includes the deltas it processes
and no later one: every entry carries the table version its batch produced,
and the fold takes the version of the table's last entry it folds.

Upsert batches are queued unconverted (ivm/durable/deferred.py). A second thread
converts runs of them while this one runs the views (ivm/durable/ahead.py); a fold
that finds converted entries first folds just those and leaves the rest to
that thread, unless a reader waits.

Reads wait until the published offset reaches the last durable offset when
they start (read your writes): the recent-changes buffer of the design is
these queued deltas, merged into the views before the read rather than
during it. A view whose program fails here (after the ack) is marked failed
and the other views go on (``Engine.maintain_and_publish(isolate=True)``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import ContextManager, Iterator, Protocol

import pyarrow as pa

from ivm.durable.ahead import ConvertAhead
from ivm.durable import deferred
from ivm.durable.deferred import convert_deferred
from ivm.durable.entry import Entry
from ivm.execute.worker import Worker
from ivm.maintain.publishing import Publishing
from ivm.ingest.prepared import Prepared
from ivm.reads.observations import Observations
from ivm.settings import Settings
from storage.log import ChangeLog
from ivm.ingest.ingest_group import zset_sums
from sql_frontend.errors import InternalError
from storage.hooks import hook
from storage.relation import Relation
from storage.store import Snapshot


log = logging.getLogger("ivm.maintainer")

# Folds up to this many changed rows run on the maintainer's single-threaded DuckDB.
# Producers use the other core: a multi-threaded fold of 50,000-100,000 rows spent
# ~0.4 ms CPU per 1,000-row batch in DuckDB's worker threads (bench.cpu_costs ingest)
# for no gain in throughput. Larger folds (bulk loads) still use every core.
FOLD_LARGE_BATCH = 250_000


class Folding(deferred.Heads, Publishing, Protocol):
    """What a fold needs (the durable engine has it): the log saying what is durable, the heads and
    conversion of deferred batches, and the one maintain-and-publish step."""

    settings: Settings
    log: ChangeLog
    observed: Observations
    convert_lock: ContextManager

    def want_indexes(self, table: str, keys: tuple) -> None: ...


class Maintainer:
    def __init__(self, engine: Folding, small: Worker, large: Worker,
                 ahead: tuple[Worker, Worker]):
        self.engine = engine
        self.small, self.large = small, large
        self.queue: deque[Entry] = deque()
        self.queued_rows = 0
        self.cond = threading.Condition()
        self.fold_lock = threading.RLock()  # a fold, or a DDL/checkpoint that needs none to run
        self.error: BaseException | None = None
        self.stopping = False
        self.demanded = False  # a reader waits for the next fold
        self.folds = 0
        self.thread = threading.Thread(target=self._run, name="ivm-maintainer", daemon=True)
        # converts queued upserts while a fold runs the views (ivm/durable/ahead.py), with its own workers
        self.ahead = ConvertAhead(engine, self, lambda rows: ahead[rows > FOLD_LARGE_BATCH])

    def start(self) -> None:
        self.thread.start()
        self.ahead.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for thread in (self.ahead.thread, self.thread):
            if thread.is_alive():
                thread.join()

    def fail(self, error: BaseException) -> None:
        """Maintenance stopped on a bug: reads raise it instead of waiting forever."""
        log.error("view maintenance stopped", exc_info=error)
        with self.cond:
            self.error = self.error or error  # the first: a fold refusing to run after it says less
            self.cond.notify_all()

    # --- producers' side -------------------------------------------------------------
    def enqueue(self, entry: Entry) -> None:
        with self.cond:
            self.queue.append(entry)
            self.queued_rows += entry.rows

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def queued_by_table(self) -> dict[str, int]:
        with self.cond:
            out: dict[str, int] = {}
            for entry in self.queue:
                for table, deltas in entry.deltas.items():
                    out[table] = out.get(table, 0) + sum(t.num_rows for t in deltas)
                for table, items in entry.batches.items():
                    out[table] = out.get(table, 0) + sum(b.num_rows for b, _ in items)
            return out

    def deferred(self, table: str) -> list[Entry]:
        """Queued entries holding unconverted batches of ``table`` (caller holds the convert lock)."""
        with self.cond:
            return [entry for entry in self.queue if table in entry.batches]

    def converted(self, entry: Entry, table: str, version: Relation, delta: pa.Table) -> None:
        """A queued entry's batches of ``table`` were converted (under the cond: status reads the queue)."""
        with self.cond:
            before = entry.rows
            del entry.batches[table]
            entry.versions[table] = version
            entry.deltas.setdefault(table, []).append(delta)
            self.queued_rows += entry.rows - before

    def replace(self, run: list[Entry], deltas: dict[str, list[pa.Table]], versions: dict[str, Relation]) -> None:
        """Queued entries whose batches were converted together (ivm/durable/ahead.py) become one entry,
        at the last one's offset. They are still in the queue: folds take entries under the
        convert lock, which the caller holds."""
        merged = Entry(run[-1].offset, deltas, versions, run[0].timestamp)
        with self.cond:
            first = next(i for i, entry in enumerate(self.queue) if entry is run[0])
            if any(self.queue[first + i] is not entry for i, entry in enumerate(run)):
                raise InternalError("queued entries converted ahead are no longer in the queue")
            kept = list(self.queue)
            kept[first:first + len(run)] = [merged]
            self.queue = deque(kept)
            self.queued_rows += merged.rows - sum(entry.rows for entry in run)

    # --- readers' side ---------------------------------------------------------------
    def wait_published(self, offset: int) -> None:
        """Block until the published snapshot is at ``offset`` or later."""
        store = self.engine.store
        if store.snapshot.offset >= offset:
            return
        with self.cond:
            self.demanded = True
            self.cond.notify_all()
            while store.snapshot.offset < offset:
                if self.error is not None:
                    raise InternalError(f"view maintenance stopped: {self.error}") from self.error
                self.cond.wait(0.5)

    # --- the thread --------------------------------------------------------------------
    def _ready(self) -> bool:
        return bool(self.queue) and self.queue[0].offset <= self.engine.log.durable

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and self.error is None and not self._ready():
                        self.cond.wait(0.5)
                    if self.error is not None or (self.stopping and not self._ready()):
                        return
                self.fold(everything=self._gather())
        except BaseException as e:  # a bug: reads must not wait forever
            self.fail(e)

    def _gather(self) -> bool:
        """Wait up to ``fold_delay`` for more changes, so one fold covers more batches
        (each fold runs every affected view's program once, whatever its size). A
        reader waiting for the fold, ``fold_rows`` queued rows or closing ends the
        wait at once: the delay never holds up a read. True when the fold must take
        every queued batch (a reader waits, or closing)."""
        settings = self.engine.settings
        deadline = time.monotonic() + settings.fold_delay
        with self.cond:
            while (not self.stopping and not self.demanded and self.queued_rows < settings.fold_rows
                   and (remaining := deadline - time.monotonic()) > 0):
                self.cond.wait(remaining)
            everything = self.demanded or self.stopping
            self.demanded = False
            return everything

    def _take(self, everything: bool) -> list[Entry]:
        """The durable queued entries, up to ``fold_rows``. Unless ``everything``, when the
        first is converted, the entries not converted yet after it are left to the thread
        converting ahead (ivm/durable/ahead.py), so the fold does not convert them on its own thread;
        the next fold takes them if that thread has not converted them by then."""
        with self.cond:
            durable = self.engine.log.durable
            taken: list[Entry] = []
            rows = 0
            leave = not everything and bool(self.queue) and not self.queue[0].batches
            while self.queue and self.queue[0].offset <= durable:
                if taken and rows + self.queue[0].rows > self.engine.settings.fold_rows:
                    break
                if leave and self.queue[0].batches:
                    break
                entry = self.queue.popleft()
                rows += entry.rows
                taken.append(entry)
            self.queued_rows -= rows
            return taken

    def fold(self, everything: bool = True) -> None:
        """Fold the durable queued entries into the views and publish (see ``_take``)."""
        with self.fold_lock:
            engine = self.engine
            started = time.perf_counter()  # the conversion of deferred upserts is part of the fold
            entries, converted = self._take_converted(everything)
            if not entries:
                return
            before = snapshot = engine.store.snapshot
            versions: dict[str, Relation] = {}
            parts: dict[str, list[pa.Table]] = {}
            counts: dict[str, int] = {}
            for entry in entries:
                versions.update(entry.versions)
                for name, n in entry.counts.items():
                    counts[name] = counts.get(name, 0) + n
                for table, deltas in entry.deltas.items():
                    parts.setdefault(table, []).extend(d for d in deltas if d.num_rows)
            for table, prepared in converted.items():  # after every eager version of the table
                versions[table] = prepared.updated
                if prepared.change.delta.num_rows:
                    parts.setdefault(table, []).append(prepared.change.delta)
            parts = {table: tables for table, tables in parts.items() if tables}
            snapshot = snapshot.with_changes(versions)
            rows = sum(t.num_rows for tables in parts.values() for t in tables)
            worker = self._worker(rows)
            deltas = zset_sums(parts, worker, engine.catalog)

            def before_publish(maintained: Snapshot) -> None:
                self._keep_indexes(before.with_changes(versions), maintained)
                hook("fold.before_publish")

            engine.maintain_and_publish(snapshot, deltas, counts, worker, first=before.offset + 1,
                                        last=entries[-1].offset, assign=False, isolate=True,
                                        before_publish=before_publish, guard=self._publishing())
            self._observe(entries, started)

    @contextmanager
    def _publishing(self) -> Iterator[None]:
        """Held while a fold publishes: waiters see the new snapshot and the fold count together."""
        with self.cond:
            yield
            self.folds += 1
            self.cond.notify_all()

    def _observe(self, entries: list[Entry], started: float) -> None:
        """Record the fold's time and, per entry, how long its batches waited to be visible."""
        observed = self.engine.observed
        observed.fold_seconds.observe(time.perf_counter() - started)
        now = time.time()  # entries are stamped with wall-clock time (it is logged with them)
        for entry in entries:
            if not entry.replayed:  # its age says when it was logged, not how late a fold made it visible
                observed.visible_seconds.observe(max(0.0, now - entry.timestamp))

    def _take_converted(self, everything: bool) -> tuple[list[Entry], dict[str, Prepared]]:
        """The entries to fold, and the conversion of their batches not converted yet.

        The convert lock guards the tables' heads. While someone else holds it (the
        thread converting ahead, or a producer converting a batch now) and the queue
        starts with converted entries, the fold takes just those, without the lock:
        they need no conversion, and waiting would idle the fold for the whole
        conversion (the other thread only converts entries after them)."""
        lock = self.engine.convert_lock
        if not lock.acquire(blocking=False):
            with self.cond:
                ready = bool(self.queue) and not self.queue[0].batches
            if ready:
                self._check()
                return self._take(everything=False), {}
            lock.acquire()
        try:
            self._check()
            entries = self._take(everything)
            return entries, convert_deferred(self.engine, entries, self._worker) if entries else {}
        finally:
            lock.release()

    def _check(self) -> None:
        if self.error is not None:  # converting ahead failed (ivm/durable/ahead.py): heads may be wrong
            raise InternalError(f"view maintenance stopped: {self.error}") from self.error

    def _worker(self, rows: int) -> Worker:
        return self.large if rows > FOLD_LARGE_BATCH else self.small

    def _keep_indexes(self, before: Snapshot, after: Snapshot) -> None:
        """Indexes a fold added to a table are added on the ingest side too (once),
        so later versions of the table have them and folds do not rebuild them."""
        for table in self.engine.catalog.tables:
            if table in before and table in after and after[table].index_keys != before[table].index_keys:
                self.engine.want_indexes(table, after[table].index_keys)
