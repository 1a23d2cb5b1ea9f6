"""Status: where each relation stands between the log head and stored state.

``SHOW STATUS``, ``db.status()`` and ``ivm status --data DIR`` report, per
relation (tables, views, operator state): rows in memory, the watermark
of a watermarked table (details per stream in ``facts["streams"]``: max
event time, lateness, late events counted), the offset of its
stored (checkpointed) version, the offset reads see (published), the log
head (last accepted offset), the lag of stored state behind the head in
changes and seconds (of the oldest change to the relation's tables that is
not stored yet), the stored size, the size of its columns in memory, and
the buffer: changed rows acknowledged but not yet folded into views, and
(views) how the last batches were maintained: incremental or recompute
(ivm/maintain/maintenance.py; the estimates are in ``facts["maintenance"]``), and
how many query steps ran compiled or on DuckDB (``facts["steps"]``). Database-wide facts (log segments,
truncations repaired at open, recovery, checkpoints, memory) come alongside.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from ivm.streams.event_time import as_time
from ivm.streams.names import ON_TIME_PREFIX

if TYPE_CHECKING:
    from ivm.catalog import ViewDef
    from ivm.engine import Engine

COLUMNS = [
    ("name", pa.string()), ("kind", pa.string()), ("rows", pa.int64()), ("stored_offset", pa.int64()),
    ("published_offset", pa.int64()), ("log_head", pa.int64()), ("lag_changes", pa.int64()),
    ("lag_seconds", pa.float64()), ("stored_bytes", pa.int64()), ("buffer_rows", pa.int64()),
    ("status", pa.string()), ("maintenance", pa.string()), ("engine", pa.string()),
    ("watermark", pa.string()), ("memory_bytes", pa.int64()),  # last: added after the others were in use
]


def base_tables(engine: "Engine", name: str) -> set[str]:
    catalog = engine.catalog
    if name in catalog.tables:
        return {catalog.tables[name].shadow_of or name}
    found: set[str] = set()
    for source in catalog.views[name].sources:
        found |= base_tables(engine, source)
    return found


def engine_status(engine: "Engine") -> dict:
    from ivm.durable.durable import DurableEngine

    durable = isinstance(engine, DurableEngine)
    snapshot = engine.store.snapshot
    now = time.time()
    unstored = engine.unstored() if durable else []
    queued = engine.maintainer.queued_by_table() if durable else {}
    stored_offset = engine.checkpointer.offset if durable else None
    relations = []
    catalog = engine.catalog

    for name in list(catalog.tables) + list(catalog.views):
        tables = base_tables(engine, name)
        mine = [e for e in unstored if e[3] in tables]
        owned = [name] if name in catalog.tables else [s.name for s in catalog.views[name].states]
        view = catalog.views.get(name)
        shadowed = catalog.tables[name].shadow_of if view is None else None
        table_kind = (("on-time rows of " if name.startswith(ON_TIME_PREFIX) else "watermark of ") + shadowed
                      if shadowed else "table")
        kinds = [(table_kind if view is None else "materialized view")] + ["view state"] * (len(owned) - 1)
        if view is not None and not view.stored_output:
            owned = [name] + owned
            kinds = ["materialized view (computed on read)"] + ["view state"] * (len(owned) - 1)
        for relation, kind in zip(owned, kinds):
            held = snapshot.relations.get(relation)
            relations.append({
                "name": relation, "kind": kind, "rows": held.num_rows if held is not None else None,
                "stored_offset": stored_offset, "published_offset": snapshot.offset, "log_head": engine.offset,
                "lag_changes": len(mine) if durable else 0,
                "lag_seconds": round(now - mine[0][1], 3) if mine else 0.0,
                "stored_bytes": engine.checkpointer.stored_bytes(relation) if durable else None,
                "buffer_rows": sum(queued.get(t, 0) for t in tables),
                "status": "failed: " + engine.failed[name] if name in engine.failed else "ok",
                "maintenance": _maintenance(engine, view) if view is not None and relation == name else None,
                # the engine that ran the view's last maintenance step (None: tables, or not run yet)
                "engine": engine.engine_used.get(name) if view is not None and relation == name else None,
                # watermarked tables: max event time seen - lateness (ivm/streams/event_time.py)
                "watermark": _watermark(engine, name) if relation == name else None,
                # its columns in the published snapshot (spilled runs: memory-mapped, counted too)
                "memory_bytes": held.num_bytes if held is not None else None,
            })
    facts = {"path": str(engine.path) if durable else None, "log_head": engine.offset,
             "published_offset": snapshot.offset, "stored_offset": stored_offset, "relations": relations,
             "maintenance": {"mode": engine.settings.maintenance,
                             "views": {v.name: maintenance_facts(v) for v in catalog.views.values()}},
             "engine": engine.settings.engine, "backfills": backfills(engine),
             # query step runs by path (ivm/execute/executor.py): compiled operators or DuckDB statements
             "steps": engine.step_counts(),
             # large runs in memory-mapped files (storage/spill.py): where, from how many rows, bytes now
             "spill": {"dir": str(engine.spill.directory) if engine.spill else None,
                       "rows": engine.spill.rows if engine.spill else None,
                       "bytes": sum(r.spilled_bytes for r in snapshot.relations.values())},
             # the published relations' columns (spilled ones included), and every Arrow buffer the
             # process holds (Arrow's allocator is per process: other databases' buffers count too)
             "memory": {"relation_bytes": sum(r.num_bytes for r in snapshot.relations.values()),
                        "arrow_allocated_bytes": pa.total_allocated_bytes()},
             "streams": {t.name: engine.watermarks.status(t) for t in catalog.tables.values()
                         if t.event_time is not None}}
    if durable:
        facts.update({
            "durable_offset": engine.log.durable, **{"log_" + k: v for k, v in engine.log.stats().items()},
            "log_truncations": list(engine.log.truncations), "recovered_records": engine.replayed,
            "recovery_seconds": round(engine.recovery_seconds, 3), "checkpoints": engine.checkpointer.count,
            "last_checkpoint_seconds": round(engine.checkpointer.last_duration, 3),
            "recent_checkpoint_seconds": [round(d, 3) for d in list(engine.checkpointer.durations)[-10:]],
            "checkpoint_error": engine.checkpointer.error, "folds": engine.maintainer.folds,
            "producers": {s: {"seq": q, "offset": o} for s, (q, o) in engine.producers.last().items()},
        })
        from ivm.cdc.postgres import sources_status

        facts["sources"] = sources_status(engine.path)
    return facts


def _watermark(engine: "Engine", name: str) -> str | None:
    table = engine.catalog.tables.get(name)
    return None if table is None or table.event_time is None else as_time(engine.watermarks.watermark(table))


def _maintenance(engine: "Engine", view: "ViewDef") -> str:
    """How the view was maintained: the mode, the last batch's path, the counts of each path."""
    cost = view.cost
    counts = ", ".join(f"{n} {path}" for path, n in cost.batches.items())
    return f"{engine.settings.maintenance}: last {cost.last or 'none'} ({counts})"


def maintenance_facts(view: "ViewDef") -> dict:
    """The view's cost model in numbers (seconds): estimates, batches and time per path."""
    cost = view.cost
    return {"last": cost.last or None, "batches": dict(cost.batches),
            "seconds": {k: round(v, 6) for k, v in cost.seconds.items()},
            "estimate_incremental": cost.incremental, "estimate_recompute": cost.recompute,
            "estimate_rebuild": cost.rebuild, "rebuilds": cost.rebuilds}


def status_table(facts: dict) -> pa.Table:
    """The per-relation rows as a table; the database-wide facts in schema metadata ``ivm.status``."""
    rows = facts["relations"]
    table = pa.table({name: pa.array([r[name] for r in rows], type) for name, type in COLUMNS})
    rest = {k: v for k, v in facts.items() if k != "relations"}
    return table.replace_schema_metadata({b"ivm.status": json.dumps(rest).encode()})


def backfills(engine: "Engine") -> dict[str, dict]:
    """Views being computed for the first time: steps done, seconds, and on Spark its running tasks.

    ``tasks_done``/``tasks`` count the tasks of the Spark stages running now
    (Spark's status tracker), so a long step shows progress between steps.
    """
    now = time.monotonic()
    found = {}
    for name, entry in list(engine.backfills.items()):
        entry = dict(entry)
        entry["seconds"] = round(now - entry.pop("started", now), 3)
        runner = engine.backfill_runners.get(name)
        tasks = getattr(runner, "task_progress", None)
        if tasks is not None:
            entry.update(tasks())
        found[name] = entry
    return found
