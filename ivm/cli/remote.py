"""A connection to a running ``ivm serve``: ``ivm sql --connect`` and ``ivm status --connect``.

``grpc://HOST:PORT`` (or ``grpc+tls://``) speaks Arrow Flight SQL with
pyarrow.flight (a dependency of ivm already; the ADBC driver is only a test
dependency): each statement is a ``CommandStatementQuery``, its rows come
back from the one endpoint the server returns, with their schema metadata
(``SHOW STATUS`` keeps the database-wide facts there). ``postgresql://…``
goes through the server's PostgreSQL door with psycopg, when installed.

Every failure is a ``RemoteError`` whose message a person can act on: no
gRPC debug context, no Python exception names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

FLIGHT_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls")
PG_SCHEMES = ("postgresql", "postgres")
TOKEN_HINT = "pass --auth-token TOKEN (or set IVM_AUTH_TOKEN)"


class RemoteError(Exception):
    """A statement or connection failed; the message says why, in one or two lines."""


@dataclass
class Result:
    """What a statement returned: rows under column names, or, for other statements, a command tag."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    tag: str | None  # e.g. "INSERT 0 2"; None for rows
    seconds: float

    @classmethod
    def of_table(cls, table: pa.Table, seconds: float) -> "Result":
        """An ivm result: rows, or for statements other than queries their ``rows_affected``."""
        # Those answer one row "rows_affected" and, unlike queries, carry no offset in their metadata.
        if table.column_names == ["rows_affected"] and not (table.schema.metadata or {}).get(b"ivm.offset"):
            affected = table.column(0)[0].as_py() if table.num_rows else 0
            return cls([], [], f"OK, {affected} row{'s' if affected != 1 else ''} affected", seconds)
        return cls(table.column_names, [tuple(row.values()) for row in table.to_pylist()], None, seconds)


def connect(url: str, auth_token: str | None = None, tls_root_certs: str | None = None):
    """A connection to the server at ``url``: ``FlightConnection`` or ``PgConnection``."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in FLIGHT_SCHEMES:
        return FlightConnection(url, auth_token, tls_root_certs)
    if scheme in PG_SCHEMES:
        return PgConnection(url, auth_token, tls_root_certs)
    raise RemoteError(f"cannot connect to {url!r}: give the server's address as grpc://HOST:PORT "
                      f"(grpc+tls:// with TLS) or postgresql://HOST:PORT (its PostgreSQL door)")


def _clean(message: str) -> str:
    """A Flight error's message without what pyarrow and gRPC append to it."""
    for tail in (". Detail:", ". gRPC client debug context", "\nDetail:"):
        message = message.split(tail, 1)[0]
    return message.strip()


class FlightConnection:
    """Statements over Arrow Flight SQL."""

    def __init__(self, url: str, auth_token: str | None, tls_root_certs: str | None):
        import pyarrow.flight as fl

        self.url = url
        self.token = auth_token
        parts = urlsplit(url)
        if not parts.hostname or parts.port is None:
            raise RemoteError(f"cannot connect to {url!r}: the address needs a host and a port, "
                              "e.g. grpc://127.0.0.1:8815")
        options: dict[str, Any] = {}
        if tls_root_certs is not None:
            if parts.scheme.lower() != "grpc+tls":
                raise RemoteError(f"--tls-root-certs is for a TLS server: use grpc+tls:// instead of {url}")
            try:
                options["tls_root_certs"] = Path(tls_root_certs).read_bytes()
            except OSError as e:
                raise RemoteError(f"cannot read --tls-root-certs {tls_root_certs}: {e.strerror}") from None
        self.client = fl.FlightClient(url, **options)
        headers = [(b"authorization", f"Bearer {auth_token}".encode())] if auth_token else []
        self.options = fl.FlightCallOptions(headers=headers)

    def arrow(self, sql: str) -> pa.Table:
        """Run one statement; its result with schema metadata (other statements: ``rows_affected``)."""
        import pyarrow.flight as fl

        from flight_server.protocol import pack

        descriptor = fl.FlightDescriptor.for_command(pack("CommandStatementQuery", query=sql))
        try:
            info = self.client.get_flight_info(descriptor, self.options)
            parts = [self.client.do_get(endpoint.ticket, self.options).read_all() for endpoint in info.endpoints]
        except fl.FlightUnauthenticatedError:
            if self.token:
                raise RemoteError(f"the server at {self.url} refused the token given") from None
            raise RemoteError(f"the server at {self.url} requires a token: {TOKEN_HINT}") from None
        except fl.FlightUnavailableError as e:
            reason = _clean(str(e)).rsplit(": ", 1)[-1]
            raise RemoteError(f"cannot reach {self.url}: {reason} (is ivm serve running there?)") from None
        except pa.ArrowException as e:  # the server's message: bad SQL, unknown table, ...
            raise RemoteError(_clean(str(e))) from None
        if not parts:
            return info.schema.empty_table()
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def execute(self, sql: str) -> Result:
        start = time.perf_counter()
        table = self.arrow(sql)
        return Result.of_table(table, time.perf_counter() - start)

    def close(self) -> None:
        self.client.close()


class PgConnection:
    """Statements over the server's PostgreSQL door (psycopg)."""

    def __init__(self, url: str, auth_token: str | None, tls_root_certs: str | None):
        try:
            import psycopg
        except ImportError:
            raise RemoteError("postgresql:// needs psycopg: pip install 'psycopg[binary]' "
                              "(or connect to the Flight SQL address, grpc://HOST:PORT)") from None
        self.url = url
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": 10}
        if auth_token:
            options["password"] = auth_token
        if tls_root_certs is not None:
            options.update(sslmode="verify-ca", sslrootcert=tls_root_certs)
        try:
            self.connection = psycopg.connect(url, **options)
        except psycopg.Error as e:
            message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            if "password" in message.lower() and not auth_token:
                message += f"; {TOKEN_HINT}"
            raise RemoteError(f"cannot connect to {url}: {message}") from None
        self.psycopg = psycopg

    def execute(self, sql: str) -> Result:
        start = time.perf_counter()
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql)
                if cursor.description is None:
                    return Result([], [], cursor.statusmessage, time.perf_counter() - start)
                columns = [column.name for column in cursor.description]
                rows = [tuple(row) for row in cursor.fetchall()]
        except self.psycopg.Error as e:
            raise RemoteError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
        return Result(columns, rows, None, time.perf_counter() - start)

    def close(self) -> None:
        self.connection.close()
