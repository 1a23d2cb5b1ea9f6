"""A real Spark standalone cluster maintains a view (issue 6, acceptance 2).

The test starts a master and one worker from the installed pyspark
(``bin/spark-class``), bound to 127.0.0.1 on free ports, then runs a separate
Python process (a process holds one SparkContext, and this suite's is local)
that connects ivm with ``spark.master = spark://127.0.0.1:PORT``, creates a
join-aggregate view, applies inserts, updates and deletes, and compares the
view with DuckDB recomputing it after every batch. Everything is stopped at
the end, by process id; every wait is bounded.
"""

from __future__ import annotations

import os
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


@pytest.mark.slow
def test_view_maintained_on_standalone_cluster(tmp_path):
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
        worker_log = tmp_path / "worker.log"
        started.append(subprocess.Popen(
            [str(spark_class()), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
             "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
             "--work-dir", str(tmp_path / "work")],
            stdout=worker_log.open("w"), stderr=subprocess.STDOUT, env=env))
        wait_for(worker_log, "Successfully registered with master", started[1], 180)
        driver = subprocess.run([sys.executable, "-c", DRIVER, master_url], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=600)
        assert driver.returncode == 0, driver.stderr[-4000:]
        assert "OK spark" in driver.stdout, driver.stdout
        assert "Launching executor" in master_log.read_text(), "the cluster ran no executor for the driver"
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in reversed(started):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
