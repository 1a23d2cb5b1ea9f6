"""Cost-based choice per batch: maintain a view incrementally, recompute it, or rebuild its state.

Incremental maintenance is not always cheaper: a cheap view over a large
batch, or a view whose delta program reads whole relations, can cost more
than computing the view again (OpenIVM measured this on single-table views;
TPC-H q02/q22 at SF 1, and q16 until its NOT IN became a keyed anti join).
A batch takes one of three paths
(ivm/maintain/recompute.py runs the last two):

* ``incremental``: the view's delta program over the batch (needs fresh state);
* ``recompute``: DuckDB evaluates the view's SELECT over the sources' NEW
  contents and the view emits ΔV = O' − O. Operator state is left *stale*
  (emptied, flagged in the snapshot);
* ``rebuild``: the initial program recomputes state and output from empty
  state (as at CREATE), ΔV = O' − O, and the state is fresh again.

Per view, a ``CostModel`` keeps estimates measured on this machine, each the
median of the last WINDOW measurements (a pause of the machine, a
collection, a neighbour's burst: one or two outliers among five do not move
a median, where a moving mean took one 10x batch as a trend and switched):

* I, incremental: the median seconds per batch (measured only when state is
  fresh, and not on a delta program's first WARMUP_RUNS runs: the executor
  runs each query plainly the first time and prepares it the second;
  measured at SF 1, the first run cost up to 10x a later one and the second
  2-3x, and an estimate seeded by them switched views that were cheaper
  incrementally), scaled up for a batch with more changed rows than usual
  (fixed costs dominate small batches, so a smaller batch is not estimated
  cheaper; above the usual rows, by I's slope over batches of different
  sizes when the window holds them, else in proportion: ``_per_row``);
* R, recompute: the median seconds per source row of the refreshes, times
  the sources' rows now. Until a refresh ran, R is *provisional*: the SELECT
  alone timed at CREATE (over the Arrow runs, without keeping the native
  copies or computing the view's delta: at SF 1 q22's was 0.75x its real
  refreshes, q02's 2x). The first real refresh (or trial, below)
  replaces it (the window starts with real refreshes only);
* B, rebuild: the seconds of the last rebuild (at CREATE, or the way back
  from stale state), scaled the same way; not known yet (after a reopen):
  REBUILD_GUESS × R.

Rule (``Settings.maintenance = "auto"``), with L = LEAVE_MARGIN, M =
RECOMPUTE_MARGIN and the one-off rebuild amortised over H = AMORTISE_BATCHES
batches:

    fresh state:  recompute   when I > L·R on SWITCH_AFTER batches in a row,
                              else incremental; a batch beyond SPREAD x every
                              measured size whose I could still be within the
                              limit (scaled by the least slope allowed) runs
                              incrementally, to be measured, and does not vote;
                              while R is provisional, I > L·R does not vote: the
                              batch runs incrementally and *trials* the refresh
                              (runs it too, result discarded) to measure R
    stale state:  rebuild     when M·I + B/H < R (incremental is cheaper again,
                              rebuild included), or when the refreshes since the
                              switch cost PROBE_FACTOR × B (a probe: I is
                              re-measured, at most 1/PROBE_FACTOR extra), or when
                              I is not known; else recompute
    after a rebuild, PROBE_BATCHES incremental batches, and I from them only

Leaving incremental costs nothing one-off (the state is emptied and left
stale), so B does not count against it: the view leaves as soon as a
refresh is estimated cheaper (L = 1.1: a view at parity gains nothing by
leaving and would pay B to come back). Coming back pays the rebuild, so B
counts there, amortised, with the wider margin M. At SF 1, B is the
initial program over every source (0.5-1.6 s for q02/q16/q22): counted as
B/H against leaving, it kept q02 and q22 incremental at about twice the
cost of their refresh.

Hysteresis, and why it does not flap. The two thresholds differ (leave above
1.1·R, come back below R/1.5 minus the rebuild's share: a band at least
1.65x wide), the estimates are medians of five, leaving takes two votes, and
while stale I is not re-measured, so noise cannot move a view across the
band. The estimate of the path not taken is refreshed by *probes*: a stale
view rebuilds once its refreshes have cost PROBE_FACTOR rebuilds (at most
1/PROBE_FACTOR extra), and runs PROBE_BATCHES incremental batches (a whole
window) whose median alone is the new I: the measurements from before the
rebuild describe state that was thrown away, one probe batch among four old
ones could never move a median of five (a view whose incremental path became
cheap needed two or three probes to notice), and a probe shorter than the
window would let two outliers in a row (a paused machine) decide it.

A provisional R never decides a switch. It is one timing of the SELECT
alone; a real refresh also keeps the native copies and computes the view's
delta, and measured 0.75-2.4x it at SF 1 (q22, q02, q11). Leaving on it sent
views to the dearer path (session 6: q22's I 44 ms left on ~40 ms, its
refreshes measured 53 ms; session 10: q11 left, measured 25.8 ms against I
15.3 ms, rebuilt and came back), and a wider margin for it kept views on
the dearer path (q15: I 24.8 ms against 21.9 ms). So when the rule would
vote to leave on a provisional R, the batch *trials* the refresh instead:
it runs incrementally, and the engine also runs the refresh path, discards
its result and records its time as the first measured R (``trial``). The
trial costs one refresh, once per view (R is then measured), where a wrong
switch cost a rebuild or a dearer path for good. The choice costs a few
multiplications; nothing else runs for it.
``"incremental"`` and ``"recompute"`` force one path (a stale view rebuilds
first under ``"incremental"``; tests force recompute to prove it against the
oracle). Views over a RETAIN stream (``Catalog.retained()``) are always
incremental: their sources no longer hold every row they count.

Durable databases: the stale flag is a snapshot counter, so a checkpoint
stores it with the offset it belongs to (and the emptied state beside it);
a reopen restores the flag, and replay or the next batch rebuilds the
state before any incremental step (ivm/durable/checkpoints.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Iterable

from sql_frontend.errors import CatalogError

if TYPE_CHECKING:
    from storage.store import Snapshot

MODES = ("auto", "incremental", "recompute")
WINDOW = 5  # measurements per estimate (the median of the last WINDOW: two outliers do not move it)
LEAVE_MARGIN = 1.1  # L: a fresh view recomputes when incremental is estimated dearer than L x recompute
RECOMPUTE_MARGIN = 1.5  # M: a stale view comes back when M x incremental (+ B/H) is cheaper than recompute
AMORTISE_BATCHES = 32  # H: the one-off rebuild counts 1/H per batch against the path that needs it
PROBE_FACTOR = 8  # stale state: rebuild to re-measure incremental after refreshes costing 8 rebuilds
SWITCH_AFTER = 2  # consecutive batches the rule must hold before a fresh view leaves incremental
PROBE_BATCHES = WINDOW  # batches a probe measures: a whole window, so its own outliers cannot decide the median
WARMUP_RUNS = 2  # a delta program's first runs: plain queries, then preparing them (ivm/execute/executor.py)
SPREAD = 1.5  # measurements at least this far apart in rows give I's slope (_per_row) ...
MIN_SLOPE_SHARE = 4.0  # ... never below 1/4 of proportional scaling
REBUILD_GUESS = 10.0  # B unknown (after a reopen): the initial program measured 5-30x the SELECT


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise CatalogError(f"maintenance must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _remember(window: list, value) -> list:  # noqa: ANN001
    window.append(value)
    del window[:-WINDOW]
    return window


@dataclass
class CostModel:
    """Moving cost estimates of one view, and what each batch chose."""

    incremental: float | None = None  # I: seconds per batch (median of the measurements)
    rows: float | None = None  # changed input rows per batch (median)
    recompute: float | None = None  # R: seconds of a refresh (the SELECT and the difference) ...
    recompute_rows: int = 0  # ... when its sources held this many rows
    rebuild: float | None = None  # B: seconds of the last rebuild (initial program) ...
    rebuild_rows: int = 0  # ... when its sources held this many rows
    # Batches per path: a rebuild counts as a recompute here (it recomputes the view), and in ``rebuilds``;
    # seconds per path: a trial refresh's count on the recompute path (time spent on the view, not a batch).
    batches: dict[str, int] = field(default_factory=lambda: {"incremental": 0, "recompute": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"incremental": 0.0, "recompute": 0.0})
    rebuilds: int = 0
    last: str = ""
    spent: float = 0.0  # seconds of refreshes since the state went stale (or was last probed)
    ran: dict[int, int] = field(default_factory=dict)  # runs per delta program (id): the first WARMUP_RUNS are warm-up
    refresh_failed: bool = False  # the SELECT failed when first timed: never chosen in auto mode
    provisional: bool = False  # R is the SELECT timed at CREATE, not yet a refresh
    _probe: int = 0  # batches with fresh state left to run incrementally, to measure I
    trial: bool = False  # the engine also runs a refresh for this batch, to measure R (the rule above)
    _votes: int = 0  # consecutive fresh batches where the rule chose recompute
    _measured: list = field(default_factory=list)  # the last WINDOW incremental (seconds, rows)
    _refreshes: list = field(default_factory=list)  # the last WINDOW refreshes' seconds per source row

    def estimates(self, rows: int, source_rows: int) -> tuple[float | None, float | None]:
        """(incremental, recompute) seconds estimated for a batch of ``rows`` changed rows."""
        incremental = None
        if self.incremental is not None:
            incremental = self._scaled(rows, self._per_row())
        recompute = None
        if self.recompute is not None:
            recompute = self.recompute * max(source_rows, 1) / max(self.recompute_rows, 1)
        return incremental, recompute

    def _scaled(self, rows: int, per_row: float) -> float:
        """I for a batch of ``rows`` at ``per_row`` seconds per row beyond the usual one (a smaller is not cheaper)."""
        return self.incremental + per_row * max(0.0, rows - max(self.rows or 1.0, 1.0))

    def _proportional(self) -> float:
        """I / usual rows: the largest slope ``_per_row`` allows (the least is 1/MIN_SLOPE_SHARE of it)."""
        return (self.incremental or 0.0) / max(self.rows or 1.0, 1.0)

    def _per_row(self) -> float:
        """Seconds per changed row beyond the usual batch (I's slope).

        Proportional (I / rows) unless the window holds batches of different
        sizes: then the median slope between pairs of them (Theil-Sen), kept
        within [1/MIN_SLOPE_SHARE, 1] x proportional. A batch has a fixed cost
        (a durable fold of bench/ingest.py's 3 views: ~18 ms CPU, then ~0.6 ms
        per 1,000 rows), so scaling I in proportion took a fold of 5x the usual
        rows as 5x dearer, and a view recomputed (and rebuilt: 0.5 s) for it.
        The floor keeps noisy slopes from making huge batches look free.
        """
        proportional = self._proportional()
        pairs = sorted(self._measured, key=lambda m: m[1])
        slopes = [(s2 - s1) / (r2 - r1) for i, (s1, r1) in enumerate(pairs) for s2, r2 in pairs[i + 1:]
                  if r2 >= SPREAD * r1 and r1 > 0]
        if len(slopes) < 2:
            return proportional
        return min(proportional, max(proportional / MIN_SLOPE_SHARE, median(slopes)))

    def _unmeasured_size(self, rows: int, limit: float) -> bool:
        """Is a batch of ``rows`` beyond every measured size, with I there possibly within ``limit``?

        Beyond SPREAD x the largest measured batch, I is extrapolated, and the
        slope is only known to lie between 1/MIN_SLOPE_SHARE and 1 x
        proportional. Where the optimistic end is within the limit, the batch
        runs incrementally to be measured, instead of voting to leave: under
        sustained durable ingest (bench/ingest.py, session 8) folds grew from
        the usual 12,000 rows to 150,000-1,000,000, were estimated in
        proportion (8.4 ms -> 100-700 ms against a recompute of 40-300 ms),
        and the views recomputed and rebuilt (0.5 s each) where incremental
        measured 54 ms for 270,000 rows. Where even the optimistic end is
        above the limit, the vote counts as before.
        """
        largest = max((r for _, r in self._measured), default=self.rows or 1.0)
        if rows <= SPREAD * largest:
            return False
        return self._scaled(rows, self._proportional() / MIN_SLOPE_SHARE) <= limit

    def rebuild_estimate(self, source_rows: int) -> float | None:
        if self.rebuild is not None:
            return self.rebuild * max(source_rows, 1) / max(self.rebuild_rows, 1)
        _, recompute = self.estimates(0, source_rows)
        return None if recompute is None else REBUILD_GUESS * recompute

    def choose(self, mode: str, rows: int, source_rows: int, stale: bool = False) -> str:
        """The path of the next batch: "incremental", "recompute" or "rebuild" (rule: module docstring)."""
        if mode == "recompute":
            return "recompute"
        if mode == "incremental":
            return "rebuild" if stale else "incremental"
        incremental, recompute = self.estimates(rows, source_rows)
        rebuild = self.rebuild_estimate(source_rows) or 0.0
        if stale:
            if incremental is None or recompute is None or self.spent >= PROBE_FACTOR * rebuild:
                return "rebuild"
            back = RECOMPUTE_MARGIN * incremental + rebuild / AMORTISE_BATCHES < recompute
            return "rebuild" if back else "recompute"
        if self._probe or incremental is None or recompute is None:
            self._probe = max(self._probe - 1, 0)
            return "incremental"
        # Leaving is free: B counts only on the way back.
        limit = LEAVE_MARGIN * recompute
        if incremental <= limit:
            self._votes = 0
            return "incremental"
        if self._unmeasured_size(rows, limit):
            return "incremental"  # measured at this size, the slope decides the next batch like it
        if self.provisional:  # one timing of the SELECT alone does not decide: measure a refresh first
            self.trial = True
            return "incremental"
        self._votes += 1  # one slow batch (a pause, an unusually large batch of a cheap source) is not enough
        if self._votes < SWITCH_AFTER:
            return "incremental"
        self._votes, self.spent = 0, 0.0
        return "recompute"

    def warming_up(self, program: object) -> bool:
        """Is this one of the program's warm-up runs (not a measurement of I)?

        The executor runs each query plainly the first time and prepares it the
        second (ivm/execute/executor.py); both cost several times a later run.
        """
        runs = self.ran[id(program)] = self.ran.get(id(program), 0) + 1
        return runs <= WARMUP_RUNS

    def record(self, path: str, seconds: float, rows: int, source_rows: int, warmup: bool = False) -> None:
        self.batches["incremental" if path == "incremental" else "recompute"] += 1
        self.seconds["incremental" if path == "incremental" else "recompute"] += seconds
        self.last = path
        if path == "incremental" and warmup:
            return
        if path == "incremental":
            measured = _remember(self._measured, (seconds, float(rows)))
            self.incremental = median(s for s, _ in measured)
            self.rows = median(r for _, r in measured)
        elif path == "recompute":
            self.record_refresh(seconds, source_rows)
            self.spent += seconds
        else:
            self.rebuilds += 1
            self.record_rebuild(seconds, source_rows)
            self.spent, self._probe = 0.0, PROBE_BATCHES
            self._measured.clear()  # they measured the state the rebuild replaced: the probe measures I anew

    def estimate_refresh(self, seconds: float, source_rows: int) -> None:
        """The provisional R: the SELECT alone, timed at CREATE (or after a reopen)."""
        self.recompute, self.recompute_rows, self.provisional = seconds, source_rows, True

    def record_trial(self, seconds: float, source_rows: int) -> None:
        """A trial refresh (``trial``): its time is R's first measurement, and time spent on the view."""
        self.trial = False
        self.seconds["recompute"] += seconds
        self.record_refresh(seconds, source_rows)

    def trial_failed(self) -> None:
        """The refresh failed where incremental did not: never chosen in auto mode (as a SELECT failing at CREATE)."""
        self.trial, self.refresh_failed, self.recompute = False, True, None

    def record_refresh(self, seconds: float, source_rows: int) -> None:
        per_row = median(_remember(self._refreshes, seconds / max(source_rows, 1)))
        self.recompute, self.recompute_rows, self.provisional = per_row * max(source_rows, 1), source_rows, False

    def record_rebuild(self, seconds: float, source_rows: int) -> None:
        self.rebuild, self.rebuild_rows = seconds, source_rows

    def describe(self, mode: str, stale: bool = False) -> str:
        """One line for EXPLAIN and status."""
        def ms(value: float | None) -> str:
            return "not measured yet" if value is None else f"{value * 1000:.1f} ms"

        counts = ", ".join(f"{n} {path}" for path, n in self.batches.items())
        head = "cost-based per batch" if mode == "auto" else f"forced {mode}"
        last = f"; last batch: {self.last}" if self.last else ""
        state = "; operator state stale (rebuilt when incremental again)" if stale else ""
        return (f"maintenance: {head}; estimates: incremental {ms(self.incremental)}, "
                f"recompute {ms(self.recompute)}, rebuild {ms(self.rebuild)}; batches: {counts} "
                f"({self.rebuilds} rebuilds){last}{state}")


def source_rows(snapshot: "Snapshot", sources: Iterable[str]) -> int:
    """The rows of a view's sources (``ViewDef.sources``): the size its costs are scaled by."""
    return sum(snapshot[s].num_rows for s in sources)
