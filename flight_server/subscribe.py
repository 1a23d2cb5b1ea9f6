"""SUBSCRIBE: a view's or table's changes, streamed while they commit, on both doors.

One implementation for every way to subscribe: ``Feed`` follows a relation's
change stream (ivm/reads/changefeed.py) from an offset or from its current rows;
plain Flight's JSON-ticket subscriptions (subscriptions.py) send its steps as
they are, and ``SUBSCRIBE`` in SQL sends them as Materialize-style rows
(``sql_rows``) over pgwire (pgwire/dispatch.py) and over Flight SQL
(server.py).

As Materialize does it (its "SUBSCRIBE" reference page), a subscription is
a statement whose result never ends: ``SUBSCRIBE [TO] v`` in the simple or
extended query protocol (DataRows keep coming), or ``COPY (SUBSCRIBE [TO] v)
TO STDOUT`` (CopyData keeps coming; what psycopg's ``cursor.copy`` reads);
over Flight SQL the statement's one endpoint is a stream that stays open
(record batches keep coming). It ends when the client cancels it (psql's
Ctrl-C, ``conn.cancel()``: 57014; closing the Flight SQL reader),
disconnects, or the server stops.

``v`` is a materialized view or a table (a table's changes are its batches:
an insert +1, a delete -1, an update -1 of the old row and +1 of the new).

Columns: ``mz_timestamp`` (bigint: the change-log offset of the batch),
``mz_progressed`` (boolean, only ``WITH (PROGRESS)``), ``mz_diff`` (bigint:
+n rows added, -n removed), then the relation's columns.

* Without ``AS OF`` it starts with the relation's rows now (``mz_diff`` +1
  each, ``mz_timestamp`` the offset read; ``WITH (SNAPSHOT = false)`` skips
  them), then every change after that offset.
* ``AS OF n`` resumes after offset n: every change with a larger offset, no
  snapshot (a client that saw everything up to n continues from there; an
  offset older than the retained history is an error: 22023 over pgwire,
  INVALID_ARGUMENT over Flight).
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
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa

import ivm
from sql_frontend.errors import SqlSyntaxError, UnknownObjectError
from storage.zset import WEIGHT

_SUBSCRIBE = re.compile(
    r"SUBSCRIBE\s+(?:TO\s+)?(?P<view>\"(?:[^\"]|\"\")+\"|\w+)"
    r"(?:\s+AS\s+OF\s+(?P<offset>\d+))?(?:\s+WITH\s*\((?P<options>[^)]*)\))?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
OFFSET = "__offset"
OFFSET_KEY = b"ivm.offset"
CHUNK_ROWS = 65_536  # rows per record batch a door sends at most
HEARTBEAT_SECONDS = 1.0  # a quiet subscription yields an empty step this often (departures show then)


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
        raise SqlSyntaxError("SUBSCRIBE takes [TO] <view or table> [AS OF <offset>] [WITH (PROGRESS, SNAPSHOT = false)]")
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


def columns(db: ivm.Database, subscription: Subscription) -> pa.Schema:
    """The columns ``subscription`` streams, without reading anything (a door's Describe)."""
    for info in db.objects():
        if info.name == subscription.view:
            return schema(info.schema, subscription.progress)
    raise UnknownObjectError(f"table or view {subscription.view} does not exist")


def schema(relation_schema: pa.Schema, progress: bool) -> pa.Schema:
    """The subscription's columns: mz_timestamp, [mz_progressed], mz_diff, then the relation's."""
    fields = [pa.field("mz_timestamp", pa.int64())]
    if progress:
        fields.append(pa.field("mz_progressed", pa.bool_()))
    return pa.schema(fields + [pa.field("mz_diff", pa.int64())] + list(relation_schema))


# --- following a relation's changes (every door) ---------------------------------------------
@dataclass
class Step:
    """Changes in changefeed form (the relation's columns, ``__weight``, ``__offset``): every change up to
    ``through`` is in this step or an earlier one. ``snapshot``: the rows are the relation's contents as of
    ``through`` (weight 1 each), not changes."""

    rows: pa.Table
    through: int
    snapshot: bool = False


class Feed:
    """A relation's change stream from an offset, or from its current rows (``since`` None).

    Made before a door starts streaming: its first reads happen here, so an
    unknown relation or an offset the history no longer holds is an error
    the door reports as a statement's error. ``start`` is the offset the
    stream begins after (the snapshot's offset, or ``since``).
    """

    def __init__(self, db: ivm.Database, name: str, since: int | None, heartbeat: float = HEARTBEAT_SECONDS):
        self.db, self.name, self.heartbeat = db, name, heartbeat
        self.initial: Step | None = None
        if since is None:
            rows = db.sql(f"SELECT * FROM {_quote(name)}")
            since = int(rows.schema.metadata[OFFSET_KEY])
            self._first = db.changes(name, since)
            self.initial = Step(_as_changes(rows, since, self._first.rows.schema), since, snapshot=True)
        else:
            self._first = db.changes(name, since)
        self.start = since
        self.nbytes = self._first.rows.nbytes + (self.initial.rows.nbytes if self.initial else 0)  # held until sent
        self.schema = self._first.rows.schema  # changefeed form
        self.relation_schema = pa.schema([f for f in self.schema if f.name not in (WEIGHT, OFFSET)])

    def steps(self, stopped: Callable[[], bool]) -> Iterator[Step]:
        """The snapshot (if any), then changes as they commit; a quiet relation yields an empty step every
        ``heartbeat`` s (a door sends a heartbeat, and notices a departed client). Ends when ``stopped()``.

        Counted in ``open_streams(db)`` from its first step until it ends or is dropped (the door stopped
        pulling: the client left)."""
        _count(self.db, 1)
        try:
            if self.initial is not None:
                yield self.initial
            changes = self._first
            while True:
                yield Step(changes.rows, changes.through)
                if stopped():
                    return
                changes = self.db.changes(self.name, changes.through, wait=self.heartbeat)
        finally:
            _count(self.db, -1)


# Streams being sent now, per database (weakly: a closed database's count goes with it); a metric reads it.
_open: "weakref.WeakKeyDictionary[ivm.Database, int]" = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def _count(db: ivm.Database, change: int) -> None:
    with _open_lock:
        _open[db] = _open.get(db, 0) + change


def open_streams(db: ivm.Database) -> int:
    """Subscriptions of ``db`` streaming now, on every door (SUBSCRIBE over pgwire and Flight SQL, plain
    Flight subscription tickets)."""
    with _open_lock:
        return _open.get(db, 0)


def _as_changes(rows: pa.Table, offset: int, schema: pa.Schema) -> pa.Table:
    n = rows.num_rows
    table = rows.append_column(WEIGHT, pa.repeat(pa.scalar(1, pa.int64()), n))
    table = table.append_column(OFFSET, pa.repeat(pa.scalar(offset, pa.int64()), n))
    return table.replace_schema_metadata(None).cast(schema)


# --- SUBSCRIBE rows (pgwire and Flight SQL) -------------------------------------------------
def sql_rows(feed: Feed, subscription: Subscription, target: pa.Schema,
             stopped: Callable[[], bool]) -> Iterator[pa.Table]:
    """``feed``'s steps as SUBSCRIBE rows of ``target`` (``schema``); an empty table is a heartbeat."""
    if subscription.progress and feed.initial is None:  # nothing before the start offset will come
        yield progress_row(feed.start, target)
    for step in feed.steps(stopped):
        if step.snapshot:
            if subscription.snapshot and step.rows.num_rows:
                yield change_rows(step.rows, target)
            if subscription.progress:
                yield progress_row(step.through, target)
            continue
        rows = change_rows(step.rows, target)
        if subscription.progress:  # after the changes it vouches for, in the same table
            rows = pa.concat_tables([rows, progress_row(step.through, target)]) if rows.num_rows \
                else progress_row(step.through, target)
        yield rows


def change_rows(changes: pa.Table, target: pa.Schema) -> pa.Table:
    """Rows in changefeed form (relation columns, ``__weight``, ``__offset``) as subscription rows."""
    n = changes.num_rows
    columns = {"mz_timestamp": changes.column(OFFSET)}
    if "mz_progressed" in target.names:
        columns["mz_progressed"] = pa.repeat(pa.scalar(False), n)
    columns["mz_diff"] = changes.column(WEIGHT)
    for name in changes.column_names:
        if name not in (WEIGHT, OFFSET):
            columns[name] = changes.column(name)
    return pa.table(columns).cast(target)


def progress_row(through: int, target: pa.Schema) -> pa.Table:
    columns = {f.name: pa.nulls(1, f.type) for f in target}
    columns["mz_timestamp"] = pa.array([through], pa.int64())
    columns["mz_progressed"] = pa.array([True])
    return pa.table(columns, schema=target)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
