"""Scripted change streams for the hard cases of issue 3's constructs.

The random oracle (test_oracle.py) finds these cases by chance; here each is
forced, step by step, and every view is compared with DuckDB's recompute
after every step: a row flipping between matched and unmatched, NULL join
keys, the only matching row of a subquery deleted and restored, NOT IN while
NULLs appear in and vanish from its subquery, duplicates on either side.
"""

from __future__ import annotations

import pytest

from tests.oracle.fixtures import VIEW_SETS, oracle_schema, oracle_views
from tests.oracle.harness import Harness

ALL_VIEWS = {v.name: v for name in VIEW_SETS[1:] for v in oracle_views(name)}


def customer(id, region="north", tier=1, name="ann"):  # noqa: A002, ANN001, ANN201
    return {"id": id, "region": region, "tier": tier, "name": name}


def order(id, cust, qty=1, status="open", amount=1.0, price=1):  # noqa: A002, ANN001, ANN201
    return {"id": id, "cust": cust, "amount": amount, "qty": qty, "status": status, "price": price}


def event(kind, val, tag="p"):  # noqa: ANN001, ANN201
    return {"kind": kind, "val": val, "tag": tag}


def item(order_id, sku, qty):  # noqa: ANN001, ANN201
    return {"order_id": order_id, "sku": sku, "qty": qty}


@pytest.fixture
def harness():
    def make(*names: str) -> Harness:
        h = Harness(oracle_schema(), [ALL_VIEWS[n] for n in names])
        h.create_views()
        made.append(h)
        return h

    made: list[Harness] = []
    yield make
    for h in made:
        h.close()


def steps(h: Harness, script) -> None:  # noqa: ANN001
    for n, (table, ops) in enumerate(script):
        h.apply(table, ops)
        h.check(f"step {n}: {table} {ops}")


def test_outer_join_rows_flip_between_matched_and_unmatched(harness):
    h = harness("left_join_basic", "right_join_basic", "full_join_basic", "left_join_under_aggregate",
                "left_join_nested_aggregate", "left_join_is_null", "left_join_chain", "full_join_aggregate")
    steps(h, [
        ("orders", [("c", order(1, 1)), ("c", order(2, None)), ("c", order(3, 7))]),  # unmatched, NULL key
        ("customers", [("c", customer(1)), ("c", customer(2))]),  # order 1 becomes matched
        ("orders", [("c", order(4, 1))]),  # a second match: customer 1's count goes 1 -> 2
        ("orders", [("d", order(1, 1))]),  # back to one match
        ("orders", [("d", order(4, 1))]),  # its last match: customer 1 is unmatched again
        ("orders", [("u", order(2, 2))]),  # NULL key -> matched
        ("customers", [("d", customer(2))]),  # order 2 unmatched, padded
        ("customers", [("c", customer(2)), ("u", customer(1, region=None))]),
        ("items", [("c", item(2, "a", 1)), ("c", item(2, "b", 2))]),
        ("orders", [("u", order(2, None))]),
    ])


def test_exists_and_in_when_the_only_match_goes_and_comes_back(harness):
    h = harness("exists_correlated", "not_exists_correlated", "in_subquery", "exists_residual",
                "not_exists_residual", "anti_join_syntax", "semi_join_syntax", "exists_uncorrelated")
    steps(h, [
        ("customers", [("c", customer(1)), ("c", customer(2, region="south"))]),
        ("orders", [("c", order(10, 1, qty=4, status="cancelled"))]),  # the only match of customer 1
        ("orders", [("c", order(11, 1, qty=2))]),
        ("orders", [("d", order(10, 1))]),
        ("orders", [("d", order(11, 1))]),  # no match left
        ("orders", [("c", order(10, 1, qty=4, status="cancelled"))]),  # and back
        ("items", [("c", item(10, "a", 3))]),
        ("orders", [("u", order(10, None, qty=4, status="cancelled"))]),  # its key becomes NULL
    ])


def test_not_in_while_nulls_appear_and_vanish(harness):
    h = harness("not_in_nulls", "not_in_outer_nulls", "in_subquery_duplicates", "not_in_correlated")
    steps(h, [
        ("customers", [("c", customer(1, tier=1)), ("c", customer(2, tier=2)), ("c", customer(3, tier=None))]),
        # the subquery is empty: every row qualifies, even a NULL tier
        ("events", [("c", event("x", 1)), ("c", event("x", 1))]),  # duplicates: 1 is IN, not twice
        ("events", [("c", event("x", None))]),  # a NULL in the subquery: NOT IN holds for nobody
        ("events", [("d", event("x", None))]),  # and it is gone again
        ("events", [("d", event("x", 1)), ("d", event("x", 1))]),  # empty again: NULL tier is back
        ("orders", [("c", order(1, 1, qty=None)), ("c", order(2, 1, qty=3))]),
        ("events", [("c", event("x", 3)), ("c", event("y", None))]),
        ("items", [("c", item(2, "a", None)), ("c", item(1, "a", 5))]),  # correlated NULL for order 2 only
        ("items", [("d", item(2, "a", None))]),
    ])


def test_set_operations_count_duplicates(harness):
    h = harness("except_all", "intersect_distinct", "intersect_all_bags", "except_multi_column",
                "union_then_except_all", "except_under_aggregate", "intersect_all_grouped")
    steps(h, [
        ("orders", [("c", order(1, 1, qty=2)), ("c", order(2, 1, qty=2)), ("c", order(3, None, qty=None))]),
        ("events", [("c", event("x", 2)), ("c", event("x", None, "p"))]),  # 2 - 1 copies, NULL = NULL
        ("events", [("c", event("x", 2))]),  # 2 - 2 copies: gone
        ("customers", [("c", customer(1, tier=2)), ("c", customer(2, tier=None))]),
        ("events", [("d", event("x", 2))]),
        ("orders", [("d", order(1, 1))]),
    ])


def test_scalar_subqueries_over_empty_and_vanishing_groups(harness):
    h = harness("scalar_correlated_select", "scalar_correlated_count_where", "scalar_correlated_where",
                "scalar_uncorrelated_where", "scalar_in_having", "scalar_max_of_aggregate", "nested_subqueries")
    steps(h, [
        ("customers", [("c", customer(1)), ("c", customer(2))]),  # COUNT over no orders is 0, SUM NULL
        ("orders", [("c", order(1, 1, qty=2, amount=3.0, price=5)), ("c", order(2, 1, qty=None))]),
        ("items", [("c", item(1, "a", 1)), ("c", item(1, "b", 5))]),
        ("orders", [("c", order(3, 2, qty=7, amount=-1.0, price=5))]),  # ties for the max
        ("orders", [("d", order(1, 1))]),
        ("items", [("d", item(1, "a", 1)), ("d", item(1, "b", 5))]),  # the group vanishes
        ("orders", [("u", order(3, 2, status="closed"))]),
    ])
