"""Plan ``ORDER BY … LIMIT k [OFFSET n]`` as a TopK node.

The query without ORDER BY/LIMIT/OFFSET is planned as usual, projecting
any ORDER BY expression that is not an output column as a hidden column;
TopK keeps the rows at the requested sort positions, and an SPJ drops the
hidden columns again.

>>> import sqlglot
>>> limits(sqlglot.parse_one("SELECT a FROM t ORDER BY a LIMIT 3 OFFSET 2"))
(3, 2)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from sql_frontend.errors import UnsupportedError
from sql_frontend.plan import SPJ, Node, SortKey, TopK
from sql_frontend.plan_sql import column

if TYPE_CHECKING:
    from sql_frontend.building import Building

TOP = "__top"


def has_limit(q: exp.Expression) -> bool:
    return isinstance(q, (exp.Select, exp.SetOperation)) and (
        q.args.get("limit") is not None or q.args.get("offset") is not None
    )


def _constant(e: exp.Expression | None, what: str) -> int | None:
    if e is None:
        return None
    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
        return int(e.this)
    raise UnsupportedError(f"{what} with a count other than an integer literal "
                           "is not supported in a materialized view")


def limits(q: exp.Expression) -> tuple[int | None, int]:
    """(limit or None, offset) of a query, as constants."""
    limit = q.args.get("limit")
    count: int | None = None
    if isinstance(limit, exp.Fetch):
        options = limit.args.get("limit_options")
        if options is not None and (options.args.get("percent") or options.args.get("with_ties")):
            raise UnsupportedError("FETCH … PERCENT / WITH TIES is not supported in a materialized view")
        count = _constant(limit.args.get("count"), "FETCH")
    elif isinstance(limit, exp.Limit):
        if limit.args.get("percent") or limit.args.get("expressions"):
            raise UnsupportedError("LIMIT … PERCENT is not supported in a materialized view")
        count = _constant(limit.expression, "LIMIT")
    offset = q.args.get("offset")
    return count, (_constant(offset.expression, "OFFSET") or 0) if offset is not None else 0


def output_names(q: exp.Expression) -> list[str]:
    while isinstance(q, exp.SetOperation):
        q = q.this
    if isinstance(q, exp.Subquery):
        return output_names(q.this)
    return [p.alias_or_name for p in q.expressions]


def plan_top_k(builder: "Building", q: exp.Expression) -> Node:
    """The plan of a query with LIMIT/OFFSET (see the module docstring)."""
    order = q.args.get("order")
    if order is None or not order.expressions:
        what = "LIMIT" if q.args.get("limit") is not None else "OFFSET"
        raise UnsupportedError(
            f"{what} without ORDER BY is not supported in a materialized view (the rows it keeps are not determined)"
        )
    limit, offset = limits(q)
    base = q.copy()
    for key in ("order", "limit", "offset"):
        base.set(key, None)
    names = output_names(q)
    by_sql = {}
    if isinstance(q, exp.Select):
        by_sql = {p.unalias().sql("duckdb"): p.alias_or_name for p in q.expressions}
    keys: list[SortKey] = []
    hidden: list[str] = []
    for i, ordered in enumerate(order.expressions):
        e = ordered.this
        if isinstance(e, exp.Column) and not e.table and e.name in names:
            name = e.name
        elif e.sql("duckdb") in by_sql:
            name = by_sql[e.sql("duckdb")]
        elif isinstance(base, exp.Select) and not base.args.get("distinct"):
            name = f"__order{i}"
            base.set("expressions", [*base.expressions, exp.alias_(e.copy(), name, quoted=True)])
            hidden.append(name)
        else:
            raise UnsupportedError(
                "ORDER BY an expression that is not an output column of a DISTINCT or set-operation query "
                "is not supported in a materialized view"
            )
        keys.append(SortKey(name, bool(ordered.args.get("desc")), bool(ordered.args.get("nulls_first"))))
    top = TopK(input=builder.query(base), order=tuple(keys), limit=limit, offset=offset)
    if not hidden:
        return top
    return SPJ(inputs=((TOP, top),), predicate=None, outputs=tuple((n, column(n, TOP)) for n in names))
