"""Flight SQL's catalog commands: results with the exact schemas clients check.

ivm has one catalog (``ivm``) with one schema (``main``) holding every table
and materialized view. Names, types and nullability below are those of
``format/FlightSql.proto``; the ADBC driver rejects (or crashes on) results
that differ, notably the GetSqlInfo value union, which must list all six
children in this order.
"""

from __future__ import annotations

import re
from typing import Sequence

import pyarrow as pa

import ivm
from ivm.database import ObjectInfo

CATALOG = "ivm"
SCHEMA = "main"
TABLE_TYPES = {"table": "TABLE", "view": "MATERIALIZED VIEW"}

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8(), nullable=False),
])
TABLES_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("table_type", pa.utf8(), nullable=False),
])
TABLE_SCHEMA_FIELD = pa.field("table_schema", pa.binary(), nullable=False)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()),
    pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("column_name", pa.utf8(), nullable=False),
    pa.field("key_name", pa.utf8()),
    pa.field("key_sequence", pa.int32(), nullable=False),
])

SQL_INFO_VALUE = pa.dense_union([
    pa.field("string_value", pa.utf8()),
    pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()),
    pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.utf8())),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
])
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False),
    pa.field("value", SQL_INFO_VALUE, nullable=False),
])
STRING, BOOL, BIGINT, INT32 = 0, 1, 2, 3  # union type codes


def sql_info_values() -> dict[int, tuple[int, object]]:
    """SqlInfo code -> (union child, value), per FlightSql.proto's SqlInfo enum."""
    return {
        0: (STRING, "ivm"),  # FLIGHT_SQL_SERVER_NAME
        1: (STRING, _version()),  # FLIGHT_SQL_SERVER_VERSION
        2: (STRING, pa.__version__),  # FLIGHT_SQL_SERVER_ARROW_VERSION
        3: (BOOL, False),  # FLIGHT_SQL_SERVER_READ_ONLY
        4: (BOOL, True),  # FLIGHT_SQL_SERVER_SQL
        5: (BOOL, False),  # FLIGHT_SQL_SERVER_SUBSTRAIT
        8: (INT32, 0),  # FLIGHT_SQL_SERVER_TRANSACTION: none (every statement commits)
        9: (BOOL, False),  # FLIGHT_SQL_SERVER_CANCEL
        10: (BOOL, True),  # FLIGHT_SQL_SERVER_BULK_INGESTION
        11: (BOOL, False),  # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
        504: (STRING, '"'),  # SQL_IDENTIFIER_QUOTE_CHAR
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ivm")
    except Exception:  # noqa: BLE001 (not installed as a distribution)
        return "0"


def sql_info(codes: Sequence[int]) -> pa.Table:
    known = sql_info_values()
    wanted = [c for c in (codes or sorted(known)) if c in known]
    children: list[list] = [[] for _ in range(6)]
    types, offsets = [], []
    for code in wanted:
        child, value = known[code]
        types.append(child)
        offsets.append(len(children[child]))
        children[child].append(value)
    arrays = [pa.array(values, field.type) for values, field in zip(children, SQL_INFO_VALUE)]
    union = pa.UnionArray.from_dense(
        pa.array(types, pa.int8()), pa.array(offsets, pa.int32()), arrays,
        [f.name for f in SQL_INFO_VALUE], list(range(6)),
    )
    return pa.Table.from_arrays([pa.array(wanted, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


def like(pattern: str | None, value: str) -> bool:
    """SQL LIKE as Flight SQL filter patterns use it (``%`` and ``_``)."""
    if pattern is None:
        return True
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def _in_catalog(catalog: str | None) -> bool:
    return catalog is None or catalog == CATALOG


def db_schemas(catalog: str | None, pattern: str | None) -> pa.Table:
    rows = [{"catalog_name": CATALOG, "db_schema_name": SCHEMA}] if _in_catalog(catalog) and like(pattern, SCHEMA) else []
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables(db: ivm.Database, command: dict) -> pa.Table:
    include_schema = command.get("include_schema", False)
    schema = TABLES_SCHEMA.append(TABLE_SCHEMA_FIELD) if include_schema else TABLES_SCHEMA
    types = command.get("table_types")
    rows = []
    if _in_catalog(command.get("catalog")) and like(command.get("db_schema_filter_pattern"), SCHEMA):
        for info in _matching(db, command.get("table_name_filter_pattern")):
            if types and TABLE_TYPES[info.kind] not in types:
                continue
            row = {"catalog_name": CATALOG, "db_schema_name": SCHEMA, "table_name": info.name,
                   "table_type": TABLE_TYPES[info.kind]}
            if include_schema:
                row["table_schema"] = info.schema.serialize().to_pybytes()
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def _matching(db: ivm.Database, pattern: str | None) -> list[ObjectInfo]:
    return [o for o in db.objects() if like(pattern, o.name)]


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": t} for t in TABLE_TYPES.values()], schema=TABLE_TYPES_SCHEMA)


def primary_keys(db: ivm.Database, command: dict) -> pa.Table:
    rows = []
    name = command.get("table", "")
    if _in_catalog(command.get("catalog")) and command.get("db_schema") in (None, SCHEMA):
        for info in db.objects():
            if info.name != name:
                continue
            for position, column in enumerate(info.primary_key, start=1):
                rows.append({"catalog_name": CATALOG, "db_schema_name": SCHEMA, "table_name": info.name,
                             "column_name": column, "key_name": None, "key_sequence": position})
    return pa.Table.from_pylist(rows, schema=PRIMARY_KEYS_SCHEMA)
