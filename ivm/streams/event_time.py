"""Event streams: append-only tables, their watermarks and their stragglers.

A table created ``APPEND ONLY`` takes inserts only (``__op`` ``c``, and ``r``
when it has no primary key, where ``r`` is an insert); an update or a delete
is refused and the batch changes nothing. With ``WATERMARK FOR ts AS ts -
INTERVAL …`` the table also has an event-time column (NOT NULL) and a
watermark:

    watermark = max(ts over every accepted batch) - lateness

It only moves forward (a maximum only grows). Stragglers are judged per
batch: an event of a batch is late when its ts is below the watermark as it
stood before that batch, so a batch never makes its own events late; the
watermark then moves with the batch's largest ts. Because the rows of an
append-only table are never deleted by changes, the largest event time is
that of the stored table: recovery recomputes it from the table it loads,
and replaying the log moves it exactly as the first time. The count of late
events is a counter of the published snapshot (``late:<table>``), stored
with it by checkpoints and moved again by replay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlglot import exp

from sql_frontend.errors import CatalogError, ChangeError, UnsupportedError
from sql_frontend.time_windows import expand_time_windows
from ivm.catalog import TableDef
from ivm.streams.interval_join import KEEP_ALL, UNREAD
from ivm.streams.names import ON_TIME_PREFIX, on_time_name, watermark_name
from ivm.streams.window_state import closable_streams, window_local
from sql_frontend.plan import Column

EPOCH = datetime(1970, 1, 1)
# Ops an append-only table accepts: inserts. ('r' replaces by key, so only a bag takes it.)
INSERT_OPS = {"c": "insert", "r": "insert or replace", "u": "upsert", "d": "delete"}


def check_appends(table: TableDef, ops: pa.ChunkedArray) -> None:
    """Refuse updates and deletes of an append-only table, naming the first one."""
    if not table.append_only or len(ops) == 0:
        return
    allowed = ["c"] if table.primary_key else ["c", "r"]
    bad = pc.invert(pc.is_in(ops, value_set=pa.array(allowed)))
    if pc.any(bad).as_py():
        op = ops.filter(bad)[0].as_py()
        raise ChangeError(f"table {table.name} is APPEND ONLY: __op {op!r} ({INSERT_OPS[op]}) is not allowed, "
                          "only inserts")


def check_stream_table(table: TableDef) -> None:
    """The event-time column exists and is a TIMESTAMP."""
    if table.event_time is None:
        return
    column = next((c for c in table.columns if c.name == table.event_time), None)
    if column is None:
        raise CatalogError(f"WATERMARK FOR {table.event_time}: {table.name} has no column {table.event_time}")
    if column.type.upper() != "TIMESTAMP":
        raise CatalogError(f"WATERMARK FOR {table.event_time}: the event-time column must be a TIMESTAMP, "
                           f"not {column.type}")


def max_event_us(table: TableDef, rows: pa.Table) -> int | None:
    """Largest event time (microseconds since the epoch) among ``rows``; None when empty."""
    if rows.num_rows == 0:
        return None
    column = rows.column(table.event_time)
    return pc.max(pc.cast(column, pa.int64())).as_py()


def on_time_mask(table: TableDef, rows: pa.Table, watermark_us: int | None) -> pa.ChunkedArray | None:
    """True for rows at or above the watermark; None when every row is on time."""
    if watermark_us is None or rows.num_rows == 0:
        return None
    on_time = pc.greater_equal(pc.cast(rows.column(table.event_time), pa.int64()), watermark_us)
    return None if pc.all(on_time).as_py() else on_time


def as_time(us: int | None) -> str | None:
    return None if us is None else (EPOCH + timedelta(microseconds=us)).isoformat(sep=" ")


def late_counter(table: str) -> str:
    """The snapshot counter of a stream's late events (stored with the snapshot it belongs to)."""
    return f"late:{table}"


@dataclass
class Watermarks:
    """Per watermarked table: the largest event time and the late events, over accepted batches."""

    max_us: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)

    def watermark(self, table: TableDef) -> int | None:
        top = self.max_us.get(table.name)
        return None if top is None else top - table.lateness_us

    def accept(self, table: TableDef, batch_max: int | None, late: int) -> None:
        if batch_max is not None and batch_max > self.max_us.get(table.name, batch_max - 1):
            self.max_us[table.name] = batch_max
        if late:
            self.late[table.name] = self.late.get(table.name, 0) + late

    def restore(self, table: TableDef, snapshot) -> None:
        """From a loaded checkpoint: the stored table's largest event time, the stored late count."""
        top = max_event_us(table, snapshot[table.name].table())
        if top is not None:
            self.max_us[table.name] = top
        self.late[table.name] = snapshot.counters.get(late_counter(table.name), 0)

    def copy(self) -> "Watermarks":
        return Watermarks(dict(self.max_us), dict(self.late))

    def drop(self, name: str) -> None:
        self.max_us.pop(name, None)
        self.late.pop(name, None)

    def status(self, table: TableDef) -> dict:
        return {"event_time": table.event_time, "lateness_seconds": table.lateness_us / 1e6,
                "max_event_time": as_time(self.max_us.get(table.name)),
                "watermark": as_time(self.watermark(table)), "late_events": self.late.get(table.name, 0)}


__all__ = ["Watermarks", "check_appends", "check_stream_table", "max_event_us", "on_time_mask", "as_time"]


# --- stragglers: the hidden table of on-time rows ---------------------------------------------------
#
# A watermarked table T has a hidden twin ``__ontime_T`` holding the rows of T
# that were on time when they arrived: every batch of T is applied to it too,
# without its late rows. A view with ``late = 'drop'`` (the default) reads the
# twin wherever its SELECT names T, so it is exactly the view over the
# on-time events (for its initial computation, its deltas and its lookups
# alike); a view with ``late = 'correct'`` reads T itself.

LATE_POLICIES = ("drop", "correct")


def hidden_defs(table: TableDef) -> list[TableDef]:
    """A watermarked table's twins: its on-time rows, and its watermark as a one-row table (k = 0, wm)."""
    if table.event_time is None:
        return []
    on_time = TableDef(name=on_time_name(table.name), columns=table.columns, primary_key=table.primary_key,
                       not_null=table.not_null, defaults=table.defaults, append_only=True, shadow_of=table.name)
    mark = TableDef(name=watermark_name(table.name), columns=(Column("k", "INTEGER"), Column("wm", "TIMESTAMP")),
                    primary_key=("k",), not_null=frozenset({"k"}), shadow_of=table.name)
    return [on_time, mark]


def watermark_batch(table: TableDef, watermarks: "Watermarks", batch_max: int | None) -> pa.Table | None:
    """The normalized upsert of the watermark table when the batch moves the watermark, else None."""
    old = watermarks.max_us.get(table.name)
    if batch_max is None or (old is not None and batch_max <= old):
        return None
    mark = pa.array([batch_max - table.lateness_us], pa.int64()).cast(pa.timestamp("us"))
    return pa.table({"k": pa.array([0], pa.int32()), "wm": mark, "__op": ["r"],
                     "__seq": pa.array([0], pa.int64())})


def on_time_batch(table: TableDef, batch: pa.Table, watermark_us: int | None) -> pa.Table:
    """The batch without its late rows."""
    mask = on_time_mask(table, batch, watermark_us)
    return batch if mask is None else batch.filter(mask)


def view_query(query, catalog, late: str | None, emit: str | None = None):
    """The SELECT a view plans, given its options:

    * late = 'drop' (default): watermarked tables read as their on-time rows;
    * emit = 'on_close': only rows whose window_end the watermark has reached,
      ``SELECT * FROM (<query>) WHERE window_end <= (SELECT MAX(wm) FROM __wm_<table>)``.
    """
    query = expand_time_windows(query, catalog.schema())
    streams = {t.name for t in catalog.tables.values() if t.event_time is not None}
    named = {t.this.name.lower() for t in query.find_all(exp.Table) if isinstance(t.this, exp.Identifier)}
    read = sorted(named & streams)
    for option, value in (("late", late), ("emit", emit)):
        if value is not None and not read:
            raise UnsupportedError(f"{option} = '{value}' applies to views reading a table with a WATERMARK; "
                                   "this view reads none")
    closing = emit == "on_close" and _closing(query, read, catalog)
    if (late or "drop") == "drop" and read:
        query = query.copy()
        for table in list(query.find_all(exp.Table)):
            name = table.this.name.lower() if isinstance(table.this, exp.Identifier) else None
            if name in streams:
                alias = table.alias or name
                table.set("this", exp.to_identifier(on_time_name(name)))
                table.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    if closing:
        mark = exp.select(exp.func("MAX", exp.column("wm"))).from_(watermark_name(read[0])).subquery()
        query = (exp.select("*").from_(query.subquery("__closed"))
                 .where(exp.LTE(this=exp.column("window_end", table="__closed"), expression=mark)))
    return query


def _closing(query, read: list[str], catalog) -> bool:
    """Check that emit = 'on_close' can apply: one watermarked table, a window_end column out."""
    if len(read) > 1:
        raise UnsupportedError(f"emit = 'on_close' over several watermarked tables ({', '.join(read)}) "
                               "is not supported")
    names = [c.name for c in catalog.describe(query.sql("duckdb"))]
    if "window_end" not in names:
        raise UnsupportedError("emit = 'on_close' needs the view to output the window_end column of its "
                               "TUMBLE/HOP (a window's row is published once the watermark passes its end)")
    return True


# --- bounded state: RETAIN ---------------------------------------------------------------------------
#
# ``APPEND ONLY RETAIN INTERVAL r``: after each batch, rows of the table (and
# of its on-time twin) with ts < watermark - r are dropped. Dropping them is
# not a change of the data: views do not see it (they took those rows in as
# deltas long ago, and a view over closed windows keeps its rows), so a view
# whose maintenance would look up or scan the stored rows of such a table
# (a join whose other side changes, a self-join) is refused: its answer
# would depend on what was dropped. Replay drops exactly the same rows (the
# watermark is a function of the log).


def expired_rows(relation, column: str, cutoff_us: int) -> tuple[np.ndarray, np.ndarray]:
    """(runs, rows) of the live rows whose ``column`` is below the cutoff."""
    runs, rows = [], []
    for r, run in enumerate(relation.runs):
        ts = pc.cast(run.table.column(column), pa.int64()).to_numpy(zero_copy_only=False)
        old = np.flatnonzero(ts < cutoff_us)
        old = old[run.is_live(old)] if len(old) else old
        if len(old):
            runs.append(np.full(len(old), r, dtype=np.int64))
            rows.append(old.astype(np.int64))
    if not runs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(runs), np.concatenate(rows)


def expire_retained(table: TableDef, prepared, watermarks: "Watermarks", coder, on_time_limit=None) -> None:
    """Drop from the batch's new versions the rows the watermark passed by more than RETAIN.

    ``on_time_limit``: the on-time rows interval joins still need (ivm/streams/interval_join.py
    on_time_cutoff: UNREAD, KEEP_ALL or an event time; None: UNREAD).
    """

    top = max(v for v in (watermarks.max_us.get(table.name), prepared.event_max) if v is not None)
    cutoff = top - table.lateness_us - table.retain_us
    expire_rows(prepared, table.event_time, cutoff, coder)
    # The on-time rows: what RETAIN drops and (when an interval join looks them up) no join can
    # still match: the join's cutoff may be the lower one (the other stream's watermark may lag).
    limit = UNREAD if on_time_limit is None else on_time_limit
    if limit is not KEEP_ALL:
        expire_rows(prepared.hidden[0], table.event_time, cutoff if limit is UNREAD else min(cutoff, limit), coder)


def expire_rows(version, column: str, cutoff_us: int, coder) -> int:
    """Drop from a batch's new version the rows with ``column`` below the cutoff; how many went."""
    runs, rows = expired_rows(version.updated, column, cutoff_us)
    if len(runs):
        version.updated = version.updated.replace_rows(runs, rows, None, coder)
    return len(runs)


def check_retained_reads(view, catalog, stored_new) -> None:
    """Refuse a view whose maintenance reads stored rows of a RETAIN table (they may be gone).

    An interval join's reads of on-time rows are bounded (ivm/streams/interval_join.py): they stay.
    """
    retained = catalog.retained()
    if not retained & set(view.sources):
        return
    if view.interval is not None:
        retained = retained - set(view.sources)
    sources = list(view.sources)
    changed_sets = [frozenset([s]) for s in sources] + [frozenset(sources)]
    for changed in changed_sets:
        program = view.program(changed, stored_new(changed))
        read = {i.relation for i in program.indexes} | set(program.scans)
        hit = sorted(read & retained)
        if hit:
            name = hit[0].removeprefix(ON_TIME_PREFIX)
            raise UnsupportedError(
                f"materialized view {view.name} would look up stored rows of {name}, which keeps only "
                f"recent rows (RETAIN): a join with a table that changes, or of {name} with itself, needs "
                f"rows {name} may have dropped; create {name} without RETAIN")


# --- bounded state: closed windows -------------------------------------------------------------------
#
# A view with late = 'drop' over one watermarked table T, windowed by
# TUMBLE/HOP of at most ``size``: an event reaches it only if ts >= W (the
# watermark before its batch), and an event is in window [s, s + size) only
# if ts < s + size. So once W >= s + size the window is closed: no change
# reaches its groups again, and operator state keyed by window_start <= W -
# size can go. W is read from T's one-row watermark table in the snapshot the
# batch is maintained into, so a durable fold and a replay drop exactly
# what the first run dropped. Kept: state the view's rows are read from
# (a view computed on read keeps one state row per window: its rows).
# SESSION windows have no size: their operator state drops the rows of
# sessions with window_end <= W (no later on-time event can touch them,
# delta_operators/session.py), and nothing goes by window_start.
# Views over several streams whose joins match windows: ivm/streams/window_state.py
# (W is the least of the streams' watermarks; such a view stores its rows).
# The one-stream path drops by window_start only when the plan is window-local
# by the same check (window_state.window_local): a raw stream row joined with
# its own windowed groups on the key alone would look up closed windows.


@dataclass(frozen=True)
class ClosedWindows:
    streams: tuple[str, ...]  # the watermarked tables; W is the least of their watermarks
    size_us: int  # the largest window over it
    relations: tuple[str, ...]  # state relations keyed by window_start that may lose closed windows
    # SESSION state (delta_operators/session.py): rows of sessions with window_end <= W go. A session has
    # no fixed size, so with a SESSION in the view nothing goes by window_start.
    sessions: tuple[str, ...] = ()


def closed_windows(view, query, catalog, may_store: bool = True) -> ClosedWindows | None:
    """What of ``view``'s state may go once windows close (None: nothing).

    ``may_store``: a view over several streams computed on read may switch to stored rows (False when
    restoring a checkpoint that holds no rows for it: it keeps its state).
    """
    from sql_frontend.session_windows import session_tables
    from sql_frontend.time_windows import window_sizes


    if (view.late or "drop") != "drop":
        return None  # a 'correct' view takes late events into any window
    several = closable_streams(view, query, catalog)
    if several is not None:  # ivm/streams/window_state.py: W = min of the streams' watermarks
        if not view.stored_output and not may_store:
            return None
        if not view.stored_output:
            view.store_output()  # its rows cannot be read from state that loses closed windows
        relations = tuple(s.name for s in view.states if s.name != view.name
                          and any(c.name == "window_start" and c.type.upper() == "TIMESTAMP" for c in s.columns))
        return ClosedWindows(several[0], several[1], relations) if relations else None
    sizes, sessions = window_sizes(query), session_tables(query)
    streams = [t for t in set(sizes) | sessions if t in catalog.tables and catalog.tables[t].event_time is not None]
    bases = {catalog.tables[s].shadow_of or s for s in view.sources if s in catalog.tables}
    if len(streams) != 1 or bases - {streams[0]} or set(view.sources) - set(catalog.tables):
        return None  # other tables (or views) in the view: their changes may touch closed windows
    read = set() if view.stored_output else view.read_sql()[1]
    session_states = tuple(s.name for s in view.states
                           if s.name not in read and re.fullmatch(re.escape(view.name) + r"\.session\d+", s.name))
    relations = () if sessions or not window_local(view.plan.root, catalog) else tuple(  # ivm/streams/window_state.py
        s.name for s in view.states if s.name not in read and s.name != view.name
        and any(c.name == "window_start" and c.type.upper() == "TIMESTAMP" for c in s.columns))
    if not relations and not session_states:
        return None
    return ClosedWindows((streams[0],), sizes.get(streams[0], 0), relations, session_states)


def drop_closed_windows(spec: ClosedWindows, snapshot, coder) -> dict:
    """New versions of the spec's relations without the windows closed by the snapshot's watermark."""
    marks = [stored_watermark(snapshot, stream) for stream in spec.streams]
    if None in marks:
        return {}  # a stream with no event yet: its first may fall in any window
    watermark = min(marks)
    cutoffs = [(name, "window_start", watermark - spec.size_us + 1) for name in spec.relations]  # start + size <= W
    cutoffs += [(name, "window_end", watermark + 1) for name in spec.sessions]  # window_end <= W
    changed = {}
    for name, column, cutoff in cutoffs:
        relation = snapshot[name]
        runs, rows = expired_rows(relation, column, cutoff)
        if len(runs):
            changed[name] = relation.replace_rows(runs, rows, None, coder)
    return changed


def stored_watermark(snapshot, stream: str) -> int | None:
    """The watermark (microseconds) in ``stream``'s one-row watermark table of the snapshot; None before events."""
    mark = snapshot[watermark_name(stream)].table()
    return None if mark.num_rows == 0 else pc.cast(mark.column("wm"), pa.int64())[0].as_py()
