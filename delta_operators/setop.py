"""EXCEPT and INTERSECT, with and without ALL.

Contract: rows are compared as GROUP BY compares them (NULL equals NULL). A
row held l times by the left input and r times by the right is held

    EXCEPT ALL  max(l − r, 0)        INTERSECT ALL  min(l, r)
    EXCEPT      [l > 0 ∧ r = 0]      INTERSECT      [l > 0 ∧ r > 0]

times by the output, g(l, r).

Incremental rule: keep both multiplicities of every distinct row,
S(v) = (l(v), r(v)), with the output multiplicity g(l, r) in the weight
column. For each row v that δL or δR touches:

    S_new(v) = S_old(v) + (δL(v), δR(v))      δOut(v) = g(S_new(v)) − g(S_old(v))

Only the touched rows are read, through S's identity index; S also holds the
output, so scans and lookups of the node read it directly.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Column, SetOp
from sql_frontend.plan_sql import alias, column, lit, subquery, table
from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.rule import Context, rule_for
from delta_operators.sqltree import cast, select_columns, union_all
from delta_operators.state_reads import StateRule
from delta_operators.zset import not_distinct
from storage.zset import POS, RUN, WEIGHT

LEFT_COUNT = "__left"
RIGHT_COUNT = "__right"
OLD_OUT = "__old"
KEEP = "__keep"


@rule_for(SetOp)
class SetOpRule(StateRule):
    """S_new(v) = S_old(v) + (δL(v), δR(v)),  δ(L op R)(v) = g(S_new(v)) − g(S_old(v)), for touched rows v."""

    looked_up, rows_note = "rows", "set operation rows"
    empty_at_first = False  # scans read the (empty) state on a first computation too

    def __init__(self, node: SetOp):
        self.node = node
        self.names = node.column_names

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "setop")

    def states(self, ctx: Context) -> list[StateSpec]:
        what = f"{self.node.kind.upper()}{' ALL' if self.node.all else ''}"
        return [StateSpec(
            name=self.state(ctx),
            columns=self.node.columns + (Column(LEFT_COUNT, "BIGINT"), Column(RIGHT_COUNT, "BIGINT")),
            identity=self.names, indexes=(self.names,),
            role=f"each distinct row's count on the left and on the right ({what} output in the weight)",
        )]

    def output(self, left: exp.Expression, right: exp.Expression) -> exp.Expression:
        """g(l, r): the output multiplicity of a row held l times left and r times right."""
        kind, all_ = self.node.kind, self.node.all
        if all_ and kind == "except":
            return exp.Anonymous(this="GREATEST", expressions=[exp.Sub(this=left, expression=right), lit(0)])
        if all_:
            return exp.Anonymous(this="LEAST", expressions=[left, right])
        right_test = exp.EQ if kind == "except" else exp.GT
        present = exp.and_(exp.GT(this=left, expression=lit(0)), right_test(this=right, expression=lit(0)))
        return exp.Case(ifs=[exp.If(this=present, true=lit(1))], default=lit(0))

    # --- delta ------------------------------------------------------------------
    def _side(self, child, delta: str, is_left: bool) -> exp.Select:  # noqa: ANN001
        """A side's delta under the node's names and types, its weight as that side's count."""
        w = column(WEIGHT, "s")
        return exp.select(
            *[alias(cast(column(src, "s"), c.type), c.name) for src, c in zip(child.column_names, self.node.columns)],
            alias(w if is_left else lit(0), LEFT_COUNT),
            alias(lit(0) if is_left else w.copy(), RIGHT_COUNT),
        ).from_(table(delta, "s"))

    def delta(self, ctx: Context) -> str | None:
        sides = [(self.node.left, ctx.delta(self.node.left), True), (self.node.right, ctx.delta(self.node.right), False)]
        parts = [self._side(child, d, is_left) for child, d, is_left in sides if d is not None]
        if not parts:
            return None
        drivers = tuple(d for _, d, _ in sides if d is not None)
        cols = [column(n, "u") for n in self.names]
        sums = [exp.Sum(this=column(LEFT_COUNT, "u")), exp.Sum(this=column(RIGHT_COUNT, "u"))]
        changes_sql = (
            exp.select(*[alias(c, c.name) for c in cols], alias(sums[0], LEFT_COUNT), alias(sums[1], RIGHT_COUNT))
            .from_(subquery(union_all(parts), "u"))
            .group_by(*[c.copy() for c in cols])
            .having(exp.or_(*[exp.NEQ(this=s.copy(), expression=lit(0)) for s in sums]))
        )
        changes = ctx.query("setd", changes_sql, drivers=drivers, skip="all", transparent=True,
                            note="change of each row's left and right counts")
        old = ctx.temp("setold")
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=self.names, probe=changes,
                        probe_columns=self.names, positions=True, note="stored counts of touched rows"))
        l_old, r_old = (exp.Coalesce(this=column(c, "o"), expressions=[lit(0)]) for c in (LEFT_COUNT, RIGHT_COUNT))
        l_new = exp.Add(this=l_old.copy(), expression=column(LEFT_COUNT, "c"))
        r_new = exp.Add(this=r_old.copy(), expression=column(RIGHT_COUNT, "c"))
        merged_sql = (
            exp.select(
                *[alias(column(n, "c"), n) for n in self.names],
                alias(l_new, LEFT_COUNT), alias(r_new, RIGHT_COUNT),
                alias(self.output(l_new.copy(), r_new.copy()), WEIGHT),
                alias(exp.Coalesce(this=column(WEIGHT, "o"), expressions=[lit(0)]), OLD_OUT),
                alias(exp.or_(exp.NEQ(this=l_new.copy(), expression=lit(0)),
                              exp.NEQ(this=r_new.copy(), expression=lit(0))), KEEP),
                alias(column(RUN, "o"), RUN), alias(column(POS, "o"), POS),
            )
            .from_(table(changes, "c"))
            .join(table(old, "o"), on=not_distinct("c", "o", self.names), join_type="left")
        )
        merged = ctx.query("setnew", merged_sql, drivers=(changes,), note="new counts and output multiplicity")
        ctx.replace(Replace(relation=self.state(ctx), deletes=merged, inserts=merged, keep=KEEP, nonnegative=True))
        change = exp.Sub(this=column(WEIGHT, "m"), expression=column(OLD_OUT, "m"))
        out_sql = (
            exp.select(*[alias(column(n, "m"), n) for n in self.names], alias(change, WEIGHT))
            .from_(table(merged, "m"))
            .where(exp.NEQ(this=change.copy(), expression=lit(0)))
        )
        return ctx.query("setop", out_sql, drivers=(merged,), note="rows whose output multiplicity changed")

    # --- reads: OLD = the stored rows with output multiplicity > 0 (state_reads.py) ---
    def rows(self, ctx: Context, source: str) -> exp.Select:
        return select_columns(source, self.node.columns).where(
            exp.GT(this=column(WEIGHT, source), expression=lit(0))
        )
