"""``ivm serve`` as a process: flags, start-up failures, clean shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow.flight as fl
import pytest

from tests.flight.server import ROOT, ServerProcess


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


def test_data_directory_errors_are_reported_and_exit_non_zero(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run_cli("serve", "--port", "0", "--data", str(blocker / "db"))
    assert result.returncode != 0
    assert result.stderr.startswith("ivm serve: ") and "Traceback" not in result.stderr
