"""Deferred conversion: upsert batches are converted to Z-set deltas at the fold, many at once.

Contract: a durable ingest acknowledges a batch once it is validated and on
disk; converting it to a Z-set delta (the -old/+new rows, the table's next
version) is needed only by the fold and by the next batch that must be
checked against the table. A batch of a keyed table without event time
whose operations are upserts only ('u', 'r', and 'd' when missing deletes
are ignored: ``changes.last_wins``) cannot fail against any table state, so
its producer only normalizes it (schema, types, NULL keys, NOT NULL), logs
it and queues it unconverted (``Entry.batches``). Everything else is
converted at once, as before, so its errors ('c' of an existing key, 'd' of
a missing one) are still raised by ``apply_changes`` and change nothing.

Invariant (per table, under ``DurableEngine.convert_lock``): the table's head
(``DurableEngine.heads``) holds every accepted batch up to some offset, and
the table's unconverted batches are exactly the queued ones after it, in
offset order. Two ways keep it:

* the fold takes its entries and converts their batches per table in one
  conversion (their concatenation in order, ``__seq`` running on: for
  upserts only each key's last row matters, so this is sequential
  application), against the head; the head moves to the result;
* a producer about to convert a batch of the table eagerly (it needs the
  head: a 'c' or 'd' must be checked) first converts the queued batches of
  that table, entry by entry (``flush``).

Why: per 1,000-row batch the producer spent ~3 ms CPU converting (key
lookup, the delta rows, the table's new LSM run and its merges); one
conversion per fold pays the fixed parts once for all its batches.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import pyarrow as pa

from ivm.catalog import Catalog, TableDef
from ivm.durable.entry import Entry
from ivm.execute.worker import Worker
from ivm.ingest.changes import SEQ, last_wins
from ivm.ingest.prepared import Prepared
from sql_frontend.errors import InternalError
from storage.relation import Relation


class DeferredQueue(Protocol):
    """The maintainer's queue as the producers' side sees it (``flush``)."""

    def deferred(self, table: str) -> list[Entry]: ...

    def converted(self, entry: Entry, table: str, version: Relation, delta: pa.Table) -> None: ...


class Heads(Protocol):
    """What converting deferred batches needs (the durable engine has it): each table's head, the
    conversion that moves it, and the queue holding batches not converted yet."""

    catalog: Catalog
    heads: dict[str, Relation]
    maintainer: DeferredQueue

    def head(self, table: str) -> Relation: ...

    def worker(self, rows: int) -> Worker: ...

    def convert(self, definition: TableDef, batch: pa.Table, policy: str, relation: Relation,
                worker: Worker) -> Prepared: ...


def deferrable(definition: TableDef, batches: list[tuple[pa.Table, str]]) -> bool:
    """True when these normalized batches may be acknowledged unconverted (they cannot fail)."""
    return (bool(definition.primary_key) and definition.event_time is None and not definition.shadow_of
            and all(last_wins(batch, policy) for batch, policy in batches))


def convert(engine: Heads, table: str, items: list[tuple[pa.Table, str]], worker: Worker) -> Prepared:
    """Convert a table's deferred batches (in order) against its head; the head moves on."""
    batch = renumbered([b for b, _ in items])
    # Upserts do not depend on the policy; a 'd' is only deferred under 'ignore'.
    policy = "ignore" if any(p == "ignore" for _, p in items) else "error"
    prepared = engine.convert(engine.catalog.table(table), batch, policy, engine.head(table), worker)
    engine.heads[table] = prepared.updated
    return prepared


def convert_deferred(engine: Heads, entries: list[Entry],
                     worker_for: Callable[[int], Worker]) -> dict[str, Prepared]:
    """The fold's side: every table's deferred batches in ``entries``, one conversion per table."""
    items = batches_per_table(entries)
    for entry in entries:
        entry.batches = {}
    return convert_per_table(engine, items, worker_for)


def batches_per_table(entries: list[Entry]) -> dict[str, list[tuple[pa.Table, str]]]:
    """Each table's unconverted batches in ``entries``, in order (the invariant above is checked)."""
    items: dict[str, list[tuple[pa.Table, str]]] = {}
    for entry in entries:
        for table in entry.versions:
            if table in items:  # an eager version after a deferred batch: the invariant is broken
                raise InternalError(f"table {table} was converted past batches not converted yet")
        for table, batches in entry.batches.items():
            items.setdefault(table, []).extend(batches)
    return items


def convert_per_table(engine: Heads, items: dict[str, list[tuple[pa.Table, str]]],
                      worker_for: Callable[[int], Worker]) -> dict[str, Prepared]:
    """One conversion per table of its batches, in order (the fold and the thread converting ahead)."""
    return {table: convert(engine, table, batches, worker_for(sum(b.num_rows for b, _ in batches)))
            for table, batches in items.items()}


def flush(engine: Heads, table: str) -> None:
    """The producers' side: convert the table's queued batches, entry by entry, before an eager conversion."""
    for entry in engine.maintainer.deferred(table):
        batches = entry.batches[table]
        prepared = convert(engine, table, batches, engine.worker(sum(b.num_rows for b, _ in batches)))
        engine.maintainer.converted(entry, table, prepared.updated, prepared.change.delta)


def renumbered(batches: list[pa.Table]) -> pa.Table:
    """The batches one after another, ``__seq`` running on (their order is the order of application)."""
    if len(batches) == 1:
        return batches[0]
    combined = pa.concat_tables(batches)
    position = combined.schema.get_field_index(SEQ)
    return combined.set_column(position, SEQ, pa.array(np.arange(combined.num_rows, dtype=np.int64)))
