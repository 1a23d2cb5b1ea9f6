"""Sources that run inside a database: ``CREATE SOURCE`` / ``DROP SOURCE``.

A source made by CREATE SOURCE runs on a background thread of the database
that made it, and again in every later ``ivm.connect(path)`` of that
directory (its state file says ``"auto": true``), until DROP SOURCE. Its
errors stop only that source; they are kept in its state and shown by
``ivm status`` / ``SHOW STATUS`` (db.status()["sources"]).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading

from ivm.cdc.postgres import Replicator, SourceConfig, SourceError, describe, sources_dir
from sql_frontend.errors import CatalogError, UnknownObjectError

log = logging.getLogger("ivm.sources")


class Sources:
    def __init__(self, db):
        self.db = db
        self.running: dict[str, tuple[threading.Thread, threading.Event, Replicator]] = {}

    def resume(self) -> None:
        """Start every CREATE SOURCE source of this directory."""
        directory = sources_dir(self.db)
        for path in sorted(directory.glob("*.json")) if directory.exists() else []:
            if path.name.endswith(".progress.json"):
                continue
            state = json.loads(path.read_text())
            if state.get("auto"):
                self._start(SourceConfig(state["name"], state["dsn"], state["publication"], state["slot"]))

    def create(self, name: str, dsn: str, publication: str, slot: str | None) -> None:
        import psycopg2

        directory = sources_dir(self.db)
        if (directory / f"{name}.json").exists():
            raise CatalogError(f"source {name} already exists")
        if self.db._engine.catalog.exists(name):
            raise CatalogError(f"{name} is already a table or view")
        try:  # check now, so that the statement reports what is wrong
            with contextlib.closing(psycopg2.connect(dsn)) as conn:
                describe(conn, publication)
        except psycopg2.Error as e:
            raise SourceError(f"cannot reach PostgreSQL for source {name}: {str(e).strip()}") from None
        config = SourceConfig(name, dsn, publication, slot or f"ivm_{name}")
        replicator = Replicator(self.db, config, auto=True)
        replicator._load()
        replicator._save()
        self._start(config)

    def _start(self, config: SourceConfig) -> None:
        stop = threading.Event()
        replicator = Replicator(self.db, config, auto=True)

        def run() -> None:
            try:
                replicator.run(stop=stop)
            except SourceError as e:
                log.error("source %s stopped: %s", config.name, e)

        thread = threading.Thread(target=run, name=f"ivm-source-{config.name}", daemon=True)
        self.running[config.name] = (thread, stop, replicator)
        thread.start()

    def drop(self, name: str) -> None:
        directory = sources_dir(self.db)
        path = directory / f"{name}.json"
        if not path.exists():
            raise UnknownObjectError(f"source {name} does not exist")
        self._stop(name)
        state = json.loads(path.read_text())
        Replicator(self.db, SourceConfig(name, state["dsn"], state["publication"], state["slot"])).drop()

    def _stop(self, name: str) -> None:
        thread, stop, _ = self.running.pop(name, (None, None, None))
        if thread is not None:
            stop.set()
            thread.join(60)

    def close(self) -> None:
        for name in list(self.running):
            self._stop(name)
