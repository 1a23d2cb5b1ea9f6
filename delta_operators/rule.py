"""The operator interface: a ``Rule`` per plan node type, the registry, and the compile context.

A rule turns one plan node into program steps. Four methods are required:

    delta(ctx)                  -> temp holding the node's change, or None
    scan(ctx, mode)             -> SELECT of the node's full contents (OLD or NEW)
    lookup(ctx, cols, probe, …) -> temp holding the node's rows matching a probe
    states(ctx)                 -> the relations the node keeps

and a few optional abilities have defaults here (``can_lookup``, ``unique``,
``is_global``, ``between``, ``old_is_empty``): a join (spj.py) asks them
of its inputs to choose how to read each one.

``OLD`` is the content before this step's changes and ``NEW`` after. Stored
base tables already hold NEW while views are maintained (ingest applies a
batch to its table first), while operator state and view outputs hold OLD
until the program's Replace steps run; rules convert between the two by
adding or subtracting the delta, which is always small.

Each rule module registers its class for its node type with
``@rule_for(NodeType)``; ``check_rules`` (run when delta_operators.compiler
is imported, after every rule module) fails if a plan node type has none.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable

from sqlglot import exp

from sql_frontend.plan import Node, ViewPlan, walk
from delta_operators.program import Guard, IndexSpec, Program, Query, Replace, StateSpec, Step, scan_name

OLD = "old"
NEW = "new"


def delta_input(relation: str) -> str:
    """Name of the temp through which the engine supplies a source's delta."""
    return f"__delta__{relation}"


class Rule(ABC):
    """How one plan node's change, contents and matching rows are computed.

    Each subclass's docstring states its incremental rule (DBSP style);
    the module docstring around it gives the contract and the details.
    """

    node: Node

    def __init__(self, node: Node):
        self.node = node

    @abstractmethod
    def delta(self, ctx: Context) -> str | None:
        """Emit the steps computing the node's change; the temp holding it, or None when nothing changed."""

    @abstractmethod
    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        """A SELECT of the node's whole contents in ``mode`` (OLD or NEW), with a weight column."""

    @abstractmethod
    def lookup(
        self, ctx: Context, columns: tuple[str, ...], probe: str, probe_columns: tuple[str, ...], mode: str
    ) -> str | None:
        """A temp holding (a superset of) the rows, in ``mode``, whose ``columns`` equal ``probe``'s
        ``probe_columns``; None if they cannot be read without a scan. Called only where ``can_lookup``."""

    @abstractmethod
    def states(self, ctx: Context) -> list[StateSpec]:
        """The relations the node keeps between steps (none for a stateless operator)."""

    # --- optional abilities: what a reader of the node may ask ------------------
    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """Whether the node's rows can be fetched by equality on ``columns`` without a scan (default: no)."""
        return False

    def unique(self, columns: tuple[str, ...]) -> bool:
        """Whether a lookup by ``columns`` finds at most one row per probe (default: not known)."""
        return False

    @property
    def is_global(self) -> bool:
        """Whether the node is an aggregate without GROUP BY: exactly one row, a change of it -old +new."""
        return False

    def can_read_range(self, ctx: Context, column: str) -> bool:
        """Whether ``between`` reads rows by a range of ``column`` without a scan (default: no)."""
        return False

    def between(self, ctx: Context, column: str, probe: str, value: str, mode: str) -> str | None:
        """A temp of the rows (in ``mode``) whose ``column`` lies within the range of ``probe``'s ``value``,
        maybe more; None when the node cannot read a range without a scan (the default). Asked only
        where ``can_read_range``."""
        return None

    def old_is_empty(self, ctx: Context) -> bool:
        """Whether the node is statically known to be empty before this step (default: not known)."""
        return False


# --- the registry: plan node type -> rule class ------------------------------------

RULES: dict[type[Node], type[Rule]] = {}


def rule_for(*node_types: type[Node]) -> Callable[[type[Rule]], type[Rule]]:
    """Class decorator: register the rule class for ``node_types``."""

    def register(cls: type[Rule]) -> type[Rule]:
        for node_type in node_types:
            if node_type in RULES and RULES[node_type] is not cls:
                raise TypeError(f"{node_type.__name__} has two rules: {RULES[node_type].__name__} and {cls.__name__}")
            RULES[node_type] = cls
        return cls

    return register


def make_rule(node: Node) -> Rule:
    """The rule of ``node``'s type, for ``node``."""
    rule = RULES.get(type(node))
    if rule is None:
        raise LookupError(f"no delta rule registered for {type(node).__name__} "
                          "(delta_operators.compiler imports every rule module)")
    return rule(node)


def plan_node_types() -> list[type[Node]]:
    """Every plan node class of sql_frontend/plan.py (subclasses of ``Node`` defined there)."""
    found, pending = [], list(Node.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if cls.__module__ == Node.__module__ and cls not in found:
            found.append(cls)
    return found


def missing_rules(node_types: Iterable[type[Node]], registry: dict[type[Node], type[Rule]]) -> list[type[Node]]:
    """The node types of ``node_types`` that ``registry`` has no rule for.

    >>> from sql_frontend.plan import Distinct, Source
    >>> [t.__name__ for t in missing_rules([Source, Distinct], {Source: Rule})]
    ['Distinct']
    """
    return [t for t in node_types if t not in registry]


def check_rules(node_types: Iterable[type[Node]] | None = None, registry: dict | None = None) -> None:
    """Raise ImportError naming every plan node type without a rule (default: all of plan.py, in ``RULES``)."""
    missing = missing_rules(plan_node_types() if node_types is None else node_types,
                            RULES if registry is None else registry)
    if missing:
        names = ", ".join(t.__name__ for t in missing)
        raise ImportError(f"no delta rule for plan node {names}: a view containing it could not be compiled; "
                          f"register a Rule subclass with @rule_for({missing[0].__name__})")


# --- the compile context ----------------------------------------------------------


@dataclass
class Options:
    changed: frozenset[str] = frozenset()  # sources with a delta in this step
    stored_new: frozenset[str] = frozenset()  # sources whose stored version already includes it
    initial: bool = False  # first computation: every source's OLD is empty
    optimize: bool = True  # run delta_operators.optimize over the program
    store_output: bool = True  # merge the view's delta into a stored output relation


@dataclass
class Context:
    """One compilation: the program being emitted, temp names, and each node's rule and delta."""

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

    def with_delta(self, node: Node, delta: str) -> "Context":
        """A context for a computation inside this one (a recursive view's round): the same rules,
        deltas and temp names, except that ``node``'s delta is ``delta``; its program is its own."""
        sub = Context(view=self.view, plan=self.plan, options=self.options, _counter=self._counter)
        sub._rules = self._rules
        sub._deltas = {**self._deltas, id(node): delta}
        return sub

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
