"""Group ingest: batches that wait for the write lock are converted together.

Producers of a durable database append their batch to a pending list and
take the write lock; whoever gets it converts every pending batch (a
*unit*) and the others find theirs done. Each batch keeps its own offset,
log record and outcome, exactly as if they had come one at a time:

* each batch is normalized on its own (a bad batch fails alone);
* the batches of one keyed table with the same missing-delete policy are
  converted in one statement: their concatenation in order, with ``__seq``
  running on across batches, is what sequential application means (the
  keyed conversion resolves repeated keys by ``__seq``: an insert ``c``
  fails when the key exists just before it, a delete when it does not).
  If that statement reports any error, the batches are converted one by
  one instead, so only the offending batch fails;
* bag tables are converted one by one (their conversion nets each row's
  copies over the whole batch, which is not sequential across batches).

Batches of upserts only are not converted here at all: the fold converts
them (ivm/durable/deferred.py). The unit becomes one maintainer entry, so a fold
never publishes part of it.
A unit holds at most one batch per producer source, so sequence numbers are
checked in order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ContextManager, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.zset import WEIGHT, consolidate
from ivm.catalog import Catalog
from ivm.durable import deferred
from ivm.execute.worker import Worker
from ivm.ingest.changes import as_table, missing_delete_policy
from ivm.ingest.prepared import Prepared
from ivm.ingest.producers import Producers
from sql_frontend.errors import ChangeError, IvmError
from storage.relation import Relation


class Converting(deferred.Heads, Protocol):
    """What validating and converting a unit needs (the engine has it, in memory or durable). The
    queue of deferred batches (``maintainer``) and ``convert_lock`` are the durable engine's: only
    ``defer`` reaches them."""

    producers: Producers
    convert_lock: ContextManager

    def change_schema(self, table: str) -> pa.Schema: ...

    def accept_events(self, table: str, prepared: Prepared) -> None: ...


@dataclass
class Ticket:
    table: str
    data: Any
    on_missing_delete: str | None
    source: str | None
    seq: int | None
    done: bool = False
    taken: bool = False  # a committer took it (in-memory group commit, ivm/ingest/group_commit.py)
    offset: int = 0
    error: BaseException | None = None
    batch: pa.Table | None = None  # normalized
    policy: str = "error"
    delta: pa.Table | None = None


@dataclass
class Unit:
    """What one conversion pass accepted: one maintainer entry."""

    tickets: list[Ticket] = field(default_factory=list)
    deltas: dict[str, list[pa.Table]] = field(default_factory=dict)
    versions: dict[str, Relation] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # late events per stream (snapshot counters)
    batches: dict[str, list[tuple[pa.Table, str]]] = field(default_factory=dict)  # deferred (ivm/durable/deferred.py)
    # per head the unit moved: the head before it (None: there was none), so ``undo`` can put it back
    previous: dict[str, "Relation | None"] = field(default_factory=dict)


class Pending:
    def __init__(self) -> None:
        self._tickets: list[Ticket] = []
        self._lock = threading.Lock()

    def add(self, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.append(ticket)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._tickets)

    def take_unit(self) -> list[Ticket]:
        """The longest prefix with at most one ticket per source."""
        with self._lock:
            sources: set[str] = set()
            n = 0
            for ticket in self._tickets:
                if ticket.source is not None:
                    if ticket.source in sources:
                        break
                    sources.add(ticket.source)
                n += 1
            unit, self._tickets = self._tickets[:n], self._tickets[n:]
            return unit


def convert_unit(engine: Converting, tickets: list[Ticket], defer: bool = True) -> Unit:
    """Validate and convert a unit's batches (under the write lock); fill in each ticket's outcome.

    ``defer``: upsert-only batches are left for the fold (durable; ivm/durable/deferred.py); in-memory
    group commit (ivm/ingest/group_commit.py) converts everything at once.
    """
    live: list[Ticket] = []
    for ticket in tickets:
        try:
            known = engine.producers.known(ticket.source, ticket.seq) if ticket.source is not None else None
            if known is not None:
                ticket.offset, ticket.done = known, True
                continue
            _normalize(engine, ticket)
            live.append(ticket)
        except IvmError as e:
            ticket.error, ticket.done = e, True
    unit = Unit()
    by_table: dict[str, list[Ticket]] = {}
    for ticket in live:
        by_table.setdefault(ticket.table, []).append(ticket)
    for table, group in by_table.items():
        _convert_table(engine, table, group, unit, defer)
    unit.tickets = [t for t in live if t.error is None]
    return unit


def _normalize(engine: Converting, ticket: Ticket) -> None:
    definition = engine.catalog.table(ticket.table)
    data = as_table(ticket.data)
    ticket.policy = missing_delete_policy(data, ticket.on_missing_delete)
    schema = engine.change_schema(ticket.table)
    ticket.batch = engine.worker(data.num_rows).normalizer.normalize(definition, schema, data)


def _convert_table(engine: Converting, table: str, group: list[Ticket], unit: Unit, defer: bool) -> None:
    definition = engine.catalog.table(table)
    items = [(t.batch, t.policy) for t in group]
    if defer:
        if deferred.deferrable(definition, items):  # upserts only: converted at the fold (ivm/durable/deferred.py)
            unit.batches.setdefault(table, []).extend(items)
            for ticket in group:
                ticket.delta = None
            return
        with engine.convert_lock:  # the heads (ivm/durable/deferred.py): taken only to convert now
            deferred.flush(engine, table)  # the head must hold every earlier batch
            _convert_now(engine, table, group, unit)
        return
    _convert_now(engine, table, group, unit)


def _convert_now(engine: Converting, table: str, group: list[Ticket], unit: Unit) -> None:
    definition = engine.catalog.table(table)
    # Batches of a watermarked table are converted one by one: each is judged late
    # against the watermark the batches before it left (as replay does).
    if (len(group) > 1 and definition.primary_key and len({t.policy for t in group}) == 1
            and definition.event_time is None):
        combined = deferred.renumbered([t.batch for t in group])
        try:
            prepared = engine.convert(definition, combined, group[0].policy, engine.head(table),
                                      engine.worker(combined.num_rows))
        except ChangeError:
            pass  # some batch is bad: find it below, one at a time
        else:
            _move_head(engine, unit, table, prepared.updated)
            unit.deltas.setdefault(table, []).append(prepared.change.delta)
            for ticket in group:
                ticket.delta = None
            group[-1].delta = prepared.change.delta  # rows are counted once, on the last batch
            return
    for ticket in group:
        try:
            prepared = engine.convert(definition, ticket.batch, ticket.policy, engine.head(table),
                                      engine.worker(ticket.batch.num_rows))
        except IvmError as e:
            ticket.error, ticket.done = e, True
            continue
        for name, version in prepared.versions().items():  # the table (and its on-time rows)
            _move_head(engine, unit, name, version)
        engine.accept_events(table, prepared)
        for name, n in prepared.counts().items():
            unit.counts[name] = unit.counts.get(name, 0) + n
        for part in [prepared, *prepared.hidden]:
            unit.deltas.setdefault(part.change_table, []).append(part.change.delta)
        ticket.delta = prepared.change.delta


def _move_head(engine: Converting, unit: Unit, name: str, version: Relation) -> None:
    unit.previous.setdefault(name, engine.heads.get(name))
    engine.heads[name] = unit.versions[name] = version


def undo(engine: Converting, unit: Unit) -> None:
    """Forget a converted unit that was not accepted (its log write failed): the heads it moved
    go back. Earlier batches it converted on the way (``deferred.flush``) stay converted: they
    were accepted before it. The caller restores the watermarks."""
    for name, previous in unit.previous.items():
        if previous is None:
            engine.heads.pop(name, None)
        else:
            engine.heads[name] = previous


def zset_sum(tables: list[pa.Table], worker: Worker, key: str | None = None) -> pa.Table:
    """One consolidated delta from several of one table (the Z-set sum).

    ``key``: the table's integer primary key column, when each delta is one
    conversion's (consolidated: its rows are distinct). Equal rows have equal
    keys, so rows whose key is in one delta only are already summed; DuckDB
    sums just the rows of keys in two deltas or more (often none: a fold of
    several entries ran a GROUP BY over every column of every row, ~10 ms
    for 40,000 rows).
    """
    if len(tables) == 1:
        return tables[0]
    combined = pa.concat_tables(tables)
    if key is not None:
        shared = _in_several(tables, key)
        if not shared.any():
            return combined
        if not shared.all():
            mask = pa.array(shared)
            return pa.concat_tables([combined.filter(pc.invert(mask)),
                                     _grouped_sum(combined.filter(mask), worker)])
    return _grouped_sum(combined, worker)


def _grouped_sum(combined: pa.Table, worker: Worker) -> pa.Table:
    names = [n for n in combined.column_names if n != WEIGHT]
    return worker.runner.run(consolidate("{d}", names, template=True), d=combined)


def _in_several(tables: list[pa.Table], key: str) -> np.ndarray:
    """Per row of the concatenated ``tables``: is its key in two of them or more?"""
    values = [t.column(key).to_numpy() for t in tables]
    distinct = np.sort(np.concatenate([np.unique(v) for v in values]))
    several = np.unique(distinct[1:][distinct[1:] == distinct[:-1]])
    return np.isin(np.concatenate(values), several)


def summed_key(catalog: Catalog, table: str, delta: pa.Table) -> str | None:
    """The column ``zset_sum`` may group by first: a keyed table's one integer key column."""
    definition = catalog.tables.get(table)
    key = definition.primary_key if definition is not None else ()
    if len(key) != 1 or key[0] not in delta.schema.names:
        return None
    column = delta.schema.field(key[0])
    return key[0] if pa.types.is_integer(column.type) and not delta.column(key[0]).null_count else None


def _key(catalog: Catalog | None, table: str, tables: list[pa.Table]) -> str | None:
    if catalog is None or len(tables) < 2:
        return None
    keys = {summed_key(catalog, table, t) for t in tables}
    return keys.pop() if len(keys) == 1 else None


def zset_sums(parts: dict[str, list[pa.Table]], worker: Worker, catalog: Catalog | None = None) -> dict[str, pa.Table]:
    """Each table's deltas as one (``zset_sum``); tables whose changes cancel out are left out.
    With the ``catalog``, keyed tables' deltas are summed by key first (``summed_key``)."""
    deltas = {table: zset_sum(tables, worker, _key(catalog, table, tables)) for table, tables in parts.items() if tables}
    return {table: delta for table, delta in deltas.items() if delta.num_rows}
