"""Adding a delta into a stored Z-set keyed by its whole row.

Contract: the stored relation holds each distinct row once with its
multiplicity; after the merge it holds the sum of old and delta.

Incremental rule:  R_new(r) = R_old(r) + ΔR(r), for the rows r in ΔR only.
The touched rows are found through the relation's identity index; rows whose
multiplicity reaches zero are deleted. Used for view outputs and for the
multiplicities DISTINCT keeps.

The identity index is on the whole row, unless the rows have a narrower key
(``output_key``: a view over one keyed table that keeps its primary key). The
lookup then probes by that key, which is cheap (an integer key is its own
code, where a whole row is hashed by a DuckDB statement for the probes and
for every new run), and the join below still matches whole rows, so a key
that repeats (the old and new version of an updated row) is handled alike.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from sql_frontend.plan import SPJ, Column, Node, Source
from sql_frontend.plan_sql import alias, column, quoted
from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.rule import Context
from delta_operators.zset import not_distinct
from storage.zset import POS, RUN, WEIGHT, consolidate_sql

OLD_WEIGHT = "__old"
KEEP = "__keep"


def output_state(view: str, columns: tuple[Column, ...], key: tuple[str, ...] = ()) -> StateSpec:
    """The stored rows of a view, indexed by ``key`` (``output_key``) or else by the whole row."""
    identity = key or tuple(c.name for c in columns)
    return StateSpec(name=view, columns=columns, identity=identity, indexes=(identity,), role="view rows")


def output_key(root: Node) -> tuple[str, ...]:
    """Output columns that identify a view's rows, or ():
    ``SELECT ..., k, ... FROM t WHERE ...`` over one table with primary key ``k``, kept as a plain column.

    One row of ``t`` gives at most one row of the view, so the view holds each ``k`` once.
    """
    if not isinstance(root, SPJ) or len(root.inputs) != 1:
        return ()
    alias_, source = root.inputs[0]
    if not isinstance(source, Source) or not source.key:
        return ()
    names = {}
    for name, expression in root.outputs:
        if isinstance(expression, exp.Column) and expression.table in ("", alias_):
            names.setdefault(expression.name, name)
    key = tuple(names.get(k) for k in source.key)
    return () if None in key else key


def merge(
    ctx: Context, relation: str, columns: tuple[Column, ...], delta: str, nonnegative: bool,
    extra: Callable[[exp.Expression, exp.Expression], list[exp.Expression]] | None = None,
    key: tuple[str, ...] = (),
) -> tuple[str, str]:
    """Emit the merge of ``delta`` into ``relation`` (indexed by ``key``, or else by the whole row).

    Returns (consolidated delta, merged rows): the merged temp has the row
    columns, OLD_WEIGHT (before) and WEIGHT (after), and the (aliased)
    columns ``extra(before, after)`` computes from the two weights.
    """
    names = tuple(c.name for c in columns)
    consolidated = ctx.query("cons", consolidate_sql(delta, names), drivers=(delta,), note=f"consolidate δ{relation}",
                             transparent=True)
    old = ctx.temp("old")
    index = key or names
    ctx.emit(Lookup(out=old, relation=relation, index=index, probe=consolidated, probe_columns=index,
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


def merge_output(ctx: Context, view: str, columns: tuple[Column, ...], delta: str, key: tuple[str, ...] = ()) -> str:
    """Fold the view's delta into its stored rows (``output_state``); return the consolidated delta."""
    consolidated, _ = merge(ctx, view, columns, delta, nonnegative=True, key=key)
    return consolidated
