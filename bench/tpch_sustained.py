"""Sustained refresh throughput: TPC-H's views kept fresh in a durable database under a stream of refreshes.

    python -m bench.tpch_sustained --sf 1 --batch 1000 --refreshes 120

``ivm bench tpch`` applies one refresh at a time in memory and waits for
every view before it sends the next: its "sustained change throughput" is
the inverse of one refresh's latency. A server under load does not wait
like that: producers send change batches as fast as they are acknowledged
(once on disk), and the maintainer folds whatever is queued into the views
in one pass (ivm/durable/maintainer.py), so the fixed cost of running 22 programs is
shared by every batch of a fold. This measures that:

1. the eight tables are loaded into a durable database (a temporary
   directory under the data directory) and every view is created;
2. the refreshes are generated first, against the DuckDB reference (each
   applied to it, so the next one sees it), so generating them costs
   nothing in the window;
3. warm-up: refreshes applied and read back one at a time, each its own
   fold (the first runs of each program compile it), then a burst of
   refreshes sent at once and read back (one large fold: the programs for
   a fold's summed deltas compile, and the cost model's first trials of
   recomputing build its DuckDB mirrors of the tables, seconds at SF 1,
   once); its time is reported apart;
4. the window: one producer thread applies each refresh's batches (one
   ``apply_changes`` per table, as a CDC source does) as fast as they are
   acknowledged, while a subscriber on one view records when each offset
   becomes visible; the clock stops when a read sees the last batch.

It reports changed rows/s over the window, acknowledgement latency,
freshness (acknowledged to visible in the subscribed view), the folds and
their sizes, and checks every view against DuckDB's recompute over the
same data at the end. Unpaced, the producer outruns the maintainer and the
window measures folding a backlog (folds of tens of thousands of rows,
freshness growing to the window's length); with ``--rate`` it sends at a
fixed rate, and a rate is sustained when freshness stays bounded (compare
its median and p99 with the fold time) rather than growing with the window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench import tpch
from bench.tpch_run import create_views, per_table, refresh_sizes

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Sustained:
    sf: float
    batch: int
    refreshes: int
    warmup: int
    burst_refreshes: int
    rate: float | None  # rows/s the producer is paced at (None: as fast as acknowledged)
    burst_seconds: float = 0.0
    views: int = 0
    load_seconds: float = 0.0
    window_seconds: float = 0.0
    changed_rows: int = 0
    batches: int = 0
    ack_ms: list[float] = field(default_factory=list)
    freshness_ms: list[float] = field(default_factory=list)
    send_seconds: float = 0.0  # the producer's time to send every batch (paced: the rate's schedule)
    folds: int = 0
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.changed_rows / self.window_seconds if self.window_seconds else 0.0


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else float("nan")


class Visibility:
    """A subscriber thread: when each offset became visible in ``view`` (the changefeed's ``through``)."""

    def __init__(self, db, view: str, since: int):  # noqa: ANN001
        self.db, self.view, self.since = db, view, since
        self.seen: list[tuple[int, float]] = []  # (through, when)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="visibility", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        through = self.since
        while not self.stop.is_set():
            changes = self.db.changes(self.view, through, wait=0.2)
            if changes.through > through:
                through = changes.through
                self.seen.append((through, time.perf_counter()))

    def visible_at(self, offset: int) -> float | None:
        for through, when in self.seen:
            if through >= offset:
                return when
        return None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def run(sf: float, batch: int, refreshes: int, warmup: int, names: list[str] | None, data_dir: Path,
        seed: int = 1, subscribe: str = "q01", burst_refreshes: int = 20, rate: float | None = None) -> Sustained:
    import ivm

    directory = data_dir / f"sf{sf:g}"
    tpch.generate(sf, directory)
    con = tpch.reference(directory)
    result = Sustained(sf, batch, refreshes, warmup, burst_refreshes, rate)
    with tempfile.TemporaryDirectory(prefix="sustained-", dir=directory) as path:
        db = ivm.connect(path)
        try:
            started = time.perf_counter()
            tpch.create_tables(db)
            tpch.load_files(db, directory, con, piece_rows=4_000_000)
            created, _, skipped = create_views(db, names)
            db.checkpoint()  # the load's checkpoint is not the window's
            result.load_seconds = time.perf_counter() - started
            result.views = len(created)
            if skipped:
                print(f"views not created: {skipped}", file=sys.stderr)

            refresh = tpch.Refresh(con, seed=seed, **refresh_sizes(batch))
            stream = []
            for _ in range(warmup + burst_refreshes + refreshes):
                batches = refresh.batches()
                for table, changes in batches:
                    refresh.apply(table, changes)
                stream.append(per_table(batches))

            for one in stream[:warmup]:  # each its own fold: the first runs of a program compile it
                for table, changes in one:
                    db.apply_changes(table, changes)
                since = db.offset  # waits like a read: the refresh is in every view
            burst = time.perf_counter()
            for one in stream[warmup:warmup + burst_refreshes]:  # then one fold of many refreshes
                for table, changes in one:
                    db.apply_changes(table, changes)
            since = db.offset
            result.burst_seconds = time.perf_counter() - burst
            folds_before = _folds(db)

            visibility = Visibility(db, subscribe if subscribe in created else next(iter(created)), since)
            visibility.start()
            acks: list[tuple[int, float]] = []  # (offset, acknowledged at)
            begin = time.perf_counter()
            for i, one in enumerate(stream[warmup + burst_refreshes:]):
                if rate:  # paced: refresh i is due once the rows before it are due at ``rate`` rows/s
                    due = begin + result.changed_rows / rate
                    while (now := time.perf_counter()) < due:
                        time.sleep(min(due - now, 0.05))
                for table, changes in one:
                    sent = time.perf_counter()
                    offset = db.apply_changes(table, changes)
                    acked = time.perf_counter()
                    acks.append((offset, acked))
                    result.ack_ms.append((acked - sent) * 1000)
                    result.changed_rows += changes.num_rows
            result.send_seconds = time.perf_counter() - begin
            last = db.offset  # a read: returns once the last batch is in every view
            result.window_seconds = time.perf_counter() - begin
            time.sleep(0.3)  # let the subscriber see the last fold
            visibility.close()
            result.batches = len(acks)
            result.folds = _folds(db) - folds_before
            for offset, acked in acks:
                when = visibility.visible_at(offset)
                if when is not None:
                    result.freshness_ms.append((when - acked) * 1000)
            assert last >= acks[-1][0]

            sys.path.insert(0, str(ROOT))  # the oracle's multiset comparison lives with the tests
            from tests.oracle.compare import multiset_diff

            for name, (_, sql) in created.items():
                problem = multiset_diff(db.sql(f"SELECT * FROM {name}"), con.sql(sql).to_arrow_table())
                if problem:
                    result.problems[name] = problem
        finally:
            db.close()
            con.close()
    return result


def _folds(db) -> int:  # noqa: ANN001
    """Folds the maintainer has published so far (its count of maintained batches per view, max over views)."""
    views = db.status()["maintenance"]["views"]
    return max((sum(facts["batches"].values()) for facts in views.values()), default=0)


def quarters(values: list[float]) -> list[float]:
    """Medians of the four quarters of ``values`` in order."""
    n = len(values)
    return [statistics.median(values[i * n // 4:(i + 1) * n // 4]) for i in range(4)] if n >= 4 else []


def report(r: Sustained) -> str:
    lines = [
        f"## Sustained refreshes, TPC-H SF {r.sf:g}, durable database, {r.views} views",
        "",
        f"- {r.refreshes} refreshes of ~{r.batch} changed rows after {r.warmup} warm-up; "
        f"{r.batches} apply_changes calls (one per table per refresh), one producer "
        + (f"paced at {r.rate:,.0f} changed rows/s" if r.rate else "sending as fast as acknowledged"),
        f"- **sustained: {r.rows_per_second:,.0f} changed rows/s** "
        f"({r.changed_rows:,} rows in {r.window_seconds:.1f} s, clock stopped when a read saw the last batch)",
        f"- warm-up: {r.warmup} refreshes folded one at a time, then {r.burst_refreshes} sent at once "
        f"(visible after {r.burst_seconds:.1f} s: first large fold)",
        f"- folds in the window: {r.folds} (~{r.changed_rows / max(r.folds, 1):,.0f} changed rows each)",
        f"- the producer sent for {r.send_seconds:.1f} s; the last batch was visible "
        f"{r.window_seconds - r.send_seconds:.1f} s after it was sent",
        "- freshness median by quarter of the window (bounded, or growing with it): "
        + ", ".join(f"{q:.0f}" for q in quarters(r.freshness_ms)) + " ms",
        f"- acknowledgement (on disk): median {statistics.median(r.ack_ms):.1f} ms, "
        f"p99 {percentile(r.ack_ms, 99):.1f} ms",
        f"- freshness (acknowledged to visible in the subscribed view, {len(r.freshness_ms)} batches): "
        f"median {percentile(r.freshness_ms, 50):.0f} ms, p99 {percentile(r.freshness_ms, 99):.0f} ms",
        f"- load and view creation: {r.load_seconds:.0f} s",
        "- correctness (each view equals DuckDB's recompute at the end): "
        + ("all equal" if not r.problems else "DIFFERENT: " + ", ".join(sorted(r.problems))),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=1000, help="changed rows per refresh (about)")
    parser.add_argument("--refreshes", type=int, default=120, help="refreshes in the window")
    parser.add_argument("--warmup", type=int, default=6, help="refreshes folded one at a time first")
    parser.add_argument("--burst", type=int, default=20, help="warm-up refreshes sent at once, after --warmup")
    parser.add_argument("--rate", type=float, default=None,
                        help="pace the producer at this many changed rows/s (default: as fast as acknowledged)")
    parser.add_argument("--views", default=None, help="comma-separated: q1,q3,... (default: all 22)")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "tpch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the report and raw numbers here")
    args = parser.parse_args(argv)
    names = args.views.split(",") if args.views else None
    result = run(args.sf, args.batch, args.refreshes, args.warmup, names, args.data, args.seed,
                 burst_refreshes=args.burst, rate=args.rate)
    text = report(result)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sustained.md").write_text(text + "\n")
        (args.out / "sustained.json").write_text(json.dumps(asdict(result), indent=2))
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
