"""Reads: ad-hoc SQL over one consistent snapshot of tables and views.

Each reading thread has its own DuckDB cursor. Before a query runs, every
table and view it names is registered on that cursor as the Arrow data of
the snapshot taken when the read began (zero-copy; re-registered only when
the version changed). All relations in one read therefore reflect the same
change offset, and a read never waits for writers.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.errors import BindError, ExecutionError, UnknownObjectError
from sql_frontend.statements import normalize_name
from delta_operators.zset import WEIGHT
from ivm import duck
from ivm.executor import duckdb_message
from storage.relation import Relation
from storage.store import Snapshot

if TYPE_CHECKING:
    from ivm.engine import Engine

OFFSET_METADATA = b"ivm.offset"


def visible(relation: Relation, may_repeat: bool) -> pa.Table:
    """The rows users see: the weight column dropped, or spent on repetitions."""
    with relation._cache_lock:
        cached = relation._cache.get("visible")
    if cached is not None:
        return cached
    table = relation.table()
    weights = table.column(WEIGHT)
    rows = table.drop_columns([WEIGHT])
    if may_repeat and table.num_rows and pc.max(weights).as_py() > 1:
        rows = rows.take(pa.array(np.repeat(np.arange(table.num_rows), weights.to_numpy())))
    with relation._cache_lock:
        relation._cache["visible"] = rows
    return rows


class Reader:
    def __init__(self, engine: "Engine"):
        self.engine = engine
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for cursor in self._cursors:
                try:
                    cursor.close()
                except duckdb.Error:
                    pass
            self._cursors.clear()

    def _cursor(self) -> tuple[duckdb.DuckDBPyConnection, dict[str, Relation]]:
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self.engine.duck.cursor()
            self._local.cursor = cursor
            self._local.registered = {}
            with self._lock:
                self._cursors.append(cursor)
        return cursor, self._local.registered

    def relations_in(self, expression: exp.Expression) -> list[str]:
        """Catalog relations a query names; unknown plain names are errors."""
        ctes = {normalize_name(c.alias) for c in expression.find_all(exp.CTE)}
        names: list[str] = []
        for table in expression.find_all(exp.Table):
            if not isinstance(table.this, exp.Identifier) or table.args.get("db"):
                continue
            name = normalize_name(table.this)
            if name in ctes or name in names:
                continue
            if not self.engine.catalog.exists(name):
                raise UnknownObjectError(f"table or view {name} does not exist")
            names.append(name)
        return names

    def register(self, cursor: duckdb.DuckDBPyConnection, registered: dict[str, Relation],
                 names: list[str], snapshot: Snapshot) -> None:
        catalog = self.engine.catalog
        for name in names:
            definition = catalog.get(name)
            relation = snapshot[name]
            # Holding the registered version (not its id) keeps the comparison sound.
            if registered.get(name) is relation:
                continue
            cursor.register(name, visible(relation, not definition.is_set))
            registered[name] = relation

    def query(self, sql: str, expression: exp.Expression, snapshot: Snapshot | None = None) -> pa.Table:
        snapshot = snapshot or self.engine.store.snapshot
        names = self.relations_in(expression)
        cursor, registered = self._cursor()
        self.register(cursor, registered, names, snapshot)
        try:
            table = duck.arrow(cursor, sql)
        except duckdb.CatalogException as e:
            raise UnknownObjectError(duckdb_message(e)) from None
        except (duckdb.BinderException, duckdb.ParserException) as e:
            raise BindError(duckdb_message(e)) from None
        except duckdb.Error as e:
            raise ExecutionError(duckdb_message(e)) from None
        metadata = dict(table.schema.metadata or {})
        metadata[OFFSET_METADATA] = str(snapshot.offset).encode()
        return table.replace_schema_metadata(metadata)
