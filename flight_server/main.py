"""``ivm serve``: run the Flight SQL server until SIGTERM or SIGINT.

Prints one line ``ivm: serving Arrow Flight SQL on grpc://HOST:PORT`` when
ready (``--port 0`` picks a free port; the line tells which), then how to
connect: ``ivm sql --connect``, ``ivm status --connect`` and an ADBC snippet,
with a query that works on this database (the demo's view only where the
demo is loaded). With ``--data`` the address is recorded in the directory
(ivm/cli/serving.py) while the server runs, so ``ivm sql --data`` can name it. With ``--pg-port N`` it also serves PostgreSQL
clients (flight_server/pgwire/) and prints ``ivm: serving PostgreSQL on
postgresql://HOST:PORT`` just before the Flight line; with ``--metrics-port N``
it serves Prometheus metrics (flight_server/metrics.py) and prints ``ivm:
serving Prometheus metrics on http://HOST:PORT/metrics``, also before the
Flight line. A port that is taken fails the start with a message naming it.
On SIGTERM/SIGINT it stops accepting calls, ends live subscriptions, lets
in-flight calls finish and closes the database.
"""

from __future__ import annotations

import logging
import random
import signal
import sys
import threading
from pathlib import Path

import pyarrow.flight as fl

import ivm
from ivm.cli import serving
from flight_server.errors import quiet_tracebacks
from flight_server.metrics import MetricsServer
from flight_server.pgwire.server import PgServer
from flight_server.server import IvmFlightServer

log = logging.getLogger("ivm.flight")


def open_database(data: str | None, demo: bool, options: dict | None = None) -> ivm.Database:
    db = ivm.connect(data, **(options or {}))
    if demo:
        from ivm.cli.demo import setup

        try:
            setup(db, rows=200, rng=random.Random(7))
        except ivm.CatalogError as e:  # a durable database that already holds the demo
            log.warning("demo not loaded: %s", e)
    return db


def tls_pair(cert: str | None, key: str | None) -> list[fl.CertKeyPair]:
    if (cert is None) != (key is None):
        raise SystemExit("ivm serve: --tls-cert and --tls-key go together")
    if cert is None:
        return []
    return [fl.CertKeyPair(cert=Path(cert).read_bytes(), key=Path(key).read_bytes())]


DEMO_VIEW = "region_sales"  # ivm/cli/demo.py's: suggested only where it exists


def first_query(db: ivm.Database) -> str:
    """A query that works on this database: the demo's view when it holds it, else SHOW TABLES."""
    return f"SELECT * FROM {DEMO_VIEW}" if any(o.name == DEMO_VIEW for o in db.objects()) else "SHOW TABLES"


def snippet(uri: str, token: str | None, query: str = "SHOW TABLES", tls_cert: str | None = None) -> str:
    auth = ', db_kwargs={"username": "ivm", "password": "<token>"}' if token else ""
    shell_options = (" --auth-token <token>" if token else "") + (f" --tls-root-certs {tls_cert}" if tls_cert else "")
    return (
        f"a shell:  ivm sql --connect {uri}{shell_options}   (or add \"{query}\" to run it)\n"
        f"status:   ivm status --connect {uri}{shell_options}\n"
        "connect with ADBC (pip install adbc-driver-flightsql pyarrow):\n"
        "    import adbc_driver_flightsql.dbapi as flight_sql\n"
        f'    with flight_sql.connect("{uri}"{auth}, autocommit=True) as conn, conn.cursor() as cur:\n'
        f'        cur.execute("{query}")\n'
        "        print(cur.fetch_arrow_table())"
    )


def pg_snippet(host: str, port: int, token: str | None, tls: bool) -> str:
    password = "PGPASSWORD=<token> " if token else ""
    mode = " sslmode=require" if tls else ""
    return (f"connect with psql:  {password}psql \"host={host} port={port} user=ivm dbname=ivm{mode}\"\n"
            f"or psycopg:         psycopg.connect(\"postgresql://ivm@{host}:{port}/ivm\"{', password=<token>' if token else ''})")


def serve(data: str | None, host: str, port: int, auth_token: str | None, tls_cert: str | None,
          tls_key: str | None, demo: bool, options: dict | None = None, pg_host: str = "127.0.0.1",
          pg_port: int | None = None, metrics_host: str = "127.0.0.1", metrics_port: int | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="ivm: %(message)s", stream=sys.stderr)
    quiet_tracebacks()
    tls = tls_pair(tls_cert, tls_key)
    try:
        db = open_database(data, demo, options)
    except (ivm.IvmError, OSError) as e:  # e.g. --data names a path under a file
        print(f"ivm serve: {e}", file=sys.stderr)
        return 1
    scheme = "grpc+tls" if tls else "grpc"
    try:
        server = IvmFlightServer(db, f"{scheme}://{host}:{port}", auth_token=auth_token, tls_certificates=tls)
    except Exception as e:  # noqa: BLE001 (e.g. the port is taken)
        db.close()
        print(f"ivm serve: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 1
    uri = f"{scheme}://{host}:{server.port}"
    running = [server]  # stopped in reverse order, then the database is closed

    def give_up(message: str) -> int:
        for door in reversed(running):
            door.stop()
        db.close()
        print(f"ivm serve: {message}", file=sys.stderr)
        return 1

    if pg_port is not None:
        try:
            pg = PgServer(db, pg_host, pg_port, auth_token=auth_token, tls_cert=tls_cert, tls_key=tls_key,
                          max_statement_bytes=(options or {}).get("max_statement_bytes", 1 << 20)).start()
        except OSError as e:
            return give_up(f"cannot listen on {pg_host}:{pg_port} for PostgreSQL clients: {e}")
        running.append(pg)
        # Printed before the Flight line, which tells a waiting script that the server is ready.
        print(f"ivm: serving PostgreSQL on postgresql://{pg.host}:{pg.port}", flush=True)
        print(pg_snippet(pg.host, pg.port, auth_token, bool(tls)), file=sys.stderr, flush=True)
    if metrics_port is not None:
        try:
            metrics = MetricsServer(db, metrics_host, metrics_port)
        except OSError as e:
            return give_up(f"cannot listen on {metrics_host}:{metrics_port} for metrics: {e}")
        running.append(metrics)
        print(f"ivm: serving Prometheus metrics on {metrics.url}", flush=True)  # also before the Flight line
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if data is not None:  # so that ivm sql/status --data can name the address to --connect to instead
        try:
            serving.record(data, uri, f"postgresql://{pg.host}:{pg.port}" if pg_port is not None else None,
                           auth=bool(auth_token))
        except OSError as e:  # only a hint is lost
            log.warning("could not record the address in %s: %s", data, e)
    print(f"ivm: serving Arrow Flight SQL on {uri}", flush=True)
    print(snippet(uri, auth_token, first_query(db), tls_cert), file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    log.info("shutting down")
    if data is not None:
        serving.forget(data)
    for door in reversed(running):
        door.stop()
    db.close()
    log.info("stopped")
    return 0
