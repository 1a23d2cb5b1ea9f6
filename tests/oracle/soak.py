"""Soak the oracle outside pytest: many seeded streams, no shrinking.

    python -m tests.oracle.soak --seeds 50 --batches 10 [--views a,b]

Prints each failing seed with the first difference; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.harness import Harness, play

TABLES = ["customers", "orders", "items", "events"]


def stream(seed: int, batches: int, views, initial: int) -> str | None:
    rng = random.Random(seed)
    harness = Harness(oracle_schema(), views)

    def next_batch(step: int) -> tuple[str, int]:
        return rng.choice(TABLES), rng.choice([1, 2, 5, 10, 30, 100, 300, 1000])

    try:
        play(harness, rng, TABLES, batches, initial, next_batch)
    except AssertionError as e:
        return str(e)
    except Exception as e:  # an engine error is a failure too
        return f"{type(e).__name__}: {e}"
    finally:
        harness.close()
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--initial", type=int, default=20)
    parser.add_argument("--views", default="")
    args = parser.parse_args()
    views = oracle_views()
    if args.views:
        wanted = set(args.views.split(","))
        views = [v for v in views if v.name in wanted]
    failed = 0
    start = time.time()
    for seed in range(args.first, args.first + args.seeds):
        problem = stream(seed, args.batches, views, args.initial)
        if problem:
            failed += 1
            print(f"seed {seed}: {problem[:2000]}\n", flush=True)
    print(f"{args.seeds - failed}/{args.seeds} seeds passed in {time.time() - start:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
