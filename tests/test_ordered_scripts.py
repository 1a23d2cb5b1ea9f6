"""Scripted streams for top-K and recursion's hard cases (issue 3, acceptance 1).

The random streams (test_oracle_ordered, test_oracle_recursive) meet these
cases by chance; here each is forced, and every view is compared with
DuckDB's recompute after every step: deleting the top row again and again
until the buffer runs dry and refills, ties at the LIMIT boundary, the top
row updated to the bottom; a cycle whose facts support each other losing
the one edge that derives them from outside.
"""

from __future__ import annotations

import pytest

from tests.oracle.fixtures import oracle_schema, read_fixture_views
from tests.oracle.harness import Harness
from tests.test_oracle_ordered import buffer_slack

TOPK = {v.name: v for v in read_fixture_views("oracle_views_topk.sql")}
RECURSIVE = {v.name: v for v in read_fixture_views("oracle_views_recursive.sql")}


def order(id, amount, qty=1, cust=1, status="open", price=1):  # noqa: A002, ANN001, ANN201
    return {"id": id, "cust": cust, "amount": amount, "qty": qty, "status": status, "price": price}


def link(id, src, dst):  # noqa: A002, ANN001, ANN201
    return {"id": id, "src": src, "dst": dst}


def play(views, script) -> None:  # noqa: ANN001
    h = Harness(oracle_schema(), views)
    try:
        h.create_views()
        for n, (table, ops) in enumerate(script):
            h.apply(table, ops)
            h.check(f"step {n}: {table} {ops}")
    finally:
        h.close()


@pytest.mark.parametrize("slack", [0, 2, None])
def test_deleting_the_top_row_until_the_buffer_refills(slack):
    views = [TOPK[n] for n in ("topk_exact", "topk_offset", "topk_ties", "topk_ties_offset", "topk_in_join",
                               "topk_offset_only")]
    with buffer_slack(slack):
        play(views, [
            ("orders", [("c", order(i, float(i), qty=i % 3, price=i)) for i in range(1, 13)]),
            ("orders", [("d", order(12, 12.0, qty=0, price=12))]),  # the top row
            ("orders", [("d", order(11, 11.0, qty=2, price=11)), ("d", order(10, 10.0, qty=1, price=10))]),
            ("orders", [("u", order(9, -1.0, qty=0, price=9))]),  # the top row sinks to the bottom
            ("orders", [("d", order(i, float(i), qty=i % 3, price=i)) for i in (8, 7, 6)]),  # the buffer runs dry
            ("orders", [("c", order(20, 50.0, qty=2)), ("c", order(21, None, qty=2))]),  # a new top; a NULL last
            ("orders", [("d", order(20, 50.0, qty=2))]),
            ("orders", [("d", order(i, float(i), qty=i % 3, price=i)) for i in (1, 2, 3, 4, 5)]
             + [("d", order(9, -1.0, qty=0, price=9)), ("d", order(21, None, qty=2))]),  # empty
            ("orders", [("c", order(i, 1.0, qty=1)) for i in range(30, 40)]),  # all tied
            ("orders", [("d", order(31, 1.0, qty=1)), ("d", order(35, 1.0, qty=1))]),
        ])


def test_ties_at_the_limit_boundary_come_and_go():
    views = [TOPK[n] for n in ("topk_ties", "topk_ties_offset", "topk_ties_aggregate")]
    with buffer_slack(1):
        play(views, [
            ("orders", [("c", order(i, 1.0, qty=q)) for i, q in enumerate([3, 3, 2, 2, 2, 2, 1, None], start=1)]),
            ("orders", [("d", order(1, 1.0, qty=3))]),  # a row above the boundary goes: a tie moves in
            ("orders", [("u", order(3, 1.0, qty=5))]),  # a tied row jumps to the top
            ("orders", [("d", order(i, 1.0, qty=2)) for i in (4, 5)]),
            ("orders", [("c", order(9, 1.0, qty=2)), ("c", order(10, 1.0, qty=2))]),
        ])


def test_a_cycle_loses_the_edge_that_derives_it_from_outside():
    views = [RECURSIVE[n] for n in ("rec_transitive_closure", "rec_reachable_from_one", "rec_reach_counts",
                                    "rec_used_twice", "rec_bounded_hops", "rec_step_filters_and_projects")]
    play(views, [
        ("links", [("c", link(1, 2, 3)), ("c", link(2, 3, 4)), ("c", link(3, 4, 2))]),  # the cycle 2 -> 3 -> 4 -> 2
        ("links", [("c", link(4, 1, 2))]),  # 1 reaches the cycle
        ("links", [("d", link(4, 1, 2))]),  # ...and no longer: every (1, x) must go, though the cycle stays
        ("links", [("c", link(4, 1, 3)), ("c", link(5, 5, 1))]),  # back in by another edge, and 5 -> 1
        ("links", [("d", link(3, 4, 2))]),  # the cycle opens: (3, 3), (4, 4), (2, 2) go
        ("links", [("c", link(3, 4, 2)), ("c", link(6, 2, 2))]),  # closed again, and a self-loop
        ("links", [("u", link(2, 3, None))]),  # a NULL endpoint cuts the cycle
        ("links", [("u", link(2, 3, 4)), ("d", link(4, 1, 3)), ("d", link(5, 5, 1))]),
        ("links", [("d", link(1, 2, 3)), ("d", link(2, 3, 4)), ("d", link(3, 4, 2)), ("d", link(6, 2, 2))]),  # all gone
    ])
