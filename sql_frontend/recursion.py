"""Plan WITH RECURSIVE as a Recursive node (linear recursion only).

resolve.inline_ctes turns every reference to a recursive CTE into the
self-contained query ``WITH RECURSIVE r AS (base UNION [ALL] step) SELECT …
FROM r``. Here that query becomes one Recursive node (shared by every
reference to the same CTE): ``base`` is planned as usual, ``step`` with ``r``
bound to a RecursiveRef, and the outer SELECT with ``r`` bound to the node.

Supported shape: the recursive step is one SELECT (joins, filters,
projections; no aggregate, DISTINCT, window or LIMIT) reading ``r`` exactly
once; the base does not read ``r``.

>>> import sqlglot
>>> q = sqlglot.parse_one("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r")
>>> is_recursive(q)
True
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

from sqlglot import exp

from sql_frontend.errors import UnsupportedError
from sql_frontend.plan import SPJ, Column, Node, Recursive, RecursiveRef, walk
from sql_frontend.plan_sql import render
from sql_frontend.statements import normalize_name

if TYPE_CHECKING:
    from sql_frontend.building import Building


def is_recursive(q: exp.Expression) -> bool:
    with_ = q.args.get("with_")
    return isinstance(with_, exp.With) and bool(with_.args.get("recursive"))


def _reads(query: exp.Expression, name: str) -> int:
    return sum(
        1 for t in query.find_all(exp.Table)
        if isinstance(t.this, exp.Identifier) and normalize_name(t.this) == name
    )


@contextlib.contextmanager
def bound(builder: "Building", name: str, node: Node) -> Iterator[None]:
    """Plan FROM references to ``name`` as ``node`` while inside the block."""
    saved = builder.bound.get(name)
    builder.bound[name] = node
    try:
        yield
    finally:
        if saved is None:
            builder.bound.pop(name, None)
        else:
            builder.bound[name] = saved


def plan_recursive(builder: "Building", q: exp.Select) -> Node:
    """The plan of ``WITH RECURSIVE r AS (...) SELECT … FROM r`` (see the module docstring)."""
    (cte,) = q.args["with_"].expressions
    name = normalize_name(cte.alias)
    key = cte.sql("duckdb")
    node = builder.recursions.get(key)
    if node is None:
        node = builder.recursions[key] = _recursive_node(builder, cte, name)
    outer = q.copy()
    outer.set("with_", None)
    with bound(builder, name, node):
        return builder.query(outer)


def _recursive_node(builder: "Building", cte: exp.CTE, name: str) -> Recursive:
    body = cte.this
    if not isinstance(body, exp.Union):
        raise UnsupportedError(
            f"WITH RECURSIVE {name} must be 'base UNION [ALL] recursive step' to be maintained in a materialized view"
        )
    base, step = body.this, body.expression
    if _reads(base, name):
        raise UnsupportedError(
            f"WITH RECURSIVE {name}: a base (non-recursive) part that reads {name} is not supported; "
            "write it as 'base UNION [ALL] step' with one recursive step"
        )
    if _reads(step, name) != 1:
        raise UnsupportedError(
            f"non-linear recursion (the recursive step of {name} reads {name} more than once) "
            "is not supported in a materialized view"
        )
    wrapper = exp.select(exp.Star()).from_(exp.Table(this=exp.to_identifier(name, quoted=True)))
    wrapper.set("with_", exp.With(expressions=[cte.copy()], recursive=True))
    columns = builder.catalog.describe(render(wrapper))
    names = [c.name for c in cte.args["alias"].columns] or [c.name for c in columns]
    columns = tuple(Column(n, c.type) for n, c in zip(names, columns))
    ref = RecursiveRef(name=f"{name}_{len(builder.recursions)}", columns=columns)
    base_node = builder.query(base)
    with bound(builder, name, ref):
        step_node = builder.query(step)
    return Recursive(name=name, base=base_node, step=step_node, ref=ref,
                     distinct=bool(body.args.get("distinct")), columns=columns)


def check_recursion(root: Node) -> None:
    """After SPJ merging: each recursive step is one SPJ reading its reference directly."""
    for node in walk(root):
        if not isinstance(node, Recursive):
            continue
        step = node.step
        if isinstance(step, SPJ) and sum(child is node.ref for _, child in step.inputs) == 1:
            continue
        blocker = next((n for n in _path(step, node.ref) if not isinstance(n, SPJ)), step)
        label = {"Aggregate": "an aggregate", "Distinct": "DISTINCT", "UnionAll": "UNION",
                 "Window": "a window function", "TopK": "ORDER BY … LIMIT",
                 "Recursive": "a nested WITH RECURSIVE"}.get(type(blocker).__name__, type(blocker).__name__)
        raise UnsupportedError(
            f"{label} in the recursive step of WITH RECURSIVE {node.name} is not supported in a "
            "materialized view (the step must be joins, filters and projections over the CTE)"
        )


def _path(node: Node, target: Node) -> list[Node]:
    """The nodes from ``node`` down to ``target`` (excluding it); empty if unreachable."""
    for child in node.children():
        if child is target:
            return [node]
        below = _path(child, target)
        if below:
            return [node, *below]
    return []
