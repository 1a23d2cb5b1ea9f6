"""Compiled scalar expressions (ivm/execute/compiled/expressions.py) against DuckDB on random rows.

Random expression trees over BIGINT, INTEGER, DOUBLE, BOOLEAN and VARCHAR
columns with NULLs and extreme values (int64 min/max, NaN, +-inf, -0.0):
arithmetic (``/`` included), comparisons, three-valued logic, IS [NOT] DISTINCT FROM, CASE,
COALESCE, GREATEST/LEAST, casts, ISNAN/ISFINITE. Each runs on DuckDB and
compiled; the rows and types must be the same, and where DuckDB raises (an
overflow) the compiled step must fall back rather than return rows.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.compiled_check import DOUBLES, INTS, SMALL_INTS, STRINGS, check, ran, tables

COLUMNS = {"a": (pa.int64(), INTS), "b": (pa.int64(), SMALL_INTS), "i": (pa.int32(), SMALL_INTS),
       "x": (pa.float64(), DOUBLES), "y": (pa.float64(), DOUBLES), "p": (pa.bool_(), st.booleans()),
       "q": (pa.bool_(), st.booleans()), "s": (pa.string(), STRINGS), "t": (pa.string(), STRINGS)}

LITERALS = st.sampled_from(["0", "1", "-2", "3", "NULL", "2147483647"])
NUMBER_COLUMNS = st.sampled_from(["a", "b", "i", "x", "y"])


NUMBERS = st.deferred(lambda: st.one_of(
    NUMBER_COLUMNS, NUMBER_COLUMNS, NUMBER_COLUMNS,
    st.tuples(NUMBERS, st.sampled_from(["+", "-", "*", "/"]), st.one_of(NUMBERS, LITERALS))
      .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    NUMBERS.map(lambda e: f"(-{e})"),
    st.tuples(BOOLEANS, NUMBERS, st.one_of(NUMBERS, LITERALS))
      .map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    st.tuples(NUMBERS, st.one_of(NUMBERS, LITERALS)).map(lambda t: f"COALESCE({t[0]}, {t[1]})"),
    st.tuples(st.sampled_from(["GREATEST", "LEAST"]), NUMBERS, NUMBERS)
      .map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
    st.tuples(NUMBERS, st.sampled_from(["BIGINT", "DOUBLE", "INTEGER", "SMALLINT"]))
      .map(lambda t: f"CAST({t[0]} AS {t[1]})"),
))


BOOLEANS = st.deferred(lambda: st.one_of(
    st.sampled_from(["p", "q", "(s = t)", "(s <> t)", "(s IS NOT DISTINCT FROM t)", "(s < t)", "(s >= t)",
                     "(s > 'ab')", "(s <= t)", "(s = 'a')", "('b' <> s)", "(s IN ('a', 'ab', 'straße'))",
                     "(s NOT IN ('', 'B'))", "(s IN ('a', NULL))", "ISNAN(x)", "ISFINITE(y)",
                     "(x = y)", "(x < y)", "(p = q)", "(p < q)"]),
    st.tuples(NUMBERS, st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM",
                                          "IS NOT DISTINCT FROM"]), st.one_of(NUMBERS, LITERALS))
      .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.tuples(BOOLEANS, st.sampled_from(["AND", "OR"]), BOOLEANS).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    BOOLEANS.map(lambda e: f"(NOT {e})"),
    NUMBERS.map(lambda e: f"({e} IS NULL)"),
    NUMBERS.map(lambda e: f"(NOT ({e} IS NULL))"),
))


# tables() filters drawn rows (unique keys); which draws it discards depends on the constants
# hypothesis mixes in from loaded modules, so its filter health check failed once new modules
# were imported (7 kept of 57), as the guard below already allows for.
@settings(max_examples=60, suppress_health_check=[HealthCheck.filter_too_much])
@given(table=tables(COLUMNS), number=NUMBERS, condition=BOOLEANS)
def test_expressions_equal_duckdb(table, number, condition):
    check(f"SELECT {number} AS r, {condition} AS c FROM d", {"d": table})
    check(f"SELECT a, x, s FROM d WHERE {condition}", {"d": table})


def test_most_random_expressions_run_compiled():
    """Guard against a suite that passes because everything falls back."""
    outcomes = []

    @settings(max_examples=40, derandomize=True,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(table=tables(COLUMNS), number=NUMBERS, condition=BOOLEANS)
    def run(table, number, condition):
        outcomes.append(check(f"SELECT {number} AS r, {condition} AS c FROM d", {"d": table}))

    run()
    ran([o for o in outcomes if o != "duckdb error"])


def test_extremes_fall_back_where_duckdb_raises():
    table = pa.table({"a": pa.array([2**63 - 1, 1], pa.int64()), "i": pa.array([2**31 - 1, None], pa.int32()),
                      "x": pa.array([float("nan"), 1e300], pa.float64())})
    assert check("SELECT a + 1 AS r FROM d", {"d": table}) == "fallback"
    assert check("SELECT i + i AS r FROM d", {"d": table}) == "fallback"
    assert check("SELECT CAST(x AS BIGINT) AS r FROM d", {"d": table}) == "fallback"
    assert check("SELECT a / (a - a) AS r FROM d", {"d": table}) == "fallback"  # x / 0: DuckDB's infinities
    assert check("SELECT a / 2 AS r, i / a AS s FROM d", {"d": table}) == "compiled"
    assert check("SELECT -a AS r, a - 1 AS s FROM d", {"d": table}) == "compiled"
    assert check("SELECT x = x AS r, x * x AS s FROM d", {"d": table}) == "compiled"  # NaN = NaN; inf


def test_strings_order_by_their_bytes_as_in_duckdb():
    """DuckDB's default collation orders VARCHAR by UTF-8 bytes (a prefix first, 'B' < 'a' < 'ä'), as Arrow does."""
    words = ["", "a", "B", "ab", "a\x00", "a\x00b", "é", "e\u0301", "ä", "z", "Z", None]
    pairs = [(x, y) for x in words for y in words]
    table = pa.table({"s": pa.array([x for x, _ in pairs], pa.string()), "t": pa.array([y for _, y in pairs], pa.string())})
    assert check("SELECT s < t AS lt, s <= t AS le, s > t AS gt, s >= t AS ge, s > 'a' AS lit FROM d",
                 {"d": table}) == "compiled"


def test_rounding_and_nan_order_are_duckdbs():
    table = pa.table({"x": pa.array([2.5, 3.5, -2.5, 0.5, float("nan"), None, -0.0], pa.float64()),
                      "y": pa.array([1.0, float("nan"), 0.0, float("inf"), float("nan"), 2.0, 0.0], pa.float64())})
    assert check("SELECT CAST(x AS BIGINT) AS r FROM d WHERE ISFINITE(x)", {"d": table}) == "compiled"
    assert check("SELECT x < y AS lt, x = y AS eq, x >= y AS ge, GREATEST(x, y) AS g FROM d WHERE NOT x = 0",
                 {"d": table}) == "compiled"
