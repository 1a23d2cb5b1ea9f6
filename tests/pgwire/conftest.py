"""Fixtures: a real ``ivm serve --pg-port 0`` per module, and psycopg connections to it.

Every socket operation and subprocess has a timeout (``connect_timeout``,
the server's own start-up timeout, pytest's per-call limits in the tests).
"""

from __future__ import annotations

import psycopg
import pytest

from tests.flight.server import ServerProcess

TIMEOUT = 20  # seconds for any one client operation


def dsn(server, **extra) -> str:
    parts = {"host": "127.0.0.1", "port": server.pg_port, "user": "ivm", "dbname": "ivm",
             "connect_timeout": TIMEOUT, **extra}
    return " ".join(f"{k}={v}" for k, v in parts.items())


def connect(server, **extra) -> psycopg.Connection:
    conn = psycopg.connect(dsn(server, **extra), autocommit=True)
    conn.execute(f"SET statement_timeout = {TIMEOUT * 1000}")
    return conn


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--pg-port", "0", "--metrics-port", "0")  # metrics: what the server holds open
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def conn(server):
    connection = connect(server)
    try:
        yield connection
    finally:
        connection.close()
