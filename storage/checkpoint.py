"""Stored relations (Delta Lake tables) and the checkpoint manifest.

Every stored relation is one Delta table under ``DIR/relations/<dir>/``
(``deltalake``): Parquet files plus a ``_delta_log`` of atomic commits. A
relation's rows carry the Z-set weight in the int64 column ``__weight``.
``<dir>`` is an id, ``r<N>`` (``RelationFiles.new_dir``), never the SQL
name: any name a user may give (spaces, quotes, ``/``, non-ASCII, longer
than a file name may be) maps to a name every file system accepts. The
manifest maps each relation's name to its directory (``StoredVersion.dir``);
a relation keeps its directory until it is dropped, and a relation created
again gets a new one. Manifests written before ids hold the SQL name itself
as ``dir``; they load as they are.
Each commit carries, in its commit metadata, the change-log offset it
reflects (``ivm.offset``), the catalog generation (``ivm.generation``), the
rows and commits appended since the last overwrite (``ivm.appended``,
``ivm.appends``) and an app transaction (app id ``ivm``, version = the
offset), so the offset is committed atomically with the data.

A version's content is the sum of ``__weight`` per distinct row over all its
files. A commit either overwrites the relation (every row once, positive
weights: the number of copies) or appends its difference since the
previous stored version (``storage.relation.difference``: rows added with
+w, rows removed with -w), so a checkpoint writes in proportion to what
changed, not to what is stored. ``write_relation`` overwrites when it must
or should: no previous version in this process, a Delta commit after the
stored version (a crash leftover: appending would count it too), a
different schema, a small relation (``APPEND_MIN_ROWS``), too many appends
(``APPEND_MAX_COMMITS``) or appended rows past ``APPEND_SHARE`` of the
relation, and when asked to consolidate (COMPACT). ``load`` sums the
weights (``consolidate``) when the version has appends; a negative sum is
a corrupt store.

Delta Lake lacks a few Arrow types; such columns are stored as the nearest
type that holds every value (``storable_type``: TIME as int64 microseconds,
unsigned integers as the next wider signed type) and cast back on load.
Relations with types it cannot hold at all (INTERVAL) are refused at DDL.

A checkpoint is atomic across relations: first each changed relation gets a
Delta commit, then ``DIR/checkpoint.json`` (the manifest: offset, catalog,
each relation's Delta version and append counts, producer sequence numbers)
is written to a temporary file, synced and renamed over the old one. A
crash between the two leaves the old manifest, which names older versions
(Delta time travel keeps them). A relation commit left behind by such a
crash is reused when the same state (same offset, same catalog generation)
is checkpointed again, so replaying that commit is a no-op; any other
state is written whole over it. A checkpoint that fails before its rename
removes the directories it created (no manifest names them) and raises;
once renamed, the manifest is the database, so nothing after it undoes it.

Only a manifest decides what may be deleted: after one is written,
``remove_others`` deletes the directories under ``relations/`` that it does
not name (relations dropped, leftovers of crashed or failed checkpoints).
A data directory without a manifest is fresh only when ``relations/`` and
the change log hold nothing (the database writes its first, empty manifest
when it is created); otherwise opening it fails (``StorageError``), as it
does for a manifest that is not valid JSON of this format, and nothing is
deleted.

deltalake writes without syncing; the files of each commit are synced here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema

from storage import zset
from storage.zset import WEIGHT
from storage.errors import InternalError, IvmError
from storage.hooks import hook
from storage.relation import Difference, Relation, difference

log = logging.getLogger("ivm.checkpoint")

MANIFEST = "checkpoint.json"
RELATIONS = "relations"
APP_ID = "ivm"
# The commit metadata key of the change-log offset a commit reflects.
OFFSET_KEY = "ivm.offset"
FORMAT = 1
# Directory names this module gives relations (``new_dir``): r1, r2, ...
DIR_ID = re.compile(r"r([0-9]+)")


class StorageError(IvmError):
    """The stored relations or the manifest cannot be written or read (disk full, damage).

    Not a RuntimeError: the server reports it as UNAVAILABLE, not as a bug in ivm."""

# When a checkpoint appends a relation's difference instead of rewriting it whole
# (RelationFiles.write_relation). Module constants, so tests (tests/crash) can lower them.
#
# The rows appended since the last overwrite, this difference included, stay at most this
# share of the relation's rows; past it the relation is overwritten. An overwrite of N rows
# then follows at least N/2 appended rows, so a checkpoint writes at most 1 + 2 = 3 rows per
# row of difference over time, loading reads at most 1.5x the relation's rows, and the
# files readers sum never hold more than a third of cancelled rows.
APPEND_SHARE = 0.5
# Relations with fewer rows are overwritten: that costs ~0.4 us a row (~40 ms at 100,000
# rows, bench/ingest.py), near a commit's fixed cost, and keeps their files plain.
APPEND_MIN_ROWS = 100_000
# At most this many appended commits (files to read) since the last overwrite: tiny
# differences each checkpoint would otherwise pile up files until the share is reached.
APPEND_MAX_COMMITS = 64


@dataclass(frozen=True)
class StoredVersion:
    dir: str  # directory name under relations/
    version: int
    bytes: int
    rows: int  # rows of the relation (after summing the appended differences)
    # Differences appended since the version's last overwrite: rows and commits (0 for a
    # plain overwrite; absent in manifests written before appends existed, which is 0).
    appended: int = 0
    appends: int = 0

    def to_json(self) -> dict:
        return {"dir": self.dir, "version": self.version, "bytes": self.bytes, "rows": self.rows,
                "appended": self.appended, "appends": self.appends}

    @staticmethod
    def from_json(doc: dict) -> "StoredVersion":
        return StoredVersion(doc["dir"], doc["version"], doc["bytes"], doc["rows"],
                             doc.get("appended", 0), doc.get("appends", 0))


def failure_text(error: BaseException) -> str:
    """One line naming an error: deltalake's messages span lines, indented, with ANSI colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).replace("\u21b3", " ")
    return f"{type(error).__name__}: {' '.join(text.split())}"


def storable_type(t: pa.DataType) -> pa.DataType:
    """The type a column is stored as: Delta Lake has no TIME, unsigned integers,
    second-precision or non-"UTC"-named zoned timestamps. Loading casts back."""
    if pa.types.is_time(t):
        return pa.int64()  # microseconds (or nanoseconds) since midnight
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width, pa.decimal128(20, 0))
    if pa.types.is_timestamp(t):
        unit = "us" if t.unit == "s" else t.unit
        return pa.timestamp(unit, tz="UTC" if t.tz else None)
    return t


def storable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, storable_type(f.type), f.nullable) for f in schema])


def unstorable(schema: pa.Schema) -> str | None:
    """Why a relation with this schema cannot be stored, or None."""
    for field in storable_schema(schema):
        try:
            DeltaSchema.from_arrow(pa.schema([field]))
        except Exception:  # deltalake raises its own exception types per version
            return f"column {field.name} has type {field.type}, which Delta Lake cannot store"
    return None


def sync_path(path: Path) -> None:
    """fsync a file or a directory (its entries), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RelationFiles:
    """The Delta tables under ``DIR/relations``, one directory each, named by ``new_dir``."""

    def __init__(self, root: Path):
        self.root = Path(root) / RELATIONS
        self.root.mkdir(parents=True, exist_ok=True)
        self._last_id = max((int(m.group(1)) for m in map(DIR_ID.fullmatch, self.names()) if m), default=0)

    def path(self, directory: str) -> Path:
        return self.root / directory

    def names(self) -> list[str]:
        """What ``relations/`` holds (directories and anything else), sorted."""
        return sorted(p.name for p in self.root.iterdir())

    def new_dir(self) -> str:
        """A directory name for a relation stored for the first time: ``r<N>``, N above every
        id on disk since this process started, so a leftover of a crash is never reused."""
        while True:
            self._last_id += 1
            name = f"r{self._last_id}"
            if not self.path(name).exists():
                return name

    def write(self, directory: str, table: pa.Table, offset: int, generation: str) -> StoredVersion:
        """Commit ``table`` as the new contents of the relation in ``directory``, stamped with ``offset``."""
        path = self.path(directory)
        latest = self._latest(path)
        reused = self._reusable(path, latest, offset, generation, table.num_rows)
        return reused or self._overwrite(path, table, offset, generation)

    def write_relation(self, directory: str, relation: Relation, previous: tuple[Relation, StoredVersion] | None,
                       offset: int, generation: str, consolidate: bool = False) -> StoredVersion:
        """Commit a version of ``relation`` (in ``directory``) stamped with ``offset``: its
        difference from ``previous`` (the version stored last by this process) appended when
        that is safe and small enough (``_appendable``), else the whole relation.
        ``consolidate``: always the whole relation, as plain files (COMPACT)."""
        path = self.path(directory)
        latest = self._latest(path)
        if not consolidate:
            reused = self._reusable(path, latest, offset, generation, relation.num_rows)
            if reused is not None:
                return reused
            diff = self._appendable(relation, previous, latest)
            if diff is not None:
                if diff.rows == 0:  # same rows (say, an index added): the stored version holds them
                    return previous[1]
                try:
                    return self._append(path, diff, previous[1], relation.num_rows, offset, generation)
                except Exception:  # deltalake raises its own types (a schema the table refuses, ...)
                    # An overwrite is right whatever the append left (a commit or none): it replaces all.
                    log.warning("appending to %s failed; writing it whole", relation.name, exc_info=True)
        return self._overwrite(path, relation.table(), offset, generation)

    @staticmethod
    def _appendable(relation: Relation, previous: tuple[Relation, StoredVersion] | None,
                    latest: DeltaTable | None) -> Difference | None:
        """The difference to append, or None when the whole relation must be written."""
        if previous is None or latest is None or previous[0].schema != relation.schema:
            return None
        before, stored = previous
        if latest.version() != stored.version:
            # A commit after the version the manifest names (left by a crash, or by another
            # process): appending onto it would count its rows too.
            return None
        if relation.num_rows < APPEND_MIN_ROWS or stored.appends >= APPEND_MAX_COMMITS:
            return None
        diff = difference(before, relation)
        if stored.appended + diff.rows > APPEND_SHARE * relation.num_rows:
            return None
        return diff

    def _overwrite(self, path: Path, table: pa.Table, offset: int, generation: str) -> StoredVersion:
        new = not path.exists()
        write_deltalake(
            str(path), table.cast(storable_schema(table.schema)), mode="overwrite", schema_mode="overwrite",
            commit_properties=self._stamp(offset, generation, 0, 0),
        )
        dt = DeltaTable(str(path))
        self._sync_version(path, dt)
        if new:
            sync_path(self.root)
        return StoredVersion(path.name, dt.version(), self._bytes(dt), table.num_rows)

    def _append(self, path: Path, diff: Difference, stored: StoredVersion, rows: int, offset: int,
                generation: str) -> StoredVersion:
        appended, appends = stored.appended + diff.rows, stored.appends + 1
        table = diff.table()
        write_deltalake(str(path), table.cast(storable_schema(table.schema)), mode="append",
                        commit_properties=self._stamp(offset, generation, appended, appends))
        dt = DeltaTable(str(path))
        self._sync_version(path, dt)
        return StoredVersion(path.name, dt.version(), self._bytes(dt), rows, appended, appends)

    @staticmethod
    def _stamp(offset: int, generation: str, appended: int, appends: int) -> CommitProperties:
        return CommitProperties(
            custom_metadata={OFFSET_KEY: str(offset), "ivm.generation": generation,
                             "ivm.appended": str(appended), "ivm.appends": str(appends)},
            app_transactions=[Transaction(app_id=APP_ID, version=offset)],
        )

    @staticmethod
    def _latest(path: Path) -> DeltaTable | None:
        return DeltaTable(str(path)) if (path / "_delta_log").exists() else None

    def _reusable(self, path: Path, dt: DeltaTable | None, offset: int, generation: str,
                  rows: int) -> StoredVersion | None:
        """The latest commit if it already holds this exact state (a commit left by a crash)."""
        if dt is None or dt.transaction_version(APP_ID) != offset:
            return None
        info = dt.history(1)[0]
        if info.get("ivm.generation") != generation or info.get(OFFSET_KEY) != str(offset):
            return None
        return StoredVersion(path.name, dt.version(), self._bytes(dt), rows,
                             int(info.get("ivm.appended", 0)), int(info.get("ivm.appends", 0)))

    @staticmethod
    def _sync_version(path: Path, dt: DeltaTable) -> None:
        for uri in dt.file_uris():
            sync_path(Path(uri.removeprefix("file://")))
        log_dir = path / "_delta_log"
        sync_path(log_dir / f"{dt.version():020d}.json")
        sync_path(log_dir)
        sync_path(path)

    @staticmethod
    def _bytes(dt: DeltaTable) -> int:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return int(pa.compute.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0

    def files(self, stored: StoredVersion) -> list[str]:
        """Parquet files of one version: what an outside engine reads."""
        dt = DeltaTable(str(self.path(stored.dir)), version=stored.version)
        return [uri.removeprefix("file://") for uri in dt.file_uris()]

    def load(self, stored: StoredVersion, schema: pa.Schema, name: str = "") -> pa.Table:
        """The rows of one version of relation ``name``: its files summed per distinct row when
        differences were appended."""
        files = self.files(stored)
        if not files:
            return schema.empty_table()
        table = ds.dataset(files, format="parquet").to_table()
        if stored.appends:
            table = consolidate(table, name or stored.dir)
        return table.select(schema.names).cast(schema)

    def compact(self, stored: StoredVersion) -> None:
        """Drop files no version after ``stored`` needs (only when it is the latest)."""
        dt = DeltaTable(str(self.path(stored.dir)))
        if dt.version() == stored.version:
            dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
            dt.cleanup_metadata()

    def remove_others(self, manifest: dict) -> list[str]:
        """Delete the directories ``manifest`` (the one just written) does not name: relations
        dropped, leftovers of crashed or failed checkpoints. Only directories go (a file here is
        not ours); return their names."""
        keep = manifest_dirs(manifest)
        gone = [p for p in self.root.iterdir() if p.name not in keep and p.is_dir() and not p.is_symlink()]
        for path in gone:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in gone]

    def remove_new(self, directories: list[str], manifest: dict | None) -> None:
        """Delete directories a failed checkpoint created, unless ``manifest`` (the one in
        force) names them: no manifest refers to them, so they are the failed attempt's only trace."""
        keep = manifest_dirs(manifest) if manifest is not None else set()
        for name in directories:
            if name not in keep:
                shutil.rmtree(self.path(name), ignore_errors=True)


def consolidate(table: pa.Table, where: str = "") -> pa.Table:
    """Sum ``__weight`` per distinct row (all other columns; NULLs and NaNs group
    together) and drop rows whose sum is 0: the rows of a version with appended
    differences. A negative sum means the files are corrupt (more removed than stored)."""
    con = duckdb.connect()
    try:
        con.register("t", table)
        names = [n for n in table.column_names if n != WEIGHT]
        summed = con.sql(zset.consolidate("t", names, keep=zset.EVERY)).to_arrow_table()
    finally:
        con.close()
    weights = summed.column(WEIGHT)
    if summed.num_rows and pc.min(weights).as_py() < 0:
        count = pc.sum(pc.less(weights, 0)).as_py()
        raise InternalError(f"stored relation {where or '?'} is corrupt: {count} row(s) "
                            f"removed more often than stored (negative summed __weight)")
    return summed.filter(pc.greater(weights, 0))


def manifest_dirs(manifest: dict) -> set[str]:
    """The directories under ``relations/`` a manifest names."""
    return {entry["dir"] for part in ("relations", "outputs") for entry in manifest[part].values()}


# What a manifest must hold (and the JSON type of each), checked before anything relies on it.
_REQUIRED = {"offset": int, "generation": str, "checkpoint": int, "catalog": dict, "failed": dict,
             "sources": dict, "relations": dict, "outputs": dict}


def _manifest_problem(doc) -> str | None:
    if not isinstance(doc, dict):
        return f"it holds a JSON {type(doc).__name__}, not an object"
    if doc.get("format") != FORMAT:
        return f"unknown checkpoint format {doc.get('format')!r} (this version reads {FORMAT})"
    for key, kind in _REQUIRED.items():
        if not isinstance(doc.get(key), kind):
            return f"its {key!r} is missing or not a JSON {kind.__name__}"
    if not all(isinstance(doc["catalog"].get(k), list) for k in ("tables", "views")):
        return "its catalog has no list of tables and views"
    for part in ("relations", "outputs"):
        for name, entry in doc[part].items():
            if not isinstance(entry, dict) or not all(isinstance(entry.get(k), int) for k in ("version", "bytes", "rows")):
                return f"{part} entry {name!r} is not a stored version"
            directory = entry.get("dir")
            if not isinstance(directory, str) or directory in ("", ".", "..") or "/" in directory or "\\" in directory:
                return f"{part} entry {name!r} names no directory under {RELATIONS}/ ({directory!r})"
    return None


def read_manifest(root: Path) -> dict | None:
    """The manifest, or None when there is none; ``StorageError`` naming the file when it is
    damaged (not JSON, another format, a field missing): opening must stop, not guess."""
    path = Path(root) / MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StorageError(f"cannot read the checkpoint manifest {path}: {e.strerror or e}") from e
    try:
        doc = json.loads(text)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise StorageError(f"the checkpoint manifest {path} is damaged: not valid JSON ({e}); "
                           "the database does not open and nothing was changed") from None
    problem = _manifest_problem(doc)
    if problem is not None:
        raise StorageError(f"the checkpoint manifest {path} is damaged: {problem}; "
                           "the database does not open and nothing was changed")
    return doc


def write_manifest(root: Path, doc: dict, moments: tuple[str, ...] = ()) -> None:
    """Replace the manifest atomically: temp file, sync, rename, sync the directory.

    Raises only before the rename (the old manifest stands). After it the new one is in
    force, so a failed sync of the directory is logged, not raised: the caller must not
    undo what the file system already shows. ``moments``: more crash hooks before the rename
    (a DDL's checkpoint names its own)."""
    root = Path(root)
    tmp = root / (MANIFEST + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"format": FORMAT, **doc}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        for moment in ("checkpoint.before_manifest", *moments):
            hook(moment)
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        with contextlib.suppress(OSError):  # half written or never renamed: the old manifest stands
            tmp.unlink()
        raise
    try:
        sync_path(root)
    except OSError:
        log.exception("syncing %s after renaming the manifest failed", root)
