"""A client reads only the database's tables and views (issue 23, item 7), over ADBC.

A real ``ivm serve`` with TLS, a token (from $IVM_AUTH_TOKEN, so it is in
the server's /proc/self/environ) and a data directory; an authenticated
client sends every statement that once read a file, a URL, an extension or
DuckDB's settings. Each is PERMISSION_DENIED with a message naming what was
refused, echoes nothing the file holds, writes no file and changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager as adbc
import pytest

from tests.flight.server import ServerProcess
from tests.flight.test_auth_tls import make_certificate

TOKEN = "file-access-token-5c1e"
SECRET = "ivm-secret-marker-7f3a"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("file_access")
    cert, key, pem = make_certificate(root)
    (root / "secret.csv").write_text(f"{SECRET},1\n")
    data = root / "db"
    process = ServerProcess("--tls-cert", cert, "--tls-key", key, "--data", str(data), env={"IVM_AUTH_TOKEN": TOKEN})
    kwargs = {"adbc.flight.sql.client_option.tls_root_certs": pem.decode(),
              "adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}
    try:
        with flight_sql.connect(process.uri, db_kwargs=kwargs, autocommit=True) as conn, conn.cursor() as cur:
            cur.executescript("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR);"
                              "INSERT INTO t VALUES (1, 'a'), (2, 'b');"
                              "CREATE MATERIALIZED VIEW n AS SELECT COUNT(*) AS c FROM t;"
                              "CHECKPOINT")
        yield {"uri": process.uri, "kwargs": kwargs, "paths": {
            "secret": str(root / "secret.csv"), "key": key, "data": str(data), "out": str(root / "out")}}
    finally:
        process.stop()


@pytest.fixture
def cur(served):
    with flight_sql.connect(served["uri"], db_kwargs=served["kwargs"], autocommit=True) as conn:
        with conn.cursor() as cursor:
            yield cursor


REFUSED = [
    ("SELECT * FROM read_text('/etc/shadow')", "read_text"),
    ("SELECT * FROM read_text('/etc/passwd')", "read_text"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM read_text('{key}')", "read_text"),
    ("SELECT content FROM read_text('/proc/self/environ')", "read_text"),
    ("SELECT * FROM glob('/etc/*')", "glob"),
    ("SELECT * FROM read_csv('{secret}')", "read_csv"),
    ("SELECT * FROM read_parquet('{data}/relations/*/*.parquet')", "read_parquet"),
    ("SELECT * FROM read_json('{secret}')", "read_json"),
    ("SELECT * FROM read_blob('{data}/LOCK')", "read_blob"),
    ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "read_csv"),
    ("SELECT * FROM query('SELECT * FROM read_text(''{secret}'')')", "query"),
    ("SELECT * FROM t, LATERAL read_text(t.v)", "read_text"),
    ("CREATE TABLE stolen AS SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("INSERT INTO t SELECT 9, content FROM read_text('{secret}')", "read_text"),
    ("UPDATE t SET v = (SELECT content FROM read_text('{secret}'))", "read_text"),
    ("CREATE MATERIALIZED VIEW stolen AS SELECT * FROM read_text('{secret}')", "read_text"),
    ("COPY t TO '{out}.csv'", "COPY t TO '{out}.csv'"),
    ("COPY (SELECT 1) TO '{out}.parquet' (FORMAT parquet)", "COPY (SELECT 1)"),
    ("EXPORT DATABASE '{out}'", "EXPORT DATABASE '{out}'"),
    ("ATTACH '{out}.db'", "ATTACH '{out}.db'"),
    ("INSTALL httpfs", "INSTALL httpfs"),
    ("LOAD httpfs", "LOAD httpfs"),
    ("PRAGMA threads = 1", "PRAGMA threads = 1"),
    ("CREATE SECRET (TYPE s3, KEY_ID 'k', SECRET 's')", "CREATE SECRET"),
]


def state(cur) -> tuple:
    cur.execute("SHOW TABLES")
    tables = cur.fetchall()
    cur.execute("SELECT * FROM t ORDER BY id")
    rows = cur.fetchall()
    cur.execute("SELECT * FROM n")
    return tables, rows, cur.fetchall()


@pytest.mark.parametrize("template,named", REFUSED, ids=[r[0][:50] for r in REFUSED])
def test_file_access_is_permission_denied(served, cur, template, named):
    paths = served["paths"]
    before = state(cur)
    with pytest.raises(adbc.ProgrammingError) as caught:
        cur.execute(template.format(**paths))
        cur.fetchall()
    message = str(caught.value)
    assert "PermissionDenied" in message and "is not allowed" in message and "not available" in message, message
    assert named.format(**paths) in message, message
    for leaked in (SECRET, "root:", TOKEN, "PRIVATE KEY", "PATH="):
        assert leaked not in message, message
    assert "Traceback" not in message and "INTERNAL" not in message
    assert state(cur) == before
    out = Path(paths["out"])
    assert not [p for p in out.parent.iterdir() if p.name.startswith(out.name)], "a refused statement wrote a file"


def test_duckdb_settings_stay_locked(cur):
    cur.execute("SELECT current_setting('enable_external_access'), current_setting('lock_configuration')")
    assert cur.fetchall() == [(False, True)]
    with pytest.raises(adbc.NotSupportedError, match="unknown setting enable_external_access"):
        cur.execute("SET enable_external_access = true")
    cur.execute("SELECT current_setting('enable_external_access')")
    assert cur.fetchall() == [(False,)]


def test_ordinary_sql_still_runs(cur):
    cur.execute("WITH c AS (SELECT id, row_number() OVER (ORDER BY id DESC) AS r FROM t) "
                "SELECT c.id, (SELECT COUNT(*) FROM range(3)) AS k FROM c WHERE r = 1")
    assert cur.fetchall() == [(2, 3)]


@pytest.mark.parametrize("sql,shown,code", [
    ("ATTACH '/tmp/x'", "statement ATTACH '/tmp/x' is not allowed", "PermissionDenied"),
    ("vacuum  t", "statement vacuum  t is not supported", "Unimplemented"),
    ("SELEC 1", "syntax error", "InvalidArgument"),
    ("SELECT * FROM Nowhere_Table", "table or view nowhere_table does not exist", "NotFound"),
])
def test_messages_quote_the_statement_once(cur, sql, shown, code):
    """The statement as written (not upper-cased), said once: no repeat after 'Detail: Python exception'."""
    with pytest.raises(adbc.Error) as caught:
        cur.execute(sql)
    message = str(caught.value)
    assert shown in message and code in message, message
    assert message.count(shown) == 1, message
