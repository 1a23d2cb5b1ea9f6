"""A durable database: ``ivm.connect("dir")``.

    DIR/LOCK              one process at a time (flock)
    DIR/server.json       where ivm serve listens, while it holds the lock (ivm/cli/serving.py)
    DIR/log/*.log         the change log (storage/log.py)
    DIR/relations/r<N>/   one Delta table per stored relation, named by an id
                          (storage/checkpoint.py); the manifest maps names to ids
    DIR/checkpoint.json   the manifest of the last checkpoint (ivm/durable/checkpoints.py);
                          written empty when the database is created, so a
                          directory with data but no manifest is refused as damaged

Ingest (under the write lock): normalize the batch, convert it to a Z-set
delta against the table including every earlier accepted batch (so
validation - schema, duplicate keys, missing deletes - happens before the
acknowledgement, and an acknowledged batch can never fail later), append the
normalized batch to the log, queue the delta for the maintainer. Then,
outside the lock, wait until the record is on disk (group commit) and return
its offset. Upsert-only batches skip the conversion here: they cannot fail,
so the fold converts them, many at once (ivm/durable/deferred.py; ``convert_lock``
guards the tables' heads). The maintainer (ivm/durable/maintainer.py) folds queued deltas into the
views in micro-batches; reads wait for it to reach every acknowledged
offset; checkpoints store published snapshots.

DDL drains the maintainer, stores what it folded, changes the catalog and
writes a checkpoint before it returns, so the log only ever holds change
batches against the catalog of the last checkpoint. A DDL is all or nothing:
when its checkpoint fails (disk full, a Delta error) the catalog, the
relations in memory and the files go back to what they were, and it raises
``StorageError``; the database goes on and reopens as before the statement.

Recovery on open: load the manifest's catalog and relations (Delta time
travel to the versions it names), replay the log records above its offset
(the normalized batches, converted again exactly as the first time), and
fold them: the database is exactly as it was after its last durable batch.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from ivm.execute import duck
from ivm.ingest.changes import OP, SEQ, q
from ivm.durable.checkpoints import Checkpointer
from ivm.ddl_undo import CatalogState
from ivm.engine import Engine
from ivm.execute.worker import Worker
from ivm.settings import Settings, spill_of
from ivm.ingest.ingest_group import Pending, Ticket, convert_unit, undo
from ivm.durable.entry import Entry
from ivm.durable.maintainer import Maintainer
from ivm.ingest.producers import check_producer
from sql_frontend.errors import ChangeError, IvmError, UnsupportedError
from sql_frontend.statements import AlterTable, AlterView, CreateTable, CreateView, Drop
from storage.checkpoint import StorageError, failure_text, unstorable
from storage.hooks import hook
from storage.log import ChangeLog, Record
from storage.relation import Relation


class DurableEngine(Engine):
    def __init__(self, path: str | os.PathLike, settings: Settings | None = None):
        super().__init__(settings)
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._lock_directory()
            if self.spill is None:
                self.spill = spill_of(self.settings, self.path / "spill")
        except OSError as e:
            raise IvmError(f"cannot use {self.path} as a database directory: {e.strerror or e}") from e
        self.heads: dict[str, Relation] = {}  # tables including batches not folded yet
        self.pending_indexes: dict[str, tuple] = {}
        # Guards the heads and the queued batches not converted yet (ivm/durable/deferred.py):
        # producers converting a batch now hold it, and so do the maintainer's threads
        # (ivm/durable/ahead.py; they never wait under it).
        self.convert_lock = threading.RLock()
        # (offset, time, rows, table) of accepted batches past the checkpoint; the
        # lock makes iteration safe against appends from producers.
        self._unstored: deque[tuple[int, float, int, str]] = deque()
        self._unstored_lock = threading.Lock()
        self.generation = uuid.uuid4().hex  # changes with every DDL
        self.log = ChangeLog(self.path / "log", self.settings.segment_bytes)
        # The maintainer gets its own single-threaded DuckDB instance: sharing the
        # ingest's would make the two threads contend inside DuckDB.
        self._fold_db = duck.connect(1, self.scratch.directory("fold"))
        self.maintainer = Maintainer(self, Worker(self._fold_db.cursor()), Worker(self.duck.cursor()),
                                     ahead=(Worker(self._fold_db.cursor()), Worker(self.duck.cursor())))
        self.checkpointer = Checkpointer(self, self.path)
        self.pending = Pending()
        self.replayed = 0
        try:
            self._recover()
        except BaseException:
            self._release()
            raise
        self.checkpointer.start()

    # --- opening and closing -------------------------------------------------------------
    def _lock_directory(self) -> int:
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IvmError(f"database {self.path} is open in another process") from None
        return fd

    def _recover(self) -> None:
        start = time.perf_counter()
        self.offset = self.checkpointer.restore()
        for table in self.catalog.tables.values():  # the largest event time is the stored table's
            if table.event_time is not None:
                self.watermarks.restore(table, self.store.snapshot)
        for name in self.catalog.views:  # subscribers resume from the restored offset on
            self.history.start(name, self.offset, complete=False)
        for table in self.catalog.visible_tables():
            self.history.start(table.name, self.offset, complete=False, kind="table")
        records = self.log.open(after=self.offset)
        self.maintainer.start()
        with self.write_lock:
            for record in records:
                self._replay(record)
        self.maintainer.wait_published(self.offset)
        self.replayed = len(records)
        self.recovery_seconds = time.perf_counter() - start

    def close(self) -> None:
        """Checkpoint and close. A final checkpoint that fails (e.g. the disk is full) is
        reported once everything is closed: every acknowledged change is in the log."""
        if self.closed:
            return
        failed: Exception | None = None
        try:
            with self.write_lock:
                if self.log.written == self.log.durable and self.maintainer.error is None:
                    self.maintainer.wait_published(self.offset)
                    try:
                        self.checkpointer.checkpoint()
                    except Exception as e:  # noqa: BLE001 (reported below, after closing)
                        failed = e
        finally:
            self.checkpointer.stop()
            self.maintainer.stop()
            self.log.close()
            self._release()
            self._fold_db.close()
            super().close()  # last: it removes the DuckDB temp directories, the fold instance's too
        if failed is not None:
            raise IvmError(f"the database closed without its final checkpoint ({type(failed).__name__}: {failed}); "
                           "every acknowledged change is in the change log and is replayed when it is opened "
                           "again") from failed

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- ingest --------------------------------------------------------------------------
    def ingest(self, table: str, data: Any, on_missing_delete: str | None = None,
               source: str | None = None, seq: int | None = None) -> int:
        check_producer(source, seq)
        started = time.perf_counter()
        ticket = Ticket(table, data, on_missing_delete, source, seq)
        self.pending.add(ticket)
        with self.write_lock:
            while not ticket.done:  # convert every waiting batch, ours among them (ivm/ingest/ingest_group.py)
                tickets = self.pending.take_unit()
                try:
                    self._accept_unit(tickets)
                except BaseException as e:
                    for other in tickets:
                        if not other.done:
                            other.error, other.done = e, True
        if ticket.error is not None:
            raise ticket.error
        self.log.wait_durable(ticket.offset)
        self.maintainer.wake()
        self.acknowledged(ticket, started)
        return ticket.offset

    def ingest_batch(self, batches: list[tuple[str, Any]], on_missing_delete: str | None = None) -> int:
        # A durable multi-table batch needs one log record for all its tables (so a crash keeps all or
        # none) and all-or-nothing conversion, where group ingest converts each batch on its own.
        raise UnsupportedError("apply_batch on a durable database is not supported yet: "
                               "use apply_changes per table (a fold still maintains them together)")

    def _accept_unit(self, tickets: list[Ticket]) -> None:
        """Convert, log and queue a unit of batches; each gets its offset (not yet durable).

        Only a batch converted now takes ``convert_lock`` (ivm/ingest/ingest_group.py): a unit of
        upserts only never waits for a conversion running ahead of the fold (ivm/durable/ahead.py).
        The write lock keeps units in offset order in the log and in the queue.

        The unit is logged whole or not at all (one write; its batches may share one
        conversion): when the write fails (e.g. the disk is full) every batch of the unit
        fails with the error, its conversion is undone and its offsets go to the next unit."""
        self.log.check()
        watermarks = self.watermarks.copy()
        unit = convert_unit(self, tickets)
        if not unit.tickets:
            return
        now = time.time()
        records = [Record(self.offset + i, t.table, t.batch, t.policy, t.source, t.seq, now)
                   for i, t in enumerate(unit.tickets, 1)]
        try:
            self.log.append(records)
        except BaseException:
            with self.convert_lock:
                undo(self, unit)
                self.watermarks = watermarks
            raise
        for ticket, record in zip(unit.tickets, records):
            self.offset = ticket.offset = record.offset
            self.producers.record(ticket.source, ticket.seq, record.offset)
            rows = ticket.delta.num_rows if ticket.delta is not None else 0
            if ticket.table in unit.batches:  # deferred: its delta is not known yet (about the batch's rows)
                rows = ticket.batch.num_rows
            self._note_unstored(record.offset, now, rows, ticket.table)
            ticket.done = True
        self.maintainer.enqueue(Entry(self.offset, unit.deltas, unit.versions, now, unit.counts, unit.batches))

    def _replay(self, record: Record) -> None:
        with self.convert_lock:
            self._replay_locked(record)

    def _replay_locked(self, record: Record) -> None:
        definition = self.catalog.table(record.table)
        try:
            prepared = self.convert(definition, record.batch, record.policy, self.head(record.table),
                                    self.worker(record.batch.num_rows))
        except ChangeError as e:
            raise IvmError(f"replaying change log offset {record.offset} failed (the log does not match the "
                           f"checkpoint): {e}") from e
        self.offset = record.offset
        versions = prepared.versions()  # the table (and its on-time rows)
        self.heads.update(versions)
        self.accept_events(record.table, prepared)
        self.producers.record(record.source, record.seq, record.offset)
        self._note_unstored(record.offset, record.timestamp, prepared.change.delta.num_rows, record.table)
        deltas = {part.change_table: [part.change.delta] for part in [prepared, *prepared.hidden]}
        self.maintainer.enqueue(Entry(record.offset, deltas, versions, record.timestamp, prepared.counts(),
                                      replayed=True))

    def _note_unstored(self, offset: int, now: float, rows: int, table: str) -> None:
        with self._unstored_lock:
            self._unstored.append((offset, now, rows, table))

    def head(self, table: str) -> Relation:
        relation = self.heads.get(table) or self.store.snapshot[table]
        keys = self.pending_indexes.pop(table, None)
        if keys:
            for key in keys:
                relation = relation.with_index(key, self.small.coder)
            self.heads[table] = relation
        return relation

    def want_indexes(self, table: str, keys: tuple) -> None:
        """Called by the maintainer: give the table's next versions these indexes."""
        self.pending_indexes[table] = keys

    def wait_visible(self) -> None:
        self.maintainer.wait_published(min(self.log.durable, self.offset))

    # --- DDL -----------------------------------------------------------------------------
    def _ddl(self, what: str, change: Callable[[], bool]) -> bool:
        """Run a catalog change (``what``: the statement, for errors) with every accepted batch
        folded and stored, then checkpoint it; all or nothing.

        The changes before it are checkpointed first, so the DDL's own checkpoint writes only
        what the statement made. If that checkpoint fails before its manifest is renamed, or
        the change itself raises, the engine goes back to the state before the statement
        (ivm/ddl_undo.py) and the files to what the manifest in force names."""
        with self.write_lock:
            self.log.check()
            self.log.wait_durable(self.offset)
            self.maintainer.wait_published(self.offset)
            with self.checkpointer.lock, self.maintainer.fold_lock:
                try:
                    self.checkpointer.checkpoint()
                except Exception as e:
                    raise StorageError(f"{what} was not run: storing the changes before it failed "
                                       f"({failure_text(e)}); nothing changed") from e
                before = CatalogState.capture(self)
                try:
                    if not change():
                        return False
                    self.heads.clear()
                    self.failed = {n: e for n, e in self.failed.items() if self.catalog.exists(n)}
                    self.generation = uuid.uuid4().hex
                    hook("ddl.before_checkpoint")
                except BaseException:
                    before.restore(self)
                    raise
                try:
                    self.checkpointer.checkpoint(force=True, ddl=True)
                except BaseException as e:
                    if self.checkpointer.generation == self.generation:
                        raise  # the manifest holds the change: it happened (checkpoint raises before that)
                    before.restore(self)
                    if not isinstance(e, Exception):
                        raise
                    raise StorageError(f"{what} was undone: storing it failed ({failure_text(e)}); "
                                       "the catalog and the stored files are as before the statement") from e
                return True

    def create_table(self, stmt: CreateTable, columns=None) -> bool:
        return self._ddl(f"CREATE TABLE {stmt.name}",
                         lambda: self._storable(Engine.create_table(self, stmt, columns), stmt.name, "table"))

    def create_view(self, stmt: CreateView) -> bool:
        return self._ddl(f"CREATE MATERIALIZED VIEW {stmt.name}",
                         lambda: self._storable(Engine.create_view(self, stmt), stmt.name, "view"))

    def _storable(self, created: bool, name: str, kind: str) -> bool:
        """Refuse a CREATE whose relations durable storage cannot hold, with a clear error
        (``_ddl`` undoes it)."""
        if not created:
            return False
        view = self.catalog.views.get(name)
        schemas = [self.store.snapshot[name].schema] if view is None else (
            [self.store.snapshot[s.name].schema for s in view.states]
            + ([] if view.stored_output else [self.arrow_schema(view.columns)]))
        for schema in schemas:
            problem = unstorable(schema)
            if problem is not None:
                what = "table" if kind == "table" else "materialized view"
                raise UnsupportedError(f"{what} {name} cannot be stored durably: {problem} "
                                       "(cast it to a storable type, e.g. VARCHAR)")
        return True

    def drop(self, stmt: Drop) -> bool:
        what = "DROP TABLE" if stmt.kind == "table" else "DROP MATERIALIZED VIEW"
        return self._ddl(f"{what} {stmt.name}", lambda: Engine.drop(self, stmt))

    def alter_table(self, stmt: AlterTable) -> bool:
        # The DDL checkpoint stores the new catalog with the table's rows in their new shape
        # (written whole: its Delta schema changed), so the log after it holds only batches of
        # the new shape, as after any DDL.
        return self._ddl(f"ALTER TABLE {stmt.table}",
                         lambda: self._storable(Engine.alter_table(self, stmt), stmt.table, "table"))

    def fail_table(self, name: str, reason: str) -> None:
        # In the manifest at once, like a DDL: a reopen must not read a table that stopped following upstream.
        self._ddl(f"marking table {name} failed", lambda: Engine.fail_table(self, name, reason) or True)

    def recover_table(self, name: str) -> None:
        self._ddl(f"marking table {name} readable", lambda: Engine.recover_table(self, name) or True)

    def alter_view(self, stmt: AlterView) -> bool:
        # the setting is in the checkpoint
        return self._ddl(f"ALTER MATERIALIZED VIEW {stmt.name}", lambda: Engine.alter_view(self, stmt))

    # --- checkpoints and maintenance ---------------------------------------------------------
    def checkpoint_due(self) -> bool:
        published = self.store.snapshot.offset
        if published <= self.checkpointer.offset:
            return False
        unstored = self.unstored()
        rows = sum(e[2] for e in unstored if e[0] <= published)
        return bool(unstored) and (rows >= self.settings.checkpoint_rows
                                   or time.time() - unstored[0][1] >= self.settings.checkpoint_seconds)

    def unstored(self) -> list[tuple[int, float, int, str]]:
        """(offset, time, rows, table) of each accepted batch the last checkpoint does not hold."""
        with self._unstored_lock:
            return list(self._unstored)

    def after_checkpoint(self, offset: int) -> None:
        with self._unstored_lock:
            while self._unstored and self._unstored[0][0] <= offset:
                self._unstored.popleft()
        self.log.roll()
        self.log.delete_covered(offset, self.settings.log_retention_seconds)

    def checkpoint(self, consolidate: bool = False) -> int:
        """Fold and store everything acknowledged now; return the stored offset (``consolidate``:
        relations stored with appended differences are rewritten whole, see Checkpointer)."""
        with self.write_lock:
            self.log.wait_durable(self.offset)
            self.maintainer.wait_published(self.offset)
            self.checkpointer.checkpoint(consolidate=consolidate)
            return self.checkpointer.offset

    def compact(self) -> dict:
        """COMPACT: checkpoint (every relation as plain files again), keep the latest change per key
        in the retained log, vacuum Delta files."""
        with self.write_lock, self.checkpointer.lock:
            offset = self.checkpoint(consolidate=True)
            before, after = self.log.rewrite_covered(offset, self._compact_records)
            relations = self.checkpointer.compact_files()
            return {"offset": offset, "log_records_before": before, "log_records_after": after,
                    "relations_vacuumed": relations}

    def _compact_records(self, records: list[Record]) -> list[Record]:
        """The latest change per key of each keyed table (as upserts/deletes); others as they were."""
        groups: dict[tuple[str, pa.Schema], list[Record]] = {}
        for record in records:
            groups.setdefault((record.table, record.batch.schema), []).append(record)
        out: list[Record] = []
        for (table, schema), group in groups.items():
            definition = self.catalog.tables.get(table)
            current = self.store.snapshot[table].schema if definition is not None else None
            if (definition is None or not definition.primary_key or len(group) < 2
                    or [f for f in schema if f.name not in (OP, SEQ)] != [f for f in current][:-1]):
                out.extend(group)
                continue
            out.append(self._latest_per_key(definition.primary_key, group))
        return sorted(out, key=lambda r: r.offset)

    def _latest_per_key(self, key: tuple[str, ...], group: list[Record]) -> Record:
        parts = [r.batch.append_column("__offset", pa.array([r.offset] * r.batch.num_rows, pa.int64()))
                 for r in group]
        keys = ", ".join(q(k) for k in key)
        latest = self.small.runner.run(
            f"SELECT * EXCLUDE (__offset) REPLACE (CASE WHEN {OP} = 'd' THEN 'd' ELSE 'r' END AS {OP}) "
            f"FROM {{b}} QUALIFY ROW_NUMBER() OVER (PARTITION BY {keys} ORDER BY __offset DESC, {SEQ} DESC) = 1",
            b=pa.concat_tables(parts),
        )
        latest = latest.set_column(latest.schema.get_field_index(SEQ), SEQ,
                                   pa.array(range(latest.num_rows), pa.int64()))
        last = group[-1]
        return Record(last.offset, last.table, latest.cast(group[0].batch.schema), "ignore",
                      timestamp=last.timestamp, extra={"compacted": len(group)})
