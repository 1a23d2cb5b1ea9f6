"""Stored views read by other engines without export copies (issue 4, acceptance 3).

DuckDB reads the Parquet files of the current Delta version; Spark (a real
local session) reads the same files with spark.read.parquet; the Delta Lake
reader (deltalake) reads the Delta table at the manifest's version. All
expand the __weight column into copies and must equal db.sql.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import ivm
from tests.oracle.compare import multiset_diff

VIEWS = {
    "per_cust": "SELECT cust, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY cust",  # computed on read
    "bag": "SELECT kind FROM events",  # rows repeat: weights above 1
    "joined": "SELECT o.id, c.region FROM orders o JOIN customers c ON o.cust = c.id WHERE o.amount > 2",
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("external")
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
    db.execute("DELETE FROM orders WHERE id < 5")
    db.checkpoint()
    yield db
    db.close()


def test_duckdb_reads_stored_views(stored):
    import duckdb

    con = duckdb.connect()
    for name in list(VIEWS) + ["orders"]:
        files = ", ".join(f"'{f}'" for f in stored.stored_files(name))
        outside = con.sql(f"SELECT t.* EXCLUDE (__weight) FROM read_parquet([{files}]) t, range(t.__weight)")
        assert multiset_diff(outside.to_arrow_table(), stored.sql(f"SELECT * FROM {name}")) is None, name


@pytest.mark.slow
def test_spark_reads_stored_views(stored):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("ivm-external-read")
             .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        for name in VIEWS:
            df = spark.read.parquet(*stored.stored_files(name))
            rows = df.selectExpr("*", "explode(sequence(1, __weight)) AS __copy").drop("__weight", "__copy")
            want = stored.sql(f"SELECT * FROM {name}")
            got = pa.Table.from_pylist([r.asDict() for r in rows.collect()], schema=want.schema)
            assert multiset_diff(got, want) is None, name
    finally:
        spark.stop()


def test_the_delta_reader_reads_stored_views_at_the_manifest_version(stored):
    """The Delta Lake reader (deltalake), time-travelling to the version that
    checkpoint.json names, sees the same rows (README: Reading stored relations)."""
    import json

    import numpy as np
    from deltalake import DeltaTable

    root = Path(stored.path)
    manifest = json.loads((root / "checkpoint.json").read_text())
    for name in list(VIEWS) + ["orders"]:
        entry = manifest["relations"].get(name) or manifest["outputs"][name]
        table = DeltaTable(str(root / "relations" / entry["dir"]), version=entry["version"]).to_pyarrow_table()
        weights = table.column("__weight").to_numpy()
        assert (weights > 0).all()
        rows = table.drop_columns(["__weight"]).take(np.repeat(np.arange(table.num_rows), weights))
        assert multiset_diff(rows, stored.sql(f"SELECT * FROM {name}")) is None, name
