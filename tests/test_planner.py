"""sql_frontend.planner: plans mean what their SQL means.

For every view of the oracle catalogue, the plan rendered back to one SELECT
(``plan_sql.to_sql``) must return exactly what the original SELECT returns on
the same data, and have the same output names and types. Structural tests
pin the rewrites (SPJ merging, aggregate decomposition).
"""

from __future__ import annotations

import random

import duckdb
import pytest
from sqlglot import exp

import ivm
from sql_frontend.plan import SPJ, Aggregate, Distinct, Source, UnionAll, walk
from sql_frontend.plan_sql import parenthesize, render, to_sql
from sql_frontend.statements import parse_query
from tests.oracle.compare import multiset_diff
from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.model import Model, generate_batch

VIEWS = oracle_views()


@pytest.fixture(scope="module")
def loaded():
    """An ivm database (for its catalog) and DuckDB, both holding the same data."""
    db = ivm.connect()
    con = duckdb.connect()
    for statement in oracle_schema():
        db.execute(statement)
        con.execute(statement)
    model = Model()
    rng = random.Random(3)
    for table in model.specs:
        model.apply(table, generate_batch(rng, model, table, 60))
        data = model.arrow(table)  # noqa: F841  (read by DuckDB)
        con.execute(f"INSERT INTO {table} SELECT * FROM data")
    for view in VIEWS:  # later views read earlier ones
        db.execute(f"CREATE MATERIALIZED VIEW {view.name} AS {view.sql}")
        con.execute(f"CREATE VIEW {view.name} AS {view.sql}")
    yield db, con
    db.close()
    con.close()


@pytest.mark.parametrize("view", VIEWS, ids=[v.name for v in VIEWS])
def test_plan_sql_returns_what_the_view_sql_returns(loaded, view):
    db, con = loaded
    plan = db._engine.catalog.views[view.name].plan
    got = con.sql(render(to_sql(plan.root))).to_arrow_table()
    want = con.sql(view.sql).to_arrow_table()
    assert multiset_diff(got, want) is None
    assert [(c.name, c.type) for c in plan.columns] == [
        (name, type_) for name, type_, *_ in con.execute(f"DESCRIBE {view.sql}").fetchall()
    ]


def plan_of(db, sql):
    from sql_frontend.planner import plan_view

    return plan_view(parse_query(sql), db._engine.catalog).root


def test_nested_selects_merge_into_one_join(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT a.id FROM (SELECT id, cust FROM orders WHERE qty > 1) a "
                       "JOIN (SELECT id FROM customers) c ON a.cust = c.id")
    spjs = [n for n in walk(root) if isinstance(n, SPJ)]
    assert len(spjs) == 1, "SPJ over SPJ must flatten"
    assert sorted(type(c).__name__ for c in spjs[0].children()) == ["Source", "Source"]


def test_aggregate_decomposition(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT cust, SUM(amount) + 1 AS s, COUNT(*) FILTER (WHERE qty > 2) AS n "
                       "FROM orders GROUP BY cust HAVING MAX(qty) > 1")
    agg = next(n for n in walk(root) if isinstance(n, Aggregate))
    assert agg.keys == ("cust",)
    assert [c.func for c in agg.aggregates] == ["sum", "count", "max"]
    assert isinstance(root, SPJ) and root.predicate is not None, "HAVING is a filter over the aggregate"


def test_union_distinct_is_distinct_over_union_all(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT status AS s FROM orders UNION SELECT region FROM customers")
    kinds = {type(n) for n in walk(root)}
    assert {Distinct, UnionAll, Source} <= kinds


def test_cte_used_twice_is_planned_from_one_source(loaded):
    db, _ = loaded
    root = plan_of(db, "WITH o2 AS (SELECT id, cust FROM orders) SELECT a.id FROM o2 a JOIN o2 b ON a.cust = b.cust")
    sources = [n for n in walk(root) if isinstance(n, Source)]
    assert len(sources) == 1, "both references read the same Source node"


def test_parenthesize_keeps_precedence():
    tree = exp.Mul(this=exp.column("x"), expression=exp.Sub(this=exp.column("a"), expression=exp.column("b")))
    assert parenthesize(tree).sql() == "x * (a - b)"
    con = duckdb.connect()
    assert con.execute(f"SELECT {render(tree)} FROM (SELECT 2 AS x, 5 AS a, 3 AS b)").fetchone()[0] == 4
