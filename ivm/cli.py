"""The ``ivm`` command line."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ivm", description="incremental materialized views")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run an embedded database with a small demo")
    demo.add_argument("--batches", type=int, default=3, help="change batches to stream")
    demo.add_argument("--rows", type=int, default=200, help="initial orders")
    demo.add_argument("--shell", action=argparse.BooleanOptionalAction, default=None,
                      help="open a SQL shell afterwards (default: when stdin is a terminal)")

    serve = commands.add_parser("serve", help="run the Arrow Flight SQL server")
    serve.add_argument("--data", metavar="DIR", default=None,
                       help="durable storage directory (default: in memory, nothing on disk)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8815, help="port (default 8815; 0 picks a free one)")
    serve.add_argument("--auth-token", default=os.environ.get("IVM_AUTH_TOKEN"),
                       help="require this token (Bearer, or as the password of Basic auth); "
                            "default $IVM_AUTH_TOKEN, else no authentication")
    serve.add_argument("--tls-cert", metavar="PEM", default=None, help="serve TLS with this certificate")
    serve.add_argument("--tls-key", metavar="PEM", default=None, help="private key of --tls-cert")
    serve.add_argument("--demo", action="store_true", help="load the demo tables and views (see ivm demo)")

    args = parser.parse_args(argv)
    if args.command == "serve":
        from flight_server.main import serve as run_server

        return run_server(args.data, args.host, args.port, args.auth_token, args.tls_cert, args.tls_key, args.demo)
    if args.command == "demo":
        from ivm.demo import run

        shell = sys.stdin.isatty() if args.shell is None else args.shell
        run(batches=args.batches, rows=args.rows, shell=shell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
