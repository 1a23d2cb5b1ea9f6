"""The two recompute paths of a view, and its stale-state flag.

Which path a batch takes is the cost model's choice (ivm/maintain/maintenance.py);
this module runs them. For a view V with operator state S and output O,
over its sources' NEW contents (tables as stored; upstream views with this
batch's changes applied on the side):

refresh (the cheap path):

    O'  = DuckDB evaluating V's SELECT (``plan_sql.to_sql`` of its plan)
    ΔV  = O' − O          (multiset difference, consolidated, zeros dropped)

    S is not touched, so it is *stale*: its relations are emptied (they would
    only hold memory) and the view is flagged in the snapshot's counters
    (``STALE_PREFIX + V``), which belong to the offset and which checkpoints
    store and restore with it. The stored output becomes O'; a view computed
    on read keeps O' as a relation under its own name while stale, and reads
    use it (ivm/reads/reads.py). A view whose only state is its output is never
    stale: the refresh brings everything it owns up to date.

rebuild (the way back to incremental):

    S', O' = V's initial program from empty state (as at CREATE)
    ΔV     = O' − O,   the stale flag cleared

Both emit ΔV, what the incremental program would have emitted, so views
downstream and subscribers maintain themselves from it unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Mapping, Protocol

import pyarrow as pa
from sqlglot import exp

from delta_operators.compiler import delta_input
from delta_operators.merge import output_key, output_state
from delta_operators.program import StateSpec
from storage.zset import WEIGHT, count_rows, difference
from ivm.binder import Binder, quote
from ivm.catalog import Catalog, ViewDef
from ivm.execute.executor import RowChanges, commit_row_changes, with_program_indexes
from ivm.execute.worker import Worker
from ivm.maintain.mirrors import Mirrors, eligible
from ivm.reads.reads import Reader
from sql_frontend.plan import Column
from storage.relation import Relation
from storage.store import Snapshot, Store


class Recomputing(Protocol):
    """What recomputing a view needs (the engine has it): the catalog and types, the reader that runs
    the view's SELECT, the native mirrors of its tables, and empty relations for its state."""

    catalog: Catalog
    binder: Binder
    store: Store
    reader: Reader
    mirrors: Mirrors

    def empty_relation(self, name: str, columns: tuple[Column, ...], identity: tuple[str, ...],
                       indexes: tuple[tuple[str, ...], ...] = ()) -> Relation: ...

STALE_PREFIX = "stale:"


def is_stale(snapshot: "Snapshot", view: str) -> bool:
    return snapshot.counters.get(STALE_PREFIX + view, 0) > 0


def with_stale(snapshot: "Snapshot", flags: Mapping[str, bool]) -> "Snapshot":
    """The snapshot with each view's stale flag set (True) or cleared (False)."""
    if not flags:
        return snapshot
    counters = dict(snapshot.counters)
    for view, stale in flags.items():
        if stale:
            counters[STALE_PREFIX + view] = 1
        else:
            counters.pop(STALE_PREFIX + view, None)
    return replace(snapshot, counters=MappingProxyType(counters))


def operator_states(view: "ViewDef") -> list[StateSpec]:
    """The relations a refresh leaves stale: every state but the stored output."""
    return [spec for spec in view.states if spec.name != view.name]


def refresh(engine: Recomputing, view: "ViewDef", snapshot: "Snapshot", pending: list["RowChanges"],
            replaced: dict[str, "Relation | None"], worker: "Worker",
            deltas: "Mapping[str, pa.Table] | None" = None) -> tuple[pa.Table, dict[str, "Relation | None"]]:
    """The cheap path: (ΔV, new versions of V's relations). See the module docstring.

    ``deltas``: this batch's deltas of the tables (against the published
    snapshot); with them, a view over keyed base tables reads native mirrors
    of its tables (ivm/maintain/mirrors.py), else the Arrow relations.
    """
    new = _new_sources(engine, view, snapshot, pending, replaced, worker)
    tree, sql = view.select()
    if deltas is not None and eligible(engine.catalog, view):
        rows = engine.mirrors.query(engine.catalog, view, sql, new, engine.store.snapshot, deltas, worker.coder)
    else:
        rows = engine.reader.query(sql, tree, new, internal=True)
    rows = rows.replace_schema_metadata(None).rename_columns(list(view.column_names))
    rows = rows.cast(engine.binder.arrow_schema(view.columns))
    counted = _counted(view, rows, worker)
    old = _output(engine, view, snapshot, worker)
    relations: dict[str, Relation | None] = {}
    output = snapshot[view.name] if view.name in snapshot else _empty(engine, output_state(view.name, view.columns, output_key(view.plan.root)))
    relations[view.name] = output.replace_all(counted, worker.coder)
    if not is_stale(snapshot, view.name):
        for spec in operator_states(view):  # stale from now on: keep the index keys, not the rows
            relations[spec.name] = _empty(engine, spec, snapshot[spec.name].index_keys, worker)
    return _difference(view, old, counted, worker), relations


def rebuild(engine: Recomputing, view: "ViewDef", snapshot: "Snapshot", pending: list["RowChanges"],
            replaced: dict[str, "Relation | None"], worker: "Worker") -> tuple[pa.Table, dict[str, "Relation | None"]]:
    """State and output from the initial program: (ΔV, new versions of V's relations)."""
    new = _new_sources(engine, view, snapshot, pending, replaced, worker)
    new = new.with_changes({spec.name: _empty(engine, spec) for spec in view.states})
    if not view.stored_output:
        new = new.with_changes({view.name: None})  # its stale output: reads compute from state again
    sources = frozenset(view.sources)
    program = view.program(sources, sources, initial=True)  # every source at NEW: as at CREATE
    new = with_program_indexes(program, new, worker.coder)
    inputs = {delta_input(s): new[s].table() for s in sources}
    _, changes = worker.executor.run(program, inputs, new, label=f"view {view.name} (rebuild)")
    new = new.with_changes(commit_row_changes(changes, new, worker.coder))
    relations: dict[str, Relation | None] = {}
    for spec in view.states:  # keep the indexes the incremental programs built on the old state
        relation = new[spec.name]
        for key in snapshot[spec.name].index_keys:
            relation = relation.with_index(key, worker.coder)
        relations[spec.name] = relation
    if not view.stored_output and view.name in snapshot:
        relations[view.name] = None
    old_rows = _output(engine, view, snapshot, worker)
    new_rows = _output(engine, view, new.with_changes(relations), worker)
    return _difference(view, old_rows, new_rows, worker), relations


def _new_sources(engine: Recomputing, view: "ViewDef", snapshot: "Snapshot", pending: list["RowChanges"],
                 replaced: dict[str, "Relation | None"], worker: "Worker") -> "Snapshot":
    """``snapshot`` (tables at NEW, views at OLD) with V's upstream views at NEW too.

    ``pending`` and ``replaced`` are this batch's changes to the views
    maintained before V (its upstream views among them).
    """
    upstream = {s for s in view.sources if s in engine.catalog.views}
    if not upstream:
        return snapshot
    new = snapshot.with_changes(commit_row_changes([c for c in pending if c.relation in upstream], snapshot, worker.coder))
    return new.with_changes({n: r for n, r in replaced.items() if n in upstream})


def _empty(engine: Recomputing, spec: StateSpec, index_keys=(), worker: "Worker | None" = None) -> "Relation":
    relation = engine.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
    for key in index_keys:
        if key not in relation.index_keys:
            relation = relation.with_index(key, worker.coder)
    return relation


def _counted(view: "ViewDef", rows: pa.Table, worker: "Worker") -> pa.Table:
    """Rows with their multiplicity in the weight column."""
    if not rows.num_rows:
        return rows.append_column(WEIGHT, pa.array([], pa.int64()))
    return worker.runner.run(count_rows("rows", view.column_names), rows=rows)


def _output(engine: Recomputing, view: "ViewDef", snapshot: "Snapshot", worker: "Worker") -> pa.Table:
    """The view's rows with their multiplicity in the weight column."""
    if view.name in snapshot:  # stored (or, computed on read, kept while its state is stale)
        return snapshot[view.name].table()
    rows = engine.reader.query(f"SELECT * FROM {quote(view.name)}", exp.Table(this=exp.to_identifier(view.name)),
                               snapshot)
    return _counted(view, rows.replace_schema_metadata(None), worker)


def _difference(view: "ViewDef", old: pa.Table, new: pa.Table, worker: "Worker") -> pa.Table:
    return worker.runner.run(difference("old", "new", view.column_names), old=old, new=new)


def time_select(engine: Recomputing, view: "ViewDef", snapshot: "Snapshot") -> float:
    """Seconds DuckDB takes for the view's SELECT over ``snapshot``: the first estimate of a refresh."""
    import time

    tree, sql = view.select()
    started = time.perf_counter()
    engine.reader.query(sql, tree, snapshot)
    return time.perf_counter() - started
