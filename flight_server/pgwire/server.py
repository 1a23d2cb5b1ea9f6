"""The PostgreSQL listener: one thread per connection, beside the Flight server.

``socketserver.ThreadingTCPServer`` rather than asyncio: every statement
blocks in ``ivm.Database`` (DuckDB, the write lock, a durable fsync), which
is thread-safe and releases the GIL while DuckDB runs; an event loop would
hand every statement to a thread pool anyway, and a blocking session reads
as the protocol's state machine, top to bottom (session.py). A connection
costs one thread while it is open.

The listener binds 127.0.0.1 unless told otherwise. It keeps the live
sessions by process id for CancelRequest (the secret key is compared in
constant time), and closes them all on ``stop``.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import secrets
import socket
import socketserver
import ssl
import struct
import threading

import pyarrow as pa

import ivm
from flight_server.pgwire import parameters
from flight_server.pgwire.auth import Scram
from flight_server.pgwire.session import Session
from flight_server.sessions import Lru
from flight_server.statements import Shapes

log = logging.getLogger("ivm.pgwire")
MIN_MESSAGE_BYTES = 1 << 20  # room for Bind values and COPY chunks even under a small statement limit
NO_LIMIT_BYTES = 1 << 30  # --max-statement-bytes 0: still no message over 1 GiB


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # Replies are small writes (a DataRow, then CommandComplete, then ReadyForQuery): without
        # TCP_NODELAY, Nagle's algorithm holds the last one for the client's delayed ACK (~40 ms).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        Session(self.request, self.server.pg).run()


class _Listener(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False


class PgServer:
    def __init__(self, db: ivm.Database, host: str = "127.0.0.1", port: int = 0, *, auth_token: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, max_statement_bytes: int | None = 1 << 20):
        self.db = db
        self.shapes = Shapes(db)
        self._parameter_types: Lru[tuple, list[int]] = Lru(1024)
        self.scram = Scram(auth_token) if auth_token else None
        self.tls: ssl.SSLContext | None = None
        if tls_cert and tls_key:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(tls_cert, tls_key)
        # A message may hold a whole statement plus its framing and parameters.
        self.max_message_bytes = max(MIN_MESSAGE_BYTES, (max_statement_bytes or NO_LIMIT_BYTES) + (1 << 16))
        self.version = _version()
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(secrets.randbelow(1 << 20) + 1000)
        self._listener = _Listener((host, port), _Handler)
        self._listener.pg = self
        self.host, self.port = self._listener.server_address[:2]
        self._thread: threading.Thread | None = None
        self.stopping = False

    def start(self) -> "PgServer":
        self._thread = threading.Thread(target=self._listener.serve_forever, name="pgwire", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting connections and close the open ones."""
        self.stopping = True  # ends subscriptions
        self._listener.shutdown()
        self._listener.server_close()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.cancel()
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --- sessions and cancel requests ------------------------------------------------------------
    def register(self, session: Session) -> tuple[int, int]:
        with self._lock:
            process_id = next(self._ids)
            self._sessions[process_id] = session
        return process_id, secrets.randbits(31)

    def unregister(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.process_id) is session:
                del self._sessions[session.process_id]

    def cancel(self, process_id: int, secret: bytes) -> None:
        with self._lock:
            session = self._sessions.get(process_id)
        if session is not None and hmac.compare_digest(secret, struct.pack("!i", session.secret)):
            log.info("cancel request for connection %d", process_id)
            session.cancel()

    def parameter_types(self, sql: str, count: int, given: list[int]) -> list[int]:
        """ParameterDescription's OIDs for a statement (inferred once per text and catalog version)."""
        key = (sql, count, tuple(given), self.db.catalog_version)
        oids = self._parameter_types.get(key)
        if oids is None:
            oids = self._parameter_types.put(key, parameters.describe(self.db, sql, count, given))
        return list(oids)

    def table_schema(self, name: str) -> pa.Schema:
        """The columns of a table (for COPY FROM)."""
        for info in self.db.objects():
            if info.name == name and info.kind == "table":
                return info.schema
        raise ivm.UnknownObjectError(f"table {name} does not exist")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ivm")
    except Exception:  # noqa: BLE001 (a checkout that is not installed)
        return "dev"
