"""Adding a delta into a stored Z-set keyed by its whole row.

Contract: the stored relation holds each distinct row once with its
multiplicity; after the merge it holds the sum of old and delta.

Incremental rule:  R_new(r) = R_old(r) + ΔR(r), for the rows r in ΔR only.
The touched rows are found through the relation's identity index; rows whose
multiplicity reaches zero are deleted. Used for view outputs and for the
multiplicities DISTINCT keeps.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from sql_frontend.plan import Column
from sql_frontend.plan_sql import alias, column, quoted
from delta_operators.compiler import Context
from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.zset import POS, RUN, WEIGHT, consolidate_sql, not_distinct

OLD_WEIGHT = "__old"
KEEP = "__keep"


def output_state(view: str, columns: tuple[Column, ...]) -> StateSpec:
    names = tuple(c.name for c in columns)
    return StateSpec(name=view, columns=columns, identity=names, indexes=(names,), role="view rows")


def merge(
    ctx: Context, relation: str, columns: tuple[Column, ...], delta: str, nonnegative: bool,
    extra: Callable[[exp.Expression, exp.Expression], list[exp.Expression]] | None = None,
) -> tuple[str, str]:
    """Emit the merge of ``delta`` into ``relation``.

    Returns (consolidated delta, merged rows): the merged temp has the row
    columns, OLD_WEIGHT (before) and WEIGHT (after), and the (aliased)
    columns ``extra(before, after)`` computes from the two weights.
    """
    names = tuple(c.name for c in columns)
    consolidated = ctx.query("cons", consolidate_sql(delta, names), drivers=(delta,), note=f"consolidate δ{relation}",
                             transparent=True)
    old = ctx.temp("old")
    ctx.emit(Lookup(out=old, relation=relation, index=names, probe=consolidated, probe_columns=names,
                    positions=True, note=f"stored rows of {relation}"))
    before = exp.Coalesce(this=column(WEIGHT, "o"), expressions=[exp.Literal.number(0)])
    after = exp.Add(this=before.copy(), expression=column(WEIGHT, "d"))
    sql = (
        exp.select(
            *[alias(column(n, "d"), n) for n in names],
            alias(before, OLD_WEIGHT),
            alias(after, WEIGHT),
            alias(exp.GT(this=after.copy(), expression=exp.Literal.number(0)), KEEP),
            alias(column(RUN, "o"), RUN),
            alias(column(POS, "o"), POS),
            *(extra(before.copy(), after.copy()) if extra else []),
        )
        .from_(exp.Table(this=quoted(consolidated), alias=exp.TableAlias(this=quoted("d"))))
        .join(
            exp.Table(this=quoted(old), alias=exp.TableAlias(this=quoted("o"))),
            on=not_distinct("d", "o", names),
            join_type="left",
        )
    )
    merged = ctx.query("merged", sql, drivers=(consolidated,), note=f"new multiplicities in {relation}")
    # Delete exactly the stored rows the join matched (a lookup may return more).
    ctx.replace(Replace(relation=relation, deletes=merged, inserts=merged, keep=KEEP, nonnegative=nonnegative))
    return consolidated, merged


def merge_output(ctx: Context, view: str, columns: tuple[Column, ...], delta: str) -> str:
    """Fold the view's delta into its stored rows; return the consolidated delta."""
    consolidated, _ = merge(ctx, view, columns, delta, nonnegative=True)
    return consolidated
