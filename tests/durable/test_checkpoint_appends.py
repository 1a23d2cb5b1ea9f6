"""Checkpoints that append what changed (storage/checkpoint.py, storage/relation.py difference).

A checkpoint appends a relation's difference since its previous stored version
(rows with signed __weight) unless it must or should rewrite it whole; loading
sums the weights per distinct row.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import ivm
from storage.zset import WEIGHT
from ivm.execute import duck
from sql_frontend.errors import InternalError
from storage import checkpoint as checkpoint_module
from storage.checkpoint import RelationFiles, consolidate
from storage.keys import KeyCoder
from storage import relation as relation_module
from storage.relation import Relation, difference
from tests.oracle.compare import multiset_diff

SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.string()), ("v", pa.float64()), (WEIGHT, pa.int64())])


@pytest.fixture(scope="module")
def coder():
    return KeyCoder(duck.Runner(duckdb.connect()).run)


@pytest.fixture
def appends(monkeypatch):
    """Every relation may take the append path (the tests' relations are small)."""
    monkeypatch.setattr(checkpoint_module, "APPEND_MIN_ROWS", 0)


def rows(keys, g="x", v=1.0, weight=1) -> pa.Table:
    keys = list(keys)
    return pa.table({"k": keys, "g": [g] * len(keys), "v": [v] * len(keys), WEIGHT: [weight] * len(keys)},
                    schema=SCHEMA)


def positions(relation: Relation, keys) -> tuple[np.ndarray, np.ndarray]:
    """(run, row) of the live rows whose k is in ``keys``."""
    runs, found = [], []
    for r, run in enumerate(relation.runs):
        live = run.live_rows()
        ks = run.table.column("k").to_numpy()[live]
        hit = live[np.isin(ks, list(keys))]
        runs.append(np.full(len(hit), r, dtype=np.int64))
        found.append(hit)
    return np.concatenate(runs), np.concatenate(found)


def summed(*tables: pa.Table) -> pa.Table:
    return consolidate(pa.concat_tables(tables))


def same(a: pa.Table, b: pa.Table) -> bool:
    return multiset_diff(a, b) is None


# --- the difference of two in-memory versions --------------------------------------------------

def test_difference_of_inserts_deletes_and_updates(coder):
    base = Relation.empty("r", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(100)), coder)
    assert len(base.runs) == 1
    runs, rows_ = positions(base, [1, 2, 3])
    new = base.replace_rows(runs, rows_, pa.concat_tables([rows([2], v=9.0), rows([200, 201])]), coder)
    diff = difference(base, new)
    table = diff.table()
    assert diff.rows == table.num_rows == 3 + 3  # three removed; one updated and two new rows added
    removed = table.filter(pa.compute.less(table.column(WEIGHT), 0))
    assert sorted(removed.column("k").to_pylist()) == [1, 2, 3]
    assert set(removed.column(WEIGHT).to_pylist()) == {-1}
    added = table.filter(pa.compute.greater(table.column(WEIGHT), 0))
    assert sorted(zip(added.column("k").to_pylist(), added.column("v").to_pylist())) == [
        (2, 9.0), (200, 1.0), (201, 1.0)]
    assert same(summed(base.table(), table), new.table())


def test_difference_of_the_same_rows_is_empty(coder):
    base = Relation.empty("r", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(10)), coder)
    assert difference(base, base).rows == 0
    indexed = base.with_index(("g",), coder)  # new Run objects, the same tables and bits
    assert difference(base, indexed).rows == 0
    assert difference(base, indexed).table().num_rows == 0


def test_difference_after_run_merges_and_multiset_weights(coder):
    relation = Relation.empty("r", SCHEMA, ("k",), (("k",),))
    versions = [relation]
    for i in range(12):  # equal-sized runs: settle merges them (FAN_IN at a level)
        relation = relation.replace_rows(np.empty(0, np.int64), np.empty(0, np.int64),
                                         rows(range(i * 4, i * 4 + 4), weight=1 + i % 3), coder)
        versions.append(relation)
    assert len(versions[-1].runs) < 12, "the runs were merged"
    runs, rows_ = positions(relation, [0, 5, 47])
    relation = relation.replace_rows(runs, rows_, rows([5], g="y", weight=3), coder)
    versions.append(relation)
    for old in versions:
        for new in versions:
            diff = difference(old, new)
            assert same(summed(old.table(), diff.table()), new.table())
    merged = difference(versions[3], versions[4])  # the 4th run of level 1 merged the first three
    assert {r.serial for r in versions[4].runs}.isdisjoint({r.serial for r in versions[3].runs})
    assert merged.rows == 4, "rows a merge only moved are left out: the 4 inserted rows remain"
    assert same(summed(versions[3].table(), merged.table()), versions[4].table())


def test_difference_leaves_out_moved_rows_across_merges_and_deletes(coder, monkeypatch):
    """Between two versions: deletes in old runs, inserts, merges of old and new runs (several
    levels), deletes in merged runs. The difference holds exactly the rows changed."""
    none = np.empty(0, np.int64)
    relation = Relation.empty("r", SCHEMA, ("k",), (("k",),))
    for i in range(5):
        relation = relation.replace_rows(none, none, rows(range(i * 40, i * 40 + 40)), coder)
    old = relation
    changed = 0
    for i in range(5, 40):
        gone = [i * 3, i * 3 + 1] if i % 4 == 0 else []
        runs_, rows_ = positions(relation, gone)
        relation = relation.replace_rows(runs_, rows_, rows(range(i * 40, i * 40 + 40)), coder)
        changed += len(gone) + 40
    new = relation
    assert {r.serial for r in old.runs} - {r.serial for r in new.runs}, "old runs were merged away"
    diff = difference(old, new)
    assert diff.rows == changed
    assert same(summed(old.table(), diff.table()), new.table())
    assert same(summed(new.table(), difference(new, old).table()), old.table()), "backwards: falls back"
    monkeypatch.setattr(relation_module, "ORIGIN_DEPTH", 1)  # origins too short: moved rows appear twice
    shallow = Relation.empty("r", SCHEMA, ("k",), (("k",),))
    for i in range(5):
        shallow = shallow.replace_rows(none, none, rows(range(i * 40, i * 40 + 40)), coder)
    start = shallow
    for i in range(5, 40):
        shallow = shallow.replace_rows(none, none, rows(range(i * 40, i * 40 + 40)), coder)
    far = difference(start, shallow)
    assert far.rows > 35 * 40
    assert same(summed(start.table(), far.table()), shallow.table())


def test_difference_of_different_schemas_is_refused(coder):
    a = Relation.empty("r", SCHEMA, ("k",))
    b = Relation.empty("r", SCHEMA.remove(1), ("k",))
    with pytest.raises(InternalError, match="different schemas"):
        difference(a, b)


# --- consolidation on load -------------------------------------------------------------------------

def test_consolidate_sums_weights_per_distinct_row_with_nulls_and_nans():
    nan = float("nan")
    table = pa.table({"k": [1, 1, None, None, 2, 2, 3, 4, 4],
                      "g": ["a", "a", None, None, "b", "b", "c", None, None],
                      "v": [1.0, 1.0, nan, nan, None, None, 0.5, 2.0, 2.0],
                      WEIGHT: [2, 1, 1, 1, 1, -1, 4, 3, -1]}, schema=SCHEMA)
    out = consolidate(table).sort_by([("k", "ascending")])
    got = [(r["k"], r["g"], None if r["v"] is None or r["v"] == r["v"] else "nan", r[WEIGHT])
           for r in out.to_pylist()]
    assert sorted(got, key=str) == sorted([(1, "a", None, 3), (None, None, "nan", 2), (3, "c", None, 4),
                                           (4, None, None, 2)], key=str)
    assert [r["v"] for r in out.to_pylist() if r["k"] == 1] == [1.0]
    assert 2 not in out.column("k").to_pylist(), "a row whose weights sum to 0 is dropped"


def test_consolidate_refuses_a_negative_sum():
    table = pa.table({"k": [1, 1, 2], "g": ["a", "a", "b"], "v": [1.0, 1.0, 2.0], WEIGHT: [1, -2, 1]},
                     schema=SCHEMA)
    with pytest.raises(InternalError, match=r"stored relation t is corrupt: 1 row\(s\) removed more often"):
        consolidate(table, "t")


def test_load_of_a_corrupt_appended_version_raises(tmp_path, coder, appends):
    files = RelationFiles(tmp_path)
    base = Relation.empty("t", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(10)), coder)
    first = files.write_relation("t", base, None, 1, "g")
    new = base.replace_rows(*positions(base, [3]), None, coder)
    second = files.write_relation("t", new, (base, first), 2, "g")
    assert second.appends == 1 and second.appended == 1
    assert files.load(second, SCHEMA).num_rows == 9
    # a removal of a row the table never held (as if a file went missing or was doubled)
    write_deltalake(str(files.path("t")), rows([77], weight=-1), mode="append")
    corrupt = checkpoint_module.StoredVersion("t", second.version + 1, 0, 9, 2, 2)
    with pytest.raises(InternalError, match="corrupt"):
        files.load(corrupt, SCHEMA)


# --- which path a checkpoint takes -------------------------------------------------------------------

def test_append_then_reuse_of_a_crash_left_append(tmp_path, coder, appends):
    """A commit left by a crash (same offset, same generation) is reused, counts and all."""
    files = RelationFiles(tmp_path)
    base = Relation.empty("t", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(10)), coder)
    first = files.write_relation("t", base, None, 1, "g")
    assert (first.appends, first.appended) == (0, 0)
    new = base.replace_rows(*positions(base, [3]), rows([3], v=2.0), coder)
    second = files.write_relation("t", new, (base, first), 2, "g")
    assert (second.version, second.appends, second.appended) == (first.version + 1, 1, 2)
    again = files.write_relation("t", new, (base, first), 2, "g")
    assert again == second
    assert DeltaTable(str(files.path("t"))).version() == second.version, "no new commit"


def test_a_later_commit_than_the_stored_version_forces_an_overwrite(tmp_path, coder, appends):
    """A commit after the stored version (a crash after the relation commit, before the manifest,
    then different changes) must not be appended onto: its rows would count twice."""
    files = RelationFiles(tmp_path)
    base = Relation.empty("t", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(10)), coder)
    first = files.write_relation("t", base, None, 1, "g")
    lost = base.replace_rows(np.empty(0, np.int64), np.empty(0, np.int64), rows([50]), coder)
    files.write_relation("t", lost, (base, first), 2, "g")  # the manifest never named it
    new = base.replace_rows(np.empty(0, np.int64), np.empty(0, np.int64), rows([60]), coder)
    third = files.write_relation("t", new, (base, first), 3, "g")
    assert third.appends == 0 and third.version == first.version + 2
    assert same(files.load(third, SCHEMA), new.table())


def test_share_commits_size_and_schema_bound_appends(tmp_path, coder, monkeypatch, appends):
    files = RelationFiles(tmp_path)
    relation = Relation.empty("t", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(100)), coder)
    stored = files.write_relation("t", relation, None, 1, "g")

    def step(keys, offset):
        nonlocal relation, stored
        new = relation.replace_rows(np.empty(0, np.int64), np.empty(0, np.int64), rows(keys), coder)
        stored = files.write_relation("t", new, (relation, stored), offset, "g")
        relation = new
        assert same(files.load(stored, SCHEMA), relation.table())
        return stored

    assert step(range(100, 120), 2).appends == 1  # 20 of 120 rows
    assert step(range(120, 150), 3).appends == 2  # 50 of 150
    assert step(range(150, 210), 4).appends == 0  # 50 + 60 > 0.5 * 210: overwritten
    monkeypatch.setattr(checkpoint_module, "APPEND_MAX_COMMITS", 2)
    assert [step([k], 5 + i).appends for i, k in enumerate(range(300, 303))] == [1, 2, 0]
    monkeypatch.setattr(checkpoint_module, "APPEND_MIN_ROWS", 1000)
    assert step([400], 9).appends == 0, "a small relation is overwritten"
    monkeypatch.setattr(checkpoint_module, "APPEND_MIN_ROWS", 0)
    wider = Relation.empty("t", SCHEMA.insert(3, pa.field("w", pa.int32())), ("k",))
    wider = wider.replace_all(relation.table().add_column(3, "w", pa.array([1] * relation.num_rows, pa.int32())),
                              coder)
    version = files.write_relation("t", wider, (relation, stored), 10, "g2")
    assert version.appends == 0
    assert files.load(version, wider.schema).column("w").to_pylist() == [1] * wider.num_rows
    assert files.write_relation("t", wider, (wider, version), 11, "g2") == version, "no change: no commit"


def test_old_manifest_entries_read_as_plain_versions():
    old = checkpoint_module.StoredVersion.from_json({"dir": "t", "version": 3, "bytes": 10, "rows": 2})
    assert (old.appended, old.appends) == (0, 0)
    assert checkpoint_module.StoredVersion.from_json(old.to_json()) == old


# --- through the database ------------------------------------------------------------------------------

def manifest(path: Path) -> dict:
    return json.loads((path / "checkpoint.json").read_text())


def delta_of(path: Path, name: str) -> DeltaTable:
    """The Delta table the manifest stores relation ``name`` in."""
    return DeltaTable(str(path / "relations" / manifest(path)["relations"][name]["dir"]))


def rows_of(db, name: str) -> list[str]:
    return sorted(map(str, db.sql(f"SELECT * FROM {name}").to_pylist()))


def test_database_appends_reopens_and_compacts_back_to_plain_files(tmp_path, appends):
    db = ivm.connect(tmp_path, checkpoint_seconds=3600, log_retention_seconds=None)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v DOUBLE, s VARCHAR)")
    db.execute("CREATE TABLE bag (k VARCHAR, x DOUBLE)")
    db.execute("CREATE MATERIALIZED VIEW big AS SELECT id, v FROM t WHERE v > 10")
    db.apply_changes("t", pa.table({"id": list(range(200)), "v": [float(i) for i in range(200)],
                                    "s": [None if i % 7 == 0 else "s" for i in range(200)]}))
    db.execute("INSERT INTO bag SELECT CASE WHEN i % 5 = 0 THEN NULL ELSE 'k' || (i % 20) END, "
               "CASE WHEN i % 9 = 0 THEN 'nan'::DOUBLE WHEN i % 11 = 0 THEN NULL ELSE i % 3 END FROM range(300) r(i)")
    db.checkpoint()
    first = manifest(tmp_path)["relations"]
    db.execute("UPDATE t SET v = -v WHERE id BETWEEN 1 AND 20")
    db.execute("DELETE FROM t WHERE id >= 190")
    db.execute("INSERT INTO t VALUES (500, 1000, NULL)")
    db.execute("DELETE FROM bag WHERE k = 'k1' OR x IS NULL")
    db.execute("INSERT INTO bag VALUES ('k2', 1), ('k2', 1), (NULL, 'nan'::DOUBLE), (NULL, NULL)")
    db.checkpoint()
    second = manifest(tmp_path)["relations"]
    for name in ("t", "bag", "big"):
        assert second[name]["appends"] == 1 and second[name]["version"] == first[name]["version"] + 1, name
        assert second[name]["appended"] > 0
    weights = delta_of(tmp_path, "t").to_pyarrow_table().column(WEIGHT).to_pylist()
    assert weights.count(-1) == 30 and weights.count(1) == 200 + 21
    want = {name: rows_of(db, name) for name in ("t", "bag", "big")}
    db.close()

    db = ivm.connect(tmp_path, checkpoint_seconds=3600, log_retention_seconds=None)
    assert {name: rows_of(db, name) for name in want} == want
    db.execute("UPDATE t SET s = 'z' WHERE id = 5")  # appends onto the loaded version
    db.checkpoint()
    assert manifest(tmp_path)["relations"]["t"]["appends"] == 2
    want["t"] = rows_of(db, "t")
    result = db.compact()
    assert result["relations_vacuumed"] >= 3
    after = manifest(tmp_path)["relations"]
    assert all(entry["appends"] == 0 and entry["appended"] == 0 for entry in after.values())
    plain = delta_of(tmp_path, "t")
    assert len(plain.file_uris()) == 1
    assert min(plain.to_pyarrow_table().column(WEIGHT).to_pylist()) > 0
    assert {name: rows_of(db, name) for name in want} == want
    db.close()
    db = ivm.connect(tmp_path)
    assert {name: rows_of(db, name) for name in want} == want
    db.close()


def test_default_threshold_overwrites_small_relations(tmp_path):
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v DOUBLE)")
    db.apply_changes("t", pa.table({"id": list(range(100)), "v": [1.0] * 100}))
    db.checkpoint()
    db.execute("DELETE FROM t WHERE id = 1")
    db.checkpoint()
    assert manifest(tmp_path)["relations"]["t"]["appends"] == 0
    assert delta_of(tmp_path, "t").to_pyarrow_table().num_rows == 99
    db.close()


def test_status_lists_checkpoint_durations(tmp_path):
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    before = db.status()["checkpoints"]
    db.execute("INSERT INTO t VALUES (1)")
    db.checkpoint()
    status = db.status()
    assert status["checkpoints"] == before + 1
    assert len(status["recent_checkpoint_seconds"]) == min(status["checkpoints"], 10)
    assert status["recent_checkpoint_seconds"][-1] == status["last_checkpoint_seconds"]
    db.close()


def test_a_failed_append_falls_back_to_an_overwrite(tmp_path, coder, monkeypatch, appends, caplog):
    files = RelationFiles(tmp_path)
    base = Relation.empty("t", SCHEMA, ("k",), (("k",),)).replace_all(rows(range(10)), coder)
    first = files.write_relation("t", base, None, 1, "g")
    new = base.replace_rows(*positions(base, [4]), None, coder)

    def refuse(*args, **kwargs):
        raise OSError("no space left for the append")

    monkeypatch.setattr(RelationFiles, "_append", refuse)
    version = files.write_relation("t", new, (base, first), 2, "g")
    assert version.appends == 0 and version.version == first.version + 1
    assert same(files.load(version, SCHEMA), new.table())
    assert "appending to t failed" in caplog.text


def test_checkpointer_counts_rows_appended_and_overwritten(tmp_path, appends):
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v DOUBLE)")
    db.apply_changes("t", pa.table({"id": list(range(100)), "v": [1.0] * 100}))
    db.checkpoint()
    checkpointer = db._engine.checkpointer
    assert checkpointer.written[-1] == (0, 100)
    db.execute("UPDATE t SET v = 2 WHERE id < 3")
    db.checkpoint()
    assert checkpointer.written[-1] == (6, 0)
    db.close()
