"""Correlated subqueries: what a subquery reads from outside, and how its WHERE splits.

A subquery is decorrelated by moving its correlation out of it: conjuncts of
its WHERE that read only its own tables stay inside; ``inner = outer``
equalities become join keys; any other conjunct that reads an outer column
becomes a residual condition of the join. Outer columns anywhere else (the
SELECT list, JOIN ON, GROUP BY, HAVING, or a subquery nested deeper) are
rejected by name, because moving them out would change the meaning.

>>> sql = 'SELECT 1 FROM "r" AS "r" WHERE "r"."k" = "o"."k" AND "r"."v" > 2 AND "r"."w" < "o"."w"'
>>> c = split_correlation(sqlglot.parse_one(sql), {"o"})
>>> [e.sql() for e in c.inner], [(i.sql(), o.sql()) for i, o in c.pairs], [e.sql() for e in c.residual]
(['"r"."v" > 2'], [('"r"."k"', '"o"."k"')], ['"r"."w" < "o"."w"'])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp

from sql_frontend.errors import UnsupportedError


def conjuncts(predicate: exp.Expression | None) -> list[exp.Expression]:
    """The top-level AND terms of a predicate (parentheses looked through)."""
    if predicate is None:
        return []
    if isinstance(predicate, exp.Paren):
        return conjuncts(predicate.this)
    if isinstance(predicate, exp.And):
        return conjuncts(predicate.this) + conjuncts(predicate.expression)
    return [predicate]


def local_aliases(select: exp.Select) -> set[str]:
    """Aliases of the tables and derived tables in a SELECT's own FROM clause."""
    items = []
    from_ = select.args.get("from_")
    if from_ is not None:
        items.append(from_.this)
    items.extend(j.this for j in select.args.get("joins") or [])
    return {item.alias_or_name for item in items}


def _enclosing_selects(node: exp.Expression, stop: exp.Expression) -> list[exp.Select]:
    """SELECTs between ``node`` and ``stop`` (inclusive), innermost first."""
    found = []
    current = node.parent
    while current is not None:
        if isinstance(current, exp.Select):
            found.append(current)
        if current is stop:
            break
        current = current.parent
    return found


def outer_columns(query: exp.Expression) -> list[exp.Column]:
    """Columns inside ``query`` that belong to no table of a SELECT within it."""
    out = []
    for col in query.find_all(exp.Column):
        if not col.table:
            continue
        scopes = _enclosing_selects(col, query)
        if not any(col.table in local_aliases(s) for s in scopes):
            out.append(col)
    return out


def is_correlated(query: exp.Expression) -> bool:
    return bool(outer_columns(query))


def _inside(node: exp.Expression, container: exp.Expression | None, stop: exp.Expression) -> bool:
    while node is not None and node is not stop:
        if node is container:
            return True
        node = node.parent
    return False


@dataclass
class Correlation:
    inner: list[exp.Expression] = field(default_factory=list)  # read only the subquery's tables
    pairs: list[tuple[exp.Expression, exp.Expression]] = field(default_factory=list)  # inner = outer
    residual: list[exp.Expression] = field(default_factory=list)  # read outer columns otherwise


def _reads_outer(expression: exp.Expression, local: set[str]) -> bool:
    return any(c.table and c.table not in local for c in expression.find_all(exp.Column))


def _reads_local(expression: exp.Expression, local: set[str]) -> bool:
    return any(c.table in local for c in expression.find_all(exp.Column))


def split_correlation(select: exp.Select, outer: set[str], what: str = "subquery") -> Correlation:
    """Split the WHERE of a correlated ``select``; reject outer references it cannot move.

    Args:
        select: the subquery body.
        outer: aliases of the enclosing query (for messages; any non-local
            qualified column is an outer reference).
        what: how the message names the subquery.
    """
    local = local_aliases(select)
    where = select.args.get("where")
    for col in outer_columns(select):
        if _enclosing_selects(col, select)[0] is not select:
            raise UnsupportedError(
                f"a {what} whose nested subquery refers to {col.sql('duckdb')} of an outer query is not "
                "supported in a materialized view"
            )
        if not _inside(col, where, select):
            raise UnsupportedError(
                f"a {what} that refers to the outer column {col.sql('duckdb')} outside its WHERE clause "
                "is not supported in a materialized view"
            )
    result = Correlation()
    for conjunct in conjuncts(where.this if where is not None else None):
        if not _reads_outer(conjunct, local):
            result.inner.append(conjunct)
            continue
        if conjunct.find(exp.Subquery, exp.Exists) is not None:
            raise UnsupportedError(
                f"a {what} whose WHERE mixes outer columns with another subquery is not supported "
                "in a materialized view"
            )
        pair = _equality(conjunct, local)
        if pair is not None:
            result.pairs.append(pair)
        else:
            result.residual.append(conjunct)
    return result


def _equality(conjunct: exp.Expression, local: set[str]) -> tuple[exp.Expression, exp.Expression] | None:
    """(inner side, outer side) when the conjunct is ``inner = outer``."""
    if not isinstance(conjunct, exp.EQ):
        return None
    for inner, outer in ((conjunct.this, conjunct.expression), (conjunct.expression, conjunct.this)):
        if (
            _reads_local(inner, local) and not _reads_outer(inner, local)
            and _reads_outer(outer, local) and not _reads_local(outer, local)
        ):
            return inner, outer
    return None
