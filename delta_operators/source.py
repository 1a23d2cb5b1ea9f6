"""Sources: the stored relations a view reads (base tables, upstream views).

Contract: the delta of a source is the change batch the engine supplies for
it; its state is the stored relation.

Incremental rule:  δ(R) = ΔR (given);  R_new = R_old + ΔR.
The stored relation holds R_new for base tables (ingest applied the batch)
and R_old for upstream views (they are replaced at the end of the step), so
reading the other version adds or subtracts ΔR, which is small.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Source
from delta_operators.program import Lookup, StateSpec, scan_name
from delta_operators.rule import NEW, OLD, Context, Rule, delta_input, rule_for
from delta_operators.sqltree import empty_select, negate_weight, select_columns, union_all


@rule_for(Source)
class SourceRule(Rule):
    """δR = ΔR (given);  R_new = R_old + ΔR."""

    def delta(self, ctx: Context) -> str | None:
        return delta_input(self.node.relation) if ctx.changed(self.node.relation) else None

    def _correction(self, ctx: Context, mode: str) -> exp.Expression | None:
        """What to add to the stored version to get ``mode`` (None if nothing)."""
        relation = self.node.relation
        if not ctx.changed(relation):
            return None
        stored_new = relation in ctx.options.stored_new
        delta = delta_input(relation)
        if mode == NEW and not stored_new:
            return select_columns(delta, self.node.columns)
        if mode == OLD and stored_new:
            return negate_weight(delta, self.node.columns)
        return None

    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        if ctx.options.initial and ctx.changed(self.node.relation):
            if mode == OLD:
                return empty_select(self.node.columns)
            return select_columns(delta_input(self.node.relation), self.node.columns)
        ctx.scan_relation(self.node.relation)
        stored = select_columns(scan_name(self.node.relation), self.node.columns)
        correction = self._correction(ctx, mode)
        return stored if correction is None else union_all([stored, correction])

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        return bool(columns)  # any columns of a stored relation can be indexed

    def unique(self, columns: tuple[str, ...]) -> bool:
        return bool(self.node.key) and set(self.node.key) <= set(columns)

    def old_is_empty(self, ctx: Context) -> bool:
        return ctx.options.initial and ctx.changed(self.node.relation)

    def lookup(
        self, ctx: Context, columns: tuple[str, ...], probe: str, probe_columns: tuple[str, ...], mode: str
    ) -> str | None:
        relation = self.node.relation
        if ctx.options.initial and ctx.changed(relation):
            # Every row is new: the "lookup" is the whole delta (a superset is fine,
            # the join re-checks its condition).
            if mode == OLD:
                return ctx.query("empty", empty_select(self.node.columns), drivers=(), note="empty")
            return delta_input(relation)
        out = ctx.temp("look")
        ctx.emit(Lookup(out=out, relation=relation, index=columns, probe=probe, probe_columns=probe_columns,
                        note=f"lookup {relation} by ({', '.join(columns)})"))
        ctx.need_index(relation, columns)
        correction = self._correction(ctx, mode)
        if correction is None:
            return out
        both = union_all([select_columns(out, self.node.columns), correction])
        return ctx.query("look", both, drivers=(), note=f"{mode} {relation} rows")

    def can_read_range(self, ctx: Context, column: str) -> bool:
        """Any column, but not on a first computation, where the stored relation is not what the term reads."""
        return not ctx.options.initial

    def between(self, ctx: Context, column: str, probe: str, value: str, mode: str) -> str | None:
        """The rows (in ``mode``) whose ``column`` lies within the range of ``probe``'s ``value``, maybe more."""
        relation = self.node.relation
        if ctx.options.initial:
            return None
        out = ctx.temp("range")
        ctx.emit(Lookup(out=out, relation=relation, index=(), probe=probe, probe_columns=(value,), between=column,
                        note=f"rows of {relation} whose {column} lies within the range of {probe}.{value}"))
        correction = self._correction(ctx, mode)
        if correction is None:
            return out
        both = union_all([select_columns(out, self.node.columns), correction])
        return ctx.query("range", both, drivers=(), note=f"{mode} {relation} rows")

    def states(self, ctx: Context) -> list[StateSpec]:
        return []
