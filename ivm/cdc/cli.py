"""``ivm ingest debezium`` and ``ivm replicate``: the CDC sources on the command line."""

from __future__ import annotations

import argparse
import json
import sys


def _connect(data: str):
    """The database at ``data``, or None after saying why it cannot be opened."""
    import ivm

    try:
        return ivm.connect(data)
    except ivm.IvmError as e:
        print(f"ivm: {e}", file=sys.stderr)
        return None


def ingest_debezium(args: argparse.Namespace) -> int:
    import ivm
    from ivm.cdc import debezium

    db = _connect(args.data)
    if db is None:
        return 1
    with db:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
        try:
            result = debezium.ingest(db, args.table, debezium.read_chunks(stream), args.source)
        except ivm.IvmError as e:
            print(f"ivm: {e}", file=sys.stderr)
            return 1
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
    print(json.dumps(result.as_dict()))
    return 0


def add_replicate(commands) -> None:
    replicate = commands.add_parser("replicate", help="follow a PostgreSQL publication (logical replication)")
    replicate.add_argument("--data", required=True, help="the database directory")
    replicate.add_argument("--dsn", required=True, help="libpq connection string of the upstream PostgreSQL")
    replicate.add_argument("--publication", required=True, help="the upstream publication to follow")
    replicate.add_argument("--slot", default=None, help="replication slot name (default ivm_<publication>)")
    replicate.add_argument("--name", default=None, help="source name in ivm status (default pg_<publication>)")
    replicate.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until killed)")


def replicate(args: argparse.Namespace) -> int:
    import ivm
    from ivm.cdc.postgres import Replicator, SourceConfig

    db = _connect(args.data)
    if db is None:
        return 1
    name = args.name or f"pg_{args.publication}"
    config = SourceConfig(name, args.dsn, args.publication, args.slot or f"ivm_{args.publication}")
    with db:
        replicator = Replicator(db, config)
        try:
            replicator.run(seconds=args.seconds)
        except ivm.IvmError as e:
            print(f"ivm: source {name} stopped: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
    return 0
