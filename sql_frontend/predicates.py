"""EXISTS, NOT EXISTS, IN and NOT IN subqueries (and SEMI / ANTI JOIN) as semi/anti joins.

A subquery predicate that is a conjunct of WHERE filters the rows of the
FROM clause, so it becomes a ``SemiJoin`` over them:

    EXISTS (S)                 semi join with S      (anti join for NOT EXISTS)
    x IN (SELECT y …)          semi join on x = y
    a SEMI JOIN b ON c         EXISTS (SELECT 1 FROM b WHERE c)   (ANTI: NOT EXISTS)

A correlated subquery is decorrelated first (``correlation.split_correlation``):
its ``inner = outer`` conjuncts become join keys and other conjuncts reading
outer columns the join's residual condition; the subquery then runs once,
uncorrelated, as the join's right side.

NOT IN is not an anti join: ``x NOT IN (S)`` is UNKNOWN (so the row is
dropped) when x is NULL and S is not empty, or when S holds a NULL and x
matches nothing. Exactly:

    x NOT IN (S)  =  [x IS NOT NULL] ▷(S on x = y) ▷(S where y IS NULL)
                  ⊎  [x IS NULL] ▷(S)

(▷: anti join; correlation keys, if any, join each part). Each anti join
keeps per-key counts, so NULLs appearing in or vanishing from S flip the
rows they affect, and nothing else. The parts with no key read whole
relations when S changes; where the catalog proves x or y never NULL
(``not_null.never_null``: NOT NULL and key columns), they are empty and not
planned, so NOT IN over key columns is the one keyed anti join.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlglot import exp

from sql_frontend.correlation import is_correlated, local_aliases, split_correlation
from sql_frontend.errors import UnsupportedError
from sql_frontend.join_keys import cast_outputs, comparable, key_type
from sql_frontend.not_null import never_null
from sql_frontend.plan import LEFT, RIGHT, SPJ, Node, SemiJoin, UnionAll
from sql_frontend.plan_sql import column
from sql_frontend.scope import FromClause, flat_name
from sql_frontend.statements import DIALECT

if TYPE_CHECKING:
    from sql_frontend.building import Building

RIGHT_INPUT = "__q"


@dataclass
class Predicate:
    """One semi/anti join to apply to the rows of a FROM clause."""

    right: Node  # the decorrelated subquery, typed
    pairs: list[tuple[exp.Expression, str]]  # (outer expression, right column) joined by =
    residual: list[exp.Expression] = field(default_factory=list)  # outer aliases and __r.<right column>
    anti: bool = False
    null_aware: bool = False  # NOT IN: the last pair is (x, y)
    origin: str = ""  # the SQL, for EXPLAIN


def is_predicate(conjunct: exp.Expression) -> bool:
    """True for [NOT] EXISTS (…) and x [NOT] IN (subquery)."""
    e = conjunct.unnest()
    if isinstance(e, exp.Not):
        e = e.this.unnest()
    return isinstance(e, exp.Exists) or (isinstance(e, exp.In) and e.args.get("query") is not None)


def from_conjunct(b: "Building", conjunct: exp.Expression, outer: set[str]) -> Predicate:
    predicate = _from_conjunct(b, conjunct, outer)
    text = conjunct.sql("duckdb")
    predicate.origin = text if len(text) <= 100 else text[:97] + "..."
    return predicate


def _from_conjunct(b: "Building", conjunct: exp.Expression, outer: set[str]) -> Predicate:
    e = conjunct.unnest()
    negated = isinstance(e, exp.Not)
    if negated:
        e = e.this.unnest()
    if isinstance(e, exp.Exists):
        return _exists(b, e.this, outer, anti=negated)
    query = e.args["query"]
    query = query.this if isinstance(query, exp.Subquery) else query
    return _in(b, e.this, query, outer, negated)


def from_join(b: "Building", item: exp.Expression, on: exp.Expression | None, outer: set[str], anti: bool) -> Predicate:
    """``FROM … SEMI|ANTI JOIN item ON on``: the same as [NOT] EXISTS (SELECT 1 FROM item WHERE on)."""
    body = exp.select(exp.Literal.number(1)).from_(item.copy())
    if on is not None:
        body = body.where(on.copy())
    predicate = _exists(b, body, outer, anti=anti)
    predicate.origin = f"{'ANTI' if anti else 'SEMI'} JOIN {item.sql('duckdb')}"
    return predicate


def _exists(b: "Building", query: exp.Expression, outer: set[str], anti: bool) -> Predicate:
    what = "NOT EXISTS subquery" if anti else "EXISTS subquery"
    if not is_correlated(query):
        return Predicate(right=b.typed(b.query(query)), pairs=[], anti=anti)
    select = _plain_select(query, what)
    corr = split_correlation(select, outer, what)
    return _decorrelated(b, select, corr, extra=[], anti=anti)


def _in(b: "Building", x: exp.Expression, query: exp.Expression, outer: set[str], negated: bool) -> Predicate:
    what = "NOT IN (subquery)" if negated else "IN (subquery)"
    if isinstance(x, exp.Tuple):
        raise UnsupportedError(f"{what} over several columns is not supported in a materialized view")
    if not is_correlated(query):
        right = b.typed(b.query(query))
        if len(right.columns) != 1:
            raise UnsupportedError(f"{what} must select exactly one column")
        return Predicate(right=right, pairs=[(x, right.columns[0].name)], anti=negated, null_aware=negated)
    select = _plain_select(query, what)
    if len(select.expressions) != 1:
        raise UnsupportedError(f"{what} must select exactly one column")
    corr = split_correlation(select, outer, what)
    if negated and corr.residual:
        raise UnsupportedError(
            "NOT IN (subquery) correlated by a condition other than equality is not supported in a "
            "materialized view; write it with NOT EXISTS"
        )
    y = select.expressions[0].unalias()
    predicate = _decorrelated(b, select, corr, extra=[("__in", y)], anti=negated)
    predicate.pairs.append((x, "__in"))
    predicate.null_aware = negated
    return predicate


def _plain_select(query: exp.Expression, what: str) -> exp.Select:
    if not isinstance(query, exp.Select):
        raise UnsupportedError(f"a correlated {what} over a set operation is not supported in a materialized view")
    if query.args.get("group") or query.args.get("having") or any(
        p.find(exp.AggFunc) for p in query.expressions
    ):
        raise UnsupportedError(
            f"a correlated {what} with GROUP BY, HAVING or aggregates is not supported in a materialized view"
        )
    return query


def _decorrelated(b: "Building", select: exp.Select, corr, extra, anti: bool) -> Predicate:  # noqa: ANN001
    """The subquery without its correlation, selecting the keys and what the residual reads."""
    local = local_aliases(select)
    outputs = [(f"__rk{i}", inner) for i, (inner, _) in enumerate(corr.pairs)] + list(extra)
    read = {(c.table, c.name) for r in corr.residual for c in r.find_all(exp.Column) if c.table in local}
    outputs += [(flat_name(t, name), column(name, t)) for t, name in sorted(read)]
    body = select.copy()
    body.set("expressions", [exp.alias_(e.copy(), name, quoted=True) for name, e in outputs])
    body.set("where", exp.Where(this=exp.and_(*corr.inner)) if corr.inner else None)
    body.set("distinct", None)

    def to_right(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table in local:
            return column(flat_name(node.table, node.name), RIGHT)
        return node

    return Predicate(
        right=b.typed(b.query(body)),
        pairs=[(outer_expr, f"__rk{i}") for i, (_, outer_expr) in enumerate(corr.pairs)],
        residual=[r.copy().transform(to_right) for r in corr.residual],
        anti=anti,
    )


# --- planning the joins --------------------------------------------------------


@dataclass
class _Keys:
    keys: list[tuple[str, str]] = field(default_factory=list)  # indexable (left column, right column)
    equalities: list[exp.Expression] = field(default_factory=list)  # compared by the residual


def apply(
    b: "Building", fc: FromClause, where: list[exp.Expression], predicates: list[Predicate],
    read_later: list[exp.Expression],
) -> None:
    """Filter everything in ``fc`` (and ``where``) by ``predicates``; ``fc`` becomes one input.

    The new input carries only the columns ``read_later`` (what the SELECT reads
    after its WHERE) and the predicates' residuals read: a column only ``where``
    reads is used up here. Carrying it would keep apart rows that differ only in
    it, as the -old/+new rows of a scalar subquery's change do (TPC-H q22's
    AVG): they cancel only once it is gone.
    """
    extra = [(f"__s{n}k{i}", outer) for n, p in enumerate(predicates) for i, (outer, _) in enumerate(p.pairs)]
    readers = [*read_later, *(r for p in predicates for r in p.residual)]
    only = {(c.table, c.name) for e in readers for c in e.find_all(exp.Column) if c.table}
    left = b.typed(fc.flatten(filters=where, extra=extra, only=only))
    left_types = {c.name: c.type for c in left.columns}
    left_casts: dict[str, str] = {}
    planned = []
    for n, p in enumerate(predicates):
        right_types = {c.name: c.type for c in p.right.columns}
        outputs: list[tuple[str, exp.Expression]] = []
        pairs: list[tuple[str, str, bool]] = []  # (left, right, indexable)
        for i, (_, right_col) in enumerate(p.pairs):
            lname, rname = f"__s{n}k{i}", f"__k{i}"
            value: exp.Expression = column(right_col, RIGHT_INPUT)
            t = key_type(b.describe, left_types[lname], right_types[right_col])
            if t is not None:
                if not comparable(left_types[lname], t):
                    left_casts[lname] = t
                if not comparable(right_types[right_col], t):
                    value = exp.cast(value, exp.DataType.build(t, dialect=DIALECT))
            outputs.append((rname, value))
            pairs.append((lname, rname, t is not None))
        read = {c.name for r in p.residual for c in r.find_all(exp.Column) if c.table == RIGHT}
        outputs += [(name, column(name, RIGHT_INPUT)) for name in sorted(read)]
        outputs = outputs or [("__one", exp.Literal.number(1))]  # only whether a row exists matters
        right = b.typed(SPJ(((RIGHT_INPUT, p.right),), None, tuple(outputs)))
        planned.append((p, right, pairs))
    if left_casts:
        left = b.typed(cast_outputs(left, left_casts))
    node: Node = left
    for p, right, pairs in planned:
        residual = [_left_refs(r, fc) for r in p.residual]
        if p.null_aware:
            node = _not_in(b, node, right, pairs, residual, p.origin)
        else:
            node = _semi(b, node, right, pairs, residual, p.anti, p.origin)
    fc.wrap(node, b.fresh("__sj"))


def _left_refs(expression: exp.Expression, fc: FromClause) -> exp.Expression:
    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table in fc.columns:
            return column(flat_name(node.table, node.name), LEFT)
        return node

    return expression.copy().transform(swap)


def _split(pairs: list[tuple[str, str, bool]]) -> _Keys:
    out = _Keys()
    for lname, rname, indexable in pairs:
        if indexable:
            out.keys.append((lname, rname))
        else:
            out.equalities.append(exp.EQ(this=column(lname, LEFT), expression=column(rname, RIGHT)))
    return out


def _semi(b: "Building", left: Node, right: Node, pairs, residual, anti: bool, origin: str) -> Node:  # noqa: ANN001
    k = _split(pairs)
    condition = residual + k.equalities
    return b.typed(SemiJoin(left, right, tuple(k.keys), exp.and_(*condition) if condition else None, anti,
                            origin=origin))


def _filtered(node: Node, name: str, is_null: bool) -> SPJ:
    test: exp.Expression = exp.Is(this=column(name, "__n"), expression=exp.null())
    if not is_null:
        test = exp.Not(this=test)
    return SPJ((("__n", node),), test, tuple((c, column(c, "__n")) for c in node.column_names))


def _not_in(b: "Building", left: Node, right: Node, pairs, residual, origin: str) -> Node:  # noqa: ANN001
    """x NOT IN (S) with SQL's NULL semantics, as anti joins (see the module docstring)."""
    *correlation, (x, y, _) = pairs
    x_never_null, y_never_null = never_null(left, x), never_null(right, y)
    if x_never_null and y_never_null:  # no NULL on either side: a plain anti join
        return _semi(b, left, right, pairs, residual, True, f"{origin}: values not in the subquery (never NULL)")
    present = left if x_never_null else b.typed(_filtered(left, x, is_null=False))
    present = _semi(b, present, right, pairs, residual, True, f"{origin}: non-NULL values not in the subquery")
    if not y_never_null:
        nulls = b.typed(_filtered(right, y, is_null=True))
        present = _semi(b, present, nulls, correlation, residual, True, f"{origin}: ... which holds no NULL")
    if x_never_null:
        return present
    missing = _semi(b, b.typed(_filtered(left, x, is_null=True)), right, correlation, residual, True,
                    f"{origin}: NULL values, kept while the subquery is empty")
    return b.typed(UnionAll((present, missing)))
