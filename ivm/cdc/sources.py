"""Sources that run inside a database: ``CREATE SOURCE`` / ``DROP SOURCE``.

A source made by CREATE SOURCE runs on a background thread of the database
that made it, and again in every later ``ivm.connect(path)`` of that
directory (its state file says ``"auto": true``), until DROP SOURCE. Its
errors stop only that source; they are kept in its state and shown by
``ivm status`` / ``SHOW STATUS`` (db.status()["sources"]).
"""

from __future__ import annotations

import json
import logging
import threading

from ivm.cdc.postgres import Replicator, SourceConfig, SourceError, sources_dir
from sql_frontend.errors import CatalogError, UnknownObjectError

log = logging.getLogger("ivm.sources")


class Sources:
    def __init__(self, db):
        self.db = db
        self.running: dict[str, tuple[threading.Thread, threading.Event, Replicator]] = {}
        self.lock = threading.Lock()  # one CREATE/DROP SOURCE at a time: each checks, then writes

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
        """Check everything that can fail (Replicator.check), then write the state file and start.

        A CREATE SOURCE that fails writes no file, makes no slot and changes no table.
        """
        with self.lock:
            directory = sources_dir(self.db)
            if (directory / f"{name}.json").exists():
                raise CatalogError(f"source {name} already exists")
            if any(o.name == name for o in self.db.objects()):
                raise CatalogError(f"{name} is already a table or view")
            config = SourceConfig(name, dsn, publication, slot or f"ivm_{name}")
            replicator = Replicator(self.db, config, auto=True)
            replicator.check()
            replicator.register()
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
        """Stop the source, drop its slot upstream and forget it; its tables keep their rows.

        When the slot cannot be dropped (PostgreSQL unreachable) the source is
        kept, and runs again if it was running.
        """
        with self.lock:
            path = sources_dir(self.db) / f"{name}.json"
            if not path.exists():
                raise UnknownObjectError(f"source {name} does not exist")
            was_running = self._stop(name)
            state = json.loads(path.read_text())
            config = SourceConfig(name, state["dsn"], state["publication"], state["slot"])
            try:
                Replicator(self.db, config).drop()
            except SourceError:
                if was_running:
                    self._start(config)
                raise

    def _stop(self, name: str) -> bool:
        """Stop the source's thread; whether it was still running."""
        thread, stop, _ = self.running.pop(name, (None, None, None))
        if thread is None:
            return False
        alive = thread.is_alive()
        stop.set()
        thread.join(60)
        return alive

    def close(self) -> None:
        for name in list(self.running):
            self._stop(name)
