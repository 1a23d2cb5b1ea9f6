"""Turn a view body into a logical plan.

The pipeline, each step a small function:

    expand_time_windows -> TUMBLE/HOP in FROM become derived tables (time_windows.py)
    expand_asof_joins -> ASOF JOIN becomes a join and a NOT EXISTS (asof_join.py)
    check_supported     -> reject constructs we cannot maintain, by name
    bind                -> DuckDB's binder checks names/types and gives the output schema
    integer_sum_types   -> a SUM of integers is a BIGINT column, not a HUGEINT (integer_sums.py)
    resolve             -> qualify columns, expand *, inline CTEs
    factor_disjunctions -> pull conditions shared by every branch of an OR out of it
    imply_per_table     -> beside an OR, add what it implies about each table alone
    build               -> SELECT blocks become plan nodes (sql_frontend.builder)
    merge_spj           -> flatten SPJ-over-SPJ so joins see all their inputs
    infer_types         -> every node's column types, from DuckDB's binder
    name_outputs        -> the root carries exactly the view's column names and types
"""

from __future__ import annotations

from typing import Callable, Sequence

from sqlglot import exp

from sql_frontend.builder import Builder, CatalogReader, unique_name
from sql_frontend.correlation import conjuncts as conjuncts_of
from sql_frontend.errors import BindError
from sql_frontend.factor_or import factor_disjunctions
from sql_frontend.integer_sums import integer_sum_types
from sql_frontend.or_per_table import imply_per_table
from sql_frontend.plan import (
    SPJ,
    AggCall,
    Aggregate,
    Column,
    Node,
    Recursive,
    RecursiveRef,
    Session,
    Source,
    ViewPlan,
    Window,
    sources,
    walk,
    with_children,
)
from sql_frontend.asof_join import expand_asof_joins
from sql_frontend.plan_sql import column, render, to_sql
from sql_frontend.recursion import check_recursion
from sql_frontend.resolve import check_relations, resolve
from sql_frontend.statements import DIALECT
from sql_frontend.supported import check_supported
from sql_frontend.time_windows import expand_time_windows
from sql_frontend.top_k import has_limit


def plan_view(
    query: exp.Expression, catalog: CatalogReader, column_names: Sequence[str] | None = None,
    column_types: Sequence[str] | None = None, *, bigint_sums: bool = True,
) -> ViewPlan:
    """Plan a materialized view body; raise a named error for anything unsupported.

    ``column_types`` freezes the view's column types (those it was created with,
    as PostgreSQL freezes a view's columns); without them the types are
    DuckDB's, with integer sums as BIGINT unless ``bigint_sums`` is False (views
    stored before that rule existed).
    """
    query = expand_asof_joins(expand_time_windows(query, catalog.schema()))
    check_supported(query, catalog.aggregate_names())
    query = drop_order_by(query)
    schema = catalog.schema()
    check_relations(query, schema)
    output = catalog.describe(render(query))
    names = _output_names(output, column_names)
    if column_types is not None:
        if len(column_types) != len(output):
            raise BindError(f"the view was created with {len(column_types)} columns but its SELECT now returns "
                            f"{len(output)}")
        output = tuple(Column(c.name, t) for c, t in zip(output, column_types))
    elif bigint_sums:
        types = integer_sum_types(query, [c.type for c in output],
                                  lambda q: [c.type for c in catalog.describe(render(q))])
        output = tuple(Column(c.name, t) for c, t in zip(output, types))
    resolved = imply_per_table(factor_disjunctions(resolve(query, schema)))
    root = Builder(catalog, infer_types).query(resolved)
    root = merge_spj(root)
    check_recursion(root)
    infer_types(root, catalog.describe)
    root = name_outputs(root, names, [c.type for c in output])
    columns = tuple(Column(n, c.type) for n, c in zip(names, output))
    relations = tuple(dict.fromkeys(s.relation for s in sources(root)))
    return ViewPlan(root=root, columns=columns, sources=relations, query=query)


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


def merge_spj(root: Node) -> Node:
    """Flatten an SPJ reading another SPJ into one SPJ over both sets of inputs.

    Joins then see every base input at once, so each can be reached by an index
    lookup; it is sound because filter/project/inner-join compose freely.
    """
    memo: dict[int, Node] = {}

    def visit(node: Node) -> Node:
        if id(node) in memo:
            return memo[id(node)]
        result: Node = with_children(node, tuple(visit(c) for c in node.children()))
        if isinstance(result, SPJ):
            result = merge_into(result)
        memo[id(node)] = result
        return result

    return visit(root)


def merge_into(parent: SPJ) -> SPJ:
    """``parent`` reading the inputs of its SPJ inputs directly (one level)."""
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
            new_alias = unique_name(f"{alias_name}_{inner_alias}" if inner_alias in used else inner_alias, used)
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
    flat = [c for conj in conjuncts for c in conjuncts_of(conj)]
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
        elif isinstance(node, Session):
            names = list(node.input.column_names) + ["window_start", "window_end"]
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
