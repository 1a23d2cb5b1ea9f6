"""Cost-based choice per batch: maintain a view incrementally, or recompute it.

Incremental maintenance is not always cheaper: a cheap view over a large
batch, or a view whose delta program reads whole relations, can cost more
than computing the view again (OpenIVM measured this on single-table views).
Per view, a ``CostModel`` keeps moving estimates of both costs, measured on
this machine as batches run:

* incremental: an exponentially weighted mean of the seconds per batch,
  scaled up for a batch with more changed rows than usual (fixed costs
  dominate small batches, so a smaller batch is not estimated cheaper);
* recompute: the seconds of the last full computation (at CREATE, or a
  batch on the recompute path), scaled by how much the sources grew since.

With ``Settings.maintenance = "auto"`` recompute is chosen when its estimate
is below the incremental one by a margin. The choice costs two
multiplications when incremental is cheaper (nothing else runs on that
path). Every ``PROBE_EVERY``-th batch on the recompute path runs
incrementally again to refresh that estimate: recompute rebuilds the
operator state as well, so the incremental path is always valid.
``"incremental"`` and ``"recompute"`` force one path (tests force recompute
to prove it against the oracle).

Recompute rule (for a view V with operator state S and output O):

    S', O' = initial program over the sources' NEW contents, from empty state
    ΔV     = O' − O          (multiset difference, consolidated, zeros dropped)

ΔV is what the incremental program would have emitted, so downstream views
and subscribers maintain themselves from it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from sqlglot import exp

from sql_frontend.errors import CatalogError
from delta_operators.compiler import delta_input
from delta_operators.zset import WEIGHT
from ivm.binder import quote

if TYPE_CHECKING:
    from ivm.catalog import ViewDef
    from ivm.engine import Engine, Worker
    from ivm.executor import RowChanges
    from storage.relation import Relation
    from storage.store import Snapshot

MODES = ("auto", "incremental", "recompute")
SMOOTHING = 0.3  # weight of the newest measurement in the moving estimates
RECOMPUTE_MARGIN = 1.5  # recompute only when incremental is estimated this many times dearer
PROBE_EVERY = 8  # on the recompute path, every 8th batch measures incremental again


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise CatalogError(f"maintenance must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class CostModel:
    """Moving cost estimates of one view, and what each batch chose."""

    incremental: float | None = None  # seconds per batch
    rows: float | None = None  # changed input rows per batch (moving mean)
    recompute: float | None = None  # seconds of the last full computation ...
    recompute_rows: int = 0  # ... when its sources held this many rows
    batches: dict[str, int] = field(default_factory=lambda: {"incremental": 0, "recompute": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"incremental": 0.0, "recompute": 0.0})
    last: str = ""
    _since_probe: int = 0

    def estimates(self, rows: int, source_rows: int) -> tuple[float | None, float | None]:
        """(incremental, recompute) seconds estimated for a batch of ``rows`` changed rows."""
        incremental = None
        if self.incremental is not None:
            incremental = self.incremental * max(1.0, rows / max(self.rows or 1.0, 1.0))
        recompute = None
        if self.recompute is not None:
            recompute = self.recompute * max(source_rows, 1) / max(self.recompute_rows, 1)
        return incremental, recompute

    def choose(self, mode: str, rows: int, source_rows: int) -> str:
        if mode != "auto":
            return mode
        incremental, recompute = self.estimates(rows, source_rows)
        if incremental is None or recompute is None or incremental <= RECOMPUTE_MARGIN * recompute:
            return "incremental"
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:
            self._since_probe = 0
            return "incremental"
        return "recompute"

    def record(self, path: str, seconds: float, rows: int, source_rows: int) -> None:
        self.batches[path] += 1
        self.seconds[path] += seconds
        self.last = path
        if path == "incremental":
            self.incremental = _smooth(self.incremental, seconds)
            self.rows = _smooth(self.rows, float(rows))
        else:
            self.record_recompute(seconds, source_rows)

    def record_recompute(self, seconds: float, source_rows: int) -> None:
        self.recompute, self.recompute_rows = seconds, source_rows

    def describe(self, mode: str) -> str:
        """One line for EXPLAIN and status."""
        def ms(value: float | None) -> str:
            return "not measured yet" if value is None else f"{value * 1000:.1f} ms"

        counts = ", ".join(f"{n} {path}" for path, n in self.batches.items())
        head = "cost-based per batch" if mode == "auto" else f"forced {mode}"
        last = f"; last batch: {self.last}" if self.last else ""
        return (f"maintenance: {head}; estimates: incremental {ms(self.incremental)}, "
                f"recompute {ms(self.recompute)}; batches: {counts}{last}")


def source_rows(snapshot: "Snapshot", view: "ViewDef") -> int:
    return sum(snapshot[s].num_rows for s in view.sources)


def recompute(engine: "Engine", view: "ViewDef", snapshot: "Snapshot", pending: list["RowChanges"],
              replaced: dict[str, "Relation"], worker: "Worker") -> tuple[pa.Table, dict[str, "Relation"]]:
    """Recompute ``view`` over its sources' NEW contents: (its delta, its new state relations).

    ``snapshot`` holds tables at NEW and views at OLD; ``pending`` and
    ``replaced`` are this batch's changes to the views maintained before this
    one (its upstream views among them), applied here on the side.
    """
    upstream = {s for s in view.sources if s in engine.catalog.views}
    new = snapshot
    if upstream:
        new = new.with_changes(engine._commit([c for c in pending if c.relation in upstream], new, worker))
        new = new.with_changes({n: r for n, r in replaced.items() if n in upstream})
    new = new.with_changes({spec.name: engine.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
                            for spec in view.states})
    sources = frozenset(view.sources)
    program = view.program(sources, sources, initial=True)  # every source at NEW: as at CREATE
    new = engine._ensure_indexes(program, new, worker)
    inputs = {delta_input(s): new[s].table() for s in sources}
    _, changes = worker.executor.run(program, inputs, new, label=f"view {view.name} (recompute)")
    new = new.with_changes(engine._commit(changes, new, worker))
    states = {}
    for spec in view.states:  # keep the indexes the incremental programs built on the old state
        relation = new[spec.name]
        for key in snapshot[spec.name].index_keys:
            relation = relation.with_index(key, worker.coder)
        states[spec.name] = relation
    old_rows = _output(engine, view, snapshot, worker)
    new_rows = _output(engine, view, new.with_changes(states), worker)
    return _difference(view, old_rows, new_rows, worker), states


def _output(engine: "Engine", view: "ViewDef", snapshot: "Snapshot", worker: "Worker") -> pa.Table:
    """The view's rows with their multiplicity in the weight column."""
    if view.stored_output:
        return snapshot[view.name].table()
    rows = engine.reader.query(f"SELECT * FROM {quote(view.name)}", exp.Table(this=exp.to_identifier(view.name)),
                               snapshot)
    names = ", ".join(quote(c) for c in view.column_names)
    return worker.runner.run(f"SELECT {names}, COUNT(*)::BIGINT AS {WEIGHT} FROM {{rows}} GROUP BY ALL", rows=rows)


def _difference(view: "ViewDef", old: pa.Table, new: pa.Table, worker: "Worker") -> pa.Table:
    names = ", ".join(quote(c) for c in view.column_names)
    return worker.runner.run(
        f"""SELECT {names}, SUM({WEIGHT})::BIGINT AS {WEIGHT} FROM (
                SELECT {names}, -{WEIGHT} AS {WEIGHT} FROM {{old}}
                UNION ALL SELECT {names}, {WEIGHT} FROM {{new}})
            GROUP BY ALL HAVING SUM({WEIGHT}) <> 0""",
        old=old, new=new)

