"""DuckDB's binder over empty copies of the catalog's relations.

Views are defined in DuckDB's SQL, so DuckDB itself is the authority on what
a SELECT means: which names resolve, what type every expression has, what
the output columns are called. The binder keeps one empty table per catalog
relation in a private in-memory database and asks DuckDB to DESCRIBE
queries over them. It never holds data.
"""

from __future__ import annotations

import threading
from typing import Sequence

import duckdb
import pyarrow as pa

from ivm.execute import duck
from sql_frontend.errors import AccessDeniedError, BindError, UnknownObjectError, UnsupportedError
from sql_frontend.plan import Column


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _message(error: Exception) -> str:
    text = str(error).strip()
    # "Binder Error: Referenced column "x" not found..." -> keep DuckDB's words,
    # drop the LINE/caret decoration that follows.
    return text.split("\n\nLINE")[0].split("\nLINE")[0].strip()


class Binder:
    def __init__(self) -> None:
        self._con = duck.connect(1)  # no temp directory: it holds empty tables
        self._lock = threading.Lock()
        self._aggregates: frozenset[str] | None = None

    def close(self) -> None:
        self._con.close()

    def _execute(self, sql: str, params: Sequence | None = None):
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def describe(self, sql: str) -> tuple[Column, ...]:
        try:
            rows = self._execute(f"DESCRIBE {sql}")
        except duckdb.PermissionException as e:  # a file or URL (ivm/execute/duck.py): sql_frontend/access.py missed it
            raise AccessDeniedError(_message(e)) from None
        except duckdb.CatalogException as e:
            message = _message(e)
            if "Table with name" in message:
                raise UnknownObjectError(message) from None
            raise BindError(message) from None  # unknown functions and types
        except duckdb.Error as e:
            raise BindError(_message(e)) from None
        return tuple(Column(name, type_) for name, type_, *_ in rows)

    def normalize_type(self, type_sql: str) -> str:
        """DuckDB's canonical spelling of a type (``TEXT`` -> ``VARCHAR``)."""
        try:
            return self.describe(f"SELECT CAST(NULL AS {type_sql}) AS x")[0].type
        except BindError as e:
            raise BindError(f"unknown type {type_sql}: {e}") from None

    def create(self, name: str, columns: Sequence[Column]) -> None:
        cols = ", ".join(f"{quote(c.name)} {c.type}" for c in columns)
        try:
            self._execute(f"CREATE TABLE {quote(name)} ({cols})")
        except duckdb.Error as e:
            raise BindError(_message(e)) from None

    def drop(self, name: str) -> None:
        self._execute(f"DROP TABLE IF EXISTS {quote(name)}")

    def arrow_schema(self, columns: Sequence[Column]) -> pa.Schema:
        """The Arrow schema DuckDB produces for these column types."""
        if not columns:
            return pa.schema([])
        select = ", ".join(f"CAST(NULL AS {c.type}) AS {quote(c.name)}" for c in columns)
        with self._lock:
            return self._con.sql(f"SELECT {select} LIMIT 0").to_arrow_table().schema

    def check_round_trip(self, column: Column) -> None:
        """Reject types that do not come back unchanged from Arrow (stored data is Arrow)."""
        schema = self.arrow_schema([column])
        with self._lock:
            self._con.register("__roundtrip", schema.empty_table())
            try:
                back = self._con.execute("DESCRIBE __roundtrip").fetchall()[0][1]
            finally:
                self._con.unregister("__roundtrip")
        if back != column.type:
            raise UnsupportedError(
                f"column {column.name}: type {column.type} is not supported for stored data "
                f"(it would come back as {back}); use {back} instead"
            )

    def aggregate_names(self) -> frozenset[str]:
        if self._aggregates is None:
            rows = self._execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'aggregate'"
            )
            self._aggregates = frozenset(r[0].lower() for r in rows)
        return self._aggregates
