"""Delta programs: what the compiler emits and an engine runs.

A program is a straight-line list of steps over named temporaries:

    Query    out := one SELECT over temporaries and full relation scans
    Lookup   out := rows of a stored relation whose index columns equal the
             probe columns of a temporary (an arrangement lookup, DD-style)
    Stack    out := selections of one temp with constant weights (no engine query)
    Loop     repeat a list of steps, feeding some of its temps to the next round,
             until one of them is empty (semi-naive evaluation of recursion)

and, applied only after every step succeeded, a list of

    Replace  delete looked-up rows of a relation (by run/position), insert new rows

Steps never mutate state, so an error anywhere leaves nothing changed, and
every view reads the same before-image of every relation. SQL is kept as
sqlglot trees and rendered per engine dialect.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from sqlglot import exp

from storage.zset import WEIGHT
from sql_frontend.plan import Column


def scan_name(relation: str) -> str:
    """The SQL name under which a query reads a relation's full contents."""
    return f"__scan__{relation}"


@dataclass(frozen=True)
class Guard:
    """A cheap driver-side test that a query's result is empty.

    The query returns nothing unless some row of ``probe`` with WEIGHT <= 0
    has ``column`` equal to a value in one of ``values``' ``value_columns``
    in a row with the same ``keys`` (NULL-safe; a MIN/MAX rescan: only a
    deleted current extreme of its own group needs one). The test is a
    superset: it may let a query run for nothing (where it cannot compare
    exactly it ignores the keys, or answers nothing), never skip one with
    rows. Engines apply it only to temporaries they hold on the driver.
    """

    probe: str
    column: str
    values: str
    value_columns: tuple[str, ...]
    keys: tuple[str, ...] = ()  # group key columns, named alike in probe and values
    # When set, the query's result is exactly the distinct ``keys`` of those probe rows (the
    # matching ones) and a TRUE column of this name: a driver-side operator may compute it
    # (ivm/execute/compiled/extremes.py) where the keys and values compare exactly.
    result: str | None = None


@dataclass
class Query:
    out: str
    sql: exp.Expression
    # Lets the engine skip work: with skip="any" the result is empty when any
    # driver temp is empty (a product), with skip="all" when all of them are
    # (a sum). An empty tuple means "always run".
    drivers: tuple[str, ...]
    note: str = ""
    skip: str = "any"
    # Lookups may probe through this query to the temp its columns are copied
    # from: it has no filter that would make that probe set much larger.
    transparent: bool = False
    # Always materialized, never inlined into its readers: a step that is
    # skipped unless this temp has rows (its driver) must see it computed.
    pinned: bool = False
    guard: Guard | None = None  # skip when it proves the result empty
    # Works on stored state: it reads rows of stored relations looked up by
    # key, results of other such steps, and a change computed apart (a
    # pinned query, never inlined here), and has a row per touched key (the
    # merge of a change into state, a test of the merged rows). An engine
    # that computes deltas away from where the relations live (Spark; they
    # live on the driver) may run it beside the state instead.
    beside_state: bool = False


@dataclass
class Lookup:
    out: str
    relation: str
    index: tuple[str, ...]  # stored columns; () means the whole relation
    probe: str
    probe_columns: tuple[str, ...]
    positions: bool = False  # also return RUN/POS for a later Replace
    note: str = ""
    probe_filter: str | None = None  # boolean column of the probe: only rows where it is true
    # Lower-case names of the relation's columns its readers may read (None: all); the optimizer's
    # narrow_lookups sets it, so a lookup copies 5 of lineitem's 17 columns where a join reads 5.
    columns: frozenset[str] | None = None
    # A range instead of an index (``index`` is then ()): the rows whose column ``between`` lies from
    # the least to the greatest of the probe's ``probe_columns[0]`` values; every row when one of
    # them is NULL, none for an empty probe. A superset of what a range condition keeps (the readers
    # re-check it): a change of a global aggregate compared with a column (spj._between_old_and_new).
    between: str | None = None

    @property
    def drivers(self) -> tuple[str, ...]:
        return (self.probe,)


@dataclass
class Stack:
    """out := selections of one temp stacked, each with a constant weight.

    For each part (filter column, weight, ((output column, source column)...)):
    the rows where the filter column is true, with columns renamed and the
    weight set. A plain columnar operation, so no engine query is needed.
    """

    out: str
    source: str
    parts: tuple[tuple[str, int, tuple[tuple[str, str], ...]], ...]
    note: str = ""

    @property
    def drivers(self) -> tuple[str, ...]:
        return (self.source,)


@dataclass
class Replace:
    relation: str
    deletes: str | None  # temp holding RUN/POS of rows to delete
    inserts: str | None  # temp holding new rows (relation columns + weight, maybe more)
    keep: str | None = None  # boolean column of ``inserts``: insert only rows where it is true
    nonnegative: bool = False  # fail if any inserted weight is negative (an engine bug)


@dataclass
class Loop:
    """Run ``body`` in rounds until the temp ``until`` is empty (a fixpoint).

    Loop variables are temps the body reads: before the first round each is
    set from a temp outside the loop (``init``: (variable, temp)), after each
    round from a temp of the body (``next``: (variable, body temp)). After the
    loop the variables hold their last values, and each ``collect`` output
    holds the rows a body temp had in every round, concatenated. More than
    ``max_rounds`` rounds is an error naming ``what`` (a recursion that does
    not reach a fixpoint).
    """

    init: tuple[tuple[str, str], ...]
    body: list["Step"]
    next: tuple[tuple[str, str], ...]
    until: str
    collect: tuple[tuple[str, str], ...] = ()
    max_rounds: int = 1000
    what: str = "a recursive step"
    note: str = ""

    @property
    def drivers(self) -> tuple[str, ...]:
        return ()

    def reads(self) -> set[str]:
        """Every temp name the body may read (so optimizers keep them)."""
        names = {t for _, t in self.init}
        for step in self.body:
            if isinstance(step, Query):
                names.update(t.name for t in step.sql.find_all(exp.Table))
            elif isinstance(step, Lookup):
                names.add(step.probe)
            elif isinstance(step, Stack):
                names.add(step.source)
            elif isinstance(step, Loop):
                names.update(step.reads())
        return names


Step = Query | Lookup | Stack | Loop


@dataclass(frozen=True)
class StateSpec:
    """A stored relation a view owns (its output, or operator state)."""

    name: str
    columns: tuple[Column, ...]  # without the weight column
    identity: tuple[str, ...]  # unique key of stored rows
    indexes: tuple[tuple[str, ...], ...] = ()
    initial_rows: tuple[tuple, ...] = ()  # rows present before any input (global aggregates)
    role: str = ""  # what it holds, for EXPLAIN


@dataclass(frozen=True)
class IndexSpec:
    """An index a program looks up in a relation it does not own."""

    relation: str
    columns: tuple[str, ...]


@dataclass
class Program:
    steps: list[Step] = field(default_factory=list)
    replaces: list[Replace] = field(default_factory=list)
    inputs: tuple[str, ...] = ()  # temps the engine supplies (source deltas)
    output: str | None = None  # temp holding the view's consolidated delta
    scans: set[str] = field(default_factory=set)  # relations read in full
    indexes: set[IndexSpec] = field(default_factory=set)

    def describe(self, dialect: str = "duckdb", annotate: Callable[[Query], str] | None = None) -> list[str]:
        """A line per step (and per Replace); ``annotate(query)`` adds how the engine runs a query step."""
        lines = describe_steps(self.steps, annotate=annotate)
        for r in self.replaces:
            lines.append(f"replace rows of {r.relation}")
        return lines


def describe_steps(steps: list[Step], indent: str = "", annotate: Callable[[Query], str] | None = None) -> list[str]:
    lines = []
    prefix = scan_name("")
    for step in steps:
        if isinstance(step, Query):
            scanned = sorted({t.name[len(prefix):] for t in step.sql.find_all(exp.Table) if t.name.startswith(prefix)})
            reads = f"  [reads all of {', '.join(scanned)}]" if scanned else ""
            how = f"  ({annotate(step)})" if annotate is not None else ""
            lines.append(f"{indent}{step.out} := {step.note or 'query'}{reads}{how}")
        elif isinstance(step, Lookup) and step.between is not None:
            lines.append(f"{indent}{step.out} := rows of {step.relation} with {step.between} within the range of "
                         f"{step.probe}.{step.probe_columns[0]}")
        elif isinstance(step, Lookup):
            key = ", ".join(step.index) or "all rows"
            lines.append(f"{indent}{step.out} := lookup {step.relation} by ({key}) from {step.probe}")
        elif isinstance(step, Stack):
            lines.append(f"{indent}{step.out} := {step.note or 'stack rows of ' + step.source}")
        elif isinstance(step, Loop):
            lines.append(f"{indent}repeat until {step.until} is empty (at most {step.max_rounds} rounds): {step.note}")
            lines.extend(describe_steps(step.body, indent + "    ", annotate))
    return lines


def readers(program: Program) -> Counter:
    """How many steps (and Replace/output uses) read each temporary."""
    counts: Counter = Counter()
    _count_steps(program.steps, counts)
    for replace in program.replaces:
        counts.update(n for n in (replace.deletes, replace.inserts) if n is not None)
    if program.output is not None:
        counts[program.output] += 1
    return counts


def _count_steps(steps: list[Step], counts: Counter) -> None:
    for step in steps:
        if isinstance(step, Query):
            counts.update({t.name for t in step.sql.find_all(exp.Table)})
        elif isinstance(step, Lookup):
            counts[step.probe] += 1
        elif isinstance(step, Stack):
            counts[step.source] += 1
        elif isinstance(step, Loop):
            # Loop variables are re-read every round: count them as shared.
            for _, source in (*step.init, *step.next, *step.collect):
                counts[source] += 2
            counts[step.until] += 2
            _count_steps(step.body, counts)


def need(needed: dict[str, set[str] | None], name: str, columns: set[str] | None) -> None:
    """Add ``columns`` (None: all) to what is read of temporary ``name``."""
    if name in needed and needed[name] is None:
        return
    needed[name] = None if columns is None else needed.get(name, set()) | columns


def query_columns(sql: exp.Expression) -> dict[str, set[str] | None]:
    """Columns (lower case) a query may read of each table it names; None: all of them.

    A superset: a column qualified by a table's alias (or name) counts for the tables that
    alias names anywhere in the query; an unqualified one, or one qualified by anything else
    (a subquery's alias: its own columns are counted where it reads them), for every table; a
    ``*`` selecting from a table directly reads all of its columns. (Counting every name for
    every table made a state lookup copy a weight column that only the delta beside it has.)
    """
    tables = list(sql.find_all(exp.Table))
    aliases: dict[str, set[str]] = {}
    for table in tables:
        aliases.setdefault(table.alias_or_name, set()).add(table.name)
    everywhere: set[str] = set()
    qualified: dict[str, set[str]] = {}
    for column in sql.find_all(exp.Column):
        named = aliases.get(column.table) if column.table else None
        if named is None:
            everywhere.add(column.name.lower())
        else:
            for name in named:
                qualified.setdefault(name, set()).add(column.name.lower())
    starred = set()
    for select in sql.find_all(exp.Select):
        if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in select.expressions):
            starred |= {t.name for t in select.find_all(exp.Table) if t.find_ancestor(exp.Select) is select}
    return {table.name: None if table.name in starred else everywhere | qualified.get(table.name, set())
            for table in tables}


def columns_read(program: Program) -> dict[str, set[str] | None] | None:
    """Columns (lower case) every reader of each temporary may read: None for one, all of its columns.

    Queries read the columns they name (``query_columns``), lookups their
    probe columns, guards the columns they compare; Stacks, Replaces and
    the view's output read whole temporaries. None for the program: it
    has loops (loop variables take other temporaries' rows).
    """
    if any(isinstance(step, Loop) for step in program.steps):
        return None
    needed: dict[str, set[str] | None] = {}
    for step in program.steps:
        if isinstance(step, Lookup):
            need(needed, step.probe, {c.lower() for c in probe_reads(step)})
        elif isinstance(step, Stack):
            need(needed, step.source, None)
        elif isinstance(step, Query):
            for table, columns in query_columns(step.sql).items():
                need(needed, table, columns)
            if step.guard is not None:
                for name, columns in guard_reads(step.guard):
                    need(needed, name, {c.lower() for c in columns})
    need_results(needed, program)
    return needed


def probe_reads(lookup: Lookup) -> set[str]:
    """The columns a lookup reads of its probe: the probe columns and the filter, if any."""
    return {*lookup.probe_columns, *([lookup.probe_filter] if lookup.probe_filter else [])}


def guard_reads(guard: Guard) -> tuple[tuple[str, set[str]], ...]:
    """(temporary, columns) a guard compares: its probe's value, weight and keys, its values' and keys."""
    return ((guard.probe, {guard.column, WEIGHT, *guard.keys}), (guard.values, {*guard.value_columns, *guard.keys}))


def need_results(needed: dict[str, set[str] | None], program: Program) -> None:
    """The temporaries Replaces and the view's output take: whole."""
    for replace in program.replaces:
        for name in (replace.deletes, replace.inserts):
            if name is not None:
                need(needed, name, None)
    if program.output is not None:
        need(needed, program.output, None)
