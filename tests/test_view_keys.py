"""Stored view rows indexed by the source's primary key (delta_operators/merge.py: output_key).

A view over one keyed table that keeps the key as a plain column holds each
key once, so its stored rows are indexed by that key (an integer key is its
own code) instead of by a hash of the whole row. The merge still matches
whole rows: these tests check the views against DuckDB's recompute while
rows change, vanish, come back and move across the filter, in memory and
across a checkpoint, and that no whole-row hash is computed for them.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import ivm
from delta_operators.merge import output_key
from storage import keys
from tests.oracle.compare import multiset_diff

SCHEMA = ("CREATE TABLE t (id BIGINT PRIMARY KEY, grp VARCHAR, x DOUBLE);"
          "CREATE TABLE pairs (a BIGINT, b VARCHAR, v INTEGER, PRIMARY KEY (a, b));"
          "CREATE TABLE other (id BIGINT PRIMARY KEY, y INTEGER)")
VIEWS = {
    "kept": ("SELECT id, grp, x FROM t WHERE x >= 0 OR x IS NULL", ("id",)),
    "renamed": ("SELECT grp, id AS k, x * 2 AS x2 FROM t", ("k",)),
    "star": ("SELECT * FROM t WHERE grp <> 'b'", ("id",)),
    "both_keys": ("SELECT b, v, a FROM pairs WHERE v > 0", ("a", "b")),
    # Not keyed: the key is not kept as it is, half of it is missing, a join, a GROUP BY, DISTINCT.
    "computed": ("SELECT id + 1 AS j, grp FROM t", ()),
    "half": ("SELECT a, v FROM pairs", ()),
    "joined": ("SELECT t.id, other.y FROM t JOIN other ON t.id = other.id", ()),
    "grouped": ("SELECT grp, COUNT(*) AS n FROM t GROUP BY grp", ()),
    "deduped": ("SELECT DISTINCT id, grp FROM t", ()),
}


def create(db: ivm.Database) -> None:
    db.execute(SCHEMA)
    for name, (sql, _) in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")


def batch(rng: random.Random) -> tuple[pa.Table, pa.Table]:
    """Upserts and deletes over a few keys: rows change, vanish, come back and move across filters."""
    ids = rng.sample(range(12), 6)
    ops = [rng.choice("uuud") for _ in ids]
    t = pa.table({"id": pa.array(ids, pa.int64()), "grp": [rng.choice(["a", "b", None]) for _ in ids],
                  "x": [rng.choice([-1.0, 0.0, 2.5, None]) for _ in ids], "__op": ops})
    keys_ = rng.sample([(a, b) for a in range(4) for b in "xy"], 4)
    pairs = pa.table({"a": pa.array([k[0] for k in keys_], pa.int64()), "b": [k[1] for k in keys_],
                      "v": pa.array([rng.choice([-1, 1, 2, None]) for _ in keys_], pa.int32()),
                      "__op": [rng.choice("uud") for _ in keys_]})
    return t, pairs


def check(db: ivm.Database, note: str) -> None:
    for name, (sql, _) in VIEWS.items():
        assert multiset_diff(db.sql(f"SELECT * FROM {name}"), db.sql(sql)) is None, f"{name} {note}"


def test_the_key_is_found_only_where_one_keyed_table_keeps_it():
    with ivm.connect() as db:
        create(db)
        for name, (_, key) in VIEWS.items():
            view = db._engine.catalog.views[name]
            assert output_key(view.plan.root) == key, name
            if key and view.stored_output:
                assert view.states[0].identity == key


@pytest.mark.parametrize("seed", [1, 2])
def test_views_indexed_by_the_key_equal_the_recompute_after_every_batch(seed, monkeypatch):
    hashed, original = [], keys.KeyCoder._hashed
    monkeypatch.setattr(keys.KeyCoder, "_hashed", lambda self, table, columns: hashed.append(tuple(columns))
                        or original(self, table, columns))
    rng = random.Random(seed)
    with ivm.connect(maintenance="incremental") as db:
        create(db)
        db.execute("INSERT INTO other VALUES (1, 10), (2, 20), (3, 30)")
        for step in range(12):
            t, pairs = batch(rng)
            db.apply_changes("t", t, on_missing_delete="ignore")
            db.apply_changes("pairs", pairs, on_missing_delete="ignore")
            check(db, f"after batch {step} (seed {seed})")
        for name in ("kept", "renamed", "star"):
            assert db._engine.store.snapshot[name].index_keys == (VIEWS[name][1],)
        # Whole rows of the keyed views are never hashed (their keys are integers, or (a, b) for both_keys).
        assert not [c for c in hashed if set(c) in ({"id", "grp", "x"}, {"grp", "k", "x2"})]


def test_a_keyed_view_reloaded_from_a_checkpoint_stays_right(tmp_path):
    rng = random.Random(3)
    with ivm.connect(str(tmp_path / "db")) as db:
        create(db)
        for _ in range(4):
            t, pairs = batch(rng)
            db.apply_changes("t", t, on_missing_delete="ignore")
            db.apply_changes("pairs", pairs, on_missing_delete="ignore")
        db.checkpoint()
    with ivm.connect(str(tmp_path / "db")) as db:
        assert db._engine.store.snapshot["kept"].index_keys[0] == ("id",)
        for step in range(4):
            t, pairs = batch(rng)
            db.apply_changes("t", t, on_missing_delete="ignore")
            db.apply_changes("pairs", pairs, on_missing_delete="ignore")
            check(db, f"after reloading, batch {step}")
