"""A real Spark standalone cluster of two workers: ivm maintains a view on it, executors keep shared state.

The module starts a master and two workers (one core each) from the
installed pyspark (``bin/spark-class``), bound to 127.0.0.1 on free ports.
Each test runs separate Python driver processes (a process holds one
SparkContext, and this suite's is local):

* issue 6, acceptance 2: a driver connects ivm with ``spark.master =
  spark://127.0.0.1:PORT``, creates a join-aggregate view, applies inserts,
  updates and deletes, and compares the view with DuckDB recomputing it
  after every batch;
* issue 28, acceptance 2: drivers keep a shared Z-set (storage/shared_zset.py)
  whose rows only the executors of both workers make, write and read; one
  driver is killed (SIGKILL, with its JVM) between the executors' write and
  its commit, and a new driver recovers it exactly once. Spark's event logs
  show every plan scanning Parquet files or generating rows on the
  executors, never rows shipped from a driver.

Everything is stopped at the end, by process id; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent("""
    import sys, duckdb, ivm
    master = sys.argv[1]
    conf = {"spark.master": master, "spark.cores.max": "1", "spark.executor.memory": "512m",
            "spark.executor.cores": "1", "spark.sql.shuffle.partitions": "2"}
    db = ivm.connect(engine="spark", spark_conf=conf)
    ref = duckdb.connect()
    schema = ["CREATE TABLE customers (id BIGINT PRIMARY KEY, region VARCHAR)",
              "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)"]
    for s in schema:
        db.execute(s); ref.execute(s)
    view = ("SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total, MAX(o.amount) AS top "
            "FROM orders o JOIN customers c ON o.cust = c.id GROUP BY c.region")
    batches = [
        "INSERT INTO customers VALUES (1, 'north'), (2, 'south'), (3, 'north')",
        "INSERT INTO orders VALUES (1, 1, 5.0), (2, 2, 7.5), (3, 3, 1.0), (4, 1, 9.0)",
        "CREATE",
        "UPDATE orders SET amount = 2.0 WHERE id = 4",
        "DELETE FROM orders WHERE id = 2",
        "UPDATE customers SET region = 'south' WHERE id = 3",
    ]
    created = False
    for sql in batches:
        if sql == "CREATE":
            db.execute("CREATE MATERIALIZED VIEW v AS " + view)
            created = True
        else:
            db.execute(sql); ref.execute(sql)
        if not created:
            continue
        got = sorted(db.sql("SELECT * FROM v").to_pylist(), key=str)
        want = sorted(ref.sql(view).to_arrow_table().to_pylist(), key=str)
        assert got == want, (sql, got, want)
    used = db._engine.engine_used["v"]
    from ivm.execute.spark.session import session
    assert session(conf).sparkContext.master == master
    print("OK", used, db.status()["engine"])
    db.close()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def wait_for(log: Path, text: str, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{log.name}: process exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{log.name}: no {text!r} within {seconds}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master and two one-core workers on 127.0.0.1: (master URL, environment for drivers, master log)."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_class().parent.parent),
           "SPARK_NO_DAEMONIZE": "1", "PYTHONPATH": str(ROOT)}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen] = []
    try:
        master_log = tmp_path / "master.log"
        started.append(subprocess.Popen(
            [str(spark_class()), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            stdout=master_log.open("w"), stderr=subprocess.STDOUT, env=env))
        wait_for(master_log, "I have been elected leader", started[0], 180)
        for w in range(2):
            worker_log = tmp_path / f"worker{w}.log"
            started.append(subprocess.Popen(
                [str(spark_class()), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                 "--work-dir", str(tmp_path / f"work{w}")],
                stdout=worker_log.open("w"), stderr=subprocess.STDOUT, env=env))
            wait_for(worker_log, "Successfully registered with master", started[-1], 180)
        yield master_url, env, master_log
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in reversed(started):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


@pytest.mark.slow
def test_view_maintained_on_standalone_cluster(cluster):
    master_url, env, master_log = cluster
    driver = subprocess.run([sys.executable, "-c", DRIVER, master_url], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert driver.returncode == 0, driver.stderr[-4000:]
    assert "OK spark" in driver.stdout, driver.stdout
    assert "Launching executor" in master_log.read_text(), "the cluster ran no executor for the driver"


# A driver of the shared Z-set: every row is made on the executors (spark.range) or read by them from
# the table's files; the driver names files and commits. argv: master, table path, event log dir, phase.
SHARED_DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import functions as F
    from ivm.execute.spark import shared_state
    from ivm.execute.spark.session import session
    from storage.shared_zset import SharedZSet

    master, path, events, phase = sys.argv[1:5]
    spark = session({"spark.master": master, "spark.cores.max": "2", "spark.executor.cores": "1",
                     "spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                     # both executors up before the first job, so both take tasks
                     "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                     "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
                     "spark.eventLog.enabled": "true", "spark.eventLog.dir": "file://" + events,
                     "spark.eventLog.compress": "false"})

    def made(low, high):  # rows generated by the executors, in four partitions
        ids = spark.range(low, high, 1, 4)
        return ids.select(F.col("id").alias("k"), (F.col("id") % 7).cast("string").alias("name"),
                          (F.col("id") * 1.5).cast("decimal(12,2)").alias("amount"),
                          F.lit(1).cast("bigint").alias("__weight"))

    def removed(table, condition):  # rows of the table's files matching, with weight -1
        rows = shared_state.consolidated(shared_state.read(spark, table)).filter(condition)
        return rows.withColumn("__weight", -F.col("__weight"))

    batch2 = lambda t: removed(t, F.col("k") % 10 == 0).unionByName(made(20000, 21000))
    batch3 = lambda t: removed(t, F.col("k") % 3 == 0)
    if phase == "load":
        import pyarrow as pa
        schema = pa.schema([("k", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2))])
        table = SharedZSet.create(path, schema, cluster_by=("k",))
        print("batch 1", shared_state.append(table, made(0, 20000), 1))
        print("batch 2", shared_state.append(table, batch2(table), 2))
    elif phase == "crash":  # killed at the hook between the write and the commit
        table = SharedZSet.open(path)
        shared_state.append(table, batch3(table), 3)
        print("NOT KILLED")
    else:
        table = SharedZSet.open(path)
        print("orphans", len(table.remove_orphans()))
        print("replay 2", shared_state.append(table, batch2(table), 2).version)
        print("batch 3", shared_state.append(table, batch3(table), 3))
        print("replay 3", shared_state.append(table, batch3(table), 3).version)
        print("compact", shared_state.compact(spark, table, 3))
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    print("OK", executors, table.version, table.offset)
    spark.stop()
""")


def event_log(directory: Path) -> list[dict]:
    """The events of the application logged under ``directory`` (Spark 4 rolls them: eventlog_v2_*/events_*)."""
    events = []
    for file in sorted(directory.rglob("*")):
        if file.is_file() and file.name.startswith("events_"):
            events.extend(json.loads(line) for line in file.read_text().splitlines() if line)
    return events


@pytest.mark.slow
def test_shared_state_kept_by_executors_of_two_workers(cluster, tmp_path):
    master_url, env, _ = cluster
    path = tmp_path / "state"
    events = {phase: tmp_path / f"events-{phase}" for phase in ("load", "crash", "recover")}
    for directory in events.values():
        directory.mkdir()

    def driver(phase, extra_env=None):
        return subprocess.Popen([sys.executable, "-c", SHARED_DRIVER, master_url, str(path), str(events[phase]),
                                 phase], cwd=ROOT, env={**env, **(extra_env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def finished(proc):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        return out

    out = finished(driver("load"))
    assert "OK 2 2 2" in out, out  # two executors; version 2 reflects offset 2

    marks = tmp_path / "marks"
    crashing = driver("crash", {"IVM_CRASH_HOOKS": "shared_zset.before_commit=600", "IVM_CRASH_MARKS": str(marks)})
    try:
        deadline = time.monotonic() + 300
        while not (marks.exists() and "shared_zset.before_commit" in marks.read_text()):
            assert crashing.poll() is None, crashing.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the crash driver never reached its commit"
            time.sleep(0.2)
        os.killpg(crashing.pid, signal.SIGKILL)  # the driver and its JVM, as if its machine died
    finally:
        if crashing.poll() is None:
            os.killpg(crashing.pid, signal.SIGKILL)
        crashing.wait(timeout=60)
    assert crashing.returncode == -signal.SIGKILL

    out = finished(driver("recover"))
    assert "orphans 1" in out.splitlines(), out  # the killed batch's files, never committed
    assert "replay 2 None" in out and "replay 3 None" in out, out
    assert "OK 2 4 3" in out, out  # batch 3 is version 3, compaction version 4, both for offset 3

    # the content, read here through deltalake (verification only), equals the arithmetic of the batches
    from deltalake import DeltaTable
    import duckdb

    con = duckdb.connect()
    con.register("stored", DeltaTable(str(path)).to_pyarrow_table())
    got = con.sql('SELECT k, name, amount, SUM("__weight") FROM stored GROUP BY ALL HAVING SUM("__weight") <> 0 '
                  "ORDER BY k").fetchall()
    keys = [k for k in range(21000) if (k >= 20000 or k % 10) and k % 3]
    assert [row[0] for row in got] == keys
    assert all(row[1] == str(row[0] % 7) and float(row[2]) == row[0] * 1.5 and row[3] == 1 for row in got)

    for phase in ("load", "recover"):
        log = event_log(events[phase])
        plans = [e["physicalPlanDescription"] for e in log
                 if e["Event"].endswith("SparkListenerSQLExecutionStart")]
        assert plans and any("Scan parquet" in plan for plan in plans)
        for plan in plans:  # rows come from files or are generated on executors, never from the driver
            assert not [scan for scan in ("LocalTableScan", "Scan ExistingRDD", "RDDScan") if scan in plan], plan
        tasks = [e for e in log if e["Event"] == "SparkListenerTaskEnd"]
        ran = {t["Task Info"]["Executor ID"] for t in tasks}
        read = sum(t.get("Task Metrics", {}).get("Input Metrics", {}).get("Records Read", 0) for t in tasks)
        assert len(ran) == 2 and "driver" not in ran, ran  # both workers' executors did the work
        assert read > 0  # ... and read the table's files themselves
