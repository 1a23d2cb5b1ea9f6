"""The ``ivm`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ivm", description="incremental materialized views")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run an embedded database with a small demo")
    demo.add_argument("--batches", type=int, default=3, help="change batches to stream")
    demo.add_argument("--rows", type=int, default=200, help="initial orders")
    demo.add_argument("--shell", action=argparse.BooleanOptionalAction, default=None,
                      help="open a SQL shell afterwards (default: when stdin is a terminal)")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from ivm.demo import run

        shell = sys.stdin.isatty() if args.shell is None else args.shell
        run(batches=args.batches, rows=args.rows, shell=shell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
