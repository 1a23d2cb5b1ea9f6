"""Build plan nodes from resolved (qualified, CTE-free) SELECT trees.

One SELECT block is planned in this order, each step its own module:

    FROM and JOINs      inner joins collect SPJ inputs; outer joins compose
                        the inner join with padded anti joins (outer_joins)
    scalar subqueries   joined as (grouped) aggregates (scalars)
    EXISTS / IN / …     semi and anti joins over everything so far (predicates)
    GROUP BY / HAVING   an Aggregate and the SPJ over it
    SELECT DISTINCT     a Distinct on top

Set operations become UnionAll (+ Distinct for UNION) and SetOp nodes;
ORDER BY … LIMIT a TopK (top_k), window functions a Window (windows), and
WITH RECURSIVE a Recursive node (recursion).
"""

from __future__ import annotations

import itertools
from typing import Callable

from sqlglot import exp

from sql_frontend.building import CatalogReader
from sql_frontend.correlation import conjuncts
from sql_frontend.errors import BindError, UnsupportedError
from sql_frontend.nulls import rejected_aliases
from sql_frontend.outer_joins import outer_join
from sql_frontend.plan import SPJ, AggCall, Aggregate, Column, Distinct, Node, Session, SetOp, Source, UnionAll
from sql_frontend.plan_sql import column
from sql_frontend.predicates import Predicate, apply, from_conjunct, from_join, is_predicate
from sql_frontend.recursion import is_recursive, plan_recursive
from sql_frontend.scalars import Hoisted, hoist, inside_aggregate
from sql_frontend.scope import FromClause, needed_columns
from sql_frontend.session_windows import session_call
from sql_frontend.statements import DIALECT, normalize_name
from sql_frontend.top_k import has_limit, plan_top_k
from sql_frontend.windows import has_windows, plan_windows

AGG_ALIAS = "__agg"


class Builder:
    """Builds plan nodes; ``typed`` fills in a subtree's column types on the way."""

    def __init__(self, catalog: CatalogReader, infer: Callable[[Node, Callable], None]):
        self.catalog = catalog
        self._infer = infer
        self._sources: dict[str, Source] = {}
        self._names = itertools.count()
        self.bound: dict[str, Node] = {}  # names planned as a node (recursive CTEs), see recursion.py
        self.recursions: dict[str, Node] = {}

    def describe(self, sql: str) -> tuple[Column, ...]:
        return self.catalog.describe(sql)

    def typed(self, node: Node) -> Node:
        self._infer(node, self.catalog.describe)
        return node

    def fresh(self, prefix: str) -> str:
        """A new alias for a node the planner adds (users cannot write names starting with __)."""
        return f"{prefix}{next(self._names)}"

    def query(self, q: exp.Expression) -> Node:
        if isinstance(q, exp.Subquery):
            return self.query(q.this)
        if has_limit(q):
            return plan_top_k(self, q)
        if isinstance(q, exp.Union):
            parts = [self.query(q.this), self.query(q.expression)]
            union = UnionAll(inputs=tuple(_flatten_unions(parts)))
            return Distinct(union) if q.args.get("distinct") else union
        if isinstance(q, (exp.Except, exp.Intersect)):
            kind = "except" if isinstance(q, exp.Except) else "intersect"
            return SetOp(kind, not q.args.get("distinct"), self.query(q.this), self.query(q.expression))
        if isinstance(q, exp.Select):
            return self.select(q)
        raise UnsupportedError(f"{type(q).__name__.upper()} as a view body")

    def source(self, name: str) -> Source:
        if name not in self._sources:
            self._sources[name] = Source(
                relation=name,
                kind=self.catalog.relation_kind(name),
                columns=self.catalog.relation_columns(name),
                key=self.catalog.relation_key(name),
                not_null=self.catalog.relation_not_null(name),
                complete=self.catalog.relation_complete(name),
            )
        return self._sources[name]

    # --- one SELECT block ------------------------------------------------------
    def select(self, sel: exp.Select) -> Node:
        if is_recursive(sel):
            return plan_recursive(self, sel)
        if has_windows(sel):
            return plan_windows(self, sel)
        from_ = sel.args.get("from_")
        if from_ is None:
            raise UnsupportedError("SELECT without FROM is not supported in a materialized view")
        where = sel.args.get("where")
        where_conjuncts = conjuncts(where.this if where is not None else None)
        fc = FromClause(needed=needed_columns(sel))
        predicates: list[Predicate] = []
        self._add_item(fc, from_.this)
        for join in sel.args.get("joins") or []:
            self._join(fc, join, rejected_aliases(where.this if where is not None else None), predicates)

        plain = [c for c in where_conjuncts if not is_predicate(c)]
        subqueries = [c for c in where_conjuncts if is_predicate(c)]
        aggregate = _is_aggregate(sel)
        hoisted: list[Hoisted] = []
        outer = set(fc.aliases)
        plain = [hoist(self, c, outer, hoisted) for c in plain]
        within = inside_aggregate if aggregate else (lambda s: True)
        projections = [hoist(self, p, outer, hoisted, within) for p in sel.expressions]
        having = sel.args.get("having")
        having_expr = hoist(self, having.this, outer, hoisted, within) if having is not None else None
        _reject_nested_predicates(plain + projections + ([having_expr] if having_expr is not None else []))
        self._join_hoisted(fc, hoisted, plain)
        predicates += [from_conjunct(self, c, set(fc.aliases)) for c in subqueries]
        if predicates:
            after_where = sel.copy()
            after_where.set("where", None)
            read_later = [after_where, *projections, *([having_expr] if having_expr is not None else [])]
            apply(self, fc, plain, predicates, read_later)
            plain = []

        if aggregate:
            node = self._aggregate(sel, fc, projections, having_expr, plain)
        else:
            predicate = fc.conjuncts + [fc.map(c) for c in plain]
            outputs = tuple((p.alias_or_name, fc.map(p.unalias())) for p in projections)
            node = SPJ(inputs=tuple(fc.inputs), predicate=exp.and_(*predicate) if predicate else None, outputs=outputs)
        if sel.args.get("distinct"):
            node = Distinct(node)
        return node

    def _add_item(self, fc: FromClause, source: exp.Expression) -> None:
        alias, node = self._item(source)
        fc.add(alias, node)

    def _item(self, source: exp.Expression) -> tuple[str, Node]:
        if isinstance(source, exp.Table):
            relation = normalize_name(source.this)
            return source.alias_or_name, self.bound[relation] if relation in self.bound else self.source(relation)
        if isinstance(source, exp.Subquery):
            session = session_call(source)
            if session is not None:  # an expanded SESSION(…): a node of its own, not its batch SQL
                table, keys, time, gap_us = session
                return source.alias, self.typed(Session(self.source(table), keys, time, gap_us))
            return source.alias, self.typed(self.query(source.this))
        raise UnsupportedError(f"{type(source).__name__.upper()} in FROM")

    def _join(self, fc: FromClause, join: exp.Join, rejected: set[str], predicates: list[Predicate]) -> None:
        if join.args.get("using"):
            raise UnsupportedError("JOIN ... USING could not be resolved; use ON")
        on = join.args.get("on")
        side = (join.args.get("side") or "").lower()
        kind = (join.args.get("kind") or "").upper()
        if kind in ("SEMI", "ANTI"):
            if side not in ("", "left"):
                raise UnsupportedError(f"{side.upper()} {kind} JOIN is not supported in a materialized view")
            predicates.append(from_join(self, join.this, on, set(fc.aliases), anti=kind == "ANTI"))
            return
        if predicates and side in ("right", "full"):
            raise UnsupportedError(f"{side.upper()} OUTER JOIN after a SEMI or ANTI JOIN is not supported")
        alias, node = self._item(join.this)
        if side:
            side = _simplify(side, alias, set(fc.aliases), rejected)
        if side:
            outer_join(self, fc, alias, node, on, side)
            return
        fc.add(alias, node)
        if on is not None:
            if on.find(exp.Subquery, exp.Exists) is not None:
                raise UnsupportedError("a subquery in a JOIN ... ON condition is not supported; move it to WHERE")
            fc.conjuncts.extend(fc.map(c) for c in conjuncts(on))

    def _join_hoisted(self, fc: FromClause, hoisted: list[Hoisted], where: list[exp.Expression]) -> None:
        """Join the nodes of scalar subqueries: one row each, or one row per correlation key."""
        rejected = rejected_aliases(exp.and_(*where) if where else None)
        for h in hoisted:
            fc.needed[h.alias] = set(h.node.column_names)
            on = [exp.EQ(this=outer.copy(), expression=column(name, h.alias)) for outer, name in h.pairs]
            if h.pairs and h.alias not in rejected:
                outer_join(self, fc, h.alias, h.node, exp.and_(*on), "left")
                continue
            fc.add(h.alias, h.node)
            fc.conjuncts.extend(fc.map(c) for c in on)

    def _aggregate(
        self, sel: exp.Select, fc: FromClause, projections: list[exp.Expression],
        having_expr: exp.Expression | None, where: list[exp.Expression],
    ) -> Node:
        group = sel.args.get("group")
        if group is not None and group.find(exp.Subquery) is not None:
            raise UnsupportedError("a subquery in GROUP BY is not supported in a materialized view")
        group_exprs = [fc.map(g) for g in (group.expressions if group is not None else [])]
        post: list[Hoisted] = []
        outer = set(fc.aliases)
        projections = [hoist(self, p, outer, post, correlated=False) for p in projections]
        if having_expr is not None:
            having_expr = hoist(self, having_expr, outer, post, correlated=False)
        projections = [fc.map(p) for p in projections]
        having_expr = fc.map(having_expr) if having_expr is not None else None

        inner_outputs: list[tuple[str, exp.Expression]] = []
        used: set[str] = set()
        keys: list[str] = []
        for i, g in enumerate(group_exprs):
            name = _unique(g.name if isinstance(g, exp.Column) and "." not in g.name else f"k{i}", used)
            keys.append(name)
            inner_outputs.append((name, g))

        calls: list[AggCall] = []
        call_of: dict[exp.Expression, str] = {}
        holders = list(projections) + ([having_expr] if having_expr is not None else [])
        for holder in holders:
            for node in holder.find_all(exp.AggFunc):
                if node.find_ancestor(exp.AggFunc) is not None:
                    raise BindError("aggregate functions cannot be nested")
                call_node = node.parent if isinstance(node.parent, exp.Filter) else node
                if call_node in call_of:
                    continue
                func, arg, distinct = _decompose(call_node)
                name = _unique(f"agg{len(calls)}", used)
                arg_name = None
                if arg is not None:
                    arg_name = _unique(f"arg{len(calls)}", used)
                    inner_outputs.append((arg_name, arg))
                calls.append(AggCall(name=name, func=func, arg=arg_name, distinct=distinct))
                call_of[call_node] = name

        if not inner_outputs:
            # COUNT(*) with no GROUP BY reads no column, but a SELECT needs one (and a row per input row).
            inner_outputs.append((_unique("unit", used), exp.Literal.number(1)))
        predicate = fc.conjuncts + [fc.map(c) for c in where]
        inner = SPJ(inputs=tuple(fc.inputs), predicate=exp.and_(*predicate) if predicate else None,
                    outputs=tuple(inner_outputs))
        agg = Aggregate(input=inner, keys=tuple(keys), aggregates=tuple(calls))
        replacements = {**call_of, **{g: k for g, k in zip(group_exprs, keys)}}
        allowed = {AGG_ALIAS} | {h.alias for h in post}

        def rewrite(expression: exp.Expression) -> exp.Expression:
            def swap(node: exp.Expression) -> exp.Expression:
                name = replacements.get(node)
                if name is not None:
                    return column(name, AGG_ALIAS)
                return node

            out = expression.copy().transform(swap)
            for col in out.find_all(exp.Column):
                if col.table not in allowed:
                    raise BindError(
                        f"column {col.sql(DIALECT)} must appear in GROUP BY or be used in an aggregate"
                    )
            return out

        outputs = tuple((p.alias_or_name, rewrite(p.unalias())) for p in projections)
        having_pred = rewrite(having_expr) if having_expr is not None else None
        inputs = ((AGG_ALIAS, agg),) + tuple((h.alias, h.node) for h in post)
        return SPJ(inputs=inputs, predicate=having_pred, outputs=outputs)


def _reject_nested_predicates(expressions: list[exp.Expression]) -> None:
    """EXISTS / IN (subquery) are filters of WHERE: anywhere else they would need a value."""
    for expression in expressions:
        for node in expression.find_all(exp.Exists, exp.In):
            if isinstance(node, exp.In) and node.args.get("query") is None:
                continue
            what = "EXISTS" if isinstance(node, exp.Exists) else "IN (subquery)"
            raise UnsupportedError(
                f"{what} is supported in a materialized view only as a condition of WHERE (alone or "
                f"negated, combined with AND), not inside another expression: {expression.sql(DIALECT)}"
            )


def _simplify(side: str, alias: str, left: set[str], rejected: set[str]) -> str:
    """The join after dropping padded rows the WHERE clause rejects anyway ("" = inner)."""
    pad_right = side in ("left", "full") and alias not in rejected  # unmatched left rows survive
    pad_left = side in ("right", "full") and not (left & rejected)
    if pad_right and pad_left:
        return "full"
    return "left" if pad_right else "right" if pad_left else ""


def _flatten_unions(parts: list[Node]) -> list[Node]:
    flat: list[Node] = []
    for part in parts:
        if isinstance(part, UnionAll):
            flat.extend(part.inputs)
        else:
            flat.append(part)
    return flat


def _is_aggregate(sel: exp.Select) -> bool:
    if sel.args.get("group") is not None or sel.args.get("having") is not None:
        return True
    return any(_own_aggregate(p) for p in sel.expressions)


def _own_aggregate(expression: exp.Expression) -> bool:
    """An aggregate call of this SELECT (not one inside a subquery)."""
    for call in expression.find_all(exp.AggFunc):
        node = call
        while node is not expression:
            node = node.parent
            if isinstance(node, (exp.Subquery, exp.Select)):
                break
        else:
            return True
    return False


def unique_name(name: str, used: set[str]) -> str:
    candidate = name
    for i in itertools.count(1):
        if candidate not in used:
            used.add(candidate)
            return candidate
        candidate = f"{name}_{i}"
    raise AssertionError("unreachable")


_unique = unique_name


def _decompose(call: exp.Expression) -> tuple[str, exp.Expression | None, bool]:
    """(func, argument expression, distinct) of a supported aggregate call.

    ``agg(x) FILTER (WHERE c)`` becomes ``agg(CASE WHEN c THEN x END)``: every
    supported aggregate ignores NULL arguments, so the two agree.
    """
    condition = None
    if isinstance(call, exp.Filter):
        condition = call.expression.this
        call = call.this
    inner = call.this
    distinct = isinstance(inner, exp.Distinct)
    if distinct:
        inner = inner.expressions[0]
    if isinstance(call, exp.Count) and isinstance(inner, exp.Star):
        if condition is None:
            return "count_star", None, False
        return "count", exp.Case(ifs=[exp.If(this=condition, true=exp.Literal.number(1))]), False
    func = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}[
        type(call)
    ]
    arg = inner.copy()
    if condition is not None:
        arg = exp.Case(ifs=[exp.If(this=condition.copy(), true=arg)])
    return func, arg, distinct
