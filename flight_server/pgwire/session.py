"""One client connection: start-up, authentication, and the simple and extended query protocols.

The state machine of PostgreSQL's "Message Flow" section:

* Start-up: SSLRequest is answered ``S`` (then TLS) when the server has a
  certificate, else ``N``; GSSENCRequest ``N``; CancelRequest cancels the
  statement running on the connection with that process id and secret key.
  Then authentication (auth.py), ParameterStatus for the reported
  parameters and ``ivm_offset``, BackendKeyData, ReadyForQuery.
* Simple query (``Q``): each ';'-separated statement gets its own result;
  the first error ends the text. Always ends with ReadyForQuery.
* Extended query: Parse/Bind/Describe/Execute/Close/Flush, until Sync. After
  an error, messages are discarded until Sync. Portals live until Sync (every
  statement commits on its own, so Sync ends the implicit transaction).
  A query's rows are computed once, at Describe or at the first Execute,
  and Execute with a row limit sends them in pieces (PortalSuspended).
* BEGIN/COMMIT/ROLLBACK are accepted but change nothing (commands.py):
  every statement commits on its own, and ROLLBACK undoes nothing. Between
  BEGIN and COMMIT the status is ``T`` and portals outlive Sync (drivers'
  cursors fetch in pieces across Syncs); otherwise it is ``I``.

Statements go through the Database entry points Flight uses (statements.py
``run_query``/``run_update``, ``Database.apply_changes`` for COPY), inside a
``Cancellation.scope`` so a CancelRequest or the session's
``statement_timeout`` can interrupt them. After every statement whose
offset differs from the last one this connection saw, the server sends
``ParameterStatus ivm_offset``: the offset of the data that statement read
(a query's ``ivm.offset``) or wrote.

A malformed or oversized message is answered with a FATAL ErrorResponse
(08P01 or 54000) and closes this connection only.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import duckdb
import pyarrow as pa

from flight_server.params import split
from flight_server.pgwire import commands, copy, messages, parameters, rows, types
from flight_server.pgwire.auth import AuthFailed
from flight_server.pgwire.errors import (INVALID_PASSWORD, PROGRAM_LIMIT, PROTOCOL_VIOLATION, QUERY_CANCELED,
                                         UNSUPPORTED, PgError, describe)
from flight_server.pgwire.messages import ProtocolViolation
from flight_server.statements import run_query, run_update
from ivm.cancel import Cancellation
from sql_frontend.errors import StatementCancelledError

if TYPE_CHECKING:
    from flight_server.pgwire.server import PgServer

log = logging.getLogger("ivm.pgwire")
OFFSET_KEY = b"ivm.offset"
STARTUP_TIMEOUT = 30.0  # seconds a client may take to start up and authenticate
MAX_STARTUP_BYTES = 10_000


class Closed(Exception):
    """The client went away (or must be disconnected)."""


@dataclass
class Prepared:
    sql: str
    oids: list[int]  # parameter types (given or inferred)
    count: int  # parameters in the text


@dataclass
class Portal:
    statement: Prepared
    bound: pa.RecordBatch | None
    formats: list[int]
    result: "Outcome | None" = None
    sent: int = 0


@dataclass
class Outcome:
    """What a statement produced: rows (``table``) or none, and its command tag."""

    tag: str
    table: pa.Table | None = None
    offset: int | None = None
    statuses: list[tuple[str, str]] = field(default_factory=list)  # ParameterStatus to send


class Session:
    def __init__(self, sock: socket.socket, server: "PgServer"):
        self.sock = sock
        self.server = server
        self.db = server.db
        self.out = bytearray()
        self.rfile = sock.makefile("rb")
        self.cancellation = Cancellation()
        self.process_id = 0
        self.secret = 0
        self.parameters: commands.Parameters | None = None
        self.database = "ivm"
        self.offset: int | None = None
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.timed_out = False
        self.in_block = False  # between BEGIN and COMMIT/ROLLBACK: status 'T', portals kept across Sync

    # --- I/O --------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out += data
        if len(self.out) >= 1 << 16:
            self.flush()

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(self.out)
            self.out.clear()

    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) != n:
            raise Closed()
        return data

    def read_message(self) -> tuple[bytes, bytes]:
        kind, length = struct.unpack("!ci", self._read(5))
        if length < 4:
            raise ProtocolViolation(f"invalid message length {length}")
        if length - 4 > self.server.max_message_bytes:
            raise PgError(PROGRAM_LIMIT, f"message of {length - 4} bytes is over the limit of "
                                         f"{self.server.max_message_bytes} (ivm serve --max-statement-bytes)")
        return kind, self._read(length - 4)

    def error(self, error: BaseException, fatal: bool = False) -> None:
        code, message = describe(error)
        if code == QUERY_CANCELED and self.timed_out and isinstance(error, StatementCancelledError):
            message = "canceling statement due to statement timeout"
        self.send(messages.error_response("FATAL" if fatal else "ERROR", code, message))

    # --- the connection ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.sock.settimeout(STARTUP_TIMEOUT)
            if not self.startup():
                return
            self.sock.settimeout(None)
            self.loop()
        except Closed:
            pass
        except (ProtocolViolation, PgError) as e:
            code = e.code if isinstance(e, PgError) else PROTOCOL_VIOLATION
            self._last_words(code, str(e))
        except (OSError, ValueError) as e:  # reset by the peer, TLS errors, a closed file
            log.debug("connection ended: %s", e)
        finally:
            self.server.unregister(self)
            self._close()

    def _last_words(self, code: str, text: str) -> None:
        try:
            self.out.clear()
            self.send(messages.error_response("FATAL", code, text))
            self.flush()
        except OSError:
            pass

    def _close(self) -> None:
        for closing in (self.rfile.close, lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                closing()
            except OSError:
                pass

    def startup(self) -> bool:
        while True:
            length = struct.unpack("!i", self._read(4))[0]
            if not 8 <= length <= MAX_STARTUP_BYTES:
                raise ProtocolViolation(f"invalid start-up packet length {length}")
            request = messages.parse_startup(self._read(length - 4))
            if request.code == messages.SSL_REQUEST:
                if self.server.tls is None or hasattr(self.sock, "cipher"):
                    self.sock.sendall(b"N")
                    continue
                self.sock.sendall(b"S")
                self.rfile.close()
                self.sock = self.server.tls.wrap_socket(self.sock, server_side=True)
                self.rfile = self.sock.makefile("rb")
                continue
            if request.code == messages.GSSENC_REQUEST:
                self.sock.sendall(b"N")
                continue
            if request.code == messages.CANCEL_REQUEST:
                self.server.cancel(request.process_id, request.secret)
                return False
            break
        unknown = [name for name in request.parameters if name.startswith("_pq_.")]
        if request.code & 0xFFFF or unknown:  # a newer minor version: say we speak 3.0
            self.send(messages.negotiate_protocol_version(0, unknown))
        user = request.parameters.get("user", "")
        self.database = request.parameters.get("database") or user or "ivm"
        self.authenticate(user)
        self.parameters = commands.Parameters({k: v for k, v in request.parameters.items()
                                               if k not in ("user", "database", "options", "replication")})
        self.send(messages.authentication_ok())
        for name, value in self.parameters.reported():
            self.send(messages.parameter_status(name, value))
        self.offset = self.db.offset
        self.send(messages.parameter_status("ivm_offset", str(self.offset)))
        self.process_id, self.secret = self.server.register(self)
        self.send(messages.backend_key_data(self.process_id, self.secret))
        self.send(messages.ready_for_query(b"I"))
        self.flush()
        return True

    def authenticate(self, user: str) -> None:
        keys = self.server.scram
        if keys is None:
            return
        try:
            if hasattr(self.sock, "cipher"):  # TLS: the password itself, encrypted by the channel
                self.send(messages.authentication_cleartext())
                self.flush()
                keys.check_cleartext(messages.Reader(self._expect_password()).cstring())
                return
            self.send(messages.authentication_sasl(["SCRAM-SHA-256"]))
            self.flush()
            reader = messages.Reader(self._expect_password())
            if reader.cstring() != "SCRAM-SHA-256":
                raise AuthFailed("the server asked for SCRAM-SHA-256 (a cleartext password is accepted only over TLS)")
            size = reader.int32()
            exchange = keys.exchange()
            self.send(messages.authentication_sasl_continue(exchange.first(reader.bytes(size) if size >= 0 else b"")))
            self.flush()
            self.send(messages.authentication_sasl_final(exchange.final(self._expect_password())))
        except (AuthFailed, ProtocolViolation):
            raise PgError(INVALID_PASSWORD, f'password authentication failed for user "{user}"') from None

    def _expect_password(self) -> bytes:
        kind, body = self.read_message()
        if kind != b"p":
            raise ProtocolViolation(f"expected a password message, got {kind!r}")
        return body

    @property
    def status(self) -> bytes:
        """ReadyForQuery's transaction status: 'T' inside BEGIN ... COMMIT (a block of no-ops), else 'I'."""
        return b"T" if self.in_block else b"I"

    def loop(self) -> None:
        skipping = False  # after an error in extended mode: discard until Sync
        handlers: dict[bytes, Callable[[bytes], None]] = {
            b"P": self.on_parse, b"B": self.on_bind, b"D": self.on_describe, b"E": self.on_execute,
            b"C": self.on_close, b"H": lambda body: self.flush(),
        }
        while True:
            self.flush()
            kind, body = self.read_message()
            if kind == b"X":
                return
            if kind == b"Q":
                self.on_query(body)
            elif kind == b"S":
                skipping = False
                if not self.in_block:
                    self.portals.clear()
                self.send(messages.ready_for_query(self.status))
            elif kind in handlers:
                if skipping:
                    continue
                try:
                    handlers[kind](body)
                except (ProtocolViolation, Closed):
                    raise
                except Exception as e:  # noqa: BLE001 (every error goes to the client as an ErrorResponse)
                    self.error(e)
                    skipping = True
            elif kind in (b"d", b"c", b"f"):
                continue  # copy messages outside COPY are ignored, as PostgreSQL does
            elif kind == b"F":
                self.send(messages.error_response("ERROR", UNSUPPORTED, "the function call protocol is not supported"))
                self.send(messages.ready_for_query(self.status))
            else:
                raise ProtocolViolation(f"invalid frontend message type {kind!r}")

    # --- simple query -----------------------------------------------------------------------------
    def on_query(self, body: bytes) -> None:
        try:
            text = messages.Reader(body).cstring()
            statements = split(text)
            if not statements:
                self.send(messages.empty_query_response())
            for sql in statements:
                outcome = self.run_statement(sql, Prepared(sql, [], 0), None)
                if outcome.table is not None:
                    formats = [0] * outcome.table.num_columns
                    self.send(messages.row_description(types.fields(outcome.table.schema, formats)))
                    self.send_rows(outcome.table, formats)
                self.complete(outcome)
        except (ProtocolViolation, Closed):
            raise
        except Exception as e:  # noqa: BLE001
            self.error(e)
        self.send(messages.ready_for_query(self.status))

    def complete(self, outcome: Outcome) -> None:
        self.send(messages.command_complete(outcome.tag))
        for name, value in outcome.statuses:
            self.send(messages.parameter_status(name, value))
        if outcome.offset is not None and outcome.offset != self.offset:
            self.offset = outcome.offset
            self.send(messages.parameter_status("ivm_offset", str(outcome.offset)))

    def send_rows(self, table: pa.Table, formats: list[int]) -> None:
        for data in rows.chunks(table, formats):
            if len(data) < 1 << 16:
                self.send(data)  # small results go out with the messages around them, in one write
            else:
                self.flush()
                self.sock.sendall(data)

    # --- extended query ---------------------------------------------------------------------------
    def on_parse(self, body: bytes) -> None:
        name, sql, given = messages.parse_parse(body)
        if name and name in self.statements:
            raise PgError("42P05", f'prepared statement "{name}" already exists')
        statements = split(sql) if sql.strip() else ()
        if len(statements) > 1:
            raise PgError("42601", "cannot insert multiple commands into a prepared statement")
        text = statements[0] if statements else ""
        message = commands.unsupported(text)
        if message:
            raise PgError(UNSUPPORTED, message)
        count = self.server.shapes.shape(text)[0] if text and self._goes_to_database(text) else 0
        count = max(count, len(given))
        oids = self.server.parameter_types(text, count, given) if count else []
        self.statements[name] = Prepared(text, oids, count)
        self.send(messages.parse_complete())

    def on_bind(self, body: bytes) -> None:
        portal, name, formats, values, result_formats = messages.parse_bind(body)
        statement = self._statement(name)
        if len(values) != statement.count:
            raise PgError(PROTOCOL_VIOLATION, f"bind message supplies {len(values)} parameters, but prepared "
                                              f"statement \"{name}\" requires {statement.count}")
        bound = parameters.decode(values, formats, statement.oids) if values else None
        self.portals[portal] = Portal(statement, bound, result_formats)
        self.send(messages.bind_complete())

    def _statement(self, name: str) -> Prepared:
        statement = self.statements.get(name)
        if statement is None:
            raise PgError("26000", f'prepared statement "{name}" does not exist')
        return statement

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise PgError("34000", f'portal "{name}" does not exist')
        return portal

    def on_describe(self, body: bytes) -> None:
        reader = messages.Reader(body)
        which, name = reader.byte(), reader.cstring()
        if which == b"S":
            statement = self._statement(name)
            self.send(messages.parameter_description(statement.oids))
            schema = self.result_schema(statement)
            formats = [0] * len(schema) if schema is not None else []
        elif which == b"P":
            portal = self._portal(name)
            if portal.result is None and self.returns_rows(portal.statement.sql):
                portal.result = self.run_statement(portal.statement.sql, portal.statement, portal.bound)
            schema = portal.result.table.schema if portal.result is not None and portal.result.table is not None \
                else None
            formats = types.formats_for(len(schema), portal.formats) if schema is not None else []
        else:
            raise ProtocolViolation(f"invalid Describe target {which!r}")
        self.send(messages.row_description(types.fields(schema, formats)) if schema is not None
                  else messages.no_data())

    def on_execute(self, body: bytes) -> None:
        reader = messages.Reader(body)
        portal = self._portal(reader.cstring())
        limit = reader.int32()
        if not portal.statement.sql:
            self.send(messages.empty_query_response())
            return
        if portal.result is None:
            portal.result = self.run_statement(portal.statement.sql, portal.statement, portal.bound)
        outcome = portal.result
        if outcome.table is None:
            if portal.sent == 0:
                portal.sent = -1
                self.complete(outcome)
            return
        table = outcome.table
        end = table.num_rows if limit <= 0 else min(table.num_rows, max(portal.sent, 0) + limit)
        formats = types.formats_for(table.num_columns, portal.formats)
        self.send_rows(table.slice(portal.sent, end - portal.sent), formats)
        portal.sent = end
        if end < table.num_rows:
            self.send(messages.portal_suspended())
        else:
            self.complete(outcome)

    def on_close(self, body: bytes) -> None:
        reader = messages.Reader(body)
        which, name = reader.byte(), reader.cstring()
        (self.statements if which == b"S" else self.portals).pop(name, None)
        self.send(messages.close_complete())

    # --- running statements -----------------------------------------------------------------------
    def _goes_to_database(self, sql: str) -> bool:
        """False for the statements this session answers itself (commands.py, COPY)."""
        return not (commands.transaction(sql) or commands.parse_set(sql) or commands.parse_reset(sql)
                    or self._session_show(sql) or commands.intercepted_function(sql) or copy.parse(sql)
                    or commands.words(sql, 1) in (["DISCARD"], ["DEALLOCATE"]))

    def _session_show(self, sql: str) -> str | None:
        name = commands.parse_show(sql)
        return name if name is not None and (name in commands.PARAMETERS or name in ("ivm_offset", "all")) else None

    def returns_rows(self, sql: str) -> bool:
        if self._session_show(sql) or commands.intercepted_function(sql):
            return True
        return self._goes_to_database(sql) and self.server.shapes.shape(sql)[1]

    def result_schema(self, statement: Prepared) -> pa.Schema | None:
        """The columns a prepared statement returns, before it runs (None: it returns no rows)."""
        if not statement.sql or not self.returns_rows(statement.sql):
            return None
        if not self._goes_to_database(statement.sql):  # SHOW and version(): answered without side effects
            return self.run_statement(statement.sql, statement, None).table.schema
        kinds = tuple(parameters.arrow_type(oid) for oid in statement.oids)
        schema = self.server.shapes.schema(statement.sql, statement.count, kinds)
        if schema is None:  # e.g. SHOW TABLES, or a text DuckDB must see with values: run it with NULLs
            nulls = pa.record_batch([pa.nulls(1, k) for k in kinds], names=[str(i) for i in range(len(kinds))])
            schema = self._guarded(lambda: run_query(self.db, statement.sql, statement.count, nulls)).schema
        return schema

    def run_statement(self, sql: str, statement: Prepared, bound: pa.RecordBatch | None) -> Outcome:
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
        self.send(messages.copy_response(b"G", len(names)))
        self.flush()
        chunks, failed = [], None
        while True:
            kind, body = self.read_message()
            if kind == b"d":
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
        data = copy.rows(b"".join(chunks), spec)
        for number, row in enumerate(data, start=1):
            if len(row) != len(names):
                raise PgError("22P04", f"COPY {spec.table}, line {number}: expected {len(names)} columns, "
                                       f"got {len(row)}; nothing was applied")
        columns = [[row[i] for row in data] for i in range(len(names))]
        arrays = [types.from_text(values, pa.string() if name == "__op" else schema.field(name).type)
                  for name, values in zip(names, columns)]
        if "__op" not in names:  # inserts: the columns not listed are NULL (an __op batch says what it means)
            for f in schema:
                if f.name not in names:
                    names, arrays = names + [f.name], arrays + [pa.nulls(len(data), f.type)]
        offset = self.db.apply_changes(spec.table, pa.table(arrays, names=names))
        return Outcome(f"COPY {len(data)}", offset=offset)

    def copy_out(self, spec: copy.CopySpec) -> Outcome:
        if spec.query is not None:
            query = spec.query
        else:
            columns = ", ".join(_quote(c) for c in spec.columns) if spec.columns else "*"
            query = f"SELECT {columns} FROM {_quote(spec.table)}"
        table = self.db.sql(query)
        self.send(messages.copy_response(b"H", table.num_columns))
        if spec.header:
            self.send(messages.copy_data(copy.line(table.column_names, spec).encode()))
        columns = [types.text_values(table.column(i)) for i in range(table.num_columns)]
        for values in zip(*columns):
            self.send(messages.copy_data(copy.line(list(values), spec).encode()))
        self.send(messages.copy_done())
        return Outcome(f"COPY {table.num_rows}", offset=_offset(table))


def _offset(table: pa.Table) -> int | None:
    value = (table.schema.metadata or {}).get(OFFSET_KEY)
    return int(value) if value is not None else None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
