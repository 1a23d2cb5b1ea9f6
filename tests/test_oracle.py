"""The differential oracle over the whole view catalogue (issue 2, acceptance 1).

After every batch of random inserts, updates and deletes (1 to 1,000 rows),
every view must equal DuckDB running its SELECT over the current tables.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.harness import Harness, play

TABLES = ["customers", "orders", "items", "events"]

# Batch sizes: mostly small, sometimes large (a 1,000-row batch over these key
# domains repeats keys many times, exercising in-batch ordering).
SIZES = st.one_of(st.integers(1, 12), st.integers(13, 200), st.sampled_from([500, 1000]))


def run_stream(data, views, batches: int, initial_rows: int) -> None:
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    harness = Harness(oracle_schema(), views)

    def next_batch(step: int) -> tuple[str, int]:
        return data.draw(st.sampled_from(TABLES), label=f"table {step}"), data.draw(SIZES, label=f"size {step}")

    try:
        play(harness, random.Random(seed), TABLES, batches, initial_rows, next_batch, f"(seed {seed})")
    finally:
        harness.close()


@given(st.data())
def test_every_view_equals_recompute_after_every_batch(data):
    run_stream(data, oracle_views(), batches=6, initial_rows=data.draw(st.sampled_from([0, 5, 40])))


@pytest.mark.slow
@settings(max_examples=5)
@given(st.data())
def test_long_streams(data):
    """Fewer, longer streams: state that has lived through many batches (LSM merges)."""
    run_stream(data, oracle_views(), batches=20, initial_rows=20)
