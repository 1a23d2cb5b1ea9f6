"""delta_operators.spj: the product rule's terms, and what they leave for the steps after them."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from sqlglot import exp

import ivm
from ivm import executor
from tests.oracle.compare import multiset_diff

ABOVE = "SELECT k FROM t WHERE x > (SELECT AVG(x) FROM t)"


@pytest.fixture
def rows_out(monkeypatch):
    """The rows each Query step of a maintenance run returned: [(note, rows)]."""
    seen: list[tuple[str, int]] = []
    query = executor.Executor._query

    def recorded(self, step, temps, snapshot, registered, label):  # noqa: ANN001, ANN202
        result = query(self, step, temps, snapshot, registered, label)
        seen.append((step.note, result.num_rows))
        return result

    monkeypatch.setattr(executor.Executor, "_query", recorded)
    return seen


def test_a_term_that_scans_a_table_leaves_only_the_rows_that_do_not_cancel(rows_out):
    """A scalar subquery's change (-old AVG, +new AVG) times the table: rows above both cancel.

    Unconsolidated, the terms held every row above either average, each once
    with -1 and once with +1 (2,002 rows), and handed them all to the next step.
    """
    db = ivm.connect(maintenance="incremental")
    reference = duckdb.connect()
    for con in (db, reference):
        con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x INTEGER)")
        con.execute("INSERT INTO t SELECT i, i FROM range(1, 2001) r(i)")
    db.execute(f"CREATE MATERIALIZED VIEW above AS {ABOVE}")
    rows_out.clear()
    # k = 1 moves to the top: the average goes from 1000.5 to 1001.5, so x = 1001 drops out and k = 1 comes in
    db.apply_changes("t", pa.table({"k": [1], "x": [2001], "__op": ["u"]}))
    reference.execute("UPDATE t SET x = 2001 WHERE k = 1")
    assert multiset_diff(db.sql("SELECT * FROM above"), reference.sql(ABOVE).to_arrow_table()) is None
    terms = [rows for note, rows in rows_out if note == "sum of product-rule terms"]
    assert terms == [2], rows_out  # +k = 1 and -k of x = 1001
    assert max(rows for _, rows in rows_out) <= 2, rows_out


def test_a_term_that_only_scans_a_global_aggregate_is_not_consolidated():
    """A global aggregate is one row: its scan multiplies nothing, so that term is left as it is."""
    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x INTEGER)")
    db.execute(f"CREATE MATERIALIZED VIEW above AS {ABOVE}")
    programs = db._engine.catalog.views["above"].programs
    maintained = next(p for key, p in programs.items() if not key[-1])  # not the first computation
    terms = next(s for s in maintained.steps if getattr(s, "note", "") == "sum of product-rule terms")
    # the two terms (δt × AVG and t × δAVG) are inlined into it; only the second is consolidated
    assert len(list(terms.sql.find_all(exp.Having))) == 1
