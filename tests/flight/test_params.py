"""Binding parameters into SQL text (flight_server/params.py), checked by running the bound text in DuckDB."""

import datetime
import decimal

import duckdb
import pyarrow as pa
import pytest

from flight_server import params
from sql_frontend.errors import BindError, SqlSyntaxError


def run(sql: str, *values, types=None) -> list[tuple]:
    arrays = [pa.array([v], types[i] if types else None) for i, v in enumerate(values)]
    row = pa.record_batch(arrays, names=[str(i) for i in range(len(values))])
    return duckdb.sql(params.bind(sql, row, 0)).fetchall()


def test_a_negative_value_after_a_minus_is_not_a_comment():
    assert run("SELECT 1-?", -5) == [(6,)]
    assert run("SELECT ?-1", -5) == [(-6,)]
    assert run("SELECT 2*?/?", -4, -2) == [(4.0,)]


def test_dollar_parameters_may_repeat_and_come_in_any_order():
    assert run("SELECT $2 - $1, $1 + $1", 3, 10) == [(7, 6)]


def test_placeholders_inside_strings_comments_and_dollar_quotes_stay_text():
    assert run("SELECT '?' AS a, $$x?$$ AS b, ? AS c -- ?\n", "it's") == [("?", "x?", "it's")]
    assert run("SELECT /* ? */ ?", 7) == [(7,)]


def test_values_keep_their_types():
    day = datetime.date(2024, 2, 29)
    moment = datetime.datetime(2024, 1, 2, 3, 4, 5, 678901)
    got = run("SELECT ?, ?, ?, ?, ?, ?, ?, ?", 1.5, True, None, b"\x00'", decimal.Decimal("12.30"), day, moment,
              float("nan"), types=[pa.float64(), pa.bool_(), pa.int64(), pa.binary(), pa.decimal128(5, 2),
                                   pa.date32(), pa.timestamp("us"), pa.float64()])
    assert got[0][:7] == (1.5, True, None, b"\x00'", decimal.Decimal("12.30"), day, moment)
    assert got[0][7] != got[0][7]  # NaN
    assert duckdb.sql(params.bind("SELECT typeof(?)", pa.record_batch([pa.array([1.0])], names=["0"]), 0)
                      ).fetchall() == [("DOUBLE",)]


def test_limit_and_in_lists_take_parameters():
    assert run("SELECT * FROM range(10) LIMIT ?", 3) == [(0,), (1,), (2,)]
    assert run("SELECT 4 IN (?, ?)", 1, 4) == [(True,)]


def test_wrong_arity_and_mixed_styles_are_errors():
    row = pa.record_batch([pa.array([1])], names=["0"])
    with pytest.raises(BindError, match="takes 2 parameter"):
        params.bind("SELECT ?, ?", row, 0)
    with pytest.raises(BindError, match=r"parameter \$0 has no value"):
        params.bind("SELECT $0, $1", row, 0)
    with pytest.raises(SqlSyntaxError, match="either"):
        params.bind("SELECT ?, $1", row, 0)
    with pytest.raises(SqlSyntaxError, match="syntax error"):
        params.bind("SELECT (?", row, 0)


def test_count_needs_no_parse():
    assert params.count("SELECT ?, '?', ?") == 2
    assert params.count("SELECT $1 + $3") == 3
    assert params.count("CREATE SOURCE s FROM POSTGRES CONNECTION 'x' PUBLICATION 'p'") == 0
