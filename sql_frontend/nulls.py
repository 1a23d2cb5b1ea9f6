"""Which tables a WHERE condition rejects when their columns are all NULL.

An outer join pads unmatched rows with NULLs; if the WHERE clause is never
true for such a row, the padded rows never reach the result and the outer
join may be planned as an inner join (the classic outer-join
simplification). Cheaper, and it needs no anti join. The analysis is
conservative: it only claims rejection where SQL guarantees it.

>>> where = sqlglot.parse_one('SELECT 1 FROM a WHERE "b"."x" + 1 > 3 AND "a"."y" IS NULL').args["where"].this
>>> sorted(rejected_aliases(where))
['b']
"""

from __future__ import annotations

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp

from sql_frontend.correlation import conjuncts

# NULL in, NULL out: an operand that is NULL makes these NULL.
STRICT = (
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Paren, exp.Cast, exp.TryCast,
    exp.DPipe, exp.Upper, exp.Lower, exp.Substring, exp.Length, exp.Abs, exp.Extract,
)
# Comparisons are NULL (so the row is rejected) when an operand is NULL.
COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike, exp.Between)


def strict_aliases(expression: exp.Expression) -> set[str]:
    """Aliases whose all-NULL columns make ``expression`` NULL."""
    if isinstance(expression, exp.Column):
        return {expression.table} if expression.table else set()
    if isinstance(expression, STRICT) and not (isinstance(expression, exp.DPipe) and expression.args.get("safe")):
        found: set[str] = set()
        for child in expression.iter_expressions():
            found |= strict_aliases(child)
        return found
    return set()


def rejected_by(predicate: exp.Expression) -> set[str]:
    """Aliases for which ``predicate`` is never TRUE when all their columns are NULL."""
    if isinstance(predicate, exp.Paren):
        return rejected_by(predicate.this)
    if isinstance(predicate, exp.And):
        return rejected_by(predicate.this) | rejected_by(predicate.expression)
    if isinstance(predicate, exp.Or):
        return rejected_by(predicate.this) & rejected_by(predicate.expression)
    if isinstance(predicate, COMPARISONS):
        found: set[str] = set()
        for child in predicate.iter_expressions():
            found |= strict_aliases(child)
        return found
    if isinstance(predicate, exp.In) and predicate.args.get("query") is None:
        return strict_aliases(predicate.this)
    if isinstance(predicate, exp.Not) and isinstance(predicate.this, (exp.Paren, *COMPARISONS)):
        inner = predicate.this.this if isinstance(predicate.this, exp.Paren) else predicate.this
        if isinstance(inner, COMPARISONS):  # NOT NULL is NULL
            return rejected_by(inner)
    if isinstance(predicate, exp.Not) and isinstance(predicate.this, exp.Is):
        test = predicate.this  # x IS NOT NULL
        if isinstance(test.expression, exp.Null):
            return strict_aliases(test.this)
    return set()


def rejected_aliases(where: exp.Expression | None) -> set[str]:
    """Aliases the WHERE condition rejects when padded with NULLs."""
    found: set[str] = set()
    for conjunct in conjuncts(where):
        found |= rejected_by(conjunct)
    return found
