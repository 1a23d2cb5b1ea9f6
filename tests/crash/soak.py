"""A longer crash soak outside pytest.

    python -m tests.crash.soak --cycles 200 [--seed 7] [--dir /tmp/ivm-crash]

Each cycle kills the writer at a random moment or inside a random crash hook
(ingest, folds, checkpoints, compaction) and verifies the reopened database
(tests/crash/harness.py). Exits 1 at the first failing cycle.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.crash.harness import Kill, crash_cycles

HOOKS = ["log.torn_record", "log.before_sync", "fold.before_publish", "checkpoint.between_relations",
         "checkpoint.before_manifest", "checkpoint.after_manifest", "compact.write", "compact.before_unlink",
         "compact.vacuum"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", default="")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kills = []
    for _ in range(args.cycles):
        hook = rng.choice(HOOKS + [None] * 4)
        compact = 5 if hook is None or hook.startswith("compact") else 0
        kills.append(Kill(hook=hook, delay=rng.uniform(0.05, 2.0), compact_every=compact))
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ivm-crash-"))
    start = time.time()
    try:
        crash_cycles(base, kills, args.seed)
    except AssertionError as e:
        print(f"FAILED in {base}: {e}", file=sys.stderr)
        return 1
    print(f"{args.cycles} kills, all verified, in {time.time() - start:.0f}s ({base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
