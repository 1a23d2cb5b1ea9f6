"""Facts of the upstream PostgreSQL that the source and its stream share: types, LSNs, tables.

The source (ivm/cdc/postgres.py) describes the publication's tables and makes the slot; the stream
(ivm/cdc/stream.py) decodes changes into them and loads a table again on REFRESH. Both read these.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from ivm.binder import quote
from sql_frontend.errors import IvmError

PART_BITS = 16  # seq = commit LSN << 16 | part (parts split a transaction at a TRUNCATE)
SIMPLE_TYPES = {
    "smallint": "SMALLINT", "integer": "INTEGER", "bigint": "BIGINT", "real": "FLOAT",
    "double precision": "DOUBLE", "boolean": "BOOLEAN", "text": "VARCHAR", "date": "DATE", "name": "VARCHAR",
    "timestamp without time zone": "TIMESTAMP", "timestamp with time zone": "TIMESTAMP WITH TIME ZONE", "uuid": "VARCHAR",
    "json": "VARCHAR", "jsonb": "VARCHAR", "numeric": "DOUBLE", "time without time zone": "VARCHAR",
}


class SourceError(IvmError, ValueError):
    """A CDC source cannot go on (upstream schema change, unsupported table, type mismatch)."""


@dataclass
class Refresh:
    """A request to the stream thread: load ``table`` again from upstream (ALTER SOURCE … REFRESH TABLE).

    The stream sets ``done`` once it has, or has failed (``error``)."""

    table: str
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def duck_type(pg_type: str) -> str | None:
    """DuckDB type for a PostgreSQL ``format_type`` text, or None when unsupported."""
    t = pg_type.lower()
    if t in SIMPLE_TYPES:
        return SIMPLE_TYPES[t]
    if re.fullmatch(r"(character varying|character|bpchar)(\(\d+\))?", t):
        return "VARCHAR"
    if re.fullmatch(r"timestamp\(\d\) without time zone", t):
        return "TIMESTAMP"
    if re.fullmatch(r"timestamp\(\d\) with time zone", t):
        return "TIMESTAMP WITH TIME ZONE"
    m = re.fullmatch(r"numeric\((\d+),(\d+)\)", t)
    if m:
        return f"DECIMAL({m[1]},{m[2]})" if int(m[1]) <= 38 else "DOUBLE"
    return None


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def check_upstream(conn, slot: str) -> None:
    """PostgreSQL can make the slot: logical decoding on, the name free, a slot to spare."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int, "
                    "(SELECT COUNT(*) FROM pg_replication_slots), "
                    "EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", (slot,))
        wal_level, most, used, taken = cur.fetchone()
    if wal_level != "logical":
        raise SourceError(f"PostgreSQL runs with wal_level = {wal_level}; logical replication needs "
                          "wal_level = logical (set it and restart PostgreSQL)")
    if taken:
        raise SourceError(f"replication slot {slot} already exists upstream: name another with SLOT '…', or "
                          f"drop it upstream if nothing uses it (SELECT pg_drop_replication_slot('{slot}'))")
    if used >= most:
        raise SourceError(f"all {most} replication slots of the PostgreSQL server are in use "
                          "(max_replication_slots)")


def describe(conn, publication: str) -> dict:
    """upstream "schema.table" -> {table, columns: [{name, type, pg_type, oid, not_null, typmod, attnum}], key}."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
        if cur.fetchone() is None:
            raise SourceError(f"publication {publication} does not exist upstream")
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
                    (publication,))
        tables = cur.fetchall()
        if not tables:
            raise SourceError(f"publication {publication} has no tables")
        return {f"{schema}.{name}": describe_table(cur, schema, name) for schema, name in tables}


def describe_table(cur, schema: str, name: str) -> dict:
    """One upstream table, as ``describe`` records it (as the snapshot of ``cur``'s transaction sees it)."""
    relation = f"{quote(schema)}.{quote(name)}"
    cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, a.attnotnull, "
                "a.atttypmod, a.attnum FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
                "AND NOT a.attisdropped ORDER BY a.attnum", (relation,))
    columns = []
    for column, pg_type, oid, not_null, typmod, attnum in cur.fetchall():
        mapped = duck_type(pg_type)
        if mapped is None:
            raise SourceError(f"column {column} of upstream table {schema}.{name} has type {pg_type}, "
                              "which ivm cannot replicate")
        columns.append({"name": column.lower(), "type": mapped, "pg_type": pg_type, "oid": oid,
                        "not_null": not_null, "typmod": typmod, "attnum": attnum})
    cur.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                "ORDER BY array_position(i.indkey::int2[], a.attnum)", (relation,))
    key = [r[0].lower() for r in cur.fetchall()]
    cur.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (relation,))
    identity = cur.fetchone()[0]
    if not ((key and identity == "d") or identity == "f"):
        raise SourceError(f"upstream table {schema}.{name} needs a primary key (with the default replica "
                          "identity) or REPLICA IDENTITY FULL to be replicated")
    local = name.lower() if schema == "public" else f"{schema}_{name}".lower()
    return {"table": local, "columns": columns, "key": key}
