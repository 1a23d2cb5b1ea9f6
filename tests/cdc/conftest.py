"""Fixtures of the CDC tests: one throwaway PostgreSQL server per test module, one upstream database per test."""

from __future__ import annotations

import itertools

import pytest

from tests.cdc import workload as w
from tests.cdc.pg_server import PostgresServer


@pytest.fixture(scope="module")
def pg():
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


DATABASES = itertools.count()


@pytest.fixture
def upstream(pg):
    """A new upstream database holding tests/cdc/workload.py's schema and publication ``shop``."""
    return w.create_database(pg.dsn, f"shop{next(DATABASES)}")
