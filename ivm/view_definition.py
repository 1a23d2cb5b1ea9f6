"""Defining a view: from its SELECT to the ViewDef the engine maintains, in one place.

CREATE MATERIALIZED VIEW, recovery (a checkpoint's manifest, a replan after
ALTER TABLE) and EXPLAIN all call ``define_view``, so a view means the same
thing however it came to be:

    view_query     -> the SELECT with its event-time rewrites (late events, EMIT)
    plan_view      -> the logical plan (sql_frontend.planner)
    make_view      -> the ViewDef: states, stored or computed-on-read output
    view_interval  -> an interval join's bounds on the stored rows it reads
    closed_windows -> what of the state may go when windows close; may switch the
                      view to stored output, so it comes after view_interval,
                      which asks whether the rows are computed on read

The order of the last two matters only when ``closed_windows`` switches the
view to stored rows, which happens only when it is first created (recovery
passes ``stored_output`` from the manifest and may not switch).
"""

from __future__ import annotations

from typing import Sequence

from sqlglot import exp

from sql_frontend.planner import plan_view
from ivm.catalog import Catalog, ViewDef, make_view
from ivm.streams.event_time import closed_windows, view_query
from ivm.streams.interval_join import view_interval


def define_view(name: str, sql: str, query: exp.Expression, catalog: Catalog, *,
                column_names: Sequence[str] | None = None, column_types: Sequence[str] | None = None,
                bigint_sums: bool = True, late: str | None = None, emit: str | None = None,
                engine: str | None = None, stored_output: bool | None = None) -> ViewDef:
    """The view ``name`` defined by ``query`` (its text ``sql``) over ``catalog``.

    ``column_names``/``column_types``: as created (``plan_view`` freezes them).
    ``stored_output``: None for a new view (its plan decides, and closing
    windows may make it store its rows); True or False for a view restored
    as it was stored (only True changes it, and nothing switches it).
    """
    rewritten = view_query(query, catalog, late, emit)
    plan = plan_view(rewritten, catalog, column_names, column_types, bigint_sums=bigint_sums)
    view = make_view(name, sql, plan)
    if stored_output and not view.stored_output:
        view.store_output()
    view.engine = engine
    view.late = late
    view.emit = emit
    view.interval = view_interval(view, rewritten, catalog)
    view.closed = closed_windows(view, query, catalog, may_store=stored_output is None or stored_output)
    return view
