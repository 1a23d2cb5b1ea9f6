"""Scalar subqueries as joins with aggregates.

A scalar subquery must compute aggregates without GROUP BY, so it returns
exactly one row per evaluation (anything else could return several rows,
an error the view could not maintain). Then:

* uncorrelated, ``(SELECT agg(x) FROM S)`` is a one-row relation; the query
  joins it (a cross join with one row) and reads its column;
* correlated by equalities, ``(SELECT f(agg(x)) FROM S WHERE S.k = o.k AND p)``
  becomes ``(SELECT k, agg(x) FROM S WHERE p GROUP BY k) AS g`` joined on
  ``g.k = o.k``, and the subquery's value is ``f(g.agg)`` evaluated in the
  query: where no group matches, aggregates are over no rows, so COUNT is 0
  (``COALESCE(g.count, 0)``) and every other aggregate NULL, exactly what the
  subquery returns for an empty input. The join is a LEFT JOIN, or an inner
  join when the WHERE clause rejects the NULLs of a missing group anyway.

This module replaces the subqueries in an expression and reports the joins
to make; the builder makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from sqlglot import exp

from sql_frontend.correlation import is_correlated, split_correlation
from sql_frontend.errors import UnsupportedError
from sql_frontend.plan import Node
from sql_frontend.plan_sql import column

if TYPE_CHECKING:
    from sql_frontend.building import Building


@dataclass
class Hoisted:
    """A subquery planned as a node the query joins as ``alias``."""

    alias: str
    node: Node
    pairs: list[tuple[exp.Expression, str]] = field(default_factory=list)  # (outer expression, node column)


def _is_scalar(sub: exp.Subquery) -> bool:
    parent = sub.parent
    if isinstance(parent, (exp.From, exp.Join, exp.Exists, exp.SetOperation)):
        return False
    return not (isinstance(parent, exp.In) and parent.args.get("query") is sub)


def scalar_subqueries(expression: exp.Expression, within: Callable[[exp.Subquery], bool] = lambda s: True) -> list:
    """The outermost scalar subqueries of ``expression`` that ``within`` accepts."""
    found = []
    for sub in expression.find_all(exp.Subquery):
        if not _is_scalar(sub) or not within(sub):
            continue
        ancestor = sub.parent
        nested = False
        while ancestor is not None and ancestor is not expression:
            if isinstance(ancestor, (exp.Subquery, exp.Exists)):
                nested = True
                break
            ancestor = ancestor.parent
        if not nested:
            found.append(sub)
    return found


def inside_aggregate(sub: exp.Subquery) -> bool:
    return sub.find_ancestor(exp.AggFunc) is not None


def hoist(
    b: "Building",
    expression: exp.Expression,
    outer: set[str],
    hoisted: list[Hoisted],
    within: Callable[[exp.Subquery], bool] = lambda s: True,
    correlated: bool = True,
) -> exp.Expression:
    """A copy of ``expression`` reading each scalar subquery from a joined node (added to ``hoisted``)."""
    expression = expression.copy()
    for sub in scalar_subqueries(expression, within):
        select = _aggregate_select(sub.this)
        alias = b.fresh("__sq")
        if not is_correlated(select):
            node = b.typed(b.query(select))
            expression = _replace(expression, sub, column(node.columns[0].name, alias))
            hoisted.append(Hoisted(alias, node))
            continue
        if not correlated:
            raise UnsupportedError(
                "a correlated scalar subquery in HAVING or in the SELECT list of a GROUP BY query is not "
                "supported in a materialized view"
            )
        replacement, node, pairs = _grouped(b, select, outer, alias)
        expression = _replace(expression, sub, replacement)
        hoisted.append(Hoisted(alias, node, pairs))
    return expression


def _replace(expression: exp.Expression, old: exp.Expression, new: exp.Expression) -> exp.Expression:
    if old is expression:
        return new
    old.replace(new)
    return expression


def _aggregate_select(query: exp.Expression) -> exp.Select:
    ok = (
        isinstance(query, exp.Select)
        and len(query.expressions) == 1
        and not query.args.get("group")
        and not query.args.get("having")
        and query.expressions[0].find(exp.AggFunc) is not None
    )
    if not ok:
        raise UnsupportedError(
            "a scalar subquery must compute one aggregate value without GROUP BY or HAVING (otherwise it "
            "could return several rows); this one is not supported in a materialized view"
        )
    return query


def _grouped(b: "Building", select: exp.Select, outer: set[str], alias: str):  # noqa: ANN202
    """(the subquery's value over the grouped node, the node, join pairs)."""
    corr = split_correlation(select, outer, "scalar subquery")
    if corr.residual:
        raise UnsupportedError(
            "a scalar subquery correlated by a condition other than equality is not supported in a "
            f"materialized view: {corr.residual[0].sql('duckdb')}"
        )
    value = select.expressions[0].unalias().copy()
    calls = []
    for call in list(value.find_all(exp.AggFunc)):
        holder = call.parent if isinstance(call.parent, exp.Filter) else call
        if holder in calls:
            continue
        calls.append(holder)
    body = select.copy()
    keys = [(f"__ck{i}", inner) for i, (inner, _) in enumerate(corr.pairs)]
    body.set(
        "expressions",
        [exp.alias_(e.copy(), name, quoted=True) for name, e in keys]
        + [exp.alias_(c.copy(), f"__a{j}", quoted=True) for j, c in enumerate(calls)],
    )
    body.set("where", exp.Where(this=exp.and_(*corr.inner)) if corr.inner else None)
    if keys:
        body.set("group", exp.Group(expressions=[inner.copy() for _, inner in keys]))
    node = b.typed(b.query(body))
    for j, call in enumerate(calls):
        ref: exp.Expression = column(f"__a{j}", alias)
        counted = call.this if isinstance(call, exp.Filter) else call
        if isinstance(counted, exp.Count):
            ref = exp.Coalesce(this=ref, expressions=[exp.Literal.number(0)])  # COUNT over no rows
        if call is value:
            value = ref
        else:
            call.replace(ref)
    pairs = [(outer_expr, name) for (name, _), (_, outer_expr) in zip(keys, corr.pairs)]
    return value, node, pairs
