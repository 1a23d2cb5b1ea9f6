"""Census of the TPC-H views' query steps: how many run compiled, how many on DuckDB, and why.

    python -m bench.tpch_compiled --sf 0.01 --refreshes 5
    python -m bench.tpch_compiled --views q2,q20 --steps     # and each DuckDB step's SQL

Sets up like ``ivm bench tpch`` (bench.tpch_profile.load_views: maintenance
forced incremental, so every view runs its programs), runs ``--warmup``
refreshes (a step runs on DuckDB the first time, and is compiled from its
second run if it can be), then counts over ``--refreshes`` refreshes every
query step run by the path it took (Executor.counts):

- ``compiled``: our operators computed it (its first runs also shadowed);
- ``duckdb``: the step is not compiled; the reason is the executor's
  (Executor.step_status: ``duckdb: <reason>``, as EXPLAIN shows it);
- ``fallback``: a compiled step handed this batch to DuckDB (the reason is
  the step's last ``Fallback``);
- ``skipped``: the step's inputs were empty and it ran nowhere.

Of the compiled runs, ``generated%`` ran as one generated function
(ivm/execute/compiled/generated.py); the others ran the operators' closures
(an operator or expression in the step has no emitter).

It prints per view and in total the runs by path and the share compiled
(of the runs that ran: compiled / (compiled + duckdb + fallback)), then the
DuckDB runs grouped by reason with the distinct steps and the views they
come from. Issue 24's acceptance 3 (>= 90% of the statements compiled, the
rest listed by construct) is read off this output.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

from bench import tpch
from bench.tpch_profile import load_views
from bench.tpch_run import per_table, refresh_sizes
from ivm.execute import executor as ex

PATHS = ("compiled", "duckdb", "fallback")


class Census:
    """Query step runs by view, path and reason, gathered by wrapping the executor (``install``)."""

    def __init__(self):
        self.runs: dict[str, Counter] = defaultdict(Counter)  # view -> path -> runs
        self.reasons: dict[str, Counter] = defaultdict(Counter)  # "duckdb: ..." -> view -> runs
        self.steps: dict[str, dict[int, str]] = defaultdict(dict)  # reason -> id(step) -> its SQL
        self.active = False

    def install(self) -> None:
        census, run, query = self, ex.StepRunner.run, ex.Executor.query

        def labelled_run(self, program, inputs, snapshot, label="", progress=None):  # noqa: ANN001, ANN202
            self._census_label = label
            return run(self, program, inputs, snapshot, label, progress)

        def counted_query(self, step, temps, snapshot, registered, label):  # noqa: ANN001, ANN202
            before = Counter(self.counts)
            result = query(self, step, temps, snapshot, registered, label)
            if census.active:
                census.record(self, step, getattr(self, "_census_label", label), self.counts - before)
            return result

        ex.StepRunner.run, ex.Executor.query = labelled_run, counted_query

    def record(self, executor: ex.Executor, step, label: str, delta: Counter) -> None:  # noqa: ANN001
        view = label.removeprefix("view ")
        if delta["fallback"]:
            path = "fallback"
            status = executor.step_status(step) or ""
            reason = "fallback: " + status.partition("last: ")[2]
        elif delta["compiled"]:
            path, reason = "compiled", None
            # As one generated function, or by the operators' closures (an operator without an emitter).
            if (executor.step_status(step) or "").startswith("compiled: generated"):
                self.runs[view]["generated"] += 1
        elif delta["duckdb"]:
            path, reason = "duckdb", executor.step_status(step) or "duckdb: ?"
        else:
            path, reason = "skipped", None
        self.runs[view][path] += 1
        if reason is not None:
            self.reasons[reason][view] += 1
            self.steps[reason][id(step)] = step.sql.sql(dialect="duckdb")

    def report(self, names: list[str], show_steps: bool = False) -> list[str]:
        lines = ["view   compiled  duckdb  fallback  skipped  compiled%  generated% (of compiled)"]
        total = Counter()
        for name in names:
            runs = self.runs[name]
            total.update(runs)
            lines.append(_row(name, runs))
        lines.append(_row("total", total))
        lines.append("")
        lines.append("runs on DuckDB by construct (runs, distinct steps, views):")
        by_construct: dict[str, list[str]] = defaultdict(list)
        for reason in self.reasons:
            by_construct[construct(reason)].append(reason)
        order = sorted(by_construct, key=lambda c: -sum(sum(self.reasons[r].values()) for r in by_construct[c]))
        for c in order:
            reasons = by_construct[c]
            runs = sum(sum(self.reasons[r].values()) for r in reasons)
            steps = sum(len(self.steps[r]) for r in reasons)
            views = sorted({v for r in reasons for v in self.reasons[r]})
            lines.append(f"{runs:6d} {steps:4d}  {c}  [{','.join(views)}]")
            for r in sorted(reasons, key=lambda r: -sum(self.reasons[r].values())):
                if len(reasons) > 1 or r != c:
                    lines.append(f"{sum(self.reasons[r].values()):12d}    {r[:160]}")
                if show_steps:
                    lines.extend(f"{'':16}{sql[:400]}" for sql in self.steps[r].values())
        return lines


def _row(name: str, runs: Counter) -> str:
    ran = sum(runs[p] for p in PATHS)
    share = f"{100 * runs['compiled'] / ran:8.1f}%" if ran else "        -"
    generated = f"{100 * runs['generated'] / runs['compiled']:9.1f}%" if runs["compiled"] else "         -"
    return (f"{name:6} {runs['compiled']:8d} {runs['duckdb']:7d} {runs['fallback']:9d} {runs['skipped']:8d}  {share}"
            f" {generated}")


def construct(reason: str) -> str:
    """A reason without the SQL it quotes, so the same construct in different steps groups together:
    ``duckdb: Limit (LIMIT 1)`` -> ``duckdb: Limit``; ``compiled; ...`` never reaches here."""
    reason = re.sub(r" \(.*", "", reason)  # static_reason quotes the node's SQL in parentheses
    reason = re.sub(r"column \S+:", "column:", reason)
    return reason


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sf", type=float, default=0.01)
    parser.add_argument("--views", default="")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", action="store_true", help="print the SQL of each step on DuckDB")
    parser.add_argument("--engine-memory", default=None, help="cap ivm's DuckDB (as ivm bench tpch --engine-memory)")
    args = parser.parse_args()
    census = Census()
    census.install()
    db, con, _, names = load_views(args.sf, args.views, args.engine_memory, announce=lambda line: None)
    refresh = tpch.Refresh(con, seed=1, **refresh_sizes(args.batch))
    for step in range(args.warmup + args.refreshes):
        census.active = step >= args.warmup
        batches = refresh.batches()
        db.apply_batch(per_table(batches))
        for table, changes in batches:
            refresh.apply(table, changes)
    print(f"SF {args.sf:g}, {args.refreshes} refreshes of ~{args.batch} changed rows after {args.warmup} warm-up; "
          f"query step runs by path; status()['steps'] since start: {db.status()['steps']}\n")
    print("\n".join(census.report(names, args.steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
