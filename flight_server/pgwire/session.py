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

What each statement does is dispatch.py's (session commands, COPY, or the
Database entry points Flight uses, cancellable). After every statement whose
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import pyarrow as pa

from flight_server.pgwire import commands, messages, parameters, rows, types
from flight_server.pgwire.auth import AuthFailed
from flight_server.pgwire.dispatch import Dispatcher, Outcome, Prepared
from flight_server.pgwire.errors import (INVALID_PASSWORD, PROGRAM_LIMIT, PROTOCOL_VIOLATION, QUERY_CANCELED,
                                         UNSUPPORTED, PgError, describe)
from flight_server.pgwire.messages import ProtocolViolation
from ivm.reads.cancel import Cancellation
from sql_frontend.errors import StatementCancelledError

if TYPE_CHECKING:
    from flight_server.pgwire.server import PgServer

log = logging.getLogger("ivm.pgwire")
STARTUP_TIMEOUT = 30.0  # seconds a client may take to start up and authenticate
MAX_STARTUP_BYTES = 10_000


class Closed(Exception):
    """The client went away (or must be disconnected)."""


@dataclass
class Portal:
    statement: Prepared
    bound: pa.RecordBatch | None
    formats: list[int]
    result: Outcome | None = None
    sent: int = 0


class Session(Dispatcher):
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
            statements = commands.split(text)
            if not statements:
                self.send(messages.empty_query_response())
            for sql in statements:
                outcome = self.run_statement(sql, Prepared(sql, [], 0), None)
                if outcome.table is not None:
                    formats = [0] * outcome.table.num_columns
                    self.send(messages.row_description(types.fields(outcome.table.schema, formats)))
                    self.send_rows(outcome.table, formats)
                    if outcome.stream is not None:
                        self.flush()
                        outcome.stream(lambda table: self.emit(table, formats))
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

    def emit(self, table: pa.Table, formats: list[int]) -> None:
        """Rows of a result that is still running (SUBSCRIBE): out now, not at the end."""
        self.send_rows(table, formats)
        self.flush()

    def send_rows(self, table: pa.Table, formats: list[int]) -> None:
        self.send_chunks(rows.chunks(table, formats))

    def send_chunks(self, chunks: Iterable[bytes | memoryview]) -> None:
        """Send pieces of a result as they are made: small ones with the messages around them."""
        for data in chunks:
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
        statements = commands.split(sql) if sql.strip() else ()
        if len(statements) > 1:
            raise PgError("42601", "cannot insert multiple commands into a prepared statement")
        text = statements[0] if statements else ""
        message = commands.unsupported(text)
        if message:
            raise PgError(UNSUPPORTED, message)
        count = self.server.shapes.shape(text)[0] if text and self.goes_to_database(text) else 0
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
        if outcome.stream is not None:
            if limit > 0:
                raise PgError(UNSUPPORTED, "SUBSCRIBE streams without a row limit (Execute with 0 rows)")
            self.flush()
            outcome.stream(lambda rows: self.emit(rows, types.formats_for(rows.num_columns, portal.formats)))
            self.complete(outcome)
            return
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
