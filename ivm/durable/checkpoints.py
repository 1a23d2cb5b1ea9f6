"""Checkpoints: published state -> Delta tables + manifest, and back on open.

A checkpoint takes one published snapshot (tables and views at offset S),
commits every relation that changed since the last checkpoint as a new
Delta version (storage/checkpoint.py): its difference from the version this
process stored last (``self.stored`` keeps that Relation, so the difference
comes from the two versions' runs) appended, or the whole relation when
that is required or cheaper; COMPACT rewrites whole every relation with
appended differences. Then it atomically replaces the
manifest, which names S, the catalog, each relation's Delta version and the
producers' sequence numbers up to S. Afterwards the log segments entirely at
or below S may go (per the retention setting).

It runs in the background when enough changes are not stored yet
(``checkpoint_rows``) or the oldest is old enough (``checkpoint_seconds``),
at every DDL (the catalog is persisted only here, atomically with the offset
it reflects, so the log holds changes only), on COMPACT and on close.

Views computed on read (no stored output) also get their rows written whole, to
a relation directory of their own (the manifest's ``outputs``), whenever their
state changed: outside engines read every view the same way. Recovery never
reads those; it rebuilds from state.

Every stored relation - a table, a hidden twin, a view's state (``v__state``
and the like), a computed view's rows - lives in ``relations/r<N>``, a
directory chosen the first time it is stored (``RelationFiles.new_dir``) and
kept in the manifest beside its name; names never become paths.

A checkpoint that fails before its manifest is renamed changes nothing the
database relies on: the directories it created are removed, the manifest in
force and this object's record of it (``stored``, ``outputs``, ``offset``,
``generation``) stay as they were, and the error is raised. Once the manifest
is renamed the checkpoint has happened: what follows (dropping directories
the manifest no longer names, rolling the log) is logged on failure, shown in
``error``, and never raised - a caller must not undo a stored catalog.

On open, a missing manifest is a fresh database only when ``relations/`` and
the log are empty (a crash while creating it); the first open writes an empty
manifest at once, so every later state has one. Anything else without a
manifest is damage: the open stops naming what is there, and deletes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import ContextManager, Protocol

import pyarrow as pa
import sqlglot
from sqlglot import exp

from delta_operators.merge import output_key, output_state
from storage.zset import WEIGHT
from ivm.binder import quote
from ivm.catalog import Catalog, TableDef, ViewDef
from ivm.execute.worker import Worker
from ivm.ingest.producers import Producers
from ivm.reads.observations import Observations
from ivm.reads.reads import Reader
from ivm.view_definition import define_view
from sql_frontend.errors import InternalError
from sql_frontend.plan import Column
from sql_frontend.statements import parse_query
from storage.checkpoint import MANIFEST, RELATIONS, RelationFiles, StorageError, StoredVersion, read_manifest, \
    write_manifest
from storage.hooks import hook
from storage.relation import Relation
from storage.log import ChangeLog
from storage.store import Snapshot, Store


class Folds(Protocol):
    fold_lock: ContextManager  # held while a fold runs: a checkpoint stores no half-folded state


class Checkpointed(Protocol):
    """What checkpoints store and recovery loads (the durable engine has it)."""

    catalog: Catalog
    store: Store
    failed: dict[str, str]
    generation: str
    producers: Producers
    observed: Observations
    log: ChangeLog
    reader: Reader
    small: Worker
    maintainer: Folds

    def empty_relation(self, name: str, columns: tuple[Column, ...], identity: tuple[str, ...],
                       indexes: tuple[tuple[str, ...], ...] = ()) -> Relation: ...

    def checkpoint_due(self) -> bool: ...

    def after_checkpoint(self, offset: int) -> None: ...

log = logging.getLogger("ivm.checkpoint")


def describe_catalog(catalog: Catalog) -> dict:
    tables = [
        {"name": t.name, "columns": [[c.name, c.type] for c in t.columns], "primary_key": list(t.primary_key),
         "not_null": sorted(t.not_null), "defaults": {c: e.sql("duckdb") for c, e in t.defaults.items()},
         "append_only": t.append_only, "event_time": t.event_time, "lateness_us": t.lateness_us,
         "shadow_of": t.shadow_of, "retain_us": t.retain_us}
        for t in catalog.tables.values()
    ]
    views = [describe_view(v) for v in catalog.views.values()]
    # PostgreSQL OIDs (ivm/catalog.py): stored so that they outlive a restart
    return {"tables": tables, "views": views, "oids": dict(catalog.oids), "next_oid": catalog.next_oid}


def describe_view(view: ViewDef, sql: str | None = None) -> dict:
    """What the manifest keeps of a view (``sql``: another text of its SELECT to keep instead)."""
    return {"name": view.name, "sql": view.sql if sql is None else sql, "columns": list(view.column_names),
            "types": [c.type for c in view.plan.columns], "stored_output": view.stored_output,
            "engine": view.engine, "late": view.late, "emit": view.emit}


def table_from_json(doc: dict) -> TableDef:
    return TableDef(
        name=doc["name"],
        columns=tuple(Column(n, t) for n, t in doc["columns"]),
        primary_key=tuple(doc["primary_key"]),
        not_null=frozenset(doc["not_null"]),
        defaults={c: sqlglot.parse_one(sql, read="duckdb") for c, sql in doc["defaults"].items()},
        append_only=doc.get("append_only", False),
        event_time=doc.get("event_time"),
        lateness_us=doc.get("lateness_us", 0),
        shadow_of=doc.get("shadow_of"),
        retain_us=doc.get("retain_us"),
    )


def view_from_json(doc: dict, catalog: Catalog) -> ViewDef:
    # The types the view was created with; a view stored before they were
    # recorded has DuckDB's (HUGEINT integer sums, see sql_frontend/integer_sums.py).
    types = doc.get("types")
    return define_view(doc["name"], doc["sql"], parse_query(doc["sql"]), catalog, column_names=tuple(doc["columns"]),
                       column_types=types, bigint_sums=types is not None, late=doc.get("late"),
                       emit=doc.get("emit"), engine=doc.get("engine"), stored_output=bool(doc["stored_output"]))


class Checkpointer:
    def __init__(self, engine: Checkpointed, root: Path):
        self.engine = engine
        self.root = Path(root)
        self.files = RelationFiles(self.root)
        self.lock = threading.RLock()
        self.offset = 0  # of the current manifest
        self.generation = ""
        self.count = 0
        self.last_duration = 0.0
        self.durations: deque[float] = deque(maxlen=1000)  # seconds of the latest checkpoints
        self.written: deque[tuple[int, int]] = deque(maxlen=1000)  # their (rows appended, rows overwritten)
        self.stored: dict[str, tuple[Relation, StoredVersion]] = {}
        self.outputs: dict[str, tuple[tuple[Relation, ...], StoredVersion]] = {}
        self.error: str | None = None
        self._manifest: dict | None = None  # the manifest in force (read on open, or written last)
        self._appended = self._overwritten = 0  # rows written by the checkpoint in progress
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ivm-checkpointer", daemon=True)

    # --- background ------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if not self.engine.checkpoint_due():
                continue
            try:
                self.checkpoint()
            except Exception as e:  # retried at the next interval; shown in status
                self.error = f"{type(e).__name__}: {e}"
                log.exception("checkpoint failed")
                self._stop.wait(1.0)

    # --- writing ---------------------------------------------------------------------------
    def checkpoint(self, force: bool = False, consolidate: bool = False, ddl: bool = False) -> bool:
        """Store the published snapshot; False when nothing changed since the last one.

        ``consolidate`` (COMPACT): also rewrite whole every relation stored with appended
        differences, so each is plain files again. ``ddl``: the checkpoint of a catalog
        change (its own crash hooks, ``ddl.*``). Raises only when the manifest was not
        replaced (see the module docstring)."""
        engine = self.engine
        with self.lock:
            with engine.maintainer.fold_lock:
                snapshot = engine.store.snapshot
                generation = engine.generation
                if consolidate and any(s.appends for _, s in self.stored.values()):
                    force = True
                if not force and snapshot.offset == self.offset and generation == self.generation:
                    return False
                catalog = describe_catalog(engine.catalog)
                failed = dict(engine.failed)
                sources = engine.producers.upto(snapshot.offset)
                # (a computed view whose state is stale keeps its rows as a relation: written with the others)
                computed = [v for v in engine.catalog.views.values()
                            if not v.stored_output and v.name not in failed and v.name not in snapshot]
            start = time.perf_counter()
            self._appended = self._overwritten = 0
            created: list[str] = []  # directories this checkpoint made: no manifest names them yet
            try:
                stored = self._write_relations(snapshot, generation, consolidate, created, ddl)
                outputs = self._write_outputs(computed, snapshot, generation, created)
                doc = self._document(snapshot, generation, self.count + 1, catalog, failed, sources, stored, outputs)
                write_manifest(self.root, doc, ("ddl.before_manifest",) if ddl else ())
            except BaseException:
                self.files.remove_new(created, self._manifest)
                raise
            hook("checkpoint.after_manifest")
            if ddl:
                hook("ddl.after_manifest")
            self._manifest = doc
            self.stored, self.outputs = stored, outputs
            self.offset, self.generation = snapshot.offset, generation
            self.count += 1
            self.last_duration = time.perf_counter() - start
            self.durations.append(self.last_duration)
            self.engine.observed.checkpoint_seconds.observe(self.last_duration)
            self.written.append((self._appended, self._overwritten))
            self.error = None
            try:
                engine.after_checkpoint(snapshot.offset)
                self.files.remove_others(doc)
            except Exception as e:  # the checkpoint stands; the next one tries again
                self.error = f"after checkpoint {self.count}: {type(e).__name__}: {e}"
                log.exception("cleaning up after checkpoint %d failed", self.count)
            return True

    @staticmethod
    def _document(snapshot: Snapshot, generation: str, count: int, catalog: dict, failed: dict, sources: dict,
                  stored: dict, outputs: dict) -> dict:
        return {
            "offset": snapshot.offset, "generation": generation, "checkpoint": count,
            "counters": dict(snapshot.counters),
            "written_at": time.time(), "catalog": catalog, "failed": failed, "sources": sources,
            "relations": {name: s.to_json() for name, (_, s) in stored.items()},
            "outputs": {name: s.to_json() for name, (_, s) in outputs.items()},
        }

    def _write_relations(self, snapshot: Snapshot, generation: str, consolidate: bool, created: list[str],
                         ddl: bool) -> dict[str, tuple[Relation, StoredVersion]]:
        stored = {}
        for name, relation in snapshot.relations.items():
            previous = self.stored.get(name)
            if previous is not None and previous[0] is relation and not (consolidate and previous[1].appends):
                stored[name] = previous
                continue
            directory = previous[1].dir if previous is not None else self._new_dir(created)
            version = self.files.write_relation(directory, relation, previous, snapshot.offset, generation,
                                                consolidate)
            stored[name] = (relation, version)
            if previous is None or version != previous[1]:
                if version.appends:
                    self._appended += version.appended - (previous[1].appended if previous else 0)
                else:
                    self._overwritten += version.rows
            hook("checkpoint.between_relations")
            if ddl:
                hook("ddl.between_relations")
        return stored

    def _write_outputs(self, views: list[ViewDef], snapshot: Snapshot, generation: str, created: list[str]) -> dict:
        outputs = {}
        for view in views:
            state = tuple(snapshot[s.name] for s in view.states)
            previous = self.outputs.get(view.name)
            if previous is not None and all(a is b for a, b in zip(previous[0], state)):
                outputs[view.name] = previous
                continue
            rows = self.engine.reader.query(f"SELECT * FROM {quote(view.name)}",
                                            exp.Table(this=exp.to_identifier(view.name)), snapshot, internal=True)
            rows = rows.replace_schema_metadata(None)
            rows = rows.append_column(WEIGHT, pa.array([1] * rows.num_rows, pa.int64()))
            directory = previous[1].dir if previous is not None else self._new_dir(created)
            outputs[view.name] = (state, self.files.write(directory, rows, snapshot.offset, generation))
        return outputs

    def _new_dir(self, created: list[str]) -> str:
        created.append(self.files.new_dir())
        return created[-1]

    # --- reading (on open) ---------------------------------------------------------------
    def restore(self) -> int:
        """Load the manifest's catalog and relations into the engine; return its offset."""
        doc = read_manifest(self.root)
        if doc is None:
            self._start_fresh()
            return 0
        engine = self.engine
        relations: dict[str, Relation] = {}
        stored_docs = {name: StoredVersion.from_json(s) for name, s in doc["relations"].items()}
        # (a manifest written before OIDs were stored has none: they are assigned in its order, as then)
        engine.catalog.load_oids(doc["catalog"].get("oids", {}), doc["catalog"].get("next_oid"))
        for table_doc in doc["catalog"]["tables"]:
            table = table_from_json(table_doc)
            engine.catalog.add_table(table)
            empty = engine.empty_relation(table.name, table.columns, table.identity, (table.identity,))
            relations[table.name] = self._load(empty, stored_docs)
        for view_doc in doc["catalog"]["views"]:
            view = view_from_json(view_doc, engine.catalog)
            engine.catalog.add_view(view)
            for spec in view.states:
                empty = engine.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
                relations[spec.name] = self._load(empty, stored_docs)
            if not view.stored_output and view.name in stored_docs:  # its state is stale: its rows were stored
                spec = output_state(view.name, view.columns, output_key(view.plan.root))
                empty = engine.empty_relation(spec.name, spec.columns, spec.identity, spec.indexes)
                relations[view.name] = self._load(empty, stored_docs)
        engine.failed.update(doc["failed"])
        engine.producers.load(doc["sources"])
        snapshot = Snapshot().with_changes(relations, offset=doc["offset"]).with_counts(doc.get("counters", {}))
        engine.store.publish(snapshot)
        self.stored = {name: (relations[name], stored_docs[name]) for name in relations}
        self.offset, self.generation, self.count = doc["offset"], doc["generation"], doc["checkpoint"]
        self._manifest = doc
        engine.generation = doc["generation"]
        self.outputs = {
            name: (tuple(relations[s.name] for s in engine.catalog.views[name].states), StoredVersion.from_json(s))
            for name, s in doc["outputs"].items() if name in engine.catalog.views
        }
        return doc["offset"]

    def _load(self, empty: Relation, stored: dict[str, StoredVersion]) -> Relation:
        if empty.name not in stored:
            raise InternalError(f"the checkpoint manifest has no stored relation {empty.name}")
        path = self.files.path(stored[empty.name].dir)
        if not (path / "_delta_log").is_dir():
            raise StorageError(f"relation {empty.name} is stored in {path} (the checkpoint manifest says so), "
                               "which is missing or holds no Delta table: the database does not open")
        table = self.files.load(stored[empty.name], empty.schema, empty.name)
        return empty.replace_all(table, self.engine.small.coder)

    def _start_fresh(self) -> None:
        """No manifest: a new database (write its first, empty manifest now), or a damaged one."""
        found = [f"{RELATIONS}/{name}" for name in self.files.names()]
        found += [f"log/{path.name}" for _, path in self.engine.log.segments() if path.stat().st_size]
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
            raise StorageError(
                f"{self.root / MANIFEST} is missing, but the directory holds stored data ({shown}): "
                "the manifest that says which of it is the database is gone, so the database does not open "
                "and nothing was changed (restore checkpoint.json from a backup)")
        doc = self._document(self.engine.store.snapshot, self.engine.generation, 0,
                             describe_catalog(self.engine.catalog), {}, {}, {}, {})
        write_manifest(self.root, doc)
        self._manifest = doc
        self.generation = self.engine.generation

    def stored_bytes(self, name: str) -> int | None:
        found = self.stored.get(name) or self.outputs.get(name)
        return found[1].bytes if found else None

    def files_of(self, name: str) -> list[str]:
        """The Parquet files of a relation's or computed view's current stored version."""
        found = self.stored.get(name) or self.outputs.get(name)
        if found is None:
            raise InternalError(f"{name} has no stored version yet")
        return self.files.files(found[1])

    def compact_files(self) -> int:
        """Vacuum every relation's Delta table down to its current version."""
        count = 0
        for _, stored in list(self.stored.values()) + list(self.outputs.values()):
            self.files.compact(stored)
            hook("compact.vacuum")
            count += 1
        return count


__all__ = ["Checkpointer", "describe_catalog", "describe_view", "view_from_json"]
