"""Sources that run inside a database: ``CREATE SOURCE`` / ``DROP SOURCE`` / ``ALTER SOURCE … REFRESH TABLE``.

CREATE SOURCE takes the snapshot on the caller's thread and returns once it
is consistent (the tables created and loaded); when anything fails it raises
and leaves nothing behind (Replicator.begin / undo). The source then streams
on a background thread of the database that made it, and again in every
later ``ivm.connect(path)`` of that directory (its state file says
``"auto": true``), until DROP SOURCE. A CREATE SOURCE cut short by a crash
during its snapshot never returned: the next open undoes it
(Replicator.abandon). Errors while streaming stop only that source; they
are kept in its state and shown by SHOW SOURCES, ``ivm status`` and SHOW
STATUS (db.status()["sources"]). A source that stays failed warns in the
log, once it has been failing for its ``wal_warning_seconds``, that its slot
holds WAL upstream, and again every WARNING_REPEAT_SECONDS. A table of a
source that failed alone is loaded again by ALTER SOURCE … REFRESH TABLE,
which the source's stream thread runs (``refresh``).
"""

from __future__ import annotations

import json
import logging
import threading

from ivm.cdc.postgres import Refresh, Replicator, SourceConfig, SourceError, source_status, sources_dir
from sql_frontend.errors import CatalogError, UnknownObjectError

log = logging.getLogger("ivm.sources")
WARNING_REPEAT_SECONDS = 600.0


class Sources:
    def __init__(self, db):
        self.db = db
        self.running: dict[str, tuple[threading.Thread, threading.Event, Replicator]] = {}
        self.lock = threading.Lock()  # one CREATE/DROP/ALTER SOURCE at a time: each checks, then writes

    def resume(self) -> None:
        """Start every CREATE SOURCE source of this directory."""
        directory = sources_dir(self.db)
        for path in sorted(directory.glob("*.json")) if directory.exists() else []:
            if path.name.endswith(".progress.json"):
                continue
            state = json.loads(path.read_text())
            if state.get("auto") and state.get("creating"):
                undone = Replicator(self.db, self._config(state), auto=True).abandon()
                log.warning("%s; undone", undone)
            elif state.get("auto"):
                self._start(Replicator(self.db, self._config(state), auto=True))

    @staticmethod
    def _config(state: dict) -> SourceConfig:
        return SourceConfig(state["name"], state["dsn"], state["publication"], state["slot"])

    def create(self, name: str, dsn: str, publication: str, slot: str | None, options: dict | None = None) -> None:
        """Take the source's snapshot, then start streaming it; on failure raise, having changed nothing."""
        with self.lock:
            directory = sources_dir(self.db)
            if (directory / f"{name}.json").exists():
                raise CatalogError(f"source {name} already exists")
            if any(o.name == name for o in self.db.objects()):
                raise CatalogError(f"{name} is already a table or view")
            config = SourceConfig(name, dsn, publication, slot or f"ivm_{name}", **(options or {}))
            replicator = Replicator(self.db, config, auto=True)
            connection = replicator.begin()
            self._start(replicator, connection)

    def _start(self, replicator: Replicator, connection=None) -> None:
        """Run the source on a thread: stream from ``connection``, or (resumed) begin first."""
        stop = threading.Event()
        name = replicator.config.name

        def run() -> None:
            try:
                replicator.follow(connection if connection is not None else replicator.begin(), stop)
            except SourceError as e:
                log.error("source %s stopped: %s", name, e)
                self._warn_while_failed(replicator, stop)

        thread = threading.Thread(target=run, name=f"ivm-source-{name}", daemon=True)
        self.running[name] = (thread, stop, replicator)
        thread.start()

    @staticmethod
    def _warn_while_failed(replicator: Replicator, stop: threading.Event) -> None:
        """Until the source is stopped (DROP SOURCE, close): warn in the log that its slot holds WAL."""
        wait = replicator.config.wal_warning_seconds
        while not stop.wait(wait) and replicator.state_file.exists():
            wait = WARNING_REPEAT_SECONDS
            status = source_status(replicator.state, replicator.progress)
            if status["warning"]:
                log.warning("%s", status["warning"])

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
            config = self._config(json.loads(path.read_text()))
            try:
                Replicator(self.db, config).drop()
            except SourceError:
                if was_running:
                    self._start(Replicator(self.db, config, auto=True))
                raise

    def refresh(self, name: str, table: str) -> None:
        """ALTER SOURCE name REFRESH TABLE table: load the table again from upstream, on the source's stream.

        Returns once the table is consistent with upstream (and no longer
        failed); raises with the table as it was when it cannot be (see
        ivm/cdc/stream.py ``Stream.refresh``). One source statement at a time,
        like CREATE and DROP SOURCE: DROP SOURCE waits for a refresh to end.
        """
        with self.lock:
            path = sources_dir(self.db) / f"{name}.json"
            if not path.exists():
                raise UnknownObjectError(f"source {name} does not exist")
            tables = sorted(t["table"] for t in json.loads(path.read_text()).get("tables", {}).values())
            if table not in tables:
                raise UnknownObjectError(f"source {name} has no table {table} (its tables: {', '.join(tables)})")
            thread, _, replicator = self.running.get(name, (None, None, None))
            why = self._not_streaming(thread, replicator)
            if why:
                raise SourceError(f"cannot refresh table {table}: source {name} {why}; REFRESH TABLE runs on the "
                                  "source's own stream, in the process that runs it")
            request = Refresh(table)
            replicator.requests.put(request)
            while not request.done.wait(0.2):
                if not thread.is_alive() or replicator.state.get("error"):
                    # (the stream fails every request it leaves; this one may have come after it stopped)
                    raise SourceError(f"cannot refresh table {table}: source {name} stopped during it: "
                                      f"{replicator.state.get('error') or 'it was stopped'}")
            if request.error is not None:
                raise request.error

    @staticmethod
    def _not_streaming(thread: threading.Thread | None, replicator: Replicator | None) -> str | None:
        """Why a source cannot serve a request, or None: it must run in this process, and not have failed."""
        if thread is None:
            return "is not running in this process (it runs where the database is open with it: ivm serve, " \
                   "ivm.connect; or it is run by ivm replicate)"
        if replicator.state.get("error"):
            return f"has failed ({replicator.state['error']}) and is not running"
        if not thread.is_alive():
            return "is not running in this process"
        return None  # (one still starting serves the request once it streams)

    def _stop(self, name: str) -> bool:
        """Stop the source's thread; whether the source was still running (not failed)."""
        thread, stop, replicator = self.running.pop(name, (None, None, None))
        if thread is None:
            return False
        following = thread.is_alive() and not replicator.state.get("error")
        stop.set()
        thread.join(60)
        return following

    def close(self) -> None:
        for name in list(self.running):
            self._stop(name)
