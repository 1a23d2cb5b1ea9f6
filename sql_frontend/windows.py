"""Plan a SELECT with window functions (and QUALIFY) as SPJ -> Window -> SPJ.

Window functions are evaluated after FROM/WHERE/GROUP BY/HAVING and before
DISTINCT/ORDER BY/LIMIT. The SELECT is split in three:

    inner   the same SELECT (FROM, WHERE, GROUP BY, HAVING) projecting every
            value the windows and the outer expressions need ("shipped"):
            columns, aggregates, GROUP BY expressions, PARTITION BY / ORDER BY
            expressions and window arguments
    Window  one node per distinct PARTITION BY column set, chained
    outer   the original projections and QUALIFY, over the inner values and
            the window results

>>> import sqlglot
>>> sel = sqlglot.parse_one("SELECT a, ROW_NUMBER() OVER (PARTITION BY g ORDER BY x) + 1 AS r FROM t")
>>> [e.sql() for e in window_calls(sel)]
['ROW_NUMBER() OVER (PARTITION BY g ORDER BY x)']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from sqlglot import exp

from sql_frontend.errors import UnsupportedError
from sql_frontend.plan import SPJ, WINDOW_INPUT, Distinct, Node, Window
from sql_frontend.plan_sql import column

if TYPE_CHECKING:
    from sql_frontend.building import Building

WINDOWED = "__win"  # alias of the window node's output in the outer SPJ

# Window functions whose value over a partition is a function of its rows
# (given a total ORDER BY): recomputing a partition reproduces them.
RANKING = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.Ntile)
NAVIGATION = (exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue, exp.NthValue)
AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def has_windows(sel: exp.Select) -> bool:
    return sel.args.get("qualify") is not None or any(p.find(exp.Window) for p in sel.expressions)


def window_calls(sel: exp.Select) -> list[exp.Window]:
    """Distinct window expressions of the projections and QUALIFY, in order."""
    holders = list(sel.expressions)
    if sel.args.get("qualify") is not None:
        holders.append(sel.args["qualify"].this)
    seen: dict[str, exp.Window] = {}
    for holder in holders:
        for w in holder.find_all(exp.Window):
            seen.setdefault(w.sql("duckdb"), w)
    return list(seen.values())


def check_window(w: exp.Window) -> None:
    """Raise UnsupportedError for window expressions ivm does not maintain."""
    if isinstance(w.args.get("alias"), exp.Identifier) or isinstance(w.this, exp.Identifier):
        raise UnsupportedError(NAMED_WINDOW)
    func = w.this
    inner = func.this if isinstance(func, (exp.IgnoreNulls, exp.RespectNulls)) else func
    if isinstance(inner, exp.Filter):
        inner = inner.this
    if not isinstance(inner, RANKING + NAVIGATION + AGGREGATES):
        name = inner.sql_name() if isinstance(inner, exp.Func) else type(inner).__name__
        if isinstance(inner, exp.Anonymous):
            name = str(inner.this)
        raise UnsupportedError(
            f"window function {name.upper()} is not supported in a materialized view (supported: ROW_NUMBER, "
            "RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST, NTILE, LAG, LEAD, FIRST_VALUE, LAST_VALUE, NTH_VALUE, "
            "COUNT, SUM, AVG, MIN, MAX)"
        )


NAMED_WINDOW = ("a named window (WINDOW clause) is not supported in a materialized view; "
                "write the window in OVER (...)")


def plan_windows(builder: "Building", sel: exp.Select) -> Node:
    """The plan of a SELECT with window functions (see the module docstring)."""
    if sel.args.get("windows"):
        raise UnsupportedError(NAMED_WINDOW)
    calls = window_calls(sel)
    for w in calls:
        check_window(w)
    group = sel.args.get("group")
    groups = {g.sql("duckdb") for g in group.expressions} if group is not None else set()
    shipped: dict[str, tuple[str, exp.Expression]] = {}

    def ship(e: exp.Expression) -> exp.Column:
        key = e.sql("duckdb")
        if key not in shipped:
            shipped[key] = (f"wc{len(shipped)}", e.copy())
        return column(shipped[key][0], WINDOW_INPUT)

    def shippable(e: exp.Expression) -> bool:
        return (
            e.sql("duckdb") in groups
            or isinstance(e, exp.Column)
            or (isinstance(e, exp.AggFunc) and not isinstance(e.parent, exp.Filter))
            or (isinstance(e, exp.Filter) and isinstance(e.this, exp.AggFunc))
        )

    def lift_values(e: exp.Expression) -> exp.Expression:
        """``e`` with every shippable value replaced by its inner column."""
        return e.copy().transform(lambda n: ship(n) if shippable(n) else n)

    names: dict[str, str] = {}
    rewritten: list[tuple[str, exp.Window, tuple[str, ...]]] = []
    for i, w in enumerate(calls):
        name = f"wf{i}"
        names[w.sql("duckdb")] = name
        rewritten.append((name, _lift_window(w, lift_values, ship), _partition_columns(w, ship)))

    def lift_outer(e: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Window):
                return column(names[n.sql("duckdb")], WINDOWED)
            if shippable(n):
                c = ship(n)
                return column(c.name, WINDOWED)
            return n

        return e.copy().transform(swap)

    outputs = tuple((p.alias_or_name, lift_outer(p.unalias())) for p in sel.expressions)
    qualify = sel.args.get("qualify")
    predicate = lift_outer(qualify.this) if qualify is not None else None
    inner = _inner_select(sel, [(n, e) for n, e in shipped.values()])
    node = builder.select(inner)
    for partition, group_calls in _by_partition(rewritten):
        node = Window(input=node, partition=partition, calls=tuple(group_calls))
    result: Node = SPJ(inputs=((WINDOWED, node),), predicate=predicate, outputs=outputs)
    if sel.args.get("distinct"):
        result = Distinct(result)
    return result


def _lift_window(
    w: exp.Window, lift: Callable[[exp.Expression], exp.Expression], ship: Callable[[exp.Expression], exp.Column]
) -> exp.Window:
    """The window expression over inner columns.

    PARTITION BY and ORDER BY expressions are shipped whole (the node's
    partition key must be exactly the columns the calls partition by); the
    function's arguments have their values shipped, so constant arguments
    (LAG's offset) stay constants.
    """
    out = w.copy()
    func = out.this
    target = func.this if isinstance(func, (exp.IgnoreNulls, exp.RespectNulls)) else func
    holder = target.this if isinstance(target, exp.Filter) else target
    for key, value in list(holder.args.items()):
        if isinstance(value, exp.Expression):
            holder.set(key, lift(value))
        elif isinstance(value, list):
            holder.set(key, [lift(v) if isinstance(v, exp.Expression) else v for v in value])
    if isinstance(target, exp.Filter):
        target.set("expression", lift(target.expression))
    out.set("partition_by", [ship(p) for p in out.args.get("partition_by") or []])
    order = out.args.get("order")
    if order is not None:
        for ordered in order.expressions:
            ordered.set("this", ship(ordered.this))
    return out


def _partition_columns(w: exp.Window, ship: Callable[[exp.Expression], exp.Column]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ship(p).name for p in w.args.get("partition_by") or []))


def _by_partition(
    calls: list[tuple[str, exp.Window, tuple[str, ...]]]
) -> list[tuple[tuple[str, ...], list[tuple[str, exp.Expression]]]]:
    """Calls grouped by PARTITION BY column set: one Window node each."""
    groups: dict[frozenset[str], tuple[tuple[str, ...], list[tuple[str, exp.Expression]]]] = {}
    for name, w, partition in calls:
        key = frozenset(partition)
        groups.setdefault(key, (tuple(sorted(partition)), []))[1].append((name, w))
    return list(groups.values())


def _inner_select(sel: exp.Select, projections: list[tuple[str, exp.Expression]]) -> exp.Select:
    inner = sel.copy()
    for key in ("qualify", "distinct", "order", "limit", "offset", "windows"):
        inner.set(key, None)
    if not projections:  # every output is a constant: keep the row count
        projections = [("wc_one", exp.Literal.number(1))]
    inner.set("expressions", [exp.alias_(e, n, quoted=True) for n, e in projections])
    return inner
