"""SUBSCRIBE over pgwire: a view's or table's rows, then its changes as they commit, until the client cancels."""

from __future__ import annotations

import queue
from collections import Counter
import threading

import psycopg
import pytest

from tests.flight.test_metrics import open_streams, open_streams_once_closed
from tests.pgwire.conftest import connect

WAIT = 20  # seconds for any expected row


@pytest.fixture(scope="module", autouse=True)
def view(server):
    with connect(server) as conn:
        conn.execute("CREATE TABLE s_orders (id BIGINT PRIMARY KEY, cust BIGINT, amount BIGINT)")
        conn.execute("CREATE MATERIALIZED VIEW s_totals AS SELECT cust, SUM(amount) AS total FROM s_orders GROUP BY cust")
        conn.execute("INSERT INTO s_orders VALUES (1, 7, 10)")


class Subscriber:
    """Runs ``consume(conn, rows)`` on a thread; rows arrive in ``rows``; ``stop`` cancels it."""

    def __init__(self, server, consume):
        self.conn = connect(server)
        self.conn.execute("SET statement_timeout = 0")  # a subscription runs until cancelled
        self.rows: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(consume,), daemon=True)
        self.thread.start()

    def _run(self, consume) -> None:
        try:
            consume(self.conn, self.rows)
        except BaseException as e:  # noqa: BLE001 (the test inspects it)
            self.error = e

    def take(self, n: int) -> list:
        return [self.rows.get(timeout=WAIT) for _ in range(n)]

    def stop(self) -> BaseException | None:
        self.conn.cancel()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        self.conn.close()
        return self.error


def copy_rows(conn, rows, sql="COPY (SUBSCRIBE TO s_totals) TO STDOUT"):
    with conn.cursor().copy(sql) as copy:
        for row in copy.rows():
            rows.put(row)


def test_copy_subscribe_streams_snapshot_then_changes(server):
    subscriber = Subscriber(server, copy_rows)
    try:
        (snapshot,) = subscriber.take(1)
        start = int(snapshot[0])
        assert snapshot[1:] == ("1", "7", "10")  # mz_diff, cust, total
        with connect(server) as writer:
            writer.execute("INSERT INTO s_orders VALUES (2, 7, 5)")
            offset = int(writer.info.parameter_status("ivm_offset"))
        changes = sorted(subscriber.take(2), key=lambda r: r[1])
        assert [r[1:] for r in changes] == [("-1", "7", "10"), ("1", "7", "15")]
        assert {int(r[0]) for r in changes} == {offset} and offset > start
        assert open_streams(server) == 1
    finally:
        error = subscriber.stop()
    assert isinstance(error, psycopg.errors.QueryCanceled)
    assert open_streams_once_closed(server, WAIT) == 0  # a cancelled statement's stream ends with it


def test_subscribe_with_progress_as_of_over_extended_protocol(server):
    with connect(server) as conn:
        since = int(conn.execute("SHOW ivm_offset").fetchone()[0])
        conn.execute("INSERT INTO s_orders VALUES (3, 8, 1)")

    def stream(conn, rows):
        for row in conn.cursor().stream(f"SUBSCRIBE s_totals AS OF {since} WITH (PROGRESS)"):
            rows.put(row)

    subscriber = Subscriber(server, stream)
    try:
        got = []
        while not any(r[1] is False for r in got):  # the change made after `since`, no snapshot
            got += subscriber.take(1)
        first = got[0]
        assert first[1] is True and first[0] == since and first[2:] == (None, None, None)  # progress row
        change = next(r for r in got if r[1] is False)
        assert change[2:] == (1, 8, 1) and change[0] > since
        assert any(r[1] is True and r[0] >= change[0] for r in got + subscriber.take(1))
    finally:
        error = subscriber.stop()
    assert isinstance(error, psycopg.errors.QueryCanceled)


def test_a_table_streams_its_batches(server):
    """Inserts +1, an update -old/+new, a delete -1, each at its batch's offset."""
    with connect(server) as conn:
        conn.execute("CREATE TABLE s_items (id BIGINT PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO s_items VALUES (1, 'a')")
    subscriber = Subscriber(server, lambda conn, rows: copy_rows(conn, rows, "COPY (SUBSCRIBE s_items) TO STDOUT"))
    try:
        ((start, *snapshot),) = subscriber.take(1)
        assert snapshot == ["1", "1", "a"]
        offsets = []
        with connect(server) as writer:
            for sql in ("INSERT INTO s_items VALUES (2, 'b')", "UPDATE s_items SET name = 'c' WHERE id = 1",
                        "DELETE FROM s_items WHERE id = 2"):
                writer.execute(sql)
                offsets.append(int(writer.info.parameter_status("ivm_offset")))
        got = sorted((int(t), diff, id, name) for t, diff, id, name in subscriber.take(4))
        assert got == [(offsets[0], "1", "2", "b"), (offsets[1], "-1", "1", "a"), (offsets[1], "1", "1", "c"),
                       (offsets[2], "-1", "2", "b")]
    finally:
        error = subscriber.stop()
    assert isinstance(error, psycopg.errors.QueryCanceled)


def test_resumed_as_of_an_offset_integrates_to_the_view(server):
    with connect(server) as conn:
        seen = Counter(conn.execute("SELECT cust, total FROM s_totals").fetchall())
        since = int(conn.info.parameter_status("ivm_offset"))
        conn.execute("INSERT INTO s_orders VALUES (40, 9, 4), (41, 7, 1)")
        conn.execute("UPDATE s_orders SET amount = 2 WHERE id = 40")
        latest = int(conn.info.parameter_status("ivm_offset"))
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = 0")
            for t, progressed, diff, cust, total in cur.stream(f"SUBSCRIBE s_totals AS OF {since} WITH (PROGRESS)"):
                if progressed and t >= latest:
                    break
                if not progressed:  # (a batch's -1 and +1 come in either order)
                    seen[(cust, total)] += diff
        conn.cancel()  # psycopg's stream has left the rest unread: end the statement
    with connect(server) as conn:
        current = Counter(conn.execute("SELECT cust, total FROM s_totals").fetchall())
        assert +seen == current and not -seen  # no row left with a negative count


def test_subscribe_errors(conn):
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SUBSCRIBE TO no_such_view")
    with pytest.raises(psycopg.errors.SyntaxError):
        conn.execute("SUBSCRIBE TO s_totals WITH (COLOR)")
    latest = int(conn.execute("SHOW ivm_offset").fetchone()[0])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="ahead of the latest offset"):
        conn.execute(f"SUBSCRIBE TO s_totals AS OF {latest + 1000}")
    conn.execute("CREATE TABLE s_altered (id BIGINT PRIMARY KEY)")
    conn.execute("INSERT INTO s_altered VALUES (1)")
    since = int(conn.info.parameter_status("ivm_offset"))
    conn.execute("ALTER TABLE s_altered ADD COLUMN note TEXT")  # its changes before have other columns
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no longer retained.*read s_altered again"):
        conn.execute(f"SUBSCRIBE TO s_altered AS OF {since - 1}")
    assert conn.execute("SELECT 1").fetchone() == (1,)
