"""Operators whose state is their output rows, indexed by a partition key: reads and delta steps.

The window and session operators (window.py, session.py) both store every
output row of their node with its weight, indexed by the columns that decide
which rows a row's values depend on (PARTITION BY; the session keys). So their
reads are the same: OLD is the stored rows, NEW adds the node's delta; a
lookup by columns that include the whole partition key is an index lookup
(without a key there is no index: the rule's own delta reads the whole state).

Their delta programs have one shape too (each rule's docstring states what
its recomputation is): the partitions δX touches, one index lookup of their
stored rows, a recomputation that retracts those rows and inserts the new
ones, the state's rows replaced by it, and the consolidated difference as the
node's delta.

Subclasses set ``node``, ``partition``, ``names``, ``steps``, ``role`` and
``whole``, and define ``state(ctx)`` and ``_recompute_sql``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from delta_operators.compiler import NEW, Context, empty_select, select_columns, union_all
from delta_operators.program import Lookup, Replace, StateSpec, scan_name
from delta_operators.sqltext import columns, parse, q
from storage.zset import consolidate_sql

KEEP = "__keep"  # column of the recomputation: True for the rows the state keeps
ALL = "__all"  # probe column when the whole input is one partition


@dataclass(frozen=True)
class Steps:
    """How one operator names the steps of its delta program (in programs and EXPLAIN)."""

    touched: str
    touched_note: str
    old: str
    old_note: str
    recompute: str
    recompute_note: str
    delta: str
    delta_note: str


class PartitionedRowsReads:
    node: object
    partition: tuple[str, ...]
    names: tuple[str, ...]  # the node's output columns
    steps: Steps
    role: str  # what the state holds (EXPLAIN) ...
    whole: str  # ... and what is added when there is no partition key
    what = "rows"  # how lookups name the rows in programs and EXPLAIN

    def state(self, ctx: Context) -> str:
        raise NotImplementedError

    def _recompute_sql(self, delta_in: str, touched: str, old: str) -> exp.Expression:
        """The stored rows ``old`` of the touched partitions, retracted (KEEP false), and their recomputation."""
        raise NotImplementedError

    def states(self, ctx: Context) -> list[StateSpec]:
        role = self.role + ("" if self.partition else self.whole)
        return [StateSpec(name=self.state(ctx), columns=self.node.columns, identity=(),
                          indexes=(self.partition,) if self.partition else (), role=role)]

    # --- delta ------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        delta_in = ctx.delta(self.node.input)
        if delta_in is None:
            return None
        steps = self.steps
        if self.partition:
            touched_sql = parse(f"SELECT DISTINCT {columns(self.partition, 'd', as_names=True)} FROM {q(delta_in)} AS d")
        else:
            touched_sql = parse(f"SELECT TRUE AS {q(ALL)} FROM {q(delta_in)} LIMIT 1")
        touched = ctx.query(steps.touched, touched_sql, drivers=(delta_in,), note=steps.touched_note,
                            transparent=bool(self.partition))
        old = ctx.temp(steps.old)
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=self.partition, probe=touched,
                        probe_columns=self.partition or (ALL,), positions=True, note=steps.old_note))
        wide = ctx.query(steps.recompute, self._recompute_sql(delta_in, touched, old), drivers=(delta_in,),
                         note=steps.recompute_note)
        ctx.replace(Replace(relation=self.state(ctx), deletes=wide, inserts=wide, keep=KEEP))
        return ctx.query(steps.delta, consolidate_sql(wide, self.names), drivers=(wide,), note=steps.delta_note)

    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        if ctx.options.initial:
            old: exp.Expression = empty_select(self.node.columns)
        else:
            ctx.scan_relation(self.state(ctx))
            old = select_columns(scan_name(self.state(ctx)), self.node.columns)
        delta = ctx.delta(self.node)
        if mode == NEW and delta is not None:
            return union_all([old, select_columns(delta, self.node.columns)])
        return old

    def can_lookup(self, columns_: tuple[str, ...]) -> bool:
        return bool(self.partition) and set(self.partition) <= set(columns_)

    def old_is_empty(self, ctx: Context) -> bool:
        return ctx.options.initial

    def lookup(self, ctx, columns_, probe, probe_columns, mode):  # noqa: ANN001
        by = dict(zip(columns_, probe_columns))
        found = ctx.temp("look")
        ctx.emit(Lookup(out=found, relation=self.state(ctx), index=self.partition, probe=probe,
                        probe_columns=tuple(by[c] for c in self.partition),
                        note=f"{self.what} by partition ({', '.join(self.partition)})"))
        parts: list[exp.Expression] = [select_columns(found, self.node.columns)]
        delta = ctx.delta(self.node)
        if mode == NEW and delta is not None:
            parts.append(select_columns(delta, self.node.columns))
        return ctx.query("look", union_all(parts), drivers=(), note=self.what)
