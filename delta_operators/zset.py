"""Z-sets: relations whose rows carry an integer weight.

A table is a Z-set with positive weights; a change batch is a Z-set whose
weights say how many copies of each row were added (+) or removed (-). Every
delta and every stored relation in ivm carries the weight in one column,
named here once. Consolidation groups equal rows and sums their weights,
dropping rows whose weight becomes zero.

>>> consolidate_sql("d", ["a", "b"]).sql("duckdb")
'SELECT "d"."a" AS "a", "d"."b" AS "b", SUM("d"."__weight") AS "__weight" FROM "d" AS "d" GROUP BY "d"."a", "d"."b" HAVING SUM("d"."__weight") <> 0'
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.plan_sql import alias, column, table

WEIGHT = "__weight"  # int64 multiplicity of a row in a Z-set
RUN = "__run"  # which run of a stored relation a looked-up row lives in
POS = "__pos"  # its position in that run; (RUN, POS) lets a later step delete it

WEIGHT_TYPE = "BIGINT"


def weight(table_alias: str | None = None) -> exp.Column:
    return column(WEIGHT, table_alias)


def consolidate_sql(source: str, columns: Sequence[str]) -> exp.Select:
    """SELECT columns, SUM(weight) ... GROUP BY columns HAVING SUM(weight) <> 0."""
    cols = [column(c, source) for c in columns]
    total = exp.Sum(this=weight(source))
    select = exp.select(*[alias(c, n) for c, n in zip(cols, columns)], alias(total, WEIGHT))
    select = select.from_(table(source, source))
    if cols:
        select = select.group_by(*[c.copy() for c in cols])
    return select.having(exp.NEQ(this=total.copy(), expression=exp.Literal.number(0)))


def not_distinct(left: str, right: str, columns: Sequence[str]) -> exp.Expression:
    """NULL-safe equality of ``columns`` between two aliases (TRUE when none)."""
    if not columns:
        return exp.true()
    return exp.and_(
        *[
            exp.NullSafeEQ(this=column(c, left), expression=column(c, right))
            for c in columns
        ]
    )


def arrow_not_distinct(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``not_distinct`` of one column over Arrow arrays, per row: NULL equals NULL, and NaN equals NaN."""
    equal = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return equal
