"""Stored views read by other engines without export copies (issue 4, acceptance 3).

DuckDB reads the Parquet files of the current Delta version; Spark (a real
local session) reads the same files with spark.read.parquet; the Delta Lake
reader (deltalake) reads the Delta table at the manifest's version. All sum
__weight per distinct row (the checkpoint after the first appended each
relation's difference: removed rows carry negative weights), keep the rows
whose sum is positive, expand them into copies and must equal db.sql.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute below)
import pytest

import ivm
from storage import checkpoint as checkpoint_module
from tests.oracle.compare import multiset_diff

VIEWS = {
    "per_cust": "SELECT cust, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY cust",  # computed on read
    "bag": "SELECT kind FROM events",  # rows repeat: weights above 1
    "joined": "SELECT o.id, c.region FROM orders o JOIN customers c ON o.cust = c.id WHERE o.amount > 2",
}


# docs/durability.md, "Reading stored relations from other engines"
DUCKDB_SQL = """SELECT t.* EXCLUDE (__weight) FROM (
    SELECT * EXCLUDE (__weight), SUM(__weight)::BIGINT AS __weight FROM read_parquet([{files}])
    GROUP BY ALL HAVING SUM(__weight) > 0) t, range(t.__weight)"""
APPENDED = ("orders", "events", "bag", "joined")  # relations whose second checkpoint appends


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("external")
    small = checkpoint_module.APPEND_MIN_ROWS
    checkpoint_module.APPEND_MIN_ROWS = 0  # these relations are small: let them take the append path
    try:
        yield from _stored(path)
    finally:
        checkpoint_module.APPEND_MIN_ROWS = small


def _stored(path):
    import json

    db = ivm.connect(path)
    db.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)")
    db.execute("CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR)")
    db.execute("CREATE TABLE events (kind VARCHAR, val INTEGER)")
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    db.apply_changes("customers", pa.table({"id": [1, 2, 3], "region": ["north", "south", None]}))
    db.apply_changes("orders", pa.table({"id": list(range(30)), "cust": [i % 4 for i in range(30)],
                                         "amount": [i / 3 for i in range(30)]}))
    db.execute("INSERT INTO events VALUES ('a', 1), ('a', 2), ('a', 3), ('b', NULL), (NULL, 1)")
    db.execute("INSERT INTO events SELECT CASE WHEN i % 4 = 0 THEN NULL ELSE chr((99 + i % 20)::INTEGER) END, i % 2 "
               "FROM range(60) r(i)")
    db.checkpoint()
    first = json.loads((path / "checkpoint.json").read_text())["relations"]
    db.execute("DELETE FROM orders WHERE id < 5")
    db.execute("UPDATE orders SET amount = amount + 10, cust = 3 WHERE id IN (11, 21)")
    db.execute("DELETE FROM events WHERE kind IN ('d', 'h') AND val = 1")
    db.execute("INSERT INTO events VALUES ('a', 1), ('z', NULL), (NULL, 1)")
    db.checkpoint()
    second = json.loads((path / "checkpoint.json").read_text())["relations"]
    for name in APPENDED:
        assert second[name]["appends"] == 1 and second[name]["version"] == first[name]["version"] + 1, name
    yield db
    db.close()


def test_stored_files_hold_appended_removals(stored):
    """The readers below meet negative weights: the sums are not optional."""
    import duckdb

    for name in APPENDED:
        files = ", ".join(f"'{f}'" for f in stored.stored_files(name))
        assert len(stored.stored_files(name)) == 2, name
        negative = duckdb.sql(f"SELECT count(*) FROM read_parquet([{files}]) WHERE __weight < 0").fetchall()[0][0]
        assert negative > 0, name


def test_duckdb_reads_stored_views(stored):
    import duckdb

    con = duckdb.connect()
    for name in list(VIEWS) + ["orders", "events"]:
        files = ", ".join(f"'{f}'" for f in stored.stored_files(name))
        outside = con.sql(DUCKDB_SQL.format(files=files))
        assert multiset_diff(outside.to_arrow_table(), stored.sql(f"SELECT * FROM {name}")) is None, name


@pytest.mark.slow
def test_spark_reads_stored_views(stored):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[1]").appName("ivm-external-read")
             .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        for name in list(VIEWS) + ["orders", "events"]:
            df = spark.read.parquet(*stored.stored_files(name))
            keys = [c for c in df.columns if c != "__weight"]
            summed = df.groupBy(*keys).agg(F.sum("__weight").alias("__weight")).where("__weight > 0")
            rows = summed.selectExpr("*", "explode(sequence(1, __weight)) AS __copy").drop("__weight", "__copy")
            want = stored.sql(f"SELECT * FROM {name}")
            got = pa.Table.from_pylist([r.asDict() for r in rows.collect()], schema=want.schema)
            assert multiset_diff(got, want) is None, name
    finally:
        spark.stop()


def test_the_delta_reader_reads_stored_views_at_the_manifest_version(stored):
    """The Delta Lake reader (deltalake), time-travelling to the version that
    checkpoint.json names, sees the same rows (docs/durability.md: Reading stored relations)."""
    import json

    import numpy as np
    from deltalake import DeltaTable

    root = Path(stored.path)
    manifest = json.loads((root / "checkpoint.json").read_text())
    for name in list(VIEWS) + ["orders", "events"]:
        entry = manifest["relations"].get(name) or manifest["outputs"][name]
        table = DeltaTable(str(root / "relations" / entry["dir"]), version=entry["version"]).to_pyarrow_table()
        keys = [c for c in table.column_names if c != "__weight"]
        table = table.group_by(keys, use_threads=False).aggregate([("__weight", "sum")])
        table = table.filter(pa.compute.greater(table.column("__weight_sum"), 0))
        weights = table.column("__weight_sum").to_numpy()
        rows = table.select(keys).take(np.repeat(np.arange(table.num_rows), weights))
        assert multiset_diff(rows, stored.sql(f"SELECT * FROM {name}")) is None, name
