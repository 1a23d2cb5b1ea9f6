"""Compiled GROUP BY with COUNT/SUM/MIN/MAX, HAVING and DISTINCT (ivm/execute/compiled/relational.py) against DuckDB.

Keys and values with NULLs, NaN, +-inf, -0.0, int64 extremes and
duplicates; empty inputs; global aggregates (one row, also over no rows);
the consolidation shape delta programs use (group by every column, sum the
weights, drop zeros). DOUBLE sums are compared within the shadow
tolerance (step.same_rows): DuckDB adds in another order.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.compiled_check import DOUBLES, INTS, SMALL_INTS, STRINGS, check, tables

COLUMNS = {"k": (pa.int64(), SMALL_INTS), "g": (pa.string(), STRINGS), "f": (pa.float64(), DOUBLES),
           "a": (pa.int64(), INTS), "i": (pa.int32(), SMALL_INTS), "x": (pa.float64(), DOUBLES),
           "w": (pa.int64(), SMALL_INTS)}
KEYS = st.sampled_from(["k", "g", "k, g", "f", "g, f, k", "i"])
CALLS = st.lists(st.sampled_from(["COUNT(*)", "COUNT(x)", "COUNT(g)", "SUM(a)", "SUM(i)", "SUM(x)", "MIN(a)", "MAX(a)",
                                  "MIN(x)", "MAX(x)", "MIN(i)", "SUM(w)", "SUM(CASE WHEN ISFINITE(x) THEN x * w ELSE 0 END)",
                                  "COALESCE(SUM(w), 0)"]), min_size=1, max_size=4, unique=True)


@settings(max_examples=60)
@given(table=tables(COLUMNS), keys=KEYS, calls=CALLS, having=st.booleans())
def test_group_by_equals_duckdb(table, keys, calls, having):
    select = ", ".join(f"{c} AS c{n}" for n, c in enumerate(calls))
    sql = f"SELECT {keys}, {select} FROM d GROUP BY {keys}"
    if having:
        sql += " HAVING SUM(w) <> 0"
    check(sql, {"d": table})


@settings(max_examples=40)
@given(table=tables(COLUMNS), calls=CALLS)
def test_global_aggregate_equals_duckdb(table, calls):
    select = ", ".join(f"{c} AS c{n}" for n, c in enumerate(calls))
    check(f"SELECT {select} FROM d", {"d": table})


@settings(max_examples=40)
@given(table=tables(COLUMNS, max_rows=20))
def test_consolidation_and_distinct_equal_duckdb(table):
    check("SELECT k, g, i, SUM(w) AS __weight FROM d GROUP BY k, g, i HAVING SUM(w) <> 0", {"d": table})
    check("SELECT DISTINCT k, g FROM d", {"d": table})


def test_empty_and_special_groups():
    empty = pa.table({"k": pa.array([], pa.int64()), "x": pa.array([], pa.float64())})
    assert check("SELECT COUNT(*) AS n, SUM(x) AS s, MAX(x) AS m FROM d", {"d": empty}) == "compiled"
    assert check("SELECT k, COUNT(*) AS n FROM d GROUP BY k", {"d": empty}) == "compiled"
    nan = pa.table({"k": pa.array([1, 1, 2, None, None], pa.int64()),
                    "x": pa.array([float("nan"), 1.0, float("nan"), None, 3.0], pa.float64())})
    assert check("SELECT k, MIN(x) AS lo, MAX(x) AS hi, COUNT(x) AS n FROM d GROUP BY k", {"d": nan}) == "compiled"
    assert check("SELECT x, COUNT(*) AS n FROM d GROUP BY x", {"d": nan}) == "compiled"  # NaNs group together
    zeros = pa.table({"x": pa.array([0.0, -0.0], pa.float64())})
    assert check("SELECT x, COUNT(*) AS n FROM d GROUP BY x", {"d": zeros}) == "fallback"
    huge = pa.table({"a": pa.array([2**62, 2**62, 2**62], pa.int64())})
    assert check("SELECT SUM(a) AS s FROM d", {"d": huge}) == "fallback"  # HUGEINT beyond BIGINT


def test_a_sum_holding_the_smallest_bigint_falls_back():
    """numpy's abs(-2**63) is -2**63: the overflow guard must not read it as a small value."""
    import numpy as np
    import pytest

    from ivm.execute.compiled.kernels import group_sum
    from ivm.execute.compiled.vectors import Fallback

    data = np.array([-(2**63), -1], np.int64)
    with pytest.raises(Fallback):
        group_sum(data, None, np.arange(2), np.array([0]))
