"""Undo a catalog change whose storage failed: the engine as it was before the statement.

A durable DDL changes the catalog in memory, then checkpoints (ivm/durable/durable.py).
When that checkpoint fails before its manifest is renamed, the stored database
still holds the old catalog, so the one in memory must go back to it too -
otherwise writes to an object that was never stored are acknowledged, and the
next open cannot replay them. ``CatalogState.capture`` takes, before the
change, everything a CREATE, DROP or ALTER touches; ``restore`` puts it back:

* the catalog's tables and views (the binder follows: names added are dropped
  from it, names removed are created again) and each view's stored-output
  switch (CREATE of a view over a computed view gives that one stored output);
* the published snapshot (the relations, their indexes and stale flags);
* views' failure marks, watermarks, and the change histories of views and
  tables (one created is forgotten; one dropped or altered starts again at the
  current offset, its earlier history gone, as after a reopen);
* the catalog generation.

The catalog's version only grows (caches keyed by it must not mistake the
restored catalog for the failed one), and so does the store's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ivm.catalog import Catalog, TableDef, ViewDef
from ivm.streams.event_time import Watermarks
from storage.relation import Relation
from storage.store import Snapshot, Store
from storage.view_history import ViewHistory


class Undoable(Protocol):
    """What a DDL statement may change, and so what undoing it puts back (the durable engine has it)."""

    catalog: Catalog
    store: Store
    history: ViewHistory
    watermarks: Watermarks
    failed: dict[str, str]
    generation: str
    offset: int
    heads: dict[str, Relation]


@dataclass(frozen=True)
class CatalogState:
    tables: dict[str, TableDef]
    views: dict[str, ViewDef]
    outputs: dict[str, tuple[bool, list]]  # per view: (stored_output, states)
    snapshot: Snapshot
    failed: dict[str, str]
    max_us: dict[str, int]
    late: dict[str, int]
    generation: str
    oids: dict[str, int]

    @staticmethod
    def capture(engine: Undoable) -> "CatalogState":
        catalog = engine.catalog
        return CatalogState(
            tables=dict(catalog.tables), views=dict(catalog.views),
            outputs={name: (v.stored_output, list(v.states)) for name, v in catalog.views.items()},
            snapshot=engine.store.snapshot, failed=dict(engine.failed),
            max_us=dict(engine.watermarks.max_us), late=dict(engine.watermarks.late),
            generation=engine.generation, oids=dict(catalog.oids),
        )

    def restore(self, engine: Undoable) -> None:
        """Put the engine back as captured (the caller holds the write and fold locks)."""
        catalog = engine.catalog
        before = {**self.tables, **self.views}
        now = {**catalog.tables, **catalog.views}
        for name in now.keys() - before.keys():  # created by the statement
            catalog.binder.drop(name)
            engine.history.drop(name)  # a view or table (dropping one never recorded is a no-op)
        for name in before.keys() - now.keys():  # dropped by the statement
            catalog.binder.create(name, before[name].columns)
            if name in self.views or self.tables[name].shadow_of is None:
                engine.history.start(name, engine.offset, complete=False, kind=before[name].kind)
        for name in before.keys() & now.keys():  # altered by the statement (ALTER TABLE)
            if before[name].columns != now[name].columns:
                catalog.binder.drop(name)
                catalog.binder.create(name, before[name].columns)
                engine.history.start(name, engine.offset, complete=False, kind="table")
        if before.keys() != now.keys() or any(before[n] is not now[n] for n in now):
            catalog.tables.clear()
            catalog.tables.update(self.tables)
            catalog.views.clear()
            catalog.views.update(self.views)
            catalog.version += 1
        # a dropped relation gets its OID back; one created keeps none (``next_oid`` only grows, so an OID
        # a client may have seen is never given to another relation)
        catalog.oids.clear()
        catalog.oids.update(self.oids)
        for name, (stored_output, states) in self.outputs.items():
            view = self.views[name]
            if view.stored_output != stored_output or view.states != states:
                view.stored_output, view.states = stored_output, states
                view.programs.clear()  # compiled for the other shape
        if engine.store.snapshot is not self.snapshot:
            engine.store.publish(self.snapshot)
        engine.failed = dict(self.failed)
        engine.watermarks.max_us.clear()
        engine.watermarks.max_us.update(self.max_us)
        engine.watermarks.late.clear()
        engine.watermarks.late.update(self.late)
        engine.generation = self.generation
        engine.heads.clear()
