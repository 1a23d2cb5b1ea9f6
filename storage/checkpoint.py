"""Stored relations (Delta Lake tables) and the checkpoint manifest.

Every stored relation is one Delta table under ``DIR/relations/<name>/``
(``deltalake``): Parquet files plus a ``_delta_log`` of atomic commits. A
relation's rows carry the Z-set weight in the int64 column ``__weight``
(the number of copies of the row; 1 for every row of a keyed table or a
set-valued view). Each commit carries, in its commit metadata, the change-log
offset it reflects (``ivm.offset``), the catalog generation
(``ivm.generation``), and an app transaction (app id ``ivm``, version = the
offset), so the offset is committed atomically with the data.

Delta Lake lacks a few Arrow types; such columns are stored as the nearest
type that holds every value (``storable_type``: TIME as int64 microseconds,
unsigned integers as the next wider signed type) and cast back on load.
Relations with types it cannot hold at all (INTERVAL) are refused at DDL.

A checkpoint is atomic across relations: first each changed relation gets a
Delta commit, then ``DIR/checkpoint.json`` (the manifest: offset, catalog,
each relation's Delta version, producer sequence numbers) is written to a
temporary file, synced and renamed over the old one. A crash between the
two leaves the old manifest, which names older versions (Delta time travel
keeps them). A relation commit left behind by such a crash is reused when
the same state (same offset, same catalog generation) is checkpointed again,
so replaying that commit is a no-op.

deltalake writes without syncing; the files of each commit are synced here.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema

from storage.hooks import hook

MANIFEST = "checkpoint.json"
RELATIONS = "relations"
APP_ID = "ivm"
FORMAT = 1


@dataclass(frozen=True)
class StoredVersion:
    dir: str  # directory name under relations/
    version: int
    bytes: int
    rows: int

    def to_json(self) -> dict:
        return {"dir": self.dir, "version": self.version, "bytes": self.bytes, "rows": self.rows}

    @staticmethod
    def from_json(doc: dict) -> "StoredVersion":
        return StoredVersion(doc["dir"], doc["version"], doc["bytes"], doc["rows"])


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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_name(relation: str) -> str:
    return quote(relation, safe="")


def relation_name(directory: str) -> str:
    return unquote(directory)


class RelationFiles:
    """The Delta tables under ``DIR/relations``."""

    def __init__(self, root: Path):
        self.root = Path(root) / RELATIONS
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, directory: str) -> Path:
        return self.root / directory

    def write(self, name: str, table: pa.Table, offset: int, generation: str) -> StoredVersion:
        """Commit ``table`` as the new contents of relation ``name``, stamped with ``offset``."""
        directory = dir_name(name)
        path = self.path(directory)
        reused = self._reusable(path, offset, generation)
        if reused is None:
            new = not path.exists()
            write_deltalake(
                str(path), table.cast(storable_schema(table.schema)), mode="overwrite", schema_mode="overwrite",
                commit_properties=CommitProperties(
                    custom_metadata={"ivm.offset": str(offset), "ivm.generation": generation},
                    app_transactions=[Transaction(app_id=APP_ID, version=offset)],
                ),
            )
            dt = DeltaTable(str(path))
            self._sync_version(path, dt)
            if new:
                _fsync(self.root)
        else:
            dt = reused
        return StoredVersion(directory, dt.version(), self._bytes(dt), table.num_rows)

    @staticmethod
    def _reusable(path: Path, offset: int, generation: str) -> DeltaTable | None:
        """The latest commit if it already holds this exact state (a commit left by a crash)."""
        if not (path / "_delta_log").exists():
            return None
        dt = DeltaTable(str(path))
        if dt.transaction_version(APP_ID) != offset:
            return None
        info = dt.history(1)[0]
        return dt if info.get("ivm.generation") == generation and info.get("ivm.offset") == str(offset) else None

    @staticmethod
    def _sync_version(path: Path, dt: DeltaTable) -> None:
        for uri in dt.file_uris():
            _fsync(Path(uri.removeprefix("file://")))
        log_dir = path / "_delta_log"
        _fsync(log_dir / f"{dt.version():020d}.json")
        _fsync(log_dir)
        _fsync(path)

    @staticmethod
    def _bytes(dt: DeltaTable) -> int:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return int(pa.compute.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0

    def files(self, stored: StoredVersion) -> list[str]:
        """Parquet files of one version: what an outside engine reads."""
        dt = DeltaTable(str(self.path(stored.dir)), version=stored.version)
        return [uri.removeprefix("file://") for uri in dt.file_uris()]

    def load(self, stored: StoredVersion, schema: pa.Schema) -> pa.Table:
        files = self.files(stored)
        if not files:
            return schema.empty_table()
        table = ds.dataset(files, format="parquet").to_table()
        return table.select(schema.names).cast(schema)

    def compact(self, stored: StoredVersion) -> None:
        """Drop files no version after ``stored`` needs (only when it is the latest)."""
        dt = DeltaTable(str(self.path(stored.dir)))
        if dt.version() == stored.version:
            dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
            dt.cleanup_metadata()

    def remove_others(self, keep: set[str]) -> None:
        """Delete the Delta tables of relations no longer in the manifest (dropped)."""
        for path in self.root.iterdir():
            if path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)


def read_manifest(root: Path) -> dict | None:
    path = Path(root) / MANIFEST
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {doc.get('format')}")
    return doc


def write_manifest(root: Path, doc: dict) -> None:
    """Replace the manifest atomically: temp file, sync, rename, sync the directory."""
    root = Path(root)
    tmp = root / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, **doc}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    hook("checkpoint.before_manifest")
    os.replace(tmp, root / MANIFEST)
    _fsync(root)
