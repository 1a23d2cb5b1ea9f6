"""Result types a client expects: a SUM of integers is a BIGINT.

DuckDB sums integers exactly into a HUGEINT (128 bits), which reaches clients
as ``decimal128(38, 0)``: an object column in pandas, a NUMERIC in a BI tool.
PostgreSQL answers ``sum(int4)`` with an ``int8``, and that is what users
expect of ``SUM(quantity)``. The rule:

* An output column whose type is HUGEINT only because of a SUM (or a window
  SUM) over TINYINT, SMALLINT, INTEGER or BIGINT values (or over unsigned ones
  up to UINTEGER) is a BIGINT. That covers ``SUM(a)``, ``SUM(a) * 2``,
  ``SUM(a) + SUM(b)``, ``CASE … THEN SUM(a) …`` and a SUM passed up from a
  subquery or a UNION branch.
* Everything else keeps DuckDB's type: a SUM of UBIGINT or HUGEINT values, an
  explicit ``CAST(… AS HUGEINT)`` (``SUM(CAST(a AS HUGEINT))``), DECIMAL sums
  (``DECIMAL(38, s)``) and floating-point sums.
* Sums are still computed exactly (the maintained state stays HUGEINT); only
  the view's column is a BIGINT. A value beyond BIGINT's range is an error of
  the view, never a wrapped or clipped number; a user who needs such sums
  writes ``SUM(CAST(a AS HUGEINT))`` or ``SUM(CAST(a AS DECIMAL(38, 0)))``.

How a column is found: the same query with every SUM replaced by MIN (which
keeps its argument's type) is bound once more; where that gives a 64-bit or
narrower integer but the real query gives HUGEINT, the HUGEINT came from a SUM
of integers.

>>> import duckdb, sqlglot
>>> con = duckdb.connect()
>>> _ = con.execute("CREATE TABLE t (g INT, a INT, b BIGINT, h HUGEINT)")
>>> def describe(sql):
...     return [(c[0], str(c[1])) for c in con.execute(f"DESCRIBE {sql}").fetchall()]
>>> q = sqlglot.parse_one("SELECT g, SUM(a) x, SUM(b) * 2 y, SUM(h) z, SUM(CAST(a AS HUGEINT)) w FROM t GROUP BY g",
...                       read="duckdb")
>>> described = [t for _, t in describe(q.sql("duckdb"))]
>>> described
['INTEGER', 'HUGEINT', 'HUGEINT', 'HUGEINT', 'HUGEINT']
>>> integer_sum_types(q, described, lambda query: [t for _, t in describe(query.sql("duckdb"))])
['INTEGER', 'BIGINT', 'BIGINT', 'HUGEINT', 'HUGEINT']
"""

from __future__ import annotations

from typing import Callable, Sequence

from sqlglot import exp

# Argument types whose SUM always fits the 64-bit BIGINT unless the sum overflows.
NARROW_INTEGERS = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"})


def integer_sum_types(
    query: exp.Expression, types: Sequence[str], describe_types: Callable[[exp.Expression], Sequence[str]]
) -> list[str]:
    """The view's column types: ``types`` (as DuckDB binds the query) with HUGEINT sums of integers as BIGINT.

    ``describe_types(query)`` binds a query and returns its column types.
    """
    if "HUGEINT" not in types or query.find(exp.Sum) is None:
        return list(types)
    with_min = query.transform(lambda node: exp.Min(this=node.this.copy()) if isinstance(node, exp.Sum) else node)
    argument_types = describe_types(with_min)
    return [
        "BIGINT" if given == "HUGEINT" and by_argument in NARROW_INTEGERS else given
        for given, by_argument in zip(types, argument_types)
    ]

