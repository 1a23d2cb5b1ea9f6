"""Issue 23 item 6: a failed CREATE SOURCE, or a table stopped by an upstream schema change, changes nothing.

Reported: a source fails on ``ALTER TABLE x2 ADD COLUMN z``; DROP SOURCE, then
CREATE SOURCE again fails ("exists with other columns") and the tables still
hold their rows, but at the next restart both are empty: the failed CREATE had
left a state file in the snapshot phase, and a resumed snapshot empties its
tables before it starts again. Here every check runs before anything is
written, and a restart holds exactly the rows it held before.

Against a real PostgreSQL (tests/cdc/pg_server.py); the first test goes the
way the user did: ``ivm serve --data DIR``, an ADBC client, SIGTERM, restart.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time

import adbc_driver_flightsql.dbapi as flightsql
import pytest

import ivm
from flight_server.process import ServerProcess
from ivm.cdc.postgres import SourceError, describe
from tests.cdc import workload as w

DATABASES = itertools.count()
SCHEMA = """
CREATE TABLE x1 (id integer PRIMARY KEY, v text);
CREATE TABLE x2 (id integer PRIMARY KEY, v text);
INSERT INTO x1 SELECT i, 'a' || i FROM generate_series(1, 1000) i;
INSERT INTO x2 SELECT i, 'b' || i FROM generate_series(1, 10) i;
CREATE PUBLICATION p FOR TABLE x1, x2;
"""
VIEWS = {"n1": "SELECT COUNT(*) AS n FROM x1", "n2": "SELECT COUNT(*) AS n FROM x2",
         "joined": "SELECT x1.id, x2.v FROM x1 JOIN x2 ON x1.id = x2.id"}


@pytest.fixture
def items(pg):
    """An upstream database with x1 (1,000 rows) and x2 (10 rows) in publication p."""
    name = f"items{next(DATABASES)}"
    with contextlib.closing(w.connect(pg.dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    dsn = pg.dsn.replace("dbname=postgres", f"dbname={name}")
    upstream(dsn, SCHEMA)
    return dsn


def upstream(dsn: str, sql: str, *args) -> list[tuple]:
    with contextlib.closing(w.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else []


def slots(dsn: str) -> list[str]:
    return [r[0] for r in upstream(dsn, "SELECT slot_name FROM pg_replication_slots "
                                        "WHERE database = current_database() ORDER BY 1")]


def create_source(dsn: str, name: str = "s") -> str:
    return f"CREATE SOURCE {name} FROM POSTGRES CONNECTION '{dsn}' PUBLICATION 'p' SLOT '{slot(dsn, name)}'"


def slot(dsn: str, name: str = "s") -> str:
    """Slots are per cluster: name them after the test's own upstream database."""
    return f"ivm_{dsn.rsplit('dbname=', 1)[1]}_{name}"


wait = w.wait_for


# --- through ivm serve and ADBC -----------------------------------------------------------------

def query(conn, sql: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def execute(conn, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)


def server_sources(conn) -> dict[str, dict]:
    with conn.cursor() as cur:
        cur.execute("SHOW STATUS")
        facts = json.loads(cur.fetch_arrow_table().schema.metadata[b"ivm.status"])
    return {s["name"]: s for s in facts.get("sources", [])}


def counts(conn) -> tuple:
    return tuple(query(conn, f"SELECT {', '.join(f'(SELECT COUNT(*) FROM {t})' for t in ('x1', 'x2'))}")[0]) + \
        tuple(query(conn, f"SELECT n FROM {v}")[0][0] for v in ("n1", "n2")) + \
        (query(conn, "SELECT COUNT(*) FROM joined")[0][0],)


def test_failed_create_source_after_a_schema_change_keeps_every_row_across_a_restart(items, tmp_path):
    data = tmp_path / "db"
    server = ServerProcess("--data", str(data))
    try:
        with flightsql.connect(server.uri) as conn:
            conn.autocommit = True
            execute(conn, create_source(items))
            wait(lambda: server_sources(conn)["s"]["phase"] == "streaming", "the snapshot")
            for name, sql in VIEWS.items():
                execute(conn, f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            assert counts(conn) == (1000, 10, 1000, 10, 10)

            # joined reads x2.v: ivm cannot follow its drop, so x2 (alone) stops, with why in the status.
            upstream(items, "ALTER TABLE x2 DROP COLUMN v; INSERT INTO x2 VALUES (11)")
            failed = wait(lambda: server_sources(conn)["s"]["failed_tables"], "the table to fail")
            assert failed["x2"].startswith("upstream table public.x2 changed in a way ivm cannot follow: cannot "
                                           "drop column v of table x2: materialized view(s) joined read it"), failed
            assert server_sources(conn)["s"]["status"] == "ok"
            with pytest.raises(flightsql.ProgrammingError, match="table x2 is not readable: upstream table public.x2"):
                counts(conn)

            execute(conn, "DROP SOURCE s")  # its tables stay, x2 with its rows as of the change
            assert server_sources(conn) == {} and slots(items) == []
            assert counts(conn) == (1000, 10, 1000, 10, 10)
            with pytest.raises(flightsql.ProgrammingError,
                               match=r"table x2 has columns id INTEGER, v VARCHAR but upstream public\.x2 has "
                                     r"id INTEGER \(not upstream: v VARCHAR\); drop it first"):
                execute(conn, create_source(items))
            assert server_sources(conn) == {} and slots(items) == []
            assert counts(conn) == (1000, 10, 1000, 10, 10)
        assert server.stop() == 0, "".join(server.stderr)
        assert not (data / "sources" / "s.json").exists()

        server = ServerProcess("--data", str(data))
        with flightsql.connect(server.uri) as conn:
            time.sleep(0.5)  # were anything resumed at the open, it would have begun by now
            assert counts(conn) == (1000, 10, 1000, 10, 10)
            assert server_sources(conn) == {} and slots(items) == []
        assert server.stop() == 0, "".join(server.stderr)
    finally:
        server.stop()


# --- through ivm.connect ----------------------------------------------------------------------------

def rows(db, table: str) -> list[tuple]:
    return sorted(tuple(r.values()) for r in db.sql(f"SELECT * FROM {table}").to_pylist())


@pytest.mark.parametrize("local, message", [
    ("CREATE TABLE x2 (id INTEGER PRIMARY KEY, v VARCHAR, extra BIGINT)",
     r"table x2 has columns id INTEGER, v VARCHAR, extra BIGINT but upstream public\.x2 has id INTEGER, v VARCHAR "
     r"\(not upstream: extra BIGINT\)"),
    ("CREATE TABLE x2 (id INTEGER PRIMARY KEY, v INTEGER)",
     r"table x2 has columns id INTEGER, v INTEGER but upstream public\.x2 has id INTEGER, v VARCHAR "
     r"\(other types: v is INTEGER here, VARCHAR upstream\)"),
    ("CREATE TABLE x2 (id INTEGER, v VARCHAR)",
     r"table x2 has no primary key but upstream public\.x2 has primary key \(id\)"),
    ("CREATE TABLE x2 (id INTEGER PRIMARY KEY, v VARCHAR)",
     r"table x2 already holds 2 rows: a source's snapshot fills its tables from empty \(so that they "
     r"equal upstream\); DELETE FROM x2 or DROP TABLE x2 first"),
])
def test_failed_create_source_writes_nothing_and_a_reopen_keeps_every_row(items, tmp_path, local, message):
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(local)
        db.execute("INSERT INTO x2 (id) VALUES (1), (2)")  # rows of the user's own, in every shape
        before = rows(db, "x2")
        with pytest.raises(SourceError, match=message):
            db.execute(create_source(items))
        assert db.status()["sources"] == [] and slots(items) == []
        assert [o.name for o in db.objects()] == ["x2"] and rows(db, "x2") == before
    assert not (data / "sources" / "s.json").exists()
    with ivm.connect(data) as db:
        time.sleep(0.5)
        assert [o.name for o in db.objects()] == ["x2"] and rows(db, "x2") == before
        assert db.status()["sources"] == []


def test_create_source_whose_slot_exists_upstream_fails_and_leaves_that_slot(items, tmp_path):
    upstream(items, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", slot(items))
    with ivm.connect(tmp_path / "db") as db:
        with pytest.raises(SourceError, match=f"replication slot {slot(items)} already exists upstream"):
            db.execute(create_source(items))
        assert db.objects() == [] and db.status()["sources"] == []
    assert slots(items) == [slot(items)]  # not ours to drop
    assert not (tmp_path / "db" / "sources" / "s.json").exists()


def test_an_unfollowable_change_fails_its_table_across_reopens_and_drop_source_keeps_the_tables(items, tmp_path):
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(create_source(items))
        wait(lambda: db.status()["sources"][0]["phase"] == "streaming", "the snapshot")
        x2 = rows(db, "x2")
        upstream(items, "INSERT INTO x1 VALUES (1001, 'before')")
        wait(lambda: len(rows(db, "x1")) == 1001, "the insert before the change")
        upstream(items, "ALTER TABLE x2 ALTER COLUMN id TYPE smallint; INSERT INTO x2 VALUES (11, 'b11');"
                        "INSERT INTO x1 VALUES (1002, 'after')")  # a narrowing: x2 stops, x1 goes on
        wait(lambda: len(rows(db, "x1")) == 1002, "the insert after the change")
        failed = wait(lambda: db.status()["sources"][0]["failed_tables"], "x2 to fail")
        assert list(failed) == ["x2"] and "cannot change from INTEGER to SMALLINT" in failed["x2"]
        x1 = rows(db, "x1")
    for _ in range(2):  # each open resumes the source; x2 stays failed
        with ivm.connect(data) as db:
            wait(lambda: db.status()["sources"][0].get("confirmed_lsn"), "the resumed source")
            assert db.status()["sources"][0]["failed_tables"] == failed
            with pytest.raises(ivm.ExecutionError, match="table x2 is not readable"):
                rows(db, "x2")
            assert rows(db, "x1") == x1
    with ivm.connect(data) as db:
        db.execute("DROP SOURCE s")
        assert db.status()["sources"] == [] and slots(items) == []
        assert (rows(db, "x1"), rows(db, "x2")) == (x1, x2)  # x2 as of the change
    with ivm.connect(data) as db:
        assert (rows(db, "x1"), rows(db, "x2")) == (x1, x2)


def test_a_state_file_left_by_a_failed_create_of_older_versions_empties_nothing(items, tmp_path):
    """Older versions wrote the state (phase "snapshot") before the check that failed; an open resumed it."""
    data = tmp_path / "db"
    with ivm.connect(data) as db:
        db.execute(create_source(items))
        wait(lambda: db.status()["sources"][0]["phase"] == "streaming", "the snapshot")
        upstream(items, "ALTER TABLE x2 ADD COLUMN z int; INSERT INTO x2 VALUES (11, 'b11', 1)")
        wait(lambda: len(rows(db, "x2")) == 11, "the change to be followed")
        db.execute("DROP SOURCE s")
        x1, x2 = rows(db, "x1"), rows(db, "x2")
    with contextlib.closing(w.connect(items)) as conn:
        tables = describe(conn, "p")
    left = {"name": "s", "dsn": items, "publication": "p", "slot": slot(items), "phase": "snapshot", "tables": tables,
            "error": "left by an older version", "auto": True}
    (data / "sources" / "s.json").write_text(json.dumps(left))
    with ivm.connect(data) as db:
        status = wait(lambda: (found := db.status()["sources"][0]["status"]) not in ("ok", "failed: left by an older "
                      "version") and found, "the resumed source to stop")
        assert (rows(db, "x1"), rows(db, "x2")) == (x1, x2) and len(x1) == 1000
        assert status.startswith("failed: source s cannot replicate publication p: "), status
        assert "table x1 already holds 1000 rows" in status and "table x2 already holds 11 rows" in status, status
        assert (rows(db, "x1"), rows(db, "x2")) == (x1, x2) and len(x1) == 1000
        db.execute("DROP SOURCE s")
    with ivm.connect(data) as db:
        assert (rows(db, "x1"), rows(db, "x2")) == (x1, x2) and db.status()["sources"] == []


def test_drop_source_while_postgres_refuses_connections_keeps_the_source(items, pg, tmp_path):
    database = items.rsplit("dbname=", 1)[1]
    with ivm.connect(tmp_path / "db") as db:
        db.execute(create_source(items))
        wait(lambda: db.status()["sources"][0]["phase"] == "streaming", "the snapshot")
        upstream(pg.dsn, f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
        try:
            with pytest.raises(SourceError, match=f"cannot drop replication slot {slot(items)} of source s upstream: "
                                                  r".*; the source is kept \(DROP SOURCE again once PostgreSQL is "
                                                  r"reachable\)"):
                db.execute("DROP SOURCE s")
            assert [s["name"] for s in db.status()["sources"]] == ["s"]
            assert len(rows(db, "x1")) == 1000
        finally:
            upstream(pg.dsn, f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
        db.execute("DROP SOURCE s")
        assert db.status()["sources"] == [] and slots(items) == [] and len(rows(db, "x1")) == 1000
