"""Z-sets: relations whose rows carry an integer weight; their names and every Z-set SQL, once.

A table is a Z-set with positive weights; a change batch is a Z-set whose
weights say how many copies of each row were added (+) or removed (-). Every
delta and every stored relation in ivm carries the weight in one column,
named here once. Consolidation groups equal rows and sums their weights,
dropping rows whose weight becomes zero (or, for the rows present in a
relation, every row whose weight is not positive).

Storage is the lowest layer: the compiler, the runtime and storage itself
build their Z-set SQL here, so this module imports nothing of theirs.
Identifiers are always quoted (any name works); sources are SQL text (a
name, ``(subquery) AS alias``, or a runner template's ``{input}``).

>>> print(consolidate("{rows}", ["a", 'b"c']))
SELECT "a", "b""c", CAST(SUM("__weight") AS BIGINT) AS "__weight" FROM {rows} GROUP BY "a", "b""c" HAVING SUM("__weight") <> 0
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from storage.buffers import fixed_width_values, one_array

WEIGHT = "__weight"  # int64 multiplicity of a row in a Z-set
RUN = "__run"  # which run of a stored relation a looked-up row lives in
POS = "__pos"  # its position in that run; (RUN, POS) lets a later step delete it

WEIGHT_TYPE = "BIGINT"

# Which consolidated rows to keep (the HAVING condition on the summed weight).
NONZERO = "<> 0"  # a Z-set: rows whose weights cancel are gone
PRESENT = "> 0"  # the rows present in a relation: removed as often as added, or more, are gone
EVERY = None  # every group, its sum included even when 0 (the caller filters)


def quote(name: str, template: bool = False) -> str:
    """Quote an identifier; in a runner template (filled by ``str.format``) its braces are doubled.

    >>> quote('a"b'), quote("x{y}", template=True)
    ('"a""b"', '"x{{y}}"')
    """
    text = exp.to_identifier(name, quoted=True).sql("duckdb")
    return text.replace("{", "{{").replace("}", "}}") if template else text


def listed(columns: Sequence[str], table: str | None = None, aliased: bool = False, template: bool = False) -> str:
    """List columns, qualified by ``table`` and named ``AS`` themselves if asked; empty for none.

    >>> listed(["a", "b"], "t", aliased=True)
    '"t"."a" AS "a", "t"."b" AS "b"'
    """
    prefix = f"{quote(table, template)}." if table else ""
    return ", ".join(f"{prefix}{quote(c, template)}" + (f" AS {quote(c, template)}" if aliased else "")
                     for c in columns)


def consolidate(source: str, columns: Sequence[str], table: str | None = None, keep: str | None = NONZERO,
                summed: str | None = None, name: str = WEIGHT, cast: bool = True, template: bool = False) -> str:
    """Group equal rows of ``source`` by ``columns``, sum their weights and keep the sums ``keep`` says.

    Args:
        source: the FROM item, as SQL text.
        columns: the row's columns (no GROUP BY for none: one group).
        table: qualify the columns by this alias (and name each ``AS`` itself).
        keep: NONZERO (a Z-set), PRESENT (a relation's rows) or EVERY (no HAVING).
        summed: the SQL expression summed instead of the weight column.
        name: the sum's column name.
        cast: cast the sum to WEIGHT_TYPE (DuckDB sums BIGINT to HUGEINT).
        template: the text is a runner template: braces in names are doubled.

    >>> consolidate('(SELECT * FROM "x") AS u', ["a"], table="u", keep=PRESENT)
    'SELECT "u"."a" AS "a", CAST(SUM("u"."__weight") AS BIGINT) AS "__weight" FROM (SELECT * FROM "x") AS u GROUP BY "u"."a" HAVING SUM("u"."__weight") > 0'
    >>> print(consolidate("{b}", ["k{1}"], summed="CASE WHEN op = 'd' THEN -1 ELSE 1 END", name="d", cast=False,
    ...                   template=True))
    SELECT "k{{1}}", SUM(CASE WHEN op = 'd' THEN -1 ELSE 1 END) AS "d" FROM {b} GROUP BY "k{{1}}" HAVING SUM(CASE WHEN op = 'd' THEN -1 ELSE 1 END) <> 0
    >>> consolidate('"t"', [], keep=EVERY, cast=False)
    'SELECT SUM("__weight") AS "__weight" FROM "t"'
    """
    if summed is None:
        summed = (f"{quote(table, template)}." if table else "") + quote(WEIGHT, template)
    total = f"SUM({summed})"
    sql = f"CAST({total} AS {WEIGHT_TYPE})" if cast else total
    items = listed(columns, table, aliased=table is not None, template=template)
    sql = f"SELECT {items + ', ' if items else ''}{sql} AS {quote(name, template)} FROM {source}"
    if columns:
        sql += f" GROUP BY {listed(columns, table, template=template)}"
    return sql if keep is None else f"{sql} HAVING {total} {keep}"


def consolidate_sql(source: str, columns: Sequence[str]) -> exp.Select:
    """Consolidate the Z-set named ``source`` as a sqlglot tree (the compiler's form: no cast).

    >>> consolidate_sql("d", ["a", "b"]).sql("duckdb")
    'SELECT "d"."a" AS "a", "d"."b" AS "b", SUM("d"."__weight") AS "__weight" FROM "d" AS "d" GROUP BY "d"."a", "d"."b" HAVING SUM("d"."__weight") <> 0'
    """
    return sqlglot.parse_one(consolidate(f"{quote(source)} AS {quote(source)}", columns, table=source, cast=False),
                             dialect="duckdb")


def counted() -> str:
    """Count a group's rows into its weight (a select item, beside GROUP BY the row's columns).

    >>> counted()
    'CAST(COUNT(*) AS BIGINT) AS "__weight"'
    """
    return f"CAST(COUNT(*) AS {WEIGHT_TYPE}) AS {quote(WEIGHT)}"


def count_rows(source: str, columns: Sequence[str]) -> str:
    """Count equal rows of the runner input ``source`` into their weight (a bag as a Z-set; a template).

    >>> count_rows("rows", ["a", "b"])
    'SELECT "a", "b", CAST(COUNT(*) AS BIGINT) AS "__weight" FROM {rows} GROUP BY "a", "b"'
    """
    items = listed(columns, template=True)
    sql = f"SELECT {items + ', ' if items else ''}{counted()} FROM {{{source}}}"
    return f"{sql} GROUP BY {items}" if columns else sql


def negate(table: str | None = None) -> str:
    """Negate the weight (a select item): the rows' removal.

    >>> negate("o")
    '-"o"."__weight" AS "__weight"'
    """
    return f"-{quote(table) + '.' if table else ''}{quote(WEIGHT)} AS {quote(WEIGHT)}"


def difference(old: str, new: str, columns: Sequence[str]) -> str:
    """The change from runner input ``old`` to ``new`` (two Z-sets): new - old, consolidated (a template).

    >>> difference("old", "new", ["a"])
    'SELECT "a", CAST(SUM("__weight") AS BIGINT) AS "__weight" FROM (SELECT "a", -"__weight" AS "__weight" FROM {old} UNION ALL SELECT "a", "__weight" FROM {new}) AS "__difference" GROUP BY "a" HAVING SUM("__weight") <> 0'
    """
    items = listed(columns, template=True)
    both = (f"(SELECT {items}, {negate()} FROM {{{old}}} "
            f"UNION ALL SELECT {items}, {quote(WEIGHT)} FROM {{{new}}}) AS {quote('__difference')}")
    return consolidate(both, columns, template=True)


def prune(source: str, columns: Sequence[str]) -> str:
    """Rows of runner input ``source`` outside the groups (by ``columns``) whose weights cancel (a template).

    >>> prune("delta", ["k"])
    'SELECT * FROM {delta} QUALIFY SUM("__weight") OVER (PARTITION BY "k") <> 0'
    >>> prune("delta", [])
    'SELECT * FROM {delta} QUALIFY SUM("__weight") OVER () <> 0'
    """
    partition = f"PARTITION BY {listed(columns, template=True)}" if columns else ""
    return f"SELECT * FROM {{{source}}} QUALIFY SUM({quote(WEIGHT)}) OVER ({partition}) {NONZERO}"


def arrow_not_distinct(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Compare one column of two Arrow arrays per row, NULL-safe: NULL equals NULL, and NaN equals NaN.

    >>> nan = float("nan")
    >>> arrow_not_distinct(pa.array([1.0, None, nan, 2.0]), pa.array([1.0, None, nan, None])).to_pylist()
    [True, True, True, False]
    """
    equal = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return equal


def numpy_not_distinct(a: pa.ChunkedArray, b: pa.ChunkedArray, zero_signs: bool = False) -> np.ndarray | None:
    """``arrow_not_distinct`` in numpy for two number (or date/time) columns of one type without NULLs,
    else None. NaN equals NaN; -0.0 equals 0.0 unless ``zero_signs``. One numpy pass instead of
    several Arrow calls: these comparisons run per column per batch on a few thousand rows.

    >>> numpy_not_distinct(pa.chunked_array([[0.0, 1.0]]), pa.chunked_array([[-0.0, 2.0]])).tolist()
    [True, False]
    >>> numpy_not_distinct(pa.chunked_array([[1, None]]), pa.chunked_array([[1, 2]])) is None
    True
    """
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


def number_values(column: pa.ChunkedArray) -> np.ndarray | None:
    """An integer or floating point column without NULLs as numpy values (a view of a one-chunk column's
    buffer), else None: pairs of its rows then compare by two numpy gathers instead of two Arrow takes.

    >>> number_values(pa.chunked_array([[3, 4]])).tolist(), number_values(pa.chunked_array([["a"]]))
    ([3, 4], None)
    """
    t = column.type
    if column.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    return fixed_width_values(one_array(column))


def pairs_not_distinct(values: np.ndarray, first: np.ndarray, second: np.ndarray,
                       zero_signs: bool = False) -> np.ndarray:
    """``numpy_not_distinct`` of rows ``first`` and ``second`` of ``number_values`` (gathered in place).

    >>> pairs_not_distinct(np.array([1.0, np.nan, 1.0, np.nan]), np.array([0, 1]), np.array([2, 3])).tolist()
    [True, True]
    """
    x, y = values[first], values[second]
    equal = x == y
    if values.dtype.kind == "f":
        if zero_signs:
            equal &= np.signbit(x) == np.signbit(y)
        equal |= np.isnan(x) & np.isnan(y)
    return equal
