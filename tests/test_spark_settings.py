"""Engine choice (issue 6): settings, their errors, EXPLAIN/status, ``auto``, the Spark dialect layer.

Most tests here need no Spark; those that do share the session's one
SparkSession (the ``spark_conf`` fixture).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot

import ivm
from ivm.spark.dialect import to_spark
from sql_frontend.errors import UnsupportedError

ORDERS = "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)"
TOTALS = "SELECT cust, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY cust"


def rows(db: ivm.Database, sql: str) -> list[dict]:
    return sorted(db.sql(sql).to_pylist(), key=str)


def test_connect_rejects_an_unknown_engine_and_bad_spark_conf():
    with pytest.raises(UnsupportedError, match="engine must be one of auto, duckdb, spark; got 'flink'"):
        ivm.connect(engine="flink")
    with pytest.raises(UnsupportedError, match="starting with 'spark.'"):
        ivm.connect(engine="spark", spark_conf={"master": "local"})
    with pytest.raises(UnsupportedError, match="spark.jars.packages is not allowed: ivm never downloads"):
        ivm.connect(engine="spark", spark_conf={"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0"})


def test_set_engine_changes_the_database_setting_and_rejects_bad_values():
    with ivm.connect() as db:
        assert db.status()["engine"] == "duckdb"
        with pytest.raises(UnsupportedError, match="ivm.engine must be one of auto, duckdb, spark; got 'gpu'"):
            db.execute("SET ivm.engine = 'gpu'")
        assert db.status()["engine"] == "duckdb"
        with pytest.raises(UnsupportedError, match="unknown setting ivm.nothing"):
            db.execute("SET ivm.nothing = 1")
        db.execute("SET ivm.engine = 'auto'")
        assert db.status()["engine"] == "auto"


def test_view_engine_option_is_validated_and_nothing_is_created_on_error():
    with ivm.connect() as db:
        db.execute(ORDERS)
        with pytest.raises(UnsupportedError, match="engine must be one of auto, duckdb, spark; got 'hive'"):
            db.execute(f"CREATE MATERIALIZED VIEW t WITH (engine = 'hive') AS {TOTALS}")
        with pytest.raises(UnsupportedError, match="materialized view option .* is not supported"):
            db.execute(f"CREATE MATERIALIZED VIEW t WITH (fillfactor = 70) AS {TOTALS}")
        assert [o.name for o in db.objects()] == ["orders"]


def test_auto_below_the_threshold_runs_on_duckdb_and_explain_and_status_say_so(tmp_path):
    with ivm.connect(tmp_path / "db", engine="auto") as db:
        db.execute(ORDERS)
        db.execute(f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
        db.execute("INSERT INTO orders VALUES (1, 7, 9.5), (2, 7, 1.0)")
        assert rows(db, "SELECT * FROM t") == [{"cust": 7, "total": 10.5, "n": 2}]
        explain = db.sql("EXPLAIN t").column(0).to_pylist()
        assert explain[0].startswith("materialized view t  (engine: auto (DuckDB below 10,000,000 rows")
        assert explain[0].endswith("last step ran on duckdb)")
        view = [r for r in db.status()["relations"] if r["name"] == "t"][0]
        assert view["engine"] == "duckdb"
        db.execute(f"CREATE MATERIALIZED VIEW pinned WITH (engine = 'duckdb') AS {TOTALS}")
    # The view's own setting survives a restart (it is in the checkpointed catalog).
    with ivm.connect(tmp_path / "db") as db:
        assert "(engine: duckdb" in db.sql("EXPLAIN pinned").column(0)[0].as_py()
        assert "(engine: duckdb" in db.sql("EXPLAIN t").column(0)[0].as_py()


def test_auto_from_the_threshold_runs_on_spark(spark_conf):
    with ivm.connect(engine="auto", spark_rows=3, spark_conf=spark_conf) as db:
        db.execute(ORDERS)
        db.execute(f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
        db.execute("INSERT INTO orders VALUES (1, 7, 9.5)")
        assert db._engine.engine_used["t"] == "duckdb"  # 1 row of input
        db.execute("INSERT INTO orders VALUES (2, 7, 1.0), (3, 8, 2.0), (4, 8, -1.0)")
        assert db._engine.engine_used["t"] == "spark"  # 3 rows
        assert rows(db, "SELECT * FROM t") == [{"cust": 7, "total": 10.5, "n": 2}, {"cust": 8, "total": 1.0, "n": 2}]


def test_a_function_spark_lacks_is_a_clear_error_and_changes_nothing(spark_conf):
    with ivm.connect(engine="spark", spark_conf=spark_conf) as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, s VARCHAR)")
        db.execute("INSERT INTO t VALUES (1, 'abc')")
        with pytest.raises(UnsupportedError, match="function strip_accents is not available on Spark"):
            db.execute("CREATE MATERIALIZED VIEW v AS SELECT id, strip_accents(s) AS s FROM t")
        assert [o.name for o in db.objects()] == ["t"]
        db.execute("CREATE MATERIALIZED VIEW v WITH (engine = 'duckdb') AS SELECT id, strip_accents(s) AS s FROM t")
        assert rows(db, "SELECT * FROM v") == [{"id": 1, "s": "abc"}]


def spark_sql(sql: str) -> str:
    return to_spark(sqlglot.parse_one(sql, dialect="duckdb"))


def test_dialect_rewrites_where_the_engines_mean_different_things():
    assert spark_sql("SELECT CAST(x AS BIGINT) FROM t") == "SELECT CAST(ROUND(x) AS BIGINT) FROM t"
    assert spark_sql("SELECT CAST(3 AS BIGINT) FROM t") == "SELECT CAST(3 AS BIGINT) FROM t"
    assert "CAST(x AS DOUBLE) * CAST('inf' AS DOUBLE)" in spark_sql("SELECT x / y FROM t")
    assert spark_sql("SELECT CAST(x AS HUGEINT) FROM t") == "SELECT CAST(x AS DECIMAL(38, 0)) FROM t"
    assert spark_sql("SELECT isfinite(x) FROM t") == "SELECT (NOT ISNAN(x) AND ABS(x) <> CAST('inf' AS DOUBLE)) FROM t"


@pytest.mark.parametrize("type_name", ["UBIGINT", "UUID", "TIME"])
def test_types_without_a_spark_counterpart_are_named(type_name):
    with pytest.raises(UnsupportedError, match=f"type {type_name} has no Spark equivalent"):
        spark_sql(f"SELECT CAST(x AS {type_name}) FROM t")


def test_backfill_progress_is_in_status_while_a_view_is_first_computed(monkeypatch):
    from ivm.executor import Executor

    seen = []
    with ivm.connect() as db:
        db.execute(ORDERS)
        db.execute("INSERT INTO orders VALUES (1, 7, 9.5), (2, 7, 1.0), (3, 8, 2.0)")
        original = Executor._query

        def observed(self, step, *args):
            seen.append(dict(db.status()["backfills"].get("t", {})))
            return original(self, step, *args)

        monkeypatch.setattr(Executor, "_query", observed)
        db.execute(f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
        monkeypatch.setattr(Executor, "_query", original)
        assert db.status()["backfills"] == {}  # done: nothing in progress
    assert seen and all(s["engine"] == "duckdb" and s["input_rows"] == 3 for s in seen)
    steps = [s["step"] for s in seen]
    assert steps == sorted(steps) and all(s["steps"] == seen[0]["steps"] for s in seen)
    assert seen[0]["steps"] > steps[-1]  # the last query runs before the last step is done
