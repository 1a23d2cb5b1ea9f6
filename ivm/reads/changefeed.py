"""A view's or table's change stream: what ``Database.changes`` returns.

The engine records each view's delta, and each table's batch as a Z-set
(an update is -old/+new), after every published batch in the change history
(storage/view_history.py). A reader asks for the changes after
an offset and gets one Arrow table: the view's columns, ``__weight`` (int64:
+n rows added, -n removed) and ``__offset`` (int64: the batch that made the
change), ordered by offset, plus ``through``, the offset the answer is
complete up to. Integrating the rows (summing weights per row) on top of the
view as of ``since`` gives the view as of ``through``; a consumer resumes by
asking again from ``through``.

Deltas are consolidated here, by DuckDB on the reading thread's cursor, per
offset (so NaN and -0.0 group as in SQL): the write path records views
computed on read as their unconsolidated delta to stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from storage.zset import WEIGHT, consolidate
from ivm.binder import quote
from ivm.reads.reads import failed_view_error
from sql_frontend.errors import OffsetError, UnknownObjectError

if TYPE_CHECKING:
    from ivm.engine import Engine

OFFSET = "__offset"  # int64: the change-log offset of the batch a change belongs to


@dataclass
class ViewChanges:
    rows: pa.Table  # view columns + __weight + __offset, ordered by __offset
    through: int  # every change up to this offset is included


def schema(engine: "Engine", view: str) -> pa.Schema:
    """The schema of a view's or table's change rows."""
    definition = engine.catalog.get(view)
    if getattr(definition, "shadow_of", None) is not None:  # a watermarked table's internal twin
        raise UnknownObjectError(f"table or view {view} does not exist")
    return engine.arrow_schema(definition.columns).append(pa.field(OFFSET, pa.int64()))


def read(engine: "Engine", view: str, since: int, wait: float = 0.0) -> ViewChanges:
    """Changes of ``view`` (a view or table) after offset ``since``, waiting up to ``wait`` s for one."""
    if since < 0:
        raise OffsetError(f"offset must be >= 0, not {since}")
    target = schema(engine, view)
    engine.wait_visible()  # read your writes, as reads do: every acknowledged change is in the history
    failed = engine.failed.get(view)
    if failed is not None:  # its history stopped: say so rather than report no changes
        raise failed_view_error(view, failed)
    found = engine.history.read(view, since, wait)
    if not found.entries:
        return ViewChanges(target.empty_table(), found.through)
    names = [f.name for f in target if f.name not in (WEIGHT, OFFSET)]
    parts = [
        delta.select(names + [WEIGHT]).append_column(OFFSET, pa.repeat(pa.scalar(offset, pa.int64()), delta.num_rows))
        for offset, delta in found.entries
    ]
    stacked = pa.concat_tables(parts, promote_options="permissive")
    grouped = engine.reader.run(
        f"{consolidate('{rows}', names + [OFFSET], template=True)} ORDER BY {quote(OFFSET)}", rows=stacked)
    ordered = grouped.select([f.name for f in target]).cast(target)
    return ViewChanges(ordered, found.through)
