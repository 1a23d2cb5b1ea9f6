"""Integrating a view's change stream: sum the weights of equal rows.

A consumer of ``Database.changes`` or of a Flight subscription holds this
state; after integrating every change up to offset N it must equal the view
read at offset N (compared as multisets with tests.oracle.compare).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

META = ("__weight", "__offset")


def _key(value: Any) -> Any:
    # SQL groups NaN with NaN and -0.0 with 0.0; so does the consolidation.
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value + 0.0
    return value


class Integrator:
    def __init__(self) -> None:
        self.weights: dict[tuple, int] = {}
        self.rows: dict[tuple, tuple] = {}
        self.names: list[str] | None = None
        self.last_offset = 0

    def add(self, changes: pa.Table) -> None:
        names = [n for n in changes.column_names if n not in META]
        self.names = names
        columns = [changes.column(n).to_pylist() for n in names]
        weights = changes.column("__weight").to_pylist()
        for i, row in enumerate(zip(*columns)) if columns else []:
            key = tuple(map(_key, row))
            total = self.weights.get(key, 0) + weights[i]
            if total == 0:
                self.weights.pop(key, None)
                self.rows.pop(key, None)
            else:
                self.weights[key] = total
                self.rows[key] = row
        if changes.num_rows:
            self.last_offset = max(self.last_offset, max(changes.column("__offset").to_pylist()))

    def negative(self) -> list[tuple]:
        return [self.rows[k] for k, w in self.weights.items() if w < 0]

    def table(self, schema: pa.Schema) -> pa.Table:
        """The integrated rows (each repeated by its weight) with ``schema``."""
        rows = [self.rows[k] for k, w in self.weights.items() for _ in range(w)]
        columns = list(zip(*rows)) if rows else [[] for _ in schema]
        return pa.table([pa.array(list(c), f.type) for c, f in zip(columns, schema)], schema=schema)
