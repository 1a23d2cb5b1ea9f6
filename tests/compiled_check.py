"""Shared by the tests/test_compiled_*.py suites: random inputs and the compiled-vs-DuckDB check."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from sqlglot import parse_one

from ivm.execute.compiled.step import CompiledStep, Fallback, Unsupported, same_rows

INT64 = (-(2**63), 2**63 - 1)
INTS = st.one_of(st.integers(-5, 5), st.sampled_from([INT64[0], INT64[1], 2**31 - 1, -(2**31), 2**62, 0]),
                 st.integers(*INT64))
SMALL_INTS = st.integers(-3, 3)
DOUBLES = st.one_of(st.sampled_from([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -2.5, 1e308]),
                    st.floats(-1e6, 1e6, allow_nan=False), st.integers(-3, 3).map(float))
STRINGS = st.sampled_from(["", "a", "b", "ab", "straße", "B"])


def column(values, nulls: bool = True):
    """A hypothesis list of values (or NULLs) of one column."""
    return values if not nulls else st.one_of(st.none(), values, values)


@st.composite
def tables(draw, columns: dict[str, tuple[pa.DataType, st.SearchStrategy]], max_rows: int = 12):
    n = draw(st.integers(0, max_rows))
    return pa.table({name: pa.array([draw(column(values)) for _ in range(n)], t)
                     for name, (t, values) in columns.items()})


# The two sides of the join suites: keys of different integer widths, strings, doubles (NaN, -0.0).
LEFT = {"k": (pa.int64(), SMALL_INTS), "s": (pa.string(), STRINGS), "f": (pa.float64(), DOUBLES),
        "w": (pa.int64(), SMALL_INTS)}
RIGHT = {"k": (pa.int32(), SMALL_INTS), "s": (pa.string(), STRINGS), "f": (pa.float64(), DOUBLES),
         "v": (pa.int64(), SMALL_INTS)}


def check(sql: str, inputs: dict[str, pa.Table]) -> str:
    """Run ``sql`` on DuckDB and compiled; assert they agree. Returns 'compiled', 'fallback' or 'duckdb error'.

    Unsupported is a test failure: the suites only send shapes the compiled set claims. Where DuckDB
    raises (an overflow), the compiled step must hand the batch back (Fallback), never return rows.
    """
    con = duckdb.connect()
    for name, table in inputs.items():
        con.register(name, table)
    tree = parse_one(sql, read="duckdb")
    try:
        theirs = con.sql(sql).to_arrow_table()
    except duckdb.Error:
        theirs = None
    schema = theirs.schema if theirs is not None else con.sql(f"SELECT * FROM ({sql}) LIMIT 0").to_arrow_table().schema \
        if _binds(con, sql) else None
    if schema is None:
        return "duckdb error"
    try:
        step = CompiledStep(tree, {n: t.schema for n, t in inputs.items()}, schema)
    except Unsupported as e:
        raise AssertionError(f"not compiled: {e}\n{sql}") from None
    try:
        ours = step.run(inputs)
    except Fallback:
        return "fallback"
    assert theirs is not None, f"DuckDB raised but the compiled step returned rows:\n{sql}\n{ours.to_pylist()}"
    difference = same_rows(ours, theirs)
    assert difference is None, f"{difference}\n{sql}\nours {ours.to_pylist()}\ntheirs {theirs.to_pylist()}"
    return "compiled"


def _binds(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    try:
        con.sql(f"SELECT * FROM ({sql}) LIMIT 0").to_arrow_table()
        return True
    except duckdb.Error:
        return False


def ran(outcomes: list[str]) -> None:
    """After a suite: a good share of the examples ran compiled (a suite where everything falls back
    tests nothing).

    A third, not a half: even derandomized, Hypothesis mixes constants it finds in the source of
    loaded modules into what it draws, so the examples depend on what the worker imported before.
    The random expressions ran 38 of 40 compiled alone and 19 of 40 in a full run (more integers
    at the edges of BIGINT, whose overflow hands a batch back to DuckDB).
    """
    assert outcomes.count("compiled") >= len(outcomes) // 3, outcomes


__all__ = ["DOUBLES", "INTS", "LEFT", "RIGHT", "SMALL_INTS", "STRINGS", "check", "column", "np", "ran", "tables"]
