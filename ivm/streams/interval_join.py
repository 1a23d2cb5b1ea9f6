"""Interval joins of two event streams: the stored stream rows they no longer need.

Contract: a view with ``late = 'drop'`` (the default) that inner-joins exactly
two watermarked APPEND ONLY streams (or one stream with itself), with no
other table and no subquery, and whose WHERE / ON conjuncts bound each
side's event time by the other's, e.g.

    b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' HOUR      (or the >= / <= pair)

is an *interval join*. Its answer is unchanged when the stream rows it can
no longer match are dropped from the stored on-time rows (the hidden twin
``__ontime_<t>`` that drop views read), so the twin keeps only the rows some
interval join may still need. Anything else is not bounded: a stream read
by such a view keeps all its rows (or, with RETAIN, the view is refused).

Rule (difference constraints). Each conjunct ``x.ts + c1 <op> y.ts + c2``
with op in ``<=, <, >=, >, =`` (and BETWEEN as two of them) over the event-time
columns of the two sides is a constraint ``x.ts - y.ts <= d`` (``<`` is
weakened to ``<=``: a looser bound drops less, never too much); for each
ordered pair keep the smallest d: ``D(x, y)``. Both ``D(a, b)`` and
``D(b, a)`` must exist, else the view is not an interval join.

Expiry. An on-time row of side y reaches the join only in a batch of its
stream whose watermark before the batch was at most y.ts (drop policy: late
rows never arrive), and watermarks only grow. So once W_x, the watermark of
x's stream before the current batch, exceeds ``r.ts + D(x, r)`` for a stored
row r of side y, no x row that is yet to come can satisfy ``x.ts - r.ts <=
D(x, y)``: r can go. The rows of the current batch are joined from its delta,
not from the stored rows, so the cutoff taken before the batch is safe:

    expire r of stream S  when  r.ts < W_x - D(x, y)   (y = the side r plays)

A stream read by several views keeps the rows any of them may need: its
cutoff is the minimum over its interval joins, and there is none (nothing
expires) while any other view reads its stored on-time rows (lookups, scans,
reads of a computed-on-read view). A self-join gives both sides the same
stream, so its rows expire at min over both sides. Stored rows of the join
are therefore at most the rows of the last ``lateness + max D`` of event
time (plus the disorder of the stream), whatever the stream's length.

Consequences, enforced by the engine: a view over such a stream is never
recomputed from its sources (they no longer hold every on-time row), and a
``late = 'drop'`` view created after the twin dropped rows is refused (its
first computation would miss them).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ivm.streams.names import ON_TIME_PREFIX
from sql_frontend.errors import SqlSyntaxError, UnsupportedError
from sql_frontend.event_time import interval_us


@dataclass(frozen=True)
class IntervalSide:
    stream: str  # the stream (base table) whose on-time rows this side reads
    other: str  # the stream whose watermark decides when this side's rows expire
    slack_us: int  # D(other side, this side): rows with ts < W(other) - slack can go


@dataclass(frozen=True)
class IntervalJoin:
    sides: tuple[IntervalSide, IntervalSide]


def interval_join(query: exp.Expression, catalog, late: str | None) -> IntervalJoin | None:
    """The interval join ``query`` (the SELECT after view_query) is, or None."""
    if (late or "drop") != "drop" or not isinstance(query, exp.Select):
        return None
    if any(isinstance(node, (exp.Subquery, exp.Union, exp.Except, exp.Intersect)) for node in query.walk()):
        return None
    tables = list(query.find_all(exp.Table))
    aliases = _aliases(tables, catalog)
    if aliases is None or len(aliases) != 2:
        return None
    joins = query.args.get("joins") or []
    if any(j.args.get("side") or (j.args.get("kind") or "").upper() not in ("", "INNER", "CROSS") for j in joins):
        return None
    conjuncts = []
    where = query.args.get("where")
    for clause in [where.this if where is not None else None, *(j.args.get("on") for j in joins)]:
        if clause is not None:
            conjuncts.extend(clause.flatten() if isinstance(clause, exp.And) else [clause])
    bounds = _bounds(conjuncts, aliases)
    (a, (stream_a, _)), (b, (stream_b, _)) = aliases.items()
    if (a, b) not in bounds or (b, a) not in bounds:
        return None
    return IntervalJoin((IntervalSide(stream_a, stream_b, bounds[(b, a)]),
                         IntervalSide(stream_b, stream_a, bounds[(a, b)])))


def view_interval(view, query: exp.Expression, catalog) -> IntervalJoin | None:
    """``view``'s interval join, unless its rows are computed on read from the streams' stored rows."""
    spec = interval_join(query, catalog, view.late)
    if spec is not None and not view.stored_output and set(view.read_sql()[1]) & set(view.sources):
        return None  # reads on read would see the rows that went
    return spec


def _aliases(tables: list[exp.Table], catalog) -> dict[str, tuple[str, str]] | None:
    """alias -> (stream, event-time column) for tables that are on-time twins of watermarked streams; None if any other table."""
    out = {}
    for table in tables:
        name = table.name.lower()
        if not name.startswith(ON_TIME_PREFIX):
            return None
        stream = name.removeprefix(ON_TIME_PREFIX)
        definition = catalog.tables.get(stream)
        if definition is None or definition.event_time is None:
            return None
        out[table.alias_or_name.lower()] = (stream, definition.event_time.lower())
    return out if len(out) == len(tables) else None


def _bounds(conjuncts, aliases: dict[str, tuple[str, str]]) -> dict[tuple[str, str], int]:
    """D(x, y): the smallest d with x.ts - y.ts <= d over the conjuncts."""
    out: dict[tuple[str, str], int] = {}

    def add(left, right) -> None:  # left <= right, each (alias, offset) or None
        if left is None or right is None or left[0] == right[0]:
            return
        pair, d = (left[0], right[0]), right[1] - left[1]
        out[pair] = min(out.get(pair, d), d)

    for c in conjuncts:
        if isinstance(c, exp.Between):
            this = _term(c.this, aliases)
            add(_term(c.args["low"], aliases), this)
            add(this, _term(c.args["high"], aliases))
        elif isinstance(c, (exp.LTE, exp.LT, exp.GTE, exp.GT, exp.EQ)):
            left, right = _term(c.this, aliases), _term(c.expression, aliases)
            if isinstance(c, (exp.LTE, exp.LT, exp.EQ)):
                add(left, right)
            if isinstance(c, (exp.GTE, exp.GT, exp.EQ)):
                add(right, left)
    return out


def _term(node, aliases: dict[str, tuple[str, str]]) -> tuple[str, int] | None:
    """``alias.ts [± INTERVAL]`` (ts the side's event time) as (alias, offset in microseconds)."""
    offset = 0
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = node.this, node.expression
        if isinstance(node, exp.Add) and isinstance(left, exp.Interval):
            left, right = right, left
        if not isinstance(right, exp.Interval):
            return None
        try:
            offset = interval_us(right.sql("duckdb"))
        except SqlSyntaxError:
            return None
        offset = offset if isinstance(node, exp.Add) else -offset
        node = left
    if not isinstance(node, exp.Column) or not node.table:
        return None
    alias = node.table.lower()
    return (alias, offset) if alias in aliases and aliases[alias][1] == node.name.lower() else None


# --- what a stream's on-time rows must keep ------------------------------------------------------------

class _Limit:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


KEEP_ALL = _Limit("KEEP_ALL")  # a reader needs every stored on-time row
UNREAD = _Limit("UNREAD")  # no view reads the stored on-time rows (deltas only): no interval constraint


def stored_reads(view, stored_new) -> frozenset[str]:
    """Relations whose stored rows ``view`` reads: lookups and scans of its programs, reads on read."""
    sources = list(view.sources)
    read: set[str] = set()
    for changed in {frozenset([s]) for s in sources} | {frozenset(sources)}:
        program = view.program(changed, stored_new(changed))
        read |= {i.relation for i in program.indexes} | set(program.scans)
    if not view.stored_output:
        read |= set(view.read_sql()[1])
    return frozenset(read)


def on_time_cutoff(stream: str, views, watermark, reads) -> int | _Limit:
    """Event time below which ``stream``'s stored on-time rows can go.

    ``watermark(name)``: a stream's watermark before the current batch (None
    before its first event); ``reads(view)``: the relations it reads stored
    rows of. KEEP_ALL when a reader is not an interval join (or a watermark is
    still unknown), UNREAD when no view reads the stored rows.
    """
    twin = ON_TIME_PREFIX + stream
    cutoffs = []
    for view in views:
        if twin not in view.sources:
            continue
        if view.interval is None:
            if twin in reads(view):
                return KEEP_ALL
            continue
        for side in view.interval.sides:
            if side.stream == stream:
                mark = watermark(side.other)
                if mark is None:
                    return KEEP_ALL
                cutoffs.append(mark - side.slack_us)
    return min(cutoffs) if cutoffs else UNREAD


def expired_counter(stream: str) -> str:
    """The snapshot counter of on-time rows an interval join let go (views created later would miss them)."""
    return f"expired:{stream}"


def check_expired_reads(view, snapshot) -> None:
    """Refuse a drop view over a stream whose on-time rows an interval join already let go."""
    for source in sorted(view.sources):
        stream = source.removeprefix(ON_TIME_PREFIX)
        gone = snapshot.counters.get(expired_counter(stream), 0) if source.startswith(ON_TIME_PREFIX) else 0
        if gone:
            raise UnsupportedError(
                f"materialized view {view.name} reads the on-time rows of {stream}, but {gone} of them are gone "
                f"(interval joins keep only the rows they can still match): its first computation would miss "
                f"them; create views over {stream} before streaming, or with WITH (late = 'correct')")
