"""A delta program's Query step compiled once into our operators, checked against DuckDB.

``CompiledStep(sql, schemas, expected)`` builds the physical operators for
one step (relational.py) for the input schemas it has, and checks that its
output has exactly the names and Arrow types DuckDB's binder gave the same
step (``expected``: the schema of a DuckDB run), so DuckDB types the result
once and the compiled step keeps to it. ``CompiledStep.run`` takes and
returns Arrow; a ``Fallback`` from it means: run this batch on DuckDB.

Where every operator and expression of the step can be written out, the
step also has a generated function (generated.py) that ``run`` uses; its
``Fallback`` sends the batch to the closures, and in shadow mode
(IVM_SHADOW=1) both run and must agree (a difference raises).

``same_rows`` is the shadow-mode comparison: rows as multisets, types
exactly; DOUBLE columns within a relative 1e-9 (and 1e-9 absolute near 0),
because sums in a different order legitimately differ in the last bits.

``checked_run`` is the one policy under which a compiled result is trusted,
for every user of compiled operators (a delta program's steps, a computed
view's projection): checked against DuckDB on its first ``SHADOW_RUNS``
runs, and on every run in shadow mode (IVM_SHADOW=1), where a difference or
an error raises; outside shadow mode either turns the compiled path off.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from ivm.execute.compiled import generated
from sql_frontend.errors import InternalError
from ivm.execute.compiled.relational import compile_query
from ivm.execute.compiled.vectors import Fallback, Unsupported, arrow_type

log = logging.getLogger("ivm.compiled")

__all__ = ["CompiledStep", "Fallback", "Unsupported", "same_rows", "static_reason"]

# Node types the compiled set may hold; anything else names the step's reason to stay on DuckDB.
SUPPORTED_NODES = (
    exp.Select, exp.Union, exp.With, exp.CTE, exp.TableAlias, exp.From, exp.Join, exp.Where, exp.Group,
    exp.Having, exp.Distinct, exp.Table, exp.Subquery, exp.Exists, exp.Identifier, exp.Column, exp.Star,
    exp.Alias, exp.Paren, exp.Literal, exp.Boolean, exp.Null, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.EQ,
    exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.And, exp.Or, exp.Not,
    exp.Is, exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Cast, exp.DataType, exp.DataTypeParam,
    exp.IsNan, exp.IntDiv, exp.Mod, exp.Interval, exp.Var, exp.Like, exp.Extract, exp.Between, exp.In,
    exp.Substring,
    exp.Count, exp.Sum, exp.Min, exp.Max,
    exp.LogicalAnd, exp.LogicalOr, exp.Order, exp.Ordered, exp.Limit, exp.Offset, exp.Except, exp.Intersect,
    exp.Window, exp.WindowSpec,
)
FUNCTIONS = {"ISFINITE", "ISNAN", "GREATEST", "LEAST"}


def static_reason(sql: exp.Expression) -> str | None:
    """Why a step cannot be compiled, from its SQL alone (None: it may be; types decide at its first run)."""
    for node in sql.walk():
        if isinstance(node, exp.Anonymous):
            if str(node.this).upper() not in FUNCTIONS:
                return f"function {str(node.this).upper()}"
        elif isinstance(node, exp.Like) and node.args.get("escape") is not None:
            return "LIKE ... ESCAPE"
        elif not isinstance(node, SUPPORTED_NODES):
            return f"{type(node).__name__} ({node.sql(dialect='duckdb')[:40]})"
    return None


class CompiledStep:
    """One query compiled for given input schemas; ``run`` maps input tables to DuckDB's result schema."""

    label = "compiled"  # what EXPLAIN says of the step

    def __init__(self, sql: exp.Expression, schemas: dict[str, pa.Schema], expected: pa.Schema):
        reason = static_reason(sql)
        if reason is not None:
            raise Unsupported(reason)
        self.schemas = schemas
        self.rel, names = compile_query(sql, schemas)
        self.expected = expected
        if names != expected.names:
            raise Unsupported(f"output names {names} differ from DuckDB's {expected.names}")
        self.casts: dict[int, pa.DataType] = {}
        for i, ((_, _, t), field) in enumerate(zip(self.rel.shape.columns, expected)):
            ours = _arrow_type(t)
            if ours == field.type:
                continue
            if _lossless(ours, field.type):
                self.casts[i] = field.type
            else:
                raise Unsupported(f"column {field.name}: {t} here, {field.type} in DuckDB")
        # The step as one generated function (None: some part of it is not covered; closures only).
        self.generated, self.source, self.why_not_generated = None, None, None
        try:
            self.generated, self.source = generated.build(self.rel, names)
            self.label = "compiled: generated"
        except Unsupported as e:
            self.why_not_generated = str(e)

    def fits(self, inputs: dict[str, pa.Table]) -> bool:
        """True when the inputs have the schemas this step was compiled for."""
        return all(inputs[name].schema.equals(schema) for name, schema in self.schemas.items())

    def run(self, inputs: dict[str, pa.Table]) -> pa.Table:
        if self.generated is None:
            return self.run_closures(inputs)
        try:
            ours = self._table(self.generated(inputs))
        except Fallback:  # a batch the generated checks refuse: the closures decide (DuckDB, if they refuse too)
            return self.run_closures(inputs)
        if shadow_mode():
            try:
                reference = self.run_closures(inputs)
            except Fallback:
                return ours  # the executor compares it with DuckDB
            difference = same_rows(ours, reference)
            if difference is not None:
                raise InternalError(f"generated step differs from its closures: {difference}\n{self.source}")
        return ours

    def run_closures(self, inputs: dict[str, pa.Table]) -> pa.Table:
        """The step computed by the operators' closures (the reference for the generated function)."""
        frame = self.rel.run(dict(inputs))
        return self._table([vec.arrow() for vec in frame.cols])

    def _table(self, arrays: list[pa.Array]) -> pa.Table:
        if not arrays:
            return self.expected.empty_table()
        for i, target in self.casts.items():
            arrays[i] = arrays[i].cast(target)
        return pa.Table.from_arrays(arrays, schema=self.expected)


def shadow_mode() -> bool:
    """IVM_SHADOW=1: every compiled step run is checked against DuckDB (differences raise)."""
    return os.environ.get("IVM_SHADOW", "") not in ("", "0")


SHADOW_RUNS = 3  # a compiled path's first runs also run on DuckDB and must agree


@dataclass(frozen=True)
class Checked:
    """What ``checked_run`` found. ``rows``: the result to use (DuckDB's after a difference; None
    after an error: run DuckDB). ``disabled``: why the compiled path is off from now on (None: it
    stays). ``reference``: DuckDB's rows when this run was checked (None: not checked).
    ``probation``: it was checked because the path is new (its first SHADOW_RUNS runs), not because
    shadow mode checks every run."""

    rows: pa.Table | None
    disabled: str | None = None
    reference: pa.Table | None = None
    difference: str | None = None
    probation: bool = False


def checked_run(run: Callable[[], pa.Table], duckdb_rows: Callable[[], pa.Table], checks: int, what: str,
                differs: Callable[[pa.Table, pa.Table, str], None] | None = None) -> Checked:
    """``run()`` (a compiled path) under the trust policy: checked against ``duckdb_rows()`` while it
    has been checked fewer than SHADOW_RUNS times (``checks``), and always in shadow mode. In shadow
    mode a difference raises InternalError and an error propagates; otherwise either disables the
    path (logged, naming ``what``). ``differs(ours, theirs, difference)`` is told of a difference
    first (to count or keep it). A ``Fallback`` from ``run`` propagates: this run only goes to DuckDB."""
    shadow = shadow_mode()
    try:
        ours = run()
    except Fallback:
        raise
    except Exception as e:  # a compiler bug must not stop maintenance or reads: DuckDB from now on
        if shadow:
            raise
        log.warning("%s failed, it runs on DuckDB from now on: %r", what, e)
        return Checked(None, disabled=f"disabled after an error: {e!r}")
    if not shadow and checks >= SHADOW_RUNS:
        return Checked(ours)
    theirs = duckdb_rows()
    difference = same_rows(ours, theirs)
    if difference is None:
        return Checked(ours, reference=theirs, probation=not shadow)
    if differs is not None:
        differs(ours, theirs, difference)
    if shadow:
        raise InternalError(f"{what} differs from DuckDB: {difference}")
    log.warning("%s differs from DuckDB, it runs on DuckDB from now on: %s", what, difference)
    return Checked(theirs, disabled=f"shadow run differed: {difference}", reference=theirs, difference=difference,
                   probation=True)


def _arrow_type(t) -> pa.DataType:
    return arrow_type(t)


def _lossless(ours: pa.DataType, theirs: pa.DataType) -> bool:
    pairs = {(pa.string(), pa.large_string()), (pa.large_string(), pa.string()),
             (pa.binary(), pa.large_binary()), (pa.large_binary(), pa.binary())}
    return (ours, theirs) in pairs


def same_rows(ours: pa.Table, theirs: pa.Table) -> str | None:
    """None when both tables hold the same rows (as multisets) with the same types; else the difference."""
    if not ours.schema.equals(theirs.schema):
        return f"types differ: {ours.schema} vs {theirs.schema}"
    if ours.num_rows != theirs.num_rows:
        return f"{ours.num_rows} rows compiled, {theirs.num_rows} on DuckDB"
    if ours.num_rows == 0:
        return None
    positions = [f"c{i}" for i in range(ours.num_columns)]  # names may repeat (SELECT * of a join)
    ours, theirs = ours.rename_columns(positions), theirs.rename_columns(positions)
    names = positions
    # Arrow cannot sort intervals or nested values: compare their text instead (shadow runs only).
    for i, field in enumerate(ours.schema):
        if not _sortable(field.type):
            ours, theirs = (t.set_column(i, pa.field(positions[i], pa.string()), _as_text(t.column(i)))
                            for t in (ours, theirs))
    floats = [n for n in names if pa.types.is_floating(ours.schema.field(n).type)]
    exact = [n for n in names if n not in floats]
    order = [(n, "ascending") for n in exact + floats]
    a = ours.take(pc.sort_indices(ours, sort_keys=order))
    b = theirs.take(pc.sort_indices(theirs, sort_keys=order))
    for n in exact:
        x, y = a.column(n), b.column(n)
        if not x.equals(y):
            return f"column {n} differs: {x.to_pylist()[:8]} vs {y.to_pylist()[:8]}"
    for n in floats:
        x = a.column(n).to_numpy(zero_copy_only=False).astype(np.float64)
        y = b.column(n).to_numpy(zero_copy_only=False).astype(np.float64)
        nx, ny = np.asarray(a.column(n).is_null()), np.asarray(b.column(n).is_null())
        if not (nx == ny).all():
            return f"column {n}: NULLs differ"
        x, y = x[~nx], y[~ny]
        both_nan = np.isnan(x) & np.isnan(y)
        with np.errstate(all="ignore"):
            close = (x == y) | both_nan | (np.abs(x - y) <= 1e-9 * np.maximum(np.abs(x), np.abs(y)) + 1e-9)
        if not close.all():
            i = int(np.flatnonzero(~close)[0])
            return f"column {n} differs: {x[i]!r} vs {y[i]!r}"
    return None


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_interval(t) or pa.types.is_nested(t) or pa.types.is_dictionary(t)
                or pa.types.is_null(t))


def _as_text(column: pa.ChunkedArray) -> pa.Array:
    """A column Arrow cannot sort, as text that is equal exactly when the values are (NULL stays NULL)."""
    return pa.array([None if v is None else repr(v) for v in column.to_pylist()], pa.string())
