"""sql_frontend.planner: plans mean what their SQL means.

For every view of the oracle catalogue, the plan rendered back to one SELECT
(``plan_sql.to_sql``) must return exactly what the original SELECT returns on
the same data (tie-aware where the fixture says ORDER BY ties make the result
ambiguous: windows, top-K), and have the same output names and types.
Structural tests pin the rewrites (SPJ merging, aggregate decomposition,
window chaining, hidden ORDER BY keys).
"""

from __future__ import annotations

import random

import duckdb
import pytest
from sqlglot import exp

import ivm
from ivm.view_definition import define_view
from sql_frontend.plan import SPJ, Aggregate, Distinct, SemiJoin, SetOp, Source, TopK, UnionAll, Window, walk
from sql_frontend.plan_sql import parenthesize, render, to_sql
from sql_frontend.planner import plan_view
from sql_frontend.statements import parse_query
from tests.oracle.compare import multiset_diff, tie_aware_diff
from tests.oracle.fixtures import VIEW_SETS, oracle_schema, oracle_views, read_fixture_views
from tests.oracle.harness import without_limit
from tests.oracle.model import Model, generate_batch

ORDERED = ["oracle_views_windows.sql", "oracle_views_topk.sql", "oracle_views_recursive.sql"]
VIEWS = [v for name in VIEW_SETS for v in oracle_views(name)] + [v for f in ORDERED for v in read_fixture_views(f)]


def define(db, name: str, sql: str) -> None:
    """Plan a view and enter it in the catalog as CREATE MATERIALIZED VIEW does (``define_view``), without
    compiling its delta programs or computing it.

    This module checks plans, and planning a view needs only the catalog (earlier views' columns and
    kinds); compiling and running the ~190 views' programs, which the oracle suites check, took three
    quarters of this module's ~70-130 s fixture.
    """
    catalog = db._engine.catalog
    catalog.add_view(define_view(name, sql, parse_query(sql), catalog))


@pytest.fixture(scope="module")
def loaded():
    """An ivm database (for its catalog of planned views) and DuckDB holding data."""
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
        define(db, view.name, view.sql)
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
    if view.ties:
        candidates = con.sql(view.candidates or without_limit(view.sql)).to_arrow_table()
        assert tie_aware_diff(got, want, candidates, view.ties, view.ranks) is None
    else:
        assert multiset_diff(got, want) is None
    # DuckDB's types, except that a SUM of integers is a BIGINT (tests/test_result_types.py).
    assert [(c.name, c.type) for c in plan.columns] == [
        (name, "BIGINT" if type_ == "HUGEINT" and mine.type == "BIGINT" else type_)
        for mine, (name, type_, *_) in zip(plan.columns, con.execute(f"DESCRIBE {view.sql}").fetchall())
    ]


def plan_of(db, sql):
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


def test_left_join_is_inner_join_plus_padded_anti_join(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT o.id, c.region FROM orders o LEFT JOIN customers c ON o.cust = c.id")
    semis = [n for n in walk(root) if isinstance(n, SemiJoin)]
    assert len(semis) == 1 and semis[0].anti and semis[0].residual is None
    assert any(isinstance(n, UnionAll) for n in walk(root))


def test_where_rejecting_nulls_turns_outer_join_inner(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT o.id FROM orders o LEFT JOIN customers c ON o.cust = c.id WHERE c.tier + 1 > 2")
    assert not any(isinstance(n, (SemiJoin, UnionAll)) for n in walk(root))


def test_not_in_is_a_union_of_anti_joins(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT id FROM customers WHERE tier NOT IN (SELECT val FROM events)")
    semis = [n for n in walk(root) if isinstance(n, SemiJoin)]
    assert len(semis) == 3 and all(s.anti for s in semis)


@pytest.mark.parametrize("sql, anti_joins, unions", [
    # keys on both sides: one keyed anti join, no part for NULLs
    ("SELECT id FROM orders WHERE id NOT IN (SELECT order_id FROM items)", 1, 0),
    # the subquery's values are a key, the outer column may be NULL: its NULL rows are a part
    ("SELECT id FROM orders WHERE cust NOT IN (SELECT id FROM customers)", 2, 1),
    # the outer column is a key, the subquery may hold NULL: the anti join against its NULLs stays
    ("SELECT id FROM customers WHERE id NOT IN (SELECT cust FROM orders)", 2, 0),
    # a filter that rejects NULL proves the subquery's values non-NULL too
    ("SELECT id FROM customers WHERE id NOT IN (SELECT cust FROM orders WHERE cust > 2)", 1, 0),
    # ... and a cast of a key column is still never NULL
    ("SELECT id FROM orders WHERE id NOT IN (SELECT CAST(order_id AS INTEGER) FROM items)", 1, 0),
    # an expression over a key column is not known to be non-NULL
    ("SELECT id FROM orders WHERE id NOT IN (SELECT order_id + 1 FROM items)", 2, 0),
])
def test_not_in_plans_no_part_for_nulls_the_catalog_rules_out(loaded, sql, anti_joins, unions):
    db, _ = loaded
    root = plan_of(db, sql)
    semis = [n for n in walk(root) if isinstance(n, SemiJoin)]
    assert len(semis) == anti_joins and all(s.anti for s in semis)
    assert sum(isinstance(n, UnionAll) for n in walk(root)) == unions


def test_a_column_only_the_where_reads_is_not_carried_past_a_semi_join(loaded):
    """The WHERE is applied where the semi join's left side is built: what only it reads stops there.

    Carried on, the scalar subquery's value would keep apart the -old/+new rows
    its change makes for every order above both values, and they could not cancel.
    """
    db, _ = loaded
    root = plan_of(db, "SELECT o.cust, SUM(o.amount) FROM orders o WHERE o.qty > (SELECT AVG(qty) FROM orders) "
                       "AND NOT EXISTS (SELECT 1 FROM items i WHERE i.order_id = o.id) GROUP BY o.cust")
    semi = next(n for n in walk(root) if isinstance(n, SemiJoin))
    assert set(semi.left.column_names) == {"o.cust", "o.amount", "__s0k0"}
    # a column the SELECT list reads stays, also when the WHERE reads it too
    root = plan_of(db, "SELECT o.qty FROM orders o WHERE o.qty > 1 AND EXISTS (SELECT 1 FROM items i WHERE i.order_id = o.id)")
    semi = next(n for n in walk(root) if isinstance(n, SemiJoin))
    assert set(semi.left.column_names) == {"o.qty", "__s0k0"}


def test_correlated_scalar_subquery_joins_a_grouped_aggregate(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT o.id FROM orders o WHERE o.qty > (SELECT AVG(i.qty) FROM items i WHERE i.order_id = o.id)")
    agg = next(n for n in walk(root) if isinstance(n, Aggregate))
    assert len(agg.keys) == 1, "grouped by the correlation column"
    assert not any(isinstance(n, SemiJoin) for n in walk(root)), "the comparison rejects NULLs: an inner join"


def test_shared_join_condition_leaves_the_or(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT o.id FROM orders o, customers c WHERE (o.cust = c.id AND o.qty > 1) "
                       "OR (o.cust = c.id AND c.tier = 2)")
    spj = next(n for n in walk(root) if isinstance(n, SPJ))
    assert any(isinstance(c, exp.EQ) for c in spj.predicate.flatten() if isinstance(spj.predicate, exp.And))


def test_except_all_is_a_set_operation_node(loaded):
    db, _ = loaded
    root = plan_of(db, "SELECT qty FROM orders EXCEPT ALL SELECT val FROM events")
    op = next(n for n in walk(root) if isinstance(n, SetOp))
    assert op.kind == "except" and op.all


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


def test_the_planner_docstring_lists_its_rules_in_the_order_they_run():
    """sql_frontend/planner.py's pipeline is data (``RULES``); its docstring is the reader's map of it."""
    from sql_frontend import planner

    listed = [line.split("->")[0].strip() for line in planner.__doc__.splitlines() if "->" in line]
    assert listed == [rule.__name__ for rule in planner.RULES]
