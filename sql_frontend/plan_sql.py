"""Render a plan node back to one plain SELECT (the non-incremental meaning).

Used to infer each node's column types with DuckDB's binder, to print plans,
and by tests: a plan's SQL must return what the original SELECT returns.

>>> from sql_frontend.plan import Source, SPJ, Column
>>> t = Source("t", "table", (Column("a", "INTEGER"),))
>>> node = SPJ((("x", t),), None, (("b", column("a", "x")),))
>>> to_sql(node).sql("duckdb")
'SELECT "x"."a" AS "b" FROM "t" AS "x"'
"""

from __future__ import annotations

from contextvars import ContextVar

from sqlglot import exp

from sql_frontend.session_windows import islands_sql
from sql_frontend.plan import (
    LEFT, RIGHT, SPJ, WINDOW_INPUT, Aggregate, AggCall, Distinct, Node, Recursive, RecursiveRef, SemiJoin, SetOp,
    Session, Source, TopK, UnionAll, Window,
)


OPERATORS = (exp.Binary, exp.Unary, exp.Between, exp.In)


def parenthesize(tree: exp.Expression) -> exp.Expression:
    """Wrap every operator operand that is itself an operator in parentheses.

    sqlglot renders a tree as given, and trees built in code (or spliced by
    substitution) carry no Paren nodes: Mul(x, Sub(a, b)) would print as
    ``x * a - b``. Extra parentheses never change meaning; missing ones do.
    """
    for node in list(tree.walk()):
        if isinstance(node, OPERATORS) and not isinstance(node, exp.Paren):
            for key in ("this", "expression", "low", "high"):
                child = node.args.get(key)
                if isinstance(child, OPERATORS) and not isinstance(child, exp.Paren):
                    node.set(key, exp.Paren(this=child))
    return tree


def render(tree: exp.Expression, dialect: str = "duckdb") -> str:
    """SQL text of a tree built in code, safe against operator precedence."""
    return parenthesize(tree.copy()).sql(dialect, copy=False)  # the copy is ours: generating may change it


def quoted(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def column(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=quoted(name), table=quoted(table) if table else None)


def alias(expression: exp.Expression, name: str) -> exp.Alias:
    return exp.Alias(this=expression, alias=quoted(name))


def table(name: str, alias_name: str | None = None) -> exp.Table:
    t = exp.Table(this=quoted(name))
    if alias_name:
        t.set("alias", exp.TableAlias(this=quoted(alias_name)))
    return t


def lit(n: int) -> exp.Literal:
    return exp.Literal.number(n)


def subquery(query: exp.Expression, alias_name: str) -> exp.Subquery:
    return exp.Subquery(this=query, alias=exp.TableAlias(this=quoted(alias_name)))


def aggregate_expression(call: AggCall, arg: exp.Expression | None) -> exp.Expression:
    """The SQL aggregate call for ``call`` over the argument expression."""
    if call.func == "count_star":
        return exp.Count(this=exp.Star())
    assert arg is not None
    inner: exp.Expression = exp.Distinct(expressions=[arg]) if call.distinct else arg
    cls = {"count": exp.Count, "sum": exp.Sum, "avg": exp.Avg, "min": exp.Min, "max": exp.Max}[call.func]
    return cls(this=inner)


def to_sql(node: Node) -> exp.Expression:
    """One SELECT computing ``node`` from the stored relations."""
    if isinstance(node, Source):
        return exp.select(*[alias(column(c.name), c.name) for c in node.columns]).from_(
            table(node.relation)
        )
    if isinstance(node, SPJ):
        return _spj_sql(node)
    if isinstance(node, Aggregate):
        inner = subquery(to_sql(node.input), "__in")
        keys = [column(k, "__in") for k in node.keys]
        calls = [
            alias(aggregate_expression(c, column(c.arg, "__in") if c.arg else None), c.name)
            for c in node.aggregates
        ]
        select = exp.select(*[alias(k, n) for k, n in zip(keys, node.keys)], *calls).from_(inner)
        if keys:
            select = select.group_by(*keys)
        return select
    if isinstance(node, Distinct):
        return exp.select(exp.Star()).distinct().from_(subquery(to_sql(node.input), "__in"))
    if isinstance(node, UnionAll):
        parts = [to_sql(child) for child in node.inputs]
        result = parts[0]
        for part in parts[1:]:
            result = exp.union(result, part, distinct=False)
        return result
    if isinstance(node, SemiJoin):
        return _semi_join_sql(node)
    if isinstance(node, SetOp):
        left = exp.select(exp.Star()).from_(subquery(to_sql(node.left), "__a"))
        right = exp.select(exp.Star()).from_(subquery(to_sql(node.right), "__b"))
        cls = exp.Except if node.kind == "except" else exp.Intersect
        return cls(this=left, expression=right, distinct=not node.all)
    if isinstance(node, (Window, TopK, Recursive, RecursiveRef)):
        return _ordered_or_recursive_sql(node)
    if isinstance(node, Session):
        return islands_sql(to_sql(node.input), node.input.column_names, node.keys, node.time, node.gap_us)
    raise TypeError(f"no SQL rendering for {type(node).__name__}")


def match_condition(node: SemiJoin) -> exp.Expression:
    """The condition under which a left row (``__l``) matches a right row (``__r``)."""
    parts: list[exp.Expression] = [
        exp.EQ(this=column(lk, LEFT), expression=column(rk, RIGHT)) for lk, rk in node.keys
    ]
    if node.residual is not None:
        parts.append(node.residual.copy())
    return exp.and_(*parts) if parts else exp.true()


def _semi_join_sql(node: SemiJoin) -> exp.Select:
    """``SELECT l.* FROM left l WHERE [NOT] EXISTS (SELECT 1 FROM right r WHERE match)``."""
    found = exp.Exists(
        this=exp.select(exp.Literal.number(1))
        .from_(subquery(to_sql(node.right), RIGHT))
        .where(match_condition(node))
    )
    test: exp.Expression = exp.Not(this=found) if node.anti else found
    return (
        exp.select(*[alias(column(c, LEFT), c) for c in node.left.column_names])
        .from_(subquery(to_sql(node.left), LEFT))
        .where(test)
    )


def _spj_sql(node: SPJ) -> exp.Select:
    select = exp.select(*[alias(e.copy(), n) for n, e in node.outputs])
    for i, (name, child) in enumerate(node.inputs):
        source = table(child.relation, name) if isinstance(child, Source) else subquery(
            to_sql(child), name
        )
        select = select.from_(source) if i == 0 else select.join(source, join_type="cross")
    if node.predicate is not None:
        select = select.where(node.predicate.copy())
    return select


# --- window, top-K and recursive nodes --------------------------------------------

# The recursive references being rendered inside their WITH RECURSIVE; any
# other reference (a step rendered alone, to infer its types) is empty.
_OPEN_RECURSIONS: ContextVar[frozenset[int]] = ContextVar("open_recursions", default=frozenset())


def recursive_table(ref: RecursiveRef) -> str:
    """The CTE name under which a recursive reference reads its relation."""
    return f"__rec_{ref.name}"


def _ordered_or_recursive_sql(node: Node) -> exp.Expression:
    if isinstance(node, Window):
        inner = subquery(to_sql(node.input), WINDOW_INPUT)
        return exp.select(
            *[alias(column(c.name, WINDOW_INPUT), c.name) for c in node.input.columns],
            *[alias(e.copy(), n) for n, e in node.calls],
        ).from_(inner)
    if isinstance(node, TopK):
        select = exp.select(*[alias(column(c.name, "__top"), c.name) for c in node.input.columns])
        select = select.from_(subquery(to_sql(node.input), "__top"))
        select = select.order_by(*[k.ordered("__top") for k in node.order])
        if node.limit is not None:
            select = select.limit(node.limit)
        return select.offset(node.offset) if node.offset else select
    if isinstance(node, RecursiveRef):
        names = [c.name for c in node.columns]
        if id(node) in _OPEN_RECURSIONS.get():
            return exp.select(*[alias(column(n, "__r"), n) for n in names]).from_(
                table(recursive_table(node), "__r"))
        return exp.select(*[
            alias(exp.cast(exp.null(), exp.DataType.build(c.type, dialect="duckdb")), c.name) for c in node.columns
        ]).where(exp.false())
    assert isinstance(node, Recursive)
    token = _OPEN_RECURSIONS.set(_OPEN_RECURSIONS.get() | {id(node.ref)})
    try:
        body = exp.union(to_sql(node.base), to_sql(node.step), distinct=node.distinct)
    finally:
        _OPEN_RECURSIONS.reset(token)
    name = recursive_table(node.ref)
    cte = exp.CTE(this=body, alias=exp.TableAlias(this=quoted(name), columns=[quoted(c.name) for c in node.columns]))
    select = exp.select(*[alias(column(c.name, "__r"), c.name) for c in node.columns]).from_(table(name, "__r"))
    select.set("with_", exp.With(expressions=[cte], recursive=True))
    return select
