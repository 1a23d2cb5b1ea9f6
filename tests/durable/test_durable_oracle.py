"""The differential oracle on durable databases: background folding, checkpoints, reopen.

Every view must equal recompute after every batch (reads wait for the
maintainer), also across checkpoints taken every few hundred changed rows
and after the database is closed and opened again (crashes: tests/crash).
Batches are sent in a burst before
each check, so folds take several batches at once (Z-sets summed per table).
"""

from __future__ import annotations

import random

import pytest

import ivm
from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.harness import Harness
from tests.oracle.model import generate_batch

TABLES = ["customers", "orders", "items", "events"]
OPTIONS = dict(checkpoint_rows=300, checkpoint_seconds=0.2, fold_delay=0.01)


def stream(path, seed: int, rounds: int, burst: int, options: dict | None = None) -> None:
    options = options or OPTIONS
    rng = random.Random(seed)
    harness = Harness(oracle_schema(), oracle_views(), db=ivm.connect(path, **options))
    try:
        for table in TABLES:
            harness.apply(table, generate_batch(rng, harness.model, table, 20))
        harness.create_views()
        harness.check("after creating the views")
        for step in range(rounds):
            for _ in range(burst):
                table = rng.choice(TABLES)
                harness.apply(table, generate_batch(rng, harness.model, table, rng.choice([1, 5, 30, 200])))
            harness.check(f"round {step} (seed {seed})")
            if step == rounds // 2:
                harness.db.close()
                harness.db = ivm.connect(path, **options)
                harness.check(f"after reopening (seed {seed})")
    finally:
        harness.close()


def test_every_view_equals_recompute_on_a_durable_database(tmp_path):
    stream(tmp_path, seed=11, rounds=4, burst=4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [12])
def test_longer_durable_streams(tmp_path, seed):
    stream(tmp_path, seed=seed, rounds=6, burst=6)  # the suite's 25-minute budget (session 22)
