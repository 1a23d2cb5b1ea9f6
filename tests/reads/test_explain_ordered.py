"""EXPLAIN for window, top-K and recursive views: which parts are incremental, and what state each keeps."""

from __future__ import annotations

import pytest

import ivm


@pytest.fixture(scope="module")
def db():
    database = ivm.connect()
    database.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)")
    database.execute("CREATE TABLE links (src INTEGER, dst INTEGER)")
    yield database
    database.close()


def explain(db, name: str, sql: str) -> str:
    db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    return "\n".join(db.sql(f"EXPLAIN {name}").column(0).to_pylist())


def test_window(db):
    text = explain(db, "ranked", "SELECT id, RANK() OVER (PARTITION BY cust ORDER BY amount) AS r FROM orders")
    assert 'Window partition by wc0 (= "orders"."cust")' in text
    assert "recomputes only the partitions a change touches" in text
    assert "input rows with their window values, indexed by (wc0)" in text
    assert "lookup ranked.window" in text and "by (wc0) from __delta__orders" in text


def test_top_k(db):
    text = explain(db, "best", "SELECT id, amount FROM orders ORDER BY amount DESC LIMIT 3 OFFSET 1")
    assert "TopK order by amount DESC NULLS LAST  LIMIT 3 OFFSET 1" in text
    assert "rescans the input only when deletions leave fewer than LIMIT + OFFSET rows" in text
    assert "buffer: the first 104..208 input rows" in text
    assert "refill: the first 104 rows of the input (scans it)" in text


def test_recursive(db):
    text = explain(db, "closure", "WITH RECURSIVE tc(a, b) AS (SELECT src, dst FROM links UNION "
                                  "SELECT tc.a, l.dst FROM tc JOIN links l ON tc.b = l.src) SELECT a, b FROM tc")
    assert "Recursive tc UNION (set: delete and re-derive, with derivation counts)" in text
    assert "number of derivations (DRed), keyed by (a, b)" in text
    assert "repeat until" in text and "over-delete" in text and "re-derive and insert" in text
    assert "lookup links by (src)" in text


def test_recursive_union_all(db):
    text = explain(db, "walks", "WITH RECURSIVE w(a, b) AS (SELECT src, dst FROM links WHERE src < dst UNION ALL "
                                "SELECT w.a, l.dst FROM w JOIN links l ON w.b = l.src WHERE l.src < l.dst) "
                                "SELECT a, b FROM w")
    assert "UNION ALL (bag: counting)" in text
    assert "rows of the fixpoint with their multiplicities" in text
    assert "semi-naive: derive from the last round's change only" in text
