"""The rows of a view computed from its state, kept per run of the state: a new version costs its change.

A view without stored output (an aggregate or DISTINCT on top,
``delta_operators.compiler.reads_only_state``) is read as a projection of its
operator state: ``read_sql`` is a chain of SELECTs over one state relation in
which each state row gives at most one row of the view (the aggregate's
outputs computed from its sums and counts, groups filtered by HAVING).
Computing that over every state row at each version costs in proportion to
the view, not to the change: a 200,000-group view read between 1,000-row
batches spent ~8 ms of DuckDB per batch there (bench/README.md, session 28).

A relation's runs never change, only which of their rows are live
(storage/relation.py). So the projection is computed once per run, with each
output row's position in its run (``RunRows``), and a version's rows are, per
run, the projected rows whose position is still live: a batch runs the
projection over the runs it made (its new rows, and a merge's) and filters
the others' by their liveness bits.

Incremental rule, for a row-wise projection f and a relation R whose runs
are r_1..r_k with live masks m_i: f(R) = ⊎_i σ_{m_i}(f⁺(r_i)), where f⁺
carries each row's position through f; a run's f⁺ is computed once.

The filter itself costs in proportion to the view (a 200,000-row run's
liveness filter and the concatenation: ~1.9 ms), so a version keeps its rows
as parts, σ_{m_i} not yet applied (``ViewRows``): a point read matches each
part's rows and keeps the matches still live; only a read of every row, or
one DuckDB runs, makes them one table (once per version).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from ivm.execute import duck
from ivm.execute.compiled.step import CompiledStep, Fallback, Unsupported, checked_run
from ivm.reads import point_reads
from sql_frontend.plan_sql import render
from storage.relation import Relation, Run
from storage.schemas import SchemaMap


_UNKNOWN = object()  # (a schema not compiled yet: None is "DuckDB projects it")
POS = "__ivm_pos"  # a projected row's position in its run
RUN_ROWS = "__ivm_run_rows"  # the name the projection reads one run under
# Clauses that make a SELECT more than a row-wise projection and filter of its one input.
_NOT_ROW_WISE = ("joins", "group", "having", "distinct", "order", "limit", "offset", "qualify", "windows",
                 "laterals", "with_", "pivots", "sample", "connect", "match", "prewhere", "cluster",
                 "distribute", "sort")


def positional(select: exp.Expression, scan: str) -> exp.Expression | None:
    """``select`` reading the table ``RUN_ROWS`` in place of ``scan`` and returning each row's ``POS``
    too, or None when it is not a chain of row-wise SELECTs (projections and filters, no aggregate,
    window or subquery in them) over that one table."""
    tree = select.copy()
    chain: list[tuple[exp.Select, exp.Expression]] = []
    node = tree
    while True:
        if not isinstance(node, exp.Select) or any(node.args.get(k) for k in _NOT_ROW_WISE):
            return None
        where = node.args.get("where")
        for e in node.expressions + ([where] if where is not None else []):
            if e.find(exp.AggFunc, exp.Window, exp.Subquery, exp.Select, exp.Star) is not None:
                return None
        source = node.args.get("from_")
        if source is None:
            return None
        source = source.this
        chain.append((node, source))
        if isinstance(source, exp.Subquery) and source.alias:
            node = source.this
            continue
        if isinstance(source, exp.Table) and source.name == scan and not source.args.get("db") \
                and not source.args.get("catalog"):
            break
        return None
    for node, source in chain:
        node.select(exp.alias_(exp.column(POS, table=exp.to_identifier(source.alias_or_name, quoted=True)), POS,
                               quoted=True), append=True, copy=False)
    table = chain[-1][1]
    if not table.alias:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(scan, quoted=True)))
    table.set("this", exp.to_identifier(RUN_ROWS, quoted=True))
    return tree


@dataclass(frozen=True)
class Projected:
    """A run's projected rows, and the run position of each (None: row i is position i)."""

    rows: pa.Table
    positions: np.ndarray | None


class RunRows:
    """One view's projected rows per run of its state relation (by run serial), for the versions in use.

    A run is projected by our compiled operators (ivm/execute/compiled/) once DuckDB has typed the
    projection, DuckDB otherwise; the compiled projection is checked against DuckDB as the executor
    checks its steps (on its first runs, and always in shadow mode)."""

    def __init__(self, tree: exp.Expression):
        self.tree = tree  # ``positional``'s SELECT
        self.sql = render(tree)
        # Output column (lower case) -> the state column it passes through unchanged (see ``plain_sources``).
        self.plain_sources = plain_sources(tree)
        self._runs: dict[int, Projected] = {}
        # Per input schema (SchemaMap: hashing a schema cost more than the lookup a read makes):
        self._compiled: SchemaMap[CompiledStep | None] = SchemaMap()  # once DuckDB typed it
        self._checked: SchemaMap[int] = SchemaMap()  # compiled runs compared with DuckDB
        self._typed: SchemaMap[pa.Schema] = SchemaMap()  # DuckDB's result schema (``_types``)
        self._lock = threading.Lock()

    def rows(self, cursor: duckdb.DuckDBPyConnection, state: Relation) -> "ViewRows":
        """The view's rows over this version of its state (``cursor`` runs DuckDB where it must)."""
        parts = []
        with self._lock:
            known = dict(self._runs)
        made = {}
        for run in state.runs:
            projected = known.get(run.serial)
            if projected is None:
                projected = made[run.serial] = self.project(cursor, run.table)
            parts.append((projected, run))
        with self._lock:
            # Only the runs of the newest version are kept: a reader of an older one projects its runs again.
            self._runs = {run.serial: made[run.serial] if run.serial in made else known[run.serial]
                          for run in state.runs}
        if not parts:
            return ViewRows.whole(self.project(cursor, state.schema.empty_table()).rows)
        return ViewRows(parts)

    def rows_schema(self, cursor: duckdb.DuckDBPyConnection, state_schema: pa.Schema) -> pa.Schema:
        """The schema of the view's rows projected from state rows of ``state_schema`` (DuckDB's types)."""
        typed = self._types(cursor, state_schema.append(pa.field(POS, pa.int64())))
        return typed.remove(typed.get_field_index(POS))

    def project(self, cursor: duckdb.DuckDBPyConnection, table: pa.Table) -> Projected:
        """The view's rows from state rows ``table`` (a run's, or some looked up), each with its position."""
        rows = table.append_column(POS, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        out = self._compiled_rows(cursor, rows)
        if out is None:
            out = self._duckdb(cursor, rows)
        positions = out.column(POS).to_numpy()
        in_order = len(positions) == table.num_rows and bool((positions == np.arange(len(positions))).all())
        return Projected(out.drop_columns([POS]), None if in_order else positions)

    def _compiled_rows(self, cursor: duckdb.DuckDBPyConnection, rows: pa.Table) -> pa.Table | None:
        """The projection by the compiled step, trusted as the executor trusts its steps (``checked_run``:
        checked against DuckDB on its first runs and always in shadow mode, where a difference raises;
        otherwise a difference or an error leaves this projection to DuckDB from then on).
        None: DuckDB projects these rows."""
        step = self._step(cursor, rows)
        if step is None:
            return None
        try:
            checked = checked_run(lambda: step.run({RUN_ROWS: rows}), lambda: self._duckdb(cursor, rows),
                                  self._checked.get(rows.schema, 0), f"a computed view's projection ({self.sql})")
        except Fallback:
            return None
        if checked.reference is not None:
            self._checked[rows.schema] = self._checked.get(rows.schema, 0) + 1
        if checked.disabled is not None:
            self._disable(rows.schema)
        return checked.rows

    def _disable(self, schema: pa.Schema) -> None:
        with self._lock:
            self._compiled[schema] = None

    def _step(self, cursor: duckdb.DuckDBPyConnection, rows: pa.Table) -> CompiledStep | None:
        """The projection compiled for this input schema (typed by DuckDB once), or None (DuckDB runs it)."""
        step = self._compiled.get(rows.schema, _UNKNOWN)
        if step is _UNKNOWN:
            expected = self._types(cursor, rows.schema)
            try:
                step = CompiledStep(self.tree, {RUN_ROWS: rows.schema}, expected)
            except Unsupported:
                step = None
            with self._lock:
                self._compiled[rows.schema] = step
        return step

    def _types(self, cursor: duckdb.DuckDBPyConnection, schema: pa.Schema) -> pa.Schema:
        """DuckDB's result schema of the projection over rows of ``schema`` (with POS), asked once per schema."""
        with self._lock:
            known = self._typed.get(schema)
        if known is None:
            known = self._duckdb(cursor, schema.empty_table()).schema
            with self._lock:
                self._typed[schema] = known
        return known

    def _duckdb(self, cursor: duckdb.DuckDBPyConnection, rows: pa.Table) -> pa.Table:
        cursor.register(RUN_ROWS, rows)
        try:
            return duck.arrow(cursor, self.sql)
        finally:
            cursor.unregister(RUN_ROWS)


class ViewRows:
    """One version's rows of a computed view: per run of its state, the run's projected rows and the
    run (whose liveness in this version says which of them are rows), or one table already whole.

    ``table()`` applies the liveness and concatenates, once, when a read needs every row or DuckDB
    reads them; ``answer`` answers a point read without that: it matches each part's projected rows,
    then keeps the matches whose positions are live (a few bits instead of every row)."""

    def __init__(self, parts: list[tuple[Projected, Run | None]]):
        self.schema = parts[0][0].rows.schema  # every run is projected to DuckDB's types
        self._parts = parts
        self._table: pa.Table | None = None
        self._lock = threading.Lock()

    @classmethod
    def whole(cls, table: pa.Table) -> "ViewRows":
        rows = cls([(Projected(table, None), None)])
        rows._table = table
        return rows

    def table(self) -> pa.Table:
        with self._lock:
            if self._table is None:
                parts = [_live(projected, run) for projected, run in self._parts]
                self._table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            return self._table

    def answer(self, read: point_reads.Shape, values: list[pa.Scalar]) -> pa.Table | None:
        """``point_reads.answer`` of these rows (None: that path cannot answer it)."""
        if self._table is not None or not read.equalities:  # every row is read: no filter to skip
            return point_reads.answer(read, self.table(), values)
        answers = []
        for projected, run in self._parts:
            rows = point_reads.answer(read, projected.rows, values, _live_positions(projected, run))
            if rows is None:
                return None
            answers.append(rows)
        return pa.concat_tables(answers) if len(answers) > 1 else answers[0]


def _live_positions(projected: Projected, run: Run | None):
    """Of positions into a run's projected rows, those whose row is live in this version of the run
    (None: all are)."""
    if run is None or run.live is None:
        return None
    if projected.positions is None:
        return lambda positions: positions[run.is_live(positions)]
    return lambda positions: positions[run.is_live(projected.positions[positions])]


def _live(projected: Projected, run: Run | None) -> pa.Table:
    """A run's projected rows whose position is live in this version of the run."""
    rows = projected.rows
    if run is None or run.live is None or not rows.num_rows:
        return rows
    if projected.positions is None:  # row i is position i: the liveness bits are the filter, as they are
        return rows.filter(run.live_mask())
    return rows.filter(pa.array(run.is_live(projected.positions)))


def plain_sources(tree: exp.Expression) -> dict[str, str]:
    """Of a ``positional`` SELECT chain, each output column (lower case) that is a column of the state rows
    passed through every SELECT unchanged (no cast, no expression), with that state column's name.

    A point read of such a column is a read of the state rows with that value: the view's group key
    columns (``SELECT cust, SUM(x) ... GROUP BY cust``) are read through the state's index on them. An
    output name given twice (case-insensitively) is left out: a read cannot name it."""
    def source(node: exp.Select, name: str) -> str | None:
        found = [e for e in node.expressions if e.alias_or_name == name]
        if len(found) != 1:
            return None
        e = found[0].this if isinstance(found[0], exp.Alias) else found[0]
        if not isinstance(e, exp.Column):
            return None
        origin = node.args["from_"].this
        if isinstance(origin, exp.Subquery):
            return source(origin.this, e.name) if e.table == origin.alias else None
        return e.name if e.table in (origin.alias_or_name, "") else None

    names = [e.alias_or_name for e in tree.expressions if e.alias_or_name != POS]
    out = {}
    for name in names:
        if sum(n.lower() == name.lower() for n in names) == 1:
            found = source(tree, name)
            if found is not None:
                out[name.lower()] = found
    return out


def run_rows(select: exp.Expression, scan: str) -> RunRows | None:
    """A ``RunRows`` for a view's read SELECT over the state relation scanned as ``scan``, or None when
    the SELECT is not row-wise (it is computed over every state row, as before)."""
    tree = positional(select, scan)
    return None if tree is None else RunRows(tree)
