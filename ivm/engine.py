"""The engine: catalog changes, ingest, view maintenance, reads.

Data flow of one change batch (all under the write lock):

    normalize  -> the batch fits the table (names, types, keys, operations)
    apply      -> Z-set delta of the table; new version of the table
    maintain   -> every affected view, in dependency order, runs its compiled
                  program over the deltas; operator state and outputs change
    publish    -> one new snapshot holding all new versions, atomically

Nothing is published until every step succeeded, so a failing batch changes
nothing. Readers never take the lock: they read the published snapshot.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlglot import exp

from sql_frontend.errors import BindError, CatalogError, UnknownObjectError
from sql_frontend.plan import Column
from sql_frontend.statements import AlterTable, AlterView, CreateTable, CreateView, Drop
from delta_operators.compiler import delta_input
from delta_operators.program import Program, Query
from delta_operators.prune import key_pairs, prune_template, without_equal_pairs
from storage.zset import EVERY, WEIGHT, consolidate, count_rows
from ivm.execute import duck
from ivm.ingest import keyed_once
from ivm.binder import Binder, quote
from ivm.catalog import Catalog, TableDef, ViewDef, check_name
from ivm.settings import Settings, spill_of
from ivm.execute.worker import LARGE_BATCH, Worker
from ivm.ingest.prepared import Prepared
from ivm.ingest.changes import as_table, missing_delete_policy
from ivm.maintain.engine_choice import check_engine, choose
from ivm.streams.event_time import (Watermarks, check_retained_reads, check_stream_table, drop_closed_windows,
                                    expire_retained, expire_rows, hidden_defs, max_event_us, on_time_batch,
                                    stored_watermark, watermark_batch)
from ivm.streams.names import on_time_name, watermark_name
from ivm.streams.interval_join import (KEEP_ALL, UNREAD, check_expired_reads, on_time_cutoff,
                               stored_reads)
from ivm.execute.executor import RowChanges, StepRunner, commit_row_changes, planned_status, with_program_indexes
from ivm.ingest.group_commit import Committer, OwnedLock, take_and_commit
from ivm.ingest.ingest_group import Pending, Ticket
from ivm.maintain.maintenance import check_mode, source_rows
from ivm.ingest.producers import Producers, check_producer
from ivm.maintain.mirrors import Mirrors
from ivm.reads.observations import Observations
from ivm.reads.reads import Reader
from ivm.view_definition import define_view
from ivm.maintain.recompute import is_stale, operator_states, rebuild, refresh, time_select, with_stale
from ivm.schema_change import BrokenView, altered_definition, altered_rows, replanned
from storage.view_history import ViewHistory
from storage.relation import Relation
from storage.store import Snapshot, Store


def _broken_views_message(stmt: AlterTable, table: str, broken: dict[str, str]) -> str:
    """Why an ALTER TABLE is refused: the views it would break, each with why."""
    views = "; ".join(f"{name}: {why}" for name, why in broken.items())
    names = ", ".join(broken)
    if stmt.action == "drop":
        return (f"cannot drop column {stmt.column} of table {table}: materialized view(s) {names} read it ({views}); "
                f"drop them first, or ALTER TABLE {table} DROP COLUMN {stmt.column} CASCADE drops them too")
    if stmt.action == "type":
        return (f"cannot change the type of column {stmt.column} of table {table}: materialized view(s) {names} "
                f"read it and would change ({views}); drop them first")
    return f"cannot add column {stmt.column} to table {table}: materialized view(s) {names} would change ({views})"


def _table_failure(table: str, reason: str) -> str:
    """Why a view over ``table`` is unreadable after ``Engine.fail_table(table, reason)`` (stored in the manifest,
    so recover_table and _only_unreadable recognise it after a reopen too)."""
    return f"it reads table {table}, which failed: {reason}"


class Engine:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self.settings.engine = check_engine(self.settings.engine)
        if self.settings.spark_conf:
            from ivm.execute.spark.session import check_conf

            check_conf(self.settings.spark_conf)
        check_mode(self.settings.maintenance)
        self.spill = spill_of(self.settings, None)
        threads = self.settings.threads or None
        # Every DuckDB instance runs user SQL, so each is locked to what ivm registers
        # on it (ivm/execute/duck.py); each spills, if ever, to its own directory of the engine's.
        self.scratch = duck.Scratch()
        # Reads, first computations of views and large batches run in parallel;
        # the steady stream of small deltas runs single-threaded, where DuckDB
        # spends less on scheduling than a second thread would save (measured:
        # 58 -> 46 ms per 1,000-row batch of the core benchmark).
        self.duck = duck.connect(threads, self.scratch.directory("reads"), self.settings.memory_limit)
        self._small_db = duck.connect(1, self.scratch.directory("small"))
        # Native copies of the tables recomputed views read.
        self.mirrors = Mirrors(lambda: duck.connect(threads, self.scratch.directory("mirrors"), self.settings.memory_limit))
        self.large = Worker(self.duck.cursor())
        self.small = Worker(self._small_db.cursor())
        self.binder = Binder()
        self.catalog = Catalog(self.binder)
        self.store = Store()
        self.write_lock = OwnedLock()
        # Group commit (ivm/ingest/group_commit.py): batches waiting for the write lock, and the
        # tables' versions made by the unit being committed.
        self.pending = Pending()
        self.heads: dict[str, Relation] = {}
        self.committer: Committer | None = None  # in memory, with ingest_nice: started by start_committer
        self.reader = Reader(self)
        self.history = ViewHistory(self.settings.retain_rows)
        self.offset = 0
        self.closed = False
        self.producers = Producers()
        # The engine that ran each view's last maintenance step ("duckdb"/"spark").
        self.engine_used: dict[str, str] = {}
        # Views being computed for the first time (backfill): name -> progress (steps done of all).
        self.backfills: dict[str, dict] = {}
        self.backfill_runners: dict[str, StepRunner] = {}  # their executors (Spark reports its tasks)
        # Views whose maintenance failed after their changes were acknowledged
        # (durable databases): name -> error message. Reads of them raise.
        self.failed: dict[str, str] = {}
        # Largest event time per watermarked table (ivm/streams/event_time.py).
        self.watermarks = Watermarks()
        # Latencies and counts recorded where they happen (ivm/reads/observations.py).
        self.observed = Observations()

    def wait_visible(self) -> None:
        """Block until reads see every acknowledged change (in memory: they always do)."""

    def worker(self, rows: int) -> Worker:
        return self.large if rows > LARGE_BATCH else self.small

    def start_committer(self) -> None:
        """In memory with ``ingest_nice``: batches are committed by a lower-priority thread."""
        if self.settings.ingest_nice > 0:
            self.committer = Committer(self, self.settings.ingest_nice)

    def close(self) -> None:
        self.closed = True
        if self.committer is not None:
            self.committer.stop()
        self.history.close()
        self.reader.close()
        self.mirrors.close()
        self.binder.close()
        self.large.close()
        self.small.close()
        self._small_db.close()
        self.duck.close()
        self.scratch.close()

    # --- schemas ------------------------------------------------------------------
    def arrow_schema(self, columns: tuple[Column, ...]) -> pa.Schema:
        schema = self.binder.arrow_schema(columns)
        return schema.append(pa.field(WEIGHT, pa.int64()))

    def empty_relation(self, name: str, columns: tuple[Column, ...], identity: tuple[str, ...],
                       indexes: tuple[tuple[str, ...], ...] = ()) -> Relation:
        return Relation.empty(name, self.arrow_schema(columns), identity, indexes, self.spill)

    # --- tables ---------------------------------------------------------------------
    def create_table(self, stmt: CreateTable, columns: tuple[Column, ...] | None = None) -> bool:
        """Create a table; False when it exists and IF NOT EXISTS was given."""
        with self.write_lock:
            if self.catalog.exists(stmt.name):
                if stmt.if_not_exists:
                    return False
                raise CatalogError(f"{stmt.name} already exists")
            check_name(stmt.name, "table")
            table = self._table_def(stmt, columns)
            relation = self.empty_relation(table.name, table.columns, table.identity, (table.identity,))
            self.catalog.add_table(table)
            relations = {table.name: relation}
            for hidden in hidden_defs(table):  # its on-time rows and its watermark, for views
                self.catalog.add_table(hidden)
                relations[hidden.name] = self.empty_relation(hidden.name, hidden.columns, hidden.identity,
                                                             (hidden.identity,))
            self.store.publish(self.store.snapshot.with_changes(relations))
            # Empty now, so its history from here on is complete: a subscriber from before integrates to it.
            self.history.start(table.name, self.offset, kind="table")
            return True

    def _table_def(self, stmt: CreateTable, given: tuple[Column, ...] | None) -> TableDef:
        if given is not None:
            columns = given
            not_null: set[str] = set()
            defaults = {}
        else:
            seen: set[str] = set()
            cols = []
            not_null = set()
            defaults = {}
            for c in stmt.columns:
                if c.name in seen:
                    raise CatalogError(f"column {c.name} appears twice in table {stmt.name}")
                seen.add(c.name)
                check_name(c.name, "column")
                column = Column(c.name, self.binder.normalize_type(c.type))
                self.binder.check_round_trip(column)
                cols.append(column)
                if c.not_null:
                    not_null.add(c.name)
                if c.default is not None:
                    if c.default.find(exp.Column) is not None:
                        raise BindError(f"DEFAULT of column {c.name} must be a constant")
                    self.binder.describe(f"SELECT CAST({c.default.sql('duckdb')} AS {column.type})")
                    defaults[c.name] = c.default
            columns = tuple(cols)
        names = [c.name for c in columns]
        for k in stmt.primary_key:
            if k not in names:
                raise CatalogError(f"primary key column {k} is not a column of {stmt.name}")
        if len(set(stmt.primary_key)) != len(stmt.primary_key):
            raise CatalogError(f"primary key of {stmt.name} names a column twice")
        stream = stmt.stream
        event_time = stream.event_time if stream is not None else None
        table = TableDef(
            name=stmt.name,
            columns=columns,
            primary_key=stmt.primary_key,
            not_null=frozenset(not_null | set(stmt.primary_key) | ({event_time} if event_time else set())),
            defaults=defaults,
            append_only=bool(stream and stream.append_only),
            event_time=event_time,
            lateness_us=(stream.lateness_us or 0) if stream is not None else 0,
            retain_us=stream.retain_us if stream is not None else None,
        )
        check_stream_table(table)
        return table

    # --- views ------------------------------------------------------------------------
    def create_view(self, stmt: CreateView) -> bool:
        with self.write_lock:
            if self.catalog.exists(stmt.name):
                if stmt.if_not_exists:
                    return False
                raise CatalogError(f"{stmt.name} already exists")
            check_name(stmt.name, "view")
            view = define_view(stmt.name, stmt.sql, stmt.query, self.catalog, column_names=stmt.column_names,
                               late=stmt.late, emit=stmt.emit, engine=stmt.engine)
            check_expired_reads(view, self.store.snapshot)
            check_retained_reads(view, self.catalog, self.stored_new)
            if set(view.sources) & {on_time_name(t) for t in self.catalog.tables}:
                self._stored_reads(view)  # now, not while a later batch is converted
            snapshot = self.store.snapshot
            # A view read by another view needs stored output (for lookups and deltas).
            converted = [self.catalog.views[s] for s in view.sources
                         if s in self.catalog.views and not self.catalog.views[s].stored_output]
            for upstream in converted:
                snapshot = self._store_output(upstream, snapshot)
            fresh = {
                spec.name: self.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
                for spec in view.states
            }
            snapshot = snapshot.with_changes(fresh)
            # Indexes the view will look up in its sources, built now rather than
            # on the first change (single-source programs cover the common case).
            for source in view.sources:
                program = view.program(frozenset([source]), self.stored_new(frozenset([source])))
                snapshot = with_program_indexes(program, snapshot, self.large.coder)
            try:
                started = time.perf_counter()
                snapshot = self._initialize(view, snapshot)
                view.cost.record_rebuild(time.perf_counter() - started, source_rows(snapshot, view.sources))
                self._measure_refresh(view, snapshot)
            except BaseException:
                for upstream in converted:  # nothing was published: undo the switch
                    upstream.stored_output = False
                    upstream.states = [s for s in upstream.states if s.name != upstream.name]
                    upstream.programs.clear()
                raise
            self.catalog.add_view(view)
            self.store.publish(snapshot)
            self._record_creation(view, snapshot)
            return True

    def _measure_refresh(self, view: ViewDef, snapshot: Snapshot) -> None:
        """First estimate of the view's refresh (ivm/maintain/maintenance.py), where auto mode may choose it."""
        if self.settings.maintenance != "auto" or view.cost.recompute is not None \
                or self.catalog.reads_retained(view):
            return
        try:
            seconds = time_select(self, view, snapshot)
        except Exception:  # noqa: BLE001 - a SELECT that fails here leaves the view incremental (no estimate)
            view.cost.refresh_failed = True
            return
        view.cost.estimate_refresh(seconds, source_rows(snapshot, view.sources))

    def _record_creation(self, view: ViewDef, snapshot: Snapshot) -> None:
        """Start the view's change history with its contents: the delta from empty."""
        self.history.start(view.name, snapshot.offset)
        if view.stored_output:
            initial = snapshot[view.name].table()
        else:
            rows = self.reader.query(f"SELECT * FROM {quote(view.name)}",
                                     exp.Table(this=exp.to_identifier(view.name)), snapshot, internal=True)
            initial = (self.large.runner.run(count_rows("rows", view.column_names), rows=rows) if rows.num_rows
                       else rows.slice(0, 0))
        self.history.append(snapshot.offset, {view.name: initial})

    def _store_output(self, view: ViewDef, snapshot: Snapshot) -> Snapshot:
        """Give a view computed on read a stored output, filled with its rows now."""
        rows = self.reader.query(f"SELECT * FROM {quote(view.name)}", exp.Table(this=exp.to_identifier(view.name)),
                                 snapshot, internal=True)
        counted = (self.large.runner.run(count_rows("rows", view.column_names), rows=rows) if rows.num_rows
                   else rows.append_column(WEIGHT, pa.array([], pa.int64())))
        view.store_output()
        spec = view.states[0]
        relation = self.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
        return snapshot.with_changes({view.name: relation.replace_all(counted, self.large.coder)})

    def stored_new(self, changed: frozenset[str]) -> frozenset[str]:
        """Sources whose stored version already includes the step's delta (tables)."""
        return frozenset(r for r in changed if r in self.catalog.tables)

    def _initialize(self, view: ViewDef, snapshot: Snapshot) -> Snapshot:
        """Compute a new view from what its sources hold now: the delta from empty."""
        sources = frozenset(view.sources)
        program = view.program(sources, sources, initial=True)
        snapshot = with_program_indexes(program, snapshot, self.large.coder)
        inputs = {delta_input(s): snapshot[s].table() for s in sources}
        rows = sum(t.num_rows for t in inputs.values())
        executor = self.executor_for(view, program, rows, snapshot, self.large)
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            self.backfills[view.name] = {"engine": executor.engine, "input_rows": rows, "step": done,
                                         "steps": total, "started": started}

        progress(0, len(program.steps))
        self.backfill_runners[view.name] = executor
        try:
            _, changes = executor.run(program, inputs, snapshot, label=f"view {view.name}", progress=progress)
        finally:
            self.backfills.pop(view.name, None)
            self.backfill_runners.pop(view.name, None)
        return snapshot.with_changes(commit_row_changes(changes, snapshot, self.large.coder))

    def alter_view(self, stmt: AlterView) -> bool:
        """Set (or with None reset) a view's own engine; takes effect from its next step."""
        with self.write_lock:
            if not self.catalog.exists(stmt.name):
                raise UnknownObjectError(f"materialized view {stmt.name} does not exist")
            view = self.catalog.views.get(stmt.name)
            if view is None:
                raise CatalogError(f"{stmt.name} is a table; ALTER MATERIALIZED VIEW changes materialized views")
            view.engine = stmt.engine
            return True

    def alter_table(self, stmt: AlterTable) -> bool:
        """ALTER TABLE … ADD/DROP COLUMN, ALTER COLUMN … TYPE (ivm/schema_change.py); False when it
        changes nothing (IF [NOT] EXISTS, the same type). All or nothing: the table's rows in the new
        shape, every view reading it planned again (its state kept when its plan's shape is; else
        computed again), published together."""
        with self.write_lock:
            if not self.catalog.exists(stmt.table):
                if stmt.if_exists:
                    return False
                raise UnknownObjectError(f"table {stmt.table} does not exist")
            table = self.catalog.table(stmt.table)  # a view: a clear error
            snapshot = self.store.snapshot
            relation = snapshot[table.name]
            new = altered_definition(table, stmt, self.binder, relation.num_rows)
            if new is None:
                return False
            default = None
            if stmt.action == "add" and stmt.definition.default is not None:
                default = self._constant(stmt.definition.default, new.columns[-1].type)
            before = self.catalog.schema()
            readers = [self.catalog.views[v] for v in self.catalog.view_order() if v in self.catalog.readers(table.name)]
            self.catalog.replace_table(new)
            try:
                planned, broken = {}, {}
                for view in readers:
                    try:
                        planned[view.name] = replanned(view, self.catalog, before, may_pin=stmt.action == "add")
                    except BrokenView as e:
                        broken[view.name] = str(e)
                if broken and not (stmt.action == "drop" and stmt.cascade):
                    raise CatalogError(_broken_views_message(stmt, table.name, broken))
                if not broken:
                    snapshot = self._altered_snapshot(snapshot, table, new, stmt, default, relation, planned)
            except BaseException:
                self.catalog.replace_table(table)
                raise
            if broken:  # DROP COLUMN … CASCADE: the views that read it go (with theirs), then the column
                self.catalog.replace_table(table)
                for name in broken:
                    Engine.drop(self, Drop("view", name, if_exists=True, cascade=True))
                return Engine.alter_table(self, stmt)
            for view in planned.values():
                self.catalog.replace_view(view)
            self.store.publish(snapshot)
            # Its earlier changes have the old columns: a subscriber from before now gets a clear error
            # (read the table again) rather than rows of two shapes.
            self.history.start(table.name, self.offset, complete=False, kind="table")
            return True

    def _altered_snapshot(self, snapshot: Snapshot, old: TableDef, new: TableDef, stmt: AlterTable,
                          default: pa.Scalar | None, relation: Relation, planned: dict[str, ViewDef]) -> Snapshot:
        """The snapshot with the altered table's rows, and the views whose state changed shape computed again."""
        names = list(new.column_names)
        summed = consolidate("{rows}", names, keep=EVERY, template=True)  # a bag's equal rows as one
        rows = altered_rows(relation.table(), old, new, stmt, default, self.arrow_schema(new.columns),
                            lambda bag: self.large.runner.run(summed, rows=bag))
        # Indexes views asked for stay, but for those of a dropped column (and a bag's old identity: its rows).
        indexes = tuple(k for k in relation.index_keys if k != old.identity and set(k) <= set(names))
        updated = self.empty_relation(new.name, new.columns, new.identity, (new.identity, *indexes))
        snapshot = snapshot.with_changes({new.name: updated.replace_all(rows, self.large.coder)})
        for name, view in planned.items():
            before = self.catalog.views[name]
            if view.states == before.states:
                continue  # the same state, the same meaning: it holds what it held
            gone: dict[str, Relation | None] = {s.name: None for s in before.states}
            if not before.stored_output and name in snapshot:
                gone[name] = None  # rows kept while its state was stale: computed again below
            fresh = {s.name: self.empty_relation(s.name, s.columns, s.identity, s.indexes) for s in view.states}
            snapshot = with_stale(snapshot.with_changes({**gone, **fresh}), {name: False})
            snapshot = self._initialize(view, snapshot)
        return snapshot

    def fail_table(self, name: str, reason: str) -> None:
        """Mark a table that stopped following its source (ivm/cdc/stream.py) and every view over it failed:
        reads of them raise ``reason`` instead of answering from rows that no longer follow upstream."""
        with self.write_lock:
            self.catalog.table(name)
            previous = self.failed.get(name)
            self.failed[name] = reason
            for view in self.catalog.dependents(name):
                if previous is not None and self.failed.get(view) == _table_failure(name, previous):
                    self.failed[view] = _table_failure(name, reason)  # failed again, for another reason
                else:
                    self.failed.setdefault(view, _table_failure(name, reason))

    def recover_table(self, name: str) -> None:
        """Undo ``fail_table``: the table (and the views failed only because of it) readable again, as they are
        (maintenance kept those views up to date meanwhile: ``_only_unreadable``)."""
        with self.write_lock:
            reason = self.failed.pop(name, None)
            if reason is None:
                return
            for view in self.catalog.dependents(name):
                if self.failed.get(view) == _table_failure(name, reason):
                    del self.failed[view]

    def _only_unreadable(self, name: str) -> bool:
        """Whether ``name`` is failed only because a table stopped following its source (``fail_table``).

        Such a table and its views are unreadable, not broken: the views'
        state is still right for the rows their tables hold, so maintenance
        goes on updating them (a view also reading a table that still follows
        upstream would otherwise miss its changes, and be wrong once the
        failed table recovers: ALTER SOURCE … REFRESH TABLE, DROP SOURCE).
        """
        reason = self.failed.get(name)
        if reason is None:
            return False
        if name in self.catalog.tables:
            return True  # only fail_table marks a table
        return any(reason == _table_failure(table, why) for table, why in self.failed.items()
                   if table in self.catalog.tables)

    def _constant(self, value: exp.Expression, type_sql: str) -> pa.Scalar:
        """A constant expression (a DEFAULT) evaluated once, as ``type_sql``."""
        text = f"SELECT CAST({value.sql('duckdb')} AS {type_sql}) AS v"
        return self.reader.query(text, exp.select("1"), internal=True).column(0)[0]

    # --- engine choice ------------------------------------------------------------------
    def engine_setting(self, view: ViewDef) -> str:
        """The view's own engine setting, else the database's."""
        return view.engine or self.settings.engine

    def step_status(self, step: Query) -> str:
        """How a query step of a program runs (EXPLAIN): compiled or on DuckDB, and why."""
        for worker in (self.small, self.large):
            status = worker.executor.step_status(step)
            if status is not None:
                return status
        return planned_status(step)

    def step_counts(self) -> dict[str, int]:
        """Query step runs since start by path: compiled, duckdb, fallback, shadowed, mismatch."""
        total = Counter()
        for worker in (self.small, self.large):
            total.update(worker.executor.counts)
        return {k: total.get(k, 0) for k in ("compiled", "duckdb", "fallback", "shadowed", "mismatch")}

    def executor_for(self, view: ViewDef, program: Program, delta_rows: int, snapshot: Snapshot,
                     worker: Worker) -> StepRunner:
        """The executor that runs this step of ``view`` (see ivm/maintain/engine_choice.py)."""
        engine = choose(self.engine_setting(view), program, delta_rows, snapshot, self.settings.spark_rows)
        self.engine_used[view.name] = engine
        return worker.spark(self.settings.spark_conf) if engine == "spark" else worker.executor

    def drop(self, stmt: Drop) -> bool:
        with self.write_lock:
            if not self.catalog.exists(stmt.name):
                if stmt.if_exists:
                    return False
                kind = "table" if stmt.kind == "table" else "materialized view"
                raise UnknownObjectError(f"{kind} {stmt.name} does not exist")
            target = self.catalog.get(stmt.name)
            if stmt.kind != target.kind:
                want = "DROP TABLE" if target.kind == "table" else "DROP MATERIALIZED VIEW"
                raise CatalogError(f"{stmt.name} is a {'table' if target.kind == 'table' else 'materialized view'}; use {want}")
            dependents = self.catalog.dependents(stmt.name)
            if dependents and not stmt.cascade:
                raise CatalogError(
                    f"cannot drop {stmt.name}: materialized view(s) {', '.join(dependents)} depend on it "
                    "(DROP ... CASCADE drops them too)"
                )
            removed: dict[str, Relation | None] = {}
            for hidden in self.catalog.hidden(stmt.name):  # a watermarked table's twins go with it
                removed[hidden.name] = None
                self.catalog.remove(hidden.name)
            for name in list(reversed(dependents)) + [stmt.name]:
                definition = self.catalog.get(name)
                if isinstance(definition, ViewDef):
                    for spec in definition.states:
                        removed[spec.name] = None
                else:
                    removed[name] = None
            for name in list(reversed(dependents)) + [stmt.name]:
                self.catalog.remove(name)
                self.history.drop(name)
                self.watermarks.drop(name)
            gone = {name: False for name in dependents + [stmt.name]}  # a view made again starts fresh
            self.store.publish(with_stale(self.store.snapshot.with_changes(removed), gone))
            return True

    # --- changes ------------------------------------------------------------------------
    def ingest(self, table: str, data: Any, on_missing_delete: str | None = None,
               source: str | None = None, seq: int | None = None) -> int:
        """Apply one change batch atomically; return its offset (once reads see it).

        Batches that queue for the write lock meanwhile are committed together
        by whoever takes it, each with its own offset and outcome
        (ivm/ingest/group_commit.py).
        """
        check_producer(source, seq)
        started = time.perf_counter()
        ticket = Ticket(table, data, on_missing_delete, source, seq)
        if self.write_lock.held():  # CREATE TABLE ... AS holds the lock: its batch goes alone, now
            with self.write_lock:
                self.ingest_one(ticket)
        elif self.committer is not None:  # a thread of lower OS priority commits (Settings.ingest_nice)
            self.committer.commit(ticket)
        else:
            self.pending.add(ticket)
            with self.write_lock:
                while not ticket.done:
                    take_and_commit(self)
        if ticket.error is not None:
            raise ticket.error
        self.acknowledged(ticket, started)
        return ticket.offset

    def acknowledged(self, ticket: Ticket, started: float) -> None:
        """Record a batch acknowledged now, handed in at ``started`` (``time.perf_counter()``)."""
        self.observed.batch_seconds.observe(time.perf_counter() - started)
        self.observed.acknowledged(ticket.table, ticket.batch.num_rows if ticket.batch is not None else 0)

    def ingest_one(self, ticket: Ticket) -> None:
        """Apply one batch on its own (under the write lock); fill in its offset or error."""
        try:
            ticket.offset = self._ingest_one(ticket)
        except Exception as e:
            ticket.error = e
        ticket.done = True

    def _ingest_one(self, ticket: Ticket) -> int:
        table, source, seq = ticket.table, ticket.source, ticket.seq
        if source is not None:
            known = self.producers.known(source, seq)
            if known is not None:
                return known
        snapshot = self.store.snapshot
        prepared = self.prepare(table, ticket.data, ticket.on_missing_delete)
        ticket.batch = prepared.batch  # normalized: its rows are the batch's
        snapshot = snapshot.with_changes(prepared.versions())
        deltas = prepared.deltas()
        offset = self.offset + 1
        pairs = {prepared.change_table: prepared.change.pairs} if prepared.change.pairs is not None else None
        self.maintain_and_publish(snapshot, deltas, prepared.counts(), self.worker(prepared.change.delta.num_rows),
                                  first=offset, last=offset, assign=True,
                                  before_publish=lambda _: self.accept_events(table, prepared), pairs=pairs)
        self.producers.record(source, seq, offset)
        return offset

    def maintain_and_publish(self, snapshot: Snapshot, deltas: dict[str, pa.Table], counts: dict[str, int],
                             worker: Worker, *, first: int, last: int, assign: bool, isolate: bool = False,
                             before_publish: Callable[[Snapshot], None] | None = None,
                             guard: ContextManager | None = None,
                             pairs: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> Snapshot:
        """The step every writer ends with (a batch on its own, a group commit, a durable fold):
        maintain every view over ``deltas`` (tables' new versions are in ``snapshot``), then publish
        the result as offsets ``first``..``last``; return the published snapshot.

        ``assign``: the offsets are new (in memory, a commit makes them) and
        become the engine's; a durable fold publishes offsets its log already
        gave. ``isolate``: see ``_maintain``. ``before_publish`` sees the
        maintained snapshot first (a step that fails there publishes nothing);
        ``guard`` is held while the history and the snapshot are published.
        ``pairs``: per table, the update pairs of its delta its conversion found (``ZsetChange.pairs``).

        The history first: a reader who sees the view at this offset may
        subscribe from it at once. Deltas of views computed on read are not
        consolidated here: subscribers consolidate what they read
        (ivm/reads/changefeed.py), which keeps that query off the write path.
        """
        snapshot = self._maintain(deltas, snapshot, worker, isolate=isolate, pairs=pairs)
        if before_publish is not None:
            before_publish(snapshot)
        return self.publish(snapshot, deltas, counts, first=first, last=last, assign=assign, guard=guard)

    def publish(self, snapshot: Snapshot, deltas: dict[str, pa.Table], counts: dict[str, int], *, first: int,
                last: int, assign: bool, guard: ContextManager | None = None) -> Snapshot:
        """The publishing half of ``maintain_and_publish`` (called only by it)."""
        published = snapshot.with_changes({}, offset=last).with_counts(counts)
        self.reader.warm(published)  # rows of views computed on read, ready for the first read
        with guard if guard is not None else nullcontext():
            self.history.append(last, self.history_deltas(deltas), first=first)
            if assign:
                self.offset = last
            self.store.publish(published)
        return published

    def ingest_batch(self, batches: list[tuple[str, Any]], on_missing_delete: str | None = None) -> int:
        """Apply change batches of distinct tables atomically, as one offset; return it.

        Each table's batch is converted against the table as published (the
        tables are distinct, so no batch sees another's rows); then every
        affected view is maintained once over all the tables' deltas, the way
        a durable fold maintains several batches (ivm/durable/maintainer.py). A bad
        batch fails the whole call before anything is published.
        """
        started = time.perf_counter()
        with self.write_lock:
            snapshot = self.store.snapshot
            prepared = [(table, self.prepare(table, data, on_missing_delete)) for table, data in batches]
            deltas: dict[str, pa.Table] = {}
            counts: dict[str, int] = {}
            for _, one in prepared:
                snapshot = snapshot.with_changes(one.versions())
                deltas.update(one.deltas())
                for name, n in one.counts().items():
                    counts[name] = counts.get(name, 0) + n
            rows = sum(one.change.delta.num_rows for _, one in prepared)

            def accept(_: Snapshot) -> None:
                for table, one in prepared:
                    self.accept_events(table, one)

            offset = self.offset + 1
            self.maintain_and_publish(snapshot, deltas, counts, self.worker(rows), first=offset, last=offset,
                                      assign=True, before_publish=accept)
        self.observed.batch_seconds.observe(time.perf_counter() - started)
        for table, one in prepared:
            self.observed.acknowledged(table, one.batch.num_rows)
        return offset

    def history_deltas(self, deltas: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """What the change history records of a step's ``deltas``: the views' (``_maintain`` added them)
        and the user tables' (their batches as Z-sets: an update is -old/+new), so both can be
        subscribed. Hidden twins of watermarked tables are internal: nobody subscribes to them."""
        tables = self.catalog.tables
        return {n: d for n, d in deltas.items()
                if n in self.catalog.views or (n in tables and tables[n].shadow_of is None)}

    def head(self, table: str) -> Relation:
        """The table including every accepted batch (in memory: the published version,
        or the version a unit being committed has made)."""
        return self.heads.get(table) or self.store.snapshot[table]

    def change_schema(self, table: str) -> pa.Schema:
        """The columns a batch of ``table`` is normalized to (no weight). Only DDL changes
        them, so this reads the head without the locks that guard its rows."""
        relation = Engine.head(self, table)
        return relation.schema.remove(relation.schema.get_field_index(WEIGHT))

    def prepare(self, table: str, data: Any, on_missing_delete: str | None) -> Prepared:
        """Normalize a batch and convert it to a Z-set change of the table (as of every earlier batch)."""
        definition = self.catalog.table(table)
        relation = self.head(table)
        data = as_table(data)
        policy = missing_delete_policy(data, on_missing_delete)
        worker = self.worker(data.num_rows)
        batch = worker.normalizer.normalize(definition, self.change_schema(table), data)
        return self.convert(definition, batch, policy, relation, worker)

    def convert(self, definition: TableDef, batch: pa.Table, policy: str, relation: Relation,
                worker: Worker) -> Prepared:
        change = worker.applier.apply(definition, relation, batch, policy)
        updated = relation.replace_rows(change.delete_runs, change.delete_rows, change.inserts, worker.coder)
        prepared = Prepared(batch, policy, change, updated, change_table=definition.name)
        if definition.event_time is not None:
            prepared.event_max = max_event_us(definition, change.inserts)
            on_time = on_time_batch(definition, batch, self.watermarks.watermark(definition))
            prepared.late = batch.num_rows - on_time.num_rows
            shadow = self.catalog.tables[on_time_name(definition.name)]
            prepared.hidden.append(self.convert(shadow, on_time, policy, self.head(shadow.name), worker))
            moved = watermark_batch(definition, self.watermarks, prepared.event_max)
            if moved is not None:
                mark = self.catalog.tables[watermark_name(definition.name)]
                prepared.hidden.append(self.convert(mark, moved, "error", self.head(mark.name), worker))
            limit = self._on_time_limit(definition)
            if definition.retain_us is not None:
                expire_retained(definition, prepared, self.watermarks, worker.coder, limit)
            elif limit is not KEEP_ALL and limit is not UNREAD:
                prepared.expired = expire_rows(prepared.hidden[0], definition.event_time, limit, worker.coder)
        return prepared

    def _on_time_limit(self, definition: TableDef):
        """What interval joins need of the stream's on-time rows (ivm/streams/interval_join.py on_time_cutoff).

        Watermarks come from the published snapshot: every batch maintained with
        this one (also in a fold of several) was on time against them or later ones.
        """
        snapshot = self.store.snapshot
        views = [v for v in self.catalog.views.values() if v.name not in self.failed]
        return on_time_cutoff(definition.name, views, lambda s: stored_watermark(snapshot, s), self._stored_reads)

    def _stored_reads(self, view: ViewDef) -> frozenset[str]:
        if view.stored is None:
            view.stored = stored_reads(view, self.stored_new)
        return view.stored

    def accept_events(self, table: str, prepared: Prepared) -> None:
        """A batch of ``table`` was accepted: move its watermark."""
        definition = self.catalog.tables[table]
        if definition.event_time is not None:
            self.watermarks.accept(definition, prepared.event_max, prepared.late)

    def _maintain(self, deltas: dict[str, pa.Table], snapshot: Snapshot, worker: Worker,
                  isolate: bool = False, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> Snapshot:
        """Run every affected view's program; return the snapshot with all changes.

        With ``isolate`` (changes already acknowledged), a view whose program
        fails is marked failed, with the error, instead of failing the batch;
        so are the views that read it. The other views go on. ``pairs``: the
        update pairs of a table's delta, known from its conversion (pruning
        looks for them otherwise).
        """
        all_changes: list[RowChanges] = []
        # New versions of the relations of views recomputed in this batch (None: removed), and their stale flags
        recomputed: dict[str, Relation | None] = {}
        stale: dict[str, bool] = {}
        stored_new = frozenset(deltas)
        # Shared by views reading the same columns; (table, None): its delta's update pairs (``_pruned``).
        pruned: dict[tuple[str, tuple[str, ...] | None], Any] = {(t, None): (p, {}) for t, p in (pairs or {}).items()}
        # Views probing the same relation with the same delta share the lookup (executor.SharedLookups).
        with worker.executor.sharing_lookups():
            for name in self.catalog.affected_views(deltas):
                view = self.catalog.views[name]
                if isolate and self._skip_failed(view):
                    continue
                seen = {s: self._pruned(view, s, deltas[s], pruned, worker)
                        for s in view.sources if s in deltas and deltas[s].num_rows}
                changed = frozenset(s for s, d in seen.items() if d.num_rows)
                if not changed:
                    continue
                rows = sum(seen[s].num_rows for s in changed)
                # A view over a RETAIN stream is never recomputed: its sources no longer hold every row it counts.
                mode = "incremental" if self.catalog.reads_retained(view) else self.settings.maintenance
                was_stale = is_stale(snapshot, name)
                sizes = source_rows(snapshot, view.sources) if mode != "incremental" or was_stale else 0
                if mode == "auto" and view.cost.recompute is None and view.cost.incremental is not None \
                        and not view.cost.refresh_failed:
                    self._measure_refresh(view, snapshot)  # e.g. after a reopen: nothing measured yet
                path = view.cost.choose(mode, rows, sizes, was_stale)
                warmup = False
                elapsed = self.mirrors.stopwatch()
                try:
                    if path != "incremental":
                        if path == "recompute":
                            delta, relations = refresh(self, view, snapshot, all_changes, recomputed, worker, deltas)
                        else:
                            delta, relations = rebuild(self, view, snapshot, all_changes, recomputed, worker)
                        deltas[name] = delta
                        recomputed.update(relations)
                        if path == "rebuild" or operator_states(view):  # a refresh leaves operator state stale
                            stale[name] = path == "recompute"
                    else:
                        program = view.program(changed, stored_new & changed)
                        warmup = view.cost.warming_up(program)
                        snapshot = with_program_indexes(program, snapshot, worker.coder)
                        inputs = {delta_input(s): seen[s] for s in changed}
                        executor = self.executor_for(view, program, rows, snapshot, worker)
                        checked = self._probation_runs(executor)
                        temps, changes = executor.run(program, inputs, snapshot, label=f"view {name}")
                        # A batch whose new compiled steps were also run on DuckDB to check them costs both:
                        # it is no timing of the incremental path (it would send a view to recompute early).
                        warmup = warmup or self._probation_runs(executor) != checked
                        if program.output is not None:
                            deltas[name] = self._as_view_delta(view, temps[program.output], snapshot)
                        all_changes.extend(changes)
                except Exception as e:
                    if not isolate:
                        raise
                    self.failed[name] = f"{type(e).__name__}: {e}"
                    continue
                # Copying whole tables into mirrors is one-off on the way to the refresh path (like leaving
                # incremental's state): it does not count in R, or one copy would send the view straight back.
                view.cost.record(path, elapsed(), rows, sizes, warmup)
                if view.cost.trial:
                    self._trial_refresh(view, snapshot, all_changes, recomputed, worker, deltas, sizes)
        committed = commit_row_changes([c for c in all_changes if c.relation not in recomputed], snapshot, worker.coder)
        snapshot = with_stale(snapshot.with_changes({**committed, **recomputed}), stale)
        self._keep_mirrors(snapshot, deltas, worker)
        return self._drop_closed_windows(deltas, snapshot, worker)

    @staticmethod
    def _probation_runs(executor: StepRunner) -> int:
        counts = getattr(executor, "counts", None)  # the local executor's; Spark's steps are not checked
        return counts["on_probation"] if counts is not None else 0

    def _trial_refresh(self, view: ViewDef, snapshot: Snapshot, pending: list[RowChanges],
                       recomputed: dict[str, Relation | None], worker: Worker, deltas: dict[str, pa.Table],
                       sizes: int) -> None:
        """Run the refresh path beside this batch's incremental one, keep only its time (ivm/maintain/maintenance.py).

        Its results are discarded: the view's state and output come from the
        incremental program. A refresh that fails leaves the view incremental,
        as a SELECT failing at CREATE does.
        """
        elapsed = self.mirrors.stopwatch()
        try:
            refresh(self, view, snapshot, pending, recomputed, worker, deltas)
        except Exception:  # noqa: BLE001 - the batch does not depend on it; the view stays incremental
            view.cost.trial_failed()
            return
        view.cost.record_trial(elapsed(), sizes)

    def _keep_mirrors(self, snapshot: Snapshot, deltas: dict[str, pa.Table], worker: Worker) -> None:
        """Drop the native mirrors no view on the refresh path reads (ivm/maintain/mirrors.py): they only hold memory;
        the others follow this batch's deltas. A copy a view that may still trial reads stays a few passes
        after its last use (``LINGER_PASSES``): the next view's trial finds it instead of copying again."""
        if not self.mirrors.tables:
            return
        views = self.catalog.views.values()
        self.mirrors.keep((source for view in views if view.cost.last == "recompute" for source in view.sources),
                          lingering=(source for view in views if view.cost.provisional and not view.cost.refresh_failed
                                     for source in view.sources))
        self.mirrors.follow(self.catalog, snapshot, self.store.snapshot, deltas, worker.coder)

    def _drop_closed_windows(self, deltas: dict[str, pa.Table], snapshot: Snapshot, worker: Worker) -> Snapshot:
        """Views over a stream whose watermark moved lose the state of windows it closed (ivm/streams/event_time.py)."""
        moved = {t.shadow_of for t in self.catalog.tables.values()
                 if t.shadow_of and t.name in deltas and t.name == watermark_name(t.shadow_of)}
        dropped = {}
        for view in self.catalog.views.values():
            if view.closed is not None and moved & set(view.closed.streams) and view.name not in self.failed:
                dropped.update(drop_closed_windows(view.closed, snapshot, worker.coder))
        return snapshot.with_changes(dropped) if dropped else snapshot

    def _pruned(self, view: ViewDef, source: str, delta: pa.Table,
                cache: dict[tuple[str, tuple[str, ...] | None], Any], worker: Worker) -> pa.Table:
        """``delta`` without the changes ``view`` cannot see (delta_operators/prune.py)."""
        reads = view.reads(source)
        names = delta.schema.names
        if reads is None or len(reads) >= len(names) - 1:
            return delta
        weights = pc.min_max(delta.column(WEIGHT))
        if weights["min"].as_py() > 0 or weights["max"].as_py() < 0:
            return delta  # inserts only, or deletes only: nothing can cancel
        columns = tuple(c for c in names if c in reads)
        key = (source, columns)
        if key not in cache:
            table = self.catalog.tables.get(source)
            if table is not None and table.primary_key and keyed_once.comparable(
                    delta.schema, table.primary_key + columns):
                # Pairs of one key cancel in numpy: for a key of several columns (lineitem, partsupp)
                # their hash codes cost one statement per delta, where each projection's window
                # query was one (~6 ms) per view reading other columns.
                shared = cache.get((source, None))  # shared by every projection of the delta
                if shared is None:
                    pairs = key_pairs(delta, worker.coder.codes(delta, table.primary_key))
                    shared = cache[(source, None)] = (pairs, {})  # and the columns compared so far
                cache[key] = without_equal_pairs(delta, shared[0], table.primary_key, columns, shared[1])
            else:
                cache[key] = worker.runner.run(prune_template(columns), delta=delta)
        return cache[key]

    def _as_view_delta(self, view: ViewDef, delta: pa.Table, snapshot: Snapshot) -> pa.Table:
        """The delta in the view's own column types (Spark's may differ: BIGINT for HUGEINT...)."""
        if not view.stored_output or view.name not in snapshot:
            return delta
        schema = snapshot[view.name].schema
        if delta.schema.equals(schema) or delta.schema.names != schema.names:
            return delta
        return delta.cast(schema)

    def _skip_failed(self, view: ViewDef) -> bool:
        if view.name in self.failed and not self._only_unreadable(view.name):
            return True
        upstream = [s for s in view.sources if s in self.failed and not self._only_unreadable(s)]
        if upstream:
            self.failed[view.name] = f"it reads materialized view {upstream[0]}, which failed"
            return True
        return False

