"""The public Python API: ``ivm.connect()`` returns a Database.

    db = ivm.connect()
    db.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DOUBLE)")
    db.execute("CREATE MATERIALIZED VIEW totals AS SELECT cust, SUM(amount) AS total FROM orders GROUP BY cust")
    db.execute("INSERT INTO orders VALUES (1, 7, 9.5)")      # -> rows affected
    offset = db.apply_changes("orders", changes)            # pyarrow data with an __op column
    db.sql("SELECT * FROM totals")                          # -> pyarrow.Table, always fresh

Statements are parsed once (``sql_frontend.statements``) and dispatched
here; INSERT, UPDATE and DELETE become change batches and go through exactly
the same path as ``apply_changes``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.errors import (BindError, CatalogError, ChangeError, IvmError, SqlSyntaxError, UnknownObjectError,
                                 UnsupportedError)
from sql_frontend.limits import check_size, too_complex
from sql_frontend.statements import (
    AlterTable,
    AlterView,
    CreateSource,
    CreateTable,
    CreateView,
    DropSource,
    RefreshSourceTable,
    RefreshView,
    Delete,
    Drop,
    Explain,
    Insert,
    Maintenance,
    Query,
    SetOption,
    Show,
    Statement,
    Update,
    parse,
    parse_one,
)
from sql_frontend.plan import Column
from ivm.reads import changefeed
from ivm.binder import quote
from ivm.reads.changefeed import ViewChanges
from ivm.catalog import TableDef
from ivm.ingest.changes import OP
from ivm.engine import Engine
from ivm.settings import Settings
from ivm.maintain.engine_choice import check_engine, describe as describe_engine
from ivm.maintain.maintenance import check_mode
from ivm.view_definition import define_view
from ivm.reads.reads import time_windows_in, visible
from ivm.reads.system_relations import reads_system
from ivm.maintain.recompute import is_stale
from ivm.reads.explain import explain_view
from ivm.reads.status import engine_status, status_table


MESSAGE_CHARS = 2000  # longest error message a statement gets back (DuckDB's may repeat the whole text)
ROWS = (Query, Explain, Show)  # statements that return rows
# SHOW SOURCES: a table, or a source made by CREATE SOURCE (Database._show_sources).
SOURCES_SCHEMA = pa.schema([
    pa.field("name", pa.string()),
    pa.field("type", pa.string()),  # "table" | "postgres"
    pa.field("written_by", pa.string()),  # a table's CREATE SOURCE source (NULL: written by clients only)
    pa.field("status", pa.string()),  # a source's phase ("snapshot", "streaming"…) or "failed: why"; a table's
    # "failed: why" when it stopped following its source (an upstream schema change ivm cannot follow), else NULL
    pa.field("rows", pa.int64()),  # a table's rows now; NULL for a source
    # Added later, so after the columns clients already read by position; NULL for a table:
    pa.field("state", pa.string()),  # snapshotting | streaming | failed | stopped
    pa.field("slot", pa.string()),  # the replication slot upstream
    pa.field("confirmed_lsn", pa.string()),  # confirmed upstream: everything before it is applied here
    pa.field("lag_bytes", pa.int64()),  # WAL upstream not applied yet (failed/stopped: as PostgreSQL says; NULL: unknown)
    pa.field("lag_seconds", pa.float64()),  # age of the oldest upstream commit not applied yet (NULL: unknown)
    pa.field("rows_applied", pa.int64()),  # rows applied, snapshot included
    pa.field("last_error", pa.string()),  # why it failed (NULL: it did not)
    pa.field("warning", pa.string()),  # failed/stopped past its wal_warning_seconds: its slot holds WAL upstream
])


def _statement_errors(method: Callable) -> Callable:
    """Run a statement method so that every failure is a clear IvmError of bounded size.

    A statement that runs out of Python recursion somewhere between parse
    and DuckDB (a shape sql_frontend/limits.py's scan does not see) is a
    TooComplexError, never an internal error; an error message that repeats
    a long statement is cut to MESSAGE_CHARS.
    """

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RecursionError as e:
            raise too_complex(e) from None
        except IvmError as e:
            message = str(e)
            if len(message) <= MESSAGE_CHARS:
                raise
            raise type(e)(f"{message[:MESSAGE_CHARS]}… (message cut: {len(message)} characters)") from None

    return run


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    kind: str  # "table" | "view"
    schema: pa.Schema  # the columns users see (no weight)
    primary_key: tuple[str, ...] = ()


class Database:
    """An ivm database. Thread-safe: writes serialize, reads run concurrently."""

    def __init__(self, path: str | os.PathLike | None = None, **options: Any):
        unknown = set(options) - {f.name for f in fields(Settings)}
        if unknown:
            raise TypeError(f"unknown option(s) for ivm.connect: {', '.join(sorted(unknown))}")
        settings = Settings(**options)
        check_mode(settings.maintenance)  # before a durable directory is touched
        self.path = None if path is None else str(path)
        _check_limits(settings)
        if not isinstance(settings.ingest_nice, int) or not 0 <= settings.ingest_nice <= 19:
            raise ValueError(f"ingest_nice must be an integer from 0 to 19, not {settings.ingest_nice!r}")
        if path is None:
            self._engine = Engine(settings)
            self._engine.start_committer()
        else:
            from ivm.durable.durable import DurableEngine

            self._engine = DurableEngine(path, settings)
        self._sources = None
        if path is not None and (Path(path) / "sources").is_dir():
            self._cdc().resume()

    # --- lifecycle ------------------------------------------------------------
    def _cdc(self):
        """The CDC sources running inside this database (ivm/cdc/sources.py)."""
        if self._sources is None:
            from ivm.cdc.sources import Sources

            self._sources = Sources(self)
        return self._sources

    def close(self) -> None:
        if self._sources is not None:
            self._sources.close()
        if not self._engine.closed:
            self._engine.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._engine.closed:
            raise IvmError("the database is closed")

    @property
    def offset(self) -> int:
        """Offset of the last change visible to reads (every acknowledged one: this waits like a read)."""
        self._engine.wait_visible()
        return self._engine.store.snapshot.offset

    @property
    def version(self) -> int:
        """Changes whenever anything visible changes (data or catalog)."""
        return self._engine.store.version

    @property
    def catalog_version(self) -> int:
        """Changes whenever a table or view is created or dropped."""
        return self._engine.catalog.version

    # --- for protocol layers (the Flight server) ------------------------------------
    @_statement_errors
    def is_query(self, sql: str) -> bool:
        """True when ``sql`` is one statement that returns rows (SELECT, EXPLAIN, SHOW).

        Several statements are never a query (they go to ``execute``, which
        refuses a script that holds one).
        """
        statements = self._parse(sql)
        return len(statements) == 1 and isinstance(statements[0], ROWS)

    @_statement_errors
    def result_schema(self, sql: str) -> pa.Schema:
        """The Arrow schema of a query's result, found without running it."""
        self._check_open()
        self._check_size(sql)
        statement = parse_one(sql)
        if not isinstance(statement, Query):
            raise UnsupportedError("only a SELECT has a result schema before it runs")
        if reads_system(statement.expression):  # the binder has no catalog relations; they are small: run it
            return self._engine.reader.query(statement.sql, statement.expression).schema.remove_metadata()
        columns = self._engine.binder.describe(statement.sql)
        return self._engine.binder.arrow_schema(columns)

    @_statement_errors
    def bound_query(self, template: str, text: str | Callable[[], str],
                    values: list[pa.Scalar] | None = None) -> pa.Table:
        """Run ``text``: the query ``template`` (``$n`` parameters) with literal values in their place.

        Prepared statements run the same template with new values many times;
        the tables a query reads do not depend on the values, so the template
        is parsed once and the bound text goes straight to the engine instead
        of being parsed again on every execution. Anything but a single query
        takes the ordinary path. ``values`` (``$n`` is ``values[n - 1]``, the
        very values spliced into ``text``) let a point read
        (``... WHERE key = $1``) be answered without DuckDB (ivm/reads/point_reads.py);
        ``text`` may then be a function that renders it, called only if
        DuckDB runs it (rendering the literals was ~40% of a point read).
        """
        self._check_open()
        self._check_size(template)
        reads = _parsed_reads(template)
        # TUMBLE/HOP expand the parsed tree, and a catalog query is rewritten (ivm/reads/system_relations.py); the tree
        # holds $n, not the values: those take the ordinary path.
        if reads is None or len(reads) != 1 or time_windows_in(reads[0].expression) \
                or reads_system(reads[0].expression):
            return self.sql(text() if callable(text) else text)
        return self._engine.reader.query(text, reads[0].expression, values=values, timeout=self._timeout)

    def objects(self) -> list[ObjectInfo]:
        """Every table and materialized view, with its Arrow schema and key."""
        self._check_open()
        catalog = self._engine.catalog
        found = []
        for definition in catalog.visible_tables() + list(catalog.views.values()):
            key = definition.primary_key if isinstance(definition, TableDef) else ()
            found.append(ObjectInfo(definition.name, definition.kind,
                                    self._engine.binder.arrow_schema(definition.columns), key))
        return sorted(found, key=lambda o: o.name)

    # --- statements ---------------------------------------------------------------
    @_statement_errors
    def execute(self, sql: str) -> int:
        """Run one statement, or a script of statements none of which returns rows.

        Returns the rows affected by the last statement (0 for DDL; a query's
        row count when ``sql`` is one query). A script that holds a query
        (SELECT, EXPLAIN, SHOW) beside other statements is refused before
        anything runs: its rows would be lost (run it with ``sql()``).
        Statements of a script run in order, each committing on its own.
        """
        self._check_open()
        statements = self._parse(sql)
        if len(statements) > 1:
            _refuse_queries(statements, "execute")
        count = 0
        for statement in statements:
            count, _ = self._run(statement)
        return count

    @_statement_errors
    def executescript(self, sql: str) -> int:
        """Run a script of ';'-separated statements that return no rows, in order; return the rows they affected.

        A query in the script is refused before anything runs (``sql()``
        returns rows). Each statement commits on its own: when one fails, the
        ones before it stay applied and the ones after it do not run.
        """
        self._check_open()
        statements = self._parse(sql)
        _refuse_queries(statements, "executescript")
        return sum(self._run(statement)[0] for statement in statements)

    @_statement_errors
    def sql(self, sql: str) -> pa.Table:
        """Run one statement; return its result as a pyarrow Table.

        Queries return their rows; other statements return one row with the
        number of rows they affected. Several statements are refused before
        anything runs (use ``executescript``).
        """
        self._check_open()
        self._check_size(sql)
        statements = _parse_reads(sql)
        if len(statements) != 1:
            raise SqlSyntaxError(f"sql() runs one statement; this text holds {len(statements)} "
                                 "(run scripts with executescript, queries one at a time)")
        count, table = self._run(statements[0])
        return table if table is not None else pa.table({"rows_affected": pa.array([count], pa.int64())})

    @property
    def _timeout(self) -> float | None:
        return self._engine.settings.statement_timeout

    def _check_size(self, sql: str) -> None:
        check_size(sql, self._engine.settings.max_statement_bytes)

    def _parse(self, sql: str) -> list[Statement]:
        self._check_size(sql)
        return parse(sql)

    def apply_changes(self, table: str, changes: Any, *, on_missing_delete: str | None = None,
                      source: str | None = None, seq: int | None = None) -> int:
        """Apply a change batch (with an optional ``__op`` column); return its offset.

        With ``source`` and ``seq`` the producer is idempotent: a batch whose
        (source, seq) was applied before is not applied again, and its
        original offset is returned. In a durable database the offset is
        returned once the batch is on disk.
        """
        self._check_open()
        return self._engine.ingest(table.lower(), changes, on_missing_delete, source, seq)

    def apply_batch(self, changes: Mapping[str, Any] | Sequence[tuple[str, Any]], *,
                    on_missing_delete: str | None = None) -> int:
        """Apply change batches of several tables atomically, as one offset; return it.

        ``changes`` maps each table to its batch (as for ``apply_changes``, with
        an optional ``__op`` column); each table appears once. Readers see all
        of them or none, and every view is maintained once for the whole batch
        (a refresh touching six tables costs one maintenance step per view, not
        six). A bad batch of any table fails the call and changes nothing.
        In-memory databases only, for now.
        """
        self._check_open()
        items = list(changes.items()) if isinstance(changes, Mapping) else [tuple(c) for c in changes]
        if not items:
            raise ChangeError("apply_batch needs at least one table's changes")
        tables = [str(table).lower() for table, _ in items]
        repeated = sorted({t for t in tables if tables.count(t) > 1})
        if repeated:
            raise ChangeError(f"apply_batch: each table appears once; repeated: {', '.join(repeated)}")
        return self._engine.ingest_batch(list(zip(tables, (data for _, data in items))), on_missing_delete)

    def table_definition(self, table: str) -> TableDef:
        """A table's definition (columns, key, options); an unknown name is an error naming it."""
        self._check_open()
        return self._engine.catalog.table(table.lower())

    def kind_of(self, name: str) -> str | None:
        """'table', 'view' or None (no such relation)."""
        self._check_open()
        catalog = self._engine.catalog
        name = name.lower()
        return "view" if name in catalog.views else "table" if catalog.exists(name) else None

    def producer_position(self, source: str) -> tuple | None:
        """The last (seq, offset) a producer ``source`` applied (None: nothing yet): where it resumes."""
        self._check_open()
        return self._engine.producers.last().get(source)

    def table_columns(self, table: str) -> list[tuple[str, str]]:
        """A table's columns now: (name, DuckDB type) each, in order."""
        self._check_open()
        return [(c.name, c.type) for c in self._engine.catalog.table(table.lower()).columns]

    def views_reading(self, table: str, column: str) -> list[str]:
        """The materialized views that read ``column`` of ``table`` directly (a view whose columns read are not
        known counts): those a DROP COLUMN would break (ivm/cdc/stream.py checks before it alters anything)."""
        self._check_open()
        catalog = self._engine.catalog
        return [name for name in catalog.readers(table.lower())
                if (reads := catalog.views[name].reads(table.lower())) is None or column.lower() in reads]

    def table_rows(self, table: str) -> pa.Table:
        """Every row ``table`` holds once every acknowledged change is visible (a row held twice, twice), also
        while it is failed (``fail_table``): the rows ALTER SOURCE … REFRESH TABLE replaces."""
        self._check_open()
        engine = self._engine
        definition = engine.catalog.table(table.lower())
        engine.wait_visible()
        return visible(engine.store.snapshot[definition.name], not definition.is_set)

    def fail_table(self, table: str, reason: str) -> None:
        """Mark ``table`` as no longer following its source, with why: reads of it and of the views over
        it raise ``reason`` (ivm/cdc/stream.py, for an upstream schema change ivm cannot follow)."""
        self._check_open()
        self._engine.fail_table(table.lower(), reason)

    def recover_table(self, table: str) -> None:
        """Undo ``fail_table``, durably: DROP SOURCE (the table no longer follows anything; it keeps its rows),
        or ALTER SOURCE … REFRESH TABLE (its rows were loaded again from upstream)."""
        self._check_open()
        self._engine.recover_table(table.lower())

    def status(self) -> dict:
        """Offsets, lags and sizes: the database's and, under "relations", each relation's."""
        self._check_open()
        return engine_status(self._engine)

    def observations(self) -> dict:
        """Latencies and counts recorded since the database was opened (ivm/reads/observations.py):
        under "histograms" each histogram's ``HistogramCounts`` (batch, fold, visible,
        checkpoint seconds), under "ingested" per table (batches, rows) acknowledged."""
        self._check_open()
        observed = self._engine.observed
        return {"histograms": observed.histograms(), "ingested": observed.ingested()}

    def checkpoint(self) -> int:
        """Store everything acknowledged now (durable databases); return the stored offset."""
        self._check_open()
        return self._durable("CHECKPOINT").checkpoint()

    def compact(self) -> dict:
        """Checkpoint, keep the latest change per key in the retained log, drop unneeded files."""
        self._check_open()
        return self._durable("COMPACT").compact()

    def stored_files(self, name: str) -> list[str]:
        """Parquet files of the stored version of a table or view (what other engines read)."""
        self._check_open()
        self._engine.catalog.get(name.lower())
        return self._durable("stored_files").checkpointer.files_of(name.lower())

    def _durable(self, what: str):
        from ivm.durable.durable import DurableEngine

        if not isinstance(self._engine, DurableEngine):
            raise UnsupportedError(f"{what} needs a durable database (ivm.connect(path)); this one is in memory")
        return self._engine

    def changes(self, view: str, since: int, *, wait: float = 0.0) -> ViewChanges:
        """Changes of a materialized view or a table after offset ``since`` (see ivm/reads/changefeed.py).

        Returns ``ViewChanges(rows, through)``: ``rows`` has its columns,
        ``__weight`` and ``__offset``; every change up to offset ``through`` is
        included, so the next call starts from ``through``. When there is none,
        waits up to ``wait`` seconds for one. An offset older than the retained
        history raises OffsetError: read it again and continue from the
        ``ivm.offset`` of that read.
        """
        self._check_open()
        return changefeed.read(self._engine, view.lower(), since, wait)

    def _run(self, statement: Statement) -> tuple[int, pa.Table | None]:
        engine = self._engine
        if isinstance(statement, Query):
            table = engine.reader.query(statement.sql, statement.expression, timeout=self._timeout)
            return table.num_rows, table
        if isinstance(statement, CreateTable):
            return self._create_table(statement), None
        if isinstance(statement, CreateView):
            engine.create_view(statement)
            return 0, None
        if isinstance(statement, Drop):
            engine.drop(statement)
            return 0, None
        if isinstance(statement, Insert):
            return self._change(statement.table, self._insert_batch(statement)), None
        if isinstance(statement, Update):
            return self._change(statement.table, self._update_batch(statement)), None
        if isinstance(statement, Delete):
            return self._change(statement.table, self._delete_batch(statement)), None
        if isinstance(statement, Explain):
            lines = self._explain(statement)
            return 0, pa.table({"explain": pa.array(lines, pa.string())})
        if isinstance(statement, Show):
            if statement.what == "status":
                return 0, status_table(engine_status(engine))
            if statement.what == "create":
                return 0, self._show_create(statement.extra["name"])
            if statement.what == "sources":
                return 0, self._show_sources()
            return 0, self._show(statement)
        if isinstance(statement, Maintenance):
            if statement.what == "checkpoint":
                offset = self.checkpoint()
                return 0, pa.table({"offset": pa.array([offset], pa.int64())})
            result = self.compact()
            return 0, pa.table({k: [v] for k, v in result.items()})
        if isinstance(statement, CreateSource):
            self._cdc().create(statement.name, statement.connection, statement.publication, statement.slot,
                               statement.options)
            return 0, None
        if isinstance(statement, DropSource):
            self._cdc().drop(statement.name)
            return 0, None
        if isinstance(statement, RefreshSourceTable):
            self._cdc().refresh(statement.source, statement.table)
            return 0, None
        if isinstance(statement, SetOption):
            return self._set(statement), None
        if isinstance(statement, AlterView):
            engine.alter_view(statement)
            return 0, None
        if isinstance(statement, AlterTable):
            engine.alter_table(statement)
            return 0, None
        if isinstance(statement, RefreshView):  # a no-op: the view is always fresh (sql_frontend/statements.py)
            if engine.catalog.get(statement.name).kind != "view":
                raise CatalogError(f'"{statement.name}" is not a materialized view')
            return 0, None
        raise UnsupportedError(f"statement {type(statement).__name__} is not supported")

    def _set(self, stmt: SetOption) -> int:
        if stmt.name != "ivm.engine":
            raise UnsupportedError(f"unknown setting {stmt.name} (settable: ivm.engine)")
        engine = check_engine(stmt.value, "ivm.engine")
        with self._engine.write_lock:  # takes effect from the next maintenance step
            self._engine.settings.engine = engine
        return 0

    # --- DDL ------------------------------------------------------------------------
    def _create_table(self, stmt: CreateTable) -> int:
        engine = self._engine
        if stmt.as_query is None:
            engine.create_table(stmt)
            return 0
        with engine.write_lock:
            rows = engine.reader.query(stmt.as_query.sql("duckdb"), stmt.as_query, timeout=self._timeout)
            types = engine.binder.describe(stmt.as_query.sql("duckdb"))
            columns = tuple(Column(c.name.lower(), c.type) for c in types)
            if not engine.create_table(stmt, columns):
                return 0
            if rows.num_rows == 0:
                return 0
            engine.ingest(stmt.name, rows.rename_columns([c.name for c in columns]))
            return rows.num_rows

    # --- DML -> change batches ----------------------------------------------------------
    def _change(self, table: str, batch: pa.Table) -> int:
        if batch.num_rows == 0:
            self._engine.catalog.table(table)  # still report unknown tables
            return 0
        self._engine.ingest(table, batch)
        ops = batch.column(OP)
        # An UPDATE that moves a key is sent as a delete and an insert per row.
        return int(batch.num_rows - pc.sum(pc.equal(ops, "d")).as_py() if _is_moving_update(batch) else batch.num_rows)

    def _table(self, name: str) -> TableDef:
        return self._engine.catalog.table(name)

    def _changeable(self, name: str, statement: str) -> TableDef:
        """A table UPDATE/DELETE may change: not an APPEND ONLY one (even when no row matches)."""
        table = self._table(name)
        if table.append_only:
            raise ChangeError(f"table {name} is APPEND ONLY: {statement} is not allowed, only INSERT")
        return table

    def _insert_batch(self, stmt: Insert) -> pa.Table:
        table = self._table(stmt.table)
        values = self._engine.reader.query(stmt.query.sql("duckdb"), stmt.query, timeout=self._timeout)
        targets = list(stmt.columns) if stmt.columns is not None else list(table.column_names)
        unknown = [c for c in targets if c not in table.column_names]
        if unknown:
            raise UnknownObjectError(f"table {table.name} has no column {', '.join(unknown)}")
        if len(set(targets)) != len(targets):
            raise BindError("a column is named twice in the INSERT column list")
        if values.num_columns != len(targets):
            raise BindError(
                f"INSERT into {table.name} gives {values.num_columns} values for {len(targets)} columns"
            )
        n = values.num_rows
        columns: dict[str, Any] = {}
        for c in table.columns:
            if c.name in targets:
                columns[c.name] = values.column(targets.index(c.name))
            else:
                columns[c.name] = self._default(table, c, n)
        columns[OP] = pa.repeat(pa.scalar("r" if stmt.replace else "c"), n)
        return pa.table(columns)

    def _default(self, table: TableDef, column: Column, n: int) -> pa.Array:
        default = table.defaults.get(column.name)
        if default is None:
            return pa.nulls(n)
        value = self._engine.reader.query(
            f"SELECT CAST({default.sql('duckdb')} AS {column.type}) AS v", exp.select("1")
        ).column(0)[0]
        return pa.repeat(value, n)

    def _update_batch(self, stmt: Update) -> pa.Table:
        table = self._changeable(stmt.table, "UPDATE")
        assigned = dict(stmt.assignments)
        unknown = [c for c in assigned if c not in table.column_names]
        if unknown:
            raise UnknownObjectError(f"table {table.name} has no column {', '.join(unknown)}")
        news = [
            f"{assigned[c].sql('duckdb')} AS {quote(c)}" if c in assigned else f"{quote(c)}"
            for c in table.column_names
        ]
        olds = [f"{quote(c)} AS {quote('__old_' + c)}" for c in table.column_names]
        where = f" WHERE {stmt.where.sql('duckdb')}" if stmt.where is not None else ""
        sql = f"SELECT {', '.join(news + olds)} FROM {quote(table.name)}{where}"
        rows = self._query_on_table(sql, stmt, table.name)
        names = list(table.column_names)
        new_rows = rows.select(names)
        old_rows = rows.select(["__old_" + c for c in names]).rename_columns(names)
        moves_key = not table.primary_key or any(k in assigned for k in table.primary_key)
        if not moves_key:
            return new_rows.append_column(OP, pa.repeat(pa.scalar("u"), rows.num_rows))
        deletes = old_rows.append_column(OP, pa.repeat(pa.scalar("d"), rows.num_rows))
        inserts = new_rows.append_column(OP, pa.repeat(pa.scalar("c"), rows.num_rows))
        batch = pa.concat_tables([deletes, inserts.cast(deletes.schema)])
        return batch.replace_schema_metadata({b"ivm.update": b"moving"})

    def _delete_batch(self, stmt: Delete) -> pa.Table:
        table = self._changeable(stmt.table, "DELETE")
        where = f" WHERE {stmt.where.sql('duckdb')}" if stmt.where is not None else ""
        cols = table.primary_key or table.column_names
        sql = f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table.name)}{where}"
        rows = self._query_on_table(sql, stmt, table.name)
        return rows.append_column(OP, pa.repeat(pa.scalar("d"), rows.num_rows))

    def _query_on_table(self, sql: str, stmt: Update | Delete, table: str) -> pa.Table:
        parsed = parse(sql)[0]
        assert isinstance(parsed, Query)
        return self._engine.reader.query(sql, parsed.expression, timeout=self._timeout)

    # --- EXPLAIN / SHOW ----------------------------------------------------------------
    def _explain(self, stmt: Explain) -> list[str]:
        engine = self._engine
        if stmt.view is not None:
            definition = engine.catalog.get(stmt.view)
            if definition.kind != "view":
                raise CatalogError(f"{stmt.view} is a table; EXPLAIN takes a materialized view or a SELECT")
            view = definition
        else:
            query = stmt.create.query if stmt.create is not None else stmt.query.expression
            name = stmt.create.name if stmt.create is not None else "query"
            names = stmt.create.column_names if stmt.create is not None else None
            late, emit = (stmt.create.late, stmt.create.emit) if stmt.create is not None else (None, None)
            view = define_view(name, query.sql("duckdb"), query, engine.catalog, column_names=names, late=late,
                               emit=emit)
        programs = {
            source: view.program(frozenset([source]), engine.stored_new(frozenset([source])))
            for source in view.sources
        }
        lines = explain_view(view.name, view.plan, view.states, programs, self._engine_text(stmt, view),
                             engine.step_status)
        mode = engine.settings.maintenance
        if stmt.view is None:
            return lines + [f"maintenance: {'cost-based per batch' if mode == 'auto' else 'forced ' + mode}"]
        return lines + [view.cost.describe(mode, is_stale(engine.store.snapshot, view.name))]

    def _engine_text(self, stmt: Explain, view) -> str:
        engine = self._engine
        setting = (stmt.create.engine if stmt.create is not None else view.engine) or engine.settings.engine
        text = describe_engine(setting, engine.settings.spark_rows)
        used = engine.engine_used.get(view.name) if stmt.view is not None else None
        return f"{text}; last step ran on {used}" if used else text

    def _show_create(self, name: str) -> pa.Table:
        """SHOW CREATE MATERIALIZED VIEW: the view's name and a statement that creates it (its SELECT as stored)."""
        definition = self._engine.catalog.get(name)
        if definition.kind != "view":
            raise CatalogError(f"{name} is a table, not a materialized view")
        return pa.table({"name": [name], "create_sql": [f"CREATE MATERIALIZED VIEW {quote(name)} AS {definition.sql}"]})

    def _show_sources(self) -> pa.Table:
        """SHOW SOURCES: what ivm reads changes from, one row each (see SOURCES_SCHEMA).

        Every table is a source (INSERT/UPDATE/DELETE, COPY, ``apply_changes``,
        Flight ingest and Debezium write it); ``written_by`` names the
        CREATE SOURCE source that replicates into it, if one does. A source
        made by CREATE SOURCE (or ``ivm replicate``) is a row of type
        ``postgres`` with its state (ivm/cdc/postgres.py ``sources_status``);
        it has no rows of its own.
        """
        engine = self._engine
        upstream = []
        if self.path is not None:
            from ivm.cdc.postgres import sources_status  # (psycopg2, imported only where sources can exist)

            upstream = sources_status(self.path)
        writer = {table: source["name"] for source in upstream for table in source["tables"]}
        snapshot = engine.store.snapshot
        failed = engine.failed  # a table that stopped following its source says why
        rows = [{"name": t.name, "type": "table", "written_by": writer.get(t.name),
                 "status": "failed: " + failed[t.name] if t.name in failed else None,
                 "rows": snapshot[t.name].num_rows}
                for t in engine.catalog.visible_tables()]
        rows += [{"name": s["name"], "type": s["kind"], "written_by": None,
                  "status": s["status"] if s["status"] != "ok" else s["phase"], "rows": None,
                  "state": s["state"], "slot": s["slot"], "confirmed_lsn": s.get("confirmed_lsn"),
                  "lag_bytes": s.get("lag_bytes"), "lag_seconds": s.get("lag_seconds"),
                  "rows_applied": s.get("rows", 0), "last_error": s["last_error"], "warning": s["warning"]}
                 for s in upstream]
        return pa.Table.from_pylist(sorted(rows, key=lambda row: (row["name"], row["type"])), schema=SOURCES_SCHEMA)

    def _show(self, stmt: Show) -> pa.Table:
        engine = self._engine
        snapshot = engine.store.snapshot
        names, kinds, rows = [], [], []
        for name in sorted([t.name for t in engine.catalog.visible_tables()] + list(engine.catalog.views)):
            definition = engine.catalog.get(name)
            if stmt.what == "views" and definition.kind != "view":
                continue
            names.append(name)
            kinds.append("table" if definition.kind == "table" else "materialized view")
            if definition.kind == "view" and not definition.stored_output:
                count = engine.reader.query(f"SELECT COUNT(*) FROM {quote(name)}", exp.Table(this=exp.to_identifier(name)),
                                            snapshot)
                rows.append(count.column(0)[0].as_py())
            else:
                rows.append(snapshot[name].num_rows)
        return pa.table({"name": names, "kind": kinds, "rows": pa.array(rows, pa.int64())})


@functools.lru_cache(maxsize=256)
def _parsed_reads(sql: str) -> tuple[Statement, ...] | None:
    statements = parse(sql)
    return tuple(statements) if all(isinstance(s, Query) for s in statements) else None


def _parse_reads(sql: str) -> list[Statement]:
    """Statements of ``sql``; texts made only of queries are parsed once (servers repeat them).

    Query statements are never modified after parsing, so sharing them is safe;
    anything else is parsed afresh.
    """
    reads = _parsed_reads(sql)
    return list(reads) if reads is not None else parse(sql)


def _check_limits(settings: Settings) -> None:
    size, timeout = settings.max_statement_bytes, settings.statement_timeout
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise ValueError(f"max_statement_bytes must be a non-negative integer (0 or None: no limit), not {size!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise ValueError(f"statement_timeout must be a non-negative number of seconds (None: no limit), "
                         f"not {timeout!r}")


def _refuse_queries(statements: list[Statement], method: str) -> None:
    """Refuse a script that holds a statement returning rows, before any of it runs."""
    queries = [s for s in statements if isinstance(s, ROWS)]
    if queries:
        raise SqlSyntaxError(f"{method}() of a script: a query (SELECT, EXPLAIN, SHOW) returns rows and must be "
                             f"the only statement; this script holds {len(statements)} statements, "
                             f"{len(queries)} of them queries. Nothing was run.")


def _is_moving_update(batch: pa.Table) -> bool:
    return (batch.schema.metadata or {}).get(b"ivm.update") == b"moving"


def connect(path: str | os.PathLike | None = None, **options: Any) -> Database:
    """Open a database: in memory when ``path`` is None, else durable in that directory.

    Options (see ``ivm.settings.Settings``): threads; engine ("duckdb",
    "spark" or "auto", see ivm/maintain/engine_choice.py), spark_conf (Spark settings
    passed through, e.g. {"spark.master": "spark://127.0.0.1:7077"}), spark_rows
    (the "auto" threshold); ingest_nice (in memory, 0-19: batches applied
    on a thread of that OS niceness, so reads in the process get a core first); for durable databases
    fold_rows, fold_delay, convert_ahead_rows, checkpoint_rows, checkpoint_seconds,
    log_retention_seconds, segment_bytes; spill_dir (runs of at least spill_rows rows,
    default 1,000,000, live in memory-mapped files there, see storage/spill.py; default
    ``<path>/spill`` for durable databases, off in memory; False: off).
    """
    return Database(path, **options)
