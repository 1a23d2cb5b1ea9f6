"""Key codes hashed in numpy (storage/keys.py) against DuckDB's notion of equal keys.

The contract indexes rely on: two rows whose key columns are equal as
DuckDB's GROUP BY compares them (NULL = NULL, NaN = NaN, -0.0 = 0.0) get the
same code, whatever the Arrow layout (chunks, slices, integer width, string
flavour). Different keys may collide (lookups re-check them), but on random
rows they should not: a collision there means a weak hash.
"""

from __future__ import annotations

import decimal

import duckdb
import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from ivm.execute import duck
from storage.keys import BYTES_PER_PASS, KeyCoder, hash_columns, hashable

INTS = st.one_of(st.integers(-3, 3), st.sampled_from([-(2**63), 2**63 - 1, 2**31, -(2**31) - 1]))
DOUBLES = st.one_of(st.sampled_from([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5, -1.5]),
                    st.floats(allow_nan=True, width=64))
STRINGS = st.one_of(st.sampled_from(["", "a", "ab", "ba", "a\x00", "straße", "é" * 40]), st.text(max_size=12))
DECIMALS = st.decimals(min_value=-(10**15), max_value=10**15, places=2, allow_nan=False, allow_infinity=False)
COLUMNS = {
    "i": (pa.int64(), INTS),
    "d": (pa.float64(), DOUBLES),
    "s": (pa.string(), STRINGS),
    "m": (pa.decimal128(18, 2), DECIMALS),
    "b": (pa.bool_(), st.booleans()),
    "t": (pa.date32(), st.integers(-1000, 1000)),
}


@st.composite
def keyed_rows(draw):
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(1, 25))
    data = {}
    for name in names:
        type_, values = COLUMNS[name]
        column = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        if pa.types.is_date(type_):
            column = [None if v is None else np.datetime64(v, "D").astype(object) for v in column]
        data[name] = pa.array(column, type_)
    table = pa.table(data)
    again = draw(st.lists(st.integers(0, n - 1), max_size=n))  # rows repeated: groups of several rows
    return pa.concat_tables([table, table.take(pa.array(again, pa.int64()))]).combine_chunks()


def duckdb_groups(table: pa.Table) -> np.ndarray:
    """For each row, the number of its group when DuckDB groups the rows by every column."""
    names = ", ".join(f'"{n}"' for n in table.column_names)
    con = duckdb.connect()
    con.register("t", table.append_column("__row", pa.array(np.arange(table.num_rows))))
    rows = con.sql(f"SELECT __row, DENSE_RANK() OVER (ORDER BY {names}) FROM t").fetchall()
    groups = np.empty(table.num_rows, np.int64)
    for row, group in rows:
        groups[row] = group
    return groups


@given(keyed_rows())
def test_rows_duckdb_groups_together_share_a_code_and_others_do_not(table):
    codes = hash_columns([table.column(n) for n in table.column_names])
    groups = duckdb_groups(table)
    for group in np.unique(groups):
        assert len(set(codes[groups == group])) == 1, f"rows of one group have several codes: {table}"
    assert len(set(codes)) == len(np.unique(groups)), "different keys collided on random rows"


@given(keyed_rows(), st.integers(0, 5))
def test_codes_do_not_depend_on_the_layout(table, cut):
    names = table.column_names
    want = hash_columns([table.column(n) for n in names])
    cut = min(cut, table.num_rows)
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    assert np.array_equal(hash_columns([chunked.column(n) for n in names]), want)
    assert np.array_equal(hash_columns([table.column(n).combine_chunks().slice(cut) for n in names]), want[cut:])
    wider = [table.column(n).cast(_other_layout(table.schema.field(n).type)) for n in names]
    assert np.array_equal(hash_columns(wider), want)


def _other_layout(t: pa.DataType) -> pa.DataType:
    """A type holding the same values, laid out differently."""
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_decimal(t):
        return pa.decimal128(30, t.scale)
    return t


def test_integer_widths_and_string_flavours_share_codes():
    values = [-1, 0, 7, None]
    ints = [pa.array(values, t) for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64())]
    want = hash_columns([ints[-1]])
    for array in ints:
        assert np.array_equal(hash_columns([array]), want)
    texts = ["x", None, "", "straße"]
    flavours = [pa.array(texts, t) for t in (pa.string(), pa.large_string(), pa.string_view(), pa.binary())]
    want = hash_columns([flavours[0]])
    for array in flavours:
        assert np.array_equal(hash_columns([array]), want)
    assert np.array_equal(hash_columns([pa.array(texts).dictionary_encode()]), want)
    assert np.array_equal(hash_columns([pa.array([decimal.Decimal("1.50"), None], pa.decimal128(5, 2))]),
                          hash_columns([pa.array([decimal.Decimal("1.50"), None], pa.decimal128(38, 2))]))


def test_strings_longer_than_one_pass_are_hashed_whole(monkeypatch):
    from storage import keys

    monkeypatch.setattr(keys, "BYTES_PER_PASS", 8)
    texts = pa.array(["abcdefghijkl", "abcdefghijkm", "", "x" * 30, "ab"])
    small = hash_columns([texts])
    monkeypatch.setattr(keys, "BYTES_PER_PASS", BYTES_PER_PASS)
    assert np.array_equal(small, hash_columns([texts]))
    assert len(set(small)) == len(texts)


def test_types_numpy_does_not_hash_go_to_duckdb():
    assert not hashable(pa.month_day_nano_interval()) and not hashable(pa.list_(pa.int64()))
    runner = duck.Runner(duckdb.connect())
    statements = []

    def run(template, **inputs):  # noqa: ANN001, ANN003, ANN202
        statements.append(template)
        return runner.run(template, **inputs)
    table = pa.table({"k": pa.array([[1], [1], [2]]), "i": [1, 1, 1]})
    codes = KeyCoder(run).codes(table, ["k", "i"])
    assert statements and codes[0] == codes[1] != codes[2]


def test_repeated_strings_hash_as_distinct_ones_do():
    """Long columns hash each distinct value once (a dictionary); short ones every value: the same codes."""
    texts = pa.array((["nation_1", None, "", "BUILDING", "nation_1"] * 20))
    whole = hash_columns([texts])
    assert np.array_equal(whole, np.concatenate([hash_columns([texts.slice(i, 5)]) for i in range(0, 100, 5)]))
