"""Reads: ad-hoc SQL over one consistent snapshot of tables and views.

A read first waits until the published snapshot holds every change
acknowledged before it started (durable databases fold acknowledged changes
into the views in the background; see ivm/durable/maintainer.py). It then leases a
DuckDB cursor from a small pool (one reader at a time per cursor). Before a
query runs, every table and view it names is registered on that cursor as
the Arrow data of the snapshot taken when the read began (zero-copy;
re-registered only when the version changed). All relations in one read
therefore reflect the same change offset. A read never takes the write lock;
in a durable database it may wait for the maintainer (read your writes),
never for a producer.

A pool rather than a cursor per thread: servers (gRPC under pyarrow.flight)
run calls on short-lived threads, and a cursor per thread was created, set
up and leaked for almost every call (measured: a 1-row view lookup over
Flight took 9.8 ms, 7 of them setting up a fresh cursor). The pool keeps at
most IDLE_CURSORS idle cursors; they hold the versions they last read until
they read again, which bounds what they pin.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.errors import (AccessDeniedError, BindError, ExecutionError, IvmError, StatementCancelledError,
                                 StatementTimeoutError, UnknownObjectError)
from sql_frontend.statements import normalize_name
from sql_frontend.time_windows import expand_time_windows, has_time_windows
from storage.zset import WEIGHT
from ivm.reads import cancel, computed, point_reads
from ivm.execute import duck
from ivm.reads.system_relations import SystemRelations, reads_system
from ivm.execute.executor import duckdb_message
from delta_operators.program import scan_name
from ivm.binder import quote
from storage.keys import KeyCoder
from storage.relation import Relation
from storage.schemas import SchemaMap
from storage.store import Snapshot, Store
from ivm.catalog import Catalog, TableDef, ViewDef


class Readable(Protocol):
    """What reads need (the engine has it): the catalog and published snapshot to read, the DuckDB
    instance that runs them, the views whose maintenance failed, and the wait that makes reads see
    every acknowledged change."""

    catalog: Catalog
    store: Store
    duck: duckdb.DuckDBPyConnection
    failed: dict[str, str]

    def wait_visible(self) -> None: ...

OFFSET_METADATA = b"ivm.offset"


def visible(relation: Relation, may_repeat: bool) -> pa.Table:
    """The rows users see: the weight column dropped, or spent on repetitions."""
    cached = relation.cached("visible")
    if cached is not None:
        return cached
    table = relation.table()
    weights = table.column(WEIGHT)
    rows = table.drop_columns([WEIGHT])
    if may_repeat and table.num_rows and pc.max(weights).as_py() > 1:
        rows = rows.take(pa.array(np.repeat(np.arange(table.num_rows), weights.to_numpy())))
    relation.remember("visible", rows)
    return rows


IDLE_CURSORS = 16
COMPUTE_ONCE_ROWS = 200_000  # state rows up to which a computed view's rows are kept per version
# State rows from which a point read by a computed view's key looks the key up in the state
# (``_keyed_answer``), instead of matching the version's computed rows. A lookup and a one-row
# projection cost ~0.4 ms whatever the view's size, and need no rows computed per version; matching
# scans the rows (~1.5 ns a row: 0.3 ms at 200,000) computed once per version for every reader
# (0.28 ms a batch at 200,000 groups). Small views are read many times per version (bench.read_load:
# 1,000 groups, ~16 reads a version): matching wins; large ones are not: the lookup wins.
KEYED_READ_ROWS = 50_000


def computed_rows(cursor: duckdb.DuckDBPyConnection, view: "ViewDef", states: list[Relation],
                  runs: computed.RunRows | None = None) -> computed.ViewRows:
    """The rows of a view without stored output over these state versions, computed once per version.

    Kept in the first state relation's cache (released with that version),
    keyed by the view and the very objects of the other states. With ``runs``
    (a view over one state relation, row by row: ivm/reads/computed.py) only
    the state's new runs are computed; otherwise ``cursor`` has every state
    registered under its scan name and the whole view is computed.
    """
    cached = computed_before(view, states)
    if cached is not None:
        return cached
    first, others = states[0], tuple(states[1:])
    try:
        rows = runs.rows(cursor, first) if runs is not None \
            else computed.ViewRows.whole(duck.arrow(cursor, view.read_text()))
    except duckdb.Error as e:  # e.g. an overflow computing an output column: as if the query hit it
        raise ExecutionError(duckdb_message(e)) from None
    first.remember(("computed", view.name, id(view)), (view, others, rows))
    return rows


def computed_before(view: "ViewDef", states: list[Relation]) -> computed.ViewRows | None:
    """The rows ``computed_rows`` kept for this view over these very state versions, or None."""
    first, others = states[0], tuple(states[1:])
    cached = first.cached(("computed", view.name, id(view)))
    if cached is not None and cached[0] is view and len(cached[1]) == len(others) \
            and all(a is b for a, b in zip(cached[1], others)):
        return cached[2]
    return None


def run_query(cursor: duckdb.DuckDBPyConnection, sql: str, timeout: float | None = None) -> pa.Table:
    """``sql`` on ``cursor`` as every read runs it: a timeout, a client's cancel, DuckDB's errors as ivm's."""
    # A stray interrupt that fires after the query ended is harmless: DuckDB clears it when the next query starts.
    timer = threading.Timer(timeout, cursor.interrupt) if timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        with cancel.running(cursor) as cancelled:
            if cancelled:
                raise StatementCancelledError(CANCELLED)
            return duck.arrow(cursor, sql)
    except duckdb.PermissionException as e:  # a file or URL (ivm/execute/duck.py): sql_frontend/access.py missed it
        raise AccessDeniedError(duckdb_message(e)) from None
    except duckdb.InterruptException:
        if cancel.requested():  # a client's cancel request (ivm/reads/cancel.py), not the timer
            raise StatementCancelledError(CANCELLED) from None
        raise StatementTimeoutError(f"statement cancelled after the statement timeout of {timeout:g} s "
                                    "(statement_timeout, ivm serve --statement-timeout); nothing changed") from None
    except duckdb.CatalogException as e:
        raise UnknownObjectError(duckdb_message(e)) from None
    except (duckdb.BinderException, duckdb.ParserException) as e:
        raise BindError(duckdb_message(e)) from None
    except duckdb.Error as e:
        raise ExecutionError(duckdb_message(e)) from None
    finally:
        if timer is not None:
            timer.cancel()


def failed_view_error(name: str, failed: str) -> ExecutionError:
    """The error of reading (or subscribing to) a view whose maintenance failed after an ack."""
    return ExecutionError(
        f"materialized view {name} failed while being maintained and is not readable: {failed} "
        "(its tables kept every change; DROP the view and create it again)"
    )


def failed_table_error(name: str, failed: str) -> ExecutionError:
    """The error of reading a table that stopped following its source (a PostgreSQL schema change ivm cannot follow)."""
    return ExecutionError(f"table {name} is not readable: {failed}")


CANCELLED = "canceling statement due to user request"  # PostgreSQL's words: clients show them


@dataclass
class Lease:
    """A pooled cursor and what is registered on it."""

    cursor: duckdb.DuckDBPyConnection
    registered: dict[str, object] = field(default_factory=dict)
    runner: duck.Runner | None = None


class Reader:
    def __init__(self, engine: Readable):
        self.engine = engine
        self._idle: list[Lease] = []
        self._lock = threading.Lock()
        self._closed = False
        self._computed_read: set[str] = set()  # views computed on read that were read since the last warm()
        self._computed_runs: dict[str, tuple[ViewDef, computed.RunRows | None]] = {}  # per view: its rows per run
        self.system = SystemRelations(engine.catalog)  # pg_catalog and information_schema
        self._coder = KeyCoder(self.run)  # key codes of point reads by a view's key (on pooled cursors)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for lease in idle:
            _close(lease.cursor)

    @contextlib.contextmanager
    def _lease(self) -> Iterator[Lease]:
        with self._lock:
            lease = self._idle.pop() if self._idle else None
        if lease is None:
            lease = Lease(self.engine.duck.cursor())
        try:
            yield lease
        finally:
            with self._lock:
                keep = not self._closed and len(self._idle) < IDLE_CURSORS
                if keep:
                    self._idle.append(lease)
            if not keep:
                _close(lease.cursor)

    def run(self, template: str, **inputs: pa.Table) -> pa.Table:
        """Run a SQL template over Arrow inputs on a pooled cursor (see duck.Runner)."""
        with self._lease() as lease:
            if lease.runner is None:
                lease.runner = duck.Runner(lease.cursor)
            try:
                return lease.runner.run(template, **inputs)
            except duckdb.Error as e:
                raise ExecutionError(duckdb_message(e)) from None

    def relations_in(self, expression: exp.Expression, system: frozenset[str] | dict = frozenset()) -> list[str]:
        """Catalog relations a query names (besides the ``system`` relations); unknown plain names are errors."""
        names = [name for name in _named_relations(expression) if name not in system]
        for name in names:
            if not self.engine.catalog.exists(name):
                raise UnknownObjectError(f"table or view {name} does not exist")
        return list(names)

    def register(self, cursor: duckdb.DuckDBPyConnection, registered: dict[str, object],
                 names: list[str], snapshot: Snapshot, note_reads: bool = True) -> None:
        """Make each named relation readable on this cursor as of ``snapshot``.

        ``registered`` remembers what each name holds on this cursor (the very
        object, not its id, so the comparison stays sound).
        """
        catalog = self.engine.catalog
        for name in names:
            definition = catalog.get(name)
            failed = self.engine.failed.get(name)
            if failed is not None:
                raise failed_view_error(name, failed) if definition.kind == "view" else failed_table_error(name, failed)
            if _computed_on_read(definition, snapshot):
                self._register_computed(cursor, registered, definition, snapshot)
                if note_reads:
                    self._note_read(name)
                continue
            relation = snapshot[name]  # stored, or kept while its state is stale (ivm/maintain/recompute.py)
            previous = registered.get(name)
            if previous is relation:
                continue
            if previous is not None and not isinstance(previous, (Relation, computed.ViewRows)):
                cursor.execute(f"DROP VIEW IF EXISTS {quote(name)}")  # it was computed on read over its state
            cursor.register(name, visible(relation, not definition.is_set))
            registered[name] = relation

    def warm(self, snapshot: Snapshot) -> None:
        """Compute the rows of ``snapshot``'s views computed on read that were read since the last warm().

        The writer calls this just before it publishes ``snapshot``: the rows
        are then ready (``computed_rows`` keeps them with the state versions)
        when the first read of the new version arrives, instead of that read
        paying for them (~3 ms for 1,000 groups; with lookups at 150/s and a
        batch every 100 ms, one lookup in fifteen did, which set their p99).
        Views nobody read since the previous batch are not computed.
        """
        with self._lock:
            names, self._computed_read = self._computed_read, set()
        views = [self.engine.catalog.views.get(name) for name in sorted(names)]
        views = [v for v in views if v is not None and v.name not in self.engine.failed
                 and _computed_on_read(v, snapshot)]
        if not views:
            return
        with self._lease() as lease:
            for view in views:
                try:
                    # Computed, not registered on this cursor: point and whole reads answer from the
                    # rows without a cursor, and a cursor that runs DuckDB registers them when it does.
                    self._computed(lease.cursor, lease.registered, view, _states(view, snapshot))
                except (IvmError, duckdb.Error):
                    pass  # e.g. an overflow computing a column: the read that needs the rows reports it

    def _note_read(self, name: str) -> None:
        """A client read the view computed on read ``name``: the writer computes its next version's rows (warm)."""
        if name not in self._computed_read:
            with self._lock:
                self._computed_read.add(name)

    def _register_computed(self, cursor: duckdb.DuckDBPyConnection, registered: dict[str, object],
                           view: "ViewDef", snapshot: Snapshot) -> None:
        """A view without stored output: its rows computed from its operator state.

        Small states: the rows are computed once per state version and kept
        with that version (``computed_rows``), so the reads between two
        changes (e.g. lookups while ingesting) scan a plain table instead of
        planning the view's expressions again on every read: a 1-row lookup
        in a 1,000-group aggregate took 1.1 ms of DuckDB CPU over the state,
        0.56 ms over the computed rows. Large states: a DuckDB view over the
        state, so a selective read does not pay for computing every row.
        """
        states = _states(view, snapshot)
        previous = registered.get(view.name)
        rows = self._computed(cursor, registered, view, states)
        if rows is not None:
            if previous is not rows:
                if previous is view:
                    cursor.execute(f"DROP VIEW IF EXISTS {quote(view.name)}")  # a registration cannot replace it
                cursor.register(view.name, rows.table())  # replaces a previous registration
                registered[view.name] = rows
            return
        _register_states(cursor, registered, states)
        if previous is not view:
            if previous is not None:
                cursor.unregister(view.name)
            cursor.execute(f"CREATE OR REPLACE TEMP VIEW {quote(view.name)} AS {view.read_text()}")
            registered[view.name] = view

    def _computed(self, cursor: duckdb.DuckDBPyConnection, registered: dict[str, object], view: "ViewDef",
                  states: list[Relation]) -> computed.ViewRows | None:
        """The view's rows over these state versions, kept with them, when the states are small
        (COMPUTE_ONCE_ROWS); None for large states (read through a DuckDB view over them)."""
        if sum(relation.num_rows for relation in states) > COMPUTE_ONCE_ROWS:
            return None
        runs = self._run_rows(view)
        if runs is None:
            _register_states(cursor, registered, states)
        return computed_rows(cursor, view, states, runs)

    def _run_rows(self, view: "ViewDef") -> computed.RunRows | None:
        """The view's rows kept per run of its state (ivm/reads/computed.py), or None when they are computed whole."""
        with self._lock:
            known = self._computed_runs.get(view.name)
            if known is not None and known[0] is view:
                return known[1]
        select, scans = view.read_sql()
        runs = computed.run_rows(select, scan_name(next(iter(scans)))) if len(scans) == 1 else None
        with self._lock:
            views = self.engine.catalog.views
            for name in [n for n, (v, _) in self._computed_runs.items() if views.get(n) is not v]:
                del self._computed_runs[name]  # dropped or replaced views
            self._computed_runs[view.name] = (view, runs)
        return runs

    def query(self, sql: str | Callable[[], str], expression: exp.Expression, snapshot: Snapshot | None = None,
              values: list[pa.Scalar] | None = None, internal: bool = False,
              timeout: float | None = None) -> pa.Table:
        """Run ``sql`` (parsed: ``expression``) on one snapshot.

        ``internal``: the engine's own read (a checkpoint, a view's first
        rows, a recompute), which does not make the writer ``warm()`` the
        views it reads for the next version: only clients' reads do.

        ``values``: ``sql`` is the template ``expression`` (``$n``
        placeholders) with these parameter values spliced in; a point read
        of that shape is then answered from the Arrow rows (ivm/reads/point_reads.py),
        and ``sql`` may be a function rendering it, called only if DuckDB runs it.

        ``timeout``: seconds DuckDB may run it (a client's statement timeout);
        past them the query is interrupted and StatementTimeoutError raised.
        """
        if snapshot is None:
            self.engine.wait_visible()  # read your writes: every acknowledged change
            snapshot = self.engine.store.snapshot
        if time_windows_in(expression):  # TUMBLE/HOP in FROM: the same expansion views get
            expression, values = expand_time_windows(expression, self.engine.catalog.schema()), None
            sql = expression.sql("duckdb")
        system: dict[str, pa.Table] = {}
        if reads_system(expression):  # pg_catalog, information_schema, a schema-qualified name, PostgreSQL syntax
            expression, system = self.system.prepare(expression)
            sql, values = expression.sql("duckdb"), None
        names = self.relations_in(expression, system)
        point = point_reads.shape(expression)
        if point is not None and point.table not in names:  # a system relation (pg_catalog, ...)
            point = None
        if point is not None and values is None:  # a query without parameters: only a whole read
            point, values = (None, None) if point.equalities else (point, [])
        table = self._arrow_answer(point, expression, values, snapshot, not internal) if point is not None else None
        if table is not None:
            return _with_offset(table, snapshot)
        with self._lease() as lease:
            self.register(lease.cursor, lease.registered, names, snapshot, note_reads=not internal)
            for name, rows in system.items():
                if lease.registered.get(name) is not rows:
                    lease.cursor.register(name, rows)
                    lease.registered[name] = rows
            table = self._point_read(lease, point, expression, values) if point is not None else None
            if table is None:
                table = run_query(lease.cursor, sql() if callable(sql) else sql, timeout)
                if point is not None:
                    self._remember_schema(lease, point, expression, table.schema, snapshot)
        return _with_offset(table, snapshot)

    def _arrow_answer(self, point: point_reads.Shape, expression: exp.Expression, values: list[pa.Scalar],
                      snapshot: Snapshot, note_read: bool) -> pa.Table | None:
        """A point or whole read answered from the snapshot's Arrow rows without a cursor, so
        nothing is registered on one (a cursor registers a relation again after every change,
        which under writes was a large part of a read's CPU). None when only DuckDB can answer
        it yet: the first read of this template and input schema (it learns the result
        schema), a computed view whose rows this version has not computed, a failed relation
        (the cursor's path raises its error)."""
        name = point.table
        if name in self.engine.failed:
            return None
        definition = self.engine.catalog.get(name)
        if _computed_on_read(definition, snapshot):
            keyed = self._keyed_answer(point, expression, definition, snapshot, values)
            if keyed is not None:
                return keyed
            rows = computed_before(definition, _states(definition, snapshot))
            if note_read:
                self._note_read(name)
        else:
            rows = visible(snapshot[name], not definition.is_set)
        return _known_answer(point, expression, rows, values)

    def _keyed_answer(self, point: point_reads.Shape, expression: exp.Expression, view: ViewDef,
                      snapshot: Snapshot, values: list[pa.Scalar]) -> pa.Table | None:
        """A point read of a computed view by columns that are its state's index key, answered from the
        state rows of that key: one index lookup and the view's projection of the rows found, however
        many rows the view has (a scan of its rows was ~19 ms at 1M groups). None: not this shape, or a
        state below KEYED_READ_ROWS.

        The read need not make the next version's rows computed (``_note_read``): it reads none of them."""
        if not point.equalities:
            return None
        runs = self._run_rows(view)
        if runs is None:
            return None
        state = _states(view, snapshot)[0]
        if state.num_rows < KEYED_READ_ROWS:
            return None
        wanted = {}  # state column -> the parameter's value
        for column, number in point.equalities:
            source = runs.plain_sources.get(column)
            if source is None or not 1 <= number <= len(values):
                continue
            wanted[source] = values[number - 1]
        key = next((k for k in state.index_keys if k and set(k) <= set(wanted)), None)
        if key is None:
            return None
        probe = {}
        for column in key:
            value, target = wanted[column], state.schema.field(column).type
            if not point_reads.comparable(value, target):
                return None  # DuckDB compares it (NULL, a float, a date...)
            try:
                probe[column] = pa.array([value.as_py()], target)
            except (pa.ArrowInvalid, OverflowError):
                return None  # outside the column's type: DuckDB says what matches
        found = state.lookup(key, self._coder.codes(pa.table(probe), list(key)), scan=False)
        try:
            with self._lease() as lease:
                rows = runs.project(lease.cursor, found).rows
        except duckdb.Error:
            return None  # e.g. an overflow computing a column: the read's usual path reports it
        return _known_answer(point, expression, rows, values)

    def _input(self, lease: Lease, name: str) -> pa.Table | computed.ViewRows | None:
        """The Arrow rows registered for ``name`` on this cursor (None: a DuckDB view over large state)."""
        registered = lease.registered.get(name)
        if isinstance(registered, Relation):
            return visible(registered, not self.engine.catalog.get(name).is_set)  # cached: the registered table
        return registered if isinstance(registered, computed.ViewRows) else None

    def _point_read(self, lease: Lease, point: point_reads.Shape, expression: exp.Expression,
                    values: list[pa.Scalar]) -> pa.Table | None:
        """The point read answered from Arrow, when DuckDB's result schema for this input is known and matches."""
        return _known_answer(point, expression, self._input(lease, point.table), values)

    def _remember_schema(self, lease: Lease, point: point_reads.Shape, expression: exp.Expression,
                         schema: pa.Schema, snapshot: Snapshot) -> None:
        rows = self._input(lease, point.table)
        input_schema = rows.schema if rows is not None else self._computed_schema(lease, point.table, snapshot)
        if input_schema is not None:
            _point_schemas(expression)[input_schema] = schema.remove_metadata()

    def _computed_schema(self, lease: Lease, name: str, snapshot: Snapshot) -> pa.Schema | None:
        """The schema of a computed view's rows as projected from its state (what ``_keyed_answer``
        answers over), for a view read through DuckDB over its large state; None for anything else."""
        definition = self.engine.catalog.get(name)
        if not (isinstance(definition, ViewDef) and _computed_on_read(definition, snapshot)):
            return None
        runs = self._run_rows(definition)
        if runs is None:
            return None
        return runs.rows_schema(lease.cursor, _states(definition, snapshot)[0].schema)


def _with_offset(table: pa.Table, snapshot: Snapshot) -> pa.Table:
    """The result stamped with the change offset it reflects (clients check read-your-writes with it)."""
    metadata = dict(table.schema.metadata or {})
    metadata[OFFSET_METADATA] = str(snapshot.offset).encode()
    return table.replace_schema_metadata(metadata)


def _known_answer(point: point_reads.Shape, expression: exp.Expression,
                  rows: pa.Table | computed.ViewRows | None, values: list[pa.Scalar]) -> pa.Table | None:
    """``point_reads.answer`` over ``rows``, when DuckDB's result schema for this query and input schema is
    known and the answer has it; None: DuckDB answers."""
    if rows is None:
        return None
    known = _point_schemas(expression).get(rows.schema)
    if known is None:
        return None
    if isinstance(rows, computed.ViewRows):
        table = rows.answer(point, values)
    else:
        table = point_reads.answer(point, rows, values)
    return table if table is not None and table.schema.equals(known) else None


def _computed_on_read(definition: TableDef | ViewDef, snapshot: Snapshot) -> bool:
    """Whether reads compute this relation's rows from its operator state: a view without stored output,
    unless the snapshot holds its rows (its state is stale: ivm/maintain/recompute.py keeps them)."""
    return definition.kind == "view" and not definition.stored_output and definition.name not in snapshot


def _states(view: "ViewDef", snapshot: Snapshot) -> list[Relation]:
    """The versions in ``snapshot`` of the state relations a view's rows are computed from, in scan order."""
    _, scans = view.read_sql()
    return [snapshot[relation_name] for relation_name in sorted(scans)]


def _register_states(cursor: duckdb.DuckDBPyConnection, registered: dict[str, object], states: list[Relation]) -> None:
    """Each state relation readable on ``cursor`` under its scan name (what a view's read SQL scans)."""
    for relation in states:
        scan = scan_name(relation.name)
        if registered.get(scan) is not relation:
            cursor.register(scan, relation.table())
            registered[scan] = relation


def _point_schemas(expression: exp.Expression) -> SchemaMap[pa.Schema]:
    """DuckDB's result schema of this very query template per input schema (the fast path must match it).

    Per template, not per shape: DuckDB names a result column as the query
    spells it, so two templates of one shape may differ in their schemas.
    """
    # At most 16 input schemas (the oldest dropped): a table's schema changes only with DDL.
    return point_reads.per_tree(expression, "ivm.point_schemas", lambda _: SchemaMap(limit=16))


def time_windows_in(expression: exp.Expression) -> bool:
    """``has_time_windows``, kept in the tree's meta (a walk of the tree cost ~0.1 ms per prepared lookup)."""
    return point_reads.per_tree(expression, "ivm.time_windows", has_time_windows)


def _named_relations(expression: exp.Expression) -> tuple[str, ...]:
    """Plain table names a query reads (not its CTEs), in order; the tree is walked once."""
    return point_reads.per_tree(expression, "ivm.relations", _walk_relations)


def _walk_relations(expression: exp.Expression) -> tuple[str, ...]:
    ctes = {normalize_name(c.alias) for c in expression.find_all(exp.CTE)}
    names: list[str] = []
    for table in expression.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier) or table.args.get("db"):
            continue
        name = normalize_name(table.this)
        if name not in ctes and name not in names:
            names.append(name)
    return tuple(names)


def _close(cursor: duckdb.DuckDBPyConnection) -> None:
    try:
        cursor.close()
    except duckdb.Error:
        pass
