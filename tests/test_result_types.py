"""Result types a client expects: a SUM of integers is a BIGINT column (sql_frontend/integer_sums.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import ivm
from ivm.errors import IvmError

TABLE = "CREATE TABLE t (id BIGINT PRIMARY KEY, g INT, a BIGINT, b INT, s SMALLINT, d DECIMAL(10,2), f DOUBLE, " \
        "w DECIMAL(38,0), u UBIGINT)"
VIEW = ("CREATE MATERIALIZED VIEW v AS SELECT g, SUM(a) sa, SUM(b) sb, SUM(s) ss, SUM(a) * 2 s2, SUM(a) + SUM(b) sab, "
        "SUM(d) sd, SUM(f) sf, SUM(w) sw, SUM(CAST(a AS HUGEINT)) sh, SUM(u) su, COUNT(*) c FROM t GROUP BY g")
EXPECTED = {
    "g": pa.int32(), "sa": pa.int64(), "sb": pa.int64(), "ss": pa.int64(), "s2": pa.int64(), "sab": pa.int64(),
    "sd": pa.decimal128(38, 2), "sf": pa.float64(), "sw": pa.decimal128(38, 0), "sh": pa.decimal128(38, 0),
    "su": pa.decimal128(38, 0), "c": pa.int64(),
}
ROWS = "INSERT INTO t VALUES (1, 1, 10, 20, 3, 1.50, 2.0, 5, 7), (2, 1, -4, NULL, 1, 2.25, 0.5, 6, 8), " \
       "(3, 2, 7, 1, 1, 0.00, 1.0, 1, 1)"


def _types(db, name: str) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in db.sql(f"SELECT * FROM {name}").schema}


def _recompute(db, select: str) -> list[dict]:
    return sorted(db.sql(select).to_pylist(), key=str)


def test_integer_sums_are_bigint_and_the_rest_keep_duckdb_types():
    db = ivm.connect()
    db.execute(TABLE)
    db.execute(VIEW)
    db.execute(ROWS)
    assert _types(db, "v") == EXPECTED
    # The values are DuckDB's (compared as numbers: 10 == Decimal(10)).
    select = VIEW.split(" AS ", 1)[1]
    assert sorted(db.sql("SELECT * FROM v").to_pylist(), key=str) == _recompute(db, select)
    assert {r["g"]: r["sa"] for r in db.sql("SELECT * FROM v").to_pylist()} == {1: 6, 2: 7}


def test_sums_from_subqueries_unions_and_windows_are_bigint_too():
    db = ivm.connect()
    db.execute(TABLE)
    db.execute("CREATE MATERIALIZED VIEW sub AS SELECT g, x FROM (SELECT g, SUM(b) x FROM t GROUP BY g) q")
    db.execute("CREATE MATERIALIZED VIEW un AS SELECT SUM(a) x FROM t UNION ALL SELECT SUM(s) FROM t")
    db.execute("CREATE MATERIALIZED VIEW win AS SELECT id, SUM(a) OVER (PARTITION BY g) x FROM t")
    db.execute(ROWS)
    for name in ("sub", "un", "win"):
        assert _types(db, name)["x"] == pa.int64(), name


def test_a_sum_beyond_bigint_is_an_error_that_changes_nothing_and_says_what_to_write():
    db = ivm.connect()
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g INT, a BIGINT)")
    db.execute("CREATE MATERIALIZED VIEW v AS SELECT g, SUM(a) s FROM t GROUP BY g")
    db.execute("CREATE MATERIALIZED VIEW wide AS SELECT g, SUM(CAST(a AS HUGEINT)) s FROM t GROUP BY g")
    db.execute("INSERT INTO t VALUES (1, 1, 9000000000000000000)")
    with pytest.raises(IvmError, match=r"view v: .*SUM\(CAST\(x AS HUGEINT\)\)"):
        db.execute("INSERT INTO t VALUES (2, 1, 9000000000000000000)")
    assert db.sql("SELECT count(*) n FROM t").to_pylist() == [{"n": 1}]
    assert db.sql("SELECT s FROM v").to_pylist() == [{"s": 9000000000000000000}]
    # A view that asked for HUGEINT holds the wide sum; the BIGINT view is dropped to let the write through.
    db.execute("DROP MATERIALIZED VIEW v")
    db.execute("INSERT INTO t VALUES (2, 1, 9000000000000000000)")
    assert db.sql("SELECT s FROM wide").to_pylist() == [{"s": 18000000000000000000}]


def test_a_view_keeps_its_types_across_a_checkpoint_and_a_restart(tmp_path):
    db = ivm.connect(tmp_path)
    db.execute(TABLE)
    db.execute(VIEW)
    db.execute(ROWS)
    db.checkpoint()
    db.execute("INSERT INTO t VALUES (4, 2, 1, 1, 1, 1, 1, 1, 1)")  # in the log, after the checkpoint
    db.close()
    db = ivm.connect(tmp_path)
    assert _types(db, "v") == EXPECTED
    assert {r["g"]: r["sa"] for r in db.sql("SELECT * FROM v").to_pylist()} == {1: 6, 2: 8}
    db.close()


def test_a_view_checkpointed_before_the_rule_keeps_its_hugeint_sums(tmp_path):
    """A checkpoint without recorded types comes from a version that published HUGEINT sums: keep them."""
    db = ivm.connect(tmp_path)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g INT, a BIGINT)")
    db.execute("CREATE MATERIALIZED VIEW v AS SELECT g, SUM(a) s FROM t GROUP BY g")
    db.execute("INSERT INTO t VALUES (1, 1, 5), (2, 1, 6)")
    db.checkpoint()
    db.close()
    manifest = tmp_path / "checkpoint.json"
    doc = json.loads(manifest.read_text())
    for view in doc["catalog"]["views"]:
        del view["types"]
    manifest.write_text(json.dumps(doc))
    db = ivm.connect(tmp_path)
    assert _types(db, "v")["s"] == pa.decimal128(38, 0)
    db.execute("INSERT INTO t VALUES (3, 1, 7)")
    assert db.sql("SELECT s FROM v").to_pylist() == [{"s": 18}]
    db.close()
