"""A database's settings (``ivm.connect(**options)``) and where large runs spill."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ivm.maintain.engine_choice import SPARK_ROWS
from storage.spill import Spill
from storage.view_history import DEFAULT_RETAIN_ROWS


@dataclass
class Settings:
    threads: int | None = None
    # How views are maintained per batch: "auto" (cost-based choice between
    # incremental and recompute, see ivm/maintain/maintenance.py), "incremental", "recompute".
    maintenance: str = "auto"
    # Rows of view and table changes kept for subscribers (storage/view_history.py).
    retain_rows: int = DEFAULT_RETAIN_ROWS
    # Durable databases only (see ivm/durable/durable.py):
    fold_rows: int = 1_000_000  # most changed rows the maintainer folds into views at once
    # seconds the maintainer waits for more changes before folding (a waiting read ends the
    # wait at once): a fold's fixed cost (~20 ms CPU for bench/ingest.py's 3 views) is then
    # shared by more batches; only subscribers see changes up to this much later. 0.1 s:
    # sustained 1,000-row upserts at 0.05 s made ~55 folds per 2,000 batches and 0.1 s ~35,
    # ~10% less process CPU per batch (bench/ingest.py, session 7)
    fold_delay: float = 0.1
    # queued upsert rows from which a second maintainer thread converts them while the
    # fold runs the views (ivm/durable/ahead.py); fewer: the fold converts them itself
    convert_ahead_rows: int = 20_000
    checkpoint_rows: int = 1_000_000  # changed rows that trigger a checkpoint ...
    checkpoint_seconds: float = 60.0  # ... or the age of the oldest change not stored
    log_retention_seconds: float | None = 0.0  # keep checkpointed log segments this long (None: forever)
    segment_bytes: int = 64 << 20  # change-log segment size
    # Compute engine for maintenance (ivm/maintain/engine_choice.py): "duckdb", "spark" or "auto".
    engine: str = "duckdb"
    # Spark settings passed through (spark.master, spark.driver.memory, ...; ivm/execute/spark/session.py).
    spark_conf: dict | None = None
    spark_rows: int = SPARK_ROWS  # "auto" runs a step on Spark from this many rows of input
    # In memory, > 0: batches are applied by a thread of their own at this OS niceness (Linux),
    # so reads in the same process get a core first (ivm/ingest/group_commit.py). Not for durable
    # databases: there reads wait for the maintainer's folds, which must not be slowed.
    ingest_nice: int = 0
    # DuckDB's memory_limit (e.g. "6GB") of the instances that run reads, large batches and
    # mirrors; past it they spill to the engine's scratch directory. None: DuckDB's default.
    memory_limit: str | None = None
    # Runs of stored relations with at least spill_rows rows are written to this directory and
    # memory-mapped (storage/spill.py), so the kernel can evict them instead of running out of
    # memory. None: <dir>/spill for durable databases, off in memory; False: off.
    spill_dir: Any = None
    spill_rows: int = 1_000_000
    # Longest statement text accepted, in UTF-8 bytes (sql_frontend/limits.py); None or 0: no limit.
    max_statement_bytes: int | None = 1 << 20
    # Seconds a client's statement may run in DuckDB before it is cancelled (its query, or the SELECT
    # that computes an INSERT/UPDATE/DELETE/CREATE TABLE AS before anything changes); None: no limit.
    statement_timeout: float | None = None


def spill_of(settings: Settings, default_dir) -> Spill | None:
    """Where large runs spill (see Settings.spill_dir); a clear error for a bad setting."""
    rows, where = settings.spill_rows, settings.spill_dir
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"spill_rows must be a positive integer, not {rows!r}")
    if where is None:
        where = default_dir
    if where is None or where is False:
        return None
    if not isinstance(where, (str, os.PathLike)):
        raise ValueError(f"spill_dir must be a directory path, None or False, not {where!r}")
    try:
        return Spill(Path(where), rows)
    except OSError as e:
        raise ValueError(f"cannot spill to {where}: {e.strerror or e}") from e
