"""``ivm serve --metrics-port``: a real server scraped over HTTP (flight_server/metrics.py)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.flight.server import ROOT, ServerProcess

HISTOGRAMS = ("ivm_batch_duration_seconds", "ivm_fold_duration_seconds", "ivm_ack_to_visible_seconds",
              "ivm_checkpoint_duration_seconds")


def scrape(url: str) -> tuple[str, dict[tuple[str, tuple], float]]:
    """The endpoint's content type and its samples: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return content_type, samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def open_streams(server) -> int:
    """``ivm_subscriptions_open`` of a server started with ``--metrics-port``."""
    return int(value(scrape(server.metrics_url)[1], "ivm_subscriptions_open"))


def open_streams_once_closed(server, seconds: float) -> int:
    """``open_streams`` once it is 0 or ``seconds`` have passed: a stream a client left ends on the
    server at its next heartbeat, not at once."""
    deadline = time.monotonic() + seconds
    while open_streams(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    return open_streams(server)


def test_text_format_with_help_for_every_metric_and_off_by_default():
    with ServerProcess("--demo", "--metrics-port", "0") as server:
        assert server.metrics_url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        ours = [f for name, f in families.items() if name.startswith("ivm_")]
        assert len(ours) > 30
        for family in ours:
            assert family.documentation, f"{family.name} has no HELP"
            assert f"# HELP {family.name}" in text or f"# HELP {family.name}_total" in text
        # in memory: the demo's two batches were acknowledged, nothing is durable
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in ours for s in f.samples}
        assert value(samples, "ivm_ingested_rows_total", table="orders") == 200
        assert value(samples, "ivm_batch_duration_seconds_count") == 2
        assert ("ivm_stored_offset", ()) not in samples
        assert families["process_resident_memory_bytes"].samples[0].value > 0
    with ServerProcess("--demo") as server:
        assert server.metrics_url is None


def show_status(cur) -> dict[str, dict]:
    cur.execute("SHOW STATUS")
    return {row["name"]: row for row in cur.fetch_arrow_table().to_pylist()}


def test_a_durable_server_after_batches(tmp_path):
    with ServerProcess("--data", str(tmp_path / "db"), "--metrics-port", "0") as server, \
            flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)")
        cur.execute("CREATE MATERIALIZED VIEW totals AS SELECT cust, SUM(amount) AS total, COUNT(*) AS n "
                    "FROM orders GROUP BY cust")
        cur.execute("CREATE MATERIALIZED VIEW low AS SELECT cust, MIN(amount) AS low FROM orders GROUP BY cust")
        _, before = scrape(server.metrics_url)
        for i in range(5):
            ids = list(range(100 * i, 100 * i + 100))
            batch = pa.table({"id": ids, "cust": [k % 7 for k in ids], "amount": [float(k) for k in ids]})
            assert cur.adbc_ingest("orders", batch, mode="append") == 100
            cur.execute("SELECT SUM(n) FROM totals")  # waits for the fold that shows the batch
            assert cur.fetchall() == [(100 * (i + 1),)]
        status = show_status(cur)
        _, after = scrape(server.metrics_url)
        with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
            served = set(re.findall(r"^# HELP (ivm_\w+)", response.read().decode(), re.M))

    assert value(after, "ivm_batch_duration_seconds_count") - value(before, "ivm_batch_duration_seconds_count") == 5
    for name in ("ivm_fold_duration_seconds_count", "ivm_ack_to_visible_seconds_count"):
        assert value(after, name) > value(before, name), name
    for name in HISTOGRAMS:  # cumulative buckets, the last one holding every observation
        buckets = sorted((float(dict(labels)["le"]), v) for (n, labels), v in after.items() if n == name + "_bucket")
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        assert buckets[-1] == (float("inf"), value(after, name + "_count"))
    assert value(after, "ivm_ingested_rows_total", table="orders") == 500
    assert value(after, "ivm_ingested_batches_total", table="orders") == 5
    # the per-view offsets, rows and offsets are SHOW STATUS's
    for view in ("totals", "low"):
        assert value(after, "ivm_view_offset", view=view) == status[view]["published_offset"]
        assert value(after, "ivm_view_failed", view=view) == 0
    assert status["totals"]["published_offset"] == value(after, "ivm_published_offset") == 5
    assert value(after, "ivm_log_head_offset") == status["orders"]["log_head"] == 5
    assert value(after, "ivm_table_rows", table="orders") == status["orders"]["rows"] == 500
    assert value(after, "ivm_table_memory_bytes", table="orders") == status["orders"]["memory_bytes"] > 0
    assert value(after, "ivm_view_maintained_batches_total", view="totals", path="incremental") \
        + value(after, "ivm_view_maintained_batches_total", view="totals", path="recompute") >= 1
    assert value(after, "ivm_checkpoints_total") >= 3  # CREATE TABLE and each CREATE VIEW
    # memory and spill
    assert value(after, "ivm_relations_memory_bytes") >= status["orders"]["memory_bytes"]
    assert value(after, "ivm_arrow_allocated_bytes") > 0
    assert value(after, "ivm_spilled_bytes") == 0  # 500 rows are far below spill_rows
    assert value(after, "process_resident_memory_bytes") > 0
    # the docs' table names exactly the metrics a durable server serves
    page = (ROOT / "docs" / "serving.md").read_text()
    section = page[page.index("## Metrics (Prometheus)"):]
    section = section[:section.index("\n## ")]
    assert set(re.findall(r"`(ivm_\w+)`", section)) == served


def test_a_taken_port_fails_the_start_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "ivm", "serve", "--port", "0", "--metrics-port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert f"ivm serve: cannot listen on 127.0.0.1:{port} for metrics" in done.stderr
    assert "serving Arrow Flight SQL" not in done.stdout  # it never said it was ready


@pytest.mark.parametrize("flag", ["--metrics-port", "--metrics-host"])
def test_flags_are_documented(flag):
    done = subprocess.run([sys.executable, "-m", "ivm", "serve", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert flag in done.stdout
