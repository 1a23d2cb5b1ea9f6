"""Render a delta program's sqlglot trees as Spark SQL.

Programs are built once as sqlglot trees in DuckDB's dialect. sqlglot's Spark
generator handles the syntax (quoting, types,
``UNNEST(GENERATE_SERIES(...))`` -> ``LATERAL VIEW EXPLODE(SEQUENCE(...))``).
What it cannot know is where the two engines *mean* different things;
those are the named rewrites below, applied to a copy of the tree before
rendering (the ibis order: syntax -> dialect, meaning -> a named rewrite):

* ``divide``: DuckDB's ``/`` is floating-point division (also of integers and
  decimals) and gives ±inf/NaN for a zero divisor; Spark's ANSI ``/`` raises.
* ``cast_rounds``: DuckDB rounds (half away from zero) when it casts a
  fractional value to an integer type; Spark truncates.
* ``isfinite``: a DuckDB function Spark lacks (spelled with ISNAN and ±inf).
* ``qualify``: every table alias and column qualifier is renamed to a name
  users cannot give a column (``__rel_`` + the alias; table and column names
  may not start with ``__``). The delta SQL qualifies with one-letter aliases
  (``g``, ``m``, ``o``...); inside a correlated subquery Spark resolves an
  outer ``g.x`` as the field ``x`` of an inner column ``g`` when there is one
  (INVALID_EXTRACT_BASE_FIELD_TYPE), where DuckDB binds the alias.
* ``date_parts``: DuckDB's EXTRACT / YEAR() / MONTH() ... are BIGINT, Spark's
  INT; a view's column (and the delta rows stacked beside its stored rows)
  must have one type whichever engine computed it.
* ``types``: HUGEINT is DECIMAL(38,0) on Spark; unsigned, UUID, JSON, TIME,
  bit, enum and union types have no Spark counterpart and raise
  UnsupportedError naming the type.

sqlglot is asked to raise rather than warn on anything it cannot transpile,
and that too becomes an UnsupportedError naming the construct. Functions
neither engine layer knows are reported by Spark's analyzer; the executor
turns that into an UnsupportedError naming the function.

>>> import sqlglot
>>> to_spark(sqlglot.parse_one('SELECT CAST("a" AS INTEGER) AS "x", "a" / 2 AS "h" FROM "t"', dialect="duckdb"))
"SELECT CAST(ROUND(`a`) AS INT) AS `x`, CASE WHEN CAST(2 AS DOUBLE) = 0 THEN CAST(`a` AS DOUBLE) * CAST('inf' AS DOUBLE) ELSE CAST(`a` AS DOUBLE) / CAST(2 AS DOUBLE) END AS `h` FROM `t` AS `__rel_t`"
"""

from __future__ import annotations

from sqlglot import ErrorLevel, exp
from sqlglot.errors import UnsupportedError as SqlglotUnsupported

from sql_frontend.errors import UnsupportedError
from sql_frontend.plan_sql import parenthesize

DIALECT = "spark"

INTEGER_TYPES = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
                 exp.DataType.Type.BIGINT}
HUGE = {exp.DataType.Type.INT128}
NO_SPARK_TYPE = {
    exp.DataType.Type.UTINYINT: "UTINYINT", exp.DataType.Type.USMALLINT: "USMALLINT",
    exp.DataType.Type.UINT: "UINTEGER", exp.DataType.Type.UBIGINT: "UBIGINT",
    exp.DataType.Type.UINT128: "UHUGEINT", exp.DataType.Type.UUID: "UUID", exp.DataType.Type.JSON: "JSON",
    exp.DataType.Type.TIME: "TIME", exp.DataType.Type.TIMETZ: "TIME WITH TIME ZONE",
    exp.DataType.Type.BIT: "BIT", exp.DataType.Type.ENUM: "ENUM", exp.DataType.Type.UNION: "UNION",
}


def double(e: exp.Expression) -> exp.Expression:
    return exp.Cast(this=e, to=exp.DataType.build("DOUBLE"))


def infinity() -> exp.Expression:
    return exp.Cast(this=exp.Literal.string("inf"), to=exp.DataType.build("DOUBLE"))


def divide(node: exp.Expression) -> exp.Expression:
    """``a / b`` as DuckDB computes it: in DOUBLE, ±inf or NaN for a zero divisor."""
    if not isinstance(node, exp.Div):
        return node
    a, b = node.this, node.expression
    zero = exp.EQ(this=double(b.copy()), expression=exp.Literal.number(0))
    # a * inf is +inf, -inf or NaN (for a = 0), as DuckDB's a / 0.
    by_zero = exp.Mul(this=double(a.copy()), expression=infinity())
    return exp.Case(ifs=[exp.If(this=zero, true=by_zero)], default=exp.Div(this=double(a), expression=double(b)))


def cast_rounds(node: exp.Expression) -> exp.Expression:
    """CAST(x AS <integer>) rounds x first, as DuckDB does (Spark would truncate)."""
    if not isinstance(node, (exp.Cast, exp.TryCast)) or node.to.this not in INTEGER_TYPES:
        return node
    value = node.this
    if isinstance(value, exp.Literal) and not value.is_string and "." not in value.name or is_integer_part(value):
        return node
    node.set("this", exp.Round(this=value))
    return node


def isfinite(node: exp.Expression) -> exp.Expression:
    if not (isinstance(node, exp.Anonymous) and node.name.lower() == "isfinite"):
        return node
    x = node.expressions[0]
    not_nan = exp.Not(this=exp.IsNan(this=x.copy()))
    not_inf = exp.NEQ(this=exp.Abs(this=x.copy()), expression=infinity())
    return exp.Paren(this=exp.and_(not_nan, not_inf))


# Date parts DuckDB returns as BIGINT where Spark returns INT (EXTRACT of a second has a
# fraction on Spark and is left alone: DuckDB's SECOND is an integer, Spark's is not).
INTEGER_PARTS = {"year", "quarter", "month", "week", "day", "dayofmonth", "dayofyear", "doy", "hour", "minute",
                 "dow", "dayofweek", "weekday", "isodow"}
DATE_PART_FUNCTIONS = (exp.Year, exp.Quarter, exp.Month, exp.Week, exp.Day, exp.DayOfWeek, exp.DayOfWeekIso,
                       exp.DayOfMonth, exp.DayOfYear)
# DuckDB numbers weekdays from Sunday = 0 (dow, dayofweek, weekday) or Monday = 1 .. Sunday = 7
# (isodow); Spark's DAYOFWEEK (and EXTRACT(DOW)) from Sunday = 1.
SUNDAY_ZERO = {"dow", "dayofweek", "weekday"}


def _part(node: exp.Expression) -> tuple[str, exp.Expression] | None:
    """(DuckDB's name of the date part, its argument) of EXTRACT, DATE_PART or a YEAR()-style call."""
    if isinstance(node, exp.Extract):
        return node.name.lower(), node.expression
    if isinstance(node, exp.Anonymous) and node.expressions:
        name, args = node.name.lower(), node.expressions
        if name in ("date_part", "datepart") and len(args) == 2 and isinstance(args[0], exp.Literal) and args[0].is_string:
            return args[0].name.lower(), args[1]
        if name == "weekday" and len(args) == 1:
            return "weekday", args[0]
        return None
    if isinstance(node, exp.DayOfWeekIso):
        return "isodow", node.this
    if isinstance(node, exp.DayOfWeek):
        return "dow", node.this
    return (type(node).__name__.lower(), node.this) if isinstance(node, DATE_PART_FUNCTIONS) else None


def is_integer_part(node: exp.Expression) -> bool:
    part = _part(node)
    return part is not None and part[0] in INTEGER_PARTS


def date_parts(node: exp.Expression) -> exp.Expression:
    """Integer date parts as BIGINT, DuckDB's type for them; weekdays numbered as DuckDB does."""
    part = _part(node)
    if part is None or part[0] not in INTEGER_PARTS:
        return node
    name, value = part
    sunday_one = exp.DayOfWeek(this=value.copy())  # Spark: Sunday = 1 .. Saturday = 7
    if name in SUNDAY_ZERO:
        node = exp.Sub(this=sunday_one, expression=exp.Literal.number(1))
    elif name == "isodow":  # Monday = 1 .. Sunday = 7
        shifted = exp.Mod(this=exp.Paren(this=exp.Add(this=sunday_one, expression=exp.Literal.number(5))),
                          expression=exp.Literal.number(7))
        node = exp.Add(this=shifted, expression=exp.Literal.number(1))
    return exp.Cast(this=exp.Paren(this=node) if isinstance(node, exp.Binary) else node,
                    to=exp.DataType.build("BIGINT"))


def types(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.DataType):
        return node
    if node.this in HUGE:
        return exp.DataType.build("DECIMAL(38,0)")
    if node.this in NO_SPARK_TYPE:
        raise UnsupportedError(f"type {NO_SPARK_TYPE[node.this]} has no Spark equivalent; maintain this view with engine = 'duckdb'")
    return node


REWRITES = (types, isfinite, cast_rounds, date_parts, divide)
QUALIFIER = "__rel_"


def qualify(tree: exp.Expression) -> exp.Expression:
    """Rename table aliases and the column qualifiers naming them to QUALIFIER + alias (in place).

    One name for one name (case-insensitively, as both engines compare
    them) over the whole tree keeps every reference bound to the relation it
    was bound to: the scopes do not change, only the spelling. A table
    read without an alias (a CTE, typically) gets its own name as alias
    first, so columns qualified by that name follow. CTE names are table
    names, not aliases, and keep theirs; a qualifier that names no alias in
    the tree is left alone.
    """
    for table in tree.find_all(exp.Table):
        if not table.alias and not table.args.get("db"):
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
    names: set[str] = set()
    for alias in tree.find_all(exp.TableAlias):
        if alias.this is not None and not isinstance(alias.parent, exp.CTE):
            names.add(alias.name.lower())
            alias.set("this", exp.to_identifier(QUALIFIER + alias.name.lower(), quoted=True))
    for column in tree.find_all(exp.Column):
        qualifier = column.args.get("table")
        if qualifier is not None and not column.args.get("db") and qualifier.name.lower() in names:
            column.set("table", exp.to_identifier(QUALIFIER + qualifier.name.lower(), quoted=True))
    return tree


def to_spark(tree: exp.Expression) -> str:
    """Spark SQL text of a program's query tree (the tree itself is not changed)."""
    tree = qualify(parenthesize(tree.copy()))
    for rewrite in REWRITES:
        tree = tree.transform(rewrite, copy=False)
    try:
        return tree.sql(dialect=DIALECT, unsupported_level=ErrorLevel.RAISE)
    except SqlglotUnsupported as e:
        raise UnsupportedError(f"cannot run on Spark: {e}") from None
