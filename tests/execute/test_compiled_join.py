"""Compiled joins, EXISTS, UNION ALL and CTEs (ivm/execute/compiled/relational.py) against DuckDB.

INNER and LEFT equi-joins on one or two keys with ``=`` (NULL keys never
match) and ``IS NOT DISTINCT FROM`` (NULL matches NULL); keys of INTEGER
against BIGINT and DOUBLE (NaN matches NaN, -0.0 matches 0.0); [NOT]
EXISTS correlated by equalities; the state-merge shape of delta programs
(a delta LEFT JOINed to looked-up state, COALESCE of old and new counts).
"""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.compiled_check import LEFT, RIGHT, SMALL_INTS, check, tables

CONDITIONS = st.sampled_from([
    "l.k = r.k", "l.k IS NOT DISTINCT FROM r.k", "l.k = r.k AND l.s = r.s",
    "l.s IS NOT DISTINCT FROM r.s AND l.k IS NOT DISTINCT FROM r.k", "l.f = r.f", "l.f IS NOT DISTINCT FROM r.f",
    "l.k = r.v",
])


@settings(max_examples=60)
@given(left=tables(LEFT), right=tables(RIGHT), on=CONDITIONS, side=st.sampled_from(["", "LEFT "]))
def test_join_equals_duckdb(left, right, on, side):
    check(f"SELECT l.k, l.s, l.w, r.v, r.f AS rf FROM l {side}JOIN r ON {on}", {"l": left, "r": right})
    check(f"SELECT * FROM l AS l {side}JOIN r AS r ON {on}", {"l": left, "r": right})


@settings(max_examples=40)
@given(left=tables(LEFT), right=tables(RIGHT), on=CONDITIONS, anti=st.booleans())
def test_exists_equals_duckdb(left, right, on, anti):
    check(f"SELECT l.k, l.s FROM l WHERE {'NOT ' if anti else ''}EXISTS (SELECT 1 FROM r WHERE {on} AND r.v > 0)",
          {"l": left, "r": right})


@settings(max_examples=40)
@given(delta=tables(LEFT), state=tables(RIGHT))
def test_state_merge_shape_equals_duckdb(delta, state):
    check("""WITH d AS (SELECT k, SUM(w) AS w FROM delta GROUP BY k)
             SELECT d.k, CAST(COALESCE(o.v, 0) + d.w AS BIGINT) AS n, (COALESCE(o.v, 0) + d.w) > 0 AS keep, o.v IS NULL AS fresh
             FROM d LEFT JOIN state AS o ON d.k IS NOT DISTINCT FROM o.k
             UNION ALL SELECT CAST(o.k AS BIGINT), o.v, TRUE, FALSE FROM state AS o WHERE o.v < 0""",
          {"delta": delta, "state": state})


def test_union_all_and_key_types():
    left = pa.table({"k": pa.array([1, None, 3], pa.int64()), "f": pa.array([-0.0, float("nan"), 1.0])})
    right = pa.table({"k": pa.array([1, None, 1], pa.int32()), "f": pa.array([0.0, float("nan"), 2.0])})
    data = {"l": left, "r": right}
    assert check("SELECT l.k, r.k AS rk FROM l JOIN r ON l.k = r.k", data) == "compiled"
    assert check("SELECT l.k, r.k AS rk FROM l LEFT JOIN r ON l.k IS NOT DISTINCT FROM r.k", data) == "compiled"
    assert check("SELECT l.f, r.f AS rf FROM l JOIN r ON l.f = r.f", data) == "compiled"
    assert check("SELECT k FROM l UNION ALL SELECT k FROM l", data) == "compiled"
    assert check("SELECT l.k, r.f FROM l CROSS JOIN r WHERE l.k = r.k AND r.f > 0", data) == "compiled"


# Keys of several integer-held columns are coded per column by their offset from the least value
# (kernels._offset_codes) when they span at most 2^31, and sorted into dense codes when wider:
# both kinds mix in one key, with NULLs, int64's extremes, dates and decimals.
WIDE_KEYS = {"a": (pa.int64(), st.one_of(SMALL_INTS, st.sampled_from([-(2**63), 2**63 - 1, 2**31, -(2**31)]))),
             "d": (pa.date32(), st.sampled_from([0, 1, 19000, -1]).map(lambda x: datetime.date(1970, 1, 1)
                                                                        + datetime.timedelta(days=x))),
             "m": (pa.decimal128(15, 2), st.sampled_from(["0.00", "-0.01", "12.50", "9999999999999.99"]).map(
                 decimal.Decimal)),
             "w": (pa.int64(), SMALL_INTS)}


@settings(max_examples=40)
@given(left=tables(WIDE_KEYS), right=tables(WIDE_KEYS), side=st.sampled_from(["", "LEFT "]),
       null_safe=st.booleans())
def test_keys_of_several_integer_columns_narrow_and_wide(left, right, side, null_safe):
    eq = "IS NOT DISTINCT FROM" if null_safe else "="
    on = " AND ".join(f"l.{c} {eq} r.{c}" for c in ("a", "d", "m"))
    check(f"SELECT l.a, l.d, l.m, l.w, r.w AS rw FROM l {side}JOIN r ON {on}", {"l": left, "r": right})
    check("SELECT a, d, m, COUNT(*) AS n, SUM(w) AS s FROM l GROUP BY a, d, m", {"l": left})
