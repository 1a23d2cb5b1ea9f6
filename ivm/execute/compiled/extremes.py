"""The groups whose old MIN/MAX a batch deleted, computed from the rescan step's Guard.

A MIN/MAX aggregate re-scans a group when a row it deleted held the group's
old extreme (delta_operators/aggregate.py ``_rescan``)::

    SELECT DISTINCT n.k, TRUE AS __rescan
    FROM changed n JOIN old o ON n.k IS NOT DISTINCT FROM o.k
    WHERE n.__weight <= 0 AND (n.v = o.__m0 OR n.v = o.__m1 ...)

The rule states that result in the step's ``Guard`` (``result`` set): the
distinct keys of the probe rows with WEIGHT <= 0 whose value equals one of
their group's old extremes. As a general compiled step it is a join, a
filter and a DISTINCT (~0.9 ms a batch for bench.core's per_customer, whose
MAX it serves); here it is a lookup of each deleted row's group in the old
state by its key, one comparison per extreme and a unique of the keys hit.

Exact only where the parts compare exactly in numpy/Arrow, decided from the
input schemas when the step compiles (else the general compiled step runs
it): one key column of an integer type, alike on both sides (NULL keys
match NULL keys, as IS NOT DISTINCT FROM does); the value and the extremes
of one type, compared as SQL's ``=`` (doubles: NaN = NaN and -0.0 = 0.0,
as DuckDB; a NULL matches nothing). The old state holds one row per group:
a key found twice hands the batch to DuckDB (``Fallback``). Shadow runs
check it against DuckDB like every compiled step.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from delta_operators.program import Guard
from storage.zset import WEIGHT
from ivm.execute.compiled.vectors import Fallback, Unsupported
from storage.buffers import fixed_width_values, one_array


class DeletedExtremes:
    """``CompiledStep``'s interface (``fits``, ``run``) for a rescan step whose Guard states its result."""

    label = "compiled: deleted extremes matched on the driver"  # what EXPLAIN says of the step

    def __init__(self, guard: Guard, schemas: dict[str, pa.Schema], expected: pa.Schema):
        if guard.result is None:
            raise Unsupported("the guard does not state the step's result")
        if len(guard.keys) != 1:
            raise Unsupported("a rescan by several key columns")
        if guard.probe not in schemas or guard.values not in schemas:
            raise Unsupported("the rescan's inputs are not the step's")
        probe, values = schemas[guard.probe], schemas[guard.values]
        key = guard.keys[0]
        for schema in (probe, values):
            if key not in schema.names:
                raise Unsupported(f"key {key} missing from an input")
        key_type = probe.field(key).type
        if not pa.types.is_integer(key_type) or values.field(key).type != key_type:
            raise Unsupported(f"rescan key of type {key_type}")
        value_type = probe.field(guard.column).type
        if any(values.field(c).type != value_type for c in guard.value_columns):
            raise Unsupported("extremes of another type than the value")
        if pa.types.is_nested(value_type) or pa.types.is_dictionary(value_type) or pa.types.is_null(value_type):
            raise Unsupported(f"rescan value of type {value_type}")
        want = pa.schema([pa.field(key, key_type), pa.field(guard.result, pa.bool_())])
        if not expected.equals(want):
            raise Unsupported(f"result {expected} where {want} was expected")
        self.guard, self.key, self.expected = guard, key, expected
        self.floating = pa.types.is_floating(value_type)
        self.schemas = {guard.probe: probe, guard.values: values}

    def fits(self, inputs: dict[str, pa.Table]) -> bool:
        return all(inputs[name].schema.equals(schema) for name, schema in self.schemas.items())

    def run(self, inputs: dict[str, pa.Table]) -> pa.Table:
        g = self.guard
        probe, values = inputs[g.probe], inputs[g.values]
        weights = one_array(probe.column(WEIGHT)).to_numpy(zero_copy_only=False)
        deleted = np.flatnonzero(weights <= 0)
        if not len(deleted) or not values.num_rows:
            return self.expected.empty_table()
        found = self._in_numpy(probe, values, deleted)
        if found is not None:
            return found
        keys = one_array(probe.column(self.key)).take(pa.array(deleted))
        at = _positions(keys, one_array(values.column(self.key)))
        found = np.flatnonzero(at >= 0)
        if not len(found):
            return self.expected.empty_table()
        rows, at = deleted[found], at[found]
        value = one_array(probe.column(g.column)).take(pa.array(rows))
        hit = np.zeros(len(rows), dtype=bool)
        for name in g.value_columns:
            hit |= _equal(value, one_array(values.column(name)).take(pa.array(at)), self.floating)
        if not hit.any():
            return self.expected.empty_table()
        hit_keys = keys.take(pa.array(found[hit]))
        distinct = pc.unique(hit_keys)  # a NULL key once, like DISTINCT
        return pa.Table.from_arrays([distinct, pa.array(np.ones(len(distinct), dtype=bool))], schema=self.expected)


    def _in_numpy(self, probe: pa.Table, values: pa.Table, deleted: np.ndarray) -> pa.Table | None:
        """``run``'s result computed over numpy views of the columns, where none holds a NULL (the usual
        delta and state); None otherwise (``run`` goes on in Arrow)."""
        g = self.guard
        columns = [probe.column(self.key), probe.column(g.column), values.column(self.key)]
        columns += [values.column(name) for name in g.value_columns]
        arrays = [one_array(c) for c in columns]
        if any(a.null_count or not _fixed_width(a.type) for a in arrays):
            return None
        keys, value, stored, *extremes = (fixed_width_values(a) for a in arrays)
        order = np.argsort(stored, kind="stable")
        ordered = stored[order]
        if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
            raise Fallback("the old state holds a group twice")
        deleted_keys = keys[deleted]
        at = np.minimum(np.searchsorted(ordered, deleted_keys), len(ordered) - 1)
        found = ordered[at] == deleted_keys
        rows, at = deleted[found], order[at[found]]
        value = value[rows]
        hit = np.zeros(len(rows), dtype=bool)
        for extreme in extremes:
            other = extreme[at]
            hit |= (value == other) | (np.isnan(value) & np.isnan(other)) if self.floating else value == other
        distinct = np.unique(keys[rows[hit]])
        return pa.Table.from_arrays([pa.array(distinct, self.expected.field(0).type),
                                     pa.array(np.ones(len(distinct), dtype=bool))], schema=self.expected)


def _fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _positions(keys: pa.Array, stored: pa.Array) -> np.ndarray:
    """For each of ``keys``, the row of ``stored`` with the same key (NULL: the NULL key), or -1."""
    stored_valid = np.ones(len(stored), bool) if not stored.null_count else \
        stored.is_valid().to_numpy(zero_copy_only=False)
    stored_values = stored.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    valid_rows = np.flatnonzero(stored_valid)
    order = valid_rows[np.argsort(stored_values[valid_rows], kind="stable")]
    ordered = stored_values[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        raise Fallback("the old state holds a group twice")
    null_rows = np.flatnonzero(~stored_valid)
    if len(null_rows) > 1:
        raise Fallback("the old state holds the NULL group twice")
    key_valid = np.ones(len(keys), bool) if not keys.null_count else keys.is_valid().to_numpy(zero_copy_only=False)
    key_values = keys.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(ordered):
        lo = np.minimum(np.searchsorted(ordered, key_values), len(ordered) - 1)
        same = (ordered[lo] == key_values) & key_valid
        out[same] = order[lo[same]]
    if len(null_rows):
        out[~key_valid] = null_rows[0]
    return out


def _equal(a: pa.Array, b: pa.Array, floating: bool) -> np.ndarray:
    """SQL ``a = b`` per row, NULL as false; doubles as DuckDB compares them (NaN = NaN, -0.0 = 0.0)."""
    if floating:
        x = a.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        y = b.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        equal = (x == y) | (np.isnan(x) & np.isnan(y))
        if a.null_count or b.null_count:
            equal &= a.is_valid().to_numpy(zero_copy_only=False) & b.is_valid().to_numpy(zero_copy_only=False)
        return equal
    return pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
