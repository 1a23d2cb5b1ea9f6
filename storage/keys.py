"""Key codes: 64-bit values that equal keys share, for index lookups.

Two keys that are equal (with NULL equal to NULL) always get the same code;
two different keys usually do not. Indexes only ever use codes to find
candidate rows; the SQL that follows re-checks keys exactly, so a collision
costs a little work and never a wrong answer.

A single integer column is its own code (no hashing at all); anything else
is hashed by DuckDB's ``hash()``, which treats -0.0 and 0.0, and all NaNs, as
equal, like its joins and GROUP BY do.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL_CODE = np.uint64(0x9E3779B97F4A7C15)  # any value works: collisions are re-checked


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (sorted distinct values) by sorting.

    numpy 2.4's ``np.unique`` goes through a hash table first: measured on
    this machine, 27,000 codes took 2-85 ms (the table's allocation under
    load) where sorting takes 0.5 ms, and it ran on every lookup and delete
    of a fold (over half of a fold's CPU in the ingest benchmark).
    """
    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


class KeyCoder:
    """Computes key codes; one per thread (it owns a DuckDB cursor)."""

    def __init__(self, run: Callable[..., pa.Table]):
        """``run(template, **inputs)`` executes SQL with ``{name}`` placeholders over Arrow inputs."""
        self._run = run
        self._lock = threading.Lock()

    def codes(self, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
        if table.num_rows == 0:
            return np.empty(0, dtype=np.uint64)
        if not columns:
            return np.zeros(table.num_rows, dtype=np.uint64)
        if len(columns) == 1 and _is_integer(table.schema.field(columns[0]).type):
            return self._integer_codes(table.column(columns[0]))
        return self._hashed(table, columns)

    @staticmethod
    def _integer_codes(col: pa.ChunkedArray) -> np.ndarray:
        target = pa.uint64() if pa.types.is_unsigned_integer(col.type) else pa.int64()
        values = pc.cast(col, target)
        if values.null_count:
            filled = pc.fill_null(values, pa.scalar(0, target))
            codes = filled.to_numpy().view(np.uint64).copy()
            codes[pc.is_null(values).to_numpy(zero_copy_only=False)] = NULL_CODE
            return codes
        return np.ascontiguousarray(values.to_numpy()).view(np.uint64)

    def _hashed(self, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
        cols = ", ".join('"' + c.replace('"', '""').replace("{", "{{").replace("}", "}}") + '"' for c in columns)
        with self._lock:
            result = self._run(f"SELECT hash({cols}) AS h FROM {{keys}}", keys=table.select(list(columns)))
        return np.asarray(result.column(0).to_numpy(), dtype=np.uint64)
