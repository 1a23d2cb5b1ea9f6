"""Which output columns of a plan node can never be NULL.

NOT IN has to plan for NULLs on both sides (``predicates._not_in``): one anti
join against the subquery's NULLs, another for the rows whose value is NULL.
Both read whole relations when they change, whatever the key. When the
catalog proves a side never NULL (a NOT NULL or PRIMARY KEY column, carried
through projections, casts, filters, grouping keys and the left side of semi
joins), that part is provably empty and is not planned, so NOT IN over key
columns is one keyed anti join.

The analysis is conservative: it answers True only where every row of the
node has a non-NULL value, for every state of the stored relations.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.correlation import conjuncts
from sql_frontend.nulls import COMPARISONS
from sql_frontend.plan import SPJ, Aggregate, Distinct, Node, SemiJoin, Source, UnionAll


def never_null(node: Node, name: str) -> bool:
    """True if column ``name`` of ``node`` is never NULL."""
    if isinstance(node, Source):
        return name in node.not_null
    if isinstance(node, SPJ):
        return _spj(node, name)
    if isinstance(node, SemiJoin):
        return never_null(node.left, name)  # a semi or anti join keeps left rows as they are
    if isinstance(node, Distinct):
        return never_null(node.input, name)
    if isinstance(node, UnionAll):
        position = node.column_names.index(name)
        return all(never_null(i, i.column_names[position]) for i in node.inputs)
    if isinstance(node, Aggregate):
        if name in node.keys:
            return never_null(node.input, name)
        return any(a.name == name and a.func in ("count", "count_star") for a in node.aggregates)
    return False


def _spj(node: SPJ, name: str) -> bool:
    expression = dict(node.outputs)[name]
    while isinstance(expression, (exp.Cast, exp.Paren)):  # a cast of a non-NULL value is not NULL
        expression = expression.this
    if not isinstance(expression, exp.Column):
        return False
    if expression.table in dict(node.inputs) and never_null(node.input(expression.table), expression.name):
        return True
    return node.predicate is not None and any(_rejects_null(c, expression) for c in conjuncts(node.predicate))


def _rejects_null(conjunct: exp.Expression, column: exp.Column) -> bool:
    """Is ``conjunct`` NULL or false (so the row is filtered out) whenever ``column`` is NULL?"""
    if isinstance(conjunct, exp.Not) and isinstance(conjunct.this, exp.Is):  # column IS NOT NULL
        return conjunct.this.this == column and isinstance(conjunct.this.expression, exp.Null)
    return isinstance(conjunct, COMPARISONS) and any(operand == column for operand in conjunct.iter_expressions())
