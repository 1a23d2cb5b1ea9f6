"""The executor's compiled path (ivm/execute/executor.py + ivm/execute/compiled/): which steps run compiled, shadow runs,
fallbacks per batch, and what EXPLAIN and status() say about them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import ivm
from ivm.execute.compiled import step as compiled_step

VIEW = "SELECT cust, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS biggest FROM orders GROUP BY cust"


def _db(view: str = VIEW):
    db = ivm.connect()
    db.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE, qty BIGINT)")
    db.execute(f"CREATE MATERIALIZED VIEW v AS {view}")
    return db


def _batches(db, count: int, start: int = 0, qty: int = 1) -> None:
    rng = np.random.default_rng(7)
    for b in range(count):
        ids = np.arange(start + b * 50, start + b * 50 + 50)
        db.apply_changes("orders", pa.table({"id": ids, "cust": rng.integers(0, 8, 50),
                                             "amount": rng.integers(0, 100, 50) / 4, "qty": np.full(50, qty)}))
        db.apply_changes("orders", pa.table({"id": ids[:10], "cust": ids[:10] * 0, "amount": ids[:10] * 0.0,
                                             "qty": ids[:10] * 0, "__op": ["d"] * 10}))


def _recompute(db, view: str = VIEW) -> list:
    return sorted(db.sql(view.replace("FROM orders", "FROM orders")).to_pylist(), key=str)


def _query_lines(db) -> list[str]:
    lines = db.sql("EXPLAIN v").column(0).to_pylist()
    return [line for line in lines if " := " in line and "lookup" not in line and "-old row" not in line]


def test_the_per_customer_steps_run_compiled_and_explain_says_so():
    db = _db()
    _batches(db, 4)
    steps = _query_lines(db)
    # the projection of the delta (kept: the rescan's guard reads it), per-group change, MAX's
    # rescan test (matched on the driver, ivm/execute/compiled/extremes.py), the state merge (a rescan reads
    # the table by cust: a lookup, no query)
    assert len(steps) == 4 and all("(compiled" in line for line in steps), steps
    # each written out as one generated function (ivm/execute/compiled/generated.py)
    assert sum(line.endswith("(compiled: generated)") for line in steps) == 3, steps
    assert sum("deleted extremes matched on the driver" in line for line in steps) == 1, steps
    counts = db.status()["steps"]
    assert counts["compiled"] >= 3 * 6 and counts["mismatch"] == 0 and counts["shadowed"] >= counts["compiled"]
    assert sorted(db.sql("SELECT * FROM v").to_pylist(), key=str) == _recompute(db)


def test_a_step_outside_the_compiled_set_stays_on_duckdb_and_says_why():
    db = _db("SELECT cust, SUM(qty) AS q FROM orders WHERE abs(qty) > 1 GROUP BY cust")
    _batches(db, 2)
    lines = db.sql("EXPLAIN v").column(0).to_pylist()
    assert any("(duckdb: " in line and "ABS" in line.upper() for line in lines), lines
    assert db.status()["steps"]["duckdb"] > 0


def test_an_overflow_hands_that_batch_to_duckdb(monkeypatch):
    # SUM(CAST(… AS HUGEINT)) keeps the HUGEINT result type (a plain SUM of
    # integers is a BIGINT column: sql_frontend/integer_sums.py).
    db = _db("SELECT cust, SUM(CAST(qty AS HUGEINT)) AS q FROM orders GROUP BY cust")
    _batches(db, 3)
    before = db.status()["steps"]["fallback"]
    _batches(db, 1, start=10_000, qty=2**62)  # a SUM beyond BIGINT: DuckDB's HUGEINT holds it, we do not
    assert db.status()["steps"]["fallback"] > before
    rows = {r["cust"]: r["q"] for r in db.sql("SELECT * FROM v").to_pylist()}
    assert max(rows.values()) > 2**62


def test_without_shadow_mode_a_mismatch_turns_the_step_off(monkeypatch):
    monkeypatch.setenv("IVM_SHADOW", "0")
    real = compiled_step.CompiledStep.run

    def wrong(self, inputs):  # noqa: ANN001, ANN202
        result = real(self, inputs)
        return result.slice(0, max(result.num_rows - 1, 0)) if result.num_rows else result

    db = _db()
    _batches(db, 1)
    monkeypatch.setattr(compiled_step.CompiledStep, "run", wrong)
    _batches(db, 2, start=1_000)
    counts = db.status()["steps"]
    assert counts["mismatch"] > 0
    assert any("shadow run differed" in line for line in _query_lines(db))
    assert sorted(db.sql("SELECT * FROM v").to_pylist(), key=str) == _recompute(db)  # DuckDB's rows were used


def test_shadow_mode_raises_on_a_mismatch(monkeypatch):
    monkeypatch.setenv("IVM_SHADOW", "1")
    db = _db()
    _batches(db, 1)
    monkeypatch.setattr(compiled_step.CompiledStep, "run", lambda self, inputs: self.expected.empty_table())
    with pytest.raises(Exception, match="differs from DuckDB"):
        _batches(db, 1, start=5_000)


def test_the_shadow_comparison_handles_columns_arrow_cannot_sort():
    """Intervals and lists pass through compiled steps (session windows); the comparison must still decide."""
    from ivm.execute.compiled.step import same_rows

    interval = pa.month_day_nano_interval()
    ours = pa.table({"k": [2, 1, 1], "gap": pa.array([(0, 0, 5), (0, 1, 0), None], interval),
                     "l": pa.array([[1], [], None], pa.list_(pa.int64()))})
    same_rows_reordered = ours.take([2, 0, 1])
    assert same_rows(ours, same_rows_reordered) is None
    other = ours.set_column(1, "gap", pa.array([(0, 0, 5), (0, 2, 0), None], interval))
    assert same_rows(ours, other) is not None


def test_intervals_compare_and_group_on_duckdb_where_it_normalizes_them():
    """DuckDB finds INTERVAL '1' MONTH equal to INTERVAL '30' DAY; compiled code would compare fields, so it
    must not: a comparison of intervals stays on DuckDB, grouping by one hands the batch to DuckDB."""
    import duckdb
    from sqlglot import parse_one

    from tests.compiled_check import check

    interval = pa.month_day_nano_interval()
    table = pa.table({"a": pa.array([(1, 0, 0), (0, 30, 0), None], interval),
                      "b": pa.array([(0, 30, 0), (0, 30, 0), (0, 1, 0)], interval)})
    con = duckdb.connect()
    con.register("t", table)
    sql = "SELECT a = b AS same FROM t"
    assert con.sql(sql).fetchall() == [(True,), (True,), (None,)]
    with pytest.raises(compiled_step.Unsupported, match="comparison eq"):
        compiled_step.CompiledStep(parse_one(sql, read="duckdb"), {"t": table.schema}, con.sql(sql).to_arrow_table().schema)
    assert check("SELECT a, COUNT(*) AS n FROM t GROUP BY a", {"t": table}) == "fallback"
    assert check("SELECT a, b FROM t", {"t": table}) == "compiled"  # moving intervals is fine


def test_a_repeated_subexpression_is_computed_once_per_frame():
    """expressions.Common: a state merge's select list repeats whole comparisons; each runs once a batch
    and both columns still equal DuckDB's."""
    import pyarrow as pa

    from ivm.execute.compiled import expressions
    from tests.compiled_check import check

    table = pa.table({"a": pa.array([1, None, 3, 4], pa.int64()), "b": pa.array([1, 2, None, 5], pa.int64())})
    calls = []
    real = expressions.Common.shared

    def counting(self, text, compile_):
        calls.append(text)
        return real(self, text, compile_)
    expressions.Common.shared = counting
    try:
        outcome = check("SELECT (a IS NOT DISTINCT FROM b) AND a > 1 AS x, NOT ((a IS NOT DISTINCT FROM b) AND a > 1) AS y, "
                        "COALESCE(a, 0) + b AS s, COALESCE(a, 0) + b > 2 AS t FROM d", {"d": table})
    finally:
        expressions.Common.shared = real
    assert outcome == "compiled"
    assert '(a IS NOT DISTINCT FROM b) AND a > 1' in calls and 'COALESCE(a, 0) + b' in calls


def test_batches_that_check_new_compiled_steps_on_duckdb_are_not_timings(monkeypatch):
    """Outside shadow mode a step's first SHADOW_RUNS compiled runs also run on DuckDB: such a batch costs
    both paths, so the cost model must not take it as the incremental path's time (it sent q02 to recompute)."""
    from ivm.execute.compiled.step import SHADOW_RUNS
    from ivm.maintain.maintenance import WARMUP_RUNS

    monkeypatch.setenv("IVM_SHADOW", "0")
    db = _db("SELECT cust, SUM(qty) AS q FROM orders GROUP BY cust")  # one program, its steps run every batch

    def estimate():
        return db.status()["maintenance"]["views"]["v"]["estimate_incremental"]

    rng = np.random.default_rng(3)
    runs = 0
    # run 1 compiles each step after its DuckDB run; runs 2..1+SHADOW_RUNS check them on DuckDB too
    for runs in range(1, 2 + SHADOW_RUNS):
        ids = np.arange(runs * 100, runs * 100 + 20)
        db.apply_changes("orders", pa.table({"id": ids, "cust": rng.integers(0, 4, 20), "amount": ids * 1.0,
                                             "qty": ids}))
        assert estimate() is None, runs
        assert db.status()["steps"]["shadowed"] > 0 or runs <= WARMUP_RUNS
    ids = np.arange(10_000, 10_020)
    db.apply_changes("orders", pa.table({"id": ids, "cust": ids % 4, "amount": ids * 1.0, "qty": ids}))
    assert estimate() is not None
    assert sorted(db.sql("SELECT * FROM v").to_pylist(), key=str) == _recompute(
        db, "SELECT cust, SUM(qty) AS q FROM orders GROUP BY cust")
