"""ivm.execute.executor.value_range: the bounds a range lookup reads between (a superset of a range condition)."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa

from ivm.execute.executor import value_range


def test_the_same_type_is_compared_exactly():
    low, high = value_range(pa.chunked_array([pa.array([3, 9, 5], pa.int64())]), pa.int64())
    assert (low.as_py(), high.as_py()) == (3, 9)
    days = pa.chunked_array([pa.array([datetime.date(2024, 1, 5), datetime.date(2023, 1, 1)])])
    low, high = value_range(days, pa.date32())
    assert (low.as_py(), high.as_py()) == (datetime.date(2023, 1, 1), datetime.date(2024, 1, 5))
    money = pa.chunked_array([pa.array([decimal.Decimal("1.25"), decimal.Decimal("-2.50")], pa.decimal128(15, 2))])
    low, high = value_range(money, pa.decimal128(15, 2))
    assert (low.as_py(), high.as_py()) == (decimal.Decimal("-2.50"), decimal.Decimal("1.25"))


def test_other_numbers_compare_as_doubles_with_a_margin_for_rounding():
    low, high = value_range(pa.chunked_array([pa.array([1000.5, 1001.5])]), pa.decimal128(15, 2))
    assert low.type == pa.float64() and 1000.5 - 1e-5 < low.as_py() < 1000.5 and 1001.5 < high.as_py() < 1001.5 + 1e-5
    low, high = value_range(pa.chunked_array([pa.array([0.0, float("inf")])]), pa.int32())
    assert low.as_py() < 0.0 and high.as_py() == float("inf")


def test_no_range_when_a_comparison_would_not_decide_by_the_column():
    assert value_range(pa.chunked_array([pa.array([1.0, None])]), pa.float64()) is None  # NULL: the aggregate of nothing
    assert value_range(pa.chunked_array([pa.array([1.0, float("nan")])]), pa.float64()) is None  # NaN sorts above all
    assert value_range(pa.chunked_array([pa.array(["a", "b"])]), pa.string()) is None  # not a number
    assert value_range(pa.chunked_array([pa.array([1.0, 2.0])]), pa.string()) is None
