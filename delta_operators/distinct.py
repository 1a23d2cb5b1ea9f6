"""DISTINCT (and UNION, which is DISTINCT over UNION ALL).

Contract: every row with a positive multiplicity in the input appears once.

Incremental rule: keep the input's multiplicities M (an integral). For each
row r touched by δX:

    δ(distinct X)(r) = [M(r) + δX(r) > 0] - [M(r) > 0]

so a row appears when its first copy arrives and disappears with its last.
Only touched rows are read (through M's identity index).
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Distinct
from sql_frontend.plan_sql import alias, column, quoted
from delta_operators.merge import OLD_WEIGHT, merge
from delta_operators.program import StateSpec
from delta_operators.rule import Context, rule_for
from delta_operators.sqltree import select_columns
from delta_operators.state_reads import StateRule
from storage.zset import WEIGHT


def presence(weight: exp.Expression) -> exp.Expression:
    return exp.Case(
        ifs=[exp.If(this=exp.GT(this=weight, expression=exp.Literal.number(0)), true=exp.Literal.number(1))],
        default=exp.Literal.number(0),
    )


@rule_for(Distinct)
class DistinctRule(StateRule):
    """δ(distinct X)(r) = [M(r) + δX(r) > 0] − [M(r) > 0], for the rows r that δX touches."""

    looked_up, rows_note = "distinct rows", "distinct rows"

    def __init__(self, node: Distinct):
        self.node = node
        self.names = tuple(c.name for c in node.columns)

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "distinct")

    def states(self, ctx: Context) -> list[StateSpec]:
        return [StateSpec(name=self.state(ctx), columns=self.node.columns, identity=self.names,
                          indexes=(self.names,), role="multiplicity of each input row")]

    def delta(self, ctx: Context) -> str | None:
        delta_in = ctx.delta(self.node.input)
        if delta_in is None:
            return None
        _, merged = merge(ctx, self.state(ctx), self.node.columns, delta_in, nonnegative=True)
        change = exp.Sub(this=presence(column(WEIGHT, "m")), expression=presence(column(OLD_WEIGHT, "m")))
        sql = (
            exp.select(*[alias(column(n, "m"), n) for n in self.names], alias(change, WEIGHT))
            .from_(exp.Table(this=quoted(merged), alias=exp.TableAlias(this=quoted("m"))))
            .where(exp.NEQ(this=change.copy(), expression=exp.Literal.number(0)))
        )
        return ctx.query("distinct", sql, drivers=(merged,), note="rows whose presence changed")

    def rows(self, ctx: Context, source: str) -> exp.Select:
        """The present rows (positive multiplicity), once each."""
        return select_columns(source, self.node.columns, exp.Literal.number(1)).where(
            exp.GT(this=column(WEIGHT, source), expression=exp.Literal.number(0))
        )
