"""Closed windows over several streams: which state may go, and when.

Contract: a ``late = 'drop'`` view that reads only watermarked append-only
streams S1..Sn (n >= 2, their on-time rows), each windowed by TUMBLE/HOP,
and whose joins match windows, loses the operator state of windows every
stream's watermark has closed. Anything else keeps its state (``None``).

Algebra. Let Wi be Si's watermark in the snapshot a batch is maintained
into and W = min_i Wi. Under the drop policy a later event e of Si reaches
the view only if e.ts >= Wi >= W (watermarks only grow). The plan is
*window-local* when every row of every node carries a column window_start
s such that every event contributing to the row lies in [s, s + size)
(size = the largest TUMBLE/HOP size in the view):

    Source row at ts  -> TUMBLE/HOP projection: s = time_bucket(ts) - k*slide, ts in [s, s + size)
    SPJ, one input    -> window_start passed through as a column: still s
    SPJ, joins        -> inputs matched by x.window_start = y.window_start: one s for all
    Aggregate/DISTINCT-> window_start among the group keys: one s per group
    UNION ALL         -> every input's column at window_start's position is its window_start

Then a change caused by e only touches rows (and looks up rows) with
s <= e.ts < s + size, so a state row with

    s + size <= W        (the window closed for every stream)

is neither changed nor read again: it may go. W is the minimum over all the
view's streams, not per relation: in a join the state of one stream's side
is looked up by the other stream's changes, so the slowest watermark bounds
it (per-stream cutoffs would be exact only for state no other stream reads).

Kept: the view's output (its rows), and every state of a view that is not
window-local (a stream read without a window, a join not on window_start,
a window_start that is computed rather than passed, SESSION, an ordinary
table, or any operator other than SPJ/Aggregate/DISTINCT/UNION ALL). Such a
view computed on read from its state could not drop it without losing rows,
so a closable view stores its output (``store_output``).

One stream (ivm/streams/event_time.py closed_windows) uses the same check, with one
more root shape (``_pinned``, Nexmark q7): raw on-time rows r of the stream
joined with one window-local input X under a conjunct r.ts < X.window_end.
A later event e (e.ts >= W) then joins only X rows with
window_start + size >= window_end > e.ts >= W, i.e. open windows, and
changes only open windows' groups; the raw rows carry no window_start and
are kept. A raw row joined on the key alone (or only with a lower bound)
could reach any closed window: such a view keeps its state.
"""

from __future__ import annotations

from sqlglot import exp

from ivm.streams.names import on_time_name
from sql_frontend.plan import SPJ, Aggregate, Distinct, Node, Source, UnionAll, walk

START = "window_start"
END = "window_end"


def closable_streams(view, query, catalog) -> tuple[tuple[str, ...], int] | None:
    """(streams, largest window size in µs) when ``view`` over several streams is window-local; else None."""
    from sql_frontend.session_windows import session_tables
    from sql_frontend.time_windows import window_sizes

    if (view.late or "drop") != "drop" or session_tables(query):
        return None
    sizes = window_sizes(query)
    bases = set()
    for source in view.sources:
        table = catalog.tables.get(source)
        if table is None:
            return None  # a view: its changes are not bounded by a watermark here
        base = catalog.tables.get(table.shadow_of or source)
        if base is None or base.event_time is None or source != on_time_name(base.name):
            return None  # an ordinary table, a stream read with all its rows, or its watermark
        bases.add(base.name)
    if len(bases) < 2 or bases - set(sizes) or not window_local(view.plan.root):
        return None
    return tuple(sorted(bases)), max(sizes[b] for b in bases)


def window_local(root: Node, catalog=None) -> bool:
    """Every node of the plan passes a genuine window_start (see the module's algebra); with ``catalog``, the
    root may also join a stream's raw on-time rows pinned to the windows they can reach (``_pinned``)."""
    if catalog is not None and isinstance(root, SPJ) and _pinned(root, catalog):
        windowed = [child for _, child in root.inputs if not isinstance(child, Source)]
        return all(_spj_local(node, False) if isinstance(node, SPJ) else _local(node)
                   for child in windowed for node in walk(child))  # X keeps a genuine window_start too
    return all(_spj_local(node, node is root) if isinstance(node, SPJ) else _local(node) for node in walk(root))


def _pinned(root: SPJ, catalog) -> bool:
    """The root joins raw rows of streams (their on-time twins) with one window-local input X, and each raw
    row r is pinned to X's windows by a conjunct ``r.ts < X.window_end`` (ts: the stream's event time,
    window_end a genuine window end, <= window_start + size): a later event e (e.ts >= W) then reaches only
    X rows with window_start + size >= window_end > e.ts >= W, windows still open (Nexmark q7)."""
    inputs = dict(root.inputs)
    raw = {alias: child for alias, child in inputs.items() if isinstance(child, Source)}
    windowed = [alias for alias in inputs if alias not in raw]
    if not raw or len(windowed) != 1 or not _genuine_end(inputs[windowed[0]]) or root.predicate is None:
        return False
    bounds = set()
    conjuncts = root.predicate.flatten() if isinstance(root.predicate, exp.And) else [root.predicate]
    for conjunct in conjuncts:
        if isinstance(conjunct, (exp.LT, exp.GT)):
            low, high = (conjunct.this, conjunct.expression) if isinstance(conjunct, exp.LT) else (
                conjunct.expression, conjunct.this)
            if (isinstance(low, exp.Column) and isinstance(high, exp.Column) and high.table == windowed[0]
                    and high.name == END):
                bounds.add((low.table, low.name))
    for alias, source in raw.items():
        table = catalog.tables.get(source.relation)
        base = table and catalog.tables.get(table.shadow_of or source.relation)
        if base is None or base.event_time is None or source.relation != on_time_name(base.name):
            return False  # an ordinary table, or a stream read with its late rows
        if (alias, base.event_time) not in bounds or START in _names(source):
            return False
    return True


def _genuine_end(node: Node) -> bool:
    """``window_end`` of ``node`` is a TUMBLE/HOP window's end, passed on from its projection."""
    if isinstance(node, Aggregate):
        return END in node.keys and START in node.keys and _genuine_end(node.input)
    if isinstance(node, Distinct):
        return _genuine_end(node.children()[0])
    if isinstance(node, SPJ) and len(node.inputs) == 1:
        (alias, child), = node.inputs
        out = dict(node.outputs).get(END)
        if isinstance(child, Source):
            return isinstance(out, exp.Add) and _is_bucket(out.this) and _is_interval(out.expression)
        return isinstance(out, exp.Column) and out.name == END and out.table == alias and _genuine_end(child)
    return False


def _names(node: Node) -> list[str]:
    return [c.name for c in node.columns]


def _local(node: Node) -> bool:
    if isinstance(node, Source):
        return START not in _names(node)  # a stream's own column named window_start is not a window
    if isinstance(node, Aggregate):
        return START in node.keys and START in _names(node.input) and START not in [a.name for a in node.aggregates]
    if isinstance(node, Distinct):
        return START in _names(node.children()[0])
    if isinstance(node, UnionAll):
        at = _names(node).index(START) if START in _names(node) else None
        return at is not None and all(_names(child)[at] == START for child in node.inputs)
    return False


def _spj_local(node: SPJ, root: bool) -> bool:
    """The root may rename or drop window_start: it owns no state (the view's rows are stored)."""
    inputs = dict(node.inputs)
    outputs = dict(node.outputs)
    if len(inputs) == 1 and isinstance(next(iter(inputs.values())), Source):
        return START in outputs and _is_bucket(outputs[START])  # the TUMBLE/HOP projection of a stream
    if any(isinstance(child, Source) or START not in _names(child) for child in inputs.values()):
        return False  # a stream joined without its window, or an input without one
    out = outputs.get(START)
    if not root and not (isinstance(out, exp.Column) and out.name == START and out.table in inputs):
        return False  # window_start computed (or dropped) below the root, not passed on
    return len(inputs) == 1 or _matched(node.predicate, set(inputs))


def _is_bucket(expression: exp.Expression) -> bool:
    """time_bucket(size, ts, EPOCH) (TUMBLE), minus k slides (HOP): sql_frontend/time_windows.py."""
    node = expression
    while isinstance(node, exp.Sub) and _is_interval(node.expression):
        node = node.this
    return isinstance(node, exp.Anonymous) and node.name.upper() == "TIME_BUCKET"


def _is_interval(expression: exp.Expression) -> bool:
    """A constant interval: INTERVAL '…' or TO_MICROSECONDS(<literal>) (k slides of a HOP)."""
    if isinstance(expression, exp.Interval):
        return True
    return (isinstance(expression, exp.Anonymous) and expression.name.upper() == "TO_MICROSECONDS"
            and all(isinstance(e, exp.Literal) for e in expression.expressions))


def _matched(predicate: exp.Expression | None, aliases: set[str]) -> bool:
    """The conjuncts ``a.window_start = b.window_start`` connect every input of the join."""
    if predicate is None:
        return False
    groups = {a: {a} for a in aliases}
    for conjunct in predicate.flatten() if isinstance(predicate, exp.And) else [predicate]:
        if not isinstance(conjunct, exp.EQ):
            continue
        left, right = conjunct.this, conjunct.expression
        if all(isinstance(c, exp.Column) and c.name == START and c.table in aliases for c in (left, right)):
            merged = groups[left.table] | groups[right.table]
            for alias in merged:
                groups[alias] = merged
    return all(len(g) == len(aliases) for g in groups.values())
