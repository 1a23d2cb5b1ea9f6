"""Reading a node whose rows are kept in its own state: OLD is the stored rows, NEW adds the node's delta.

Contract: ``scan`` and ``lookup`` return the node's rows in the mode asked
for, read from the one relation its rule keeps (``state(ctx)``), not from
its inputs.

Incremental rule (of the reads, not of the node):

    OLD = rows(S)        NEW = rows(S) + δ(node)

where S is the stored state, which holds OLD until the program's Replace
steps run, and ``rows`` turns stored rows into the node's rows (an
aggregate finalizes its sums, DISTINCT keeps the present rows). A lookup is
the same over the state's rows matching a probe (one index lookup); on a
first computation OLD is empty without reading anything.

Aggregates, DISTINCT, set operations, semi-joins by rows, top-K, windows,
sessions and the recursive CTE all read so; each is this one read with
parameters (as differential dataflow builds ``distinct`` on ``threshold``):
how to read rows from a stored or looked-up relation, by which index a
lookup goes, and what the steps are called.
"""

from __future__ import annotations

from abc import abstractmethod

from sqlglot import exp

from delta_operators.program import Lookup, scan_name
from delta_operators.rule import NEW, Context, Rule
from delta_operators.sqltree import empty_select, select_columns, union_all


class StateRule(Rule):
    """A rule whose node's rows are read from its state: OLD = rows(S), NEW = rows(S) + δ(node)."""

    looked_up = "rows"  # what a lookup's Lookup step calls the rows, in programs and EXPLAIN ...
    rows_note = "rows"  # ... and its query step
    empty_at_first = True  # a first computation reads OLD as empty, without the state
    adds_delta = True  # NEW adds the node's delta (False: the node reads OLD in both modes)
    index_on_demand = True  # a lookup asks for an index by its columns (False: the state declares it)

    @abstractmethod
    def state(self, ctx: Context) -> str:
        """The name of the relation holding the node's state."""

    def rows(self, ctx: Context, source: str) -> exp.Expression:
        """The node's rows (with weights) from ``source``: the state, or rows of it looked up."""
        return select_columns(source, self.node.columns)

    def lookup_index(
        self, columns: tuple[str, ...], probe_columns: tuple[str, ...]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(index, probe columns) of the state lookup that finds the rows matching ``columns``."""
        return columns, probe_columns

    def lookup_note(self, index: tuple[str, ...]) -> str:
        return f"{self.looked_up} by ({', '.join(index)})"

    def with_delta(self, ctx: Context, old: exp.Expression, mode: str) -> exp.Expression:
        """``old`` in NEW mode: plus the node's delta, when it has one."""
        if not self.adds_delta:
            return old
        delta = ctx.delta(self.node)
        if mode == NEW and delta is not None:
            return union_all([old, select_columns(delta, self.node.columns)])
        return old

    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        if self.empty_at_first and ctx.options.initial:
            old: exp.Expression = empty_select(self.node.columns)
        else:
            ctx.scan_relation(self.state(ctx))
            old = self.rows(ctx, scan_name(self.state(ctx)))
        return self.with_delta(ctx, old, mode)

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """Any columns: the state is indexed by them on demand."""
        return bool(columns)

    def lookup(self, ctx, columns, probe, probe_columns, mode):  # noqa: ANN001
        index, by = self.lookup_index(columns, probe_columns)
        found = ctx.temp("look")
        ctx.emit(Lookup(out=found, relation=self.state(ctx), index=index, probe=probe, probe_columns=by,
                        note=self.lookup_note(index)))
        if self.index_on_demand:
            ctx.need_index(self.state(ctx), index)
        return ctx.query("look", self.with_delta(ctx, self.rows(ctx, found), mode), drivers=(), note=self.rows_note)

    def old_is_empty(self, ctx: Context) -> bool:
        """On a first computation: the state is empty before it."""
        return ctx.options.initial
