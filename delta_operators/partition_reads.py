"""Reads of an operator whose state is its output rows, indexed by a partition key.

The window and session operators (window.py, session.py) both store every
output row of their node with its weight, indexed by the columns that decide
which rows a row's values depend on (PARTITION BY; the session keys). So their
reads are the same: OLD is the stored rows, NEW adds the node's delta; a
lookup by columns that include the whole partition key is an index lookup
(without a key there is no index: the rule's own delta reads the whole state).

Subclasses set ``node`` and ``partition`` and define ``state(ctx)``.
"""

from __future__ import annotations

from sqlglot import exp

from delta_operators.compiler import NEW, Context, empty_select, select_columns, union_all
from delta_operators.program import Lookup, scan_name


class PartitionedRowsReads:
    node: object
    partition: tuple[str, ...]
    what = "rows"  # how lookups name the rows in programs and EXPLAIN

    def state(self, ctx: Context) -> str:
        raise NotImplementedError

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
