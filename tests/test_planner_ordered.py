"""Plans of window, top-K and recursive views mean what their SQL means.

Like tests/test_planner.py for the issue-3 fixture files: a plan rendered
back to one SELECT (``plan_sql.to_sql``) must return what the view's SELECT
returns on the same data (tie-aware where the fixture says ORDER BY ties make
the result ambiguous), with the same output names and types.
"""

from __future__ import annotations

import random

import duckdb
import pytest

import ivm
from sql_frontend.plan import TopK, Window, walk
from sql_frontend.plan_sql import render, to_sql
from tests.oracle.compare import multiset_diff, tie_aware_diff
from tests.oracle.fixtures import oracle_schema, read_fixture_views
from tests.oracle.harness import without_limit
from tests.oracle.model import Model, generate_batch

FILES = ["oracle_views_windows.sql", "oracle_views_topk.sql", "oracle_views_recursive.sql"]
VIEWS = [v for f in FILES for v in read_fixture_views(f)]


@pytest.fixture(scope="module")
def loaded():
    db = ivm.connect()
    con = duckdb.connect()
    for statement in oracle_schema():
        db.execute(statement)
        con.execute(statement)
    model = Model()
    rng = random.Random(5)
    for table in model.specs:
        model.apply(table, generate_batch(rng, model, table, 60))
        data = model.arrow(table)  # noqa: F841  (read by DuckDB)
        con.execute(f"INSERT INTO {table} SELECT * FROM data")
    for view in VIEWS:
        db.execute(f"CREATE MATERIALIZED VIEW {view.name} AS {view.sql}")
    yield db, con
    db.close()
    con.close()


@pytest.mark.parametrize("view", VIEWS, ids=[v.name for v in VIEWS])
def test_plan_sql_returns_what_the_view_sql_returns(loaded, view):
    db, con = loaded
    plan = db._engine.catalog.views[view.name].plan
    got = con.sql(render(to_sql(plan.root))).to_arrow_table()
    want = con.sql(view.sql).to_arrow_table()
    if view.ties:
        candidates = con.sql(view.candidates or without_limit(view.sql)).to_arrow_table()
        assert tie_aware_diff(got, want, candidates, view.ties, view.ranks) is None
    else:
        assert multiset_diff(got, want) is None
    assert [(c.name, c.type) for c in plan.columns] == [
        (name, type_) for name, type_, *_ in con.execute(f"DESCRIBE {view.sql}").fetchall()
    ]


def test_windows_with_different_partitions_chain_nodes(loaded):
    db, _ = loaded
    plan = db._engine.catalog.views["win_two_partitionings"].plan
    partitions = [n.partition for n in walk(plan.root) if isinstance(n, Window)]
    assert sorted(len(p) for p in partitions) == [1, 1, 2], "one Window node per PARTITION BY column set"


def test_order_by_hidden_expression_becomes_a_dropped_column(loaded):
    db, _ = loaded
    plan = db._engine.catalog.views["topk_hidden_key"].plan
    (top,) = [n for n in walk(plan.root) if isinstance(n, TopK)]
    assert [k.column for k in top.order][0].startswith("__order")
    assert [c.name for c in plan.columns] == ["id"]
