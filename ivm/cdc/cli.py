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
    from ivm.cdc.postgres import WAL_WARNING_SECONDS

    replicate = commands.add_parser("replicate", help="follow a PostgreSQL publication (logical replication)")
    replicate.add_argument("--data", required=True, help="the database directory")
    replicate.add_argument("--dsn", required=True, help="libpq connection string of the upstream PostgreSQL")
    replicate.add_argument("--publication", required=True, help="the upstream publication to follow")
    replicate.add_argument("--slot", default=None, help="replication slot name (default ivm_<publication>)")
    replicate.add_argument("--name", default=None, help="source name in ivm status (default pg_<publication>)")
    replicate.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until killed)")
    replicate.add_argument("--progress-seconds", type=float, default=10.0, metavar="SECONDS",
                           help="print the streaming progress this often (default 10)")
    replicate.add_argument("--wal-warning-seconds", type=float, default=WAL_WARNING_SECONDS, metavar="SECONDS",
                           help="ivm status warns that the slot holds WAL once the source has been failed or "
                                f"stopped this long (default {WAL_WARNING_SECONDS:g}; kept from the first run)")


def replicate(args: argparse.Namespace) -> int:
    """Run one source in the foreground, saying what it does on stdout, one plain line at a time."""
    import ivm
    from ivm.cdc.postgres import Replicator, SourceConfig

    db = _connect(args.data)
    if db is None:
        return 1
    name = args.name or f"pg_{args.publication}"
    config = SourceConfig(name, args.dsn, args.publication, args.slot or f"ivm_{args.publication}",
                          args.wal_warning_seconds)

    def say(line: str) -> None:
        print(line, flush=True)

    with db:
        replicator = Replicator(db, config, say=say, say_every=args.progress_seconds)
        try:
            replicator.run(seconds=args.seconds)
        except ivm.IvmError as e:
            print(f"ivm: source {name} stopped: {e}", file=sys.stderr)
            _slot_left(replicator, name)
            return 1
        except KeyboardInterrupt:
            pass
        _slot_left(replicator, name)
    return 0


def _slot_left(replicator, name: str) -> None:
    """Say that the slot, when it exists, holds WAL upstream until the source runs again or is dropped."""
    if not replicator.state_file.exists():  # a new source that failed left nothing, its slot included
        return
    p = replicator.progress
    print(f"source {name}: stopped: {p['rows']} rows applied, confirmed LSN {p.get('confirmed_lsn')}", flush=True)
    print(f"ivm: replication slot {replicator.config.slot} stays upstream and holds WAL until ivm replicate runs "
          f"again (or: ivm sql --data {replicator.db.path} 'DROP SOURCE {name}', which drops it)", file=sys.stderr)
