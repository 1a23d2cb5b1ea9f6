"""Compile a view's plan into a delta program.

The compiler walks the plan bottom-up and asks each node's rule (one module
per operator family) for three things:

    delta(ctx)                  -> temp holding the node's change, or None
    scan(ctx, mode)             -> SELECT of the node's full contents (OLD or NEW)
    lookup(ctx, cols, probe, …) -> temp holding the node's rows matching a probe

``OLD`` is the content before this step's changes and ``NEW`` after. Stored
base tables already hold NEW while views are maintained (ingest applies a
batch to its table first), while operator state and view outputs hold OLD
until the program's Replace steps run; rules convert between the two by
adding or subtracting the delta, which is always small.

Programs are compiled per set of changed sources and cached by the engine.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from sqlglot import exp

from sql_frontend.plan import SPJ, Aggregate, Column, Distinct, Node, SemiJoin, SetOp, Source, UnionAll, ViewPlan, walk
from sql_frontend.plan_sql import alias, column
from delta_operators.program import Guard, IndexSpec, Program, Query, Replace, StateSpec, Step, scan_name
from delta_operators.optimize import optimize
from storage.zset import WEIGHT, WEIGHT_TYPE

OLD = "old"
NEW = "new"


def delta_input(relation: str) -> str:
    """Name of the temp through which the engine supplies a source's delta."""
    return f"__delta__{relation}"


class Rule(Protocol):
    node: Node

    def delta(self, ctx: "Context") -> str | None: ...

    def scan(self, ctx: "Context", mode: str) -> exp.Expression: ...

    def lookup(
        self, ctx: "Context", columns: tuple[str, ...], probe: str, probe_columns: tuple[str, ...], mode: str
    ) -> str | None: ...

    def states(self, ctx: "Context") -> list[StateSpec]: ...


@dataclass
class Options:
    changed: frozenset[str] = frozenset()  # sources with a delta in this step
    stored_new: frozenset[str] = frozenset()  # sources whose stored version already includes it
    initial: bool = False  # first computation: every source's OLD is empty
    optimize: bool = True  # run delta_operators.optimize over the program
    store_output: bool = True  # merge the view's delta into a stored output relation


@dataclass
class Context:
    view: str
    plan: ViewPlan
    options: Options
    program: Program = field(default_factory=Program)
    _counter: itertools.count = field(default_factory=itertools.count)
    _rules: dict[int, Rule] = field(default_factory=dict)
    _deltas: dict[int, str | None] = field(default_factory=dict)
    _index: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, node in enumerate(walk(self.plan.root)):
            self._index[id(node)] = i

    # --- naming -----------------------------------------------------------
    def temp(self, prefix: str) -> str:
        return f"{prefix}{next(self._counter)}"

    def node_number(self, node: Node) -> int:
        return self._index[id(node)]

    def state_name(self, node: Node, role: str) -> str:
        return f"{self.view}.{role}{self.node_number(node)}"

    # --- emitting ---------------------------------------------------------
    def query(
        self, prefix: str, sql: exp.Expression, drivers: tuple[str, ...], note: str = "", skip: str = "any",
        transparent: bool = False, pinned: bool = False, guard: Guard | None = None, beside_state: bool = False,
    ) -> str:
        out = self.temp(prefix)
        self.program.steps.append(
            Query(out=out, sql=sql, drivers=drivers, note=note, skip=skip, transparent=transparent, pinned=pinned,
                  guard=guard, beside_state=beside_state)
        )
        return out

    def emit(self, step: Step) -> None:
        self.program.steps.append(step)

    def replace(self, replace: Replace) -> None:
        self.program.replaces.append(replace)

    def need_index(self, relation: str, columns: tuple[str, ...]) -> None:
        self.program.indexes.add(IndexSpec(relation, columns))

    def scan_relation(self, relation: str) -> exp.Table:
        self.program.scans.add(relation)
        return exp.Table(this=exp.to_identifier(scan_name(relation), quoted=True))

    # --- rules ------------------------------------------------------------
    def rule(self, node: Node) -> Rule:
        key = id(node)
        if key not in self._rules:
            self._rules[key] = make_rule(node)
        return self._rules[key]

    def delta(self, node: Node) -> str | None:
        key = id(node)
        if key not in self._deltas:
            self._deltas[key] = self.rule(node).delta(self)
        return self._deltas[key]

    def changed(self, relation: str) -> bool:
        return relation in self.options.changed


def make_rule(node: Node) -> Rule:
    # Imported here: the rule modules import this one for Context and modes.
    from delta_operators.aggregate import AggregateRule
    from delta_operators.distinct import DistinctRule
    from delta_operators.semijoin import SemiJoinRule
    from delta_operators.setop import SetOpRule
    from delta_operators.source import SourceRule
    from delta_operators.spj import SPJRule
    from delta_operators.union import UnionAllRule

    rules = {
        Source: SourceRule, SPJ: SPJRule, Aggregate: AggregateRule, Distinct: DistinctRule, UnionAll: UnionAllRule,
        SemiJoin: SemiJoinRule, SetOp: SetOpRule,
    }
    rules.update(ordered_and_recursive_rules())
    return rules[type(node)](node)


def ordered_and_recursive_rules() -> dict[type, type]:
    """Rules of the window, top-K and recursive nodes (imported late, as above)."""
    from sql_frontend.plan import Recursive, RecursiveRef, Session, TopK, Window
    from delta_operators.recursive import RecursiveRefRule, RecursiveRule
    from delta_operators.session import SessionRule
    from delta_operators.top_k import TopKRule
    from delta_operators.window import WindowRule

    return {Window: WindowRule, TopK: TopKRule, Recursive: RecursiveRule, RecursiveRef: RecursiveRefRule,
            Session: SessionRule}


def compile_view(view: str, plan: ViewPlan, options: Options) -> Program:
    """The program that turns source deltas into the view's delta and new state."""
    from delta_operators.merge import merge_output, output_key

    ctx = Context(view=view, plan=plan, options=options)
    ctx.program.inputs = tuple(delta_input(r) for r in sorted(options.changed))
    root_delta = ctx.delta(plan.root)
    if root_delta is not None:
        if options.store_output:
            ctx.program.output = merge_output(ctx, view, plan.columns, root_delta, output_key(plan.root))
        else:
            ctx.program.output = root_delta
    return optimize(ctx.program) if options.optimize else ctx.program


def view_states(view: str, plan: ViewPlan, store_output: bool = True) -> list[StateSpec]:
    """Every relation a view owns: its output first (when stored), then operator state."""
    from delta_operators.merge import output_key, output_state

    ctx = Context(view=view, plan=plan, options=Options())
    specs = [output_state(view, plan.columns, output_key(plan.root))] if store_output else []
    for node in walk(plan.root):
        specs.extend(ctx.rule(node).states(ctx))
    return specs


def reads_only_state(plan: ViewPlan) -> bool:
    """True when the view's rows can be computed from its own operator state alone.

    Such a view needs no stored output: its rows are a cheap projection of the
    state of its top aggregate or DISTINCT, computed when read.
    """

    def only_state(node: Node) -> bool:
        if isinstance(node, (Aggregate, Distinct)):
            return True
        if isinstance(node, SetOp):
            return not node.all  # reads show each row once: only without ALL is that its multiplicity
        if isinstance(node, (SPJ, UnionAll)):
            return all(only_state(child) for child in node.children())
        return False

    return only_state(plan.root)


def read_sql(view: str, plan: ViewPlan) -> tuple[exp.Expression, set[str]]:
    """SELECT of a view's rows from its operator state, and the relations it scans."""
    ctx = Context(view=view, plan=plan, options=Options())
    scan = ctx.rule(plan.root).scan(ctx, OLD)
    from sql_frontend.plan_sql import subquery

    select = exp.select(*[column(c.name, "v") for c in plan.columns]).from_(subquery(scan, "v"))
    return select, set(ctx.program.scans)


# --- SQL helpers shared by the rules ------------------------------------------


def typed_null(type_sql: str) -> exp.Expression:
    return exp.cast(exp.null(), exp.DataType.build(type_sql, dialect="duckdb"))


def cast(expression: exp.Expression, type_sql: str) -> exp.Expression:
    return exp.cast(expression, exp.DataType.build(type_sql, dialect="duckdb"))


def empty_select(columns: tuple[Column, ...]) -> exp.Select:
    """A typed, empty Z-set with ``columns``."""
    return exp.select(
        *[alias(typed_null(c.type), c.name) for c in columns],
        alias(cast(exp.Literal.number(0), WEIGHT_TYPE), WEIGHT),
    ).where(exp.false())


def select_columns(source: str, columns: tuple[Column, ...], weight_expr: exp.Expression | None = None) -> exp.Select:
    """SELECT the node's columns and the weight from a temp or relation scan."""
    w = weight_expr if weight_expr is not None else column(WEIGHT, source)
    return exp.select(
        *[alias(column(c.name, source), c.name) for c in columns], alias(w, WEIGHT)
    ).from_(exp.Table(this=exp.to_identifier(source, quoted=True), alias=exp.TableAlias(this=exp.to_identifier(source, quoted=True))))


def union_all(parts: list[exp.Expression]) -> exp.Expression:
    result = parts[0]
    for part in parts[1:]:
        result = exp.union(result, part, distinct=False)
    return result


def negate_weight(source: str, columns: tuple[Column, ...]) -> exp.Select:
    return select_columns(source, columns, exp.Neg(this=column(WEIGHT, source)))
