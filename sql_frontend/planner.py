"""Turn a view body into a logical plan: a pipeline of rules, run in order (``RULES``).

Each rule is a small function of the planning state (``Planning``): the
query rules rewrite or check the SELECT, the plan rules build and rewrite
plan nodes. As in sqlglot's optimizer, the order is data, read in one place:

    expand_windows      -> TUMBLE/HOP in FROM become derived tables (time_windows.py)
    expand_asof         -> ASOF JOIN becomes a join and a NOT EXISTS (asof_join.py)
    check_constructs    -> reject constructs we cannot maintain, by name (supported.py)
    drop_order          -> ORDER BY without LIMIT goes: a view is an unordered set of rows
    check_names         -> every relation read exists (resolve.py)
    bind                -> DuckDB's binder checks names/types and gives the output schema
    integer_sums        -> a SUM of integers is a BIGINT column, not a HUGEINT (integer_sums.py)
    resolve_columns     -> qualify columns, expand *, inline CTEs
    factor_ors          -> pull conditions shared by every branch of an OR out of it
    imply_per_table_conditions -> beside an OR, add what it implies about each table alone
    build               -> SELECT blocks become plan nodes (sql_frontend.builder)
    merge_nested_spj    -> flatten SPJ-over-SPJ so joins see all their inputs
    check_recursive     -> a WITH RECURSIVE is one the delta rules can maintain (recursion.py)
    infer_node_types    -> every node's column types, from DuckDB's binder
    name_root           -> the root carries exactly the view's column names and types
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from sqlglot import exp

from sql_frontend.builder import Builder, unique_name
from sql_frontend.building import CatalogReader
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


@dataclass
class Planning:
    """What the rules read and write while one view is planned."""

    query: exp.Expression  # the SELECT with windows and ASOF expanded, ORDER BY dropped (the plan keeps it)
    catalog: CatalogReader
    column_names: Sequence[str] | None  # as the view names them (None: the SELECT's)
    column_types: Sequence[str] | None  # frozen types of a view created before (None: DuckDB's)
    bigint_sums: bool
    output: tuple[Column, ...] = ()  # the view's columns as the binder gives them
    names: list[str] = field(default_factory=list)
    resolved: exp.Expression | None = None  # the query qualified and rewritten for building
    root: Node | None = None  # the plan, once built


def expand_windows(p: Planning) -> None:
    p.query = expand_time_windows(p.query, p.catalog.schema())


def expand_asof(p: Planning) -> None:
    p.query = expand_asof_joins(p.query)


def check_constructs(p: Planning) -> None:
    check_supported(p.query, p.catalog.aggregate_names())


def drop_order(p: Planning) -> None:
    p.query = drop_order_by(p.query)


def check_names(p: Planning) -> None:
    check_relations(p.query, p.catalog.schema())


def bind(p: Planning) -> None:
    """The output columns from DuckDB's binder; frozen types replace its types (as PostgreSQL freezes a
    view's columns)."""
    output = p.catalog.describe(render(p.query))
    p.names = _output_names(output, p.column_names)
    if p.column_types is not None:
        if len(p.column_types) != len(output):
            raise BindError(f"the view was created with {len(p.column_types)} columns but its SELECT now returns "
                            f"{len(output)}")
        output = tuple(Column(c.name, t) for c, t in zip(output, p.column_types))
    p.output = output


def integer_sums(p: Planning) -> None:
    """Integer sums as BIGINT, unless the types are frozen or the view predates the rule."""
    if p.column_types is None and p.bigint_sums:
        types = integer_sum_types(p.query, [c.type for c in p.output],
                                  lambda q: [c.type for c in p.catalog.describe(render(q))])
        p.output = tuple(Column(c.name, t) for c, t in zip(p.output, types))


def resolve_columns(p: Planning) -> None:
    p.resolved = resolve(p.query, p.catalog.schema())


def factor_ors(p: Planning) -> None:
    p.resolved = factor_disjunctions(p.resolved)


def imply_per_table_conditions(p: Planning) -> None:
    p.resolved = imply_per_table(p.resolved)


def build(p: Planning) -> None:
    p.root = Builder(p.catalog, infer_types).query(p.resolved)


def merge_nested_spj(p: Planning) -> None:
    p.root = merge_spj(p.root)


def check_recursive(p: Planning) -> None:
    check_recursion(p.root)


def infer_node_types(p: Planning) -> None:
    infer_types(p.root, p.catalog.describe)


def name_root(p: Planning) -> None:
    p.root = name_outputs(p.root, p.names, [c.type for c in p.output])


RULES = (expand_windows, expand_asof, check_constructs, drop_order, check_names, bind, integer_sums,
         resolve_columns, factor_ors, imply_per_table_conditions, build, merge_nested_spj, check_recursive,
         infer_node_types, name_root)


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
    p = Planning(query, catalog, column_names, column_types, bigint_sums)
    for rule in RULES:
        rule(p)
    columns = tuple(Column(n, c.type) for n, c in zip(p.names, p.output))
    relations = tuple(dict.fromkeys(s.relation for s in sources(p.root)))
    return ViewPlan(root=p.root, columns=columns, sources=relations, query=p.query)


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
