"""What one statement does on a PostgreSQL connection: answered by the session, a COPY, or the Database.

Session statements (commands.py: BEGIN/COMMIT, SET/SHOW/RESET, version(),
DISCARD) are answered without the Database. ``COPY ... FROM STDIN`` reads
the client's CopyData until CopyDone (or CopyFail: nothing applied) and
applies the rows as one change batch (``Database.apply_changes``);
``COPY ... TO STDOUT`` streams a query's rows. Everything else goes
through the entry points Flight uses (``flight_server.statements``).

The Database's work runs inside the connection's ``Cancellation.scope``
(ivm/reads/cancel.py) with the connection's ``statement_timeout`` as a timer, so
a CancelRequest or the timeout interrupts it with 57014 and nothing changed.

``Dispatcher`` is the statement half of ``session.Session`` (which owns the
socket, the parameters and the prepared statements it reads here).
"""

from __future__ import annotations

import select
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable

import duckdb
import pyarrow as pa

from flight_server import subscribe
from flight_server.pgwire import commands, copy, copy_binary, messages, parameters, types
from flight_server.pgwire.errors import PROGRAM_LIMIT, QUERY_CANCELED, UNSUPPORTED, PgError
from flight_server.pgwire.messages import ProtocolViolation
from flight_server.statements import run_query, run_update
from ivm.reads.reads import CANCELLED
from sql_frontend.errors import StatementCancelledError

OFFSET_KEY = b"ivm.offset"
COPY_LIMIT_BYTES = 1 << 30


@dataclass
class Prepared:
    """A parsed statement: its text, parameter type OIDs (given or inferred) and parameter count."""

    sql: str
    oids: list[int]  # parameter types (given or inferred)
    count: int  # parameters in the text


@dataclass
class Outcome:
    """What a statement produced: rows (``table``) or none, and its command tag."""

    tag: str
    table: pa.Table | None = None
    offset: int | None = None
    statuses: list[tuple[str, str]] = field(default_factory=list)  # ParameterStatus to send
    stream: Callable | None = None  # SUBSCRIBE: called with emit(rows) after ``table`` (its columns) is sent


class Dispatcher:
    """Runs statements for a Session (the attributes it reads are the Session's)."""

    def goes_to_database(self, sql: str) -> bool:
        """False for the statements this session answers itself (commands.py, COPY)."""
        return not (commands.transaction(sql) or commands.savepoint(sql) or commands.parse_set(sql) or commands.parse_reset(sql)
                    or self._session_show(sql) or commands.intercepted_function(sql) or copy.parse(sql)
                    or subscribe.parse(sql)
                    or commands.words(sql, 1) in (["DISCARD"], ["DEALLOCATE"]))

    def _session_show(self, sql: str) -> str | None:
        name = commands.parse_show(sql)
        return name if name is not None and (name in commands.PARAMETERS or name in ("ivm_offset", "all")) else None

    def returns_rows(self, sql: str) -> bool:
        if self._session_show(sql) or commands.intercepted_function(sql) or subscribe.parse(sql):
            return True
        return self.goes_to_database(sql) and self.server.shapes.shape(sql)[1]

    def result_schema(self, statement: Prepared) -> pa.Schema | None:
        """The columns a prepared statement returns, before it runs (None: it returns no rows)."""
        if not statement.sql or not self.returns_rows(statement.sql):
            return None
        subscription = subscribe.parse(statement.sql)
        if subscription is not None:  # its columns, without reading the relation
            return subscribe.columns(self.db, subscription)
        if not self.goes_to_database(statement.sql):  # SHOW and version(): answered without side effects
            return self.run_statement(statement.sql, statement, None).table.schema
        kinds = tuple(parameters.arrow_type(oid) for oid in statement.oids)
        schema = self.server.shapes.schema(statement.sql, statement.count, kinds)
        if schema is None:  # e.g. SHOW TABLES, or a text DuckDB must see with values: run it with NULLs
            nulls = pa.record_batch([pa.nulls(1, k) for k in kinds], names=[str(i) for i in range(len(kinds))])
            schema = self._guarded(lambda: run_query(self.db, statement.sql, statement.count, nulls)).schema
        return schema

    def run_statement(self, sql: str, statement: Prepared, bound: pa.RecordBatch | None) -> Outcome:
        tag = commands.savepoint(sql)
        if tag:
            return Outcome(tag)  # no-ops inside or outside a block (commands.savepoint)
        tag = commands.transaction(sql)
        if tag:
            self.in_block = tag in ("BEGIN", "START TRANSACTION")
            if not self.in_block:
                self.portals = {k: v for k, v in self.portals.items() if v.statement is statement}
            return Outcome(tag)
        setting = commands.parse_set(sql)
        if setting is not None:
            if setting[0].startswith("ivm."):
                self._guarded(lambda: self.db.execute(sql))
                return Outcome("SET")
            shown = self.parameters.set(*setting)
            return Outcome("SET", statuses=[(shown, self.parameters.values[setting[0]])] if shown else [])
        reset = commands.parse_reset(sql)
        if reset is not None:
            names = self.parameters.reset(reset)
            return Outcome("RESET", statuses=[(n, self.parameters.values[n.lower()]) for n in names])
        shown = self._session_show(sql)
        if shown is not None:
            return Outcome("SHOW", self._show(shown))
        first = commands.words(sql, 2)
        if first[:1] in (["DISCARD"], ["DEALLOCATE"]):
            if first[:1] == ["DEALLOCATE"]:
                self.statements.clear() if "ALL" in commands.words(sql, 3) else None
            return Outcome(" ".join(first) if first[0] == "DISCARD" else "DEALLOCATE")
        message = commands.unsupported(sql)
        if message:
            raise PgError(UNSUPPORTED, message)
        function = commands.intercepted_function(sql)
        if function == "version":
            text = commands.VERSION_TEXT.format(version=self.server.version, duckdb=duckdb.__version__)
            return Outcome("SELECT 1", pa.table({"version": [text]}))
        if function == "current_database":
            return Outcome("SELECT 1", pa.table({"current_database": [self.database]}))
        subscription = subscribe.parse(sql)
        if subscription is not None:
            feed, target = self.subscription(subscription)
            return Outcome("SUBSCRIBE", target.empty_table(),
                           stream=lambda emit: self.stream(feed, subscription, target, emit))
        spec = copy.parse(sql)
        if spec is not None:
            return self._guarded(lambda: self.copy_in(spec) if spec.inbound else self.copy_out(spec))
        count, is_query = self.server.shapes.shape(sql)
        if count and bound is None:
            raise PgError("08P01", f"the statement takes {count} parameter(s); send them with the extended "
                                   "query protocol (Parse/Bind)")
        if is_query:
            table = self._guarded(lambda: run_query(self.db, sql, count, bound))
            head = (first or ["SELECT"])[0]
            tag = f"{head} {table.num_rows}" if head in ("SHOW", "EXPLAIN") else f"SELECT {table.num_rows}"
            return Outcome(tag, table, _offset(table))
        affected = self._guarded(lambda: run_update(self.db, sql, count, bound))
        return Outcome(commands.tag(sql, affected), offset=self.db.offset)

    def _show(self, name: str) -> pa.Table:
        if name == "ivm_offset":
            return pa.table({"ivm_offset": [str(self.offset if self.offset is not None else self.db.offset)]})
        if name == "all":
            values = self.parameters.values
            return pa.table({"name": list(values), "setting": list(values.values())})
        return pa.table({name: [self.parameters.show(name)]})

    def _guarded(self, run: Callable):
        """Run a statement's work so that a CancelRequest or the statement timeout can stop it."""
        timeout = self.parameters.timeout_seconds() if self.parameters else None
        timer = threading.Timer(timeout, self._time_out) if timeout else None
        self.timed_out = False
        with self.cancellation.scope():
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                return run()
            finally:
                if timer is not None:
                    timer.cancel()

    def _time_out(self) -> None:
        self.timed_out = True
        self.cancellation.cancel()

    def cancel(self) -> None:
        """A CancelRequest for this connection (called on the canceller's thread)."""
        self.cancellation.cancel()

    # --- COPY -------------------------------------------------------------------------------------
    def copy_in(self, spec: copy.CopySpec) -> Outcome:
        schema = self.server.table_schema(spec.table)
        names = spec.columns or [n for n in schema.names]
        unknown = [n for n in names if n not in schema.names and n != "__op"]
        if unknown:
            raise PgError("42703", f"table {spec.table} has no column {', '.join(unknown)}")
        self.send(messages.copy_response(b"G", len(names), int(spec.binary)))
        self.flush()
        chunks, failed, received = [], None, 0
        while True:
            kind, body = self.read_message()
            if kind == b"d":
                received += len(body)
                if received > COPY_LIMIT_BYTES:  # held in memory until CopyDone: one batch, applied at once
                    raise PgError(PROGRAM_LIMIT, f"COPY data over {COPY_LIMIT_BYTES >> 20} MiB: send it in "
                                                 "several COPY statements; nothing was applied")
                chunks.append(body)
            elif kind == b"c":
                break
            elif kind == b"f":
                failed = messages.Reader(body).cstring()
                break
            elif kind in (b"H", b"S"):
                continue
            else:
                raise ProtocolViolation(f"unexpected message type {kind!r} during COPY from stdin")
        if failed is not None:
            raise PgError(QUERY_CANCELED, f"COPY from stdin failed: {failed}")
        fields = [pa.field(n, pa.string() if n == "__op" else schema.field(n).type) for n in names]
        arrays = copy_binary.read(b"".join(chunks), pa.schema(fields)) if spec.binary \
            else self._text_columns(b"".join(chunks), spec, fields)
        count = len(arrays[0]) if arrays else 0
        if "__op" not in names:  # inserts: the columns not listed are NULL (an __op batch says what it means)
            for f in schema:
                if f.name not in names:
                    names, arrays = names + [f.name], arrays + [pa.nulls(count, f.type)]
        offset = self.db.apply_changes(spec.table, pa.table(arrays, names=names))
        return Outcome(f"COPY {count}", offset=offset)

    @staticmethod
    def _text_columns(data: bytes, spec: copy.CopySpec, fields: list[pa.Field]) -> list[pa.Array]:
        lines = copy.rows(data, spec)
        for number, row in enumerate(lines, start=1):
            if len(row) != len(fields):
                raise PgError("22P04", f"COPY {spec.table}, line {number}: expected {len(fields)} columns, "
                                       f"got {len(row)}; nothing was applied")
        return [types.from_text([row[i] for row in lines], f.type) for i, f in enumerate(fields)]

    def copy_out(self, spec: copy.CopySpec) -> Outcome:
        subscription = subscribe.parse(spec.query) if spec.query is not None else None
        if subscription is not None and spec.binary:
            raise PgError(UNSUPPORTED, "COPY (SUBSCRIBE ...) TO STDOUT streams in text or csv format, not binary")
        if subscription is not None:  # COPY (SUBSCRIBE ...) TO STDOUT: CopyData until cancelled
            feed, target = self.subscription(subscription)
            self.send(messages.copy_response(b"H", len(target)))
            self.flush()
            self.stream(feed, subscription, target, lambda rows: self._copy_lines(rows, spec, flush=True))
            self.send(messages.copy_done())
            return Outcome("COPY 0")
        if spec.query is not None:
            query = spec.query
        else:
            columns = ", ".join(_quote(c) for c in spec.columns) if spec.columns else "*"
            query = f"SELECT {columns} FROM {_quote(spec.table)}"
        table = self.db.sql(query)
        self.send(messages.copy_response(b"H", table.num_columns, int(spec.binary)))
        if spec.binary:
            self.send_chunks(copy_binary.messages(table))
            self.send(messages.copy_done())
            return Outcome(f"COPY {table.num_rows}", offset=_offset(table))
        if spec.header:
            self.send(messages.copy_data(copy.line(table.column_names, spec).encode()))
        self._copy_lines(table, spec)
        self.send(messages.copy_done())
        return Outcome(f"COPY {table.num_rows}", offset=_offset(table))

    def _copy_lines(self, table: pa.Table, spec: copy.CopySpec, flush: bool = False) -> None:
        columns = [types.text_values(table.column(i)) for i in range(table.num_columns)]
        for values in zip(*columns):
            self.send(messages.copy_data(copy.line(list(values), spec).encode()))
        if flush:
            self.flush()

    # --- SUBSCRIBE ------------------------------------------------------------------------------
    def subscription(self, subscription: subscribe.Subscription) -> tuple[subscribe.Feed, pa.Schema]:
        """The subscription's feed, read now (a bad relation or offset is this statement's error), and columns."""
        feed = self._guarded(lambda: subscribe.Feed(self.db, subscription.view, subscription.since))
        return feed, subscribe.schema(feed.relation_schema, subscription.progress)

    def stream(self, feed: subscribe.Feed, subscription: subscribe.Subscription, target: pa.Schema,
               emit: Callable) -> None:
        """Send the changes through ``emit`` as they commit, until the client cancels or leaves."""
        with self.cancellation.scope():
            for rows in subscribe.sql_rows(feed, subscription, target, lambda: self.server.stopping):
                if rows.num_rows:
                    emit(rows)
                if self.cancellation.cancelled:  # checked at least every heartbeat (an empty table)
                    raise StatementCancelledError(CANCELLED)
                if self.client_gone():
                    raise ConnectionResetError("the client left during SUBSCRIBE")

    def client_gone(self) -> bool:
        """True when the client closed its end (a subscription that sends nothing would not notice)."""
        if hasattr(self.sock, "cipher"):
            return False  # TLS: no peeking; a departed client shows when the next rows fail to send
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable) and self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


def _offset(table: pa.Table) -> int | None:
    value = (table.schema.metadata or {}).get(OFFSET_KEY)
    return int(value) if value is not None else None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
