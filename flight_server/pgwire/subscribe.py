"""SUBSCRIBE over PostgreSQL: a materialized view's changes, streamed as rows while they commit.

As Materialize does it (its "SUBSCRIBE" reference page), a subscription is
a statement whose result never ends: ``SUBSCRIBE [TO] v`` in the simple or
extended query protocol (DataRows keep coming), or ``COPY (SUBSCRIBE [TO] v)
TO STDOUT`` (CopyData keeps coming; what psycopg's ``cursor.copy`` reads).
It ends when the client cancels it (psql's Ctrl-C, ``conn.cancel()``:
57014), disconnects, or the server stops.

Columns: ``mz_timestamp`` (bigint: the change-log offset of the batch),
``mz_progressed`` (boolean, only ``WITH (PROGRESS)``), ``mz_diff`` (bigint:
+n rows added, -n removed), then the view's columns.

* Without ``AS OF`` it starts with the view's rows now (``mz_diff`` +1 each,
  ``mz_timestamp`` the offset read; ``WITH (SNAPSHOT = false)`` skips them),
  then every change after that offset.
* ``AS OF n`` resumes after offset n: every change with a larger offset, no
  snapshot (a client that saw everything up to n continues from there; an
  offset older than the retained history is 22023).
* ``WITH (PROGRESS)`` adds a row ``(t, true, NULL, NULL...)`` whenever every
  change up to offset t has been sent, and at least every second while
  nothing changes.

>>> parse("SUBSCRIBE TO big AS OF 12 WITH (PROGRESS)")
Subscription(view='big', since=12, progress=True, snapshot=False)
>>> parse("subscribe big") == Subscription("big")
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from sql_frontend.errors import SqlSyntaxError

_SUBSCRIBE = re.compile(
    r"SUBSCRIBE\s+(?:TO\s+)?(?P<view>\"(?:[^\"]|\"\")+\"|\w+)"
    r"(?:\s+AS\s+OF\s+(?P<offset>\d+))?(?:\s+WITH\s*\((?P<options>[^)]*)\))?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
WEIGHT, OFFSET = "__weight", "__offset"


@dataclass(frozen=True)
class Subscription:
    view: str
    since: int | None = None  # AS OF: changes after this offset, no snapshot
    progress: bool = False
    snapshot: bool = True


def parse(sql: str) -> Subscription | None:
    """The subscription ``sql`` asks for, or None when it is not a SUBSCRIBE."""
    text = sql.strip()
    if not re.match(r"SUBSCRIBE\b", text, re.IGNORECASE):
        return None
    match = _SUBSCRIBE.match(text)
    if match is None:
        raise SqlSyntaxError("SUBSCRIBE takes [TO] <view> [AS OF <offset>] [WITH (PROGRESS, SNAPSHOT = false)]")
    view = match["view"]
    view = view[1:-1].replace('""', '"') if view.startswith('"') else view.lower()
    progress, snapshot = False, True
    for option in filter(None, (o.strip() for o in (match["options"] or "").split(","))):
        name, _, value = (part.strip().lower() for part in option.partition("="))
        on = value.strip("'") not in ("false", "off", "0")
        if name == "progress":
            progress = on
        elif name == "snapshot":
            snapshot = on
        else:
            raise SqlSyntaxError(f"SUBSCRIBE option {name!r} is not known (PROGRESS, SNAPSHOT)")
    since = int(match["offset"]) if match["offset"] else None
    return Subscription(view, since, progress, snapshot and since is None)


def schema(view_schema: pa.Schema, progress: bool) -> pa.Schema:
    """The subscription's columns: mz_timestamp, [mz_progressed], mz_diff, then the view's."""
    fields = [pa.field("mz_timestamp", pa.int64())]
    if progress:
        fields.append(pa.field("mz_progressed", pa.bool_()))
    return pa.schema(fields + [pa.field("mz_diff", pa.int64())] + list(view_schema))


def snapshot_rows(rows: pa.Table, offset: int, target: pa.Schema) -> pa.Table:
    """The view's current rows as additions at ``offset``."""
    n = rows.num_rows
    return _assemble(rows, pa.array([offset] * n, pa.int64()), pa.array([1] * n, pa.int64()), target)


def change_rows(changes: pa.Table, target: pa.Schema) -> pa.Table:
    """A changefeed answer (view columns, ``__weight``, ``__offset``) as subscription rows."""
    return _assemble(changes.drop_columns([WEIGHT, OFFSET]), changes.column(OFFSET), changes.column(WEIGHT), target)


def progress_row(through: int, target: pa.Schema) -> pa.Table:
    columns = {f.name: pa.nulls(1, f.type) for f in target}
    columns["mz_timestamp"] = pa.array([through], pa.int64())
    columns["mz_progressed"] = pa.array([True])
    return pa.table(columns, schema=target)


def _assemble(rows: pa.Table, offsets, diffs, target: pa.Schema) -> pa.Table:
    columns = {"mz_timestamp": offsets}
    if "mz_progressed" in target.names:
        columns["mz_progressed"] = pa.array([False] * rows.num_rows)
    columns["mz_diff"] = diffs
    for name in rows.column_names:
        columns[name] = rows.column(name)
    return pa.table(columns).cast(target)
