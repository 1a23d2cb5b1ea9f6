"""``ivm sql --connect`` and ``ivm status --connect`` against a real ``ivm serve``.

One durable server for the module, with everything a client must get
right at once: a token, TLS (clients trust its certificate with
--tls-root-certs) and the PostgreSQL door. The CLI runs in this process
(``ivm.cli.cli.main``) where that is enough, and as a process where stdin or a
terminal matters (the shell).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from ivm.cli.cli import main
from tests.flight.server import ROOT, ServerProcess
from tests.flight.test_auth_tls import make_certificate

TOKEN = "shell-token"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("shell")
    cert, key, _ = make_certificate(home)
    data = str(home / "db")
    server = ServerProcess("--data", data, "--auth-token", TOKEN, "--tls-cert", cert, "--tls-key", key,
                           "--pg-port", "0")
    try:
        yield server, data, cert
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def no_token_in_environment(monkeypatch):
    monkeypatch.delenv("IVM_AUTH_TOKEN", raising=False)


def ivm(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def sql(capsys, served, *statements: str, token: str | None = TOKEN) -> tuple[int, str, str]:
    server, _, cert = served
    auth = ("--auth-token", token) if token is not None else ()
    return ivm(capsys, "sql", "--connect", server.uri, *auth, "--tls-root-certs", cert, *statements)


def banner(server: ServerProcess, timeout: float = 30.0) -> str:
    """What the server printed on stderr once ready: its last line comes after the ready line."""
    deadline = time.monotonic() + timeout
    while "print(cur.fetch_arrow_table())" not in "".join(server.stderr):
        assert time.monotonic() < deadline, "".join(server.stderr)
        time.sleep(0.05)
    return "".join(server.stderr)


def test_banner_without_the_demo_suggests_what_works(served):
    server, _, cert = served
    banner_text = banner(server)
    assert f"ivm sql --connect {server.uri} --auth-token <token> --tls-root-certs {cert}" in banner_text
    assert f"ivm status --connect {server.uri}" in banner_text
    assert 'cur.execute("SHOW TABLES")' in banner_text
    assert "region_sales" not in banner_text


def test_statements_run_in_order_print_each_result_and_stop_at_the_first_error(capsys, served):
    code, out, err = sql(capsys, served, "CREATE TABLE items (id BIGINT PRIMARY KEY, label VARCHAR); "
                         "INSERT INTO items VALUES (1, 'short'), (2, '" + "x" * 60 + "'); "
                         "SELECT id, label FROM items ORDER BY id")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("OK, 0 rows affected (")
    assert lines[1].startswith("OK, 2 rows affected (")
    header = lines.index("id  label")
    assert lines[header + 2] == " 1  short"
    assert lines[header + 3] == " 2  " + "x" * 39 + "…"  # wide cells are cut
    assert re.fullmatch(r"\(2 rows, [\d.]+ (ms|s)\)", lines[header + 4])

    code, out, err = sql(capsys, served, "INSERT INTO items VALUES (3, 'c'); SELECT * FROM nope; "
                         "INSERT INTO items VALUES (4, 'd')")
    assert code == 1 and err == "ivm sql: table or view nope does not exist\n"
    code, out, _ = sql(capsys, served, "SELECT COUNT(*) AS n FROM items")
    assert code == 0 and out.splitlines()[2] == "3"  # the statement after the error did not run


def test_token_missing_or_wrong_is_a_clear_error(capsys, served, monkeypatch):
    code, _, err = sql(capsys, served, "SELECT 1", token=None)
    assert code == 1 and "requires a token: pass --auth-token TOKEN (or set IVM_AUTH_TOKEN)" in err
    code, _, err = sql(capsys, served, "SELECT 1", token="wrong")
    assert code == 1 and "refused the token" in err and "Traceback" not in err
    monkeypatch.setenv("IVM_AUTH_TOKEN", TOKEN)
    code, out, _ = sql(capsys, served, "SELECT 41 + 1 AS answer", token=None)
    assert code == 0 and out.splitlines()[2] == "    42"


def test_bad_addresses_and_misplaced_options(capsys, served, tmp_path):
    server, data, cert = served
    code, _, err = ivm(capsys, "sql", "--connect", "http://127.0.0.1:8815", "SELECT 1")
    assert code == 1 and "grpc://HOST:PORT" in err
    plain = server.uri.replace("grpc+tls://", "grpc://")
    code, _, err = ivm(capsys, "sql", "--connect", plain, "--tls-root-certs", cert, "SELECT 1")
    assert code == 1 and "use grpc+tls://" in err
    code, _, err = ivm(capsys, "sql", "--connect", server.uri, "--tls-root-certs", str(tmp_path / "none.pem"),
                       "SELECT 1")
    assert code == 1 and "cannot read --tls-root-certs" in err
    with pytest.raises(SystemExit):
        main(["sql", "--data", data, "--auth-token", TOKEN, "SELECT 1"])
    assert "--auth-token goes with --connect, not --data" in capsys.readouterr().err


def test_sql_and_status_on_a_served_directory_name_the_address(capsys, served):
    server, data, _ = served
    code, _, err = ivm(capsys, "sql", "--data", data, "SELECT 1")
    assert code == 1 and "is open in another process" in err
    assert f"run ivm sql --connect {server.uri} --auth-token TOKEN" in err
    code, _, err = ivm(capsys, "status", "--data", data)
    assert f"run ivm status --connect {server.uri} --auth-token TOKEN" in err


def test_the_postgresql_door(capsys, served):
    server, _, cert = served
    code, out, err = ivm(capsys, "sql", "--connect", server.pg_uri + "/ivm?user=ivm", "--auth-token", TOKEN,
                         "--tls-root-certs", cert, "CREATE TABLE door (id BIGINT PRIMARY KEY); "
                         "INSERT INTO door VALUES (7); SELECT id FROM door; SELECT * FROM nope")
    assert code == 1, err
    assert "id\n--\n 7\n(1 row, " in out
    assert "ivm sql: " in err and "nope" in err and "Traceback" not in err


def test_status_fits_80_columns_and_json_is_the_facts(capsys, served):
    assert sql(capsys, served, "CREATE TABLE orders_with_a_rather_long_name_for_a_table "
               "(id BIGINT PRIMARY KEY, region VARCHAR, amount DOUBLE); "
               "INSERT INTO orders_with_a_rather_long_name_for_a_table VALUES (1, 'n', 2.5), (2, 's', 4.0), "
               "(3, 'n', 1.0); CREATE MATERIALIZED VIEW sales_by_region AS SELECT region, SUM(amount) AS total "
               "FROM orders_with_a_rather_long_name_for_a_table GROUP BY region")[0] == 0
    server, data, cert = served
    code, out, err = ivm(capsys, "status", "--connect", server.uri, "--auth-token", TOKEN, "--tls-root-certs", cert)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    assert "{" not in out and not re.search(r"\d{9,}\.\d", out), out  # no dicts, no epoch floats
    assert lines[0] == f"database     {data}"
    [table] = [line.split() for line in lines if line.startswith("orders_with_a_rather")]
    assert table[1:3] == ["table", "3"] and table[-1] == "ok"
    assert any(line.startswith("sales_by_region") for line in lines)
    assert re.search(r"\d+(\.\d)? (B|KiB)", out)

    code, out, _ = ivm(capsys, "status", "--connect", server.uri, "--auth-token", TOKEN, "--tls-root-certs", cert,
                       "--json")
    facts = json.loads(out)
    rows = {r["name"]: r["rows"] for r in facts["relations"]}
    assert rows["orders_with_a_rather_long_name_for_a_table"] == 3 and "sales_by_region" in rows
    assert facts["path"] == data and facts["log_head"] >= 1


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kwargs.pop("env", {})}
    env.pop("IVM_AUTH_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "ivm", *args], cwd=ROOT, env=env, **kwargs)


def test_shell_reads_statements_from_a_pipe(served, tmp_path):
    server, _, cert = served
    script = ("CREATE TABLE piped (id BIGINT PRIMARY KEY, note VARCHAR);\n"
              "INSERT INTO piped\n  VALUES (1, 'a;b'),\n         (2, 'it''s');\n"
              "SELECT * FROM missing;\n"
              "\\x\n"
              "SELECT note FROM piped\nWHERE id = 1; SELECT COUNT(*) AS n FROM piped;\n"
              "SELECT id FROM piped WHERE id = 2\n")  # the last statement has no ';': it runs at end of input
    shell = _cli("sql", "--connect", server.uri, "--auth-token", TOKEN, "--tls-root-certs", cert,
                 env={"HOME": str(tmp_path)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    out, err = shell.communicate(script, timeout=120)
    assert shell.returncode == 1, err  # from a pipe: 1 when a statement failed, after running the rest
    assert err.splitlines() == ["ERROR: table or view missing does not exist",
                                "ERROR: unknown command \\x; \\? for help, \\q to quit"]
    assert "ivm>" not in out  # no prompts when not on a terminal
    assert "note\n----\na;b\n(1 row, " in out
    assert "n\n-\n2\n(1 row, " in out
    assert "id\n--\n 2\n(1 row, " in out
    assert not (tmp_path / ".ivm_history").exists()  # history is for terminals


def _read_until(fd: int, needle: str, seen: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in "".join(seen):
        if time.monotonic() > deadline or not select.select([fd], [], [], deadline - time.monotonic())[0]:
            raise AssertionError(f"{needle!r} not shown; the terminal shows:\n{''.join(seen)}")
        try:
            seen.append(os.read(fd, 4096).decode(errors="replace"))
        except OSError:  # the shell exited
            raise AssertionError(f"{needle!r} not shown before exit:\n{''.join(seen)}") from None


def test_shell_on_a_terminal_prompts_and_keeps_history(served, tmp_path):
    server, _, cert = served
    (tmp_path / ".ivm_history").write_text("SELECT 'from before'\n")
    controller, terminal = pty.openpty()
    shell = _cli("sql", "--connect", server.uri, "--auth-token", TOKEN, "--tls-root-certs", cert,
                 env={"HOME": str(tmp_path), "TERM": "dumb"}, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen: list[str] = []
    try:
        _read_until(controller, "ivm> ", seen)
        assert f"connected to {server.uri}" in "".join(seen)
        os.write(controller, b"SELECT 6 * 7\n")
        _read_until(controller, "...> ", seen)  # no ';' yet: the statement goes on
        os.write(controller, b"  AS answer;\n")
        _read_until(controller, "(1 row, ", seen)
        os.write(controller, b"SELECT * FROM nope;\n")
        _read_until(controller, "ERROR: table or view nope does not exist", seen)
        os.write(controller, b"\\q\n")
        assert shell.wait(60) == 0  # errors on a terminal do not make the exit status
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait(10)
        os.close(controller)
    screen = "".join(seen).replace("\r\n", "\n")
    assert "answer\n------\n    42\n" in screen and "Traceback" not in screen
    history = (tmp_path / ".ivm_history").read_text().splitlines()
    assert history == ["SELECT 'from before'", "SELECT 6 * 7 AS answer;", "SELECT * FROM nope;"]
