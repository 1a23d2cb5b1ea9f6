"""Soak the oracle outside pytest: many seeded streams, no shrinking.

    python -m tests.oracle.soak --seeds 50 --batches 10 [--set joins|setops|subqueries|windows|topk|recursive] [--views a,b]
    python -m tests.oracle.soak --set topk --ordered --slack 2   # top-K's hard cases: tiny buffers, refills

The recursive catalogue always plays test_oracle_recursive's streams (they
change the graph table ``links``, which the default streams leave alone).
``--ordered`` plays test_oracle_ordered's streams (tables kept large by upsert
batches, so a LIMIT cuts through them); ``--slack`` sets how many rows a
top-K buffer holds beyond LIMIT + OFFSET (small: deletes of top rows force refills).

Prints each failing seed with the first difference; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from delta_operators import top_k
from tests.oracle.fixtures import ORDERED_SETS, VIEW_SETS, oracle_schema, oracle_views
from tests.oracle.harness import Harness, play

TABLES = ["customers", "orders", "items", "events"]


def stream(seed: int, batches: int, views, initial: int, ordered: bool = False, graph: bool = False) -> str | None:
    if graph:
        from tests.test_oracle_recursive import recursive_stream

        try:
            recursive_stream(seed, batches, views)
        except AssertionError as e:
            return str(e)
        except Exception as e:  # an engine error is a failure too
            return f"{type(e).__name__}: {e}"
        return None
    rng = random.Random(seed)
    harness = Harness(oracle_schema(), views)

    def next_batch(step: int) -> tuple[str, int]:
        return rng.choice(TABLES), rng.choice([1, 2, 5, 10, 30, 100, 300, 1000])

    try:
        if ordered:
            from tests.test_oracle_ordered import ordered_stream

            ordered_stream(harness, rng, batches, f"(seed {seed})")
        else:
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
    parser.add_argument("--set", default="", choices=VIEW_SETS + ORDERED_SETS, help="view catalogue (default: the core one)")
    parser.add_argument("--ordered", action="store_true", help="test_oracle_ordered's streams (large tables)")
    parser.add_argument("--slack", type=int, default=None, help="top-K buffer rows beyond LIMIT + OFFSET")
    args = parser.parse_args()
    top_k.SLACK = args.slack
    views = oracle_views(args.set)
    if args.views:
        wanted = set(args.views.split(","))
        views = [v for v in views if v.name in wanted]
    failed = 0
    start = time.time()
    for seed in range(args.first, args.first + args.seeds):
        began = time.time()
        problem = stream(seed, args.batches, views, args.initial, args.ordered, args.set == "recursive")
        if problem:
            failed += 1
            print(f"seed {seed}: {problem[:2000]}\n", flush=True)
        else:
            print(f"seed {seed}: ok ({time.time() - began:.1f}s)", flush=True)
    print(f"{args.seeds - failed}/{args.seeds} seeds passed in {time.time() - start:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
