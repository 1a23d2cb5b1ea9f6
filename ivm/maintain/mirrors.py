"""Native DuckDB copies ("mirrors") of the tables recomputed views read.

Contract: ``Mirrors.query(view, sql, snapshot, published, deltas)`` returns
what DuckDB's SELECT ``sql`` gives over the base tables as they are in
``snapshot`` (NEW), evaluated over native DuckDB tables instead of the
engine's Arrow runs. DuckDB plans and scans its own storage better (TPC-H
q02 at SF 1: 17.8 ms CPU native vs 47.7 ms over the Arrow runs, same text).

Each mirror is a table of the mirrors' own DuckDB database, named like the
base table, stamped with the Relation version it holds. Relations are
immutable, so the stamp is compared by identity. Before a SELECT, each table
it reads is brought to ``snapshot``'s version:

* stamp is ``snapshot[t]``: nothing to do (another view of this batch synced it);
* stamp is ``published[t]`` (the version before this batch) and the batch
  has a delta for ``t``: apply it, cost proportional to the delta:

      Δ   = consolidate(π_C(deltas[t]))   (weights summed, zeros dropped)
      M'  = (M − rows of M whose key is in Δ⁻) ∪ Δ⁺

  (keyed tables only: a key's row has weight 1, an update is −old +new).
  The DELETE finds Δ⁻'s keys by scanning M's key columns (DuckDB uses no
  index for a join or an IN list: ~5-8 ms CPU for 1.5M keys at SF 1,
  whatever the form), so the statements are few: -old/+new pairs equal in
  C cancel in numpy first, and a Δ that cancels entirely costs nothing;
  else one DELETE and one INSERT, each consolidating the delta inline
  (no temporary table, no explicit transaction: the stamp below makes a
  half-applied delta harmless). Measured at SF 1, 250-row delta of orders:
  6 statements 12-13 ms CPU, these 2 about 8;
* anything else (first use, a failed batch whose mutation was never
  published, a restart, a view needing a column the copy lacks): rebuild
  ``t`` from ``snapshot[t]``'s rows.

A mirror holds only C, the key and the columns its views read
(``ViewDef.reads``; every column when a view may read all): narrower copies,
and an update of columns no recomputed view reads (TPC-H's refresh of
part's price, orders' status) cancels instead of costing a DELETE and an
INSERT. C only grows (the union over the views that used the copy); a
view whose SELECT still names a column C lacks (the analysis missed one:
a binder error) rebuilds its copies with every column and runs again.

The stamp is cleared before a mirror changes and set after the change
committed, so an error half-way leaves it unstamped: the next use rebuilds.
Only views whose sources are all keyed base tables use mirrors (see
``eligible``); ``keep`` drops the mirrors no recomputed view reads (memory), once
no view that may still trial the refresh path has read them for LINGER_PASSES passes.
Rebuilds are one-off costs of switching to the refresh path: ``copy_seconds``
lets the engine leave them out of the refresh times the cost model keeps.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import duckdb
import pyarrow as pa
from sqlglot import exp

from delta_operators.prune import cancelled_pairs
from storage.zset import EVERY, WEIGHT, consolidate
from ivm.binder import quote
from ivm.reads.reads import run_query, visible
from sql_frontend.errors import BindError

if TYPE_CHECKING:
    from ivm.catalog import Catalog, ViewDef
    from storage.keys import KeyCoder
    from storage.relation import Relation
    from storage.store import Snapshot

ALL = None  # a mirror's columns: every column of its table
# Maintenance passes a copy outlives its last use while a view that may still trial the refresh
# path reads its table (``Mirrors.keep``). Views trial one by one, in the folds where each one's
# estimate first passes its provisional refresh time: at TPC-H SF 1 under sustained ingest, 10
# trials over 9 folds each copied their tables again (12.4 of 25.3 s of folding), because a copy
# was dropped at the end of the fold that made it. Kept, a copy follows each pass's deltas
# (two statements per changed table) until no view needs it for this many passes.
LINGER_PASSES = 8


def eligible(catalog: "Catalog", view: "ViewDef") -> bool:
    """Whether a refresh of ``view`` may read mirrors: its SELECT is its text over keyed, plain base tables."""
    tree, _ = view.select()
    if tree is not view.plan.query:
        return False
    for source in view.sources:
        table = catalog.tables.get(source)
        if table is None or not table.primary_key or table.event_time is not None or table.shadow_of:
            return False
    return True


class Mirrors:
    def __init__(self, connect: Callable[[], duckdb.DuckDBPyConnection]):
        self._connect = connect  # opens the mirrors' own DuckDB database (see ivm.execute.duck.connect)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._stamps: dict[str, "Relation | None"] = {}
        self._keys: dict[str, tuple[str, ...]] = {}
        self._columns: dict[str, tuple[str, ...] | None] = {}  # C per mirror (ALL: every column)
        self._table_names: dict[str, frozenset[str]] = {}  # its table's columns when copied (lower case)
        self._lock = threading.Lock()
        self.rebuilds = 0  # tables copied whole (tests and status: a steady stream should not rebuild)
        self.applied = 0  # deltas applied (also those that cancelled to nothing)
        self.cancelled = 0  # of them, deltas that cancelled entirely in the mirror's columns: no statement
        self.copy_seconds = 0.0  # spent on rebuilds: the cost model leaves it out of a refresh's time
        self._passes = 0  # calls of ``keep``: one per maintenance pass
        self._used: dict[str, int] = {}  # table -> the pass its copy was last read in

    @property
    def tables(self) -> frozenset[str]:
        return frozenset(self._stamps)

    def stopwatch(self) -> Callable[[], float]:
        """Started now: the seconds since, less those spent copying tables whole (``copy_seconds``)."""
        copied, started = self.copy_seconds, time.perf_counter()
        return lambda: time.perf_counter() - started - (self.copy_seconds - copied)

    def stamp(self, table: str) -> "Relation | None":
        return self._stamps.get(table)

    def query(self, catalog: "Catalog", view: "ViewDef", sql: str, snapshot: "Snapshot", published: "Snapshot",
              deltas: Mapping[str, pa.Table], coder: "KeyCoder") -> pa.Table:
        with self._lock:
            con = self._connection()
            for source in view.sources:
                self._used[source] = self._passes
                self._sync(con, source, catalog.tables[source].primary_key, _reads(view, source), snapshot,
                           published, deltas, coder, lambda table: _reads_of_any(catalog, table))
            try:
                return run_query(con, sql)  # DuckDB's errors as the reader's (ExecutionError, BindError...)
            except BindError:
                narrowed = [s for s in view.sources if self._columns.get(s, ALL) is not ALL]
                if not narrowed:
                    raise
            for source in narrowed:  # a column C lacks, maybe: every column, then the same SELECT again
                self._stamps[source] = None
                self._sync(con, source, catalog.tables[source].primary_key, ALL, snapshot, published, deltas, coder)
            return run_query(con, sql)

    def follow(self, catalog: "Catalog", snapshot: "Snapshot", published: "Snapshot", deltas: Mapping[str, pa.Table],
               coder: "KeyCoder") -> None:
        """Apply this batch's deltas to the mirrors no refresh synced (their views skipped the batch).

        A view skips a batch that changes none of the columns it reads; its
        copy must still follow the table, or the next refresh would copy the
        whole table again (its stamp would no longer be the published version).
        """
        with self._lock:
            for table, stamp in list(self._stamps.items()):
                if (stamp is not None and table in deltas and table in snapshot and table in published
                        and stamp is published[table] and snapshot[table] is not stamp):
                    key = catalog.tables[table].primary_key
                    try:
                        self._sync(self._connection(), table, key, frozenset(), snapshot, published, deltas, coder)
                    except Exception:  # noqa: BLE001 - a copy is a cache: left unstamped, its next use rebuilds it
                        self._stamps[table] = None

    def keep(self, tables: Iterable[str], lingering: Iterable[str] = ()) -> None:
        """Drop every mirror but those of ``tables``, and of ``lingering`` read in the last
        LINGER_PASSES passes (tables a view that may still trial reads). Called once per pass."""
        with self._lock:
            self._passes += 1
            keep = set(tables) | {t for t in lingering if self._passes - self._used.get(t, -LINGER_PASSES - 1)
                                  <= LINGER_PASSES}
            for table in [t for t in self._stamps if t not in keep]:
                self._stamps.pop(table)
                self._used.pop(table, None)
                self._keys.pop(table, None)
                self._columns.pop(table, None)
                self._table_names.pop(table, None)
                self._con.execute(f"DROP TABLE IF EXISTS {quote(table)}")

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
            self._stamps.clear()
            self._columns.clear()

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._con = self._connect()
        return self._con

    def _sync(self, con: duckdb.DuckDBPyConnection, table: str, key: tuple[str, ...], reads: frozenset[str] | None,
              snapshot: "Snapshot", published: "Snapshot", deltas: Mapping[str, pa.Table], coder: "KeyCoder",
              others: Callable[[str], frozenset[str] | None] | None = None) -> None:
        """Bring the copy of ``table`` to ``snapshot``'s version holding at least ``reads``; a copy made
        whole holds also what ``others(table)`` names (the columns other views may read)."""
        target = snapshot[table]
        stamp = self._stamps.get(table)
        columns = self._columns.get(table, ALL)
        covered = self._keys.get(table) == key and self._covers(table, reads)
        if stamp is target and covered:
            return
        self._stamps[table] = None  # unstamped while it changes: an error leaves it to be rebuilt
        delta = deltas.get(table)
        if (stamp is not None and covered and table in published and stamp is published[table]
                and delta is not None):
            self._apply(con, table, key, columns, delta, coder)
            self.applied += 1
        else:
            started = time.perf_counter()
            if not covered and table in self._columns:  # widen: what the copy held, and what this view reads
                reads = ALL if reads is ALL or columns is ALL else reads | {c.lower() for c in columns}
            if others is not None and reads is not ALL:
                # Every mirror-eligible view's columns at once: the views that trial the refresh path in
                # one fold (ivm/maintain/maintenance.py) read different columns of one table, and widening the copy
                # for each in turn copied lineitem's 6M rows again and again (13 copies in one fold at SF 1).
                wider = others(table)
                reads = ALL if wider is ALL else reads | wider
            self._columns[table] = self._rebuild(con, table, target, key, reads)
            self.copy_seconds += time.perf_counter() - started
            self.rebuilds += 1
        self._keys[table] = key
        self._stamps[table] = target

    def _covers(self, table: str, reads: frozenset[str] | None) -> bool:
        """Does the copy hold every column of its table that ``reads`` names (lower case)?"""
        columns = self._columns.get(table, ALL)
        if columns is ALL:
            return True
        return reads is not ALL and reads & self._table_names[table] <= {c.lower() for c in columns}

    def _rebuild(self, con: duckdb.DuckDBPyConnection, table: str, relation: "Relation", key: tuple[str, ...],
                 reads: frozenset[str] | None) -> tuple[str, ...] | None:
        """Copy ``relation``'s rows, only the key and ``reads`` (ALL: every column); the columns copied."""
        rows = visible(relation, False)  # keyed: every weight is 1
        names = rows.column_names
        self._table_names[table] = frozenset(n.lower() for n in names)
        columns = ALL
        if reads is not ALL:
            columns = tuple(n for n in names if n.lower() in reads or n in key)
            if len(columns) < len(names):
                rows = rows.select(list(columns))
            else:
                columns = ALL
        con.register("__mirror_rows", rows)
        try:
            con.execute(f"CREATE OR REPLACE TABLE {quote(table)} AS SELECT * FROM __mirror_rows")
        finally:
            con.unregister("__mirror_rows")
        return columns

    def _apply(self, con: duckdb.DuckDBPyConnection, table: str, key: tuple[str, ...], columns: tuple[str, ...] | None,
               delta: pa.Table, coder: "KeyCoder") -> None:
        names = [n for n in delta.column_names if n != WEIGHT] if columns is ALL else list(columns)
        delta = delta.select(names + [WEIGHT])
        # Updates of columns the copy does not keep cancel here. Codes of a key's first integer column are
        # enough (cancelled_pairs re-checks every key column) and need no statement, unlike hashed ones.
        first = key[:1] if pa.types.is_integer(delta.schema.field(key[0]).type) else key
        delta = cancelled_pairs(delta, coder.codes(delta, first), key, tuple(names))
        if not delta.num_rows:
            self.cancelled += 1
            return
        listed = ", ".join(quote(n) for n in names)
        net = f"({consolidate('__mirror_delta', names, keep=EVERY, name='__net', cast=False)})"
        match = " AND ".join(f"m.{quote(k)} = n.{quote(k)}" for k in key)
        weights = delta.column(WEIGHT).to_numpy()
        con.register("__mirror_delta", delta)
        try:
            if (weights < 0).any():
                con.execute(f"DELETE FROM {quote(table)} AS m USING {net} AS n WHERE n.__net < 0 AND {match}")
            if (weights > 0).any():
                con.execute(f"INSERT INTO {quote(table)} ({listed}) SELECT {listed} FROM {net} WHERE __net > 0")
        finally:
            con.unregister("__mirror_delta")


def _reads_of_any(catalog: "Catalog", table: str) -> frozenset[str] | None:
    """The columns of ``table`` any view that may read its mirror reads (ALL: maybe every one)."""
    reads: frozenset[str] = frozenset()
    for view in catalog.views.values():
        if table in view.sources and eligible(catalog, view):
            found = _reads(view, table)
            if found is ALL:
                return ALL
            reads |= found
    return reads


def _reads(view: "ViewDef", table: str) -> frozenset[str] | None:
    """The columns of ``table`` ``view``'s SELECT may read (ALL: maybe every one), lower case.

    The plan's read set, plus every column name the text mentions anywhere:
    a name dropped from a copy then never occurs in the text, so it cannot
    silently bind to another scope's column of that name (a missed one
    fails to bind and is caught, see ``Mirrors.query``). A star other than
    COUNT(*)'s reads every column.
    """
    reads = view.reads(table)
    named = _named(*view.select())
    return ALL if reads is None or named is ALL else frozenset(name.lower() for name in reads) | named


_NAMED: dict[str, frozenset[str] | None] = {}  # text -> its column names (a view's text never changes)


def _named(tree: exp.Expression, sql: str) -> frozenset[str] | None:
    """The column names the text mentions (lower case; ALL: it has a star), cached per text."""
    if sql not in _NAMED:
        if len(_NAMED) > 1024:
            _NAMED.clear()
        stars = any(not isinstance(star.parent, exp.Count) for star in tree.find_all(exp.Star))
        _NAMED[sql] = ALL if stars else frozenset(column.name.lower() for column in tree.find_all(exp.Column))
    return _NAMED[sql]
