"""The process's SparkSession: created on first use, configured from settings.

One session per process (Spark allows one SparkContext per JVM); every
database of the process shares it. Each executor works in its own
``newSession()`` so temporary views of concurrent programs never collide.
Configuration passes through: ``spark.master`` (default ``local[*]``),
``spark.driver.memory`` and any other ``spark.*`` key given in
``ivm.connect(spark_conf={...})`` or ``ivm serve --spark-conf k=v``. Nothing is
downloaded: ``spark.jars.packages`` is refused.
"""

from __future__ import annotations

import logging
import threading
from typing import Mapping

from sql_frontend.errors import UnsupportedError

# Defaults chosen for ivm's use (settings override every one of them):
DEFAULTS = {
    "spark.master": "local[*]",
    "spark.app.name": "ivm",
    # Delta programs compare NULLs and divide like DuckDB only with ANSI
    # semantics (errors on overflow and division by zero, as DuckDB raises).
    "spark.sql.ansi.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Never fall back to row-by-row conversion silently.
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    # Deltas are small; 200 shuffle partitions would dominate every job.
    "spark.sql.shuffle.partitions": "8",
    # Change batches and operator state are small: broadcast them into joins
    # with stored relations instead of shuffling the relations (default 10 MB).
    "spark.sql.autoBroadcastJoinThreshold": "64m",
    # Parquet files Spark writes (shared state) are read by deltalake and DuckDB
    # too: standard microsecond timestamps, not Spark's legacy INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Servers bind 127.0.0.1 only; no web UI on a public port.
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

FORBIDDEN = ("spark.jars.packages", "spark.jars.repositories", "spark.jars.ivySettings")

_lock = threading.Lock()
_session = None
_conf: dict[str, str] = {}


def check_conf(conf: Mapping[str, object] | None) -> dict[str, str]:
    """Validated ``spark.*`` settings as strings; a clear error for anything else."""
    result = {}
    for key, value in (conf or {}).items():
        if not isinstance(key, str) or not key.startswith("spark."):
            raise UnsupportedError(f"spark_conf keys are Spark settings starting with 'spark.', got {key!r}")
        if key in FORBIDDEN:
            raise UnsupportedError(f"{key} is not allowed: ivm never downloads packages at run time")
        result[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return result


def session(conf: Mapping[str, str] | None = None):
    """The process's SparkSession, started with ``conf`` over DEFAULTS on first use.

    A later call with a different ``spark.master`` is an error (the JVM holds
    one SparkContext); other differing settings apply only to SQL confs.
    """
    global _session, _conf
    wanted = {**DEFAULTS, **check_conf(conf)}
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            if wanted["spark.master"] != _conf["spark.master"]:
                raise UnsupportedError(
                    f"Spark already runs with spark.master={_conf['spark.master']} in this process; "
                    f"cannot switch to {wanted['spark.master']}"
                )
            return _session
        from pyspark.sql import SparkSession

        builder = SparkSession.builder
        for key, value in wanted.items():
            builder = builder.config(key, value)
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel("ERROR")
        # pyspark logs every failed query (with its JVM stack) before raising it;
        # the executor raises a clear ivm error for it instead.
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
        _conf = wanted
        return _session


def stop() -> None:
    """Stop the process's session (tests that switch masters; nothing else needs it)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
