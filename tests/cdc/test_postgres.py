"""PostgreSQL logical replication into ivm (ivm/cdc/postgres.py, stream.py), against a real server.

The server is Debian's PostgreSQL in a temporary directory with
wal_level=logical, on a unix socket only (tests/cdc/pg_server.py); each test
has its own upstream database. Views over the replicated tables must equal
the same SELECT run in PostgreSQL at the matching LSN (the workload pauses,
bumps a marker, and the check waits until the source applied past it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ivm
from flight_server.process import ROOT
from ivm.cdc.postgres import Replicator, SourceConfig, SourceError, sources_status
from tests.cdc import workload as w


class Running:
    """A Replicator on a thread of this process."""

    def __init__(self, db, config: SourceConfig):
        self.replicator = Replicator(db, config)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.replicator.run(stop=self.stop)
        except BaseException as e:  # surfaced by progress() and close()
            self.error = e

    def progress(self) -> dict:
        if self.error is not None:
            return {"error": str(self.error)}
        return dict(self.replicator.progress)

    def wait_streaming(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.replicator.state.get("phase") != "streaming" or self.replicator.progress.get("confirmed_lsn") is None:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "the snapshot did not finish"
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


def run_rounds(load: w.Workload, db, progress, rounds: int, transactions: int) -> None:
    for _ in range(rounds):
        for _ in range(transactions):
            load.transaction()
        lsn = load.mark()
        expected = load.expected()
        w.wait_applied(progress, lsn)
        found = w.ivm_views(db)
        if found != expected:  # say which tables differ too
            tables = {}
            with contextlib.closing(w.connect(load.dsn)) as conn, conn.cursor() as cur:
                for table in ("customers", "products", "orders", "audit"):
                    cur.execute(f"SELECT * FROM {table}")
                    theirs = set(w.normalized(cur.fetchall()))
                    mine = set(w.normalized(tuple(r.values()) for r in db.sql(f"SELECT * FROM {table}").to_pylist()))
                    tables[table] = (sorted(mine - theirs, key=repr)[:5], sorted(theirs - mine, key=repr)[:5])
            diff = {n: (sorted(set(found[n]) - set(expected[n]), key=repr)[:5],
                        sorted(set(expected[n]) - set(found[n]), key=repr)[:5]) for n in found}
            raise AssertionError(f"views (ivm-only, postgres-only): {diff}; tables: {tables}")


def test_snapshot_then_random_workload_matches_postgres(upstream, tmp_path):
    db = ivm.connect(tmp_path / "db")
    running = Running(db, SourceConfig("shop", upstream, "shop", slot(upstream)))
    try:
        running.wait_streaming()
        assert db.sql("SELECT COUNT(*) AS n FROM orders").column(0)[0].as_py() == 2000  # the snapshot
        w.create_views(db)
        load = w.Workload(upstream, seed=1)
        try:
            run_rounds(load, db, running.progress, rounds=6, transactions=25)
        finally:
            load.close()
        status = db.status()["sources"]
        assert [(s["name"], s["phase"], s["status"]) for s in status] == [("shop", "streaming", "ok")]
        assert status[0]["confirmed_lsn"] and "lag_bytes" in status[0] and "lag_seconds" in status[0]
    finally:
        running.close()
        db.close()


def slot(dsn: str, name: str = "") -> str:
    """Slots are per cluster: name them after the test's own upstream database."""
    return "ivm_" + dsn.rsplit("dbname=", 1)[1] + name


def replicate(data: Path, dsn: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ivm", "replicate", "--data", str(data), "--dsn", dsn,
                             "--publication", "shop", "--name", "shop", "--slot", slot(dsn), *extra], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def progress_file(data: Path):
    def read() -> dict:
        found = {s["name"]: s for s in sources_status(data)}.get("shop", {})
        return {**found, "error": found.get("status", "ok")[len("failed: "):] if found.get("status", "ok") != "ok" else None}
    return read


@pytest.mark.slow
def test_kill_9_mid_stream_then_resume_loses_nothing_and_repeats_nothing(upstream, tmp_path):
    data = tmp_path / "db"
    snapshot = replicate(data, upstream, "--seconds", "3")  # snapshot, a little streaming, then exit
    assert snapshot.wait(120) == 0, snapshot.stderr.read()
    with ivm.connect(data) as db:
        w.create_views(db)
    load = w.Workload(upstream, seed=2)
    stop = threading.Event()

    def generate() -> None:
        while not stop.is_set():
            load.transaction(statements=8)

    generator = threading.Thread(target=generate, daemon=True)
    process = replicate(data, upstream)
    try:
        generator.start()
        for kill_after in (2.0, 1.3, 0.7):  # kill -9 mid-stream, three times, and start again
            time.sleep(kill_after)
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            process = replicate(data, upstream)
        time.sleep(2.0)
        stop.set()
        generator.join(30)
        lsn = load.mark()
        expected = load.expected()
        w.wait_applied(progress_file(data), lsn, timeout=120)
        status = subprocess.run([sys.executable, "-m", "ivm", "status", "--data", str(data), "--json"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert status.returncode == 0, status.stderr  # while the replicator holds the database: sources only
        [source] = json.loads(status.stdout)["sources"]
        assert (source["phase"], source["status"]) == ("streaming", "ok") and source["confirmed_lsn"]
        assert {"lag_bytes", "lag_seconds", "applied_lsn", "received_lsn"} <= set(source)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) in (0, -signal.SIGTERM), process.stderr.read()
        with ivm.connect(data) as db:
            assert w.ivm_views(db) == expected
            for table in ("customers", "orders", "audit"):
                mine = w.normalized(tuple(r.values()) for r in db.sql(f"SELECT * FROM {table}").to_pylist())
                with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
                    cur.execute(f"SELECT * FROM {table}")
                    assert mine == w.normalized(cur.fetchall()), table
    finally:
        stop.set()
        if process.poll() is None:
            process.kill()
            process.wait(30)
        load.close()


def test_kill_9_during_the_snapshot_starts_it_again(upstream, tmp_path):
    data = tmp_path / "db"
    with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO audit SELECT i % 50, 'bulk' FROM generate_series(1, 300000) i")
    process = replicate(data, upstream)
    deadline = time.monotonic() + 60
    while not (data / "sources" / "shop.json").exists() or \
            json.loads((data / "sources" / "shop.json").read_text())["phase"] != "snapshot":
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    again = replicate(data, upstream, "--seconds", "8")
    assert again.wait(120) == 0, again.stderr.read()
    with ivm.connect(data) as db, contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
        assert db.status()["sources"][0]["phase"] == "streaming"
        for table in ("customers", "orders", "audit"):
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            assert db.sql(f"SELECT COUNT(*) FROM {table}").column(0)[0].as_py() == cur.fetchone()[0], table
        cur.execute("SELECT COUNT(*) FROM pg_replication_slots WHERE database = current_database()")
        assert cur.fetchone()[0] == 1  # the cut-short slot was dropped


def test_a_schema_change_is_followed_and_another_source_goes_on(upstream, pg, tmp_path):
    """(ivm used to stop the whole source here; tests/cdc/test_schema_changes.py has the rest.)"""
    with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE notes (id int PRIMARY KEY, body text); CREATE PUBLICATION other FOR TABLE notes")
    db = ivm.connect(tmp_path / "db")
    shop = Running(db, SourceConfig("shop", upstream, "shop", slot(upstream, "_1")))
    other = Running(db, SourceConfig("other", upstream, "other", slot(upstream, "_2")))
    try:
        shop.wait_streaming()
        other.wait_streaming()
        with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO customers VALUES (9001, 'before', 'r1')")
            cur.execute("ALTER TABLE customers ADD COLUMN vip boolean")
            cur.execute("INSERT INTO customers VALUES (9002, 'after', 'r1', true)")
            cur.execute("INSERT INTO notes VALUES (1, 'still flowing')")
        deadline = time.monotonic() + 30
        while db.sql("SELECT COUNT(*) FROM customers WHERE id > 9000").column(0)[0].as_py() != 2 or \
                db.sql("SELECT COUNT(*) FROM notes").column(0)[0].as_py() != 1:
            assert time.monotonic() < deadline and shop.error is None and other.error is None, (shop.error,
                                                                                                 other.error)
            time.sleep(0.05)
        assert db.sql("SELECT id, vip FROM customers WHERE id > 9000 ORDER BY id").to_pylist() == [
            {"id": 9001, "vip": None}, {"id": 9002, "vip": True}]
        status = {s["name"]: (s["status"], s["failed_tables"]) for s in db.status()["sources"]}
        assert status == {"shop": ("ok", {}), "other": ("ok", {})}
    finally:
        other.close()
        shop.close()
        db.close()


@pytest.mark.parametrize("ddl, message", [
    ("CREATE TABLE nokey (a int, b text); CREATE PUBLICATION p FOR TABLE nokey",
     "upstream table public.nokey needs a primary key (with the default replica identity) or REPLICA IDENTITY FULL"),
    ("CREATE TABLE arr (id int PRIMARY KEY, tags text[]); CREATE PUBLICATION p FOR TABLE arr",
     "column tags of upstream table public.arr has type text[], which ivm cannot replicate"),
    ("CREATE PUBLICATION q FOR TABLE customers", "publication p does not exist upstream"),
])
def test_unreplicable_upstream_is_a_clear_error_and_creates_nothing(upstream, tmp_path, ddl, message):
    with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
        cur.execute(ddl)
    with ivm.connect(tmp_path / "db") as db:
        with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                           .replace(")", r"\)")):
            db.execute(f"CREATE SOURCE src FROM POSTGRES CONNECTION '{upstream}' PUBLICATION 'p'")
        assert db.objects() == []
        assert db.status()["sources"] == []
    done = subprocess.run([sys.executable, "-m", "ivm", "replicate", "--data", str(tmp_path / "db2"), "--dsn", upstream,
                           "--publication", "p", "--seconds", "5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 1 and message in done.stderr


def test_local_table_of_other_shape_is_a_clear_error(upstream, tmp_path):
    with ivm.connect(tmp_path / "db") as db:
        db.execute("CREATE TABLE products (id INTEGER PRIMARY KEY, price VARCHAR, label VARCHAR)")
        running = Running(db, SourceConfig("shop", upstream, "shop", slot(upstream)))
        running.thread.join(60)
        assert ("table products has columns id INTEGER, price VARCHAR, label VARCHAR but upstream public.products has "
                "id INTEGER, price DECIMAL(10,2), label VARCHAR (other types: price is VARCHAR here, DECIMAL(10,2) "
                "upstream); drop it first") in str(running.error)
        assert db.sql("SELECT COUNT(*) FROM products").column(0)[0].as_py() == 0
        assert [o.name for o in db.objects()] == ["products"]  # checked before any table is made
        assert db.status()["sources"] == []  # a source that never began leaves no state


def test_create_source_runs_inside_the_database_and_resumes_on_open(upstream, tmp_path):
    data = tmp_path / "db"
    with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM orders")
        (orders,) = cur.fetchone()
    db = ivm.connect(data)
    try:
        db.execute(f"CREATE SOURCE shop FROM POSTGRES CONNECTION '{upstream}' PUBLICATION 'shop' SLOT '{slot(upstream)}'")
        progress = lambda: {s["name"]: s for s in db.status()["sources"]}.get("shop", {})  # noqa: E731
        deadline = time.monotonic() + 60
        while progress().get("phase") != "streaming":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        w.create_views(db)
        sources = db.sql("SHOW SOURCES").to_pylist()  # the source, and the tables it writes
        [source] = [s for s in sources if s["type"] == "postgres"]
        assert {k: source[k] for k in ("name", "type", "written_by", "status", "rows", "state", "slot")} == {
            "name": "shop", "type": "postgres", "written_by": None, "status": "streaming", "rows": None,
            "state": "streaming", "slot": slot(upstream)}
        assert sorted(s["name"] for s in sources if s["written_by"] == "shop") == \
            ["audit", "customers", "marker", "orders", "products"]
        load = w.Workload(upstream, seed=3)
        try:
            run_rounds(load, db, progress, rounds=2, transactions=10)
            db.close()
            for _ in range(10):  # while the database is closed
                load.transaction()
            db = ivm.connect(data)  # resumes the source
            progress = lambda: {s["name"]: s for s in db.status()["sources"]}.get("shop", {})  # noqa: E731
            run_rounds(load, db, progress, rounds=2, transactions=10)
        finally:
            load.close()
        with pytest.raises(ivm.CatalogError, match="source shop already exists"):
            db.execute(f"CREATE SOURCE shop FROM POSTGRES CONNECTION '{upstream}' PUBLICATION 'shop'")
        db.execute("DROP SOURCE shop")
        assert db.status()["sources"] == []
        assert {(s["type"], s["written_by"]) for s in db.sql("SHOW SOURCES").to_pylist()} == {("table", None)}
        with contextlib.closing(w.connect(upstream)) as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name = %s", (slot(upstream),))
            assert cur.fetchone()[0] == 0
        assert db.sql("SELECT COUNT(*) FROM orders").column(0)[0].as_py() > 0  # the tables stay
        with pytest.raises(ivm.UnknownObjectError, match="source shop does not exist"):
            db.execute("DROP SOURCE shop")
    finally:
        db.close()


def test_create_source_syntax_and_in_memory_errors():
    with ivm.connect() as db:
        with pytest.raises(ivm.SqlSyntaxError, match="expected CREATE SOURCE name FROM POSTGRES CONNECTION"):
            db.execute("CREATE SOURCE x FROM MYSQL CONNECTION 'a' PUBLICATION 'b'")
        with pytest.raises(ivm.UnsupportedError, match=r"a PostgreSQL source needs a database on disk: start the "
                                                       r"server with `ivm serve --data DIR`, or open it with "
                                                       r"`ivm\.connect\(DIR\)`"):
            db.execute("CREATE SOURCE x FROM POSTGRES CONNECTION 'host=/nowhere' PUBLICATION 'b'")
