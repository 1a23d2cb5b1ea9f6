"""delta_operators.spj: the product rule's terms, and what they leave for the steps after them."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from sqlglot import exp

import ivm
from ivm.execute import executor
from sql_frontend.plan_sql import render
from tests.oracle.compare import multiset_diff
from tests.oracle.reference import apply_cdc

ABOVE = "SELECT k FROM t WHERE x > (SELECT AVG(x) FROM t)"
# x + 0 is no plain column: t × δAVG scans t and consolidates, where ABOVE reads t by range
ABOVE_SCANNED = "SELECT k FROM t WHERE x + 0 > (SELECT AVG(x) FROM t)"


def numbered_t(x_type: str, view: str):  # noqa: ANN201
    """ivm and a DuckDB reference, each with t holding x = k for k = 1..2000, and ``view`` as ``above`` in ivm."""
    db = ivm.connect(maintenance="incremental")
    reference = duckdb.connect()
    for con in (db, reference):
        con.execute(f"CREATE TABLE t (k BIGINT PRIMARY KEY, x {x_type})")
        con.execute("INSERT INTO t SELECT i, i FROM range(1, 2001) r(i)")
    db.execute(f"CREATE MATERIALIZED VIEW above AS {view}")
    return db, reference


@pytest.fixture
def rows_out(monkeypatch):
    """The rows each Query step of a maintenance run returned: [(note, rows)]."""
    seen: list[tuple[str, int]] = []
    query = executor.Executor.query

    def recorded(self, step, temps, snapshot, registered, label):  # noqa: ANN001, ANN202
        result = query(self, step, temps, snapshot, registered, label)
        seen.append((step.note, result.num_rows))
        return result

    monkeypatch.setattr(executor.Executor, "query", recorded)
    return seen


def test_a_term_that_scans_a_table_leaves_only_the_rows_that_do_not_cancel(rows_out):
    """A scalar subquery's change (-old AVG, +new AVG) times the table: rows above both cancel.

    Unconsolidated, the terms held every row above either average, each once
    with -1 and once with +1 (2,002 rows), and handed them all to the next step.
    """
    db, reference = numbered_t("INTEGER", ABOVE_SCANNED)
    rows_out.clear()
    # k = 1 moves to the top: the average goes from 1000.5 to 1001.5, so x = 1001 drops out and k = 1 comes in
    db.apply_changes("t", pa.table({"k": [1], "x": [2001], "__op": ["u"]}))
    reference.execute("UPDATE t SET x = 2001 WHERE k = 1")
    assert multiset_diff(db.sql("SELECT * FROM above"), reference.sql(ABOVE_SCANNED).to_arrow_table()) is None
    terms = [rows for note, rows in rows_out if note == "sum of product-rule terms"]
    assert terms == [2], rows_out  # +k = 1 and -k of x = 1001
    assert max(rows for _, rows in rows_out) <= 2, rows_out


def test_a_term_that_only_scans_a_global_aggregate_is_not_consolidated():
    """A global aggregate is one row: its scan multiplies nothing, so that term is left as it is."""
    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x INTEGER)")
    # x * 2 is no plain column, so t × δAVG scans t (a plain x reads only the rows in range: next test)
    db.execute("CREATE MATERIALIZED VIEW above AS SELECT k FROM t WHERE x * 2 > (SELECT AVG(x) FROM t)")
    # the two terms (δt × AVG and t × δAVG) are inlined into it; only the second is consolidated
    assert len(list(_terms(db, "above").sql.find_all(exp.Having))) == 1


def test_a_plain_column_compared_with_the_aggregate_reads_only_the_rows_in_range(lookups_run):
    """t × δAVG reads the rows of t between the old and the new average, not all of t (TPC-H q22's shape)."""
    db, reference = numbered_t("DECIMAL(15, 2)", ABOVE)
    assert not list(_terms(db, "above").sql.find_all(exp.Having))  # nothing scanned: nothing to consolidate
    # AVG 1000.5 -> 1001.5: x = 1001 drops out; DECIMAL against the DOUBLE average, compared as doubles
    batches = [([1], [2001], "u"), ([2], [1001.5], "u"), ([3], [None], "u"), ([4], [7], "u")]
    for keys, xs, op in batches:
        changes = pa.table({"k": pa.array(keys, pa.int64()), "x": pa.array(xs, pa.float64()).cast(pa.decimal128(15, 2)),
                            "__op": [op] * len(keys)})
        lookups_run.clear()
        db.apply_changes("t", changes)
        apply_cdc(reference, "t", "k", changes)
        assert multiset_diff(db.sql("SELECT * FROM above"), reference.sql(ABOVE).to_arrow_table()) is None, keys
        ranged = [(step.relation, rows) for step, rows in lookups_run if step.between is not None]
        assert ranged and all(relation == "t" and rows <= 3 for relation, rows in ranged), ranged


def _terms(db, view: str):  # noqa: ANN001, ANN202
    """The step summing the product rule's terms, in the program that maintains the view (not the first computation)."""
    programs = db._engine.catalog.views[view].programs
    maintained = next(p for key, p in programs.items() if not key[-1])
    return next(s for s in maintained.steps if getattr(s, "note", "") == "sum of product-rule terms")


def _terms_sql(db, view: str) -> str:  # noqa: ANN001
    return render(_terms(db, view).sql)


@pytest.mark.parametrize("condition", [
    "x > (SELECT AVG(x) FROM t)", "x >= (SELECT AVG(x) FROM t)", "x < (SELECT AVG(x) FROM t)",
    "x <= (SELECT AVG(x) FROM t)", "(SELECT AVG(x) FROM t) < x", "x > (SELECT MIN(x) FROM t WHERE k > 2)",
])
def test_rows_past_both_values_are_left_out_and_the_view_stays_exact(condition):
    """The filter keeping only rows between a global aggregate's old and new value loses no row.

    Boundaries are hit on purpose: averages that equal stored values, NULL x,
    a table emptied (the aggregate is NULL) and filled again.
    """
    view = f"SELECT k, x FROM t WHERE {condition}"
    db = ivm.connect(maintenance="incremental")
    reference = duckdb.connect()
    for con in (db, reference):
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x INTEGER)")
    db.execute(f"CREATE MATERIALIZED VIEW v AS {view}")
    assert "MIN(" in _terms_sql(db, "v") and "MAX(" in _terms_sql(db, "v")
    batches = [
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], "c"),  # AVG 3, a stored value
        ([6], [None], "c"),  # AVG unchanged
        ([1], [6], "u"),  # AVG 3 -> 4: x = 3 and x = 4 sit on the two values
        ([1], [1], "u"),  # AVG 4 -> 3: and back down
        ([2, 3], [9, 0], "u"),  # AVG 3.8
        ([7], [4], "c"),
        ([1, 2, 3, 4, 5, 6, 7], [None] * 7, "d"),  # empty: the aggregate is NULL
        ([8, 9], [10, 20], "c"),  # from NULL to 15
        ([8], [30], "u"),
    ]
    for keys, xs, op in batches:
        changes = pa.table({"k": pa.array(keys, pa.int64()), "x": pa.array(xs, pa.int32()), "__op": [op] * len(keys)})
        db.apply_changes("t", changes)
        apply_cdc(reference, "t", "k", changes)
        expected = reference.sql(view).to_arrow_table()
        assert multiset_diff(db.sql("SELECT * FROM v"), expected) is None, (keys, xs, op)


def test_no_rows_are_left_out_when_the_aggregate_is_not_compared_alone():
    """``x + A.v > c`` does not order rows by x against A.v: every row may change, none is left out."""
    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x INTEGER)")
    db.execute("CREATE MATERIALIZED VIEW v AS SELECT k FROM t WHERE x + (SELECT AVG(x) FROM t) > 10")
    assert "MIN(" not in _terms_sql(db, "v")


def test_a_range_over_a_view_read_in_the_same_batch_adds_that_views_change():
    """The ranged input may be a view maintained in the same batch: its stored rows are OLD, and the
    lookup's rows are joined with its change (SourceRule's correction); the view stays exact."""
    import random

    db = ivm.connect(maintenance="incremental")
    reference = duckdb.connect()
    for con in (db, reference):
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x DECIMAL(15, 2), open BOOLEAN)")
    db.execute("CREATE MATERIALIZED VIEW opened AS SELECT k, x FROM t WHERE open")
    upper = "SELECT k, x FROM opened WHERE x >= (SELECT AVG(x) FROM opened)"
    db.execute(f"CREATE MATERIALIZED VIEW upper_half AS {upper}")
    expected = upper.replace("FROM opened", "FROM (SELECT k, x FROM t WHERE open)")
    rng = random.Random(7)
    live: set[int] = set()
    for _ in range(40):
        keys = rng.sample(range(60), rng.randint(1, 6))
        ops = ["d" if k in live and rng.random() < 0.3 else ("u" if k in live else "c") for k in keys]
        xs = [None if rng.random() < 0.1 else rng.randint(-500, 500) / 4 for _ in keys]
        changes = pa.table({"k": pa.array(keys, pa.int64()),
                            "x": pa.array(xs, pa.float64()).cast(pa.decimal128(15, 2)),
                            "open": [rng.random() < 0.7 for _ in keys], "__op": ops})
        db.apply_changes("t", changes)
        apply_cdc(reference, "t", "k", changes)
        live = (live | {k for k, op in zip(keys, ops) if op != "d"}) - {k for k, op in zip(keys, ops) if op == "d"}
        assert multiset_diff(db.sql("SELECT * FROM upper_half"), reference.sql(expected).to_arrow_table()) is None
    ranged = [s for p in db._engine.catalog.views["upper_half"].programs.values() for s in p.steps
              if getattr(s, "between", None)]
    assert ranged, "the term over opened reads it by range"
