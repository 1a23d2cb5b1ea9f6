"""UNION ALL.

Contract: the bag union of inputs that line up by position.

Incremental rule:  δ(X1 ⊎ … ⊎ Xn) = δX1 ⊎ … ⊎ δXn  (linear, no state).
Each branch is cast to the node's column types, so a branch missing from a
step (unchanged) cannot change the result's types.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import UnionAll
from sql_frontend.plan_sql import alias, column, quoted, subquery
from delta_operators.program import StateSpec
from delta_operators.rule import Context, Rule, rule_for
from delta_operators.sqltree import cast, union_all
from storage.zset import WEIGHT


@rule_for(UnionAll)
class UnionAllRule(Rule):
    """δ(X1 ⊎ … ⊎ Xn) = δX1 ⊎ … ⊎ δXn."""

    def __init__(self, node: UnionAll):
        self.node = node

    def _aligned(self, child_columns: tuple[str, ...], source: exp.Expression) -> exp.Select:
        """SELECT a branch's columns under this node's names and types."""
        return exp.select(
            *[
                alias(cast(column(src, "b"), c.type), c.name)
                for src, c in zip(child_columns, self.node.columns)
            ],
            alias(column(WEIGHT, "b"), WEIGHT),
        ).from_(source)

    def delta(self, ctx: Context) -> str | None:
        parts, drivers = [], []
        for child in self.node.inputs:
            d = ctx.delta(child)
            if d is None:
                continue
            drivers.append(d)
            source = exp.Table(this=quoted(d), alias=exp.TableAlias(this=quoted("b")))
            parts.append(self._aligned(child.column_names, source))
        if not parts:
            return None
        return ctx.query("union", union_all(parts), drivers=tuple(drivers), note="union of branch deltas", skip="all")

    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        return union_all(
            [
                self._aligned(child.column_names, subquery(ctx.rule(child).scan(ctx, mode), "b"))
                for child in self.node.inputs
            ]
        )

    def _branch_columns(self, child, columns: tuple[str, ...]) -> tuple[str, ...]:  # noqa: ANN001
        """The names ``columns`` have in a branch (branches line up by position)."""
        position = {c: i for i, c in enumerate(self.node.column_names)}
        return tuple(child.column_names[position[c]] for c in columns)

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """When every branch can be looked up by the same columns."""
        return bool(columns) and all(
            ctx.rule(child).can_lookup(ctx, self._branch_columns(child, columns)) for child in self.node.inputs
        )

    def lookup(self, ctx, columns, probe, probe_columns, mode):  # noqa: ANN001
        """Each branch's rows by the same columns, lined up as in the union."""
        parts, found = [], []
        for child in self.node.inputs:
            rows = ctx.rule(child).lookup(ctx, self._branch_columns(child, columns), probe, probe_columns, mode)
            if rows is None:
                return None
            found.append(rows)
            source = exp.Table(this=quoted(rows), alias=exp.TableAlias(this=quoted("b")))
            parts.append(self._aligned(child.column_names, source))
        return ctx.query("look", union_all(parts), drivers=tuple(found), note="union rows", skip="all")

    def old_is_empty(self, ctx: Context) -> bool:
        return all(ctx.rule(child).old_is_empty(ctx) for child in self.node.inputs)

    def states(self, ctx: Context) -> list[StateSpec]:
        return []
