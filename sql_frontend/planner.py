"""Turn a view body into a logical plan.

The pipeline, each step a small function:

    check_supported  -> reject constructs we cannot maintain, by name
    bind             -> DuckDB's binder checks names/types and gives the output schema
    resolve          -> qualify columns, expand *, inline CTEs
    build            -> SELECT blocks become Source/SPJ/Aggregate/Distinct/UnionAll
    merge_spj        -> flatten SPJ-over-SPJ so joins see all their inputs
    infer_types      -> every node's column types, from DuckDB's binder
    name_outputs     -> the root carries exactly the view's column names and types
"""

from __future__ import annotations

import itertools
from typing import Callable, Protocol, Sequence

from sqlglot import exp

from sql_frontend.errors import BindError, UnsupportedError
from sql_frontend.plan import (
    SPJ,
    AggCall,
    Aggregate,
    Column,
    Distinct,
    Node,
    Recursive,
    RecursiveRef,
    Source,
    TopK,
    UnionAll,
    ViewPlan,
    Window,
    sources,
    walk,
    with_children,
)
from sql_frontend.plan_sql import column, render, to_sql
from sql_frontend.resolve import check_relations, resolve
from sql_frontend.statements import DIALECT, normalize_name
from sql_frontend.recursion import check_recursion, is_recursive, plan_recursive
from sql_frontend.supported import check_supported
from sql_frontend.top_k import has_limit, plan_top_k
from sql_frontend.windows import has_windows, plan_windows

AGG_ALIAS = "__agg"


class CatalogReader(Protocol):
    """What the planner needs from the catalog."""

    def relation_columns(self, name: str) -> tuple[Column, ...]: ...

    def relation_kind(self, name: str) -> str: ...

    def schema(self) -> dict[str, dict[str, str]]: ...

    def describe(self, sql: str) -> tuple[Column, ...]: ...

    def aggregate_names(self) -> frozenset[str]: ...


def plan_view(
    query: exp.Expression, catalog: CatalogReader, column_names: Sequence[str] | None = None
) -> ViewPlan:
    """Plan a materialized view body; raise a named error for anything unsupported."""
    check_supported(query, catalog.aggregate_names())
    query = drop_order_by(query)
    schema = catalog.schema()
    check_relations(query, schema)
    output = catalog.describe(render(query))
    names = _output_names(output, column_names)
    resolved = resolve(query, schema)
    root = Builder(catalog).query(resolved)
    root = merge_spj(root)
    check_recursion(root)
    infer_types(root, catalog.describe)
    root = name_outputs(root, names, [c.type for c in output])
    columns = tuple(Column(n, c.type) for n, c in zip(names, output))
    relations = tuple(dict.fromkeys(s.relation for s in sources(root)))
    return ViewPlan(root=root, columns=columns, sources=relations)


def drop_order_by(query: exp.Expression) -> exp.Expression:
    """Remove ORDER BY clauses that have no LIMIT: a view is an unordered set of rows.

    (With a LIMIT or OFFSET, ORDER BY decides which rows are in the view: it
    becomes a TopK node.)
    """
    query = query.copy()
    for order in list(query.find_all(exp.Order)):
        holder = order.parent
        if isinstance(holder, (exp.Select, exp.SetOperation)) and not has_limit(holder):
            order.pop()
    return query


def _output_names(output: Sequence[Column], given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if len(given) != len(output):
            raise BindError(
                f"the view names {len(given)} columns but its SELECT returns {len(output)}"
            )
        names = list(given)
    else:
        names = [c.name for c in output]
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            raise BindError(
                f'column "{name}" appears more than once in the view; give the columns distinct aliases'
            )
        if name.startswith("__"):
            raise BindError(f'column name "{name}" is reserved (names starting with __)')
        seen.add(name.lower())
    return names


class Builder:
    """Builds plan nodes from resolved (qualified, CTE-free) SELECT trees."""

    def __init__(self, catalog: CatalogReader):
        self.catalog = catalog
        self._sources: dict[str, Source] = {}
        self.bound: dict[str, Node] = {}  # names planned as a node (recursive CTEs), see recursion.py
        self.recursions: dict[str, Node] = {}

    def query(self, q: exp.Expression) -> Node:
        if isinstance(q, exp.Subquery):
            return self.query(q.this)
        if has_limit(q):
            return plan_top_k(self, q)
        if isinstance(q, exp.Union):
            parts = [self.query(q.this), self.query(q.expression)]
            union = UnionAll(inputs=tuple(_flatten_unions(parts)))
            return Distinct(union) if q.args.get("distinct") else union
        if isinstance(q, exp.Select):
            return self.select(q)
        raise UnsupportedError(f"{type(q).__name__.upper()} as a view body")

    def source(self, name: str) -> Source:
        if name not in self._sources:
            self._sources[name] = Source(
                relation=name,
                kind=self.catalog.relation_kind(name),
                columns=self.catalog.relation_columns(name),
            )
        return self._sources[name]

    def select(self, sel: exp.Select) -> Node:
        if is_recursive(sel):
            return plan_recursive(self, sel)
        if has_windows(sel):
            return plan_windows(self, sel)
        from_ = sel.args.get("from_")
        if from_ is None:
            raise UnsupportedError("SELECT without FROM is not supported in a materialized view")
        inputs: list[tuple[str, Node]] = []
        conjuncts: list[exp.Expression] = []
        self._add_input(from_.this, inputs)
        for join in sel.args.get("joins") or []:
            self._add_input(join.this, inputs)
            if join.args.get("using"):
                raise UnsupportedError("JOIN ... USING could not be resolved; use ON")
            if join.args.get("on") is not None:
                conjuncts.extend(_conjuncts(join.args["on"]))
        where = sel.args.get("where")
        if where is not None:
            conjuncts.extend(_conjuncts(where.this))
        predicate = exp.and_(*conjuncts) if conjuncts else None

        if _is_aggregate(sel):
            node = self._aggregate(sel, tuple(inputs), predicate)
        else:
            outputs = tuple((p.alias_or_name, p.unalias()) for p in sel.expressions)
            node = SPJ(inputs=tuple(inputs), predicate=predicate, outputs=outputs)
        if sel.args.get("distinct"):
            node = Distinct(node)
        return node

    def _add_input(self, source: exp.Expression, inputs: list[tuple[str, Node]]) -> None:
        if isinstance(source, exp.Table):
            relation = normalize_name(source.this)
            node: Node = self.bound[relation] if relation in self.bound else self.source(relation)
            name = source.alias_or_name
        elif isinstance(source, exp.Subquery):
            node = self.query(source.this)
            name = source.alias
        else:
            raise UnsupportedError(f"{type(source).__name__.upper()} in FROM")
        if any(existing == name for existing, _ in inputs):
            raise BindError(f'table alias "{name}" is used twice in one FROM clause')
        inputs.append((name, node))

    def _aggregate(
        self, sel: exp.Select, inputs: tuple[tuple[str, Node], ...], predicate: exp.Expression | None
    ) -> Node:
        group = sel.args.get("group")
        group_exprs = list(group.expressions) if group is not None else []
        having = sel.args.get("having")
        having_expr = having.this if having is not None else None

        inner_outputs: list[tuple[str, exp.Expression]] = []
        used: set[str] = set()
        keys: list[str] = []
        for i, g in enumerate(group_exprs):
            name = _unique(g.name if isinstance(g, exp.Column) else f"k{i}", used)
            keys.append(name)
            inner_outputs.append((name, g))

        calls: list[AggCall] = []
        call_of: dict[exp.Expression, str] = {}
        holders = list(sel.expressions) + ([having_expr] if having_expr is not None else [])
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

        inner = SPJ(inputs=inputs, predicate=predicate, outputs=tuple(inner_outputs))
        agg = Aggregate(input=inner, keys=tuple(keys), aggregates=tuple(calls))

        replacements = {**call_of, **{g: k for g, k in zip(group_exprs, keys)}}

        def rewrite(expression: exp.Expression) -> exp.Expression:
            def swap(node: exp.Expression) -> exp.Expression:
                name = replacements.get(node)
                if name is not None:
                    return column(name, AGG_ALIAS)
                return node

            out = expression.copy().transform(swap)
            for col in out.find_all(exp.Column):
                if col.table != AGG_ALIAS:
                    raise BindError(
                        f"column {col.sql(DIALECT)} must appear in GROUP BY or be used in an aggregate"
                    )
            return out

        outputs = tuple((p.alias_or_name, rewrite(p.unalias())) for p in sel.expressions)
        having_pred = rewrite(having_expr) if having_expr is not None else None
        return SPJ(inputs=((AGG_ALIAS, agg),), predicate=having_pred, outputs=outputs)


def _flatten_unions(parts: list[Node]) -> list[Node]:
    flat: list[Node] = []
    for part in parts:
        if isinstance(part, UnionAll):
            flat.extend(part.inputs)
        else:
            flat.append(part)
    return flat


def _conjuncts(predicate: exp.Expression) -> list[exp.Expression]:
    if isinstance(predicate, exp.Paren):
        return _conjuncts(predicate.this)
    if isinstance(predicate, exp.And):
        return _conjuncts(predicate.this) + _conjuncts(predicate.expression)
    return [predicate]


def _is_aggregate(sel: exp.Select) -> bool:
    if sel.args.get("group") is not None or sel.args.get("having") is not None:
        return True
    return any(p.find(exp.AggFunc) is not None for p in sel.expressions)


def _unique(name: str, used: set[str]) -> str:
    candidate = name
    for i in itertools.count(1):
        if candidate not in used:
            used.add(candidate)
            return candidate
        candidate = f"{name}_{i}"
    raise AssertionError("unreachable")


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


def merge_spj(root: Node) -> Node:
    """Flatten an SPJ reading another SPJ into one SPJ over both sets of inputs.

    Joins then see every base input at once, so each can be reached by an index
    lookup; it is sound because filter/project/inner-join compose freely.
    """
    memo: dict[int, Node] = {}

    def visit(node: Node) -> Node:
        if id(node) in memo:
            return memo[id(node)]
        result: Node
        if isinstance(node, SPJ):
            result = _merge_into(
                SPJ(
                    inputs=tuple((a, visit(c)) for a, c in node.inputs),
                    predicate=node.predicate,
                    outputs=node.outputs,
                )
            )
        elif isinstance(node, Aggregate):
            result = Aggregate(visit(node.input), node.keys, node.aggregates)
        elif isinstance(node, Distinct):
            result = Distinct(visit(node.input))
        elif isinstance(node, UnionAll):
            result = UnionAll(tuple(visit(c) for c in node.inputs))
        elif isinstance(node, (Window, TopK, Recursive)):
            result = with_children(node, visit)
        else:
            result = node
        memo[id(node)] = result
        return result

    return visit(root)


def _merge_into(parent: SPJ) -> SPJ:
    if not any(isinstance(c, SPJ) for _, c in parent.inputs):
        return parent
    used = {a for a, c in parent.inputs if not isinstance(c, SPJ)}
    inputs: list[tuple[str, Node]] = []
    substitutions: dict[tuple[str, str], exp.Expression] = {}
    conjuncts: list[exp.Expression] = []
    for alias_name, child in parent.inputs:
        if not isinstance(child, SPJ):
            inputs.append((alias_name, child))
            continue
        renames = {}
        for inner_alias, inner_node in child.inputs:
            new_alias = _unique(f"{alias_name}_{inner_alias}" if inner_alias in used else inner_alias, used)
            renames[inner_alias] = new_alias
            inputs.append((new_alias, inner_node))
        rename = _alias_renamer(renames)
        for out_name, out_expr in child.outputs:
            substitutions[(alias_name, out_name)] = rename(out_expr)
        if child.predicate is not None:
            conjuncts.append(rename(child.predicate))

    def substitute(expression: exp.Expression) -> exp.Expression:
        def swap(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column):
                replacement = substitutions.get((node.table, node.name))
                if replacement is not None:
                    return replacement.copy()
            return node

        return expression.copy().transform(swap)

    if parent.predicate is not None:
        conjuncts.append(substitute(parent.predicate))
    flat = [c for conj in conjuncts for c in _conjuncts(conj)]
    return SPJ(
        inputs=tuple(inputs),
        predicate=exp.and_(*flat) if flat else None,
        outputs=tuple((n, substitute(e)) for n, e in parent.outputs),
    )


def _alias_renamer(renames: dict[str, str]) -> Callable[[exp.Expression], exp.Expression]:
    def rename(expression: exp.Expression) -> exp.Expression:
        out = expression.copy()
        for col in out.find_all(exp.Column):
            if col.table in renames:
                col.set("table", exp.to_identifier(renames[col.table], quoted=True))
        return out

    return rename


def infer_types(root: Node, describe: Callable[[str], tuple[Column, ...]]) -> None:
    """Fill in ``columns`` of every derived node from DuckDB's binder."""
    for node in walk(root):
        if isinstance(node, (Source, RecursiveRef)):
            continue  # typed when built
        described = describe(render(to_sql(node)))
        if isinstance(node, SPJ):
            names = [n for n, _ in node.outputs]
        elif isinstance(node, Window):
            names = list(node.input.column_names) + [n for n, _ in node.calls]
        elif isinstance(node, Recursive):
            names = [c.name for c in node.columns]
        elif isinstance(node, Aggregate):
            names = list(node.keys) + [c.name for c in node.aggregates]
            types = {c.name: c.type for c in described}
            node.aggregates = tuple(
                AggCall(c.name, c.func, c.arg, c.distinct, types[c.name]) for c in node.aggregates
            )
        else:
            names = [c.name for c in node.children()[0].columns]
        node.columns = tuple(Column(n, c.type) for n, c in zip(names, described))


def name_outputs(root: Node, names: Sequence[str], types: Sequence[str]) -> Node:
    """Give the root exactly the view's column names (and types, by cast if needed)."""
    current = root.columns
    if [c.name for c in current] == list(names) and [c.type for c in current] == list(types):
        return root

    def output(i: int, expression: exp.Expression) -> exp.Expression:
        if current[i].type != types[i]:
            return exp.cast(expression, exp.DataType.build(types[i], dialect=DIALECT))
        return expression

    if isinstance(root, SPJ):
        outputs = tuple((names[i], output(i, e)) for i, (_, e) in enumerate(root.outputs))
        node = SPJ(root.inputs, root.predicate, outputs)
    else:
        outputs = tuple(
            (names[i], output(i, column(c.name, "__root"))) for i, c in enumerate(current)
        )
        node = SPJ((("__root", root),), None, outputs)
    node.columns = tuple(Column(n, t) for n, t in zip(names, types))
    return node
