"""Fixtures: one real server per module (fresh state), clients for it.

``server`` is in memory unless a module parametrizes it (``DURABILITY``
below): ``"durable"`` serves ``--data`` in a fresh directory, so the same
tests drive the durable path (change log, async maintainer, checkpoints).
"""

from __future__ import annotations

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow.flight as fl
import pytest

from tests.flight.server import ServerProcess


def run_script(uri: str, script: str) -> None:
    """Run ';'-separated statements over a fresh ADBC connection (module set-up)."""
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.executescript(script)


# For modules whose every test must hold in memory and durably:
#     pytestmark = DURABILITY
DURABILITY = pytest.mark.parametrize("server", ["memory", "durable"], indirect=True, scope="module")


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    kind = getattr(request, "param", "memory")
    args = ("--data", str(tmp_path_factory.mktemp("data") / "db")) if kind == "durable" else ()
    process = ServerProcess(*args)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def conn(server):
    connection = flight_sql.connect(server.uri, autocommit=True)
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def cur(conn):
    cursor = conn.cursor()
    try:
        yield cursor
    finally:
        cursor.close()


@pytest.fixture
def client(server):
    flight_client = fl.connect(server.uri)
    try:
        yield flight_client
    finally:
        flight_client.close()
