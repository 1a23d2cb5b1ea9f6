"""Group commit for in-memory databases: batches that queue for the write lock are maintained together.

Contract (what a producer sees is exactly what it saw one batch at a time):
every batch gets its own offset, in the order the batches were taken, and
its own outcome (a bad batch fails alone, with the error it would have had
on its own, and changes nothing); ``apply_changes`` returns only after the
snapshot holding the batch is published, so a read that starts after the
acknowledgement sees it (read your writes).

How: producers append a ticket to the engine's pending list
(ivm/ingest/ingest_group.py) and take the write lock; whoever holds it takes every
pending ticket (a *unit*) and commits them at once: each batch is
normalized on its own, the batches of one keyed table are converted in one
statement (``convert_unit``), the view programs run **once** over the
per-table sums of the deltas (Z-sets add), and one snapshot is published at
the unit's last offset. The view history records the unit's view deltas for
its offset range (as a durable fold does), so a subscriber resuming inside
the range gets them once.

Cost: a batch's maintenance is mostly fixed cost (measured in memory,
``bench.flight``'s two views: 17.6 ms CPU for 1,000 rows, 29.5 ms for
5,000), so N queued batches cost about one, and the CPU (and GIL) the
ingest takes from reads in the same process shrinks with the queue.

A unit with one ticket, a batch of a watermarked table (judged late against
the watermark the batches before it left), or a maintenance error takes
the one-batch path (``Engine.ingest_one``): on an error nothing of the unit
was published, so each batch is applied alone and only the failing one
fails.

``Settings.ingest_nice`` > 0 (``ivm serve --ingest-nice N``; in-memory
databases only: a durable database's reads wait for its maintainer; off by
default): units are committed by
a thread of their own (``Committer``) at that OS niceness (Linux; elsewhere
it is an ordinary thread), so reads served by the same process get a core
first. Measured in process (``bench.cpu_costs lookup-waits``, 10 batches/s
of 5,000 rows, load ~8): point-read wall p99 9.1-11.3 ms -> 4.7-6.2 ms,
run-queue wait p99 6.8-8.2 -> 3.1-4.2 ms, ingest CPU per batch unchanged.
The price: a lookup waiting for the GIL may wait for the lower-priority
thread that holds it. On a machine with no idle core the committer may not
run for a while: a producer whose batch it has not taken within
``TAKE_OVER_AFTER`` commits the pending unit itself, at its own priority
(measured at load 4-6 without this: 37.7k of 50k rows/s, ack p99 751 ms;
with it, 24.2k: the committer takes the unit at once, then loses the core
mid-commit, so at nice 10 a loaded machine loses ingest rate). Off by
default: nearly quiet (load 1-5), bench.flight's lookup p99 was 10.5 ms
without it, 10.6 (nice 10) and 13.3 (nice 5) with it, at a lower rate.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Protocol

from ivm.ingest.ingest_group import Converting, Pending, Ticket, convert_unit, zset_sums
from ivm.maintain.publishing import Publishing
from sql_frontend.errors import IvmError


class OwnedLock:
    """A reentrant lock that tells whether the calling thread holds it (``threading.RLock`` has no
    public way to say): a batch handed in under it (CREATE TABLE ... AS) must commit at once, not
    wait for a committer thread that would need the lock."""

    def __init__(self):
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> "OwnedLock":
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def held(self) -> bool:
        return self._owner == threading.get_ident()


class Committing(Converting, Publishing, Protocol):
    """What committing a unit needs (the in-memory engine has it): the batches waiting for the write
    lock, the one-batch path, and the one maintain-and-publish step."""

    write_lock: OwnedLock
    pending: Pending
    offset: int

    def ingest_one(self, ticket: Ticket) -> None: ...


def commit_unit(engine: Committing, tickets: list[Ticket]) -> None:
    """Apply ``tickets`` (under the write lock); fill in each one's offset or error."""
    if len(tickets) > 1 and all(_groupable(engine, t) for t in tickets):
        try:
            _commit_together(engine, tickets)
            return
        except Exception:
            for ticket in tickets:  # nothing was published: each batch on its own below
                ticket.done, ticket.error, ticket.offset = False, None, 0
        finally:
            engine.heads.clear()
    for ticket in tickets:
        engine.ingest_one(ticket)


def _groupable(engine: Committing, ticket: Ticket) -> bool:
    definition = engine.catalog.tables.get(ticket.table)
    return definition is not None and definition.event_time is None and not definition.shadow_of


def _commit_together(engine: Committing, tickets: list[Ticket]) -> None:
    unit = convert_unit(engine, tickets, defer=False)  # per-batch errors and known (source, seq) are settled here
    if not unit.tickets:
        return
    parts = {table: [d for d in deltas if d.num_rows] for table, deltas in unit.deltas.items()}
    rows = sum(d.num_rows for tables in parts.values() for d in tables)
    worker = engine.worker(rows)
    deltas = zset_sums(parts, worker, engine.catalog)
    snapshot = engine.store.snapshot.with_changes(unit.versions)
    first = engine.offset + 1
    engine.maintain_and_publish(snapshot, deltas, unit.counts, worker, first=first, last=first + len(unit.tickets) - 1,
                                assign=True)
    for offset, ticket in enumerate(unit.tickets, start=first):
        engine.producers.record(ticket.source, ticket.seq, offset)
        ticket.offset, ticket.done = offset, True


# Seconds a producer waits for the committer to take its batch before committing it itself.
TAKE_OVER_AFTER = 0.02


def take_and_commit(engine: Committing) -> None:
    """Commit the pending unit (under the write lock); no ticket of it is left waiting, whatever happens."""
    tickets = engine.pending.take_unit()
    for ticket in tickets:
        ticket.taken = True
    try:
        commit_unit(engine, tickets)
    except BaseException as e:  # e.g. KeyboardInterrupt
        for other in tickets:
            if not other.done:
                other.error, other.done = e, True
        raise


def lower_priority(nice: int) -> None:
    """Give the calling thread OS niceness ``nice`` (Linux: a thread is a task of its own)."""
    if nice > 0 and sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass  # not permitted here: an ordinary thread


class Committer:
    """A thread of its own, at a lower OS priority, that commits every pending unit."""

    def __init__(self, engine: Committing, nice: int):
        self.engine = engine
        self.nice = nice
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="ivm-committer", daemon=True)
        self.thread.start()

    def commit(self, ticket: Ticket) -> None:
        """Queue ``ticket`` and wait until it is done; commit it here if the committer is slow to start."""
        self.engine.pending.add(ticket)
        deadline = time.monotonic() + TAKE_OVER_AFTER
        with self.cond:
            self.cond.notify_all()
            while not ticket.done and not self.stopping and not ticket.taken:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.cond.wait(remaining)
        if not ticket.done and not ticket.taken and not self.stopping:
            # No idle core for the committer (or it is busy with an earlier unit): the
            # producer commits at its own priority, as without a committer, so ingest
            # never starves on a loaded machine.
            try:
                with self.engine.write_lock:
                    while not ticket.done:
                        take_and_commit(self.engine)
            finally:
                with self.cond:
                    self.cond.notify_all()  # producers of the batches committed with ours
        with self.cond:
            while not ticket.done:
                if self.stopping:
                    raise IvmError("the database was closed before the batch was applied")
                self.cond.wait()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    def _run(self) -> None:
        lower_priority(self.nice)
        while True:
            with self.cond:
                while not self.stopping and not self.engine.pending.waiting():
                    self.cond.wait()
                if self.stopping:
                    return
            try:
                with self.engine.write_lock:
                    take_and_commit(self.engine)
            except BaseException:  # the tickets hold the error; the thread goes on
                pass
            with self.cond:
                self.cond.notify_all()
