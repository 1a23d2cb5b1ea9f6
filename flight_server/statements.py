"""Statements with bound parameters, as both doors run them (Flight SQL and pgwire).

A door receives a SQL text once (prepare) and values many times (bind,
execute). What it needs from the text — how many parameters, whether it
returns rows, its result schema — is found once per distinct text (or per
catalog version, for the schema) and cached here. Values reach the SQL only
through ``flight_server.params`` (literals rendered by sqlglot, never pasted
text); a query with values goes through ``Database.bound_query`` so a point
read is answered without DuckDB.
"""

from __future__ import annotations

import pyarrow as pa

import ivm
from flight_server import params
from flight_server.sessions import Lru
from sql_frontend.errors import BindError


class Shapes:
    """(parameters, returns rows) of SQL texts, and parameterized result schemas, cached."""

    def __init__(self, db: ivm.Database, limit: int = 1024):
        self.db = db
        self._shapes: Lru[str, tuple[int, bool]] = Lru(limit)
        self._schemas: Lru[tuple[str, int, tuple], bytes | pa.Schema] = Lru(limit)

    def shape(self, sql: str) -> tuple[int, bool]:
        """(parameters, is a query) of a SQL text: parsed once per distinct text."""
        shape = self._shapes.get(sql)
        if shape is None:
            shape = self._shapes.put(sql, (params.count(sql), self.db.is_query(sql)))
        return shape

    def schema(self, sql: str, count: int, types: tuple[pa.DataType, ...] = ()) -> pa.Schema | None:
        """The result schema of a query with ``count`` parameters, typed as NULLs of ``types`` (default NULL).

        None when it cannot be found before the values are known (the error,
        if any, is reported when the statement runs).
        """
        key = (sql, self.db.catalog_version, types)
        schema = self._schemas.get(key)
        if schema is None:
            kinds = list(types) + [pa.null()] * (count - len(types))
            nulls = pa.record_batch([pa.nulls(1, kind) for kind in kinds[:count]], names=[str(i) for i in range(count)])
            try:
                schema = self.db.result_schema(params.bind(sql, nulls, 0))
            except ivm.IvmError:
                schema = b""
            self._schemas.put(key, schema)
        return schema if isinstance(schema, pa.Schema) else None


def run_query(db: ivm.Database, sql: str, parameters: int, bound: pa.RecordBatch | None) -> pa.Table:
    """Run a query with its one row of bound values (``$n`` is column n-1)."""
    if parameters == 0:
        return db.sql(sql)
    if bound is None:
        raise BindError(f"the statement takes {parameters} parameter(s); none were bound")
    if bound.num_rows != 1:
        raise BindError(f"a query takes one row of parameters, not {bound.num_rows}")
    values = [column[0] for column in bound.columns]
    # The text is rendered only if DuckDB runs it (a point read is answered from the values).
    return db.bound_query(params.numbered(sql), lambda: params.bind(sql, bound, 0), values)


def run_update(db: ivm.Database, sql: str, parameters: int, values: pa.Table | pa.RecordBatch | None) -> int:
    """Run a statement that returns no rows, once per row of values (one INSERT for all rows when it can be)."""
    if parameters == 0:
        return db.execute(sql)
    given = 0 if values is None else values.num_columns
    if given != parameters:
        raise BindError(f"the statement takes {parameters} parameter(s), {given} were bound")
    if not values.num_rows:
        return 0
    if isinstance(values, pa.Table):
        values = values.combine_chunks().to_batches()[0]
    # One INSERT for all rows when possible (atomic); otherwise each row runs as its own statement, in order.
    return sum(db.execute(text) for text in params.bind_rows(sql, values))
