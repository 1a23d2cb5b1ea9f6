"""A real ``ivm serve`` subprocess, for tests and benchmarks; always stopped afterwards.

    with ServerProcess("--demo") as server:
        adbc_driver_flightsql.dbapi.connect(server.uri)
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # this checkout: the server runs its own code
READY = "ivm: serving Arrow Flight SQL on "
PG_READY = "ivm: serving PostgreSQL on "  # printed before READY when --pg-port is given
METRICS_READY = "ivm: serving Prometheus metrics on "  # printed before READY when --metrics-port is given


class ServerProcess:
    """``python -m ivm serve --port 0 ...`` from this checkout; ``uri`` once ready."""

    def __init__(self, *args: str, env: dict | None = None, timeout: float = 60.0):
        environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}  # env may override PYTHONPATH
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ivm", "serve", "--port", "0", *args],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.stderr: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.process.stderr, None), daemon=True).start()
        self.pg_uri: str | None = None  # postgresql://HOST:PORT with --pg-port
        self.metrics_url: str | None = None  # http://HOST:PORT/metrics with --metrics-port
        self.uri = self._wait_ready(timeout)
        self.port = int(self.uri.rsplit(":", 1)[1])
        self.pg_port = int(self.pg_uri.rsplit(":", 1)[1]) if self.pg_uri else None

    def _pump(self, stream, lines) -> None:
        for line in stream:
            if lines is not None:
                lines.put(line)
            else:
                self.stderr.append(line)
        if lines is not None:
            lines.put(None)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith(PG_READY):
                self.pg_uri = line[len(PG_READY):].strip()
            if line.startswith(METRICS_READY):
                self.metrics_url = line[len(METRICS_READY):].strip()
            if line.startswith(READY):
                return line[len(READY):].strip()
        self.stop()
        raise RuntimeError(f"ivm serve did not start:\n{''.join(self.stderr)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server and wait for it; kill it if it does not stop in time."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise RuntimeError(f"ivm serve did not stop within {timeout} s after signal {sig}")
        return self.process.returncode

    def rss_bytes(self) -> int:
        """Resident memory of the server process now."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS for the server process")

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
