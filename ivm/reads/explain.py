"""EXPLAIN: the incremental plan of a view, as text lines.

For each plan node: what it computes, how its delta is computed, and the
state it keeps; then, for each source, the steps a change to that source
runs (which relations are looked up by which index, which are scanned, and
whether a query step runs compiled or on DuckDB, and why).
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from sql_frontend.plan import (
    SPJ, Aggregate, Distinct, Node, Recursive, RecursiveRef, SemiJoin, Session, SetOp, Source, TopK, UnionAll, ViewPlan,
    Window,
)
from sql_frontend.plan_sql import match_condition, render
from delta_operators.compiler import Context, Options
from delta_operators.program import Program, Query, StateSpec

RULES = {
    Source: "incremental: its delta is the change batch",
    SPJ: "incremental: product rule, one term per changed input, joined by index lookups",
    Aggregate: "incremental: per-group counts/sums; MIN/MAX rescan a group only when its extreme is deleted",
    Distinct: "incremental: keeps each row's multiplicity; emits rows whose presence flips",
    UnionAll: "incremental: union of the inputs' deltas",
    SetOp: "incremental: keeps each row's left and right counts; emits rows whose output multiplicity changes",
    Window: "incremental per partition: recomputes only the partitions a change touches",
    Session: "incremental per session: recomputes only the sessions of a key a changed row meets",
    TopK: "incremental: keeps a buffer of the first rows in sort order; rescans the input only "
          "when deletions leave fewer than LIMIT + OFFSET rows in it",
    Recursive: "incremental: semi-naive rounds over the changed facts only",
    RecursiveRef: "the recursive CTE inside its own step (the previous round's facts)",
}
SEMI_RULES = {
    False: "incremental: keeps the right side's match count per key; looks up left rows only for keys "
           "whose count crosses zero",
    True: "incremental: keeps each left row's number of matching right rows, from the inner join's delta "
          "(product rule)",
}


def rule_text(node: Node) -> str:
    if isinstance(node, SemiJoin):
        return SEMI_RULES[node.residual is not None]
    return RULES.get(type(node), "")


def _describe_node(node: Node) -> str:
    if isinstance(node, Source):
        return f"Source {node.relation} ({node.kind})"
    if isinstance(node, SPJ):
        parts = [f"SPJ over {', '.join(a for a, _ in node.inputs)}"]
        parts.append("outputs: " + ", ".join(n for n, _ in node.outputs))
        if node.predicate is not None:
            parts.append("where: " + render(node.predicate))
        return "  ".join(parts)
    if isinstance(node, Aggregate):
        keys = ", ".join(node.keys) or "(none: one row)"
        calls = ", ".join(f"{c.name}={c.sql()}" for c in node.aggregates)
        return f"Aggregate group by {keys}  computing {calls}"
    if isinstance(node, Distinct):
        return "Distinct"
    if isinstance(node, UnionAll):
        return f"UnionAll of {len(node.inputs)} inputs"
    if isinstance(node, SemiJoin):
        kind = "AntiJoin" if node.anti else "SemiJoin"
        text = f"{kind} on {render(match_condition(node))}"
        return f"{text}  ({node.origin})" if node.origin else text
    if isinstance(node, SetOp):
        return f"{node.kind.upper()}{' ALL' if node.all else ''} of 2 inputs"
    return _describe_ordered_or_recursive(node)


def _describe_ordered_or_recursive(node: Node) -> str:
    if isinstance(node, Session):
        by = ", ".join(node.keys) or "(nothing: one sequence)"
        return f"Session by {by} over {node.time}, gap {node.gap_us / 1e6:g} s"
    if isinstance(node, Window):
        source = dict(node.input.outputs) if isinstance(node.input, SPJ) else {}
        by = ", ".join(f"{p} (= {render(source[p])})" if p in source else p for p in node.partition)
        calls = ", ".join(f"{name}={render(call)}" for name, call in node.calls)
        return f"Window partition by {by or '(nothing: one partition)'}  computing {calls}"
    if isinstance(node, TopK):
        order = ", ".join(k.sql() for k in node.order)
        limit = "no LIMIT" if node.limit is None else f"LIMIT {node.limit}"
        return f"TopK order by {order}  {limit} OFFSET {node.offset}"
    if isinstance(node, Recursive):
        kind = "UNION (set: delete and re-derive, with derivation counts)" if node.distinct else \
            "UNION ALL (bag: counting)"
        return f"Recursive {node.name} {kind}; children: base, then the recursive step"
    if isinstance(node, RecursiveRef):
        return f"RecursiveRef {node.name}"
    return type(node).__name__


def explain_view(name: str, plan: ViewPlan, states: list[StateSpec], programs: dict[str, Program],
                 engine: str = "duckdb", step_status: Callable[[Query], str] | None = None) -> list[str]:
    lines = [f"materialized view {name}  (engine: {engine})"]
    lines.append("columns: " + ", ".join(f"{c.name} {c.type}" for c in plan.columns))
    lines.append("plan:")
    ctx = Context(view=name, plan=plan, options=Options())
    state_by_node: dict[int, list[StateSpec]] = {}
    for node in _nodes(plan.root):
        state_by_node[id(node)] = ctx.rule(node).states(ctx)

    def visit(node: Node, depth: int, seen: set[int]) -> None:
        pad = "  " * (depth + 1)
        lines.append(f"{pad}{_describe_node(node)}")
        lines.append(f"{pad}  {rule_text(node)}")
        for spec in state_by_node.get(id(node), []):
            lines.append(f"{pad}  state {spec.name}: {spec.role}, {_keyed(spec)}")
        if id(node) in seen:
            lines.append(f"{pad}  (shared, shown above)")
            return
        seen.add(id(node))
        for child in node.children():
            visit(child, depth + 1, seen)

    visit(plan.root, 0, set())
    if any(s.name == name for s in states):
        lines.append(f"output: stored in {name}, rows keyed by their values with a multiplicity")
    else:
        lines.append("output: not stored; read from the state of the operators above")
    for source, program in programs.items():
        lines.append(f"on a change to {source}:")
        for step in program.describe(annotate=step_status):
            lines.append(f"  {step}")
        if program.scans:
            lines.append("  not incremental: the steps marked [reads all of …] read whole relations "
                         "(each runs only when its inputs are not empty)")
        else:
            lines.append("  incremental: no step reads a whole relation")
    return lines


def _keyed(spec: StateSpec) -> str:
    if spec.identity:
        return f"keyed by ({', '.join(spec.identity)})"
    indexes = [", ".join(i) for i in spec.indexes if i]
    if indexes:
        return "indexed by " + ", ".join(f"({i})" for i in indexes)
    return "read whole"


def _nodes(root: Node):
    from sql_frontend.plan import walk

    return walk(root)


def explain_sql(expression: exp.Expression) -> str:
    return expression.sql("duckdb", pretty=True)
