"""Cancel requests and the session's statement_timeout stop a long statement with 57014;
the connection goes on."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.pgwire.conftest import connect

LONG = "SELECT count(*) FROM big a, big b, big c WHERE a.x + b.x + c.x = -1"  # 2.7e10 row triples


@pytest.fixture(scope="module", autouse=True)
def big(server):
    with connect(server) as conn:
        conn.execute("CREATE TABLE big (x BIGINT)")
        with conn.cursor().copy("COPY big FROM STDIN") as copy:
            copy.write("".join(f"{i}\n" for i in range(3000)))


def test_cancel_request(server):
    with connect(server) as conn:
        timer = threading.Timer(1.0, conn.cancel)
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(psycopg.errors.QueryCanceled) as caught:
                conn.execute(LONG)
        finally:
            timer.cancel()
        assert caught.value.sqlstate == "57014"
        assert "canceling statement due to user request" in str(caught.value)
        assert time.monotonic() - started < 15
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (3000,)


def test_cancel_of_another_connection_needs_its_key(server):
    with connect(server) as victim, connect(server) as other:
        # A cancel request carries the process id and secret key of the connection it cancels:
        # cancelling `other` leaves `victim` running to the end.
        other.cancel()
        assert victim.execute("SELECT count(*) FROM big WHERE x < 10").fetchone() == (10,)


def test_statement_timeout(server):
    with connect(server) as conn:
        conn.execute("SET statement_timeout = 300")
        assert conn.execute("SHOW statement_timeout").fetchone() == ("300",)
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            conn.execute(LONG)
        conn.execute("SET statement_timeout = 0")
        assert conn.execute("SELECT 1").fetchone() == (1,)
