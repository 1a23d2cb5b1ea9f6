"""Observations: latencies and counts the engine records where they happen.

``db.status()`` reads the engine's state as it is now (offsets, lags,
sizes). What state cannot tell afterwards - how long each batch took to be
acknowledged, each fold to run, each change to become visible, each
checkpoint to be written, how many rows came in - is recorded at the one
place it happens, into the ``Observations`` the engine owns:

* ``batch_seconds``: a producer's batch, from handing it in to its
  acknowledgement (``Engine.ingest``, ``DurableEngine.ingest``, in memory
  ``Engine.ingest_batch``); ``ingested_rows``/``ingested_batches`` per table
  count the batches acknowledged (re-deliveries of an idempotent producer
  count as batches of 0 rows);
* ``fold_seconds``: a durable database's maintainer fold, from taking the
  queued batches to publishing the snapshot (ivm/durable/maintainer.py; in memory a
  batch is maintained before its acknowledgement, inside ``batch_seconds``);
* ``visible_seconds``: from accepting a durable batch (just before its
  acknowledgement, which waits for the disk) to publishing the fold that
  shows it to reads, once per queued unit of batches (in memory: none, a
  batch is visible when it is acknowledged);
* ``checkpoint_seconds``: each checkpoint written (ivm/durable/checkpoints.py).

The numbers are plain (bucket counts, sums): exporting them (e.g. to
Prometheus, flight_server/metrics.py) is the reader's business. Each
database has its own; nothing here is shared between databases.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

# Upper bounds (seconds) of the latency buckets: a 1 ms fold to a minute-long bulk load.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Checkpoints write Delta tables: tens of milliseconds to minutes.
CHECKPOINT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class HistogramCounts:
    """A histogram at one moment: ``cumulative[i]`` observations were <= ``bounds[i]``."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int  # every observation (the +Inf bucket)
    total: float  # their sum


class Histogram:
    """Observations counted into fixed buckets; thread-safe.

    >>> latency = Histogram((0.1, 1.0))
    >>> for seconds in (0.5, 0.1, 2.0):
    ...     latency.observe(seconds)
    >>> latency.counts()
    HistogramCounts(bounds=(0.1, 1.0), cumulative=(1, 2), count=3, total=2.6)
    """

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS):
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        slot = bisect.bisect_left(self.bounds, value)  # a value equal to a bound belongs to it (le)
        with self._lock:
            self._counts[slot] += 1
            self._total += value

    def counts(self) -> HistogramCounts:
        with self._lock:
            counts, total = list(self._counts), self._total
        cumulative, running = [], 0
        for n in counts[:-1]:
            running += n
            cumulative.append(running)
        return HistogramCounts(self.bounds, tuple(cumulative), running + counts[-1], total)


class Observations:
    """What one database's engine recorded since it was opened (see the module docstring)."""

    def __init__(self) -> None:
        self.batch_seconds = Histogram()
        self.fold_seconds = Histogram()
        self.visible_seconds = Histogram()
        self.checkpoint_seconds = Histogram(CHECKPOINT_BUCKETS)
        self._ingested_rows: dict[str, int] = {}
        self._ingested_batches: dict[str, int] = {}
        self._lock = threading.Lock()

    def acknowledged(self, table: str, rows: int) -> None:
        """A batch of ``rows`` rows of ``table`` was acknowledged."""
        with self._lock:
            self._ingested_rows[table] = self._ingested_rows.get(table, 0) + rows
            self._ingested_batches[table] = self._ingested_batches.get(table, 0) + 1

    def ingested(self) -> dict[str, tuple[int, int]]:
        """Per table: (batches, rows) acknowledged."""
        with self._lock:
            return {t: (self._ingested_batches[t], self._ingested_rows[t]) for t in self._ingested_rows}

    def histograms(self) -> dict[str, HistogramCounts]:
        return {name: getattr(self, name).counts()
                for name in ("batch_seconds", "fold_seconds", "visible_seconds", "checkpoint_seconds")}
