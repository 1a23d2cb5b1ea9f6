"""One DuckDB cursor and everything that runs on it, for one thread at a time."""

from __future__ import annotations

import duckdb

from ivm.execute import duck
from ivm.execute.executor import Executor, StepRunner
from ivm.ingest.changes import ChangeApplier, ChangeNormalizer
from storage.keys import KeyCoder

# Batches above this many rows are processed by the parallel DuckDB instance.
LARGE_BATCH = 50_000


class Worker:
    """Everything that runs statements on one DuckDB cursor, for one thread at a time."""

    def __init__(self, connection: duckdb.DuckDBPyConnection):
        self.connection = connection
        self.runner = duck.Runner(connection)
        self.coder = KeyCoder(self.runner.run)
        self.executor = Executor(connection, self.coder)
        self.normalizer = ChangeNormalizer(self.runner)
        self.applier = ChangeApplier(self.runner, self.coder)
        self._spark = None  # a SparkExecutor, created on first use

    def spark(self, conf: dict | None) -> StepRunner:
        if self._spark is None:
            from ivm.execute.spark.executor import SparkExecutor
            from ivm.execute.spark.session import session

            self._spark = SparkExecutor(session(conf), self.coder, driver=self.executor)
        return self._spark

    def close(self) -> None:
        if self._spark is not None:
            self._spark.frames.clear()
