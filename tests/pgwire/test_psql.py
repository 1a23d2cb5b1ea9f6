"""Debian's psql runs a script file against ``ivm serve --pg-port``; its output must match the expected file.

``./dev test`` installs postgresql-client when psql is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.pgwire.conftest import connect

FIXTURES = Path(__file__).parent / "fixtures"


def test_psql_script(server):
    psql = shutil.which("psql")
    assert psql, "psql is missing: ./dev test installs postgresql-client"
    env = {**os.environ, "PGCONNECT_TIMEOUT": "20", "PGPASSWORD": "", "PSQLRC": "/dev/null"}
    result = subprocess.run(
        [psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "any", "shop",
         "-f", str(FIXTURES / "psql_script.sql")],
        capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (FIXTURES / "psql_script.out").read_text()


def test_psql_reports_errors_with_sqlstate(server):
    env = {**os.environ, "PGCONNECT_TIMEOUT": "20", "PSQLRC": "/dev/null"}
    result = subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-h", "127.0.0.1",
         "-p", str(server.pg_port), "-U", "any", "shop", "-c", "SELECT * FROM no_such_table"],
        capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0
    assert "ERROR:  42P01: table or view no_such_table does not exist" in result.stderr


@pytest.mark.parametrize("sql", ["COPY orders FROM '/etc/passwd'", "SELECT * FROM read_csv('/etc/passwd')"])
def test_files_are_refused(server, sql):
    with connect(server) as conn:  # the same guards as Flight: SQL reaches no file
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            conn.execute(sql)
        assert caught.value.sqlstate == "42501"
        assert "root:" not in str(caught.value)


def test_psql_under_the_c_locale_connects(server):
    # psql's client_encoding "auto" is SQL_ASCII under LANG=C: no conversion, which is what ivm does.
    env = {**os.environ, "PGCONNECT_TIMEOUT": "20", "PSQLRC": "/dev/null", "LANG": "C", "LC_ALL": "C",
           "PGCLIENTENCODING": "SQL_ASCII"}
    result = subprocess.run(["psql", "-X", "-At", "-h", "127.0.0.1", "-p", str(server.pg_port), "-U", "any", "shop",
                             "-c", "SHOW client_encoding"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "UTF8"
