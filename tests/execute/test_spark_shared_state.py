"""A Z-set as a Delta table on shared storage, written and read by Spark (issue 28).

storage/shared_zset.py and ivm/execute/spark/shared_state.py: Spark writes
the files, the driver commits them with deltalake. After every commit the
table's content (weights summed per row) equals a model of the changes, read
three ways: by Spark from the files the version names, by deltalake and by
DuckDB. Replayed offsets change nothing, compaction keeps the content, key
statistics prune files, plans scan files (no rows from the driver), and bad
input is refused with nothing written.
"""

from __future__ import annotations

import datetime
import random
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ivm.execute.spark import shared_state
from storage.checkpoint import StorageError
from storage.shared_zset import SharedZSet
from storage.zset import WEIGHT

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2))])
# What a plan shows when it scans rows the driver shipped (createDataFrame of local data or an RDD).
DRIVER_SCANS = ("LocalTableScan", "Scan ExistingRDD", "RDDScan", "Scan RDD")


@pytest.fixture(scope="module")
def spark(spark_conf):
    from ivm.execute.spark.session import session

    return session(spark_conf)


def change_frame(spark, rows: list[tuple]):
    """A change as a DataFrame (test input: here the driver does ship it, as it ships a change batch)."""
    k, name, amount, weight = zip(*rows) if rows else ([], [], [], [])
    table = pa.table({"k": pa.array(k, pa.int64()), "name": pa.array(name, pa.string()),
                      "amount": pa.array(amount, pa.decimal128(12, 2)), WEIGHT: pa.array(weight, pa.int64())})
    return spark.createDataFrame(table)


def spark_content(spark, table: SharedZSet, version=None) -> Counter:
    rows = shared_state.consolidated(shared_state.read(spark, table, version)).collect()
    return Counter({(r.k, r.name, r.amount): r[WEIGHT] for r in rows})


def delta_content(table: SharedZSet, version=None) -> Counter:
    """The content as deltalake reads the version (sums weights itself: a second reader, not Spark)."""
    dt = DeltaTable(str(table.path), version=version)
    con = duckdb.connect()
    con.register("stored", dt.to_pyarrow_table())
    summed = con.sql('SELECT k, name, amount, SUM("__weight")::BIGINT AS w FROM stored '
                     'GROUP BY ALL HAVING SUM("__weight") <> 0').fetchall()
    return Counter({(k, name, amount): w for k, name, amount, w in summed})


def random_change(rng: random.Random, present: Counter) -> list[tuple]:
    """Inserts (NULL keys and names, duplicates) and deletes of rows present, as weighted rows."""
    from decimal import Decimal

    rows = []
    for _ in range(rng.randint(0, 12)):
        k = rng.choice([None, *range(40)])
        name = rng.choice([None, "a", "b", "é"])
        rows.append((k, name, Decimal(rng.randint(-500, 500)) / 100, rng.randint(1, 2)))
    live = [row for row, w in present.items() if w > 0]
    for row in rng.sample(live, min(len(live), rng.randint(0, 6))):
        rows.append((*row, -rng.randint(1, present[row])))
    return rows


def test_appends_replays_and_compaction_keep_the_content(spark, tmp_path):
    table = SharedZSet.create(tmp_path / "t", SCHEMA, cluster_by=("k",))
    rng = random.Random(28)
    model: Counter = Counter()
    history = {}
    for offset in range(1, 9):
        change = random_change(rng, model)
        committed = shared_state.append(table, change_frame(spark, change), offset)
        assert committed.version == table.version and table.offset == offset
        assert committed.rows == len(change)
        for k, name, amount, w in change:
            model[(k, name, amount)] += w
        model = +model  # drop rows whose weight is gone (deletes never go below zero here)
        history[table.version] = Counter(model)
        assert spark_content(spark, table) == model
        assert delta_content(table) == model
        # a batch replayed (the driver died after this commit): nothing is written or committed
        version = table.version
        assert shared_state.append(table, change_frame(spark, change), offset).version is None
        assert table.version == version and spark_content(spark, table) == model
        if offset == 5:
            files = len(table.files())
            done = shared_state.compact(spark, table, offset)
            assert done.version == table.version and table.offset == offset
            assert done.rows == len(model) and len(table.files()) <= files
            assert spark_content(spark, table) == model and delta_content(table) == model
    # every version committed stays readable (time travel: serving reads the version it published)
    for version, content in history.items():
        assert spark_content(spark, table, version) == content
        assert delta_content(table, version) == content
    # ... and is found by the offset it reflects (recovery reads inputs as of the offset before a batch)
    by_offset = {offset: table.version_for(offset) for offset in range(0, 10)}
    assert by_offset[0] == 0 and delta_content(table, 0) == Counter()
    for offset in range(1, 9):  # versions 1-5 for offsets 1-5, the compaction 6, then 7-9 for offsets 6-8
        assert delta_content(table, by_offset[offset]) == history[offset if offset <= 5 else offset + 1]
    assert by_offset[5] == 6  # the compaction's version: the same content, for the same offset
    assert by_offset[9] == table.version
    assert table.orphans() == []


def test_reads_scan_files_never_driver_rows(spark, tmp_path):
    table = SharedZSet.create(tmp_path / "t", SCHEMA, cluster_by=("k",))
    shared_state.append(table, change_frame(spark, [(1, "a", 1, 1), (2, "b", 2, 1)]), 1)
    frame = shared_state.consolidated(shared_state.read(spark, table))
    frame.collect()
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan
    assert not [scan for scan in DRIVER_SCANS if scan in plan], plan


def test_key_statistics_prune_files(spark, tmp_path):
    table = SharedZSet.create(tmp_path / "t", SCHEMA, cluster_by=("k",))
    for offset, keys in enumerate([(1, 5), (10, 20), (30, None)], start=1):
        rows = [(k, "x", 1, 1) for k in keys]
        shared_state.append(table, change_frame(spark, rows).coalesce(1), offset)
    everything = table.files()
    assert len(everything) == 3

    def files_for(*keys):
        return table.files(keys={"k": pa.array(keys, pa.int64())})

    assert len(files_for(12)) == 1 and files_for(12) == files_for(10) == files_for(20)
    assert files_for(3) != files_for(12)
    assert files_for(7, 25) == []  # no file's range holds them
    assert len(files_for(None)) == 1  # only the file holding a NULL key (lookups are NULL-safe)
    assert sorted(files_for(1, 30)) == sorted(set(files_for(1)) | set(files_for(30)))
    # a pruned read returns every row of those keys
    rows = shared_state.read(spark, table, keys={"k": pa.array([12, 20], pa.int64())}).collect()
    assert sorted(r.k for r in rows) == [10, 20]
    # dates prune too
    dated = SharedZSet.create(tmp_path / "d", pa.schema([("day", pa.date32())]), cluster_by=("day",))
    for offset, day in enumerate(["2026-01-01", "2026-06-01"], start=1):
        shared_state.append(dated, spark.sql(f"SELECT DATE'{day}' AS day, 1L AS __weight"), offset)
    assert len(dated.files(keys={"day": pa.array([datetime.date(2026, 6, 1)])})) == 1
    assert len(dated.files(keys={"day": pa.array([datetime.date(2026, 3, 1)])})) == 0
    # columns without exact statistics (strings) never prune
    strings = SharedZSet.create(tmp_path / "s", SCHEMA, cluster_by=("name",))
    shared_state.append(strings, change_frame(spark, [(1, "a", 1, 1)]), 1)
    shared_state.append(strings, change_frame(spark, [(2, "z", 1, 1)]), 2)
    assert len(strings.files(keys={"name": pa.array(["q"])})) == len(strings.files()) == 2


def test_bad_input_is_refused_and_changes_nothing(spark, tmp_path):
    path = tmp_path / "t"
    with pytest.raises(StorageError, match="must not hold __weight"):
        SharedZSet.create(path, SCHEMA.append(pa.field(WEIGHT, pa.int64())))
    with pytest.raises(StorageError, match="lacks"):
        SharedZSet.create(path, SCHEMA, cluster_by=("nope",))
    with pytest.raises(StorageError, match="no shared Z-set"):
        SharedZSet.open(path)
    table = SharedZSet.create(path, SCHEMA, cluster_by=("k",))
    with pytest.raises(StorageError, match="already exists"):
        SharedZSet.create(path, SCHEMA)
    shared_state.append(table, change_frame(spark, [(1, "a", 1, 1)]), 1)
    before = (table.version, spark_content(spark, table), sorted((path / "data").iterdir()))

    wrong_type = change_frame(spark, [(1, "a", 1, 1)]).withColumn("amount", shared_col("amount", "double"))
    with pytest.raises(StorageError, match=r"amount double \(the table's: decimal\(12,2\)\)"):
        shared_state.append(table, wrong_type, 2)
    with pytest.raises(StorageError, match="extra columns"):
        shared_state.append(table, change_frame(spark, [(1, "a", 1, 1)]).withColumn("x", shared_col("k", "bigint")), 2)
    with pytest.raises(StorageError, match="missing"):
        shared_state.append(table, change_frame(spark, [(1, "a", 1, 1)]).drop("name"), 2)
    with pytest.raises(StorageError, match="new_dir"):
        table.commit(tmp_path / "elsewhere", 2)
    # a damaged file in a written directory: the commit fails whole, the directory stays an orphan
    broken = table.new_dir()
    broken.mkdir()
    (broken / "part-0.parquet").write_bytes(b"not parquet")
    pq.write_table(pa.table({"k": [1]}), broken / "part-1.parquet")
    with pytest.raises(StorageError, match="not a readable Parquet file"):
        table.commit(broken, 2)
    (broken / "part-0.parquet").unlink()
    with pytest.raises(StorageError, match=r"has columns \['k'\]"):
        table.commit(broken, 2)
    assert (table.version, spark_content(spark, table)) == before[:2]
    assert table.orphans() == [broken]
    assert table.remove_orphans() == [broken]
    assert sorted((path / "data").iterdir()) == before[2]


def test_a_batch_written_but_not_committed_lands_once(spark, tmp_path):
    """The driver dies between the executors' write and its commit: the files are orphans, the replay lands once."""
    table = SharedZSet.create(tmp_path / "t", SCHEMA, cluster_by=("k",))
    shared_state.append(table, change_frame(spark, [(1, "a", 1, 1)]), 1)
    change = change_frame(spark, [(2, "b", 2, 3), (1, "a", 1, -1)])
    written = shared_state.write(table, change)  # ... and the driver is gone before the commit
    reopened = SharedZSet.open(tmp_path / "t")
    assert reopened.offset == 1 and reopened.orphans() == [written]
    assert reopened.remove_orphans() == [written] and not Path(written).exists()
    assert shared_state.append(reopened, change, 2).version == 2
    assert spark_content(spark, reopened) == Counter({(2, "b", 2): 3})


def shared_col(name: str, type_: str):
    from pyspark.sql import functions as F

    return F.col(name).cast(type_)


def test_a_commit_syncs_its_files_before_naming_them_and_its_log_entry_after(spark, tmp_path, monkeypatch):
    import storage.shared_zset as shared_zset

    table = SharedZSet.create(tmp_path / "t", SCHEMA, cluster_by=("k",))
    directory = shared_state.write(table, change_frame(spark, [(1, "a", 1, 1), (2, "b", 2, 1)]))
    synced: list[Path] = []
    real = shared_zset.sync_path

    def recorded(path):
        if path.name.endswith(".json"):  # the log entry is synced after the commit wrote it
            assert path.exists()
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(shared_zset, "sync_path", recorded)
    table.commit(directory, 1)
    files = [Path(f) for f in table.files()]
    entry = tmp_path / "t" / "_delta_log" / f"{table.version:020d}.json"
    assert files and set(files) <= set(synced) and entry in synced
    assert max(synced.index(f) for f in files) < synced.index(directory) < synced.index(entry)
