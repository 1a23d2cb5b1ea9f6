"""Statement limits over Flight SQL (a real ``ivm serve`` and the ADBC driver).

Deep nesting used to come back as INTERNAL (a RecursionError in the server);
it is INVALID_ARGUMENT naming the limit now, through every statement path:
a query, an update, a prepared statement, executescript. Statements past the
size limit or the statement timeout (server options) are refused or
cancelled and nothing changes; a query call runs exactly one statement.
"""

from __future__ import annotations

import time

import adbc_driver_manager as adbc
import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flight_server import protocol
from sql_frontend.limits import MAX_NESTING
from tests.flight.conftest import run_script
from tests.flight.server import ServerProcess

N = MAX_NESTING
DEEP = {
    "3000 parentheses": "SELECT " + "(" * 3000 + "1" + ")" * 3000,
    "300 subqueries": "SELECT " + "(SELECT " * 300 + "1" + ")" * 300,
    "3000 COALESCE in a view": "CREATE MATERIALIZED VIEW deep AS SELECT id, " + "COALESCE(" * 3000 + "x"
                               + ", 0)" * 3000 + " FROM t",
    "limit + 1": "SELECT id, " + "(" * (N + 1) + "x" + ")" * (N + 1) + " FROM t",
}
SLOW = "SELECT count(*) AS n FROM t, range(100000000) a, range(100000) b"


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--max-statement-bytes", "100000", "--statement-timeout", "0.5")
    try:
        run_script(process.uri, "CREATE TABLE t (id BIGINT PRIMARY KEY, x BIGINT); INSERT INTO t VALUES (1, 2), (2, 3)")
        yield process
    finally:
        process.stop()


def tables(cur) -> list:
    cur.execute("SELECT id, x FROM t ORDER BY id")
    return cur.fetchall()


@pytest.mark.parametrize("sql", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_is_invalid_argument_naming_the_limit(server, cur, sql):
    with pytest.raises(adbc.ProgrammingError, match=f"INVALID_ARGUMENT.*the limit is {N}") as caught:
        cur.execute(sql)
    assert "INTERNAL" not in str(caught.value)
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT.*the limit is"):
        cur.executescript(sql)
    cur.execute("SHOW TABLES")
    assert [row[0] for row in cur.fetchall()] == ["t"]


def test_nesting_at_the_limit_works_as_a_query_and_a_view(server, cur):
    body = "SELECT id, " + "COALESCE(" * N + "x" + ", 0)" * N + " AS c FROM t"
    cur.execute(body)
    assert sorted(cur.fetchall()) == [(1, 2), (2, 3)]
    cur.execute("CREATE MATERIALIZED VIEW at_limit AS " + body)
    cur.execute("INSERT INTO t VALUES (3, 4)")
    cur.execute("SELECT c FROM at_limit ORDER BY id")
    assert cur.fetchall() == [(2,), (3,), (4,)]
    cur.execute("DROP MATERIALIZED VIEW at_limit")
    cur.execute("DELETE FROM t WHERE id = 3")


def test_a_statement_over_the_size_option_is_refused(server, cur):
    big = "INSERT INTO t VALUES " + ", ".join(f"({i}, {i})" for i in range(10, 20_000))
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT.*the limit is 100000 bytes") as caught:
        cur.execute(big)
    assert len(str(caught.value)) < 1000  # the error repeats 200 characters of the statement, not all of it
    assert tables(cur) == [(1, 2), (2, 3)]


def test_a_query_past_the_statement_timeout_is_deadline_exceeded(server, cur):
    started = time.perf_counter()
    with pytest.raises(adbc.OperationalError, match="TIMEOUT.*statement timeout of 0.5 s.*DeadlineExceeded"):
        cur.execute(SLOW)
    assert time.perf_counter() - started < 5
    with pytest.raises(adbc.OperationalError, match="DeadlineExceeded"):
        cur.execute("INSERT INTO t SELECT n + 10, n FROM (" + SLOW + ")")
    assert tables(cur) == [(1, 2), (2, 3)]


def test_a_garbage_statement_gets_a_short_error(server):
    with ServerProcess("--max-statement-bytes", "0") as unlimited, \
            flight_sql.connect(unlimited.uri, autocommit=True) as conn, conn.cursor() as cur:
        with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT") as caught:
            cur.execute("SELECT " + "a" * 2_000_000)
        assert "message cut" in str(caught.value) and len(str(caught.value)) < 5000  # ADBC repeats it twice


# --- one query per call -------------------------------------------------------------------------
def test_a_query_command_with_several_statements_is_refused_and_runs_nothing(server, client, cur):
    for text in ("SELECT * FROM t; DROP TABLE t", "SELECT 1; SELECT 2"):
        descriptor = fl.FlightDescriptor.for_command(protocol.pack("CommandStatementQuery", query=text))
        with pytest.raises(pa.ArrowInvalid, match="one statement; this text holds 2"):
            client.get_flight_info(descriptor)
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT"):
        cur.execute("SELECT * FROM t; DROP TABLE t")
    with pytest.raises(adbc.ProgrammingError, match="INVALID_ARGUMENT.*Nothing was run"):
        cur.executescript("INSERT INTO t VALUES (7, 7); SELECT * FROM t")
    assert tables(cur) == [(1, 2), (2, 3)]


def test_an_update_command_runs_a_script_of_changes(server, cur):
    cur.executescript("CREATE TABLE s (a BIGINT); INSERT INTO s VALUES (1); INSERT INTO s VALUES (2)")
    cur.execute("SELECT SUM(a) FROM s")
    assert cur.fetchall() == [(3,)]
    cur.execute("DROP TABLE s")
