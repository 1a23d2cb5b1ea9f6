"""Batches of tables without a primary key converted in numpy (ivm/ingest/bags.py) against DuckDB's ``_bag``."""

import random

import numpy as np
import pyarrow as pa
import pytest

import ivm
from storage.zset import POS, RUN, WEIGHT
from ivm.ingest import bags
from sql_frontend.errors import ChangeError
from tests.oracle.compare import multiset_diff


def rows(rng: random.Random, n: int, ops: list[str]) -> pa.Table:
    return pa.table({
        "a": pa.array([rng.choice([None, 1, 2]) for _ in range(n)], pa.int32()),
        "x": pa.array([rng.choice([None, 0.5, float("nan"), 2.0]) for _ in range(n)], pa.float64()),
        "s": pa.array([rng.choice([None, "", "u"]) for _ in range(n)], pa.string()),
        "__op": pa.array(ops, pa.string()),
    })


@pytest.mark.parametrize("seed", range(10))
def test_bag_batches_convert_as_duckdb_does(seed):
    rng = random.Random(seed)
    with ivm.connect() as db:
        db.execute("CREATE TABLE b (a INTEGER, x DOUBLE, s VARCHAR)")
        db.apply_changes("b", rows(rng, 20, ["c"] * 20))
        engine, worker = db._engine, db._engine.small
        definition = engine.catalog.table("b")
        names = list(definition.column_names)
        for step in range(5):
            n = rng.randint(1, 25)
            batch = rows(rng, n, [rng.choice("crdd") for _ in range(n)])
            relation = engine.store.snapshot["b"]
            schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
            normalized = worker.normalizer.normalize(definition, schema, batch)
            codes = worker.coder.codes(normalized, definition.identity)
            existing = relation.lookup(definition.identity, codes, positions=True, scan=False)
            for policy in ("error", "ignore"):
                outcomes = []
                for run in (lambda: worker.applier._bag(definition, normalized, existing, policy),
                            lambda: worker.applier._bag_numpy(definition, normalized, codes, existing, policy)):
                    try:
                        outcomes.append(run())
                    except ChangeError as e:
                        outcomes.append(str(e).split(":")[0])  # the rows named come in no set order
                duck_rows, numpy_rows = outcomes
                if isinstance(duck_rows, str) or isinstance(numpy_rows, str):
                    assert duck_rows == numpy_rows
                    continue
                assert numpy_rows is not None
                columns = names + [WEIGHT, RUN, POS, "__new"]
                assert multiset_diff(numpy_rows.select(columns),
                                     duck_rows.select(columns).cast(numpy_rows.select(columns).schema)) is None
            db.apply_changes("b", batch, on_missing_delete="ignore")


def test_negative_zero_and_collisions_go_to_duckdb():
    batch = pa.table({"x": pa.array([-0.0, 0.0]), "__op": ["c", "c"], "__seq": pa.array([0, 1], pa.int64())})
    assert bags.convert(("x",), batch, np.zeros(2, np.uint64), batch.slice(0, 0), "error", None) is None
    batch = pa.table({"x": pa.array([1.0, 2.0]), "__op": ["c", "c"], "__seq": pa.array([0, 1], pa.int64())})
    assert bags.convert(("x",), batch, np.zeros(2, np.uint64), batch.slice(0, 0), "error", None) is None
