"""``ivm serve`` as a process: flags, start-up failures, clean shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.conftest import run_script
from tests.flight.server import ROOT, ServerProcess
from tests.flight.test_subscriptions import consume
from tests.integrate import Integrator
from tests.oracle.compare import multiset_diff


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ivm", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_flags():
    help_text = run_cli("serve", "--help").stdout
    for flag in ("--data", "--host", "--port", "--auth-token", "--tls-cert", "--tls-key", "--demo"):
        assert flag in help_text


def test_tls_needs_both_files():
    result = run_cli("serve", "--port", "0", "--tls-cert", "cert.pem")
    assert result.returncode != 0 and "--tls-cert and --tls-key go together" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_stop_the_server_cleanly_even_with_live_subscribers(sig):
    server = ServerProcess("--demo")
    try:
        assert server.uri.startswith("grpc://127.0.0.1:")  # loopback unless told otherwise
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM orders")
            assert cur.fetchall() == [(200,)]
        client = fl.connect(server.uri)
        reader = client.do_get(fl.Ticket(json.dumps({"subscribe": "region_sales", "from": 0}).encode()))
        first = reader.read_chunk()
        assert first.data.num_rows > 0
        ended = threading.Event()

        def drain() -> None:
            try:
                while True:
                    reader.read_chunk()
            except (StopIteration, fl.FlightError, OSError):
                pass
            ended.set()

        threading.Thread(target=drain, daemon=True).start()
        assert server.stop(sig, timeout=30) == 0
        assert ended.wait(10), "the subscription did not end when the server stopped"
        log = "".join(server.stderr)
        assert "shutting down" in log and "stopped" in log and "Traceback" not in log
        client.close()
    finally:
        server.stop()


def test_data_directory_survives_a_restart(tmp_path):
    with ServerProcess("--data", str(tmp_path / "db")) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE kept (id BIGINT PRIMARY KEY, v VARCHAR)")
            cur.execute("CREATE MATERIALIZED VIEW kept_n AS SELECT COUNT(id) AS n FROM kept")
            cur.execute("INSERT INTO kept VALUES (1, 'a'), (2, 'b')")
    with ServerProcess("--data", str(tmp_path / "db")) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT n FROM kept_n")
            assert cur.fetchall() == [(2,)]


def _offset(cur) -> int:
    cur.execute("SELECT 1")
    return int(cur.fetch_arrow_table().schema.metadata[b"ivm.offset"])


def _insert(uri: str, first: int, count: int) -> int:
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for i in range(first, first + count):
            cur.execute(f"INSERT INTO kept VALUES ({i}, 'g{i % 3}')")
        return _offset(cur)


def _catch_up(uri: str, consumer: Integrator, since: int, until: int) -> int:
    with fl.connect(uri) as client:
        reader = client.do_get(fl.Ticket(json.dumps({"subscribe": "by_v", "from": since, "until": until}).encode()))
        return consume(reader, consumer, until)


def _view(uri: str):
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM by_v")
        return cur.fetch_arrow_table()


def _resume(uri: str, consumer: Integrator, since: int, until: int) -> tuple[Integrator, int, str]:
    """Catch up from ``since``; when refused, re-read the view and go on from that read."""
    try:
        return consumer, _catch_up(uri, consumer, since, until), "resumed"
    except pa.ArrowInvalid as e:
        view = _view(uri)
        fresh = Integrator()
        at = int(view.schema.metadata[b"ivm.offset"])
        fresh.add(view.append_column("__weight", pa.repeat(pa.scalar(1, pa.int64()), view.num_rows))
                  .append_column("__offset", pa.repeat(pa.scalar(at, pa.int64()), view.num_rows)))
        return fresh, at, str(e)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_subscriptions_across_a_restart(tmp_path, how):
    """Consumers of a view's changes over a durable server, which stops
    (SIGTERM: it checkpoints) or is killed (SIGKILL: the log replays on start).
    Every acknowledged insert is back. A consumer that had caught up resumes
    exactly (integrates to the view). A consumer that was behind may be
    refused with INVALID_ARGUMENT (after a stop always: the reopened history
    starts at the stored offset) - never a gap or a repeat - and then re-reads
    the view and goes on from the offset of that read."""
    data = str(tmp_path / "db")
    current, behind = Integrator(), Integrator()
    with ServerProcess("--data", data) as server:
        run_script(server.uri, "CREATE TABLE kept (id BIGINT PRIMARY KEY, v VARCHAR);"
                   "CREATE MATERIALIZED VIEW by_v AS SELECT v, COUNT(*) AS n FROM kept GROUP BY v")
        acked = _insert(server.uri, 0, 5)
        behind_at = _catch_up(server.uri, behind, 0, acked)
        acked = _insert(server.uri, 5, 3)
        current_at = _catch_up(server.uri, current, 0, acked)
        assert server.stop(how) == (0 if how == signal.SIGTERM else -signal.SIGKILL)
    with ServerProcess("--data", data) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            assert _offset(cur) == acked
            cur.execute("SELECT COUNT(*) FROM kept")
            assert cur.fetchall() == [(8,)]
        acked = _insert(server.uri, 8, 4)
        current, current_at, outcome = _resume(server.uri, current, current_at, acked)
        assert outcome == "resumed"
        behind, behind_at, outcome = _resume(server.uri, behind, behind_at, acked)
        if how == signal.SIGTERM:
            assert "no longer retained" in outcome, outcome
        else:
            assert outcome == "resumed" or "folded together" in outcome or "no longer retained" in outcome, outcome
        acked = _insert(server.uri, 12, 2)
        view = _view(server.uri)
        for consumer, since in ((current, current_at), (behind, behind_at)):
            assert _catch_up(server.uri, consumer, since, acked) == acked
            assert multiset_diff(consumer.table(view.schema), view) is None


def test_data_directory_errors_are_reported_and_exit_non_zero(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run_cli("serve", "--port", "0", "--data", str(blocker / "db"))
    assert result.returncode != 0
    assert result.stderr.startswith("ivm serve: ") and "Traceback" not in result.stderr
