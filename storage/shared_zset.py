"""A Z-set as a Delta table on shared storage: workers write its files, the driver commits them.

This is the state of a view maintained where the data is (issue 28): the
table lives under a storage root that every Spark executor reads directly,
so the driver handles file names, never rows.

* **Rows** carry the Z-set weight in ``__weight`` (storage/zset.py), as every
  stored relation does (storage/checkpoint.py). A version's content is the
  sum of the weights per distinct row over all its files: a batch appends its
  difference, and ``commit(..., overwrite=True)`` replaces the whole table
  with consolidated rows (compaction).
* **Who writes what.** A writer (a Spark job) writes Parquet files into a
  fresh directory under ``data/`` (``new_dir``). The driver then commits
  every file of that directory as one Delta version with ``deltalake``'s
  transaction API, reading only the files' Parquet footers for their row
  counts and key statistics. Spark needs no Delta jars (nothing may be
  downloaded here): it reads the Parquet files a version names (``files``).
* **Exactly once.** Each commit carries an app transaction (app id ``ivm``,
  version = the change-log offset it reflects), written atomically with its
  files. ``commit`` of an offset at or below the committed one adds nothing
  and removes the directory written for it, so a batch replayed after a
  crash (the writer ran again, or the driver died between the write and
  the commit) lands once. ``orphans`` names the directories no commit
  names: leftovers of a writer or driver killed mid-batch. Neither Spark
  nor deltalake syncs what it writes: the commit syncs the batch's files
  before naming them and its log entry after, as checkpoints do.
* **Laid out for lookups.** Writers sort their files by the table's
  ``cluster_by`` columns (the keys programs probe). The commit records each
  file's min and max of those columns (from the footers), so ``files`` with
  probe keys names only the files whose range holds one of them; Spark then
  reads those and joins. Only ordered fixed-width types get statistics here
  (Parquet may truncate string statistics); files without them are always
  read.

Local paths only for now: on object storage (``s3a://``, ``abfss://``) the
listing of a written directory and the footer reads go through the
store's file system, and a commit needs the store's conditional put (which
``deltalake`` has); see docs/spark.md.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction

from storage.checkpoint import APP_ID, OFFSET_KEY, StorageError, sync_path
from storage.hooks import hook
from storage.zset import WEIGHT

DATA = "data"
# Commit metadata key (besides OFFSET_KEY and the app transaction, as checkpoints write them):
DIR_KEY = "ivm.dir"
CLUSTER_KEY = "ivm.cluster_by"


def _has_stats(type_: pa.DataType) -> bool:
    """Types whose Parquet min/max are exact and order like the values (so they can prune)."""
    # not floats: NaN sorts above every number in SQL but Parquet statistics leave it out;
    # not timestamps yet: their text in Delta's statistics (time zone, precision) is untested
    return pa.types.is_integer(type_) or pa.types.is_date32(type_)


@dataclass(frozen=True)
class Committed:
    """What ``commit`` did: the new version (None: the offset was already committed) and rows added."""

    version: int | None
    files: int
    rows: int


class SharedZSet:
    """One Delta table of a Z-set under a storage root (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, table: DeltaTable):
        self.path = Path(path)
        self._table = table
        # Delta's configuration takes only keys it knows: ivm's own settings are the description (JSON)
        try:
            described = json.loads(table.metadata().description or "{}")
        except ValueError:
            described = {}
        self.cluster_by: tuple[str, ...] = tuple(described.get(CLUSTER_KEY) or ())

    # --- opening ---------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, schema: pa.Schema, cluster_by: tuple[str, ...] = ()) -> SharedZSet:
        """A new empty table of ``schema`` (``__weight`` is appended); an error if one is there."""
        if WEIGHT in schema.names:
            raise StorageError(f"a shared Z-set's schema must not hold {WEIGHT}: it is added")
        missing = [c for c in cluster_by if c not in schema.names]
        if missing:
            raise StorageError(f"cluster_by names columns the schema lacks: {missing}")
        if DeltaTable.is_deltatable(str(path)):
            raise StorageError(f"a table already exists at {path}")
        table = DeltaTable.create(
            str(path), schema.append(pa.field(WEIGHT, pa.int64())),
            description=json.dumps({CLUSTER_KEY: list(cluster_by)}),
        )
        return cls(path, table)

    @classmethod
    def open(cls, path: str | os.PathLike) -> SharedZSet:
        if not DeltaTable.is_deltatable(str(path)):
            raise StorageError(f"no shared Z-set at {path}")
        try:
            return cls(path, DeltaTable(str(path)))
        except Exception as e:  # deltalake's errors for a damaged log
            raise StorageError(f"cannot open the shared Z-set at {path}: {e}") from e

    # --- reading metadata --------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The rows' schema, ``__weight`` included."""
        return pa.schema(self._table.schema().to_arrow())

    @property
    def version(self) -> int:
        return self._table.version()

    @property
    def offset(self) -> int | None:
        """The change-log offset of the last commit (None: nothing committed yet)."""
        return self._table.transaction_version(APP_ID)

    def version_for(self, offset: int) -> int:
        """The version holding the state after ``offset``: the last commit for an offset at or below it.

        Version 0 (the empty table) when none is. Recovery reads every input of
        a replayed batch O at ``version_for(O - 1)``, whether or not a table
        already committed O before the crash.
        """
        found = 0
        for entry in self._table.history():
            committed = entry.get(OFFSET_KEY)
            if committed is not None and int(committed) <= offset:
                found = max(found, int(entry["version"]))
        return found

    def files(self, version: int | None = None, keys: dict[str, pa.Array] | None = None) -> list[str]:
        """Paths of the Parquet files of ``version`` (default: the latest).

        With ``keys`` (probe values of the cluster columns), only the files
        whose recorded [min, max] of the first cluster column holds one of the
        probe values, or that hold NULLs when a probe is NULL (lookups are
        NULL-safe), or that have no statistics.
        """
        table = self._table if version is None or version == self.version else self._at(version)
        actions = pa.table(table.get_add_actions(flatten=True))
        paths = [str(self.path / p) for p in actions.column("path").to_pylist()]
        column = self.cluster_by[0] if self.cluster_by else None
        if not keys or column is None or column not in keys or f"min.{column}" not in actions.column_names:
            return paths
        probe = keys[column]
        values = probe.drop_null().to_numpy(zero_copy_only=False)
        values = np.sort(values)
        low = actions.column(f"min.{column}")
        high = actions.column(f"max.{column}")
        nulls = actions.column(f"null_count.{column}")
        keep = np.ones(len(paths), dtype=bool)
        known = ~(np.asarray(low.is_null()) | np.asarray(high.is_null()))
        if known.any():
            lo = low.filter(pa.array(known)).to_numpy(zero_copy_only=False)
            hi = high.filter(pa.array(known)).to_numpy(zero_copy_only=False)
            # the probe values in [lo, hi]: searchsorted counts them without a loop over files
            inside = np.searchsorted(values, hi, side="right") > np.searchsorted(values, lo, side="left")
            keep[known] = inside
        if probe.null_count:
            keep |= np.asarray(nulls.fill_null(1).to_numpy(zero_copy_only=False)) > 0
        return [p for p, k in zip(paths, keep) if k]

    def _at(self, version: int) -> DeltaTable:
        table = DeltaTable(str(self.path))
        try:
            table.load_as_version(version)
        except Exception as e:
            raise StorageError(f"version {version} of {self.path} is not readable: {e}") from e
        return table

    def orphans(self) -> list[Path]:
        """Directories under ``data/`` that no commit names: a killed writer's or driver's leftovers."""
        root = self.path / DATA
        if not root.is_dir():
            return []
        named = {entry[DIR_KEY] for entry in self._table.history() if entry.get(DIR_KEY)}
        return sorted(p for p in root.iterdir() if p.is_dir() and p.name not in named)

    def remove_orphans(self) -> list[Path]:
        removed = self.orphans()
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    # --- writing ---------------------------------------------------------------
    def new_dir(self) -> Path:
        """A fresh directory for one writer's files (not yet created: writers create it)."""
        return self.path / DATA / uuid.uuid4().hex

    def commit(self, directory: str | os.PathLike, offset: int, overwrite: bool = False) -> Committed:
        """Commit every Parquet file in ``directory`` as one version reflecting ``offset``.

        ``overwrite``: the files replace the table's (they hold consolidated
        rows). An offset at or below the committed one commits nothing and
        removes ``directory`` (a replayed batch); an overwrite may repeat the
        committed offset (compaction leaves the content as it is). The files'
        schema must be the table's.
        """
        directory = Path(directory)
        if directory.parent != self.path / DATA:
            raise StorageError(f"{directory} is not a directory of {self.path / DATA} (new_dir)")
        if not self.accepts(offset, overwrite):
            shutil.rmtree(directory, ignore_errors=True)
            return Committed(None, 0, 0)
        files = sorted(directory.glob("*.parquet")) if directory.is_dir() else []
        schema = self.schema
        actions, rows = [], 0
        for file in files:
            add, count = self._add_action(file, schema)
            if count:  # a writer's empty partitions add nothing to read
                actions.append(add)
                rows += count
                sync_path(file)  # writers do not sync: a commit never names a file a power loss can take
        if actions:
            sync_path(directory)
            sync_path(directory.parent)
        hook("shared_zset.before_commit")
        properties = CommitProperties(
            app_transactions=[Transaction(APP_ID, offset)],
            custom_metadata={OFFSET_KEY: str(offset), DIR_KEY: directory.name},
        )
        try:
            self._table.create_write_transaction(actions, mode="overwrite" if overwrite else "append",
                                                 schema=schema, commit_properties=properties)
        except Exception as e:
            raise StorageError(f"commit to {self.path} failed: {e}") from e
        self._table.update_incremental()
        log = self.path / "_delta_log"
        sync_path(log / f"{self.version:020d}.json")  # deltalake does not sync its commits either
        sync_path(log)
        return Committed(self.version, len(actions), rows)

    def accepts(self, offset: int, overwrite: bool = False) -> bool:
        """Whether a commit for ``offset`` would change the table (not a replay of a committed batch)."""
        committed = self.offset
        return committed is None or offset > committed or (overwrite and offset == committed)

    def _add_action(self, file: Path, schema: pa.Schema) -> tuple[AddAction, int]:
        """The Delta add action of one written file: its size, row count and cluster keys' min/max (footer only)."""
        try:
            meta = pq.read_metadata(file)
        except Exception as e:
            raise StorageError(f"{file} is not a readable Parquet file: {e}") from e
        written = meta.schema.to_arrow_schema()
        if written.names != schema.names:
            raise StorageError(f"{file} has columns {written.names}, the table {schema.names}")
        stats: dict = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
        for name in self.cluster_by:
            index = written.get_field_index(name)
            if not _has_stats(schema.field(name).type):
                continue
            lows, highs, nulls = [], [], 0
            for g in range(meta.num_row_groups):
                column = meta.row_group(g).column(index).statistics
                if column is None or not column.has_null_count:
                    break
                nulls += column.null_count
                if column.has_min_max:
                    lows.append(column.min)
                    highs.append(column.max)
            else:
                stats["nullCount"][name] = nulls
                if lows:
                    stats["minValues"][name] = _json_value(min(lows))
                    stats["maxValues"][name] = _json_value(max(highs))
        size = file.stat().st_size
        mtime = int(file.stat().st_mtime * 1000)
        relative = f"{DATA}/{file.parent.name}/{file.name}"
        return AddAction(relative, size, {}, mtime, True, json.dumps(stats)), meta.num_rows


def _json_value(value):
    """A statistic as Delta's JSON stats hold it (dates and timestamps as ISO text)."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value
