"""Issue 27, operating sources: CREATE SOURCE returns once its snapshot is loaded, or fails and leaves nothing;
SHOW SOURCES / ``ivm status`` say how each source stands; a source failed or stopped too long warns that its
slot holds WAL upstream; ``ivm replicate`` says what it does.

Against a real PostgreSQL (tests/cdc/pg_server.py), with test_source_failures.py's upstream (publication p of
x1, 1,000 rows, and x2, 10 rows). A value DuckDB cannot take (numeric 'NaN' into DECIMAL) is the failure that
stops a snapshot half-way: it fails after rows were applied, which is what must be undone.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import pytest

import ivm
from flight_server.process import ROOT, ServerProcess
from ivm.cdc.postgres import SourceError, lsn_int, sources_status
from tests.cdc.test_source_failures import create_source, items, rows, slot, slots, upstream, wait

__all__ = ["items"]  # the fixture, used by name

SOURCE_COLUMNS = ["state", "slot", "confirmed_lsn", "lag_bytes", "lag_seconds", "rows_applied", "last_error",
                  "warning"]
NAN_ROW = "CREATE TABLE prices (id int PRIMARY KEY, price numeric(10,2)); INSERT INTO prices VALUES (1, 'NaN')"


def sources(db) -> dict[str, dict]:
    return {r["name"]: r for r in db.sql("SHOW SOURCES").to_pylist() if r["type"] == "postgres"}


def confirmed_upstream(dsn: str, slot_name: str) -> str:
    return upstream(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                    slot_name)[0][0]


def assert_nothing_left(db, dsn: str, data, tables: list[str]) -> None:
    assert [o.name for o in db.objects()] == tables
    assert all(rows(db, t) == [] for t in tables)
    assert sources(db) == {} and db.status()["sources"] == []
    assert slots(dsn) == []
    assert not list((data / "sources").glob("*.json"))


def test_create_source_returns_with_its_snapshot_loaded_and_show_sources_follows_it(items, pg, tmp_path):
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(create_source(items) + " WITH (wal_warning_seconds = 1)")
        # no waiting: CREATE SOURCE returned, so the snapshot is there
        assert (len(rows(db, "x1")), len(rows(db, "x2"))) == (1000, 10)
        s = sources(db)["s"]
        assert {k: s[k] for k in ("status", "rows", "state", "slot", "lag_bytes", "rows_applied", "last_error",
                                  "warning")} == {
            "status": "streaming", "rows": None, "state": "streaming", "slot": slot(items), "lag_bytes": 0,
            "rows_applied": 1010, "last_error": None, "warning": None}
        assert s["confirmed_lsn"] == confirmed_upstream(items, slot(items))  # the slot's consistent point
        [status] = db.status()["sources"]
        assert (status["state"], status["rows"], status["snapshot_rows"]) == ("streaming", 1010, {"x1": 1000, "x2": 10})

        upstream(items, "INSERT INTO x1 SELECT i, 'new' FROM generate_series(1001, 1005) i")
        s = wait(lambda: (found := sources(db)["s"])["rows_applied"] == 1015 and found, "the inserts")
        assert lsn_int(s["confirmed_lsn"]) > lsn_int(status["confirmed_lsn"]) and len(rows(db, "x1")) == 1005
        assert (s["state"], s["lag_bytes"], s["lag_seconds"], s["warning"]) == ("streaming", 0, 0.0, None)
        stopped_at = time.time()  # (before the close, which stops the source)

    # Closed, nothing runs the source: stopped, and once stopped longer than 1 s its slot's WAL is warned about.
    upstream(items, "INSERT INTO x1 VALUES (1006, 'while closed')")
    [s] = sources_status(data)
    assert (s["state"], s["status"], s["last_error"]) == ("stopped", "ok", None)
    s = wait(lambda: (found := sources_status(data)[0])["warning"] and found, "the WAL warning")
    assert time.time() - stopped_at >= 1.0
    assert s["warning"].startswith(f"source s has been stopped for 1 s and its replication slot {slot(items)} holds "), s
    assert re.search(r"holds [\d.]+ (bytes|kB|MB) of WAL upstream", s["warning"]) and s["retained_wal_bytes"] > 0, s
    assert s["lag_bytes"] > 0 and s["lag_seconds"] is None, s  # as pg_replication_slots says: behind, by then
    database = items.rsplit("dbname=", 1)[1]
    upstream(pg.dsn, f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    try:  # PostgreSQL cannot say: the warning says the slot may hold WAL, and why it cannot say how much
        s = wait(lambda: (found := sources_status(data)[0])["lag_bytes"] is None and found, "an unreachable upstream")
        assert "its replication slot " + slot(items) + " may hold WAL upstream (cannot read pg_replication_slots: " \
            in s["warning"], s
    finally:
        upstream(pg.dsn, f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")

    with ivm.connect(data) as db:  # resumed: streaming again, the row written while closed applied, no warning
        s = wait(lambda: (found := sources(db)["s"])["rows_applied"] == 1016 and found, "the resumed source")
        assert (s["state"], s["warning"], len(rows(db, "x1"))) == ("streaming", None, 1006)
        db.execute("DROP SOURCE s")
        assert slots(items) == []


def test_a_snapshot_that_fails_half_way_leaves_nothing_behind(items, tmp_path):
    upstream(items, "ALTER TABLE x2 ADD COLUMN price numeric(10,2); UPDATE x2 SET price = 'NaN' WHERE id = 5")
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute("CREATE TABLE x1 (id INTEGER PRIMARY KEY, v VARCHAR)")  # the user's, empty: the snapshot fills it
        with pytest.raises(SourceError, match=r"^source s could not take its snapshot: upstream table public\.x2: "
                                              r"column price of x2 is DECIMAL\(10,2\), and 'NaN'"):
            db.execute(create_source(items))  # x1 was loaded (1,000 rows) before x2 failed
        assert_nothing_left(db, items, data, ["x1"])  # x1 is the user's: kept, empty as it was; x2 dropped
    with ivm.connect(data) as db:
        time.sleep(0.3)  # were anything resumed at the open, it would have begun by now
        assert_nothing_left(db, items, data, ["x1"])
        upstream(items, "UPDATE x2 SET price = 1 WHERE id = 5")
        db.execute(create_source(items))  # the same statement, once upstream is fixed
        assert (len(rows(db, "x1")), len(rows(db, "x2"))) == (1000, 10)


def test_create_source_errors_before_the_snapshot_leave_nothing_behind(items, tmp_path):
    upstream(items, "CREATE SCHEMA s; CREATE TABLE s.x (id int PRIMARY KEY); CREATE TABLE s_x (id int PRIMARY KEY);"
                    "CREATE PUBLICATION twins FOR TABLE s.x, s_x; CREATE PUBLICATION again FOR TABLE x2")
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(create_source(items, "a"))
        before = (sorted(o.name for o in db.objects()), rows(db, "x2"), slots(items), list(sources(db)))
        for sql, error, message in [
            (create_source(items, "b").replace(items, "host=/nonexistent dbname=nothing"), SourceError,
             r"cannot reach PostgreSQL for source b: .*/nonexistent"),
            (create_source(items, "b").replace("'p'", "'twins'"), SourceError,
             r"source b cannot replicate publication twins: upstream tables public\.s_x and s\.x would both "
             r"replicate into table s_x"),
            (create_source(items, "b").replace("'p'", "'again'"), SourceError,
             r"source b cannot replicate publication again: table x2 is written by source a"),
            (create_source(items, "x1"), ivm.CatalogError, "x1 is already a table or view"),
            (create_source(items, "a"), ivm.CatalogError, "source a already exists"),
        ]:
            with pytest.raises(error, match=message):
                db.execute(sql)
            after = (sorted(o.name for o in db.objects()), rows(db, "x2"), slots(items), list(sources(db)))
            assert after == before, sql
        assert not (data / "sources" / "b.json").exists()


def test_over_flight_sql_create_source_errors_reach_the_client_and_show_sources_reads_by_position(items, tmp_path):
    upstream(items, "ALTER TABLE x2 ADD COLUMN price numeric(10,2); UPDATE x2 SET price = 'NaN' WHERE id = 5")
    with ServerProcess("--data", str(tmp_path / "db")) as server, flightsql.connect(server.uri) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            with pytest.raises(flightsql.Error, match="cannot reach PostgreSQL for source s"):
                cur.execute(create_source(items).replace(items, "host=/nonexistent dbname=nothing"))
            with pytest.raises(flightsql.Error, match=r"source s could not take its snapshot: upstream table "
                                                      r"public\.x2: column price of x2 is DECIMAL\(10,2\)"):
                cur.execute(create_source(items))
            cur.execute("SHOW TABLES")
            assert cur.fetchall() == [] and slots(items) == []
            upstream(items, "UPDATE x2 SET price = 1 WHERE id = 5")
            cur.execute(create_source(items))
            cur.execute("SELECT COUNT(*) FROM x2")
            assert cur.fetchall() == [(10,)]
            cur.execute("ALTER SOURCE s REFRESH TABLE x2")  # as every source statement, over Flight SQL too
            with pytest.raises(flightsql.Error, match=r"source s has no table x3 \(its tables: x1, x2\)"):
                cur.execute("ALTER SOURCE s REFRESH TABLE x3")
            cur.execute("SHOW SOURCES")
            table = cur.fetch_arrow_table()
            assert table.column_names == ["name", "type", "written_by", "status", "rows", *SOURCE_COLUMNS]
            [source] = [r for r in table.to_pylist() if r["type"] == "postgres"]
            assert list(source.values())[:7] == ["s", "postgres", None, "streaming", None, "streaming", slot(items)]
            assert (source["rows_applied"], source["last_error"], source["warning"]) == (1010, None, None)


def test_a_failed_source_warns_in_show_sources_and_the_log_that_its_slot_holds_wal(items, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ivm.sources")
    with ivm.connect(tmp_path / "db") as db:
        db.execute(create_source(items) + " WITH (wal_warning_seconds = 1)")
        failing_from = time.time()
        # A table published after the snapshot stops the whole source (a value that does not fit fails only
        # its table: test_refresh_table.py).
        upstream(items, "CREATE TABLE prices (id int PRIMARY KEY); ALTER PUBLICATION p ADD TABLE prices; "
                        "INSERT INTO prices VALUES (1)")
        s = wait(lambda: (found := sources(db)["s"])["state"] == "failed" and found, "the source to fail")
        assert s["status"] == "failed: " + s["last_error"], s
        assert "upstream table public.prices was added to publication p after the snapshot" in s["last_error"], s
        assert s["lag_bytes"] > 0 and s["rows_applied"] == 1010, s  # the failed transaction is not confirmed

        s = wait(lambda: (found := sources(db)["s"])["warning"] and found, "the WAL warning")
        assert time.time() - failing_from >= 1.0
        assert s["warning"].startswith(f"source s has been failing for 1 s and its replication slot {slot(items)} "
                                       "holds "), s
        assert "of WAL upstream" in s["warning"] and "DROP SOURCE s" in s["warning"], s
        logged = wait(lambda: [r.getMessage() for r in caplog.records if "holds" in r.getMessage()], "the log")
        assert logged[0].startswith(f"source s has been failing for 1 s and its replication slot {slot(items)} holds")
        assert [s["state"] for s in db.status()["sources"]] == ["failed"]
        db.execute("DROP SOURCE s")
        assert slots(items) == [] and sources(db) == {}


def test_a_create_source_cut_short_by_a_crash_is_undone_at_the_next_open(items, tmp_path, caplog):
    upstream(items, "INSERT INTO x1 SELECT i, 'bulk' FROM generate_series(1001, 300000) i")
    data = tmp_path / "db"
    process = subprocess.Popen([sys.executable, "-m", "ivm", "sql", "--data", str(data), create_source(items)],
                               cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait(lambda: slots(items) or process.poll() is not None, "the snapshot to begin")
        assert [s["state"] for s in sources_status(data)] == ["snapshotting"]  # (read while another process runs it)
        process.kill()
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    state = json.loads((data / "sources" / "s.json").read_text())
    assert (state["phase"], state["creating"], slots(items)) == ("snapshot", True, [slot(items)])  # cut short
    assert [s["state"] for s in sources_status(data)] == ["stopped"]  # its process is gone
    caplog.set_level(logging.WARNING, logger="ivm.sources")
    with ivm.connect(data) as db:
        assert_nothing_left(db, items, data, [])
    assert any(r.getMessage() == "source s could not take its snapshot: the process stopped during it, before "
               "CREATE SOURCE s returned; undone" for r in caplog.records), caplog.records


def test_replicate_says_what_it_does(items, tmp_path):
    data = tmp_path / "db"
    process = run_replicate(data, items, "p", "--seconds", "2.5", "--progress-seconds", "0.3",
                            "--wal-warning-seconds", "0.5")
    lines = Lines(process.stdout)
    lines.wait_for("snapshot done")
    upstream(items, "INSERT INTO x1 SELECT i, 'new' FROM generate_series(1001, 1005) i")
    lines.wait_for("streaming: 1015 rows applied")
    assert process.wait(60) == 0
    said = lines.all()
    assert said[:4] == [f"source s: snapshot of publication p (2 tables) into slot {slot(items)}",
                        "  x1: 1000 rows", "  x2: 10 rows",
                        f"source s: snapshot done: 1010 rows at LSN {said[3].split(' LSN ')[1].split(';')[0]}; "
                        "streaming"], said
    streaming = [line for line in said if line.startswith("source s: streaming: ")]
    assert len(streaming) >= 3, said  # every 0.3 s for 2.5 s, whether or not anything changed
    assert all(re.fullmatch(r"source s: streaming: 10(10|15) rows applied \([01] transactions\), confirmed LSN "
                            r"[0-9A-F]+/[0-9A-F]+, lag \d+ bytes, [0-9.]+ s", line) for line in streaming), streaming
    assert said[-1].startswith("source s: stopped: 1015 rows applied, confirmed LSN "), said
    assert f"replication slot {slot(items)} stays upstream and holds WAL" in process.stderr.read()

    with ivm.connect(data) as db:  # (what ivm status --json prints)
        [s] = db.status()["sources"]
    assert (s["state"], s["rows"], s["snapshot_rows"], s["transactions"]) == \
        ("stopped", 1015, {"x1": 1000, "x2": 10}, 1), s
    assert slots(items) == [slot(items)]
    status = subprocess.run([sys.executable, "-m", "ivm", "status", "--data", str(data)], cwd=ROOT, timeout=60,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="300"), capture_output=True, text=True)
    assert re.search(rf"^warning: source s has been stopped for \d+ s and its replication slot {slot(items)} holds "
                     r"[\d.]+ (bytes|kB|MB) of WAL upstream", status.stdout, re.MULTILINE), status.stdout


def run_replicate(data, dsn: str, publication: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ivm", "replicate", "--data", str(data), "--dsn", dsn,
                             "--publication", publication, "--name", "s", "--slot", slot(dsn), *extra], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


class Lines:
    """A process's stdout, read as it comes."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"{text!r} never came: {self.lines}"
            self.lines.append(line)

    def all(self) -> list[str]:
        while (line := self.queue.get(timeout=30)) is not None:
            self.lines.append(line)
        return self.lines


def test_the_snapshot_keeps_text_that_spells_null_in_other_tools(items, tmp_path):
    """Only PostgreSQL's NULL is NULL: 'NA', 'null', 'NaN', 'N/A' and '' are text (Arrow's CSV reader reads them
    as NULL unless told otherwise)."""
    upstream(items, "INSERT INTO x2 VALUES (11, 'NA'), (12, 'null'), (13, 'NaN'), (14, 'N/A'), (15, ''), (16, NULL)")
    with ivm.connect(tmp_path / "db") as db:
        db.execute(create_source(items))
        assert rows(db, "x2")[10:] == [(11, "NA"), (12, "null"), (13, "NaN"), (14, "N/A"), (15, ""), (16, None)]
