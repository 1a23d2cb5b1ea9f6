"""--auth-token as the password: SCRAM-SHA-256 in the clear, cleartext only over TLS."""

from __future__ import annotations

import socket
import struct

import psycopg
import pytest

from tests.flight.server import ServerProcess
from tests.flight.test_auth_tls import make_certificate
from tests.pgwire.conftest import dsn
from tests.pgwire.test_protocol import fields, message, read_message

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secured():
    process = ServerProcess("--pg-port", "0", "--auth-token", TOKEN)
    try:
        yield process
    finally:
        process.stop()


def test_scram_with_the_token(secured):
    with psycopg.connect(dsn(secured, password=TOKEN), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert not conn.info.pgconn.ssl_in_use


def test_wrong_or_missing_password_is_refused(secured):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(dsn(secured, password="wrong"))
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):  # libpq asked for one
        psycopg.connect(dsn(secured))


def test_cleartext_password_refused_without_tls(secured):
    with socket.create_connection(("127.0.0.1", secured.pg_port), timeout=10) as sock:
        body = struct.pack("!i", 196608) + b"user\x00x\x00\x00"
        sock.sendall(struct.pack("!i", len(body) + 4) + body)
        kind, body = read_message(sock)
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 10  # AuthenticationSASL
        assert b"SCRAM-SHA-256\x00" in body
        sock.sendall(message(b"p", TOKEN.encode() + b"\x00"))  # the right token, in cleartext
        kind, body = read_message(sock)
        assert kind == b"E" and fields(body)["C"] == "28P01"
        assert sock.recv(1) == b""


def test_tls(tmp_path):
    cert, key, _ = make_certificate(tmp_path)
    with ServerProcess("--pg-port", "0", "--tls-cert", cert, "--tls-key", key, "--auth-token", TOKEN) as server:
        # verify-full: the client checks the certificate against the one it trusts
        with psycopg.connect(dsn(server, password=TOKEN, sslmode="verify-full", sslrootcert=cert,
                                 host="localhost"), autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use
            conn.execute("CREATE TABLE t (a BIGINT)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
            assert conn.execute("SELECT sum(a) FROM t").fetchone() == (3,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn(server, password="wrong", sslmode="require"))
        # Without TLS the same server asks for SCRAM.
        with psycopg.connect(dsn(server, password=TOKEN, sslmode="disable"), autocommit=True) as conn:
            assert not conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)


def test_sslmode_require_against_a_plain_server(secured):
    with pytest.raises(psycopg.OperationalError, match="does not support SSL"):
        psycopg.connect(dsn(secured, password=TOKEN, sslmode="require"))
