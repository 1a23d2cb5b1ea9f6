"""Compact copies of the columns a refresh reads from each table.

Contract: ``scans(engine, tree, snapshot)`` gives, for each table the view's
SELECT (``tree``) reads, an Arrow table with the rows ``reads.visible``
gives (the same multiset) but only the columns the SELECT names, in one
chunk when the relation's rows are fragmented. A refresh (ivm/recompute.py)
registers these instead of the relations' full rows; DuckDB's result is the
same because the SELECT reads no other column.

Why: a refresh evaluates the SELECT over whole tables, whose Arrow rows are
zero-copy slices between deleted rows (storage/relation.py,
``Run.live_table``): after three TPC-H refreshes at SF 1, part and partsupp
are ~200 chunks, orders ~380, and DuckDB scans many small chunks slower than
one. Copying every column of a changed table per version costs more than it
saves (lineitem's comments), so the copy holds only the columns read, and is
cached with the relation version (released with it): the next refresh
reuses the copies of unchanged tables, and only tables that changed pay.
Measured at SF 1 after 3 refreshes (process CPU of the SELECT, median of 5;
`/work/notes/issue9-results/session6-scripts/projected.py`): q02 49 -> 40 ms
(the copies 14 ms when every table it reads changed), q16 93 -> 71 (4 ms),
q22 62 -> 56 (6 ms).

Columns are told from the qualified column references of the plan's SQL
(``plan_sql`` qualifies every column with its table's alias). A SELECT
with a ``*`` projection or an unqualified column gets every column (still
compacted); a reference the analysis missed makes DuckDB's binder fail, and
the refresh then runs over the full rows (``recompute._select``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from sqlglot import exp

from ivm.reads import visible

if TYPE_CHECKING:
    from ivm.engine import Engine
    from storage.relation import Relation
    from storage.store import Snapshot

COMPACT_CHUNKS = 8  # a table in fewer chunks than this is scanned as it is (only projected)


def read_columns(tree: exp.Expression, tables: set[str]) -> dict[str, list[str] | None]:
    """Per table of ``tables`` the SELECT reads: the columns it names (None: every column)."""
    aliases: dict[str, set[str]] = {}
    for table in tree.find_all(exp.Table):
        if table.name in tables:
            aliases.setdefault(table.alias_or_name, set()).add(table.name)
    read: dict[str, list[str] | None] = {name: [] for names in aliases.values() for name in names}
    if _star_projection(tree) or any(not c.table for c in tree.find_all(exp.Column)):
        return {name: None for name in read}
    for column in tree.find_all(exp.Column):
        for name in aliases.get(column.table, ()):  # several scopes may reuse an alias: a superset is fine
            read[name].append(column.name)
    return {name: sorted(set(columns)) for name, columns in read.items()}


def _star_projection(tree: exp.Expression) -> bool:
    for select in tree.find_all(exp.Select):
        for e in select.expressions:
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                return True
    return False


def compact(relation: "Relation", may_repeat: bool, columns: list[str] | None) -> pa.Table:
    """The relation's visible rows, only ``columns`` (None: all), combined when fragmented; cached per version."""
    key = ("compact", may_repeat, None if columns is None else tuple(columns))
    with relation._cache_lock:
        cached = relation._cache.get(key)
    if cached is not None:
        return cached
    rows = visible(relation, may_repeat)
    if columns is not None and set(columns) <= set(rows.column_names):
        rows = rows.select(columns or rows.column_names[:1])  # no column named (COUNT(*)): keep the row count
    if rows.num_columns and rows.column(0).num_chunks >= COMPACT_CHUNKS:
        rows = rows.combine_chunks()
    with relation._cache_lock:
        relation._cache[key] = rows
    return rows


def scans(engine: "Engine", tree: exp.Expression, snapshot: "Snapshot") -> dict[str, pa.Table]:
    """What a refresh registers for the tables its SELECT reads (see the module docstring)."""
    tables = {name for name in engine.reader.relations_in(tree) if name in engine.catalog.tables}
    return {name: compact(snapshot[name], not engine.catalog.tables[name].is_set, columns)
            for name, columns in read_columns(tree, tables).items()}
