"""The ``ivm`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from ivm.engine_choice import ENGINES



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

    status = commands.add_parser("status", help="offsets, lags and sizes of a durable database")
    status.add_argument("--data", required=True, help="the database directory")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sql = commands.add_parser("sql", help="run SQL statements on a durable database (a progress bar while "
                                            "CREATE MATERIALIZED VIEW computes the view)")
    sql.add_argument("--data", required=True, help="the database directory (created if missing)")
    sql.add_argument("--engine", choices=ENGINES, default="duckdb", help="maintenance engine (as ivm serve)")
    sql.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                     help="a Spark setting (repeatable)")
    sql.add_argument("statements", help="one or more ';'-separated statements")
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
    if args.command == "sql":
        from ivm.cli_sql import run_sql

        return run_sql(args.data, args.statements, {"engine": args.engine,
                                                    "spark_conf": _spark_conf(parser, args.spark_conf)})
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
        from ivm.demo import run

        shell = sys.stdin.isatty() if args.shell is None else args.shell
        run(batches=args.batches, rows=args.rows, shell=shell)
    return 0


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

    if not (Path(args.data) / "checkpoint.json").exists() and not (Path(args.data) / "log").exists():
        print(f"ivm: {args.data} is not an ivm database directory", file=sys.stderr)
        return 2
    try:
        db = ivm.connect(args.data)
    except ivm.IvmError as e:
        print(f"ivm: {e}", file=sys.stderr)
        if args.command == "status" and "open in another process" in str(e):
            return _sources_only(args)
        return 1
    with db:
        if args.command == "compact":
            print(json.dumps(db.compact()))
            return 0
        facts = db.status()
        if args.json:
            print(json.dumps(facts, indent=1))
            return 0
        _print_status(facts)
    return 0


def _sources_only(args: argparse.Namespace) -> int:
    """Status of the CDC sources from their files, while another process holds the database."""
    import json

    from ivm.cdc.postgres import sources_status

    sources = sources_status(args.data)
    if args.json:
        print(json.dumps({"sources": sources}, indent=1))
    else:
        _print_rows("sources (the database is open in another process)", sources)
        _print_source_warnings(sources)
    return 0


def _print_source_warnings(sources: list[dict]) -> None:
    """Each source's WAL warning on a line of its own, where a wide table cannot cut it off."""
    for source in sources:
        if source.get("warning"):
            print(f"warning: {source['warning']}")


def _print_rows(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    columns = list(rows[0]) if rows else []
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console().print(table)


def _print_status(facts: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if facts.get("sources"):
        _print_rows("sources", facts["sources"])
        _print_source_warnings(facts["sources"])
    overview = {k: v for k, v in facts.items() if k not in ("relations", "sources")}
    for key, value in overview.items():
        console.print(f"[bold]{key}[/bold]: {value}")
    table = Table()
    columns = list(facts["relations"][0]) if facts["relations"] else []
    for column in columns:
        table.add_column(column)
    for row in facts["relations"]:
        table.add_row(*("" if row[c] is None else str(row[c]) for c in columns))
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
