"""The protocol on a raw socket: start-up requests, extended-query row limits, and bad clients.

A malformed or oversized message closes that connection only; the server
keeps serving the others.
"""

from __future__ import annotations

import socket
import struct

import psycopg
import pytest

from tests.flight.server import ServerProcess
from tests.pgwire.conftest import connect

TIMEOUT = 10


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--pg-port", "0", "--max-statement-bytes", "2000")
    try:
        yield process
    finally:
        process.stop()


def raw(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.pg_port), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def startup(sock: socket.socket) -> None:
    body = struct.pack("!i", 196608) + b"user\x00raw\x00\x00"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    assert dict(read_until(sock, b"Z"))[b"Z"] == b"I"


def read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _exactly(sock, 5)
    kind, length = struct.unpack("!ci", head)
    return kind, _exactly(sock, length - 4)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data


def read_until(sock: socket.socket, last: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    while True:
        kind, body = read_message(sock)
        out.append((kind, body))
        if kind == last:
            return out


def closed(sock: socket.socket) -> bool:
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True


def fields(body: bytes) -> dict[str, str]:
    parts = body.rstrip(b"\x00").split(b"\x00")
    return {p[:1].decode(): p[1:].decode() for p in parts if p}


def still_serving(server) -> None:
    with connect(server) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)


def test_ssl_and_gssenc_requests_are_declined(server):
    with raw(server) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877104))
        assert sock.recv(1) == b"N"
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"N"
        startup(sock)  # the same connection then starts in the clear
        sock.sendall(message(b"Q", b"SELECT 1 AS one\x00"))
        kinds = [k for k, _ in read_until(sock, b"Z")]
        assert kinds == [b"T", b"D", b"C", b"S", b"Z"] or kinds == [b"T", b"D", b"C", b"Z"]


def test_execute_with_row_limit_suspends_the_portal(server):
    with connect(server) as conn:
        conn.execute("CREATE TABLE nums (x BIGINT)")
        conn.execute("INSERT INTO nums VALUES (0), (1), (2), (3), (4)")
    with raw(server) as sock:
        startup(sock)
        sock.sendall(message(b"P", b"\x00SELECT x FROM nums ORDER BY x\x00\x00\x00")
                     + message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
                     + message(b"E", b"\x00" + struct.pack("!i", 2))
                     + message(b"E", b"\x00" + struct.pack("!i", 2))
                     + message(b"E", b"\x00" + struct.pack("!i", 2))
                     + message(b"S"))
        got = read_until(sock, b"Z")
        kinds = [k for k, _ in got]
        assert kinds[:9] == [b"1", b"2", b"D", b"D", b"s", b"D", b"D", b"s", b"D"]
        assert (b"C", b"SELECT 5\x00") in got
        assert [b for k, b in got if k == b"D"][-1] == struct.pack("!hi", 1, 1) + b"4"


def test_error_in_extended_mode_skips_until_sync(server):
    with raw(server) as sock:
        startup(sock)
        sock.sendall(message(b"P", b"\x00SELEC 1\x00\x00\x00")
                     + message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
                     + message(b"E", b"\x00\x00\x00\x00\x00")
                     + message(b"S"))
        got = read_until(sock, b"Z")
        assert [k for k, _ in got] == [b"E", b"Z"]
        assert fields(got[0][1])["C"] == "42601"


def test_malformed_message_closes_that_connection_only(server):
    with raw(server) as sock:
        startup(sock)
        sock.sendall(b"Q\x00\x00\x00\x02")  # a length below the 4 bytes of the length itself
        kind, body = read_message(sock)
        assert kind == b"E" and fields(body)["S"] == "FATAL" and fields(body)["C"] == "08P01"
        assert closed(sock)
    with raw(server) as sock:
        startup(sock)
        sock.sendall(message(b"!", b"junk"))  # no such message type
        kind, body = read_message(sock)
        assert fields(body)["C"] == "08P01"
        assert closed(sock)
    with raw(server) as sock:
        sock.sendall(b"\x00\x00\x00\x05\x00")  # a start-up packet too short to hold a version
        kind, body = read_message(sock)
        assert fields(body)["C"] == "08P01"
        assert closed(sock)
    still_serving(server)


def test_oversized_message_closes_that_connection_only(server):
    other = connect(server)
    try:
        with raw(server) as sock:
            startup(sock)
            sock.sendall(b"Q" + struct.pack("!i", 64 << 20))  # claims 64 MiB: refused before reading it
            kind, body = read_message(sock)
            assert fields(body)["C"] == "54000" and "max-statement-bytes" in fields(body)["M"]
            assert closed(sock)
        assert other.execute("SELECT 1").fetchone() == (1,)  # an open connection is unaffected
    finally:
        other.close()
    with connect(server) as conn:  # a statement over --max-statement-bytes is an ordinary error
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT " + " + ".join(["1"] * 1500))
        assert caught.value.sqlstate == "54000"
    still_serving(server)


def test_client_vanishing_mid_message(server):
    with raw(server) as sock:
        startup(sock)
        sock.sendall(b"Q\x00\x00\x00\x40SELECT")  # then hangs up
    still_serving(server)
