"""Run delta programs on DuckDB over one snapshot of the stored relations.

Queries run in DuckDB over Arrow temporaries (zero-copy); lookups run against
the relations' indexes in numpy. Nothing is modified here: the Replace steps
come back as row deletions and insertions for the caller to commit.

A program runs once per change batch, and its queries are the same every
time while their inputs change. From its second run a query is therefore a
DuckDB prepared statement over *holders*: objects registered once under the
query's input names whose Arrow data is swapped before each execution. That
skips parsing, binding and optimizing (most of the cost of a query over a
small delta); the prepared plan reads whatever the holders hold when it runs.

DuckDB still binds and optimizes each EXECUTE (1.5-3.5 ms a step), so after
its first run on DuckDB a query is compiled into our own operators over
Arrow/numpy (ivm/execute/compiled/), typed by that run's result, and runs there
from then on; a step outside the compiled set, or a batch the compiled
step cannot compute exactly as DuckDB would (``Fallback``: an overflow, a
-0.0 key...), runs on DuckDB. Shadow runs execute both and compare: every
run with ``IVM_SHADOW=1`` (the test suites), else a step's first
``SHADOW_RUNS``; a difference raises under IVM_SHADOW, and otherwise turns
the step's compiled path off and logs it.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from contextlib import contextmanager
from typing import Callable
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.errors import ExecutionError, InternalError
from sql_frontend.plan_sql import quoted, render
from delta_operators.program import Guard, Lookup, Loop, Program, Query, Replace, Stack, Step, scan_name
from storage.zset import POS, RUN, WEIGHT
from ivm.execute import duck
from ivm.execute.compiled.extremes import DeletedExtremes
from ivm.execute.compiled.step import CompiledStep, Fallback, Unsupported, checked_run, shadow_mode, static_reason
from ivm.execute.duck import Holder
from storage.keys import KeyCoder
from storage.relation import Relation
from storage.store import Snapshot

DIALECT = "duckdb"
SCAN_PREFIX = scan_name("")
log = logging.getLogger("ivm.compiled")


# A view's SUM of integers is a BIGINT column (sql_frontend/integer_sums.py);
# the one way it fails is a sum beyond BIGINT, and the fix is the user's to write.
BIGINT_SUM_HINT = (" (a SUM of integers is a BIGINT column; for sums beyond ±9.2e18 write "
                   "SUM(CAST(x AS HUGEINT)) or SUM(CAST(x AS DECIMAL(38, 0))))")


@dataclass
class RowChanges:
    """Deletions (by run and row position) and insertions for one relation."""

    relation: str
    delete_runs: np.ndarray
    delete_rows: np.ndarray
    inserts: pa.Table | None


@dataclass
class Prepared:
    statement: str
    holders: dict[str, Holder] = field(default_factory=dict)  # temp or scan name -> holder


@dataclass
class StepState:
    text: str  # SQL for a one-off run, reading temps under their own names
    names: frozenset[str]  # tables the SQL reads (temps, scans, CTE names)
    runs: int = 0
    prepared: Prepared | None = None
    empty: pa.Schema | None = None  # result schema, for skipped runs
    compiled: CompiledStep | None = None  # our operators, once a DuckDB run typed the result
    reason: str | None = None  # why the step runs on DuckDB (None: not decided, or compiled)
    shadowed: int = 0  # compiled runs checked against DuckDB
    fallbacks: int = 0  # batches a compiled step handed to DuckDB
    last_fallback: str = ""


def duckdb_message(error: Exception) -> str:
    return str(error).strip().split("\n\nLINE")[0].split("\nLINE")[0].strip()


def guard_empty(guard: Guard, probe: pa.Table, values: pa.Table, coder: KeyCoder | None = None) -> bool:
    """True when no row of ``probe`` with WEIGHT <= 0 has ``guard.column`` among its group's ``values``.

    Equality as SQL's ``=`` only where Arrow agrees with it: the same type
    on both sides, not floating point (-0.0 = 0.0 and NaN), else no answer
    (False: the query runs). Groups match by key codes (``coder``; NULL
    equals NULL as in the query's NOT DISTINCT join; codes may collide,
    which only lets the query run); where the keys' types differ between
    the two sides or are floating point, or without a coder, groups are
    ignored and any group's extreme counts.
    """
    if probe.num_rows == 0:
        return True
    value_type = probe.schema.field(guard.column).type
    if pa.types.is_floating(value_type) or any(values.schema.field(c).type != value_type
                                               for c in guard.value_columns):
        return False  # decided before filtering: the test answers nothing for these types
    deleted = probe.filter(pc.less_equal(probe.column(WEIGHT), 0))
    if deleted.num_rows == 0:
        return True
    value = deleted.column(guard.column)
    columns = [values.column(c) for c in guard.value_columns]
    try:
        if coder is not None and _same_key_types(guard.keys, deleted, values):
            return _no_pair(coder.codes(deleted, guard.keys), value, coder.codes(values, guard.keys), columns)
        candidates = pa.chunked_array([chunk for c in columns for chunk in c.chunks], type=value.type)
        # is_in matches NULL to NULL, where SQL finds nothing: a NULL only makes it run
        return not pc.any(pc.is_in(value, value_set=candidates.combine_chunks())).as_py()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # types Arrow cannot compare: let the query decide
        return False


def _same_key_types(keys: tuple[str, ...], a: pa.Table, b: pa.Table) -> bool:
    """Both sides' key columns code alike: present, of one type each, not floating point."""
    if not keys or not all(k in a.column_names and k in b.column_names for k in keys):
        return False
    types = [(a.schema.field(k).type, b.schema.field(k).type) for k in keys]
    return all(x == y and not pa.types.is_floating(x) for x, y in types)


def _no_pair(codes: np.ndarray, value: pa.ChunkedArray, value_codes: np.ndarray, columns: list) -> bool:
    """No (group code, value) of the deleted rows is a (group code, extreme) of ``values`` (NULLs never equal)."""
    left = pa.table({"k": codes, "v": value})
    right = pa.concat_tables([pa.table({"k": value_codes, "v": c}) for c in columns])
    return left.join(right, keys=["k", "v"], join_type="inner").num_rows == 0


def _taken(schema: pa.Schema, columns: frozenset[str] | None) -> list[str] | None:
    """The relation's columns a lookup copies (``Lookup.columns``, lower case); at least one, so rows count
    (one list shared by every caller: read it, never change it)."""
    if columns is None:
        return None
    # Memoized by schema object (a relation keeps its schema across versions): Schema.names
    # builds a list per call, and every lookup of every refresh asks.
    held = _TAKEN.get((id(schema), columns))
    if held is not None and held[0] is schema:
        return held[1]
    names = schema.names
    taken = [name for name in names if name.lower() in columns]
    found = None if len(taken) == len(names) else taken or names[:1]
    if len(_TAKEN) > 4096:
        _TAKEN.clear()
    _TAKEN[(id(schema), columns)] = (schema, found)
    return found


_TAKEN: dict[tuple[int, frozenset[str]], tuple[pa.Schema, list[str] | None]] = {}


def value_range(values: pa.ChunkedArray, column_type: pa.DataType) -> tuple[pa.Scalar, pa.Scalar] | None:
    """[low, high] around every one of ``values``, to compare a column of ``column_type`` with; None: no range.

    None when a value is NULL (a comparison with it keeps or drops rows
    whatever the column holds) or NaN, or the types do not compare. Numbers of
    different types are compared as doubles, as DuckDB compares a DECIMAL with
    a DOUBLE, and the range is widened by a relative 1e-9 so rounding never
    leaves out a row on its edge: the readers re-check the exact condition.
    """
    if values.null_count:
        return None
    if values.type == column_type and not pa.types.is_floating(column_type):
        if not (pa.types.is_integer(column_type) or pa.types.is_decimal(column_type)
                or pa.types.is_temporal(column_type)):
            return None
        bounds = pc.min_max(values)
        return bounds["min"], bounds["max"]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
               for t in (values.type, column_type)]
    if not all(numeric):
        return None
    doubles = values.cast(pa.float64())
    if pc.any(pc.is_nan(doubles)).as_py():
        return None
    bounds = pc.min_max(doubles)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if np.isfinite(low):
        low -= abs(low) * 1e-9 + 1e-12
    if np.isfinite(high):
        high += abs(high) * 1e-9 + 1e-12
    return pa.scalar(low, pa.float64()), pa.scalar(high, pa.float64())


class SharedLookups:
    """The lookups of one maintenance pass, shared among the views that make the same one.

    Differential dataflow shares one arrangement among every dataflow that
    reads it; here the arrangement is a stored relation's index, and what is
    shared is a probe of it: the views of one pass see one snapshot, so two
    views probing one relation version by the same index with the same probe
    keys (TPC-H's views probing ``orders`` by the ``l_orderkey`` of one
    lineitem delta) get the same rows, and the second reuses the first's
    result. A hit needs the same relation *object* (one version; the entry
    holds it, so its id stays its own), the same index, range and probe
    columns, probe key values equal as Arrow data (a view's delta may be
    another table object holding the same keys), and a held result with every
    column the lookup copies (it is narrowed to them). Results are
    immutable Arrow tables. Entries stop being added past ``budget`` bytes
    of results (memory, not correctness).
    """

    def __init__(self, budget: int = 256 << 20):
        self.budget = budget
        self.held = 0
        self.hits = 0
        # per lookup: [(probe keys, relation, result, its column names)]
        self._found: dict[tuple, list[tuple[pa.Table, object, pa.Table, list[str]]]] = {}

    def lookup(self, step: Lookup, probe: pa.Table, relation, run: Callable[[], pa.Table]) -> pa.Table:
        key = (step.relation, id(relation), step.index, step.positions, step.between,
               step.probe_filter, step.probe_columns, probe.num_rows)
        entries = self._found.setdefault(key, [])
        keys = probe.select(list(step.probe_columns) + ([step.probe_filter] if step.probe_filter else []))
        if entries:  # (names are read once: Table.column_names costs ~1 us a column)
            wanted = _taken(relation.schema, step.columns) or relation.schema.names
            if step.positions:
                wanted = [*wanted, RUN, POS]
            for held_keys, held_relation, result, names in entries:
                # Views read different columns of the rows (narrow_lookups): a result holding them all serves.
                if held_relation is relation and set(wanted) <= set(names) and held_keys.equals(keys):
                    self.hits += 1
                    return result if names == wanted else result.select(wanted)
        result = run()
        if self.held + result.nbytes <= self.budget:
            entries.append((keys, relation, result, result.schema.names))
            self.held += result.nbytes
        return result


def planned_status(step: Query) -> str:
    """How a query step will run, from its SQL alone: on DuckDB and why, or compiled if its types allow."""
    reason = static_reason(step.sql)
    return f"duckdb: {reason}" if reason else "compiled after its first run, if its types allow"


def _dump(step: Query, inputs: dict[str, pa.Table], ours: pa.Table, theirs: pa.Table, difference: str) -> None:
    """With IVM_SHADOW_DUMP=dir, keep a differing step's SQL, inputs and both results there (to replay it)."""
    directory = os.environ.get("IVM_SHADOW_DUMP")
    if not directory:
        return
    import pickle
    from pathlib import Path

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / f"{step.out}-{os.getpid()}-{next(_dumps)}.pickle", "wb") as f:
        pickle.dump({"sql": step.sql, "inputs": inputs, "ours": ours, "theirs": theirs, "difference": difference}, f)


_dumps = itertools.count()


class StepRunner:
    """Runs a program's steps over Arrow temporaries; subclasses run its queries.

    Everything but a Query is engine-neutral (lookups in the relations' numpy
    indexes, stacks in Arrow, loops, the Replace bookkeeping), so every engine
    shares it and differs only in how it runs a Query (``query``).
    """

    engine = "?"

    def __init__(self, coder: KeyCoder):
        self.coder = coder
        # Lookups shared by the views of one maintenance pass (``sharing_lookups``); None: not shared.
        self.shared: SharedLookups | None = None

    @contextmanager
    def sharing_lookups(self):
        """Within the block, a lookup identical to one already run (same relation version, index,
        columns and probe data) returns that result instead of probing again."""
        self.shared = SharedLookups()
        try:
            yield self.shared
        finally:
            self.shared = None

    def run(
        self, program: Program, inputs: dict[str, pa.Table], snapshot: Snapshot, label: str = "",
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[dict[str, pa.Table], list[RowChanges]]:
        """Run the steps; return the temporaries and the row changes of the Replace steps.

        ``progress(done, total)`` is called after each top-level step (backfills report it).
        """
        temps = self._temps(inputs, label)
        # What one run registered with the engine, with the data each name
        # holds (a loop gives a name new data every round).
        registered: dict[str, pa.Table] = {}
        try:
            if progress is None:
                self._steps_run(program.steps, temps, snapshot, registered, label)
            else:
                for done, step in enumerate(program.steps, 1):
                    self._steps_run([step], temps, snapshot, registered, label)
                    progress(done, len(program.steps))
            changes = [self._changes(r, temps, snapshot) for r in program.replaces]
            if program.output is not None:
                temps[program.output] = temps[program.output]  # on the driver before release
        finally:
            self.release(registered)
        return temps, [c for c in changes if c is not None]

    def _temps(self, inputs: dict[str, pa.Table], label: str) -> dict[str, pa.Table]:
        """The run's temporaries, starting with its inputs (engines may hold some lazily)."""
        return dict(inputs)

    def release(self, registered: dict[str, pa.Table]) -> None:
        """Drop what one run registered with the engine."""

    def query(
        self, step: Query, temps: dict[str, pa.Table], snapshot: Snapshot, registered: dict[str, pa.Table], label: str
    ) -> pa.Table:
        raise NotImplementedError

    def _steps_run(self, steps: list[Step], temps: dict[str, pa.Table], snapshot: Snapshot,
                   registered: dict[str, pa.Table], label: str) -> None:
        for step in steps:
            if isinstance(step, Lookup):
                temps[step.out] = self._shared_lookup(step, temps, snapshot)
            elif isinstance(step, Query):
                temps[step.out] = self.query(step, temps, snapshot, registered, label)
            elif isinstance(step, Stack):
                temps[step.out] = self._stack(step, temps)
            elif isinstance(step, Loop):
                self._loop(step, temps, snapshot, registered, label)

    def _loop(self, loop: Loop, temps: dict[str, pa.Table], snapshot: Snapshot,
              registered: dict[str, pa.Table], label: str) -> None:
        """Rounds of the body until ``until`` is empty; see program.Loop."""
        for variable, source in loop.init:
            temps[variable] = temps[source]
        collected: dict[str, list[pa.Table]] = {out: [] for out, _ in loop.collect}
        for _ in range(loop.max_rounds):
            self._steps_run(loop.body, temps, snapshot, registered, label)
            for out, source in loop.collect:
                collected[out].append(temps[source])
            for variable, source in loop.next:
                temps[variable] = temps[source]
            if temps[loop.until].num_rows == 0:
                break
        else:
            prefix = f"{label}: " if label else ""
            raise ExecutionError(
                f"{prefix}{loop.what} did not reach a fixpoint within {loop.max_rounds} rounds "
                "(recursion over a cycle with UNION ALL, or a step that keeps producing new rows)"
            )
        for out, parts in collected.items():
            temps[out] = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]

    # --- steps -----------------------------------------------------------------
    def _shared_lookup(self, step: Lookup, temps: dict[str, pa.Table], snapshot: Snapshot) -> pa.Table:
        if self.shared is None or step.relation not in snapshot:
            return self._lookup(step, temps, snapshot)
        return self.shared.lookup(step, temps[step.probe], snapshot[step.relation],
                                  lambda: self._lookup(step, temps, snapshot))

    def _lookup(self, step: Lookup, temps: dict[str, pa.Table], snapshot: Snapshot) -> pa.Table:
        probe = temps[step.probe]
        relation = snapshot[step.relation]
        columns = _taken(relation.schema, step.columns)
        if not relation.runs:
            # Nothing to find (state on a first computation or a recompute): skip
            # coding the probe, which on those runs is a whole source.
            return relation.lookup(step.index, np.empty(0, np.uint64), step.positions, columns=columns)
        if not step.index:
            if probe.num_rows == 0:
                return relation.lookup(step.index, np.empty(0, np.uint64), step.positions, columns=columns).slice(0, 0)
            if step.between is not None:  # a range narrows the whole relation, when the probe's values give one
                bounds = value_range(probe.column(step.probe_columns[0]), relation.schema.field(step.between).type)
                if bounds is not None:
                    return relation.between(step.between, *bounds, positions=step.positions, columns=columns)
            return relation.all_rows(step.positions, columns)
        if step.probe_filter is not None:
            probe = probe.filter(probe.column(step.probe_filter))
        codes = self.coder.codes(probe.select(list(step.probe_columns)).rename_columns(list(step.index)), step.index)
        return relation.lookup(step.index, codes, step.positions, columns=columns)

    def _skippable(self, drivers: tuple[str, ...], skip: str, temps: dict[str, pa.Table]) -> bool:
        if not drivers:
            return False
        empty = [temps[d].num_rows == 0 for d in drivers]
        return any(empty) if skip == "any" else all(empty)

    def _guarded(self, step: Query, temps: dict[str, pa.Table]) -> bool:
        """True when the step's guard (program.Guard) proves its result empty."""
        guard = step.guard
        if guard is None or not (self._on_driver(guard.probe, temps) and self._on_driver(guard.values, temps)):
            return False
        return guard_empty(guard, temps[guard.probe], temps[guard.values], self.coder)

    def _on_driver(self, name: str, temps: dict[str, pa.Table]) -> bool:
        """True when ``name``'s rows are at hand (engines holding some temporaries elsewhere say no)."""
        return name in temps

    @staticmethod
    def _data(name: str, temps: dict[str, pa.Table], snapshot: Snapshot) -> pa.Table | None:
        if name in temps:
            return temps[name]
        if name.startswith(SCAN_PREFIX):
            return snapshot[name[len(SCAN_PREFIX):]].table()
        return None  # a CTE name, or not ours: DuckDB resolves or reports it

    @staticmethod
    def _stack(step: Stack, temps: dict[str, pa.Table]) -> pa.Table:
        source = temps[step.source]
        parts = []
        for filter_column, weight, columns in step.parts:
            # Only the columns the part takes are filtered (a state merge's result is ~40 wide).
            rows = source.select(list(dict.fromkeys(src for _, src in columns))) if columns else source
            if source.num_rows:
                rows = rows.filter(source.column(filter_column))
            data = {out: rows.column(src) for out, src in columns}
            data[WEIGHT] = pa.array(np.full(rows.num_rows, weight, np.int64))  # also for no columns
            parts.append(pa.table(data))
        return pa.concat_tables(parts)

    def _changes(self, replace: Replace, temps: dict[str, pa.Table], snapshot: Snapshot) -> RowChanges | None:
        runs = np.empty(0, np.int32)
        rows = np.empty(0, np.int64)
        if replace.deletes is not None:
            deleted = temps[replace.deletes]
            if deleted.num_rows:
                found = deleted.select([RUN, POS])
                if found.column(RUN).null_count:
                    found = found.filter(pc.is_valid(found.column(RUN)))
                runs = found.column(RUN).to_numpy()
                rows = found.column(POS).to_numpy()
        inserts = None
        if replace.inserts is not None:
            inserts = temps[replace.inserts]
            if replace.nonnegative and inserts.num_rows and pc.min(inserts.column(WEIGHT)).as_py() < 0:
                raise InternalError(f"relation {replace.relation} would hold a row a negative number of times")
            if replace.keep is not None and inserts.num_rows:
                keep = inserts.column(replace.keep)
                # The relation's columns only, before filtering: the temp may be several times wider.
                names = snapshot[replace.relation].schema.names if replace.relation in snapshot else None
                if names is not None and set(names) <= set(inserts.column_names):
                    inserts = inserts.select(names)
                inserts = inserts.filter(keep)
        if not len(runs) and (inserts is None or inserts.num_rows == 0):
            return None
        return RowChanges(replace.relation, runs, rows, inserts)


class Executor(StepRunner):
    """One per thread: owns a DuckDB cursor and a key coder."""

    engine = "duckdb"
    _ids = itertools.count()

    def __init__(self, connection: duckdb.DuckDBPyConnection, coder: KeyCoder):
        super().__init__(coder)
        self.con = connection
        # Keyed by id(step), holding the step itself: a freed step's id can be
        # reused by a new step (programs are recompiled), which must never find
        # the old step's prepared statement.
        self._steps: dict[int, tuple[Query, StepState]] = {}
        # Step runs by path: compiled, duckdb, fallback (compiled step, batch on DuckDB), shadowed, mismatch;
        # on_probation: the shadowed runs of a step's first SHADOW_RUNS outside shadow mode.
        self.counts: Counter = Counter()

    def step_status(self, step: Query) -> str | None:
        """How a query step runs here: compiled, or on DuckDB and why; None: it has not run here."""
        entry = self._steps.get(id(step))
        state = entry[1] if entry is not None and entry[0] is step else None
        if state is None:
            return None
        if state.compiled is not None:
            text = state.compiled.label
            if state.fallbacks:
                text += f"; {state.fallbacks} batch(es) on DuckDB, last: {state.last_fallback}"
            return text
        if state.reason is not None:
            return f"duckdb: {state.reason}"
        return "duckdb: first run (compiled from the next, if its types allow)"

    def release(self, registered: dict[str, pa.Table]) -> None:
        for name in registered:
            self.con.unregister(name)

    def _state(self, step: Query) -> StepState:
        entry = self._steps.get(id(step))
        if entry is None or entry[0] is not step:
            names = frozenset(t.name for t in step.sql.find_all(exp.Table))
            entry = self._steps[id(step)] = (step, StepState(render(step.sql, DIALECT), names))
        return entry[1]

    def _execute(self, step: Query, temps: dict[str, pa.Table], snapshot: Snapshot, registered: dict[str, pa.Table]) -> pa.Table:
        state = self._state(step)
        state.runs += 1
        if state.runs == 1:
            # A one-off run (first computations run once): plain registrations.
            for name in state.names:
                data = self._data(name, temps, snapshot)
                if data is not None and registered.get(name) is not data:
                    self.con.register(name, data)
                    registered[name] = data
            return duck.arrow(self.con, state.text)
        prepared = state.prepared
        inputs = {name: self._data(name, temps, snapshot) for name in state.names}
        inputs = {name: data for name, data in inputs.items() if data is not None}
        if prepared is None or any(
            not data.schema.equals(prepared.holders[name].schema) for name, data in inputs.items()
        ):
            prepared = state.prepared = self._prepare(step, inputs)
        for name, data in inputs.items():
            prepared.holders[name].table = data
        try:
            return duck.arrow(self.con, f'EXECUTE "{prepared.statement}"')
        finally:
            for holder in prepared.holders.values():
                holder.table = holder.schema.empty_table()  # do not keep batches alive

    def _prepare(self, step: Query, inputs: dict[str, pa.Table]) -> Prepared:
        sid = next(self._ids)
        prepared = Prepared(statement=f"__ivm_stmt{sid}")
        tree = step.sql.copy()
        ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
        for table in tree.find_all(exp.Table):
            name = table.name
            if name in ctes or name not in inputs:
                continue
            holder = prepared.holders.get(name)
            if holder is None:
                holder = prepared.holders[name] = Holder(inputs[name])
                self.con.register(f"__ivm_in{sid}_{name}", holder)
            table.set("this", quoted(f"__ivm_in{sid}_{name}"))
        self.con.execute(f'PREPARE "{prepared.statement}" AS {render(tree, DIALECT)}')
        return prepared

    def query(
        self, step: Query, temps: dict[str, pa.Table], snapshot: Snapshot, registered: dict[str, pa.Table], label: str
    ) -> pa.Table:
        state = self._state(step)
        if state.empty is not None and (self._skippable(step.drivers, step.skip, temps) or self._guarded(step, temps)):
            return state.empty.empty_table()
        if state.compiled is not None:
            result = self._compiled(step, state, temps, snapshot, registered, label)
            if result is not None:
                return result
        result = self._duckdb(step, temps, snapshot, registered, label)
        self.counts["duckdb"] += 1
        if state.empty is None:
            state.empty = result.schema
        if state.compiled is None and state.reason is None:
            self._compile(step, state, self._inputs(state, temps, snapshot), result.schema)
        return result

    def _duckdb(self, step: Query, temps, snapshot: Snapshot, registered, label: str) -> pa.Table:
        try:
            return self._execute(step, temps, snapshot, registered)
        except duckdb.Error as e:
            message = duckdb_message(e)
            if isinstance(e, duckdb.ConversionException) and "to type INT64" in message:
                message += BIGINT_SUM_HINT
            raise ExecutionError(f"{label}: {message}" if label else message) from None

    def _inputs(self, state: StepState, temps: dict[str, pa.Table], snapshot: Snapshot) -> dict[str, pa.Table]:
        found = {name: self._data(name, temps, snapshot) for name in state.names}
        return {name: data for name, data in found.items() if data is not None}

    def _compile(self, step: Query, state: StepState, inputs: dict[str, pa.Table], schema: pa.Schema) -> None:
        """Compile the step for these inputs, typed by DuckDB's result ``schema``; else note why not."""
        schemas = {n: t.schema for n, t in inputs.items()}
        if step.guard is not None and step.guard.result is not None:
            try:  # a MIN/MAX rescan whose guard states its result: computed from it (compiled/extremes.py)
                state.compiled = DeletedExtremes(step.guard, schemas, schema)
                return
            except Unsupported:
                pass  # the general compiled step below
        try:
            state.compiled = CompiledStep(step.sql, schemas, schema)
        except Unsupported as e:
            state.reason = str(e)
        except Exception as e:  # a compiler bug must not stop maintenance; the step stays on DuckDB
            if shadow_mode():
                raise
            log.warning("compiling step %s failed, it runs on DuckDB: %r", step.out, e)
            state.reason = f"compiler error: {e!r}"

    def _compiled(self, step: Query, state: StepState, temps, snapshot: Snapshot, registered,
                  label: str) -> pa.Table | None:
        """The compiled step's result, shadowed while it is new; None: run this batch on DuckDB."""
        inputs = self._inputs(state, temps, snapshot)
        compiled = state.compiled
        if not compiled.fits(inputs):  # new input types: DuckDB types the result again
            state.compiled = None
            return None

        def differs(ours: pa.Table, theirs: pa.Table, difference: str) -> None:
            self.counts["mismatch"] += 1
            _dump(step, inputs, ours, theirs, difference)

        try:
            checked = checked_run(lambda: compiled.run(inputs),
                                  lambda: self._duckdb(step, temps, snapshot, registered, label),
                                  state.shadowed, f"{label}: compiled step {step.out}" if label else
                                  f"compiled step {step.out}", differs)
        except Fallback as e:
            self.counts["fallback"] += 1
            state.fallbacks += 1
            state.last_fallback = str(e)
            return None
        if checked.reference is not None:
            state.shadowed += 1
            self.counts["shadowed"] += 1
            if checked.probation:  # a new step's check, not a setting: this run is no timing of the view's batches
                self.counts["on_probation"] += 1
        if checked.disabled is not None:
            state.compiled, state.reason = None, checked.disabled
        elif checked.rows is not None:
            self.counts["compiled"] += 1
        return checked.rows


def commit_row_changes(changes: list[RowChanges], snapshot: Snapshot, coder: KeyCoder) -> dict[str, Relation]:
    """The new versions of the relations ``changes`` (a program's state changes) delete from and insert into."""
    updated: dict[str, Relation] = {}
    for change in changes:
        relation = updated.get(change.relation) or snapshot[change.relation]
        updated[change.relation] = relation.replace_rows(change.delete_runs, change.delete_rows, change.inserts, coder)
    return updated


def with_program_indexes(program: Program, snapshot: Snapshot, coder: KeyCoder) -> Snapshot:
    """``snapshot`` with every index ``program``'s lookups probe (built where one is missing)."""
    missing = {}
    for spec in program.indexes:
        relation = missing.get(spec.relation) or snapshot[spec.relation]
        if spec.columns not in relation.index_keys:
            missing[spec.relation] = relation.with_index(spec.columns, coder)
    return snapshot.with_changes(missing) if missing else snapshot
