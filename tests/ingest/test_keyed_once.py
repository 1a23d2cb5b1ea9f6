"""The Arrow conversion of batches naming each key once (ivm/ingest/keyed_once.py) against DuckDB's (ivm/ingest/changes.py)."""

import decimal
import random

import numpy as np
import pyarrow as pa
import pytest

import ivm
from storage.zset import WEIGHT
from ivm.ingest import keyed_once
from sql_frontend.errors import ChangeError
from tests.oracle.compare import multiset_diff

COLUMNS = "id INTEGER PRIMARY KEY, x DOUBLE, s VARCHAR, d DECIMAL(9, 2), t TIMESTAMP"
XS = [None, 0.0, -0.0, float("nan"), 1.5, float("inf")]
SS = [None, "", "a", "b"]
DS = [None, decimal.Decimal("1.10"), decimal.Decimal("-2.00")]


def rows(rng: random.Random, ids: list[int], ops: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int32()),
        "x": pa.array([rng.choice(XS) for _ in range(n)], pa.float64()),
        "s": pa.array([rng.choice(SS) for _ in range(n)], pa.string()),
        "d": pa.array([rng.choice(DS) for _ in range(n)], pa.decimal128(9, 2)),
        "t": pa.array([rng.choice([None, 0, 10**12]) for _ in range(n)], pa.timestamp("us")),
        "__op": pa.array(ops, pa.string()),
    })


def both(db, batch: pa.Table, policy: str):
    engine = db._engine
    definition = engine.catalog.table("t")
    relation = engine.store.snapshot["t"]
    worker = engine.small
    schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
    normalized = worker.normalizer.normalize(definition, schema, batch)
    codes = worker.coder.codes(normalized, definition.identity)
    existing = relation.lookup(definition.identity, codes, positions=True)
    assert keyed_once.applies(definition.primary_key, normalized.schema)
    def arrow():
        result = keyed_once.convert(definition.column_names, "id", normalized, codes, existing, policy, worker.coder)
        worker.applier._raise_errors(definition, result)  # as ChangeApplier.apply does
        return result

    outcomes = []
    for run in (lambda: worker.applier._keyed_once(definition, normalized, existing, policy), arrow):
        try:
            outcomes.append(run())
        except ChangeError as e:
            outcomes.append(str(e))
    return outcomes


@pytest.mark.parametrize("seed", range(12))
def test_the_arrow_conversion_returns_duckdbs_rows(seed):
    rng = random.Random(seed)
    with ivm.connect() as db:
        db.execute(f"CREATE TABLE t ({COLUMNS})")
        stored = rng.sample(range(40), 25)
        db.apply_changes("t", rows(rng, stored, ["c"] * len(stored)))
        for step in range(6):
            ids = rng.sample(range(50), rng.randint(1, 20))
            ops = [rng.choice("cudr") if step % 2 else rng.choice("udr") for _ in ids]
            batch = rows(rng, ids, ops)
            if step % 3 == 0:  # re-send stored rows unchanged: no change for those keys
                same = db.sql("SELECT * FROM t ORDER BY id LIMIT 5").append_column("__op", pa.array(["u"] * 5))
                batch = pa.concat_tables([batch.filter(pa.array([i not in same.column("id").to_pylist()
                                                                  for i in ids])), same.cast(batch.schema)])
            for policy in ("error", "ignore"):
                duck_rows, arrow_rows = both(db, batch, policy)
                if isinstance(duck_rows, str) or isinstance(arrow_rows, str):
                    assert duck_rows == arrow_rows
                    continue
                assert multiset_diff(arrow_rows, duck_rows.cast(arrow_rows.schema)) is None, (seed, step, policy)
            db.apply_changes("t", batch, on_missing_delete="ignore") if "c" not in ops else None


@pytest.mark.parametrize("seed", range(8))
def test_the_conversion_knows_the_update_pairs_pruning_finds(seed):
    """``ZsetChange.pairs`` (given to pruning instead of sorting the delta's key codes) are exactly the
    pairs ``prune.key_pairs`` finds in the delta: -old/+new rows alone with their key, whether every
    stored row found is removed or not, every batch row inserted or not, and rows sent unchanged."""
    from delta_operators.prune import key_pairs

    rng = random.Random(seed)
    with ivm.connect() as db:
        db.execute(f"CREATE TABLE t ({COLUMNS})")
        stored = rng.sample(range(40), 25)
        db.apply_changes("t", rows(rng, stored, ["c"] * len(stored)))
        engine, worker = db._engine, db._engine.small
        definition = engine.catalog.table("t")
        checked = 0
        for step in range(8):
            live = db.sql("SELECT id FROM t").column("id").to_pylist()
            ids = rng.sample(live, rng.randint(0, len(live))) + list(range(100 + 10 * step, 100 + 10 * step + rng.randint(0, 6)))
            ops = [rng.choice("ud") if i in live else "c" for i in ids]
            batch = rows(rng, ids, ops)
            if step % 2:  # rows sent unchanged: no change for their keys, no pair
                same = db.sql("SELECT * FROM t ORDER BY id LIMIT 4")
                same = same.filter(pa.array([i not in ids for i in same.column("id").to_pylist()]))
                batch = pa.concat_tables([batch, same.append_column("__op", pa.array(["u"] * same.num_rows)).cast(batch.schema)])
            relation = engine.store.snapshot["t"]
            schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
            normalized = worker.normalizer.normalize(definition, schema, batch)
            change = worker.applier.apply(definition, relation, normalized, "error")
            if change.pairs is not None:
                found = key_pairs(change.delta, worker.coder.codes(change.delta, definition.primary_key))
                assert sorted(zip(*map(list, change.pairs))) == sorted(zip(*map(list, found))), (seed, step)
                checked += len(found[0])
            db.apply_changes("t", batch)
        assert checked  # updates were made and paired


def test_keys_of_any_comparable_columns():
    schema = pa.schema([("id", pa.int64()), ("v", pa.list_(pa.int64()))])
    assert not keyed_once.applies(("id",), schema)
    assert not keyed_once.applies(("v",), pa.schema([("v", pa.month_day_nano_interval())]))
    assert not keyed_once.applies((), pa.schema([("v", pa.string())]))
    assert keyed_once.applies(("v",), pa.schema([("v", pa.string())]))
    assert keyed_once.applies(("a", "b"), pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    assert keyed_once.applies(("id",), pa.schema([("id", pa.int16()), ("s", pa.string())]))


def test_new_keys_without_deletes_are_inserted_as_they_are():
    """A batch of distinct keys none of which is stored, without deletes (a bulk load), skips the
    join: its change is DuckDB's (``_keyed_once``) rows, every row +1, and the inserts share the delta."""
    rng = random.Random(7)
    with ivm.connect() as db:
        db.execute("CREATE TABLE p (a INTEGER, b VARCHAR, x DOUBLE, d DECIMAL(9, 2), PRIMARY KEY (a, b))")
        engine, worker = db._engine, db._engine.small
        definition = engine.catalog.table("p")
        names = list(definition.column_names)

        def batch(keys, ops):
            return pa.table({"a": pa.array([k[0] for k in keys], pa.int32()), "b": [k[1] for k in keys],
                             "x": pa.array([rng.choice(XS) for _ in keys], pa.float64()),
                             "d": pa.array([rng.choice(DS) for _ in keys], pa.decimal128(9, 2)), "__op": ops})

        # Into the empty table, then beside 3,000 stored keys (more than a lookup returns whole).
        for keys, ops in ((list(zip(range(3000), "ab" * 1500)), ["c"] * 3000),
                          (list(zip(range(3000, 3010), "b" * 10)), list("curcurcurc"))):
            relation = engine.store.snapshot["p"]
            schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
            normalized = worker.normalizer.normalize(definition, schema, batch(keys, ops))
            change = worker.applier.apply(definition, relation, normalized, "error")
            assert change.inserts is change.delta and len(change.delete_runs) == 0  # no join ran
            existing = relation.lookup(definition.identity, worker.coder.codes(normalized, definition.identity),
                                       positions=True)
            expected = worker.applier._keyed_once(definition, normalized, existing, "error")
            assert multiset_diff(change.delta, expected.select(names + [WEIGHT]).cast(change.delta.schema)) is None
            db.apply_changes("p", batch(keys, ops).drop_columns(["__op"]).append_column("__op", pa.array(ops)))
        assert db.sql("SELECT count(*) AS n FROM p").column("n").to_pylist() == [3010]
        # A stored key or a delete takes the join: a duplicate insert is still refused, nothing changes.
        for keys, ops, message in (([(1, "b"), (5002, "a")], ["c", "c"], "duplicate key"),
                                   ([(5000, "a"), (5001, "a")], ["c", "d"], r"delete \('d'\) from p of missing")):
            with pytest.raises(ChangeError, match=message):
                db.apply_changes("p", batch(keys, ops))
            assert db.sql("SELECT count(*) AS n FROM p").column("n").to_pylist() == [3010]


class Colliding:
    """A key coder whose codes collide (a's parity only): matching must re-check the keys."""

    def __init__(self, real):  # noqa: ANN001
        self.real = real

    def codes(self, table, columns):  # noqa: ANN001, ANN201
        return np.asarray(table.column("a").to_numpy(zero_copy_only=False) % 2, dtype=np.uint64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("colliding", [False, True])
def test_keys_of_several_columns_convert_as_duckdb_does(seed, colliding):
    """A key of (INTEGER, VARCHAR), hashed in numpy and re-checked, gives ``_keyed_once``'s rows."""
    rng = random.Random(seed)
    keys = [(a, b) for a in range(8) for b in ("x", "y", "", "é")]

    def batch(chosen, ops):
        return pa.table({"a": pa.array([k[0] for k in chosen], pa.int32()), "b": [k[1] for k in chosen],
                         "x": pa.array([rng.choice(XS) for _ in chosen], pa.float64()),
                         "d": pa.array([rng.choice(DS) for _ in chosen], pa.decimal128(9, 2)), "__op": ops})

    with ivm.connect() as db:
        db.execute("CREATE TABLE p (a INTEGER, b VARCHAR, x DOUBLE, d DECIMAL(9, 2), PRIMARY KEY (a, b))")
        engine, worker = db._engine, db._engine.small
        definition = engine.catalog.table("p")
        stored = rng.sample(keys, 14)
        db.apply_changes("p", batch(stored, ["c"] * len(stored)))
        coder = Colliding(worker.coder) if colliding else worker.coder
        for step in range(5):
            chosen = rng.sample(keys, rng.randint(1, 12))
            ops = [rng.choice("cudr") if step % 2 else rng.choice("udr") for _ in chosen]
            relation = engine.store.snapshot["p"]
            schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
            normalized = worker.normalizer.normalize(definition, schema, batch(chosen, ops))
            codes = coder.codes(normalized, definition.identity)
            existing = relation.all_rows(positions=True)  # a superset, as a lookup may return
            for policy in ("error", "ignore"):
                duck_rows, arrow_rows = (
                    _result_or_error(lambda: _checked(worker, definition, run()))
                    for run in (lambda: worker.applier._keyed_once(definition, normalized, existing, policy),
                                lambda: keyed_once.convert(definition.column_names, ("a", "b"), normalized, codes,
                                                           existing, policy, coder)))
                if isinstance(duck_rows, str) or isinstance(arrow_rows, str):
                    assert duck_rows == arrow_rows
                    continue
                assert multiset_diff(arrow_rows, duck_rows.cast(arrow_rows.schema)) is None, (seed, step, policy)
            if "c" not in ops:
                db.apply_changes("p", batch(chosen, ops), on_missing_delete="ignore")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("several", [False, True])
def test_batches_repeating_keys_convert_as_duckdb_does(seed, several):
    """Keys named several times apply in __seq order (``repeated``): DuckDB's ``_keyed`` rows and errors.
    With a coder whose codes collide, a batch is either converted the same or handed back (None)."""
    rng = random.Random(seed)
    with ivm.connect() as db:
        if several:
            db.execute("CREATE TABLE t (a INTEGER, b VARCHAR, x DOUBLE, s VARCHAR, d DECIMAL(9, 2), t TIMESTAMP, "
                       "PRIMARY KEY (a, b))")
        else:
            db.execute(f"CREATE TABLE t ({COLUMNS})")
        engine, worker = db._engine, db._engine.small
        definition = engine.catalog.table("t")
        key = definition.primary_key

        def batch(ids, ops):
            table = rows(rng, ids, ops)
            if several:
                table = table.rename_columns(["a", "x", "s", "d", "t", "__op"])
                table = table.add_column(1, "b", pa.array([rng.choice(["p", "q"]) for _ in ids]))
            return table

        db.apply_changes("t", batch(rng.sample(range(30), 15), ["c"] * 15), on_missing_delete="ignore")
        for step in range(6):
            ids = [rng.randrange(12) for _ in range(rng.randint(2, 16))]
            ops = [rng.choice("cudr" if step % 2 else "udrd") for _ in ids]
            relation = engine.store.snapshot["t"]
            schema = relation.schema.remove(relation.schema.get_field_index(WEIGHT))
            normalized = worker.normalizer.normalize(definition, schema, batch(ids, ops))
            for coder in (worker.coder, Colliding(worker.coder)):
                if coder is not worker.coder and not several:
                    continue  # an integer key is its own code
                codes = coder.codes(normalized, definition.identity)
                existing = relation.all_rows(positions=True)
                for policy in ("error", "ignore"):
                    duck_rows = _result_or_error(lambda: worker.applier._keyed(definition, normalized, existing, policy))
                    done = keyed_once.repeated(definition.column_names, key, normalized, codes, existing, policy,
                                               coder)
                    if done is None:
                        assert coder is not worker.coder, "only colliding codes hand a batch back"
                        continue
                    arrow_rows = _result_or_error(
                        lambda: (_checked(worker, definition, done.errors), (done.olds, done.news))[1])
                    if isinstance(duck_rows, str) or isinstance(arrow_rows, str):
                        assert duck_rows == arrow_rows
                        continue
                    names = list(definition.column_names)
                    olds, news = arrow_rows
                    minus = duck_rows.filter(pa.compute.equal(duck_rows.column(WEIGHT), -1))
                    plus = duck_rows.filter(pa.compute.equal(duck_rows.column(WEIGHT), 1))
                    assert multiset_diff(olds.select(names + ["__run", "__pos"]),
                                         minus.select(names + ["__run", "__pos"]).cast(olds.schema)) is None
                    assert multiset_diff(news, plus.select(names).cast(news.schema)) is None
            if "c" not in ops:
                db.apply_changes("t", batch(ids, ops), on_missing_delete="ignore")


def _result_or_error(run):
    """What ``run`` returns, or the message of the ChangeError it raises (both paths must agree on either)."""
    try:
        return run()
    except ChangeError as e:
        return str(e)


def _checked(worker, definition, rows: pa.Table) -> pa.Table:
    """``rows`` after raising the errors they record, as the engine does."""
    if rows.num_rows:
        worker.applier._raise_errors(definition, rows)
    return rows
