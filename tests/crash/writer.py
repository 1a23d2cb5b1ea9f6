"""The crash harness's writer: ingests random batches until it is killed.

    python -m tests.crash.writer DB_DIR SIDE_DIR SEED [--compact-every N] [--retain] [--ddl-every N]

On start it opens the database (recovery), creates the schema and views if
they are missing, re-sends its last intended batch (same source and seq: the
database applies it only if it never did), then loops: generate a valid
batch against the model of every intent so far, record the intent, send it,
record the acknowledged offset; with ``--ddl-every N``, after every N
batches run the next DDL step (tests/crash/workload.py: DDL_STEPS), having
first run again the step a kill interrupted. Crash points are widened by storage.hooks
(IVM_CRASH_HOOKS), set by the test.
"""

from __future__ import annotations

import argparse
import random
import sys

import ivm
from storage import checkpoint as checkpoint_module
from storage import hooks
from tests.crash.workload import SOURCE, TABLES, SideFiles, ddl, model_of, run_ddl_step
from tests.oracle.model import generate_batch, ops_to_arrow

OPTIONS = dict(checkpoint_rows=400, checkpoint_seconds=0.3, segment_bytes=64 << 10)
# (APPEND_MIN_ROWS, APPEND_SHARE) in the writer and on reopen (harness.verify): append at any size,
# and up to 4x the relation's rows, so most checkpoints append and stored versions hold several appends.
APPEND_SETTINGS = (0, 4.0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("side")
    parser.add_argument("seed", type=int)
    parser.add_argument("--compact-every", type=int, default=0)
    parser.add_argument("--retain", action="store_true", help="keep checkpointed log segments (for COMPACT)")
    parser.add_argument("--ddl-every", type=int, default=0, help="run a DDL step after every N batches")
    args = parser.parse_args()
    side = SideFiles(args.side)
    side.repair()
    # No stalls before "ready": the harness kills only after it (storage/hooks.py: arm).
    hooks.arm(False)
    # The workload's relations are small: let checkpoints append their differences (not only
    # overwrite them), so kills land around appended commits and recovery sums them.
    checkpoint_module.APPEND_MIN_ROWS, checkpoint_module.APPEND_SHARE = APPEND_SETTINGS
    db = ivm.connect(args.db, log_retention_seconds=None if args.retain else 0.0, **OPTIONS)
    for statement in ddl():
        db.execute(statement)
    intents = side.read_intents()
    model = model_of(intents)
    if intents:
        last = intents[-1]
        offset = db.apply_changes(last["table"], ops_to_arrow(model.specs[last["table"]], last["ops"]),
                                  source=SOURCE, seq=last["seq"])
        side.ack(last["seq"], offset)
    step, done = side.read_ddl()
    if step > done:  # the DDL step a kill interrupted: each is idempotent
        run_ddl_step(db, step - 1)
        side.ddl_event("done", step - 1)
    side.mark("ready")
    hooks.arm(True)
    rng = random.Random(args.seed)
    seq = intents[-1]["seq"] + 1 if intents else 0
    while True:
        table = rng.choice(TABLES)
        ops = generate_batch(rng, model, table, rng.choice([1, 3, 10, 30, 100, 300]))
        side.intend(seq, table, ops)
        offset = db.apply_changes(table, ops_to_arrow(model.specs[table], ops), source=SOURCE, seq=seq)
        side.ack(seq, offset)
        model.apply(table, ops)
        seq += 1
        if args.ddl_every and seq % args.ddl_every == 0:
            side.ddl_event("intend", step)
            run_ddl_step(db, step)
            side.ddl_event("done", step)
            step += 1
        if args.compact_every and seq % args.compact_every == 0:
            side.mark("compact")
            db.compact()


if __name__ == "__main__":
    sys.exit(main())
