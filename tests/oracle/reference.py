"""Keeping a plain DuckDB copy of a keyed table in step with the CDC batches a test sends ivm."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow as pa


def apply_cdc(con: duckdb.DuckDBPyConnection, table: str, key: str, changes: pa.Table) -> None:
    """Apply ``changes`` (rows with ``__op``) to ``table``, as ivm applies them to a keyed table.

    ``d`` removes the row with that key; ``c``, ``r`` and ``u`` leave exactly
    the given row under its key. A key appears at most once per batch here,
    so the order of the rows does not matter. The table's columns must be the
    batch's, in the same order.
    """
    keys = changes.column(key).to_pylist()
    repeated = [k for k, n in Counter(keys).items() if n > 1]
    assert not repeated, f"a key changes at most once per batch here: {repeated}"
    rows = changes.drop_columns(["__op"])
    kept = pa.array([op != "d" for op in changes.column("__op").to_pylist()], pa.bool_())
    con.register("__cdc_rows", rows)
    con.register("__cdc_kept", rows.filter(kept))
    try:
        con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM __cdc_rows)")
        con.execute(f"INSERT INTO {table} SELECT * FROM __cdc_kept")
    finally:
        con.unregister("__cdc_rows")
        con.unregister("__cdc_kept")
