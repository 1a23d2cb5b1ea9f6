"""sql_frontend.or_per_table: what an OR implies about each table alone, and what that saves."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
import sqlglot

import ivm
from sql_frontend.or_per_table import imply_per_table
from tests.oracle.compare import multiset_diff
from tests.oracle.reference import apply_cdc


def _where(sql: str) -> str:
    return imply_per_table(sqlglot.parse_one(sql)).args["where"].this.sql()


@pytest.mark.parametrize("sql, added", [
    # each branch names t alone in some condition, and u alone in another
    ("SELECT 1 FROM t, u WHERE (t.a = 1 AND u.b = 2) OR (t.a = 3 AND u.b = 4)",
     ["(t.a = 1 OR t.a = 3)", "(u.b = 2 OR u.b = 4)"]),
    # the second branch says nothing of u alone: only t's is implied
    ("SELECT 1 FROM t, u WHERE (t.a = 1 AND u.b = 2) OR (t.a = 3 AND t.c = u.c)", ["(t.a = 1 OR t.a = 3)"]),
    # an OR of one table already is its own implication
    ("SELECT 1 FROM t, u WHERE t.a = 1 OR t.a = 3", []),
    # a condition holding a subquery does not count for a table
    ("SELECT 1 FROM t, u WHERE (t.a IN (SELECT x FROM v) AND u.b = 2) OR (t.a = 3 AND u.b = 4)",
     ["(u.b = 2 OR u.b = 4)"]),
    # a column of a table outside this SELECT's FROM (a correlation) is not a local table's
    ("SELECT 1 FROM t WHERE (t.a = 1 AND o.b = 2) OR (t.a = 3 AND o.b = 4)", ["(t.a = 1 OR t.a = 3)"]),
])
def test_each_table_gains_the_or_of_its_own_conditions(sql, added):
    where = sqlglot.parse_one(sql).args["where"].this.sql()
    want = " AND ".join([f"({where})" if added else where, *added])
    assert _where(sql) == want


def test_ors_inside_subqueries_gain_too():
    sql = "SELECT 1 FROM t WHERE t.k IN (SELECT u.k FROM u, v WHERE (u.a = 1 AND v.b = 2) OR (u.a = 3 AND v.b = 4))"
    out = imply_per_table(sqlglot.parse_one(sql)).sql()
    assert "(u.a = 1 OR u.a = 3) AND (v.b = 2 OR v.b = 4)" in out


PARTS = "SELECT SUM(l.price) AS s, COUNT(*) AS n FROM line l, part p WHERE l.pk = p.pk AND (" \
        "(p.brand = 'A' AND p.size < 5 AND l.qty < 10) OR (p.brand = 'B' AND l.qty >= 10 AND l.mode = 'AIR'))"


def test_a_changed_row_that_fails_its_own_conditions_looks_nothing_up(lookups_run):
    """TPC-H Q19's shape: a part whose brand passes no branch joins no line item, so none is fetched.

    Without the implied ``p.brand = 'A' AND p.size < 5 OR p.brand = 'B'`` the
    change looked up all 200 line items of the part before the OR dropped them.
    """
    db = ivm.connect(maintenance="incremental")
    reference = duckdb.connect()
    for con in (db, reference):
        con.execute("CREATE TABLE part (pk BIGINT PRIMARY KEY, brand VARCHAR, size INTEGER)")
        con.execute("CREATE TABLE line (id BIGINT PRIMARY KEY, pk BIGINT, qty INTEGER, mode VARCHAR, price DOUBLE)")
        con.execute("INSERT INTO part SELECT i, ['A', 'B', 'C'][1 + i % 3], i % 7 FROM range(50) r(i)")
        con.execute("INSERT INTO line SELECT i, i % 50, i % 20, ['AIR', 'MAIL'][1 + i % 2], i FROM range(10000) r(i)")
    db.execute(f"CREATE MATERIALIZED VIEW q AS {PARTS}")
    changes = [
        ("part", "u", {"pk": [2], "brand": ["C"], "size": [1]}),  # C before and after: nothing to fetch
        ("part", "u", {"pk": [5], "brand": ["A"], "size": [2]}),  # C -> A: its line items come in
        ("part", "u", {"pk": [7], "brand": ["B"], "size": [None]}),  # B, NULL size: the B branch ignores size
        ("part", "d", {"pk": [1], "brand": ["B"], "size": [1]}),
    ]
    fetched = []
    for table, op, row in changes:
        lookups_run.clear()
        changes = pa.table({"pk": pa.array(row["pk"], pa.int64()), "brand": row["brand"],
                            "size": pa.array(row["size"], pa.int32()), "__op": [op]})
        db.apply_changes(table, changes)
        apply_cdc(reference, table, "pk", changes)
        assert multiset_diff(db.sql("SELECT * FROM q"), reference.sql(PARTS).to_arrow_table()) is None
        fetched.append(sum(rows for step, rows in lookups_run if "line" in step.note))
    assert fetched[0] == 0, lookups_run  # the old and the new part pass no branch: not one line item fetched
    assert fetched[1:] == [200, 200, 200], fetched  # the old or the new part passes: its 200 line items, once
