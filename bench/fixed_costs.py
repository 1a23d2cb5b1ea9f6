"""What a 1,000-row batch costs, stage by stage (issue 25's check).

    python -m bench.fixed_costs [--rows 2000000] [--batches 60] [--views none per_customer nation_segment] [--read]

For each scenario (no view; each of bench.core's views on its own) it loads
bench.core's tables into an in-memory database, applies ``--warmup`` change
batches (the first ones compile each step and run it three more times on
DuckDB to check it), then times ``--batches`` more of bench.core's change
stream (40% inserts, 40% updates, 20% deletes of ``orders``) and prints, per
stage, the median milliseconds per batch and its share of the whole
``apply_changes``. With ``--read`` a prepared point read of the view
(``SELECT * FROM v WHERE key = $1``, bench.core.point_read, as a server runs one) follows
every batch, outside the clock: the next batch then computes the rows of a
view read from its operator state for the reads of its version (the stage
"compute a read view's rows"), unless the view's state holds at least
``ivm.reads.reads.KEYED_READ_ROWS`` rows, whose point reads look their key up
in the state instead (2M orders: 200,000 groups); the read's own median is
printed below the table.

Stages are timed where a batch enters them: each is a function of the
runtime, wrapped by this script for the run (names below, ``STAGES``). A
stage's time includes the stages nested in it (printed beneath it), so a
parent's time less its children's is its own bookkeeping. A name that no
longer exists fails the run at once: the stages moved, and this list must
follow them.

Timings are wall time of one thread on a host whose speed moves (see
bench/core.py): compare stages within one run, and runs by their shares.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import duckdb
import numpy as np

import ivm
from bench import core

# (label, "module:Class.method" or "module:function"), in the order a batch meets them.
STAGES = [
    ("apply_changes", "ivm.database:Database.apply_changes"),
    ("ingest: the batch as a change of its table", "ivm.engine:Engine.prepare"),
    ("normalize (check and cast the batch)", "ivm.ingest.changes:ChangeNormalizer.normalize"),
    ("convert to a Z-set change", "ivm.ingest.changes:ChangeApplier.apply"),
    ("find the stored rows", "storage.relation:Relation.lookup"),
    ("new table version", "storage.relation:Relation.replace_rows"),
    ("maintain the views", "ivm.engine:Engine._maintain"),
    ("prune each view's delta", "ivm.engine:Engine._pruned"),
    ("delta programs", "ivm.execute.executor:StepRunner.run"),
    ("compiled steps", "ivm.execute.executor:Executor._compiled"),
    ("DuckDB steps", "ivm.execute.executor:Executor._duckdb"),
    ("lookups in state and tables", "ivm.execute.executor:StepRunner._shared_lookup"),
    ("commit state changes", "ivm.engine:commit_row_changes"),
    ("publish the snapshot", "ivm.engine:Engine.publish"),
    ("compute a read view's rows", "ivm.reads.reads:Reader.warm"),
]


class StageClock:
    """Inclusive wall time per stage path ("a/b": b called inside a), summed over a batch."""

    def __init__(self):
        self.stack: list[str] = []
        self.batch: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, label: str):
        path = "/".join(self.stack + [label])
        self.stack.append(label)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.batch[path] += time.perf_counter() - start
            self.stack.pop()

    def take(self) -> dict[str, float]:
        done, self.batch = dict(self.batch), defaultdict(float)
        return done


def instrument(clock: StageClock) -> list[tuple[object, str, object]]:
    """Wrap every stage function; return what to put back."""
    undo = []
    for label, target in STAGES:
        module_name, _, attribute = target.partition(":")
        owner = importlib.import_module(module_name)
        parts = attribute.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part)
        name = parts[-1]
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        function = raw.__func__ if isinstance(raw, staticmethod) else raw

        def timed(*args, _function=function, _label=label, **kwargs):
            with clock.stage(_label):
                return _function(*args, **kwargs)

        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)
        undo.append((owner, name, raw))
    return undo


def restore(undo: list[tuple[object, str, object]]) -> None:
    for owner, name, raw in reversed(undo):
        setattr(owner, name, raw)


def database(data: dict, view: str | None) -> ivm.Database:
    if view is None:
        return core.loaded_database(data)
    db, _ = core.database_with_view(data, view, core.VIEWS[view])
    return db


def run_scenario(data: dict, rows: int, view: str | None, warmup: int, batches: int, seed: int,
                 read: bool = False) -> dict:
    db = database(data, view)
    customers = data["customers"].num_rows
    lookup = core.point_read(db, view, customers) if read and view is not None else None
    rng = np.random.default_rng(seed)
    next_id, deleted = rows, set()
    for _ in range(warmup):
        batch, next_id = core.change_batch(rng, next_id, rows, customers, 1000, deleted)
        db.apply_changes("orders", batch)
        if lookup is not None:
            lookup(rng)
    clock = StageClock()
    undo = instrument(clock)
    per_batch, reads = [], []
    try:
        for _ in range(batches):
            batch, next_id = core.change_batch(rng, next_id, rows, customers, 1000, deleted)
            db.apply_changes("orders", batch)
            per_batch.append(clock.take())
            if lookup is not None:  # read between batches: the next batch computes the view's rows for reads
                started = time.perf_counter()
                lookup(rng)
                reads.append(time.perf_counter() - started)
    finally:
        restore(undo)
        db.close()
    paths = sorted({p for b in per_batch for p in b}, key=lambda p: _order(p))
    medians = {p: statistics.median(b.get(p, 0.0) for b in per_batch) * 1000 for p in paths}
    return {"view": (view or "no view") + (", a point read after each batch" if lookup else ""), "rows": rows,
            "batches": batches, "medians_ms": medians,
            "read_ms": statistics.median(reads) * 1000 if reads else None}


def _order(path: str) -> tuple:
    labels = [label for label, _ in STAGES]
    return tuple(labels.index(part) for part in path.split("/"))


def report(result: dict) -> str:
    medians = result["medians_ms"]
    whole = medians.get("apply_changes", 0.0)
    lines = [f"### {result['view']}: {result['rows']:,} rows, median of {result['batches']} batches of 1,000",
             "", "| stage | ms per batch | share |", "| --- | ---: | ---: |"]
    for path, ms in medians.items():
        depth = path.count("/")
        label = path.rsplit("/", 1)[-1]
        share = f"{100 * ms / whole:.0f}%" if whole else ""
        lines.append(f"| {'· ' * depth}{label} | {ms:.2f} | {share} |")
    if result.get("read_ms") is not None:  # outside the batch's clock: what the reader waits
        lines += ["", f"The point read after each batch: median {result['read_ms']:.3f} ms."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--views", nargs="+", default=["none", *core.VIEWS],
                        help="scenarios: none (no view) and/or bench.core view names")
    parser.add_argument("--read", action="store_true",
                        help="a prepared point read of the view after every batch (a client reading while "
                             "changes stream in): the next batch computes the rows of a view read from its state")
    args = parser.parse_args()
    unknown = [v for v in args.views if v != "none" and v not in core.VIEWS]
    if unknown:
        parser.error(f"unknown view {', '.join(unknown)}: choose among none, {', '.join(core.VIEWS)}")
    data = core.generate(duckdb.connect(), args.rows)
    for view in args.views:
        result = run_scenario(data, args.rows, None if view == "none" else view, args.warmup, args.batches, args.seed,
                              args.read)
        print(report(result))
        print()


if __name__ == "__main__":
    main()
