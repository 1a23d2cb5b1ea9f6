"""Engine choice (issue 6): settings, their errors, EXPLAIN/status, ``auto``, the Spark dialect layer.

Most tests here need no Spark; those that do share the session's one
SparkSession (the ``spark_conf`` fixture).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot

import ivm
from ivm.execute.spark.dialect import to_spark
from sql_frontend.errors import CatalogError, SqlSyntaxError, UnknownObjectError, UnsupportedError

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
        with pytest.raises(UnsupportedError, match="unknown option 'fillfactor' for CREATE MATERIALIZED VIEW; valid options: engine, late, emit"):
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
    t = " FROM t AS `__rel_t`"  # every relation gets a reserved alias (dialect.qualify)
    assert spark_sql("SELECT CAST(x AS BIGINT) FROM t") == "SELECT CAST(ROUND(x) AS BIGINT)" + t
    assert spark_sql("SELECT CAST(3 AS BIGINT) FROM t") == "SELECT CAST(3 AS BIGINT)" + t
    assert "CAST(x AS DOUBLE) * CAST('inf' AS DOUBLE)" in spark_sql("SELECT x / y FROM t")
    assert spark_sql("SELECT CAST(x AS HUGEINT) FROM t") == "SELECT CAST(x AS DECIMAL(38, 0))" + t
    assert spark_sql("SELECT isfinite(x) FROM t") == "SELECT (NOT ISNAN(x) AND ABS(x) <> CAST('inf' AS DOUBLE))" + t
    # DuckDB's date parts are BIGINT (Spark's INT); its weekdays count from Sunday = 0 (Spark's from 1).
    assert spark_sql("SELECT EXTRACT(year FROM d) FROM t") == "SELECT CAST(EXTRACT(YEAR FROM d) AS BIGINT)" + t
    assert spark_sql("SELECT dayofweek(d) FROM t") == "SELECT CAST((DAYOFWEEK(d) - 1) AS BIGINT)" + t
    assert spark_sql("SELECT isodow(d) FROM t") == "SELECT CAST(((DAYOFWEEK(d) + 5) % 7 + 1) AS BIGINT)" + t
    assert spark_sql("SELECT CAST(EXTRACT(month FROM d) AS INTEGER) FROM t") == \
        "SELECT CAST(CAST(EXTRACT(MONTH FROM d) AS BIGINT) AS INT)" + t
    assert spark_sql("SELECT EXTRACT(second FROM ts) FROM t") == "SELECT EXTRACT(SECOND FROM ts)" + t


def test_table_aliases_become_names_no_column_can_have():
    """Spark would read an outer ``g.x`` inside a subquery over a table with a column g as g's field x."""
    sql = spark_sql('WITH c AS (SELECT 1 AS g) SELECT g.x, c.g FROM t AS g, c '
                    'WHERE EXISTS (SELECT 1 FROM u AS M WHERE m.g = g.x) AND "G".y = 1')
    assert sql == ("WITH c AS (SELECT 1 AS g) SELECT `__rel_g`.x, `__rel_c`.g FROM t AS `__rel_g`, c AS `__rel_c` "
                   "WHERE EXISTS(SELECT 1 FROM u AS `__rel_m` WHERE `__rel_m`.g = `__rel_g`.x) AND (`__rel_g`.y = 1)")
    # a qualifier that names no relation in the query (a struct column's field) is left alone
    assert spark_sql("SELECT s.f FROM t") == "SELECT s.f" + " FROM t AS `__rel_t`"


@pytest.mark.parametrize("type_name", ["UBIGINT", "UUID", "TIME"])
def test_types_without_a_spark_counterpart_are_named(type_name):
    with pytest.raises(UnsupportedError, match=f"type {type_name} has no Spark equivalent"):
        spark_sql(f"SELECT CAST(x AS {type_name}) FROM t")


def test_backfill_progress_is_in_status_while_a_view_is_first_computed(monkeypatch):
    from ivm.execute.executor import Executor

    seen = []
    with ivm.connect() as db:
        db.execute(ORDERS)
        db.execute("INSERT INTO orders VALUES (1, 7, 9.5), (2, 7, 1.0), (3, 8, 2.0)")
        original = Executor.query

        def observed(self, step, *args):
            seen.append(dict(db.status()["backfills"].get("t", {})))
            return original(self, step, *args)

        monkeypatch.setattr(Executor, "query", observed)
        db.execute(f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
        monkeypatch.setattr(Executor, "query", original)
        assert db.status()["backfills"] == {}  # done: nothing in progress
    assert seen and all(s["engine"] == "duckdb" and s["input_rows"] == 3 for s in seen)
    steps = [s["step"] for s in seen]
    assert steps == sorted(steps) and all(s["steps"] == seen[0]["steps"] for s in seen)
    assert seen[0]["steps"] > steps[-1]  # the last query runs before the last step is done


def test_alter_view_sets_and_resets_the_views_engine_and_it_survives_a_restart(tmp_path, spark_conf):
    with ivm.connect(tmp_path / "db", spark_conf=spark_conf) as db:
        db.execute(ORDERS)
        db.execute(f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
        db.execute("INSERT INTO orders VALUES (1, 7, 9.5)")
        assert "(engine: duckdb" in db.sql("EXPLAIN t").column(0)[0].as_py()
        db.execute("ALTER MATERIALIZED VIEW t SET (engine = 'spark')")
        assert "(engine: spark" in db.sql("EXPLAIN t").column(0)[0].as_py()
        db.execute("INSERT INTO orders VALUES (2, 7, 1.0), (3, 8, 2.0)")
        assert rows(db, "SELECT * FROM t") == [{"cust": 7, "total": 10.5, "n": 2}, {"cust": 8, "total": 2.0, "n": 1}]
        assert db._engine.engine_used["t"] == "spark"
    with ivm.connect(tmp_path / "db", spark_conf=spark_conf) as db:
        assert "(engine: spark" in db.sql("EXPLAIN t").column(0)[0].as_py()
        db.execute("alter materialized view T reset (ENGINE);")
        assert "(engine: duckdb" in db.sql("EXPLAIN t").column(0)[0].as_py()  # the database's setting
    with ivm.connect(tmp_path / "db") as db:
        assert "(engine: duckdb" in db.sql("EXPLAIN t").column(0)[0].as_py()


@pytest.mark.parametrize("sql, error, message", [
    ("ALTER MATERIALIZED VIEW t SET (engine = 'hive')", UnsupportedError,
     "engine must be one of auto, duckdb, spark; got 'hive'"),
    ("ALTER MATERIALIZED VIEW t SET (fillfactor = 70)", UnsupportedError,
     "unknown option 'fillfactor' for ALTER MATERIALIZED VIEW; valid options: engine"),
    ("ALTER MATERIALIZED VIEW t RESET (fillfactor)", UnsupportedError,
     "unknown option 'fillfactor' for ALTER MATERIALIZED VIEW; valid options: engine"),
    ("ALTER MATERIALIZED VIEW t RENAME TO u", UnsupportedError,
     "ivm cannot rename a view; drop it and create it under the new name"),
    ("ALTER MATERIALIZED VIEW t OWNER TO bob", SqlSyntaxError,
     r"expected ALTER MATERIALIZED VIEW name SET \(engine = '<engine>'\)"),
    ("ALTER MATERIALIZED VIEW nope SET (engine = 'spark')", UnknownObjectError,
     "materialized view nope does not exist"),
    ("ALTER MATERIALIZED VIEW orders SET (engine = 'spark')", CatalogError,
     "orders is a table; ALTER MATERIALIZED VIEW changes materialized views"),
])
def test_alter_view_errors_are_clear_and_change_nothing(sql, error, message):
    with ivm.connect() as db:
        db.execute(ORDERS)
        db.execute(f"CREATE MATERIALIZED VIEW t WITH (engine = 'duckdb') AS {TOTALS}")
        with pytest.raises(error, match=message):
            db.execute(sql)
        assert "(engine: duckdb" in db.sql("EXPLAIN t").column(0)[0].as_py()
        assert db._engine.catalog.views["t"].engine == "duckdb"
        assert [o.name for o in db.objects()] == ["orders", "t"]


def test_status_shows_a_spark_backfill_while_it_runs(spark_conf):
    """Poll db.status() from another thread while CREATE computes a view on Spark."""
    import threading
    import time

    with ivm.connect(engine="spark", spark_conf=spark_conf) as db:
        db.execute(ORDERS)
        db.apply_changes("orders", pa.table({"id": range(2000), "cust": [i % 13 for i in range(2000)],
                                             "amount": [float(i) for i in range(2000)]}))
        seen: list[dict] = []
        creating = threading.Thread(target=db.execute, args=(f"CREATE MATERIALIZED VIEW t AS {TOTALS}",))
        creating.start()
        deadline = time.monotonic() + 120
        while creating.is_alive() and time.monotonic() < deadline:
            entry = db.status()["backfills"].get("t")
            if entry is not None:
                seen.append(entry)
            time.sleep(0.01)
        creating.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not creating.is_alive(), "the backfill did not finish within 2 minutes"
        assert db.status()["backfills"] == {}
        assert rows(db, "SELECT * FROM t WHERE cust = 0") == [
            {"cust": 0, "total": float(sum(range(0, 2000, 13))), "n": len(range(0, 2000, 13))}]
    assert seen, "status never showed the backfill"
    assert all(s["engine"] == "spark" and s["input_rows"] == 2000 and 0 <= s["step"] <= s["steps"] for s in seen)
    assert all(0 <= s["tasks_done"] <= s["tasks"] for s in seen)
    assert [s["seconds"] for s in seen] == sorted(s["seconds"] for s in seen)


def test_ivm_sql_creates_a_view_and_prints_query_results(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "db"

    def ivm_sql(statements: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ivm", "sql", "--data", str(data), statements],
                              cwd=root, capture_output=True, text=True, timeout=120)

    done = ivm_sql(f"{ORDERS}; INSERT INTO orders VALUES (1, 7, 9.5), (2, 7, 1.0); "
                   f"CREATE MATERIALIZED VIEW t AS {TOTALS}")
    assert done.returncode == 0, done.stderr
    done = ivm_sql("SELECT cust, total, n FROM t")
    assert done.returncode == 0, done.stderr
    assert "10.5" in done.stdout and "7" in done.stdout
    failed = ivm_sql("ALTER MATERIALIZED VIEW nope SET (engine = 'spark')")
    assert failed.returncode == 1 and "ivm sql: materialized view nope does not exist" in failed.stderr
