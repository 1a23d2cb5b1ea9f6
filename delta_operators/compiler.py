"""Compile a view's plan into a delta program.

The compiler walks the plan bottom-up and asks each node's rule (one module
per operator family, each a ``rule.Rule`` registered for its node type) for
its delta, its contents (OLD or NEW) and lookups of its rows; see rule.py
for the interface and the meaning of OLD and NEW.

Importing this module imports every rule module, so the registry is full,
and checks that every plan node type has a rule: a node without one fails
here, at import, not when a view containing it is created.

Programs are compiled per set of changed sources and cached by the engine.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import SPJ, Aggregate, Distinct, Node, SetOp, UnionAll, ViewPlan, walk
from sql_frontend.plan_sql import column, subquery
from delta_operators import aggregate, distinct, recursive, semijoin, session, setop, source, spj, top_k, union, window
from delta_operators.merge import merge_output, output_key, output_state
from delta_operators.optimize import optimize
from delta_operators.program import Program, StateSpec
from delta_operators.rule import OLD, Context, Options, check_rules, delta_input

__all__ = ["Context", "Options", "compile_view", "delta_input", "read_sql", "reads_only_state", "view_states"]

# The rule modules: importing each registers its rules (``@rule_for``); then no plan node may lack one.
RULE_MODULES = (source, spj, aggregate, distinct, union, semijoin, setop, window, session, top_k, recursive)
check_rules()


def compile_view(view: str, plan: ViewPlan, options: Options) -> Program:
    """The program that turns source deltas into the view's delta and new state."""
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
    select = exp.select(*[column(c.name, "v") for c in plan.columns]).from_(subquery(scan, "v"))
    return select, set(ctx.program.scans)
