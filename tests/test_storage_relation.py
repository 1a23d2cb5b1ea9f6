"""storage.relation: the indexed LSM of runs, against a plain Python model."""

from __future__ import annotations

import decimal
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute below)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.zset import POS, RUN, WEIGHT
from ivm.execute import duck
from sql_frontend.errors import InternalError
from storage import relation as relation_module
from storage.keys import NULL_CODE, KeyCoder
from storage.relation import Relation
from storage.spill import PREFIX, Spill

SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.string()), ("v", pa.float64()), (WEIGHT, pa.int64())])


@pytest.fixture(scope="module")
def coder():
    return KeyCoder(duck.Runner(duckdb.connect()).run)


def rows_table(rows: list[tuple]) -> pa.Table:
    return pa.table(
        {"k": [r[0] for r in rows], "g": [r[1] for r in rows], "v": [r[2] for r in rows], WEIGHT: [1] * len(rows)},
        schema=SCHEMA,
    )


def test_key_codes_equal_for_equal_keys(coder):
    t = pa.table({"a": pa.array([1, None, 1, 2], pa.int64()), "s": ["x", None, "x", "y"],
                  "f": [0.0, -0.0, float("nan"), float("nan")]})
    ints = coder.codes(t, ["a"])
    assert ints[0] == ints[2] and ints[0] != ints[3] and ints[1] == NULL_CODE
    pairs = coder.codes(t, ["a", "s"])
    assert pairs[0] == pairs[2] and pairs[0] != pairs[3]
    floats = coder.codes(t, ["f"])
    assert floats[0] == floats[1], "-0.0 and 0.0 must share a code"
    assert floats[2] == floats[3], "every NaN must share a code"
    narrow = coder.codes(pa.table({"a": pa.array([1, 2], pa.int32())}), ["a"])
    assert list(narrow) == list(ints[[0, 3]]), "integer widths must not change codes"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "delete", "lookup"]),
        st.lists(st.integers(0, 40), min_size=0, max_size=30),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60)
@given(OPS, st.booleans(), st.sampled_from([None, 1, 3]), st.booleans(), st.booleans())
def test_relation_matches_model(ops, force_probing, spill_rows, dense, filtered):
    """Also with runs of at least ``spill_rows`` rows spilled to mapped files (storage/spill.py), with
    the key's index answering by dense offsets in runs of every size (``dense``), and with every
    probe of a searched run going through its filter first (``filtered``)."""
    with tempfile.TemporaryDirectory() as directory, \
            mock.patch.object(relation_module, "DENSE_MIN_ROWS", 0 if dense else 1 << 62), \
            mock.patch.object(relation_module, "FILTER_MIN_PROBES", 0 if filtered else 1 << 62):
        spill = None if spill_rows is None else Spill(Path(directory), spill_rows)
        if force_probing:  # below these sizes lookups would return whole relations
            with mock.patch.object(relation_module, "SMALL_RELATION", 0), \
                    mock.patch.object(relation_module, "PROBE_COST", 0):
                rel = check_against_model(ops, spill)
        else:
            rel = check_against_model(ops, spill)
        assert os.listdir(directory) == [], "spilled files are unlinked once mapped"
        if spill is not None:
            assert all(run.spilled == (run.n_rows >= spill_rows) for run in rel.runs)


def check_against_model(ops, spill=None):
    coder = KeyCoder(duck.Runner(duckdb.connect()).run)
    rel = Relation.empty("t", SCHEMA, ("k",), (("g",),), spill)
    model: dict[int, tuple] = {}
    for kind, keys in ops:
        if kind == "insert":
            new = [k for k in dict.fromkeys(keys) if k not in model]
            rows = [(k, f"g{k % 5}", k / 2) for k in new]
            rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), rows_table(rows), coder)
            model.update({r[0]: r for r in rows})
        elif kind == "delete":
            probe = pa.table({"k": pa.array(keys, pa.int64())})
            found = rel.lookup(("k",), coder.codes(probe, ["k"]), positions=True)
            hit = found.filter(pa.compute.is_in(found.column("k"), value_set=pa.array(keys, pa.int64())))
            rel = rel.replace_rows(hit.column(RUN).to_numpy(), hit.column(POS).to_numpy(), None, coder)
            for k in keys:
                model.pop(k, None)
        else:
            probe = pa.table({"g": [f"g{k % 5}" for k in keys]})
            found = rel.lookup(("g",), coder.codes(probe, ["g"]))
            got = {r["k"] for r in found.to_pylist()}
            want = {k for k, r in model.items() if r[1] in set(probe.column("g").to_pylist())}
            assert want <= got, "a lookup missed matching rows"
            assert got <= set(model), "a lookup returned a deleted row"
        assert sorted(tuple(r.values())[:3] for r in rel.table().to_pylist()) == sorted(model.values())
        assert rel.num_rows == len(model)
        assert len(rel.runs) <= 2 + int(np.log2(max(2, len(model) + 1))) * 2
    return rel


def test_lookup_probes_instead_of_copying_when_large(coder, monkeypatch):
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 10)
    rel = Relation.empty("t", SCHEMA, ("k",))
    rows = [(k, "g", float(k)) for k in range(1000)]
    rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), rows_table(rows), coder)
    found = rel.lookup(("k",), coder.codes(pa.table({"k": pa.array([5, 7, 5000], pa.int64())}), ["k"]), positions=True)
    assert sorted(found.column("k").to_pylist()) == [5, 7], "exactly the probed rows (no collisions here)"
    assert set(found.column_names) >= {RUN, POS}


def test_a_lookup_copies_only_the_columns_asked_for(coder, monkeypatch):
    """Lookup.columns (delta_operators/optimize.py's narrow_lookups): the rest of a row is not copied."""
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 10)
    rel = Relation.empty("t", SCHEMA, ("k",))
    rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64),
                           rows_table([(k, f"g{k}", float(k)) for k in range(1000)]), coder)
    probes = coder.codes(pa.table({"k": pa.array([5, 7, 5000], pa.int64())}), ["k"])
    found = rel.lookup(("k",), probes, positions=True, columns=["k", "v"])
    assert found.column_names == ["k", "v", RUN, POS] and sorted(found.column("v").to_pylist()) == [5.0, 7.0]
    whole = rel.lookup(("k",), probes, positions=True)
    assert found.select([RUN, POS]).sort_by(RUN).equals(whole.select([RUN, POS]).sort_by(RUN))
    none = rel.lookup(("k",), coder.codes(pa.table({"k": pa.array([5000], pa.int64())}), ["k"]), columns=["g"])
    assert none.num_rows == 0 and none.schema == pa.schema([("g", pa.string())])
    assert rel.all_rows(columns=["g"]).column_names == ["g"] and rel.all_rows(columns=["g"]).num_rows == 1000


def test_between_finds_the_live_rows_in_range_in_every_run(coder, monkeypatch):
    """Relation.between: inclusive bounds, NULLs never, deleted rows never, each run searched."""
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 10)  # the lookup of k = 105 below probes
    rel = Relation.empty("t", SCHEMA, ("k",))
    for first in (0, 100, 200):  # appended as runs (merged or not: the rows found are the same)
        rows = [(k, "g", None if k % 10 == 0 else float(k % 100)) for k in range(first, first + 100)]
        rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), rows_table(rows), coder)
    gone = rel.lookup(("k",), coder.codes(pa.table({"k": pa.array([105], pa.int64())}), ["k"]), positions=True)
    rel = rel.replace_rows(gone.column(RUN).to_numpy(), gone.column(POS).to_numpy(), None, coder)
    found = rel.between("v", pa.scalar(4.0), pa.scalar(6.0), positions=True, columns=["k", "v"])
    assert sorted(found.column("k").to_pylist()) == [4, 5, 6, 104, 106, 204, 205, 206]
    assert found.column_names == ["k", "v", RUN, POS]
    assert rel.between("v", pa.scalar(50.5), pa.scalar(50.7)).num_rows == 0
    decimals = Relation.empty("d", pa.schema([("k", pa.int64()), ("x", pa.decimal128(15, 2)), (WEIGHT, pa.int64())]),
                              ("k",))
    decimals = decimals.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), pa.table({
        "k": pa.array([1, 2, 3], pa.int64()), "x": pa.array([1.25, 2.5, 3.75]).cast(pa.decimal128(15, 2)),
        WEIGHT: pa.array([1, 1, 1], pa.int64())}), coder)
    # a DECIMAL column against DOUBLE bounds is compared as doubles
    assert decimals.between("x", pa.scalar(2.5), pa.scalar(3.75)).column("k").to_pylist() == [2, 3]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-10**15 + 1, 10**15 - 1)), min_size=1, max_size=40),
       bounds=st.tuples(st.floats(-1e13, 1e13), st.floats(-1e13, 1e13)), cut=st.integers(0, 5))
def test_decimal_ranges_compare_the_unscaled_integers_as_the_doubles_would(coder, values, bounds, cut):
    """A DECIMAL(15, 2) column against double bounds: the numpy path keeps every row the cast keeps.

    A bound rounds outward to the next cent, so rows within a cent of it may
    be found too (the lookup is a superset the readers re-check): every row
    clearly inside must be found, none clearly outside, and NULLs never. A
    sliced column (offset) reads its own rows.
    """
    low, high = sorted(bounds)
    column = pa.array([None if v is None else decimal.Decimal(v).scaleb(-2) for v in values], pa.decimal128(15, 2))
    table = pa.table({"k": pa.array(range(len(values)), pa.int64()), "x": column,
                      WEIGHT: pa.array([1] * len(values), pa.int64())}).slice(min(cut, len(values) - 1))
    schema = pa.schema([("k", pa.int64()), ("x", pa.decimal128(15, 2)), (WEIGHT, pa.int64())])
    rel = Relation.empty("d", schema, ("k",)).replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), table, coder)
    found = set(rel.between("x", pa.scalar(low), pa.scalar(high)).column("k").to_pylist())
    for k, x in zip(table.column("k").to_pylist(), table.column("x").to_pylist()):
        margin = 0.011 + 1e-12 * abs(float(x)) if x is not None else 0  # a bound rounds out by up to 0.01
        if x is None or float(x) < low - margin or float(x) > high + margin:
            assert k not in found, (k, x, low, high)
        elif low + margin < float(x) < high - margin:
            assert k in found, (k, x, low, high)


def test_many_probes_return_the_whole_relation_unless_scanning_is_off(coder, monkeypatch):
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 10)
    rel = Relation.empty("t", SCHEMA, ("k",))
    rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64),
                           rows_table([(k, "g", float(k)) for k in range(1000)]), coder)
    # 300 probes x PROBE_COST (8) >= 1,000 rows: a copy of the relation is cheaper than probing ...
    probes = coder.codes(pa.table({"k": pa.array(list(range(0, 3000, 10)), pa.int64())}), ["k"])
    assert rel.lookup(("k",), probes).num_rows == 1000
    # ... unless the caller's work grows faster than the rows it gets (the upsert conversion sorts them)
    found = rel.lookup(("k",), probes, positions=True, scan=False)
    assert sorted(found.column("k").to_pylist()) == list(range(0, 1000, 10))
    assert set(found.column_names) >= {RUN, POS}


def test_versions_are_immutable(coder):
    rel = Relation.empty("t", SCHEMA, ("k",))
    v1 = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), rows_table([(1, "a", 1.0), (2, "b", 2.0)]), coder)
    found = v1.all_rows(positions=True)
    first = found.filter(pa.compute.equal(found.column("k"), 1))
    v2 = v1.replace_rows(first.column(RUN).to_numpy(), first.column(POS).to_numpy(), None, coder)
    assert sorted(v1.table().column("k").to_pylist()) == [1, 2], "an old version must not change"
    assert v2.table().column("k").to_pylist() == [2]
    with pytest.raises(InternalError, match="deleted twice"):
        v2.replace_rows(first.column(RUN).to_numpy(), first.column(POS).to_numpy(), None, coder)


def test_lookup_on_missing_index_is_an_internal_error(coder):
    rel = Relation.empty("t", SCHEMA, ("k",))
    with pytest.raises(InternalError, match="no index"):
        rel.lookup(("g",), np.array([1], np.uint64))


@pytest.mark.parametrize("dead", [[0], [5, 6, 7], [999], [0, 500, 999], list(range(0, 1000, 3))])
def test_live_rows_read_as_slices_or_filtered_are_the_same(coder, dead):
    """A run with few dead rows is read as zero-copy slices, with many through a filter: same rows."""
    rows = [(i, f"g{i % 7}", i / 3) for i in range(1000)]
    relation = Relation.empty("r", SCHEMA, ("k",)).replace_rows(np.empty(0, np.int32), np.empty(0, np.int64),
                                                                 rows_table(rows), coder)
    gone = np.array(dead, np.int64)
    after = relation.replace_rows(np.zeros(len(gone), np.int32), gone, None, coder)
    expected = rows_table([r for i, r in enumerate(rows) if i not in set(dead)])
    got = after.table()
    assert got.equals(expected) or got.combine_chunks().equals(expected.combine_chunks())
    sliced = len(dead) * relation_module.SLICE_RATIO <= 1000
    assert (got.column(0).num_chunks > 1) == (sliced and dead not in ([0], [999]))


def test_sorted_unique_is_numpys_unique():
    import numpy as np

    from storage.keys import sorted_unique

    rng = np.random.default_rng(3)
    for values in (np.empty(0, np.uint64), np.array([5], np.uint64), rng.integers(0, 50, 1000).astype(np.uint64),
                   rng.integers(0, 2**63, 300).astype(np.uint64), np.array([3, 1, 3, 2, 1], np.int64)):
        got = sorted_unique(values)
        assert got.dtype == values.dtype
        assert np.array_equal(got, np.unique(values))


def test_tiered_merges_keep_every_key_findable_and_rewrite_each_row_log_fan_in_times(coder, monkeypatch):
    """Size-tiered merges (FAN_IN runs of a level into one): after 150 steps of 500-row upserts
    (80% new keys, 20% rewrites of old ones, some deletes), every live key is found exactly once
    by a lookup, no deleted one is, the runs' indexes are sorted, and merges rewrote each
    inserted row at most log_FAN_IN(rows / step) + 2 times (the old halving policy: ~log2)."""
    merged = [0]
    merge = relation_module._merge

    def counting(runs, keys, spill):
        out = merge(runs, keys, spill)
        merged[0] += out.n_rows
        return out

    monkeypatch.setattr(relation_module, "_merge", counting)
    rng = np.random.default_rng(7)
    rel = Relation.empty("t", SCHEMA, ("k",), (("g",),))
    live = np.empty(0, np.int64)
    nxt = inserted = 0
    for step in range(150):
        new = np.arange(nxt, nxt + 400)
        nxt += 400
        old = rng.choice(live, min(len(live), 100), replace=False) if len(live) else live
        gone = rng.choice(live, min(len(live), 20 if step % 10 == 0 else 0), replace=False) if len(live) else live
        gone = np.setdiff1d(gone, old)
        touched = np.concatenate([old, gone])
        found = rel.lookup(("k",), coder.codes(pa.table({"k": touched}), ["k"]), positions=True)
        hit = found.filter(pa.compute.is_in(found.column("k"), value_set=pa.array(touched)))
        assert sorted(hit.column("k").to_pylist()) == sorted(touched.tolist()), "a live key was not found once"
        keys = np.concatenate([new, old])
        inserts = pa.table({"k": keys, "g": pa.compute.cast(keys % 5, pa.string()),
                            "v": keys / 2, WEIGHT: np.ones(len(keys), np.int64)}, schema=SCHEMA)
        rel = rel.replace_rows(hit.column(RUN).to_numpy(), hit.column(POS).to_numpy(), inserts, coder)
        inserted += len(keys)
        live = np.setdiff1d(np.concatenate([live, new]), gone)
    for run in rel.runs:
        for index in run.indexes.values():
            assert np.all(index.codes[:-1] <= index.codes[1:]), "a run's index is not sorted"
    assert rel.num_rows == len(live)
    assert sorted(rel.table().column("k").to_pylist()) == live.tolist()
    probe = np.concatenate([live, np.setdiff1d(np.arange(nxt), live)])  # every key ever inserted
    found = rel.lookup(("k",), coder.codes(pa.table({"k": probe}), ["k"]))
    got = found.filter(pa.compute.is_in(found.column("k"), value_set=pa.array(probe))).column("k").to_numpy()
    assert np.array_equal(np.sort(got), live), "lookups must find every live key once and no deleted one"
    levels = np.log(inserted / 500) / np.log(relation_module.FAN_IN)
    assert merged[0] <= inserted * (levels + 2), (merged[0] / inserted, levels)
    assert len(rel.runs) <= (relation_module.FAN_IN - 1) * (levels + 2)


def test_runs_whose_rows_die_mid_list_still_merge_so_lookups_probe_few_runs(coder):
    """A view's group state: a fixed set of keys, each step replacing the rows of the keys it
    touches, so every run loses rows and its level falls while it sits mid-list. Settling looks
    at the whole list: oldest first, levels never rise and no level holds FAN_IN adjacent runs,
    so the runs stay about (FAN_IN - 1) per level (checking only the newest runs left 14 runs
    where 4-6 do, per_customer's state at 2M rows). Every key is still found exactly once."""
    rng = np.random.default_rng(11)
    keys = 20_000
    rel = Relation.empty("state", SCHEMA, ("k",))
    every = np.arange(keys)
    rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64),
                           pa.table({"k": every, "g": pa.compute.cast(every % 5, pa.string()), "v": every * 1.0,
                                     WEIGHT: np.ones(keys, np.int64)}, schema=SCHEMA), coder)
    most = 0
    for step in range(120):
        touched = np.unique(rng.integers(0, keys, 700))
        found = rel.lookup(("k",), coder.codes(pa.table({"k": touched}), ["k"]), positions=True, scan=False)
        hit = found.filter(pa.compute.is_in(found.column("k"), value_set=pa.array(touched)))
        assert sorted(hit.column("k").to_pylist()) == touched.tolist(), "a live key was not found once"
        inserts = pa.table({"k": touched, "g": pa.compute.cast(touched % 5, pa.string()),
                            "v": touched + step / 1000, WEIGHT: np.ones(len(touched), np.int64)}, schema=SCHEMA)
        rel = rel.replace_rows(hit.column(RUN).to_numpy(), hit.column(POS).to_numpy(), inserts, coder)
        levels = [relation_module._level(run) for run in rel.runs]
        assert all(a >= b for a, b in zip(levels, levels[1:])), levels
        assert all(len(set(levels[i:i + relation_module.FAN_IN])) > 1
                   for i in range(len(levels) - relation_module.FAN_IN + 1)), levels
        most = max(most, len(rel.runs))
    assert rel.num_rows == keys
    assert sorted(rel.table().column("k").to_pylist()) == every.tolist()

    def level(rows):
        return (rows.bit_length() - 1) // relation_module.LOG2_FAN_IN

    top = level(keys) - level(600)  # levels between one step's run and the whole state
    assert most <= (relation_module.FAN_IN - 1) * (top + 1) + 1, most


@pytest.mark.parametrize("search_end_probes", [0, relation_module.SEARCH_END_PROBES])
def test_counting_equal_codes_is_a_second_binary_search(monkeypatch, search_end_probes):
    """``_equal_from`` steps over equal codes (a few, then searches), or for few probes searches: either
    is the same as searchsorted(side="right")."""
    monkeypatch.setattr(relation_module, "SEARCH_END_PROBES", search_end_probes)
    monkeypatch.setattr(relation_module, "SEARCH_END_CODES", 1 << 16)
    rng = np.random.default_rng(5)
    for _ in range(300):  # keys repeated 0 to ~20 times, some probes beyond the last code
        codes = np.sort(rng.integers(0, 40, int(rng.integers(0, 200))).astype(np.uint64))
        probes = np.unique(rng.integers(0, 45, int(rng.integers(0, 30))).astype(np.uint64))
        lo = np.searchsorted(codes, probes, side="left")
        want = np.searchsorted(codes, probes, side="right") - lo
        assert np.array_equal(relation_module._equal_from(codes, probes, lo), want)


@pytest.mark.parametrize("unique", [True, False])
def test_dense_offsets_find_what_the_binary_search_finds(coder, unique, monkeypatch):
    """A run whose integer codes are dense answers by offsets: the same live rows as the binary
    search for probes inside, between, below and above its codes, with dead rows and NULL keys."""
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 0)
    monkeypatch.setattr(relation_module, "PROBE_COST", 0)
    rng = np.random.default_rng(11)
    n = 40_000
    keys = np.arange(1000, 1000 + n) if unique else rng.integers(1000, 1000 + n // 3, n)
    keys = keys * 2 if unique else keys  # unique keys: every other value, so half the probes miss
    table = pa.table({"k": pa.array(keys, pa.int64()), "g": pa.array(["x"] * n), "v": np.arange(n, dtype=float),
                      WEIGHT: np.ones(n, dtype=np.int64)}, schema=SCHEMA)
    probe_values = np.concatenate([rng.integers(0, 1000 + 3 * n, 3000), [0, 999, 1000, keys.max(), keys.max() + 1]])
    probe = pa.table({"k": pa.array(list(probe_values) + [None], pa.int64())})
    dead = rng.choice(n, n // 5, replace=False)
    found = {}
    for label, min_rows in (("dense", 0), ("search", 1 << 62)):
        monkeypatch.setattr(relation_module, "DENSE_MIN_ROWS", min_rows)
        rel = Relation.empty("t", SCHEMA, ("k",)).replace_rows(
            np.empty(0, np.int32), np.empty(0, np.int64), table, coder)
        rel = rel.replace_rows(np.zeros(len(dead), np.int32), dead, None, coder)
        index = rel.runs[0].indexes[("k",)]
        assert (index.dense() is not None) == (label == "dense")
        assert index.unique == unique
        got = rel.lookup(("k",), coder.codes(probe, ["k"]), positions=True)
        found[label] = sorted(zip(got.column(POS).to_pylist(), got.column("k").to_pylist()))
    assert found["dense"] == found["search"]
    live = np.setdiff1d(np.arange(n), dead)
    assert len(found["dense"]) == int(np.isin(keys[live], probe_values).sum()) > 0


@pytest.mark.parametrize("unique", [True, False])
def test_a_runs_filter_keeps_every_probe_the_search_would_find(coder, unique, monkeypatch):
    """Probes a run's filter drops are absent from it: filtered lookups find the same live rows as
    unfiltered ones, for integer keys with a pattern (multiples of 1,024), random ones and string keys
    (hashed codes), with dead rows; and the filter lets few absent probes through."""
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 0)
    monkeypatch.setattr(relation_module, "PROBE_COST", 0)
    monkeypatch.setattr(relation_module, "DENSE_MIN_ROWS", 1 << 62)
    rng = np.random.default_rng(5)
    n = 3000
    patterned = np.arange(n) * 1024 if unique else rng.integers(0, n // 3, n) * 1024
    for keys in (patterned, rng.integers(-(2**62), 2**62, n) if unique else rng.integers(0, 50, n)):
        for column, values, probes in (
                ("k", keys, np.concatenate([rng.choice(keys, 500), rng.integers(-(2**62), 2**62, 1500),
                                            np.arange(0, 3000 * 1024, 997)])),
                ("g", [f"s{v}" for v in keys], None)):
            if probes is None:
                probes = [f"s{v}" for v in np.concatenate([rng.choice(keys, 500), rng.integers(0, 10**6, 1500)])]
            table = pa.table({"k": pa.array(keys, pa.int64()), "g": pa.array([f"s{v}" for v in keys]),
                              "v": np.arange(n, dtype=float), WEIGHT: np.ones(n, dtype=np.int64)}, schema=SCHEMA)
            dead = rng.choice(n, n // 5, replace=False)
            probe = pa.table({column: pa.array(list(probes), SCHEMA.field(column).type)})
            found = {}
            for label, min_probes in (("filtered", 0), ("searched", 1 << 62)):
                monkeypatch.setattr(relation_module, "FILTER_MIN_PROBES", min_probes)
                rel = Relation.empty("t", SCHEMA, ("k",), (("g",),)).replace_rows(
                    np.empty(0, np.int32), np.empty(0, np.int64), table, coder)
                rel = rel.replace_rows(np.zeros(len(dead), np.int32), dead, None, coder)
                got = rel.lookup((column,), coder.codes(probe, [column]), positions=True)
                found[label] = sorted(got.column(POS).to_pylist())
            assert found["filtered"] == found["searched"] and found["filtered"]
            index = rel.runs[0].indexes[(column,)]
            shift, buckets = index.filter()
            absent = np.setdiff1d(np.unique(coder.codes(probe, [column])), index.codes)
            assert buckets[(index.codes * relation_module._GOLDEN) >> shift].all()
            assert buckets[(absent * relation_module._GOLDEN) >> shift].mean() < 0.3


def test_codes_that_are_not_dense_keep_the_binary_search(coder, monkeypatch):
    monkeypatch.setattr(relation_module, "DENSE_MIN_ROWS", 0)
    spread = pa.table({"k": pa.array(np.arange(0, 10**9, 10**4), pa.int64())})
    negative = pa.table({"k": pa.array([-5, -1, 0, 3], pa.int64())})
    hashed = pa.table({"k": pa.array(np.arange(1000), pa.int64()), "g": pa.array([str(i) for i in range(1000)])})
    assert relation_module.build_index(spread, ("k",), coder).dense() is None
    assert relation_module.build_index(negative, ("k",), coder).dense() is None
    assert relation_module.build_index(hashed, ("g",), coder).dense() is None
    assert relation_module.build_index(hashed, ("k",), coder).dense() is not None


def _mapped_deleted_files(directory) -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if str(directory) in line and line.rstrip().endswith("(deleted)"))


def test_spilled_runs_are_mapped_files_that_answer_like_memory(coder, tmp_path, monkeypatch):
    """The same changes to a spilling and an in-memory relation (inserts, deletes that leave few and
    many dead rows, merges, compaction, a new index) give equal tables and lookups; the spilled runs'
    columns and indexes live in unlinked mapped files, and their row positions are int32."""
    monkeypatch.setattr(relation_module, "SMALL_RELATION", 10)
    spill = Spill(tmp_path, 500)
    spilled = Relation.empty("t", SCHEMA, ("k",), spill=spill)
    memory = Relation.empty("t", SCHEMA, ("k",))
    rng = np.random.default_rng(11)
    for step in range(12):
        rows = rows_table([(k, f"g{k % 9}" if k % 13 else None, k / 4) for k in range(step * 400, step * 400 + 400)])
        gone = rng.choice(step * 400, min(step * 400, 5 if step % 2 else 300), replace=False)
        versions = []
        for rel in (spilled, memory):
            found = rel.lookup(("k",), coder.codes(pa.table({"k": pa.array(gone, pa.int64())}), ["k"]), positions=True)
            hit = found.filter(pa.compute.is_in(found.column("k"), value_set=pa.array(gone, pa.int64())))
            versions.append(rel.replace_rows(hit.column(RUN).to_numpy(), hit.column(POS).to_numpy(), rows, coder))
        spilled, memory = versions
        if step == 6:
            spilled, memory = spilled.with_index(("g",), coder), memory.with_index(("g",), coder)
        assert spilled.table().sort_by("k").equals(memory.table().sort_by("k").cast(spilled.schema))
    probe = coder.codes(pa.table({"g": ["g1", "g4", None]}), ["g"])
    assert spilled.lookup(("g",), probe).sort_by("k").equals(memory.lookup(("g",), probe).sort_by("k"))
    big = [run for run in spilled.runs if run.n_rows >= 500]
    assert big and all(run.spilled for run in big) and not any(run.spilled for run in memory.runs)
    assert spilled.spilled_bytes > 0 and memory.spilled_bytes == 0
    assert all(i.rows.dtype == np.int32 for run in spilled.runs for i in run.indexes.values())
    assert os.listdir(tmp_path) == [], "every spilled file is unlinked once it is mapped"
    assert _mapped_deleted_files(tmp_path) >= len(big) * (len(SCHEMA) + 4)  # columns + 2 indexes x 2 arrays
    con = duckdb.connect()  # DuckDB scans the mapped columns like any Arrow table
    con.register("t", spilled.table())
    want = (pa.compute.sum(memory.table().column("v")).as_py(), memory.num_rows)
    assert con.execute("SELECT sum(v), count(*) FROM t").fetchone() == pytest.approx(want)
    con.close()
    del spilled, big, versions, rel, found, hit
    import gc

    gc.collect()
    assert _mapped_deleted_files(tmp_path) == 0, "dropping the runs unmaps their files"


def test_spill_removes_files_of_dead_processes_only(tmp_path):
    dead = tmp_path / f"{PREFIX}999999999-1-0.arrow"  # above Linux's pid_max: no such process
    mine = tmp_path / f"{PREFIX}{os.getpid()}-1-0.npy"
    other = tmp_path / "notes.txt"
    for path in (dead, mine, other):
        path.write_text("x")
    Spill(tmp_path, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])
    with pytest.raises(ValueError, match="spill_rows"):
        Spill(tmp_path, 0)


def test_lookups_gather_every_column_type_across_runs(coder):
    """Looked-up rows are gathered column by column across runs (numpy for plain values, Arrow for
    NULLs, strings and booleans): the same rows as filtering the whole relation."""
    import decimal

    schema = pa.schema([("k", pa.int64()), ("i", pa.int32()), ("d", pa.decimal128(12, 2)),
                        ("t", pa.timestamp("us")), ("s", pa.string()), ("b", pa.bool_()), (WEIGHT, pa.int64())])

    def part(keys, nulls):
        n = len(keys)
        return pa.table({"k": pa.array(keys, pa.int64()),
                         "i": pa.array([None if nulls and k % 3 == 0 else -k for k in keys], pa.int32()),
                         "d": pa.array([decimal.Decimal(k) / 4 for k in keys], pa.decimal128(12, 2)),
                         "t": pa.array([k * 10**6 for k in keys], pa.timestamp("us")),
                         "s": pa.array([f"s{k}" if k % 2 else None for k in keys]),
                         "b": pa.array([k % 2 == 0 for k in keys]), WEIGHT: pa.array([1] * n, pa.int64())},
                        schema=schema)

    rel = Relation.empty("t", schema, ("k",))
    for start, nulls in ((0, False), (100, True), (200, False)):
        rel = rel.replace_rows(np.empty(0, np.int32), np.empty(0, np.int64), part(range(start, start + 100), nulls),
                               coder)
    assert len(rel.runs) > 1
    keys = [5, 99, 103, 150, 201, 299, 1000]
    probe = pa.table({"k": pa.array(keys, pa.int64())})
    with mock.patch.object(relation_module, "SMALL_RELATION", 0):
        found = rel.lookup(("k",), coder.codes(probe, ["k"]), positions=True)
    assert all(found.column(n).num_chunks == 1 for n in schema.names)
    want = rel.table().filter(pa.compute.is_in(rel.table().column("k"), value_set=pa.array(keys, pa.int64())))
    assert found.select(schema.names).sort_by("k").equals(want.sort_by("k").combine_chunks())


@settings(max_examples=40, deadline=None)
@given(dead=st.lists(st.sets(st.integers(0, 99), max_size=100), min_size=1, max_size=4),
       nulls=st.lists(st.booleans(), min_size=4, max_size=4))
def test_a_merge_keeps_the_live_rows_of_every_column_type_and_their_index(coder, dead, nulls):
    """A merge copies plain values with numpy (one take per run) and the rest with Arrow (NULLs,
    strings, booleans); its index is the runs' indexes without dead rows, renumbered. Every column
    type, runs with and without NULLs and dead rows: the merged run holds exactly the live rows in
    order, and its index finds each of them."""
    schema = pa.schema([("k", pa.int64()), ("i", pa.int32()), ("d", pa.decimal128(12, 2)),
                        ("t", pa.timestamp("us")), ("s", pa.string()), ("b", pa.bool_()), (WEIGHT, pa.int64())])
    runs = []
    for r, gone in enumerate(dead):
        keys = range(r * 100, r * 100 + 100)
        table = pa.table({"k": pa.array(keys, pa.int64()),
                          "i": pa.array([None if nulls[r] and k % 3 == 0 else -k for k in keys], pa.int32()),
                          "d": pa.array([decimal.Decimal(k) / 4 - 7 for k in keys], pa.decimal128(12, 2)),
                          "t": pa.array([k * 10**6 for k in keys], pa.timestamp("us")),
                          "s": pa.array([f"s{k}" if k % 2 else None for k in keys]),
                          "b": pa.array([k % 2 == 0 for k in keys]), WEIGHT: pa.array([1] * 100, pa.int64())},
                         schema=schema)
        run = relation_module.make_run(table, [("k",), ("s",)], coder)
        if gone:
            live = relation_module.all_live(100)
            rows = np.array(sorted(gone))
            np.bitwise_and.at(live, rows >> 3, ~np.left_shift(np.uint8(1), (rows & 7).astype(np.uint8)))
            run = replace(run, live=live, n_live=100 - len(gone))
        runs.append(run)
    runs = [run for run in runs if run.n_live]
    if not runs:
        return
    merged = relation_module._merge(runs, (("k",), ("s",)), None)
    want = pa.concat_tables([run.live_table() for run in runs]).combine_chunks()
    assert merged.live is None and merged.n_live == want.num_rows
    assert merged.table.equals(want)
    for key in (("k",), ("s",)):
        index = merged.indexes[key]
        codes = coder.codes(merged.table, list(key))
        assert np.array_equal(index.codes, np.sort(codes, kind="stable"))
        assert np.array_equal(codes[index.rows.astype(np.int64)], index.codes), "an index row points elsewhere"
        assert sorted(index.rows.tolist()) == list(range(merged.n_live))
