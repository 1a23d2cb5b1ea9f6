"""Run delta programs on DuckDB over one snapshot of the stored relations.

Queries run in DuckDB over Arrow temporaries (zero-copy); lookups run against
the relations' indexes in numpy. Nothing is modified here: the Replace steps
come back as row deletions and insertions for the caller to commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.errors import ExecutionError, InternalError
from sql_frontend.plan_sql import render
from delta_operators.program import Check, Lookup, Program, Query, Replace, scan_name

SCAN_PREFIX = scan_name("")
from delta_operators.zset import POS, RUN, WEIGHT
from storage.keys import KeyCoder
from storage.store import Snapshot

DIALECT = "duckdb"


@dataclass
class RowChanges:
    """Deletions (by run and row position) and insertions for one relation."""

    relation: str
    delete_runs: np.ndarray
    delete_rows: np.ndarray
    inserts: pa.Table | None


@dataclass
class CompiledStep:
    text: str
    names: frozenset[str]  # temps and scans the SQL reads


def duckdb_message(error: Exception) -> str:
    return str(error).strip().split("\n\nLINE")[0].split("\nLINE")[0].strip()


class Executor:
    """One per thread: owns a DuckDB cursor and a key coder."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, coder: KeyCoder):
        self.con = connection
        self.coder = coder
        self._compiled: dict[int, CompiledStep] = {}
        self._empty_schemas: dict[int, pa.Schema] = {}

    def _compile(self, step: Query | Check) -> CompiledStep:
        key = id(step)
        compiled = self._compiled.get(key)
        if compiled is None:
            names = frozenset(t.name for t in step.sql.find_all(exp.Table))
            compiled = CompiledStep(render(step.sql, DIALECT), names)
            self._compiled[key] = compiled
        return compiled

    def run(
        self, program: Program, inputs: dict[str, pa.Table], snapshot: Snapshot, label: str = ""
    ) -> tuple[dict[str, pa.Table], list[RowChanges]]:
        temps: dict[str, pa.Table] = dict(inputs)
        registered: set[str] = set()  # names registered on this cursor for this run
        try:
            for step in program.steps:
                if isinstance(step, Lookup):
                    temps[step.out] = self._lookup(step, temps, snapshot)
                elif isinstance(step, Query):
                    temps[step.out] = self._query(step, temps, snapshot, registered, label)
                elif isinstance(step, Check):
                    self._check(step, temps, snapshot, registered, label)
        finally:
            for name in registered:
                self.con.unregister(name)
        changes = [self._changes(r, temps) for r in program.replaces]
        return temps, [c for c in changes if c is not None]

    # --- steps -----------------------------------------------------------------
    def _lookup(self, step: Lookup, temps: dict[str, pa.Table], snapshot: Snapshot) -> pa.Table:
        probe = temps[step.probe]
        relation = snapshot[step.relation]
        if not step.index:
            if probe.num_rows == 0:
                return relation.lookup(step.index, np.empty(0, np.uint64), step.positions).slice(0, 0)
            return relation.all_rows(step.positions)
        codes = self.coder.codes(probe.select(list(step.probe_columns)).rename_columns(list(step.index)), step.index)
        return relation.lookup(step.index, codes, step.positions)

    def _skippable(self, drivers: tuple[str, ...], skip: str, temps: dict[str, pa.Table]) -> bool:
        if not drivers:
            return False
        empty = [temps[d].num_rows == 0 for d in drivers]
        return any(empty) if skip == "any" else all(empty)

    def _prepare(self, compiled: CompiledStep, temps: dict[str, pa.Table], snapshot: Snapshot, registered: set[str]) -> str:
        """Register every temp and relation scan the SQL reads (once per run).

        Registrations belong to this cursor alone and are removed when the run
        ends, so programs on other threads cannot see them.
        """
        for name in compiled.names - registered:
            if name in temps:
                data = temps[name]
            elif name.startswith(SCAN_PREFIX):
                data = snapshot[name[len(SCAN_PREFIX):]].table()
            else:
                continue  # not ours: DuckDB will report it
            self.con.register(name, data)
            registered.add(name)
        return compiled.text

    def _query(
        self, step: Query, temps: dict[str, pa.Table], snapshot: Snapshot, registered: set[str], label: str
    ) -> pa.Table:
        compiled = self._compile(step)
        if self._skippable(step.drivers, step.skip, temps):
            schema = self._empty_schemas.get(id(step))
            if schema is not None:
                return schema.empty_table()
        text = self._prepare(compiled, temps, snapshot, registered)
        try:
            result = self.con.sql(text).to_arrow_table()
        except duckdb.Error as e:
            raise ExecutionError(f"{label}: {duckdb_message(e)}" if label else duckdb_message(e)) from None
        if id(step) not in self._empty_schemas:
            self._empty_schemas[id(step)] = result.schema
        return result

    def _check(
        self, step: Check, temps: dict[str, pa.Table], snapshot: Snapshot, registered: set[str], label: str
    ) -> None:
        if self._skippable(step.drivers, "any", temps):
            return
        text = self._prepare(self._compile(step), temps, snapshot, registered)
        if self.con.sql(text).fetchone() is not None:
            raise InternalError(f"{label}: {step.message}")

    def _changes(self, replace: Replace, temps: dict[str, pa.Table]) -> RowChanges | None:
        runs = np.empty(0, np.int32)
        rows = np.empty(0, np.int64)
        if replace.deletes is not None:
            deleted = temps[replace.deletes]
            if deleted.num_rows:
                valid = pc.is_valid(deleted.column(RUN))
                found = deleted.filter(valid)
                runs = found.column(RUN).to_numpy()
                rows = found.column(POS).to_numpy()
        inserts = None
        if replace.inserts is not None:
            inserts = temps[replace.inserts]
            if replace.nonnegative and inserts.num_rows and pc.min(inserts.column(WEIGHT)).as_py() < 0:
                raise InternalError(f"relation {replace.relation} would hold a row a negative number of times")
            if replace.keep is not None and inserts.num_rows:
                inserts = inserts.filter(inserts.column(replace.keep))
        if not len(runs) and (inserts is None or inserts.num_rows == 0):
            return None
        return RowChanges(replace.relation, runs, rows, inserts)
