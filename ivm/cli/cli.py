"""The ``ivm`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from ivm.maintain.engine_choice import ENGINES



def _niceness(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 19:
        raise argparse.ArgumentTypeError(f"an OS niceness from 0 to 19, not {text!r}")
    return int(text)

def _non_negative(kind: type) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = -1
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"a non-negative {kind.__name__}, not {text!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ivm", description="incremental materialized views")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run an embedded database with a small demo")
    demo.add_argument("--batches", type=int, default=3, help="change batches to stream")
    demo.add_argument("--rows", type=int, default=200, help="initial orders")
    demo.add_argument("--shell", action=argparse.BooleanOptionalAction, default=None,
                      help="open a SQL shell afterwards (default: when stdin is a terminal)")

    status = commands.add_parser("status", help="offsets, lags and sizes of a durable database or a running server")
    status_target = status.add_mutually_exclusive_group(required=True)
    status_target.add_argument("--data", help="the database directory (not while ivm serve holds it)")
    status_target.add_argument("--connect", metavar="URL", help="a running ivm serve: grpc://HOST:PORT")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _client_arguments(status)
    sql = commands.add_parser("sql", help="run SQL statements, or a shell, on a durable database or a running "
                                            "server (a progress bar while CREATE MATERIALIZED VIEW computes "
                                            "the view)")
    sql_target = sql.add_mutually_exclusive_group(required=True)
    sql_target.add_argument("--data", help="the database directory (created if missing)")
    sql_target.add_argument("--connect", metavar="URL",
                            help="a running ivm serve: grpc://HOST:PORT (grpc+tls:// with TLS), or "
                                 "postgresql://HOST:PORT for its PostgreSQL door (needs psycopg)")
    sql.add_argument("--engine", choices=ENGINES, default=None, help="with --data: maintenance engine (as ivm serve)")
    sql.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                     help="with --data: a Spark setting (repeatable)")
    _client_arguments(sql)
    sql.add_argument("statements", nargs="?", default=None,
                     help="one or more ';'-separated statements (none: a shell reading them from stdin, with "
                          "history in ~/.ivm_history)")
    compact = commands.add_parser("compact", help="checkpoint, compact the retained log, vacuum stored files")
    compact.add_argument("--data", required=True, help="the database directory")
    serve = commands.add_parser("serve", help="run the Arrow Flight SQL server (and, with --pg-port, the PostgreSQL one)")
    serve.add_argument("--data", metavar="DIR", default=None,
                       help="durable storage directory (default: in memory, nothing on disk)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8815, help="port (default 8815; 0 picks a free one)")
    serve.add_argument("--auth-token", default=os.environ.get("IVM_AUTH_TOKEN"),
                       help="require this token (Bearer, or as the password of Basic auth); "
                            "default $IVM_AUTH_TOKEN, else no authentication")
    serve.add_argument("--tls-cert", metavar="PEM", default=None, help="serve TLS with this certificate")
    serve.add_argument("--tls-key", metavar="PEM", default=None, help="private key of --tls-cert")
    serve.add_argument("--pg-port", type=int, default=None, metavar="N",
                       help="also serve PostgreSQL clients (psql, psycopg, asyncpg) on this port "
                            "(0 picks a free one; default: off)")
    serve.add_argument("--pg-host", default="127.0.0.1", help="address for --pg-port (default 127.0.0.1)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="N",
                       help="also serve Prometheus metrics over HTTP on this port, at /metrics "
                            "(0 picks a free one; default: off)")
    serve.add_argument("--metrics-host", default="127.0.0.1",
                       help="address for --metrics-port (default 127.0.0.1; the endpoint has no authentication)")
    serve.add_argument("--demo", action="store_true", help="load the demo tables and views (see ivm demo)")
    serve.add_argument("--ingest-nice", type=_niceness, default=0, metavar="N",
                       help="in memory: apply change batches on a thread at OS niceness N (0-19), so lookups "
                            "get a core first (default 0: off)")
    serve.add_argument("--engine", choices=ENGINES, default="duckdb",
                       help="maintenance engine: duckdb (default), spark, or auto (Spark for large inputs)")
    serve.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                       help="a Spark setting, e.g. spark.master=spark://127.0.0.1:7077 (repeatable)")
    serve.add_argument("--max-statement-bytes", type=_non_negative(int), default=1 << 20, metavar="N",
                       help="refuse SQL statements longer than N bytes (default 1048576 = 1 MiB; 0: no limit)")
    serve.add_argument("--statement-timeout", type=_non_negative(float), default=0.0, metavar="SECONDS",
                       help="cancel a statement whose query runs longer than this; nothing changes "
                            "(default 0: no limit)")

    ingest = commands.add_parser("ingest", help="apply change events from a file or stdin")
    formats = ingest.add_subparsers(dest="format", required=True)
    debezium = formats.add_parser("debezium", help="Debezium JSON events, one per line (see ivm/cdc/debezium.py)")
    debezium.add_argument("--data", required=True, help="the database directory")
    debezium.add_argument("--table", required=True, help="the table the events apply to")
    debezium.add_argument("--source", default=None,
                          help="producer name for idempotent re-delivery (default debezium:<table>)")
    debezium.add_argument("file", help="the events file, or - for stdin")
    from ivm.cdc.cli import add_replicate

    add_replicate(commands)

    bench = commands.add_parser("bench", help="benchmarks: incremental maintenance versus full recompute")
    workloads = bench.add_subparsers(dest="workload", required=True)
    from bench.tpch_report import add_arguments

    add_arguments(workloads.add_parser("tpch", help="the TPC-H queries as views under a refresh stream "
                                                    "(report, plots; see bench/README.md)"))
    from bench.nexmark_run import add_arguments as nexmark_arguments

    nexmark_arguments(workloads.add_parser("nexmark", help="the Nexmark queries (q5, q7, q8, q11) as views over the "
                                                          "event generator (report; see bench/README.md)"))

    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    if args.command == "ingest":
        from ivm.cdc.cli import ingest_debezium

        return ingest_debezium(args)
    if args.command == "replicate":
        from ivm.cdc.cli import replicate

        return replicate(args)
    if args.command in ("sql", "status"):
        _check_client_arguments(parser, args)
    if args.command == "sql":
        from ivm.cli.cli_sql import run_remote, run_sql

        if args.connect:
            return run_remote(args.connect, args.statements, _token(args), args.tls_root_certs)
        return run_sql(args.data, args.statements, {"engine": args.engine or "duckdb",
                                                    "spark_conf": _spark_conf(parser, args.spark_conf)})
    if args.command == "status" and args.connect:
        return _remote_status(args)
    if args.command in ("status", "compact"):
        return _maintenance(args)
    if args.command == "serve":
        from flight_server.main import serve as run_server

        options = {"engine": args.engine, "spark_conf": _spark_conf(parser, args.spark_conf),
                   "ingest_nice": args.ingest_nice, "max_statement_bytes": args.max_statement_bytes,
                   "statement_timeout": args.statement_timeout or None}
        return run_server(args.data, args.host, args.port, args.auth_token, args.tls_cert, args.tls_key, args.demo,
                          options, pg_host=args.pg_host, pg_port=args.pg_port,
                          metrics_host=args.metrics_host, metrics_port=args.metrics_port)
    if args.command == "demo":
        from ivm.cli.demo import run

        shell = sys.stdin.isatty() if args.shell is None else args.shell
        run(batches=args.batches, rows=args.rows, shell=shell)
    return 0


def _client_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--auth-token", default=None,
                         help="with --connect: the server's token (default $IVM_AUTH_TOKEN)")
    command.add_argument("--tls-root-certs", metavar="PEM", default=None,
                         help="with --connect to a grpc+tls:// server: trust the certificates in this file "
                              "(e.g. the server's own --tls-cert)")


def _check_client_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.connect is None:
        given = [flag for flag, value in (("--auth-token", args.auth_token), ("--tls-root-certs", args.tls_root_certs))
                 if value is not None]
        if given:
            parser.error(f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --connect, not --data")
    elif args.command == "sql" and (args.engine is not None or args.spark_conf):
        parser.error("--engine and --spark-conf go with --data; a server (--connect) has its own settings")


def _token(args: argparse.Namespace) -> str | None:
    return args.auth_token if args.auth_token is not None else os.environ.get("IVM_AUTH_TOKEN") or None


def _spark_conf(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--spark-conf takes KEY=VALUE, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _bench(args: argparse.Namespace) -> int:
    if args.workload == "nexmark":
        from bench.nexmark_run import main as nexmark

        return nexmark(args)
    from bench.tpch_report import main as tpch

    return tpch(args)


def _maintenance(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import ivm
    from ivm.cli.serving import connect_hint

    if not (Path(args.data) / "checkpoint.json").exists() and not (Path(args.data) / "log").exists():
        print(f"ivm: {args.data} is not an ivm database directory", file=sys.stderr)
        return 2
    try:
        db = ivm.connect(args.data)
    except ivm.IvmError as e:
        locked = "open in another process" in str(e)
        print(f"ivm: {e}" + (f"\n{connect_hint(args.data, f'ivm {args.command}')}" if locked else ""),
              file=sys.stderr)
        if args.command == "status" and locked:
            return _sources_only(args)
        return 1
    with db:
        if args.command == "compact":
            print(json.dumps(db.compact()))
            return 0
        _print_status(db.status(), args.json)
    return 0


def _remote_status(args: argparse.Namespace) -> int:
    """SHOW STATUS of a running server: its rows are the relations, its schema metadata the rest."""
    import json

    from ivm.cli.remote import FlightConnection, RemoteError, connect

    try:
        connection = connect(args.connect, _token(args), args.tls_root_certs)
    except RemoteError as e:
        print(f"ivm status: {e}", file=sys.stderr)
        return 1
    try:
        if not isinstance(connection, FlightConnection):
            print("ivm status: --connect needs the server's Flight SQL address (grpc://HOST:PORT): the "
                  "database-wide facts of SHOW STATUS travel in Arrow metadata", file=sys.stderr)
            return 2
        table = connection.arrow("SHOW STATUS")
    except RemoteError as e:
        print(f"ivm status: {e}", file=sys.stderr)
        return 1
    finally:
        connection.close()
    facts = json.loads((table.schema.metadata or {}).get(b"ivm.status", b"{}"))
    facts["relations"] = table.to_pylist()
    _print_status(facts, args.json)
    return 0


def _sources_only(args: argparse.Namespace) -> int:
    """Status of the CDC sources from their files, while another process holds the database."""
    from ivm.cdc.postgres import sources_status

    _print_status({"sources": sources_status(args.data)}, args.json)
    return 0


def _print_status(facts: dict, as_json: bool) -> None:
    import json
    import shutil

    from ivm.reads.status_text import WIDTH, status_lines

    if as_json:
        print(json.dumps(facts, indent=1))
        return
    # 80 columns unless the terminal is wider (a pipe gets 80, so the output reads the same in a log)
    width = max(WIDTH, shutil.get_terminal_size().columns) if sys.stdout.isatty() else WIDTH
    print("\n".join(status_lines(facts, width=width)))
    for source in facts.get("sources") or []:  # on lines of their own, where a table cannot cut them off
        if source.get("warning"):
            print(f"warning: {source['warning']}")


if __name__ == "__main__":
    sys.exit(main())
