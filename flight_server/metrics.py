"""``ivm serve --metrics-port N``: the database's numbers for Prometheus, read at scrape time.

Every scrape reads ``db.status()`` (offsets, lags, sizes, counts as they are
now) and ``db.observations()`` (the latency histograms and ingest counts the
engine recorded where they happen, ivm/reads/observations.py) and turns them into
metric families; nothing is copied or counted on the side, so a scrape
shows exactly what ``SHOW STATUS`` would. Each server has its own registry
(never prometheus_client's global one): two databases in one process do not
mix. The process's own numbers (resident memory, CPU seconds, open files)
come from prometheus_client's process collector.

The endpoint has no authentication: like every port of ``ivm serve`` it
binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import ivm
from flight_server.subscribe import open_streams

# name (after ivm_), key in db.observations()["histograms"], help
HISTOGRAMS = (
    ("batch_duration_seconds", "batch_seconds",
     "Seconds from a producer handing in a change batch to its acknowledgement"),
    ("fold_duration_seconds", "fold_seconds",
     "Seconds a durable database's maintainer takes to fold queued batches into the views and publish"),
    ("ack_to_visible_seconds", "visible_seconds",
     "Seconds from accepting a durable batch (its acknowledgement follows once it is on disk) to the fold "
     "that makes it visible to reads; once per unit of batches accepted together"),
    ("checkpoint_duration_seconds", "checkpoint_seconds", "Seconds each checkpoint took to write"),
)

# Database-wide facts of db.status(): (name after ivm_, key, counter?, help); absent keys (in memory) are skipped.
DATABASE = (
    ("log_head_offset", "log_head", False, "Offset of the last accepted change batch"),
    ("published_offset", "published_offset", False, "Offset of the snapshot reads see"),
    ("durable_offset", "durable_offset", False, "Offset of the last change batch on disk"),
    ("stored_offset", "stored_offset", False, "Offset the last checkpoint stored"),
    ("checkpoints", "checkpoints", True, "Checkpoints written by the database (over its life)"),
    ("folds", "folds", True, "Folds of queued batches into the views since the database was opened"),
    ("log_segments", "log_segments", False, "Segment files of the change log"),
    ("log_bytes", "log_bytes", False, "Bytes of the change log's segment files"),
    ("log_syncs", "log_syncs", True, "fsyncs of the change log since the database was opened"),
    ("recovered_records", "recovered_records", False, "Change log records replayed when the database was opened"),
    ("recovery_seconds", "recovery_seconds", False, "Seconds the database took to open (restore and replay)"),
)

# Per-relation facts of db.status()["relations"]: (suffix, key, help); the label says table or view.
RELATION = (
    ("rows", "rows", "Rows in the published snapshot"),
    ("memory_bytes", "memory_bytes", "Bytes of its columns in the published snapshot (spilled runs included)"),
    ("stored_bytes", "stored_bytes", "Bytes of its stored (checkpointed) files"),
)


class StatusCollector(Collector):
    """Metric families of one database, read when scraped."""

    def __init__(self, db: ivm.Database):
        self.db = db

    def collect(self) -> Iterator[Metric]:
        facts = self.db.status()
        observed = self.db.observations()
        yield from database_metrics(facts)
        yield from relation_metrics(facts)
        yield from view_metrics(facts)
        yield from source_metrics(facts.get("sources") or [])
        yield from ingest_metrics(observed["ingested"])
        yield from histogram_metrics(observed["histograms"])
        yield GaugeMetricFamily("ivm_subscriptions_open", "Subscriptions streaming now (SUBSCRIBE over "
                                "PostgreSQL or Flight SQL, plain Flight subscription tickets)",
                                value=open_streams(self.db))


def database_metrics(facts: dict) -> Iterator[Metric]:
    for name, key, counter, help_text in DATABASE:
        value = facts.get(key)
        if value is not None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            yield kind(f"ivm_{name}", help_text, value=value)
    failing = facts.get("checkpoint_error")
    if "checkpoint_error" in facts:
        yield GaugeMetricFamily("ivm_checkpoint_failing", "1 while the last checkpoint's clean-up failed "
                                "(see SHOW STATUS checkpoint_error), else 0", value=int(failing is not None))
    yield GaugeMetricFamily("ivm_spilled_bytes", "Bytes of stored relations held in memory-mapped spill files",
                            value=facts["spill"]["bytes"])
    memory = facts["memory"]
    yield GaugeMetricFamily("ivm_relations_memory_bytes", "Bytes of every relation's columns in the published "
                            "snapshot (tables, views, view state; spilled runs included)",
                            value=memory["relation_bytes"])
    yield GaugeMetricFamily("ivm_arrow_allocated_bytes", "Bytes Arrow's allocator holds in this process",
                            value=memory["arrow_allocated_bytes"])
    steps = CounterMetricFamily("ivm_query_steps", "Query steps run by path: compiled operators, DuckDB "
                                "statements, fallbacks to DuckDB, shadow checks, mismatches", labels=["path"])
    for path, n in facts["steps"].items():
        steps.add_metric([path], n)
    yield steps


def _kind(row: dict) -> str | None:
    """"table" or "view" for the relations users made; None for view state and hidden tables."""
    if row["kind"] == "table":
        return "table"
    return "view" if row["kind"].startswith("materialized view") else None


def relation_metrics(facts: dict) -> Iterator[Metric]:
    rows = [(kind, row) for row in facts["relations"] if (kind := _kind(row)) is not None]
    for kind in ("table", "view"):
        for suffix, key, help_text in RELATION:
            family = GaugeMetricFamily(f"ivm_{kind}_{suffix}", help_text, labels=[kind])
            for _, row in (r for r in rows if r[0] == kind):
                if row[key] is not None:
                    family.add_metric([row["name"]], row[key])
            yield family
    tables = [row for kind, row in rows if kind == "table"]
    for name, key, help_text in (
            ("ivm_table_buffered_rows", "buffer_rows", "Changed rows acknowledged but not yet folded into the views"),
            ("ivm_table_unstored_changes", "lag_changes", "Accepted batches of the table the last checkpoint "
                                                          "does not hold"),
            ("ivm_table_unstored_seconds", "lag_seconds", "Age of the oldest accepted batch of the table the last "
                                                          "checkpoint does not hold")):
        family = GaugeMetricFamily(name, help_text, labels=["table"])
        for row in tables:
            family.add_metric([row["name"]], row[key])
        yield family


def view_metrics(facts: dict) -> Iterator[Metric]:
    views = [row for row in facts["relations"] if _kind(row) == "view"]
    offset = GaugeMetricFamily("ivm_view_offset", "Change log offset the view was last maintained to (the "
                               "published snapshot's: every view of a snapshot is at one offset)", labels=["view"])
    failed = GaugeMetricFamily("ivm_view_failed", "1 when the view's maintenance failed and reads of it raise "
                               "(SHOW STATUS says why), else 0", labels=["view"])
    for row in views:
        offset.add_metric([row["name"]], row["published_offset"])
        failed.add_metric([row["name"]], int(row["status"] != "ok"))
    yield offset
    yield failed
    batches = CounterMetricFamily("ivm_view_maintained_batches", "Batches maintained per view and path "
                                  "(incremental, recompute)", labels=["view", "path"])
    seconds = CounterMetricFamily("ivm_view_maintenance_seconds", "Seconds spent maintaining the view per path "
                                  "(incremental, recompute)", labels=["view", "path"])
    for view, cost in facts["maintenance"]["views"].items():
        for path, n in cost["batches"].items():
            batches.add_metric([view, path], n)
        for path, n in cost["seconds"].items():
            seconds.add_metric([view, path], n)
    yield batches
    yield seconds


def source_metrics(sources: list[dict]) -> Iterator[Metric]:
    """PostgreSQL sources (ivm/cdc/postgres.py): their progress files, as SHOW STATUS reads them."""
    families = {
        "lag_bytes": GaugeMetricFamily("ivm_source_lag_bytes", "WAL bytes between the upstream's current "
                                       "position and what the source applied", labels=["source"]),
        "lag_seconds": GaugeMetricFamily("ivm_source_lag_seconds", "Seconds the source's applied changes are "
                                         "behind the upstream", labels=["source"]),
        "rows": CounterMetricFamily("ivm_source_rows", "Rows the source applied", labels=["source"]),
        "transactions": CounterMetricFamily("ivm_source_transactions", "Upstream transactions the source "
                                            "applied", labels=["source"]),
    }
    failed = GaugeMetricFamily("ivm_source_failed", "1 when the source stopped on an error, else 0",
                               labels=["source"])
    phase = GaugeMetricFamily("ivm_source_phase", "1 for the phase the source is in (snapshot, streaming, ...)",
                              labels=["source", "phase"])
    for source in sources:
        for key, family in families.items():
            if source.get(key) is not None:
                family.add_metric([source["name"]], source[key])
        failed.add_metric([source["name"]], int(source["status"] != "ok"))
        phase.add_metric([source["name"], source["phase"]], 1)
    yield from families.values()
    yield failed
    yield phase


def ingest_metrics(ingested: dict[str, tuple[int, int]]) -> Iterator[Metric]:
    batches = CounterMetricFamily("ivm_ingested_batches", "Change batches acknowledged per table since the "
                                  "database was opened", labels=["table"])
    rows = CounterMetricFamily("ivm_ingested_rows", "Rows of the change batches acknowledged per table since "
                               "the database was opened (rate() of it: rows/s)", labels=["table"])
    for table, (n_batches, n_rows) in ingested.items():
        batches.add_metric([table], n_batches)
        rows.add_metric([table], n_rows)
    yield batches
    yield rows


def histogram_metrics(histograms: dict) -> Iterator[Metric]:
    for name, key, help_text in HISTOGRAMS:
        counts = histograms[key]
        buckets = [(_bound(b), n) for b, n in zip(counts.bounds, counts.cumulative)] + [("+Inf", counts.count)]
        yield HistogramMetricFamily(f"ivm_{name}", help_text, buckets=buckets, sum_value=counts.total)


def _bound(value: float) -> str:
    return repr(float(value))


class MetricsServer:
    """The HTTP endpoint (``/metrics``, any path) on its own threads."""

    def __init__(self, db: ivm.Database, host: str, port: int):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(db))
        ProcessCollector(registry=self.registry)
        self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = host, self._httpd.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)
