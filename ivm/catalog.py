"""The catalog: tables, materialized views, and who reads whom.

Tables and views share one namespace (as in SQL). A view records its plan,
the relations it owns (output and operator state) and the programs compiled
for it, one per set of changed sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from sqlglot import exp

from sql_frontend.errors import CatalogError, UnknownObjectError
from sql_frontend.plan import Column, ViewPlan, is_set_valued
from sql_frontend.plan_sql import render, to_sql
from sql_frontend.resolve import referenced_relations
from delta_operators.compiler import Options, compile_view, read_sql, reads_only_state, view_states
from delta_operators.program import Program, StateSpec
from delta_operators.prune import read_columns
from ivm.binder import Binder
from ivm.maintain.maintenance import CostModel


def check_name(name: str, what: str) -> None:
    """Names ivm keeps for itself (hidden tables start with __) or cannot quote in a path are refused."""
    if name.startswith("__") or "." in name or not name:
        raise CatalogError(f"{what} name {name!r} is reserved (names may not start with __ or contain '.')")


FIRST_OID = 16384  # PostgreSQL's first OID for user objects
OID_STRIDE = 4  # OIDs per relation (``Catalog.oids``)


@dataclass
class TableDef:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    not_null: frozenset[str] = frozenset()
    defaults: dict[str, exp.Expression] = field(default_factory=dict)
    kind: str = "table"
    # Event streams (CREATE TABLE … WATERMARK FOR ts AS ts - INTERVAL … APPEND ONLY; ivm/streams/event_time.py):
    append_only: bool = False  # inserts only: updates and deletes are refused
    event_time: str | None = None  # the column the watermark is declared on
    lateness_us: int = 0  # watermark = largest event time seen - lateness
    retain_us: int | None = None  # RETAIN: rows below watermark - retain are dropped (None: kept)
    # Hidden twins of a watermarked table (its on-time rows, read by views with
    # late = 'drop'; its one-row watermark, read by views with emit = 'on_close';
    # ivm/streams/event_time.py): the name of the table they belong to.
    shadow_of: str | None = None

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def identity(self) -> tuple[str, ...]:
        """Unique key of stored rows: the primary key, or the whole row for a bag."""
        return self.primary_key or self.column_names

    @property
    def is_set(self) -> bool:
        return bool(self.primary_key)


@dataclass
class ViewDef:
    name: str
    sql: str
    plan: ViewPlan
    states: list[StateSpec]
    kind: str = "view"
    programs: dict[tuple, Program] = field(default_factory=dict)
    # False: rows are computed on read from operator state (see reads_only_state)
    stored_output: bool = True
    engine: str | None = None  # compute engine of this view (None: the database's setting)
    late: str | None = None  # stragglers of watermarked sources: "drop" (None: the default) or "correct"
    emit: str | None = None  # "on_close": rows of a window only once the watermark passed its end
    closed: object = None  # event_time.ClosedWindows: state that closed windows no longer need
    interval: object = None  # interval_join.IntervalJoin: its streams' on-time rows expire (ivm/streams/interval_join.py)
    stored: frozenset[str] | None = None  # relations whose stored rows it reads (computed once, by the engine)
    # Moving estimates of incremental vs recompute cost (ivm/maintain/maintenance.py).
    cost: CostModel = field(default_factory=CostModel)
    _reads: dict[str, frozenset[str] | None] | None = field(default=None, repr=False)

    def reads(self, source: str) -> frozenset[str] | None:
        """The columns of ``source`` the view reads (None: maybe all; delta_operators/prune.py)."""
        if self._reads is None:
            self._reads = read_columns(self.plan)
        return self._reads.get(source)

    @property
    def columns(self) -> tuple[Column, ...]:
        return self.plan.columns

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def sources(self) -> tuple[str, ...]:
        return self.plan.sources

    @property
    def is_set(self) -> bool:
        return is_set_valued(self.plan.root)

    def program(self, changed: frozenset[str], stored_new: frozenset[str], initial: bool = False) -> Program:
        key = (changed, stored_new & changed, initial)
        if key not in self.programs:
            options = Options(changed=changed, stored_new=stored_new & changed, initial=initial,
                              store_output=self.stored_output)
            self.programs[key] = compile_view(self.name, self.plan, options)
        return self.programs[key]

    def store_output(self) -> None:
        """Switch to a stored output (a view that other views read needs one)."""
        self.stored_output = True
        self.states = view_states(self.name, self.plan, True)
        self.programs.clear()

    def relations(self) -> list[str]:
        return [s.name for s in self.states]

    def read_text(self) -> str:
        """``read_sql``'s SELECT rendered for DuckDB (rendering costs milliseconds: once)."""
        cached = self.programs.get(("read_text",))
        if cached is None:
            cached = self.programs[("read_text",)] = render(self.read_sql()[0])
        return cached

    def select(self) -> tuple[exp.Expression, str]:
        """The SELECT a refresh evaluates over the view's sources, as a tree and as DuckDB text, once.

        The view's own SELECT (``plan.query``: what the oracle evaluates, with
        the frontend's rewrites that change meaning already applied) where it
        reads only the plan's sources; else ``plan_sql.to_sql`` of the plan.
        The text is the cheaper one: DuckDB plans its joins from the user's
        query (TPC-H q02 at SF 1: 19.5 vs 38.7 ms CPU over the same tables).
        The plan's SQL stays where the text names a relation the plan does not
        read (a source the frontend folded away, a watermark table): a refresh
        brings only the plan's sources to NEW (ivm/maintain/recompute.py).
        """
        cached = self.programs.get(("select",))
        if cached is None:
            query = self.plan.query
            if query is not None and set(referenced_relations(query)) <= set(self.plan.sources):
                cached = (query, render(query))
            else:
                tree = to_sql(self.plan.root)
                cached = (tree, render(tree))
            self.programs[("select",)] = cached
        return cached

    def read_sql(self) -> tuple[exp.Expression, set[str]]:
        """SELECT of the rows of a view without stored output, and the state it scans."""
        cached = self.programs.get(("read",))
        if cached is None:
            cached = self.programs[("read",)] = read_sql(self.name, self.plan)
        return cached


class Catalog:
    """Implements the planner's CatalogReader over tables, views and the binder."""

    def __init__(self, binder: Binder):
        self.binder = binder
        self.tables: dict[str, TableDef] = {}
        self.views: dict[str, ViewDef] = {}
        self.version = 0  # counts changes of names and schemas (for caches of derived facts)
        # Each relation's PostgreSQL OID (pg_class.oid; ivm/reads/system_relations.py), assigned once when it is
        # created and kept (in the checkpoint manifest) for its life: across other relations' creation and
        # removal, ALTER TABLE and restarts, because drivers and BI tools cache OIDs. A relation dropped and
        # created again gets a new one, as in PostgreSQL. ``OID_STRIDE`` OIDs per relation: its own, its
        # primary key's index and constraint, and a view's rewrite rule.
        self.oids: dict[str, int] = {}
        self.next_oid = FIRST_OID

    # --- lookups --------------------------------------------------------------
    def get(self, name: str) -> TableDef | ViewDef:
        found = self.tables.get(name) or self.views.get(name)
        if found is None:
            raise UnknownObjectError(f"table or view {name} does not exist")
        return found

    def exists(self, name: str) -> bool:
        return name in self.tables or name in self.views

    def table(self, name: str) -> TableDef:
        if name in self.tables:
            return self.tables[name]
        if name in self.views:
            raise CatalogError(f"{name} is a materialized view; change its source tables instead")
        raise UnknownObjectError(f"table {name} does not exist")

    def relation_columns(self, name: str) -> tuple[Column, ...]:
        return self.get(name).columns

    def relation_kind(self, name: str) -> str:
        return self.get(name).kind

    def relation_key(self, name: str) -> tuple[str, ...]:
        """The primary key of a table (views have none: their rows may repeat)."""
        definition = self.get(name)
        return definition.primary_key if isinstance(definition, TableDef) else ()

    def relation_not_null(self, name: str) -> frozenset[str]:
        """Columns of a table that are never NULL (a view's may be, as far as the planner knows)."""
        definition = self.get(name)
        return definition.not_null if isinstance(definition, TableDef) else frozenset()

    def relation_complete(self, name: str) -> bool:
        """Whether the stored relation holds every row no change deleted (RETAIN drops old ones)."""
        return name not in self.retained()

    def schema(self) -> dict[str, dict[str, str]]:
        out = {}
        for d in list(self.tables.values()) + list(self.views.values()):
            out[d.name] = {c.name: c.type for c in d.columns}
        return out

    def describe(self, sql: str) -> tuple[Column, ...]:
        return self.binder.describe(sql)

    def aggregate_names(self) -> frozenset[str]:
        return self.binder.aggregate_names()

    # --- dependencies ---------------------------------------------------------
    def readers(self, name: str) -> list[str]:
        """Views that read ``name`` directly (or the hidden table of its on-time rows)."""
        names = {name} | {t.name for t in self.hidden(name)}
        return [v.name for v in self.views.values() if names & set(v.sources)]

    def retained(self) -> set[str]:
        """Streams whose old rows RETAIN drops, and their hidden twins."""
        streams = {t.name for t in self.tables.values() if t.retain_us is not None}
        return streams | {t.name for t in self.tables.values() if t.shadow_of in streams}

    def expiring(self) -> set[str]:
        """On-time twins an interval join lets go of old rows of (ivm/streams/interval_join.py)."""
        return {s for v in self.views.values() if v.interval is not None for s in v.sources}

    def reads_retained(self, view: "ViewDef") -> bool:
        """Does ``view`` read a stream whose old rows RETAIN (or an interval join) drops?

        Such a view cannot be recomputed from its sources: the dropped rows
        still count in its windows. It is always maintained incrementally.
        """
        return not (self.retained() | self.expiring()).isdisjoint(view.sources)

    def hidden(self, name: str) -> list[TableDef]:
        """The hidden twins of a watermarked table (its on-time rows, its watermark)."""
        return [t for t in self.tables.values() if t.shadow_of == name]

    def visible_tables(self) -> list[TableDef]:
        """Tables users created (not the hidden on-time tables)."""
        return [t for t in self.tables.values() if t.shadow_of is None]

    def dependents(self, name: str) -> list[str]:
        """Every view that reads ``name`` directly or through other views, readers first."""
        seen: list[str] = []
        stack = self.readers(name)
        while stack:
            view = stack.pop()
            if view in seen:
                continue
            seen.append(view)
            stack.extend(self.readers(view))
        order = self.view_order()
        return [v for v in order if v in seen]

    def view_order(self) -> list[str]:
        """All views, each after the views it reads."""
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order or name not in self.views:
                return
            visiting.add(name)
            for src in self.views[name].sources:
                if src in self.views and src not in visiting:
                    visit(src)
            visiting.discard(name)
            order.append(name)

        for name in self.views:
            visit(name)
        return order

    def affected_views(self, changed: Iterable[str]) -> list[str]:
        touched: set[str] = set()
        for name in changed:
            touched.update(self.dependents(name))
        return [v for v in self.view_order() if v in touched]

    # --- changes ---------------------------------------------------------------
    def add_table(self, table: TableDef) -> None:
        self.binder.create(table.name, table.columns)
        self.tables[table.name] = table
        self._assign_oid(table.name)
        self.version += 1

    def add_view(self, view: ViewDef) -> None:
        self.binder.create(view.name, view.columns)
        self.views[view.name] = view
        self._assign_oid(view.name)
        self.version += 1

    def _assign_oid(self, name: str) -> None:
        if name not in self.oids:  # (a relation restored from a checkpoint has its stored one: ``load_oids``)
            self.oids[name] = self.next_oid
            self.next_oid += OID_STRIDE

    def load_oids(self, oids: dict[str, int], next_oid: int | None) -> None:
        """The OIDs a checkpoint stored, before its relations are added again (on open)."""
        self.oids.update(oids)
        self.next_oid = max([self.next_oid, next_oid or 0, *(oid + OID_STRIDE for oid in oids.values())])

    def replace_table(self, table: TableDef) -> None:
        """Another definition of an existing table (ALTER TABLE: its columns changed)."""
        self.binder.drop(table.name)
        self.binder.create(table.name, table.columns)
        self.tables[table.name] = table
        self.version += 1

    def replace_view(self, view: ViewDef) -> None:
        """Another plan of an existing view, with the same columns (a table it reads was altered)."""
        self.views[view.name] = view
        self.version += 1

    def remove(self, name: str) -> None:
        self.tables.pop(name, None)
        self.views.pop(name, None)
        self.oids.pop(name, None)
        self.binder.drop(name)
        self.version += 1


def make_view(name: str, sql: str, plan: ViewPlan) -> ViewDef:
    stored = not reads_only_state(plan)
    return ViewDef(name=name, sql=sql, plan=plan, states=view_states(name, plan, stored), stored_output=stored)
