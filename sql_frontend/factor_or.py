"""Pull the conditions every branch of an OR shares out of the OR.

``(a AND b) OR (a AND c)`` is ``a AND (b OR c)`` (in three-valued logic too:
AND and OR distribute). A join condition hidden in every branch of an OR
(TPC-H Q19 writes ``p_partkey = l_partkey`` in each of three branches)
becomes a plain conjunct, so the join is an equi-join maintained by index
lookups instead of a product.

>>> where = sqlglot.parse_one("SELECT 1 FROM t WHERE (a = b AND x > 1) OR (a = b AND y < 2)")
>>> factor_disjunctions(where).sql()
'SELECT 1 FROM t WHERE (a = b AND (x > 1 OR y < 2))'
"""

from __future__ import annotations

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp

from sql_frontend.correlation import conjuncts


def disjuncts(e: exp.Expression) -> list[exp.Expression]:
    if isinstance(e, exp.Paren):
        return disjuncts(e.this)
    if isinstance(e, exp.Or):
        return disjuncts(e.this) + disjuncts(e.expression)
    return [e]


def _factor(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.Or):
        return node
    branches = [conjuncts(d) for d in disjuncts(node)]
    common = [c for c in branches[0] if all(any(c == o for o in b) for b in branches[1:])]
    if not common:
        return node
    rests = [[c for c in b if not any(c == k for k in common)] for b in branches]
    parts = [c.copy() for c in common]
    if all(rests):  # a branch of only shared conditions makes the OR of the rest TRUE
        ors = [exp.and_(*[c.copy() for c in rest]) for rest in rests]
        parts.append(exp.Paren(this=exp.or_(*ors)))
    return exp.Paren(this=exp.and_(*parts))  # parentheses keep the AND inside whatever held the OR


def factor_disjunctions(query: exp.Expression) -> exp.Expression:
    """Rewrite every OR in ``query`` whose branches share conditions (returns a new tree)."""
    return query.copy().transform(_factor)
