"""Issue 27: tables of a PostgreSQL source fail and recover independently (ivm/cdc/stream.py).

A change whose value does not fit its local column (numeric 'NaN', which a
DuckDB DECIMAL cannot hold) fails that table alone while the others stream
on; once the cause is fixed upstream, ``ALTER SOURCE s REFRESH TABLE t``
loads that table again from a snapshot, under the same streaming writes,
and every table and view is right afterwards, also after a reopen. Against
a real PostgreSQL (tests/cdc/pg_server.py) with test_source_failures.py's
upstream (publication p of x1, 1,000 rows, and x2, 10 rows).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

import ivm
from flight_server.process import ROOT
from ivm.cdc.postgres import SourceError
from sql_frontend.errors import UnknownObjectError
from tests.cdc.test_source_failures import VIEWS, create_source, items, rows, slots, upstream, wait
from tests.test_alter_table import assert_views_equal_recompute

__all__ = ["items"]  # the fixture, used by name


def upstream_rows(dsn: str, table: str) -> list[tuple]:
    return sorted(upstream(dsn, f"SELECT * FROM {table}"))


def failed_tables(db) -> dict[str, str]:
    return db.status()["sources"][0]["failed_tables"]


class Writer:
    """Small transactions writing x1 and x2 upstream, on a thread, until paused or stopped."""

    def __init__(self, dsn: str):
        self.dsn, self.n = dsn, 0
        self.go, self.stop, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.go.set()
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.go.is_set():
                    self.idle.set()
                    self.go.wait(0.05)
                    continue
                self.idle.clear()
                self.n += 1
                n = self.n
                upstream(self.dsn, "INSERT INTO x1 VALUES (%s, 'w'); UPDATE x1 SET v = v || '+' WHERE id = %s; "
                                   "UPDATE x2 SET price = %s WHERE id = %s; INSERT INTO x2 VALUES (%s, 'w', %s)",
                         10_000 + n, 1 + n % 1000, n, 1 + n % 9, 10_000 + n, n / 4)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def pause(self) -> None:
        self.go.clear()
        wait(lambda: self.idle.is_set() or self.errors, "the writer to pause")
        assert not self.errors, self.errors

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        self.thread.join(10)


def assert_equal_upstream(db, dsn: str, tables=("x1", "x2")) -> None:
    for table in tables:
        want = upstream_rows(dsn, table)
        wait(lambda: rows(db, table) == want, f"{table} to equal upstream", timeout=30)


def test_a_value_that_does_not_fit_fails_its_table_alone_and_refresh_table_recovers_it(items, tmp_path):
    upstream(items, "ALTER TABLE x2 ADD COLUMN price numeric(10,2); UPDATE x2 SET price = id")
    data = tmp_path / "db"
    writer = None
    with ivm.connect(data) as db:
        db.execute(create_source(items))
        for name, select in {**VIEWS, "priced": "SELECT x2.price, COUNT(*) AS n, SUM(x1.id) AS ids FROM x1 "
                                                "JOIN x2 ON x1.id % 10 = x2.id % 10 GROUP BY x2.price"}.items():
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {select}")
        writer = Writer(items)
        try:
            wait(lambda: writer.n >= 20, "some writes")
            upstream(items, "UPDATE x2 SET price = 'NaN' WHERE id = 10")  # DECIMAL(10,2) cannot hold NaN
            failed = wait(lambda: failed_tables(db), "x2 to fail")
            wait(lambda: "x2" in {r["name"] for r in db.status()["relations"] if r["status"] != "ok"},
                 "x2 to be unreadable")  # (the source's state says so first, then the database)
            assert list(failed) == ["x2"]
            assert failed["x2"].startswith("a change of upstream table public.x2 (commit LSN "), failed
            assert "does not fit table x2: column price of x2 is DECIMAL(10,2), and 'NaN'" in failed["x2"], failed
            assert "ALTER SOURCE s REFRESH TABLE x2 loads it again" in failed["x2"], failed
            [source] = db.status()["sources"]
            assert (source["status"], source["state"]) == ("ok", "streaming")
            for read, words in [("SELECT * FROM x2", "table x2 is not readable: a change of upstream table"),
                                ("SELECT * FROM joined", "it reads table x2, which failed"),
                                ("SELECT * FROM priced", "it reads table x2, which failed")]:
                with pytest.raises(ivm.ExecutionError, match=words):
                    db.sql(read)
            at_failure = writer.n
            wait(lambda: writer.n >= at_failure + 20, "writes after the failure")
            writer.pause()  # x1 went on: it equals upstream
            assert_equal_upstream(db, items, ["x1"])
            assert db.sql("SELECT n FROM n1").column(0)[0].as_py() == len(upstream_rows(items, "x1"))
            with pytest.raises(SourceError, match=r"^ALTER SOURCE s REFRESH TABLE x2 failed: .*column price of x2 "
                                                  r"is DECIMAL\(10,2\), and 'NaN'.*; the table is still failed$"):
                db.execute("ALTER SOURCE s REFRESH TABLE x2")  # the cause is still there: nothing changes
            assert failed_tables(db) == failed
            writer.go.set()

            upstream(items, "UPDATE x2 SET price = 0 WHERE price = 'NaN'")  # the cause fixed upstream
            db.execute("alter source s refresh table X2;")  # while the writer writes
            assert failed_tables(db) == {}
            wait(lambda: writer.n >= at_failure + 60, "writes after the refresh")
            db.execute("ALTER SOURCE s REFRESH TABLE x1")  # a table that follows upstream: loaded again too
            wait(lambda: writer.n >= at_failure + 80, "writes after the second refresh")
            writer.pause()
            assert_equal_upstream(db, items)
            assert_views_equal_recompute(db)
            [source] = db.status()["sources"]
            assert (source["status"], source["state"], source["failed_tables"]) == ("ok", "streaming", {})
            writer.go.set()
            wait(lambda: writer.n >= at_failure + 100, "writes before the close")
        finally:
            writer.close()
    assert not writer.errors, writer.errors
    with ivm.connect(data) as db:  # the refresh is stored: x2 readable, right, and following upstream
        upstream(items, "INSERT INTO x2 VALUES (99999, 'after the reopen', 1)")
        assert_equal_upstream(db, items)
        assert_views_equal_recompute(db)
        assert failed_tables(db) == {}
        db.execute("DROP SOURCE s")
    assert slots(items) == []  # the refreshes' temporary slots went with their connections


def test_refresh_table_errors_change_nothing(items, tmp_path):
    with ivm.connect(tmp_path / "db") as db:
        with pytest.raises(UnknownObjectError, match="^source s does not exist$"):
            db.execute("ALTER SOURCE s REFRESH TABLE x2")
        db.execute(create_source(items))
        for name, select in VIEWS.items():
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {select}")
        with pytest.raises(UnknownObjectError, match=r"^source s has no table x3 \(its tables: x1, x2\)$"):
            db.execute("ALTER SOURCE s REFRESH TABLE x3")
        with pytest.raises(ivm.SqlSyntaxError, match="expected ALTER SOURCE name REFRESH TABLE table"):
            db.execute("ALTER SOURCE s REFRESH x2")

        # joined reads x2.v: dropping it upstream fails x2, and a refresh cannot follow it either.
        upstream(items, "ALTER TABLE x2 DROP COLUMN v; INSERT INTO x2 VALUES (11); INSERT INTO x1 VALUES (1001, 'a')")
        failed = wait(lambda: failed_tables(db), "x2 to fail")
        assert "cannot drop column v of table x2: materialized view(s) joined read it" in failed["x2"], failed
        wait(lambda: len(rows(db, "x1")) == 1001, "x1 to go on")
        before = db.table_rows("x2")
        with pytest.raises(SourceError, match=r"^ALTER SOURCE s REFRESH TABLE x2 failed: cannot drop column v of "
                                              r"table x2: materialized view\(s\) joined read it .*; the table is "
                                              r"still failed$"):
            db.execute("ALTER SOURCE s REFRESH TABLE x2")
        assert failed_tables(db) == failed
        assert db.table_rows("x2").equals(before) and [c for c, _ in db.table_columns("x2")] == ["id", "v"]

        db.execute("DROP MATERIALIZED VIEW joined")  # the cause fixed here: now the refresh follows
        db.execute("ALTER SOURCE s REFRESH TABLE x2")
        assert failed_tables(db) == {} and db.table_columns("x2") == [("id", "INTEGER")]
        assert rows(db, "x2") == upstream_rows(items, "x2") and len(rows(db, "x2")) == 11
        upstream(items, "INSERT INTO x2 VALUES (12)")
        wait(lambda: len(rows(db, "x2")) == 12, "x2 to follow upstream again")
        assert_views_equal_recompute(db)

        # The upstream table leaves the publication: the refresh fails, x2 keeps its rows and its state.
        upstream(items, "ALTER PUBLICATION p DROP TABLE x2")
        with pytest.raises(SourceError, match=r"^ALTER SOURCE s REFRESH TABLE x2 failed: upstream table public\.x2 "
                                              r"is no longer in publication p; the table follows upstream as before$"):
            db.execute("ALTER SOURCE s REFRESH TABLE x2")
        assert failed_tables(db) == {} and len(rows(db, "x2")) == 12
        # A source that stopped (here: a table added to the publication after its snapshot) refreshes nothing.
        upstream(items, "CREATE TABLE x3 (id int PRIMARY KEY); ALTER PUBLICATION p ADD TABLE x3; "
                        "INSERT INTO x3 VALUES (1)")
        wait(lambda: db.status()["sources"][0]["state"] == "failed", "the source to stop")
        with pytest.raises(SourceError, match=r"^cannot refresh table x1: source s has failed \(upstream table "
                                              r"public\.x3 was added to publication p after the snapshot.*\) and is "
                                              r"not running; REFRESH TABLE runs on the source's own stream"):
            db.execute("ALTER SOURCE s REFRESH TABLE x1")


def test_a_process_killed_during_refresh_table_leaves_the_table_failed_never_half_refreshed(items, tmp_path):
    """A refresh that must alter a table marks it failed first: killed before its rows are replaced, the table
    is failed at the next open (never readable in its new shape with its old rows), and a refresh mends it."""
    upstream(items, "INSERT INTO x2 SELECT i, 'b' || i FROM generate_series(11, 100000) i")  # a refresh that lasts
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(create_source(items))
        db.execute("CREATE MATERIALIZED VIEW n2 AS SELECT COUNT(*) AS n FROM x2")
    # No change of x2 since: the stream has not seen the column, the refresh follows it (ADD COLUMN).
    upstream(items, "ALTER TABLE x2 ADD COLUMN z int DEFAULT 7")
    script = "import ivm, sys; ivm.connect(sys.argv[1]).execute('ALTER SOURCE s REFRESH TABLE x2')"
    refresh = subprocess.Popen([sys.executable, "-c", script, str(data)], cwd=ROOT, stderr=subprocess.PIPE)
    try:
        state = data / "sources" / "s.json"
        wait(lambda: "was altering it" in state.read_text() or refresh.poll() is not None,
             "the refresh to mark x2 failed", timeout=60)
        refresh.send_signal(signal.SIGKILL)
    finally:
        refresh.kill()
        _, stderr = refresh.communicate(timeout=30)
    assert refresh.returncode == -signal.SIGKILL, stderr.decode()
    with ivm.connect(data) as db:
        failed = wait(lambda: failed_tables(db), "the resumed source")
        assert list(failed) == ["x2"] and failed["x2"].startswith("ALTER SOURCE s REFRESH TABLE x2 was altering it "
                                                                  "when it stopped"), failed
        with pytest.raises(ivm.ExecutionError, match="table x2 is not readable"):
            rows(db, "x2")
        db.execute("ALTER SOURCE s REFRESH TABLE x2")
        assert db.sql("SELECT COUNT(*) AS n, MIN(z) AS lo, MAX(z) AS hi FROM x2").to_pylist() == [
            {"n": 100000, "lo": 7, "hi": 7}]
        assert db.sql("SELECT n FROM n2").column(0).to_pylist() == [100000] and failed_tables(db) == {}
