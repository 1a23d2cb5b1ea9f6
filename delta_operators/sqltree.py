"""SQL trees the rules share: typed NULLs and casts, and SELECTs of Z-sets (rows with a weight column).

>>> from sql_frontend.plan import Column
>>> union_all([select_columns("t", (Column("a", "INTEGER"),)), negate_weight("d", (Column("a", "INTEGER"),))]).sql()
'SELECT "t"."a" AS "a", "t"."__weight" AS "__weight" FROM "t" AS "t" UNION ALL SELECT "d"."a" AS "a", -"d"."__weight" AS "__weight" FROM "d" AS "d"'
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Column
from sql_frontend.plan_sql import alias, column
from storage.zset import WEIGHT, WEIGHT_TYPE


def typed_null(type_sql: str) -> exp.Expression:
    return exp.cast(exp.null(), exp.DataType.build(type_sql, dialect="duckdb"))


def cast(expression: exp.Expression, type_sql: str) -> exp.Expression:
    return exp.cast(expression, exp.DataType.build(type_sql, dialect="duckdb"))


def empty_select(columns: tuple[Column, ...]) -> exp.Select:
    """A typed, empty Z-set with ``columns``."""
    return exp.select(
        *[alias(typed_null(c.type), c.name) for c in columns],
        alias(cast(exp.Literal.number(0), WEIGHT_TYPE), WEIGHT),
    ).where(exp.false())


def select_columns(source: str, columns: tuple[Column, ...], weight_expr: exp.Expression | None = None) -> exp.Select:
    """SELECT the node's columns and the weight from a temp or relation scan."""
    w = weight_expr if weight_expr is not None else column(WEIGHT, source)
    return exp.select(
        *[alias(column(c.name, source), c.name) for c in columns], alias(w, WEIGHT)
    ).from_(exp.Table(this=exp.to_identifier(source, quoted=True), alias=exp.TableAlias(this=exp.to_identifier(source, quoted=True))))


def union_all(parts: list[exp.Expression]) -> exp.Expression:
    result = parts[0]
    for part in parts[1:]:
        result = exp.union(result, part, distinct=False)
    return result


def negate_weight(source: str, columns: tuple[Column, ...]) -> exp.Select:
    return select_columns(source, columns, exp.Neg(this=column(WEIGHT, source)))
