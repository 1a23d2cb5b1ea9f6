"""User SQL reaches only the database's tables and views (issue 23, item 7), embedded.

Every statement below once ran through ``Database.sql``/``execute`` and read
(or wrote) a file, a URL, an extension or DuckDB's settings. Each must now be
refused with AccessDeniedError naming what was refused, must not echo what
the file holds, and must change nothing. Two lines of defence are tested
apart: sql_frontend/access.py refuses by name before anything runs; every
DuckDB instance is locked too (ivm/execute/duck.py), which the test proves by
switching the first line off.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

import ivm
from ivm.execute import duck
from sql_frontend import statements

SECRET = "ivm-secret-marker-7f3a"


@pytest.fixture(params=["memory", "durable"])
def db(request, tmp_path):
    database = ivm.connect(tmp_path / "db" if request.param == "durable" else None)
    database.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)")
    database.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    database.execute("CREATE MATERIALIZED VIEW n AS SELECT COUNT(*) AS c FROM t")
    if request.param == "durable":
        database.execute("CHECKPOINT")  # the data directory holds relations, a log and a manifest
    yield database
    database.close()


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    secret = tmp_path / "secret.csv"
    secret.write_text(f"{SECRET},1\n")
    return {"secret": str(secret), "out": str(tmp_path / "out"), "data": str(tmp_path / "db")}


# Statements as a client would send them; {secret}, {out} and {data} are paths of the test.
REFUSED = [
    ("SELECT * FROM read_text('/etc/passwd')", "read_text"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM read_csv('{secret}')", "read_csv"),
    ("SELECT * FROM read_csv_auto('{secret}')", "read_csv_auto"),
    ("SELECT * FROM read_text('/etc/shadow')", "read_text"),
    ("SELECT content FROM read_text('/proc/self/environ')", "read_text"),
    ("SELECT * FROM read_blob('{secret}')", "read_blob"),
    ("SELECT * FROM glob('/etc/*')", "glob"),
    ("SELECT * FROM read_json('{secret}')", "read_json"),
    ("SELECT * FROM read_parquet('{data}/relations/*/*.parquet')", "read_parquet"),
    ("SELECT * FROM read_text('{data}/LOCK')", "read_text"),
    ("SELECT * FROM read_blob('{data}/log/*')", "read_blob"),
    ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "read_csv"),
    ("SELECT * FROM sniff_csv('{secret}')", "sniff_csv"),
    ("SELECT * FROM query('SELECT * FROM read_text(''{secret}'')')", "query"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("SELECT * FROM t, LATERAL read_text(t.v)", "read_text"),
    ("SELECT * FROM t WHERE v IN (SELECT content FROM read_text('{secret}'))", "read_text"),
    ("SELECT * FROM t JOIN read_csv('{secret}') AS f ON true", "read_csv"),
    ("EXPLAIN SELECT * FROM read_text('{secret}')", "read_text"),
    ("CREATE TABLE stolen AS SELECT * FROM read_csv('{secret}')", "read_csv"),
    ("CREATE TABLE stolen (id BIGINT PRIMARY KEY, v VARCHAR DEFAULT (SELECT content FROM read_text('{secret}')))",
     "read_text"),
    ("INSERT INTO t SELECT 9, content FROM read_text('{secret}')", "read_text"),
    ("UPDATE t SET v = (SELECT content FROM read_text('{secret}'))", "read_text"),
    ("DELETE FROM t WHERE v NOT IN (SELECT content FROM read_text('{secret}'))", "read_text"),
    ("CREATE MATERIALIZED VIEW stolen AS SELECT * FROM read_text('{secret}')", "read_text"),
    ("COPY t TO '{out}.csv'", "COPY t TO '{out}.csv'"),
    ("COPY (SELECT 1) TO '{out}.parquet' (FORMAT parquet)", "COPY (SELECT 1)"),
    ("EXPORT DATABASE '{out}'", "EXPORT DATABASE"),
    ("ATTACH '{out}.db'", "ATTACH '{out}.db'"),
    ("ATTACH '{out}.db' AS other", "ATTACH"),
    ("DETACH memory", "DETACH memory"),
    ("USE memory", "USE memory"),
    ("INSTALL httpfs", "INSTALL httpfs"),
    ("FORCE INSTALL httpfs", "FORCE INSTALL"),
    ("LOAD httpfs", "LOAD httpfs"),
    ("LOAD '{out}.duckdb_extension'", "LOAD"),
    ("PRAGMA threads = 1", "PRAGMA threads"),
    ("RESET threads", "RESET threads"),
    ("CALL pragma_version()", "CALL"),
    ("CREATE SECRET (TYPE s3, KEY_ID 'k', SECRET 's')", "CREATE SECRET"),
    ("CREATE PERSISTENT SECRET keep (TYPE s3, KEY_ID 'k', SECRET 's')", "CREATE PERSISTENT SECRET"),
    ("SELECT 1; SELECT * FROM read_text('{secret}')", "read_text"),
]


def state(db: ivm.Database) -> tuple:
    return (db.sql("SHOW TABLES").to_pylist(), db.sql("SELECT * FROM t ORDER BY id").to_pylist(),
            db.sql("SELECT * FROM n").to_pylist())


def outputs(files: dict[str, str]) -> list[str]:
    """Files a refused statement could have written."""
    out = Path(files["out"])
    return sorted(str(p) for p in out.parent.iterdir() if p.name.startswith(out.name))


def refused(db: ivm.Database, sql: str, *words: str) -> str:
    """Run ``sql``; it must raise AccessDeniedError naming ``words`` and change nothing. Its message."""
    before = state(db)
    run = db.execute if ";" in sql or not sql.lstrip().upper().startswith(("SELECT", "EXPLAIN")) else db.sql
    with pytest.raises(ivm.AccessDeniedError) as caught:
        run(sql)
    message = str(caught.value)
    for word in words:
        assert word in message, message
    assert "is not allowed" in message and "not available" in message, message
    for leaked in (SECRET, "root:", "PATH="):
        assert leaked not in message, message
    assert state(db) == before, "a refused statement changed the database"
    return message


@pytest.mark.parametrize("template,named", REFUSED, ids=[r[0][:50] for r in REFUSED])
def test_file_access_is_refused(db, files, template, named):
    sql = template.format(**files)
    refused(db, sql, named.format(**files))
    assert outputs(files) == [], "a refused statement wrote a file"


def test_duckdb_settings_cannot_change(db):
    """SET and PRAGMA reach ivm's own settings only; DuckDB's stay as the engine set them."""
    setting = "SELECT current_setting('threads') AS t, current_setting('enable_external_access') AS e"
    before = db.sql(setting).to_pylist()
    with pytest.raises(ivm.UnsupportedError, match="unknown setting threads"):
        db.execute("SET threads = 1")
    with pytest.raises(ivm.UnsupportedError, match="unknown setting enable_external_access"):
        db.execute("SET enable_external_access = true")
    refused(db, "PRAGMA enable_external_access = true", "PRAGMA enable_external_access")
    assert db.sql(setting).to_pylist() == before
    assert before[0]["e"] is False


def test_the_reads_instance_is_locked(db):
    """What a client's SELECT runs on: no file access, locked settings, no extension autoload,
    and the only directory it may reach is its own temp directory, made by the engine."""
    row = db.sql("SELECT current_setting('enable_external_access') AS external, "
                 "current_setting('lock_configuration') AS locked, "
                 "current_setting('autoload_known_extensions') AS autoload, "
                 "current_setting('autoinstall_known_extensions') AS autoinstall, "
                 "current_setting('temp_directory') AS temp, "
                 "current_setting('allowed_directories') AS allowed").to_pylist()[0]
    assert (row["external"], row["locked"], row["autoload"], row["autoinstall"]) == (False, True, False, False)
    temp = Path(row["temp"])
    assert temp.name == "reads" and temp.parent.name.startswith("ivm-duckdb-"), row
    assert not str(temp).startswith(os.getcwd()), "DuckDB would spill into the server's working directory"
    assert [a.rstrip("/") for a in row["allowed"]] == [str(temp)]


def test_duckdb_refuses_what_the_frontend_lets_through(db, files, monkeypatch):
    """The second line: with sql_frontend's check switched off, DuckDB itself refuses the read
    (reads, CREATE TABLE AS and a DEFAULT on the binder), as AccessDeniedError, leaking nothing."""
    monkeypatch.setattr(statements, "check_tree", lambda tree: None)
    for sql in ("SELECT * FROM read_text('{secret}')", "SELECT * FROM glob('/etc/*')",
                "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
                "CREATE TABLE stolen AS SELECT * FROM read_csv('{secret}')",
                "CREATE TABLE stolen (id BIGINT PRIMARY KEY, n BIGINT DEFAULT (SELECT count(*) FROM read_text('{secret}')))"):
        before = state(db)
        with pytest.raises(ivm.AccessDeniedError, match="disabled by configuration") as caught:
            db.execute(sql.format(**files))
        assert SECRET not in str(caught.value) and "root:" not in str(caught.value)
        assert state(db) == before


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('{secret}')", "SELECT * FROM glob('{dir}/*')", "COPY (SELECT 1) TO '{out}.csv'",
    "ATTACH '{out}.db'", "INSTALL httpfs", "LOAD httpfs", "CREATE SECRET (TYPE s3)", "SET threads = 2",
    "SET enable_external_access = true", "SELECT * FROM '{secret}'",
])
def test_every_duckdb_instance_is_locked(files, sql):
    """ivm.execute.duck.connect (every DuckDB instance ivm opens) refuses files, extensions, secrets and settings."""
    con = duck.connect(1, os.path.join(files["out"] + "-scratch", "x"))
    try:
        with pytest.raises((duckdb.PermissionException, duckdb.InvalidInputException, duckdb.CatalogException)):
            con.execute(sql.format(dir=os.path.dirname(files["secret"]), **files)).fetchall()
    finally:
        con.close()
    assert outputs(files) == []


def test_range_and_ordinary_sql_still_run(db):
    assert db.sql("SELECT * FROM range(3)").column(0).to_pylist() == [0, 1, 2]
    assert db.sql("SELECT x FROM generate_series(1, 2) AS g(x)").column(0).to_pylist() == [1, 2]
    assert db.sql("SELECT unnest([1, 2]) AS u").column(0).to_pylist() == [1, 2]
    assert db.sql("WITH c AS (SELECT id, row_number() OVER (ORDER BY id DESC) AS r FROM t) "
                  "SELECT id FROM c WHERE r = 1").to_pylist() == [{"id": 2}]


def test_durable_features_work_locked(tmp_path):
    """ivm's own file work (log, checkpoint, spill, reopen) is not SQL and keeps working."""
    path = tmp_path / "db"
    db = ivm.connect(path, spill_rows=10)
    db.execute("CREATE TABLE big (id BIGINT PRIMARY KEY, v VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW per_v AS SELECT v, COUNT(*) AS n FROM big GROUP BY v")
    db.execute("INSERT INTO big SELECT i, 'v' || (i % 3) FROM range(100) AS r(i)")
    db.execute("CHECKPOINT")
    temp = Path(db.sql("SELECT current_setting('temp_directory') AS t").to_pylist()[0]["t"]).parent
    assert temp.is_dir()
    db.close()
    assert not temp.exists(), "the engine's DuckDB temp directories outlive it"
    db = ivm.connect(path, spill_rows=10)
    try:
        assert db.sql("SELECT * FROM per_v ORDER BY v").to_pylist() == [
            {"v": "v0", "n": 34}, {"v": "v1", "n": 33}, {"v": "v2", "n": 33}]
        assert db.sql("SELECT COUNT(*) AS c FROM big").to_pylist() == [{"c": 100}]
    finally:
        db.close()


@pytest.mark.parametrize("sql,shown", [
    ("ATTACH '/tmp/x'", "statement ATTACH '/tmp/x' is not allowed"),
    ("attach '/Tmp/Mixed' AS y", "statement attach '/Tmp/Mixed' AS y is not allowed"),
    ("SELECT 1;   Copy t TO '/tmp/Out.csv'", "statement Copy t TO '/tmp/Out.csv' is not allowed"),
])
def test_refusals_quote_the_statement_as_written(sql, shown):
    with ivm.connect() as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        with pytest.raises(ivm.AccessDeniedError) as caught:
            db.execute(sql)
        assert shown in str(caught.value)


@pytest.mark.parametrize("sql,shown", [
    ("vacuum  t", "statement vacuum  t is not supported"),
    ("SELECT 1; Show Everything", "SHOW Everything is not supported"),
    ("set Ivm.Engine", "statement set Ivm.Engine is not supported"),
])
def test_other_errors_quote_the_statement_as_written(sql, shown):
    with ivm.connect() as db:
        with pytest.raises(ivm.IvmError) as caught:
            db.execute(sql)
        assert shown in str(caught.value)


def test_a_killed_process_leaves_no_duckdb_temp_directory(tmp_path, monkeypatch):
    """Scratch directories are named by process id; the next engine removes those of dead processes."""
    import subprocess
    import sys

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    code = "import os, ivm; db = ivm.connect(); os.kill(os.getpid(), 9)"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)}, check=False)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ivm-duckdb-")], "the child made none"
    with ivm.connect():
        mine = [p for p in tmp_path.iterdir() if p.name.startswith("ivm-duckdb-")]
        assert [p.name.split("-")[2] for p in mine] == [str(os.getpid())]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ivm-duckdb-")]
