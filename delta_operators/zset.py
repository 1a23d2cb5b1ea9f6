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


def numpy_not_distinct(a: pa.ChunkedArray, b: pa.ChunkedArray, zero_signs: bool = False):  # -> np.ndarray | None
    """``arrow_not_distinct`` in numpy for two number (or date/time) columns of one type without NULLs,
    else None. NaN equals NaN; -0.0 equals 0.0 unless ``zero_signs``. One numpy pass instead of
    several Arrow calls: these comparisons run per column per batch on a few thousand rows."""
    import numpy as np

    t = a.type
    if a.null_count or b.null_count or t != b.type:
        return None
    if pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_duration(t):
        a, b = a.cast(pa.int64()) if t.bit_width == 64 else a.cast(pa.int32()), \
            b.cast(pa.int64()) if t.bit_width == 64 else b.cast(pa.int32())
    elif not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    x, y = a.to_numpy(), b.to_numpy()
    equal = x == y
    if pa.types.is_floating(t):
        if zero_signs:
            equal &= np.signbit(x) == np.signbit(y)
        equal |= np.isnan(x) & np.isnan(y)
    return equal



def number_values(column: pa.ChunkedArray):  # -> np.ndarray | None
    """An integer or floating point column without NULLs as numpy values (a view of a one-chunk column's
    buffer), else None: pairs of its rows then compare by two numpy gathers instead of two Arrow takes."""
    from storage.buffers import fixed_width_values, one_array

    t = column.type
    if column.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    return fixed_width_values(one_array(column))


def pairs_not_distinct(values, first, second, zero_signs: bool = False):  # -> np.ndarray
    """``numpy_not_distinct`` of rows ``first`` and ``second`` of ``number_values`` (gathered in place)."""
    import numpy as np

    x, y = values[first], values[second]
    equal = x == y
    if values.dtype.kind == "f":
        if zero_signs:
            equal &= np.signbit(x) == np.signbit(y)
        equal |= np.isnan(x) & np.isnan(y)
    return equal
