"""Compiled DECIMAL, dates, LIKE, SUBSTRING, TRY_CAST, integer // % and UNION ALL casts against DuckDB.

(ivm/execute/compiled/decimals.py, expressions.py, relational.py.) Two DECIMAL
columns of random widths 1..38 and scales (values up to the width's limit,
NULLs, ties at .5 for the rounding casts; past int64 for the wide ones,
which must fall back), an integer and a DOUBLE column: every operator's
result type must be DuckDB's (CompiledStep checks it against the schema
DuckDB gives) and every value the same, or the batch falls back where
DuckDB raises (an overflow past the result's width). Dates from year 1 to
9999 with month ends and leap days against folded DATE +- INTERVAL
constants; LIKE patterns over multibyte text and newlines.
"""

from __future__ import annotations

import datetime
from decimal import Decimal, localcontext

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.compiled_check import DOUBLES, SMALL_INTS, check, column, ran, tables

WIDTHS = st.integers(1, 38).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p)))


def decimals_of(p: int, s: int) -> st.SearchStrategy:
    """Values of DECIMAL(p,s): the extremes, zero, ties (x.5 at every scale), small and any in range."""
    top = 10**p - 1
    fits = min(top, 2**63 - 1)
    units = st.one_of(
        st.sampled_from([top, -top, 0, 1, -1, 5, -5, 15, -25, fits, -fits]),
        st.integers(-1000, 1000),
        st.integers(-fits, fits),
        st.integers(-top, top),
    ).map(lambda n: max(-top, min(top, n)))
    return units.map(lambda n: scaled(n, s))


def scaled(n: int, s: int) -> Decimal:
    """n * 10^-s exactly (the default context would round past 28 digits)."""
    with localcontext() as context:
        context.prec = 80
        return Decimal(n).scaleb(-s)


@st.composite
def decimal_tables(draw):
    (pa_, sa), (pb, sb) = draw(WIDTHS), draw(WIDTHS)
    n = draw(st.integers(0, 10))
    columns = {
        "a": (pa.decimal128(pa_, sa), decimals_of(pa_, sa)),
        "b": (pa.decimal128(pb, sb), decimals_of(pb, sb)),
        "i": (pa.int32(), SMALL_INTS),
        "k": (pa.int64(), st.integers(0, 2)),
        "x": (pa.float64(), st.one_of(DOUBLES, st.sampled_from([0.125, 2.5, -2.5, 0.285, 1.005]))),
    }
    return pa.table({name: pa.array([draw(column(values)) for _ in range(n)], t)
                     for name, (t, values) in columns.items()}), (pa_, sa), (pb, sb)


EXPRESSIONS = [
    "a + b", "a - b", "a * b", "-a", "a / b", "a + i", "i - a", "a * i", "a * 100", "1 - a", "a + 1",
    "a * 0.5", "a + 0.06", "COALESCE(a, 0)", "COALESCE(a, b)", "COALESCE(a, i)", "CASE WHEN a > b THEN a ELSE b END",
    "GREATEST(a, b)", "LEAST(a, i)", "CAST(a AS DOUBLE)", "CAST(a AS BIGINT)", "CAST(a AS INTEGER)", "a + x",
    "CAST(a AS DECIMAL(38, 2))", "CAST(a AS DECIMAL(15, 2))", "CAST(a AS DECIMAL(18, 0))", "CAST(a AS DECIMAL(4, 1))",
    "CAST(b AS DECIMAL(38, 4))", "CAST(i AS DECIMAL(15, 2))", "CAST(x AS DECIMAL(15, 2))", "CAST(x AS DECIMAL(3, 1))",
    "CAST(x AS DECIMAL(38, 10))", "CAST(COALESCE(a, 0) AS DECIMAL(38, 4))",
]
CONDITIONS = ["a = b", "a < b", "a >= b", "a <> i", "a > 0", "a <= 0.05", "a = x", "a IS NOT DISTINCT FROM b",
              "a BETWEEN 0.05 AND 1", "a BETWEEN b AND 2.5", "i IN (1, 2, -3)", "a IN (0, 1, b)"]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=decimal_tables(), expr=st.sampled_from(EXPRESSIONS), cond=st.sampled_from(CONDITIONS))
def test_decimal_expressions_equal_duckdb(data, expr, cond):
    table, _, _ = data
    check(f"SELECT {expr} AS r, {cond} AS c FROM d", {"d": table})
    check(f"SELECT a, b FROM d WHERE {cond}", {"d": table})


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=decimal_tables())
def test_decimal_aggregates_equal_duckdb(data):
    table, _, _ = data
    check("SELECT k, SUM(a) AS s, MIN(a) AS lo, MAX(b) AS hi, COUNT(a) AS n FROM d GROUP BY k", {"d": table})
    check("SELECT SUM(b) AS s, MIN(b) AS lo FROM d", {"d": table})
    check("SELECT a, COUNT(*) AS n FROM d GROUP BY a", {"d": table})


def test_every_width_and_scale_types_as_duckdb():
    """Each width 1..38 with a few scales, against each other and the integer types: DuckDB's types."""
    outcomes = []
    for p in range(1, 39):
        for s in sorted({0, p // 2, p}):
            t = pa.decimal128(p, s)
            a = pa.array([scaled(1, s), None, scaled(-5, s) if p > 1 else Decimal(0)], t)
            b = pa.array([Decimal("1.25"), Decimal("-2.50"), None], pa.decimal128(15, 2))
            table = pa.table({"a": a, "b": b, "i": pa.array([1, 2, None], pa.int64()),
                              "j": pa.array([3, None, 4], pa.int8())})
            for sql in ["a + b AS r, a - i AS q, a * b AS m, a * j AS n, COALESCE(a, i) AS c, a > b AS g",
                        "COALESCE(a, b) AS c, a + 1 AS r, CASE WHEN i > 1 THEN a ELSE j END AS w, -a AS n"]:
                outcomes.append(check(f"SELECT {sql} FROM d", {"d": table}))
            outcomes.append(check("SELECT i, SUM(a) AS s, MAX(a) AS m FROM d GROUP BY i", {"d": table}))
    ran(outcomes)


def test_rounding_ties_and_overflow():
    t = pa.table({"a": pa.array([Decimal("2.5"), Decimal("-2.5"), Decimal("0.5"), Decimal("-3.5"), None],
                                pa.decimal128(2, 1)),
                  "x": pa.array([0.125, 2.5, -2.5, 0.285, 1.005], pa.float64())})
    assert check("SELECT CAST(a AS INTEGER) AS r, CAST(a AS DECIMAL(2, 0)) AS d FROM d", {"d": t}) == "compiled"
    assert check("SELECT CAST(x AS DECIMAL(4, 2)) AS r, CAST(x AS DECIMAL(2, 0)) AS s FROM d", {"d": t}) == "compiled"
    big = pa.table({"a": pa.array([Decimal("99999999999999.99")], pa.decimal128(16, 2)),
                    "w": pa.array([Decimal(2**63 + 5)], pa.decimal128(38, 0)),
                    "v": pa.array([Decimal("99.5")], pa.decimal128(3, 1))})
    assert check("SELECT a * a AS r FROM d", {"d": big}) == "fallback"  # past DECIMAL(18,4): DuckDB raises
    assert check("SELECT CAST(v AS DECIMAL(2, 0)) AS r FROM d", {"d": big}) == "fallback"
    assert check("SELECT w + 1 AS r FROM d", {"d": big}) == "fallback"  # outside int64: held by DuckDB only


def test_comparisons_keep_the_larger_scale():
    """DuckDB compares DECIMAL(37,6) with DECIMAL(30,17) as DECIMAL(38,17) (a value that does not fit raises),
    not in the common type of CASE, DECIMAL(38,7), which would round b and call unequal values equal."""
    t = pa.table({"a": pa.array([Decimal("0.000001"), Decimal(0), None], pa.decimal128(37, 6)),
                  "b": pa.array([Decimal("0.00000100000000001"), Decimal("0.00000000000000001"), Decimal(1)],
                                pa.decimal128(30, 17))})
    sql = "SELECT a = b AS e, a < b AS l, a IN (b, 1) AS i, a BETWEEN b AND 1 AS w, COALESCE(a, b) AS c FROM d"
    assert check(sql, {"d": t}) == "compiled"


DATES = st.one_of(st.dates(datetime.date(1900, 1, 1), datetime.date(2100, 12, 31)),
                  st.sampled_from([datetime.date(1994, 1, 31), datetime.date(1996, 2, 29), datetime.date(1, 1, 1),
                                   datetime.date(9999, 12, 31)]))
TIMESTAMPS = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2100, 1, 1))
DATE_COLUMNS = {"d": (pa.date32(), DATES), "e": (pa.date32(), DATES), "t": (pa.timestamp("us"), TIMESTAMPS)}
DATE_CONDITIONS = [
    "d < e", "d >= e", "d = e", "d <> e", "d < t", "t >= d", "d < DATE '1994-01-01' + INTERVAL '1' YEAR",
    "d >= DATE '1994-01-31' + INTERVAL '1' MONTH", "d <= DATE '1998-12-01' - INTERVAL '90' DAY",
    "d > CAST('1995-03-15' AS DATE)", "d BETWEEN DATE '1995-01-01' AND DATE '1996-12-31'",
    "t < TIMESTAMP '1996-02-29 12:00:00' + INTERVAL '3' MONTH", "d < DATE '1996-02-29' - INTERVAL '1' YEAR",
]


@settings(max_examples=60)
@given(table=tables(DATE_COLUMNS), cond=st.sampled_from(DATE_CONDITIONS),
       part=st.sampled_from(["YEAR", "MONTH", "DAY"]))
def test_dates_equal_duckdb(table, cond, part):
    check(f"SELECT d, t, {cond} AS c, EXTRACT({part} FROM d) AS x, EXTRACT({part} FROM t) AS y FROM v",
          {"v": table})
    check(f"SELECT d, MIN(e) AS lo, MAX(t) AS hi FROM v WHERE {cond} GROUP BY d", {"v": table})
    check("SELECT COALESCE(d, e) AS c, CASE WHEN d < e THEN d ELSE e END AS m, CAST(d AS TIMESTAMP) AS s FROM v",
          {"v": table})


LIKE_STRINGS = st.sampled_from(["", "a", "BRASS", "x BRASS", "PROMO x", "special requests", "specialrequests",
                                "requests special", "a\nBRASS", "straße", "100%", "x.y*z", "Customer Complaints"])
PATTERNS = ["%BRASS", "PROMO%", "%special%requests%", "%Customer%Complaints%", "a", "%", "%%", "", "%ß%",
            "%.y*%", "100%", "%a%a%", "%SS", "a%BRASS", "BR%SS", "x%", "%requests"]


@settings(max_examples=60)
@given(table=tables({"s": (pa.string(), LIKE_STRINGS)}), pattern=st.sampled_from(PATTERNS),
       negate=st.booleans())
def test_like_equals_duckdb(table, pattern, negate):
    op = "NOT LIKE" if negate else "LIKE"
    check(f"SELECT s, s {op} '{pattern}' AS m FROM v", {"v": table})
    check(f"SELECT s FROM v WHERE s {op} '{pattern}'", {"v": table})


INT_COLUMNS = {"a": (pa.int64(), st.one_of(st.integers(-9, 9), st.sampled_from([-(2**63), 2**63 - 1]))),
               "b": (pa.int64(), st.one_of(st.integers(-4, 4), st.just(-1))),
               "c": (pa.int8(), st.integers(-128, 127)), "e": (pa.int8(), st.integers(-3, 3))}


@settings(max_examples=60)
@given(table=tables(INT_COLUMNS), expr=st.sampled_from(["a // b", "a % b", "c // e", "c % e", "a // 2", "-7 // b",
                                                         "a % 3", "c // -1", "c % -1", "a % -1"]))
def test_integer_division_equals_duckdb(table, expr):
    check(f"SELECT {expr} AS r FROM v", {"v": table})


@pytest.mark.parametrize("sql", ["SELECT a // b AS q, a % b AS r FROM v"])
def test_integer_division_truncates(sql):
    table = pa.table({"a": pa.array([-7, 7, -7, 7, None], pa.int64()), "b": pa.array([2, -2, 3, 3, 1], pa.int64())})
    assert check(sql, {"v": table}) == "compiled"
    zero = pa.table({"a": pa.array([1], pa.int64()), "b": pa.array([0], pa.int64())})
    assert check(sql, {"v": zero}) == "fallback"  # DuckDB raises on a zero divisor


@settings(max_examples=40)
@given(table=tables({"s": (pa.string(), st.one_of(LIKE_STRINGS, st.text(max_size=6))),
                     "a": (pa.int64(), st.one_of(st.integers(-200, 200), st.sampled_from([2**63 - 1, -(2**63)])))}),
       start=st.integers(1, 7), length=st.one_of(st.none(), st.integers(0, 4)),
       target=st.sampled_from(["TINYINT", "SMALLINT", "INTEGER", "BIGINT"]))
def test_substring_and_try_cast_equal_duckdb(table, start, length, target):
    """SUBSTRING counts code points (multibyte text included); TRY_CAST outside the target is NULL."""
    sub = f"SUBSTRING(s, {start}, {length})" if length is not None else f"SUBSTRING(s, {start})"
    check(f"SELECT {sub} AS p, TRY_CAST(a AS {target}) AS t FROM v", {"v": table})
    check(f"SELECT s FROM v WHERE {sub} IN ('a', 'ab', 'ß', '')", {"v": table})


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(data=decimal_tables())
def test_union_all_of_different_types_equals_duckdb(data):
    """UNION ALL casts each column to the common type (decimals of different widths, integers, DOUBLE)."""
    table, _, _ = data
    check("SELECT a AS r, i AS s, CAST(NULL AS TEXT) AS t FROM d UNION ALL SELECT b, a, CAST(NULL AS TEXT) FROM d",
          {"d": table})
    check("SELECT a AS r, k AS s FROM d UNION ALL SELECT x, i FROM d", {"d": table})
    check("SELECT a FROM d WHERE a <= 1 + 10 AND i < 2 * 3", {"d": table})


@settings(max_examples=40)
@given(table=tables({"x": (pa.float64(), st.one_of(DOUBLES, st.integers(-10**6, 10**6).map(lambda n: n / 1000),
                                                   st.integers(-10**5, 10**5).map(lambda n: n / 8 + 0.005)))}),
       width=WIDTHS)
def test_double_to_decimal_rounds_as_duckdb(table, width):
    """DOUBLE -> DECIMAL(p,s): round(x * 10^s) half away from zero, in doubles (2.675 -> 2.68, 0.285 -> 0.28)."""
    p, s = width
    check(f"SELECT CAST(x AS DECIMAL({p}, {s})) AS r FROM v", {"v": table})
