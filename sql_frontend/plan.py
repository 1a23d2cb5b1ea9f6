"""The logical plan: what a view computes, as a small DAG of relational nodes.

The planner turns a resolved SELECT into these nodes; ``delta_operators``
compiles each node into its incremental rule. Nodes are compared by identity
(a CTE used twice is one node read twice). Expressions are sqlglot trees whose
column references are ``alias.column`` over the node's named inputs.

    Source      a base table or an upstream materialized view
    SPJ         select-project-join over named inputs (inner joins only)
    Aggregate   GROUP BY with COUNT/SUM/AVG/MIN/MAX (+ DISTINCT variants)
    Distinct    set semantics over its input
    UnionAll    bag union of inputs with the same column layout
    SemiJoin    rows of one input with (semi) or without (anti) a match in another
    SetOp       EXCEPT / INTERSECT, with or without ALL
    Window      window functions, evaluated per partition
    Session     SESSION windows: each row with the bounds of its session
    TopK        ORDER BY … LIMIT/OFFSET: the rows at some sort positions
    Recursive   WITH RECURSIVE (linear): base, and a step reading RecursiveRef

Outer joins, subqueries and NOT IN are not nodes of their own: the planner
composes them from these (an outer join is the inner join plus the unmatched
rows, an anti join, padded with NULLs), so every construct reuses the rules
and state of a few operators.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from sqlglot import exp


INTEGER_TYPES = frozenset({
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
})
FLOAT_TYPES = frozenset({"FLOAT", "DOUBLE", "REAL"})


def is_number_type(sql_type: str) -> bool:
    """Whether values of this DuckDB type compare as numbers: integers (HUGEINT too: a SUM of integers),
    floats, DECIMAL(p,s)."""
    base = sql_type.upper().split("(")[0].strip()
    return base in INTEGER_TYPES or base in FLOAT_TYPES or base in ("DECIMAL", "NUMERIC", "HUGEINT", "UHUGEINT")


@dataclass(frozen=True)
class Column:
    """A named, typed column; ``type`` is DuckDB type SQL such as ``DECIMAL(18,2)``."""

    name: str
    type: str


class Node:
    """Base of plan nodes: an output schema and the nodes it reads."""

    columns: tuple[Column, ...]

    def children(self) -> tuple["Node", ...]:
        return ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    # Plan nodes are identities in a DAG, not values.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


@dataclass(eq=False)
class Source(Node):
    """A stored relation read by the view: a base table or a materialized view."""

    relation: str
    kind: str  # "table" | "view"
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()  # primary key, if any: a lookup by it finds at most one row
    not_null: frozenset[str] = frozenset()  # columns declared NOT NULL (and the key's)
    # Holds every row not deleted by a change (False: a stream with RETAIN, which drops old rows
    # without a delta): only then can a rule re-read rows it saw before from the relation itself.
    complete: bool = True


@dataclass(eq=False)
class SPJ(Node):
    """Select-project-join: the product of ``inputs`` filtered by ``predicate``.

    ``outputs`` are (name, expression) pairs over ``alias.column`` references.
    """

    inputs: tuple[tuple[str, Node], ...]
    predicate: exp.Expression | None
    outputs: tuple[tuple[str, exp.Expression], ...]
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return tuple(node for _, node in self.inputs)

    def input(self, alias: str) -> Node:
        for a, node in self.inputs:
            if a == alias:
                return node
        raise KeyError(alias)


AGGREGATE_FUNCTIONS = ("count_star", "count", "sum", "avg", "min", "max")


@dataclass(frozen=True)
class AggCall:
    """One aggregate: ``func`` over input column ``arg`` (None for COUNT(*))."""

    name: str
    func: str
    arg: str | None
    distinct: bool = False
    type: str = ""

    def sql(self) -> str:
        if self.func == "count_star":
            return "COUNT(*)"
        inner = f"DISTINCT {self.arg}" if self.distinct else str(self.arg)
        return f"{self.func.upper()}({inner})"


@dataclass(eq=False)
class Aggregate(Node):
    """GROUP BY ``keys`` (input column names) computing ``aggregates``.

    Output columns are the keys (same names) followed by one column per call.
    With no keys it is a global aggregate: exactly one output row, always.
    """

    input: Node
    keys: tuple[str, ...]
    aggregates: tuple[AggCall, ...]
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(eq=False)
class Distinct(Node):
    """Removes duplicates: every row of the input appears once."""

    input: Node
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(eq=False)
class UnionAll(Node):
    """Bag union; inputs line up by position, names come from the first input."""

    inputs: tuple[Node, ...]
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return self.inputs


# The aliases under which a SemiJoin's residual condition reads its two inputs.
LEFT = "__l"
RIGHT = "__r"


@dataclass(eq=False)
class SemiJoin(Node):
    """Rows of ``left`` that have (``anti=False``) or have no (``anti=True``) match in ``right``.

    A left row matches a right row when each ``keys`` pair (left column,
    right column) is equal under SQL ``=`` (so a NULL key never matches) and
    ``residual``, an expression over ``__l.<left column>`` and
    ``__r.<right column>``, is true. A left row keeps its multiplicity; how
    many right rows match does not matter. The output columns are the left's.
    """

    left: Node
    right: Node
    keys: tuple[tuple[str, str], ...]
    residual: exp.Expression | None = None
    anti: bool = False
    columns: tuple[Column, ...] = ()
    origin: str = ""  # the SQL it plans, for EXPLAIN ("EXISTS", "unmatched rows of LEFT JOIN c", ...)

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


SET_OPERATIONS = ("except", "intersect")


@dataclass(eq=False)
class SetOp(Node):
    """``left EXCEPT|INTERSECT [ALL] right``; inputs line up by position, names come from ``left``.

    Rows are compared as in GROUP BY (NULL equals NULL). With ALL, a row
    appearing l times on the left and r times on the right appears
    max(l - r, 0) times (EXCEPT) or min(l, r) times (INTERSECT); without
    ALL, once when l > 0 and r = 0 (EXCEPT) or l > 0 and r > 0 (INTERSECT).
    """

    kind: str  # one of SET_OPERATIONS
    all: bool
    left: Node
    right: Node
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


def with_children(node: Node, children: tuple[Node, ...]) -> Node:
    """A copy of ``node`` reading ``children`` instead (columns are inferred again)."""
    if isinstance(node, Source):
        return node
    if isinstance(node, SPJ):
        aliases = [a for a, _ in node.inputs]
        return SPJ(tuple(zip(aliases, children)), node.predicate, node.outputs)
    if isinstance(node, Aggregate):
        return Aggregate(children[0], node.keys, node.aggregates)
    if isinstance(node, Distinct):
        return Distinct(children[0])
    if isinstance(node, UnionAll):
        return UnionAll(tuple(children))
    if isinstance(node, SemiJoin):
        return SemiJoin(children[0], children[1], node.keys, node.residual, node.anti, origin=node.origin)
    if isinstance(node, SetOp):
        return SetOp(node.kind, node.all, children[0], children[1])
    if isinstance(node, (Window, TopK, Session)):
        return replace(node, input=children[0])
    if isinstance(node, Recursive):  # keeps its RecursiveRef: the step must still read it
        return replace(node, base=children[0], step=children[1])
    if isinstance(node, RecursiveRef):
        return node
    raise TypeError(f"unknown plan node {type(node).__name__}")


@dataclass
class ViewPlan:
    """A planned view: the root node and the names/types users see."""

    root: Node
    columns: tuple[Column, ...]
    sources: tuple[str, ...] = field(default_factory=tuple)
    # The view's own SELECT after the frontend's rewrites that change meaning
    # (time windows, ASOF joins, late/emit options, ORDER BY without LIMIT
    # dropped), before resolution: the text DuckDB bound to type the view.
    # A refresh evaluates it (ivm/maintain/recompute.py); None: use the plan's SQL.
    query: exp.Expression | None = field(default=None, compare=False, repr=False)


def walk(root: Node) -> Iterator[Node]:
    """Yield every node once, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))


def sources(root: Node) -> tuple[Source, ...]:
    return tuple(n for n in walk(root) if isinstance(n, Source))


def is_set_valued(node: Node) -> bool:
    """True when the node can never hold duplicate rows."""
    if isinstance(node, (Distinct, Aggregate)):
        return True
    if isinstance(node, SetOp):
        return not node.all or is_set_valued(node.left)  # min(l, r) and l - r never exceed l
    if isinstance(node, SemiJoin):
        return is_set_valued(node.left)  # a filter of the left rows
    if isinstance(node, SPJ) and len(node.inputs) == 1:
        # A filter over a set stays a set only when it keeps every column.
        (alias, child), = node.inputs
        refs = [e for _, e in node.outputs]
        keeps_all = all(isinstance(e, exp.Column) for e in refs) and {
            e.name for e in refs
        } >= set(child.column_names)
        return keeps_all and is_set_valued(child)
    if isinstance(node, (Window, TopK, Session)):
        return is_set_valued(node.input)
    if isinstance(node, Recursive):
        return node.distinct
    return False


# --- ordered and recursive nodes (issue 3, part B) ------------------------------

WINDOW_INPUT = "__wi"  # table alias under which window expressions read their input


@dataclass(eq=False)
class Window(Node):
    """Window functions over ``input``; each row gets one value per call.

    ``calls`` are (output name, sqlglot Window expression) whose column
    references read ``WINDOW_INPUT.column``. Every call partitions by at least
    the columns in ``partition``, so a row's window values depend only on the
    rows that share its ``partition`` values. Output: the input's columns, then
    one column per call.
    """

    input: Node
    partition: tuple[str, ...]
    calls: tuple[tuple[str, exp.Expression], ...]
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(eq=False)
class Session(Node):
    """SESSION windows over ``input`` (sql_frontend/session_windows.py): its rows whose ``time`` is not NULL,
    each with the ``window_start`` and ``window_end`` of its session per ``keys``, sessions closing after
    ``gap_us`` microseconds without an event. Output: the input's columns, then the two bounds.
    """

    input: Node
    keys: tuple[str, ...]
    time: str
    gap_us: int
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY item over an input column, with DuckDB's NULL placement made explicit."""

    column: str
    descending: bool = False
    nulls_first: bool = False

    def ordered(self, table: str | None = None) -> exp.Ordered:
        col = exp.Column(this=exp.to_identifier(self.column, quoted=True),
                         table=exp.to_identifier(table, quoted=True) if table else None)
        return exp.Ordered(this=col, desc=self.descending, nulls_first=self.nulls_first)

    def sql(self) -> str:
        return (f"{self.column}{' DESC' if self.descending else ''}"
                f" NULLS {'FIRST' if self.nulls_first else 'LAST'}")


@dataclass(eq=False)
class TopK(Node):
    """``ORDER BY order LIMIT limit OFFSET offset``: the rows at those sort positions.

    Rows tied on ``order`` at a boundary are interchangeable: any choice among
    them is a correct result (as in SQL). ``limit`` None keeps every row after
    ``offset``. Output columns are the input's.
    """

    input: Node
    order: tuple[SortKey, ...]
    limit: int | None
    offset: int = 0
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(eq=False)
class RecursiveRef(Node):
    """The recursive CTE as its own recursive step reads it (the previous iteration)."""

    name: str
    columns: tuple[Column, ...] = ()


@dataclass(eq=False)
class Recursive(Node):
    """``WITH RECURSIVE name AS (base UNION [ALL] step)``: the least fixpoint.

    ``step`` reads ``ref`` exactly once (linear recursion). With ``distinct``
    (UNION) the result is a set; with UNION ALL it is the bag
    base + step(base) + step(step(base)) + ….
    """

    name: str
    base: Node
    step: Node
    ref: RecursiveRef
    distinct: bool
    columns: tuple[Column, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return (self.base, self.step)
