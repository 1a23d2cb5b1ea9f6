"""The driver-side MIN/MAX rescan (ivm/execute/compiled/extremes.py) against DuckDB running the rescan's SQL.

Random probes and old states with NULL keys, NULL values, NaN, -0.0 and 0.0,
infinities, duplicate deleted rows, groups missing from the old state, one or
two extremes per group; every type the operator claims. Also what it refuses
(so the general compiled step runs) and what it hands to DuckDB.
"""

from __future__ import annotations

import datetime
import decimal

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from delta_operators.program import Guard
from storage.zset import WEIGHT
from ivm.execute.compiled.extremes import DeletedExtremes
from ivm.execute.compiled.vectors import Fallback, Unsupported

GUARD = Guard(probe="n_in", column="__v", values="o_in", value_columns=("__m0", "__m1"), keys=("k",),
              result="__rescan")
SQL = """SELECT DISTINCT n.k AS k, TRUE AS __rescan FROM n_in AS n
         JOIN o_in AS o ON n.k IS NOT DISTINCT FROM o.k
         WHERE n.__weight <= 0 AND (n.__v = o.__m0 OR n.__v = o.__m1)"""

VALUES = {
    "double": (pa.float64(), st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.0, float("nan"),
                                                                     float("inf"), float("-inf")]))),
    "bigint": (pa.int64(), st.one_of(st.none(), st.integers(-3, 3), st.just(2**63 - 1))),
    "decimal": (pa.decimal128(18, 2), st.one_of(st.none(), st.sampled_from(
        [decimal.Decimal("1.50"), decimal.Decimal("-0.01"), decimal.Decimal("9999999999999999.99")]))),
    "varchar": (pa.string(), st.one_of(st.none(), st.sampled_from(["", "a", "b", "é"]))),
    "date": (pa.date32(), st.one_of(st.none(), st.sampled_from([datetime.date(2024, 1, 1), datetime.date(1, 1, 1)]))),
}
KEYS = st.one_of(st.none(), st.integers(-2, 4))


def duckdb_rows(probe: pa.Table, old: pa.Table) -> list:
    con = duckdb.connect()
    con.register("n_in", probe)
    con.register("o_in", old)
    return sorted(con.sql(SQL).fetchall(), key=repr)


def ours(probe: pa.Table, old: pa.Table) -> list:
    schema = pa.schema([pa.field("k", probe.schema.field("k").type), pa.field("__rescan", pa.bool_())])
    step = DeletedExtremes(GUARD, {"n_in": probe.schema, "o_in": old.schema}, schema)
    assert step.fits({"n_in": probe, "o_in": old})
    result = step.run({"n_in": probe, "o_in": old})
    assert result.schema.equals(schema)
    return sorted([tuple(r.values()) for r in result.to_pylist()], key=repr)


@st.composite
def case(draw):
    kind = draw(st.sampled_from(sorted(VALUES)))
    type_, values = VALUES[kind]
    n = draw(st.integers(0, 12))
    probe = pa.table({
        "k": pa.array([draw(KEYS) for _ in range(n)], pa.int64()),
        "__v": pa.array([draw(values) for _ in range(n)], type_),
        WEIGHT: pa.array([draw(st.sampled_from([-2, -1, 0, 1])) for _ in range(n)], pa.int64()),
    })
    groups = draw(st.lists(KEYS, unique=True, max_size=6))  # the old state: one row per group
    old = pa.table({
        "k": pa.array(groups, pa.int64()),
        "__m0": pa.array([draw(values) for _ in groups], type_),
        "__m1": pa.array([draw(values) for _ in groups], type_),
    })
    return probe, old


@settings(max_examples=150, deadline=None)
@given(case())
def test_the_rescan_finds_what_duckdb_finds(data):
    probe, old = data
    assert ours(probe, old) == duckdb_rows(probe, old)


def test_signed_zeros_nan_and_nulls_compare_as_in_duckdb():
    probe = pa.table({"k": pa.array([1, 2, 3, None, 5, 5], pa.int64()),
                      "__v": pa.array([-0.0, float("nan"), None, 1.0, 2.0, 2.0]),
                      WEIGHT: pa.array([-1, -1, -1, -1, 0, -1], pa.int64())})
    old = pa.table({"k": pa.array([1, 2, 3, None, 5], pa.int64()),
                    "__m0": pa.array([0.0, float("nan"), None, 1.0, 2.0]), "__m1": pa.array([None] * 5, pa.float64())})
    assert ours(probe, old) == duckdb_rows(probe, old) == [(1, True), (2, True), (5, True), (None, True)]


def test_a_group_twice_in_the_old_state_goes_to_duckdb():
    probe = pa.table({"k": pa.array([1], pa.int64()), "__v": pa.array([1.0]), WEIGHT: pa.array([-1], pa.int64())})
    old = pa.table({"k": pa.array([1, 1], pa.int64()), "__m0": pa.array([1.0, 2.0]), "__m1": pa.array([1.0, 2.0])})
    with pytest.raises(Fallback, match="twice"):
        ours(probe, old)


@pytest.mark.parametrize("change", ["two keys", "string key", "mixed value types", "no result column"])
def test_what_it_cannot_compute_exactly_is_left_to_the_general_step(change):
    probe = pa.schema([("k", pa.int64()), ("j", pa.int64()), ("s", pa.string()), ("__v", pa.float64()),
                       (WEIGHT, pa.int64())])
    old = pa.schema([("k", pa.int64()), ("j", pa.int64()), ("s", pa.string()), ("__m0", pa.float64()),
                     ("__m1", pa.int64())])
    guard = {"two keys": Guard("n_in", "__v", "o_in", ("__m0",), ("k", "j"), "__rescan"),
             "string key": Guard("n_in", "__v", "o_in", ("__m0",), ("s",), "__rescan"),
             "mixed value types": Guard("n_in", "__v", "o_in", ("__m0", "__m1"), ("k",), "__rescan"),
             "no result column": Guard("n_in", "__v", "o_in", ("__m0",), ("k",))}[change]
    expected = pa.schema([("k", pa.int64()), ("__rescan", pa.bool_())])
    with pytest.raises(Unsupported):
        DeletedExtremes(guard, {"n_in": probe, "o_in": old}, expected)


def test_a_max_view_rescans_by_the_driver_side_operator(monkeypatch):
    """In the engine, with shadow runs on: per-customer MAX with deletes of the current MAX; the rescan
    step runs as DeletedExtremes and the view equals its recompute after every batch."""
    monkeypatch.setenv("IVM_SHADOW", "1")
    db = ivm.connect()
    db.execute("CREATE TABLE o (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)")
    db.execute("INSERT INTO o SELECT i, i % 5, (i * 7) % 11 FROM range(60) r(i)")
    body = "SELECT cust, COUNT(*) AS n, MAX(amount) AS top, MIN(amount) AS low FROM o GROUP BY cust"
    db.execute(f"CREATE MATERIALIZED VIEW v AS {body}")
    for step in range(8):
        db.execute(f"DELETE FROM o WHERE amount = (SELECT MAX(amount) FROM o WHERE cust = {step % 5}) "
                   f"AND cust = {step % 5}")
        db.execute(f"INSERT INTO o VALUES ({100 + step}, {step % 3}, {step * 1.5})")
        got = sorted(db.sql("SELECT * FROM v").to_pylist(), key=repr)
        assert got == sorted(db.sql(body).to_pylist(), key=repr)
    explained = "\n".join(str(r) for r in db.sql("EXPLAIN v").to_pylist())
    assert DeletedExtremes.label in explained
    counts = db._engine.step_counts()
    assert counts["mismatch"] == 0 and counts["shadowed"] > 0
