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

Subclasses set ``node``, ``partition``, ``names``, ``steps``, ``role``,
``whole`` and the names of looked-up rows (``looked_up``, ``rows_note``),
and define ``state(ctx)`` and ``_recompute_sql``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

from sqlglot import exp

from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.rule import Context
from delta_operators.sqltext import columns, parse, q
from delta_operators.state_reads import StateRule
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


class PartitionedRowsReads(StateRule):
    """δ(op X) = op(rows(T) + δX) − rows(T), T = the stored rows of the partitions δX touches."""

    partition: tuple[str, ...]
    names: tuple[str, ...]  # the node's output columns
    steps: Steps
    role: str  # what the state holds (EXPLAIN) ...
    whole: str  # ... and what is added when there is no partition key
    index_on_demand = False  # the state declares its partition index

    @abstractmethod
    def _recompute_sql(self, delta_in: str, touched: str, old: str) -> exp.Expression:
        """The stored rows ``old`` of the touched partitions, retracted (KEEP false), and their recomputation."""

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

    # --- reads: OLD = the stored rows (state_reads.py), by the partition index ----
    def can_lookup(self, ctx: Context, columns_: tuple[str, ...]) -> bool:
        """By columns that include the whole partition key (the state's index)."""
        return bool(self.partition) and set(self.partition) <= set(columns_)

    def lookup_index(
        self, columns_: tuple[str, ...], probe_columns: tuple[str, ...]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The partition key's index, probed by the probe columns that match it."""
        by = dict(zip(columns_, probe_columns))
        return self.partition, tuple(by[c] for c in self.partition)

    def lookup_note(self, index: tuple[str, ...]) -> str:
        return f"{self.looked_up} by partition ({', '.join(index)})"
