"""The differential oracle for WITH RECURSIVE views (issue 3).

The graph table ``links`` has eight nodes, so random edges close cycles all
the time; batches insert, delete and move edges (updates), cut the edge that
made a path exist, and empty a node's out-edges. Each view must equal
DuckDB's recursive CTE after every batch, which checks that deletes are
exact: a fact on a cycle survives only while something outside the cycle
still derives it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle.fixtures import oracle_schema, read_fixture_views
from tests.oracle.harness import Harness
from tests.oracle.model import generate_batch

VIEWS = read_fixture_views("oracle_views_recursive.sql")


def grow(rng: random.Random, harness: Harness, table: str, size: int) -> list:
    spec = harness.model.specs[table]
    return [("r", spec.gen(rng)) for _ in range(size)]


def recursive_stream(seed: int, batches: int, views=VIEWS) -> None:  # noqa: ANN001
    rng = random.Random(seed)
    harness = Harness(oracle_schema(), views)
    try:
        harness.apply("links", grow(rng, harness, "links", rng.choice([0, 6, 20])))
        harness.apply("customers", grow(rng, harness, "customers", 8))
        harness.create_views()
        harness.check(f"after creating the views (seed {seed})")
        for step in range(batches):
            table = "customers" if rng.random() < 0.15 else "links"
            if rng.random() < 0.3:
                ops = grow(rng, harness, table, rng.choice([1, 3, 10]))
            else:
                ops = generate_batch(rng, harness.model, table, rng.choice([1, 1, 2, 3, 5, 12, 40]))
            harness.apply(table, ops)
            harness.check(f"after batch {step}: {len(ops)} ops on {table} (seed {seed}): {ops}")
    finally:
        harness.close()


# Eight nodes make every few random edges close a cycle, and each batch inserts, deletes and moves
# edges, so four seeds (plus the long streams) reach the cases eight did, in half the time.
@settings(max_examples=3)  # the suite's 25-minute budget (session 22)
@given(st.integers(0, 2**32 - 1))
def test_recursive_views_equal_recompute_after_every_batch(seed):
    recursive_stream(seed, batches=12)


@pytest.mark.slow
@settings(max_examples=1)  # the suite's 25-minute budget (session 22)
@given(st.integers(0, 2**32 - 1))
def test_long_streams(seed):
    recursive_stream(seed, batches=40)
