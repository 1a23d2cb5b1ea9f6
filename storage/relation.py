"""Stored relations: immutable, indexed Z-sets in memory (Arrow + numpy).

A relation is a tuple of *runs*. A run is an Arrow table written once (the
rows some step inserted, or the result of merging runs), a bitmap of which of
its rows are still live, and, per index, the run's key codes sorted with the
row positions they came from. This is an LSM tree / DBSP spine:

* a lookup probes every run with a binary search (numpy, vectorised) and
  gathers the matching live rows: work in proportion to the probes and the
  rows found, not to the relation;
* a change deletes rows by position (a copy-on-write bitmap) and appends a
  new run;
* runs are merged size-tiered: FAN_IN runs of one level (size FAN_IN**L up
  to FAN_IN**(L+1)) become one run of a higher level, and a newer run that
  outgrew an older one merges into it. A relation of N rows has O(FAN_IN
  log N) runs, and each row is rewritten about log_FAN_IN(N / run size)
  times over its life (the policy of halving sizes rewrote it log2 times:
  2.5x the copies, at fold-sized runs of 20,000-80,000 rows).

Every change returns a new Relation and leaves the old one intact, so a
reader holding a version keeps a consistent view and a failed step changes
nothing.
"""

from __future__ import annotations

import itertools
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.zset import POS, RUN, WEIGHT
from storage.errors import InternalError
from storage.buffers import fixed_width_values, int64_values, one_array
from storage.keys import KeyCoder, sorted_unique
from storage.spill import Spill

# Below this many live rows a lookup returns the whole relation: one copy is
# cheaper than probing, and the caller re-checks keys anyway.
SMALL_RELATION = 2048
# Probing costs about this many times a sequential row; with more probes than
# rows / PROBE_COST the whole relation is returned instead.
PROBE_COST = 8
# Size-tiered merges: FAN_IN runs of one level merge into one run of a higher level, so
# each row is rewritten about log_FAN_IN(N / run size) times, and a relation has at
# most FAN_IN - 1 runs per level for a lookup to probe.
LOG2_FAN_IN = 2
FAN_IN = 1 << LOG2_FAN_IN
# A run with at most one dead row per this many rows is read as zero-copy
# slices between its dead rows (one chunk each) rather than copied by a filter.
SLICE_RATIO = 256
# A lookup steps over at most this many equal codes per probe before it searches for the end.
EQUAL_STEPS = 4
# Up to this many probes into a run of up to SEARCH_END_CODES codes, a second binary search finds
# where each probe's codes end: two calls, where stepping over the equal codes takes ~10 per step
# (a MAX rescan's ~60 probes per run). Not in larger runs: there each search's ~25 steps miss the
# cache, where a step over equal codes reads the next code beside the last (SF 10's lineitem).
SEARCH_END_PROBES = 256
SEARCH_END_CODES = 1 << 16
# A run's index whose codes are integers packed densely (a key of one integer, date or
# decimal column: its codes are the values, storage/keys.py) also answers probes by offset:
# the rows of code c are rows[offsets[c - base]:offsets[c - base + 1]], two gathers per probe
# instead of a binary search (1,000 probes into the 2M codes of a table's key: ~0.5 ms
# searching, measured). Kept when the codes span at most DENSE_SPAN times the run's rows
# (4-8 bytes per value of the span), for runs of at least DENSE_MIN_ROWS rows (below that a
# search is cheap); hashed codes (keys of several columns, strings) never are.
DENSE_SPAN = 4
DENSE_MIN_ROWS = 16_384
# A run whose codes are not dense (the newest, small runs above all: a batch's 1,000 rows
# span the whole key range) first drops the probes its filter says are absent, so the
# binary search meets only those that may be there: one byte per bucket, FILTER_BUCKETS
# buckets per code (about one absent probe in eight passes), built at the first probe.
# 1,375 probes into a 1,000-row run: 49 us searching all, ~20 us filtered (measured).
# Above FILTER_MAX_ROWS a filter would be large and the run is searched as before; below
# FILTER_MIN_PROBES probes the search alone is cheaper than the filter's four calls.
FILTER_BUCKETS = 8
FILTER_MAX_ROWS = 1 << 16
FILTER_MIN_PROBES = 64
# Runs of at most this many rows answer ``is_live`` from their liveness unpacked once per version (a
# 64 KiB bool array at most); larger runs shift the packed bits per ask, since unpacking the 2M
# rows of a large run at each version would cost more than the few lookups that read it.
UNPACKED_LIVE_ROWS = 1 << 16
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: codes with a pattern spread too
# A merged run remembers where its rows came from this many merges back (Run.origin), so
# the difference of two versions (what a checkpoint appends) leaves out rows a merge only
# moved. Between two checkpoints a row is merged about once per level it climbs (fold-sized
# runs of ~20,000 rows to the largest: ~5 levels at 20M rows); rows merged more often are
# written as removed and added again, which is still right, only larger.
ORIGIN_DEPTH = 8

_serials = itertools.count()

# Run.origin: one entry per source run, in the order their rows were copied:
# (source serial, its liveness bits at the merge (None = all live), its n_rows, its origin
# (None: made from inserted rows, or past ORIGIN_DEPTH)).
Origin = tuple  # tuple[tuple[int, np.ndarray | None, int, "Origin | None"], ...]


Key = tuple[str, ...]


@dataclass(frozen=True)
class RunIndex:
    codes: np.ndarray  # sorted key codes (uint64)
    rows: np.ndarray  # row position of each code (int32 below 2**31 rows, else int64)
    # No code appears twice (a key index of a run, barring collisions): a probe finds at most
    # one row, where its binary search lands, so a lookup needs no second search.
    unique: bool = False
    # (base, offsets) once a probe asked for it, or None when the codes are not dense (see
    # DENSE_SPAN); built at the first probe, since most runs of a relation are never probed.
    _dense: list = field(default_factory=list, compare=False, repr=False)
    _filter: list = field(default_factory=list, compare=False, repr=False)  # (shift, buckets), see filter

    def filter(self) -> tuple[np.uint64, np.ndarray]:
        """(shift, buckets): a code c may be in the run only if ``buckets[(c * _GOLDEN) >> shift]``
        (no code of the run is ever missed; ~1/FILTER_BUCKETS of the others pass)."""
        if not self._filter:
            bits = max(10, int(FILTER_BUCKETS * max(len(self.codes), 1) - 1).bit_length())
            shift = np.uint64(64 - bits)
            buckets = np.zeros(1 << bits, dtype=bool)
            buckets[(self.codes * _GOLDEN) >> shift] = True
            self._filter.append((shift, buckets))
        return self._filter[0]

    def dense(self) -> tuple[int, np.ndarray] | None:
        """(base, offsets): the rows of code c are ``rows[offsets[c - base]:offsets[c - base + 1]]``;
        ``offsets`` ends with two entries equal to the run's length, so a probe outside the span,
        clipped to its end, finds nothing. None when the codes are not dense."""
        if not self._dense:
            self._dense.append(_dense_offsets(self.codes))
        return self._dense[0]


def _dense_offsets(codes: np.ndarray) -> tuple[int, np.ndarray] | None:
    n = len(codes)
    if n < DENSE_MIN_ROWS:
        return None
    base = int(codes[0])
    span = int(codes[-1]) - base + 1
    if span > DENSE_SPAN * n:
        return None
    counts = np.bincount((codes - np.uint64(base)).astype(np.intp), minlength=span)
    offsets = np.empty(span + 2, dtype=np.int32 if n < 2**31 else np.int64)
    offsets[0] = 0
    np.cumsum(counts, out=offsets[1:span + 1])
    offsets[span + 1] = n
    return base, offsets


def run_index(codes: np.ndarray, rows: np.ndarray) -> RunIndex:
    """The index of sorted ``codes`` (and their rows), knowing whether each code is there once."""
    unique = len(codes) < 2 or not bool(np.any(codes[1:] == codes[:-1]))
    return RunIndex(codes=codes, rows=rows, unique=unique)


def _numpy_values(column: pa.ChunkedArray) -> np.ndarray | None:
    """A one-chunk column of numbers, dates, times or decimals without NULLs, as numpy (decimal128:
    two int64 words per value); None otherwise."""
    if column.num_chunks != 1 or column.null_count:
        return None
    array = column.chunk(0)
    t = array.type
    if pa.types.is_decimal128(t):
        words = np.frombuffer(array.buffers()[1], dtype=np.int64, count=2 * len(array), offset=16 * array.offset)
        return words.reshape(-1, 2)
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date(t) or pa.types.is_time(t)
            or pa.types.is_timestamp(t) or pa.types.is_duration(t)):
        return None
    return fixed_width_values(array)


def _gathered(runs: Sequence["Run"], i: int, field_type: pa.DataType, parts: list[tuple[int, np.ndarray]]) -> pa.Array:
    """Column ``i`` of the rows ``parts`` names, as one array: numpy gathers where every run's column
    is plain values (a fancy index each), Arrow takes otherwise."""
    values = [runs[r].values(i) for r, _ in parts]
    if all(v is not None for v in values):
        gathered = values[0][parts[0][1]] if len(parts) == 1 else \
            np.concatenate([v[rows] for v, (_, rows) in zip(values, parts)])
        return pa.Array.from_buffers(field_type, len(gathered), [None, pa.py_buffer(np.ascontiguousarray(gathered))])
    pieces = [one_array(runs[r].table.column(i)).take(rows) for r, rows in parts]
    return pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table.cast(schema)``; DECIMAL(38,0) columns held as BIGINT (state counts: DuckDB's SUM of
    BIGINT is HUGEINT) are narrowed in numpy, a copy of their low words (~5x Arrow's cast kernel)."""
    columns = []
    for column, field_ in zip(table.columns, schema):
        narrowed = _narrowed(column, field_.type) if column.type != field_.type else column
        columns.append(column.cast(field_.type) if narrowed is None else narrowed)
    return pa.Table.from_arrays(columns, schema=schema)


def _narrowed(column: pa.ChunkedArray, target: pa.DataType) -> pa.Array | None:
    """A DECIMAL(p,0) column as int64 when every value fits (else None: Arrow's cast decides, and raises)."""
    t = column.type
    if not (pa.types.is_decimal128(t) and t.scale == 0 and target == pa.int64()) or sys.byteorder != "little":
        return None
    array = one_array(column)
    low, fits = int64_values(array)
    valid = None
    if array.null_count:
        valid = pc.is_valid(array).to_numpy(zero_copy_only=False)
        fits |= ~valid
    if not fits.all():
        return None
    return pa.array(low, pa.int64(), mask=None if valid is None else ~valid)


def all_live(n_rows: int) -> np.ndarray:
    """Packed liveness bits (LSB first, padding bits 0) with every one of ``n_rows`` rows live (a new array):
    ``np.packbits`` of ``n_rows`` ones without making them."""
    live = np.full((n_rows + 7) // 8, 0xFF, dtype=np.uint8)
    if n_rows % 8:
        live[-1] = (1 << (n_rows % 8)) - 1
    return live


def unpack_live(live: np.ndarray | None, n_rows: int) -> np.ndarray:
    """Packed liveness bits (LSB first; None = all live) as one bool per row."""
    if live is None:
        return np.ones(n_rows, dtype=bool)
    return np.unpackbits(live, count=n_rows, bitorder="little").view(bool)


@dataclass(frozen=True)
class Run:
    table: pa.Table  # one chunk per column; includes the weight column
    live: np.ndarray | None  # packed bits (LSB first), 1 = live; None = all live
    n_live: int
    indexes: dict[Key, RunIndex] = field(default_factory=dict)
    spilled: bool = False  # columns and indexes memory-mapped from unlinked files (storage/spill.py)
    # Identifies the run (its table and row positions) across versions; never reused.
    serial: int = field(default_factory=lambda: next(_serials))
    origin: Origin | None = None  # the runs a merge copied its rows from (see Origin)
    # Column number -> its values as a numpy view, or None (see ``values``); the table never
    # changes, so versions of the run (``replace``) share what was found.
    _values: dict = field(default_factory=dict, compare=False, repr=False)
    # ``live`` unpacked to one bool per row (``is_live``), made at the first ask: per version (init=False:
    # ``replace``, which makes a version with other liveness, starts it empty).
    _unpacked: list = field(default_factory=list, init=False, compare=False, repr=False)

    def values(self, i: int) -> np.ndarray | None:
        """Column ``i`` as a zero-copy numpy array when it is fixed-width (not boolean) and has no NULLs,
        so lookups gather it with one fancy index; else None (gathered by Arrow)."""
        if i not in self._values:
            self._values[i] = _numpy_values(self.table.column(i))
        return self._values[i]

    @property
    def n_rows(self) -> int:
        return self.table.num_rows

    def live_rows(self) -> np.ndarray:
        if self.live is None:
            return np.arange(self.n_rows, dtype=np.int64)
        return np.flatnonzero(unpack_live(self.live, self.n_rows))

    def packed_live(self) -> np.ndarray:
        """The liveness as packed bits (LSB first; padding bits 0), all ones when ``live`` is None."""
        if self.live is not None:
            return self.live
        return all_live(self.n_rows)

    def is_live(self, rows: np.ndarray) -> np.ndarray:
        if self.live is None:
            return np.ones(len(rows), dtype=bool)
        if self.table.num_rows <= UNPACKED_LIVE_ROWS:
            # One gather from the bits unpacked once for this version of the run (the seven calls
            # below, per probe of every run of a lookup, were ~8% of a batch's numpy calls).
            if not self._unpacked:
                self._unpacked.append(unpack_live(self.live, self.n_rows))
            return self._unpacked[0][rows]
        return ((self.live[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(bool)

    def live_table(self) -> pa.Table:
        """The live rows; zero-copy slices between the dead rows when those are few."""
        if self.live is None:
            return self.table
        bounds = self._live_bounds()
        if bounds is not None:
            return pa.concat_tables([self.table.slice(a, b - a) for a, b in bounds])
        return self.table.filter(self.live_mask())

    def _live_bounds(self) -> list[tuple[int, int]] | None:
        """[start, end) of the stretches between dead rows, when those are few (else None)."""
        dead = self.n_rows - self.n_live
        if dead * SLICE_RATIO > self.n_rows:
            return None
        gone = np.flatnonzero(~unpack_live(self.live, self.n_rows))
        starts = np.concatenate([[0], gone + 1])
        ends = np.concatenate([gone, [self.n_rows]])
        keep = ends > starts
        return [(int(a), int(b)) for a, b in zip(starts[keep], ends[keep])]

    def live_mask(self) -> pa.Array:
        """The liveness bits as an Arrow boolean array over the run's rows (zero-copy; ``live`` is not None)."""
        return pa.Array.from_buffers(pa.bool_(), self.n_rows, [None, pa.py_buffer(self.live)])

    def live_pieces(self) -> Callable[[int], list[pa.Array]]:
        """Column number -> the live values of that column, as arrays (zero-copy when few are dead)."""
        if self.live is None:
            return lambda i: self.table.column(i).chunks
        bounds = self._live_bounds()
        if bounds is not None:
            return lambda i: [self.table.column(i).slice(a, b - a).chunks[0] for a, b in bounds]
        mask = self.live_mask()
        return lambda i: self.table.column(i).filter(mask).chunks


def _row_positions(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Index row positions as int32 when they fit: 4 of the 12-16 bytes per row per index."""
    return rows.astype(np.int32 if n_rows < 2**31 else np.int64, copy=False)


def build_index(table: pa.Table, key: Key, coder: KeyCoder) -> RunIndex:
    codes = coder.codes(table, key)
    order = np.argsort(codes, kind="stable")
    return run_index(codes[order], _row_positions(order, table.num_rows))


def _one_array(pieces: list[pa.Array], type_: pa.DataType) -> pa.Array:
    if len(pieces) == 1:
        return pieces[0]
    return pa.concat_arrays(pieces) if pieces else pa.array([], type=type_)


def _new_run(schema: pa.Schema, columns: Iterable[pa.Array], n_rows: int,
             indexes: Callable[[pa.Table], dict[Key, RunIndex]], spill: Spill | None,
             origin: Origin | None = None) -> Run:
    """A run of all-live rows from ``columns`` (each made, and spilled, one at a time:
    a merge of spilled runs holds one column in anonymous memory, not the run)."""
    spilled = spill is not None and spill.wants(n_rows)
    arrays = [spill.array(a) if spilled else a for a in columns]
    table = pa.Table.from_arrays(arrays, schema=schema)
    built = indexes(table)
    if spilled:
        built = {k: _spilled_index(spill, i) for k, i in built.items()}
    return Run(table=table, live=None, n_live=n_rows, indexes=built, spilled=spilled, origin=origin)


def _spilled_index(spill: Spill, index: RunIndex) -> RunIndex:
    return RunIndex(codes=spill.numpy(index.codes), rows=spill.numpy(index.rows), unique=index.unique)


def make_run(table: pa.Table, keys: Sequence[Key], coder: KeyCoder, spill: Spill | None = None) -> Run:
    columns = (_one_array(c.chunks, c.type) for c in table.columns)
    return _new_run(table.schema, columns, table.num_rows,
                    lambda t: {key: build_index(t, key, coder) for key in keys if key}, spill)


def _gather(run: Run, index: RunIndex, probes: np.ndarray, hashed: np.ndarray | None = None) -> np.ndarray:
    """Live row positions of ``run`` whose code is one of ``probes`` (unique). ``hashed``: the probes'
    Fibonacci hashes (``probes * _GOLDEN``), made once for all the runs of a lookup: each
    run's filter takes its own shift of them."""
    dense = index.dense() if probes.dtype == np.uint64 else None
    if dense is not None:
        base, offsets = dense
        at = np.minimum(probes - np.uint64(base), np.uint64(len(offsets) - 2)).astype(np.intp)  # below base wraps
        lo = offsets[at].astype(np.int64)
        counts = offsets[at + 1] - lo
        if not index.unique:
            return _rows_from(run, index, lo, counts)
        found = lo[counts > 0]
    else:
        if (probes.dtype == np.uint64 and len(probes) >= FILTER_MIN_PROBES
                and len(index.codes) <= FILTER_MAX_ROWS):
            shift, buckets = index.filter()
            if hashed is None:
                hashed = probes * _GOLDEN
            probes = probes[buckets[hashed >> shift]]  # still sorted and unique
        lo = index.codes.searchsorted(probes)
        if not index.unique:
            return _rows_from(run, index, lo, _equal_from(index.codes, probes, lo))
        if not len(index.codes):
            return np.empty(0, dtype=np.int64)
        found = lo[index.codes.take(lo, mode="clip") == probes]
    if not len(found):  # (most small runs of a lookup hold none of its keys)
        return np.empty(0, dtype=np.int64)
    # A unique index: at most one row per probe, where its offset or search landed.
    rows = index.rows[found].astype(np.int64, copy=False)
    return rows if run.live is None else rows[run.is_live(rows)]


def _rows_from(run: Run, index: RunIndex, lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Live row positions of the index entries [lo, lo + counts) of each probe."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    rows = index.rows[starts + np.arange(total)].astype(np.int64, copy=False)
    return rows[run.is_live(rows)]


def _equal_from(codes: np.ndarray, probes: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """How many of the sorted ``codes`` from ``lo`` on equal each probe (``lo``: where each would go).

    The same as a second binary search (``side="right"``) minus ``lo``, but a key is
    in a run once or a few times, so stepping over its equal codes costs a compare
    per match instead of a search per probe (the searches were a tenth of an
    ingested batch's CPU). Keys repeated more than a few times are searched for.
    """
    if len(probes) <= SEARCH_END_PROBES and len(codes) <= SEARCH_END_CODES:
        return codes.searchsorted(probes, side="right") - lo
    counts = np.zeros(len(probes), dtype=np.int64)
    still = np.arange(len(probes))  # probes whose next code may still be equal
    for _ in range(EQUAL_STEPS):
        at = lo[still] + counts[still]
        inside = at < len(codes)
        still, at = still[inside], at[inside]
        still = still[codes[at] == probes[still]]
        if not len(still):
            return counts
        counts[still] += 1
    counts[still] = np.searchsorted(codes, probes[still], side="right") - lo[still]
    return counts


@dataclass(frozen=True)
class Relation:
    """One version of a stored relation."""

    name: str
    schema: pa.Schema  # relation columns + weight
    identity: Key
    runs: tuple[Run, ...] = ()
    index_keys: tuple[Key, ...] = ()
    # Where runs of many rows are spilled to (None: all in memory); carried to every version.
    spill: Spill | None = field(default=None, compare=False, repr=False)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)
    _cache_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @staticmethod
    def empty(name: str, schema: pa.Schema, identity: Key, index_keys: Sequence[Key] = (),
              spill: Spill | None = None) -> "Relation":
        keys = tuple(dict.fromkeys(k for k in (identity, *index_keys) if k))
        return Relation(name=name, schema=schema, identity=identity, index_keys=keys, spill=spill)

    @property
    def num_rows(self) -> int:
        return sum(run.n_live for run in self.runs)

    @property
    def num_bytes(self) -> int:
        return sum(run.table.nbytes for run in self.runs)

    @property
    def spilled_bytes(self) -> int:
        """Bytes of columns and indexes held in memory-mapped files (storage/spill.py)."""
        return sum(run.table.nbytes + sum(i.codes.nbytes + i.rows.nbytes for i in run.indexes.values())
                   for run in self.runs if run.spilled)

    # --- reads -------------------------------------------------------------
    def cached(self, key: object) -> object | None:
        """What ``remember`` kept with this version under ``key`` (None: nothing)."""
        with self._cache_lock:
            return self._cache.get(key)

    def remember(self, key: object, value: object) -> None:
        """Keep ``value`` with this version (rows derived from it, e.g. a reader's): it goes with the version."""
        with self._cache_lock:
            self._cache[key] = value

    def table(self) -> pa.Table:
        """All live rows (with the weight column); cached per version."""
        with self._cache_lock:
            cached = self._cache.get("table")
            if cached is None:
                parts = [run.live_table() for run in self.runs if run.n_live]
                # Chunked, not combined: the readers (DuckDB scans, Parquet) take chunks,
                # and a copy of a large table per version is what made whole reads dear.
                cached = pa.concat_tables(parts) if parts else self.schema.empty_table()
                self._cache["table"] = cached
            return cached

    def _with_positions(self, parts: list[tuple[int, np.ndarray]], positions: bool,
                        columns: list[str] | None = None) -> pa.Table:
        """The rows ``parts`` names ((run, row positions) pairs), and with ``positions`` their run and
        position (one pair of columns for all the parts: two Arrow calls, not two per run)."""
        schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
        if not parts:
            if positions:
                schema = schema.append(pa.field(RUN, pa.int32())).append(pa.field(POS, pa.int64()))
            return schema.empty_table()
        if sum(len(rows) for _, rows in parts) == 1:
            # One row (a point read's): a zero-copy slice of its run, not a gather per column (~10x).
            r, rows = parts[0]
            table = self.runs[r].table.slice(int(rows[0]), 1)
            table = table if columns is None else table.select(columns)
        else:
            # Column by column across the runs (one array each, not a chunk per run): numbers in numpy.
            numbers = [self.schema.get_field_index(f.name) for f in schema]
            table = pa.Table.from_arrays([_gathered(self.runs, i, f.type, parts) for i, f in zip(numbers, schema)],
                                         schema=schema)
        if positions:
            runs = np.repeat(np.array([r for r, _ in parts], dtype=np.int32), [len(rows) for _, rows in parts])
            rows = parts[0][1] if len(parts) == 1 else np.concatenate([rows for _, rows in parts])
            table = table.append_column(RUN, pa.array(runs)).append_column(POS, pa.array(rows, pa.int64()))
        return table

    def all_rows(self, positions: bool = False, columns: list[str] | None = None) -> pa.Table:
        return self._with_positions([(r, run.live_rows()) for r, run in enumerate(self.runs)], positions, columns)

    def between(self, column: str, low: pa.Scalar, high: pa.Scalar, positions: bool = False,
                columns: list[str] | None = None) -> pa.Table:
        """Live rows whose ``column`` lies in [``low``, ``high``] (NULLs never).

        ``low`` and ``high`` share a type the column is compared in (cast to
        it when it differs). A pass over one column of each run, with no
        index: the rows found are taken, the rest of the run is not read.
        """
        parts = []
        scaled = _scaled_bounds(self.schema.field(column).type, low, high)
        for r, run in enumerate(self.runs):
            values = run.table.column(column)
            if scaled is not None:
                rows = np.flatnonzero(np.concatenate([_decimal_inside(chunk, *scaled) for chunk in values.chunks]
                                                     or [np.empty(0, bool)]))
            else:
                if values.type != low.type:
                    values = values.cast(low.type)
                inside = pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
                rows = np.flatnonzero(inside.fill_null(False).to_numpy(zero_copy_only=False))
            rows = rows[run.is_live(rows)] if len(rows) else rows
            if len(rows):
                parts.append((r, rows))
        return self._with_positions(parts, positions, columns)

    def lookup(self, key: Key, probe_codes: np.ndarray, positions: bool = False, scan: bool = True,
               columns: list[str] | None = None, distinct: bool = False) -> pa.Table:
        """Live rows whose ``key`` code is among ``probe_codes``, maybe more.

        Callers must re-check keys: collisions, and small relations returned
        whole, add rows that do not match. ``scan=False``: probe the index
        however many probes there are (only a small relation is returned
        whole), for callers whose own work grows faster than linearly with
        the rows they get (a sort of them). ``columns``: only these (None:
        all, the weight included). ``distinct``: ``probe_codes`` are sorted and distinct
        already (``sorted_unique``'s result: not sorted again).
        """
        if not key:
            return self.all_rows(positions, columns)
        if key not in self.index_keys:
            raise InternalError(f"relation {self.name} has no index on ({', '.join(key)})")
        probes = probe_codes if distinct else sorted_unique(probe_codes)
        if len(probes) == 0:
            return self._with_positions([], positions, columns)
        live = self.num_rows
        if live <= SMALL_RELATION or (scan and len(probes) * PROBE_COST >= live):
            return self.all_rows(positions, columns)
        parts = []
        hashed = probes * _GOLDEN if probes.dtype == np.uint64 and len(probes) >= FILTER_MIN_PROBES else None
        for r, run in enumerate(self.runs):
            rows = _gather(run, run.indexes[key], probes, hashed)
            if len(rows):
                parts.append((r, rows))
        return self._with_positions(parts, positions, columns)

    # --- changes -----------------------------------------------------------
    def with_index(self, key: Key, coder: KeyCoder) -> "Relation":
        if not key or key in self.index_keys:
            return self
        runs = tuple(
            replace(run, indexes={**run.indexes, key: self._spilled(run, build_index(run.table, key, coder))})
            for run in self.runs
        )
        return replace(self, runs=runs, index_keys=self.index_keys + (key,), _cache={}, _cache_lock=threading.Lock())

    def _spilled(self, run: Run, index: RunIndex) -> RunIndex:
        if not run.spilled or self.spill is None:
            return index
        return _spilled_index(self.spill, index)

    def replace_rows(
        self, delete_runs: np.ndarray, delete_rows: np.ndarray, inserts: pa.Table | None, coder: KeyCoder
    ) -> "Relation":
        """A new version without the given rows and with ``inserts`` appended."""
        runs = list(self.runs)
        if len(delete_runs):
            for r, rows in _by_run(delete_runs, delete_rows):
                run = runs[r]
                byte = rows >> 3
                bit = np.left_shift(np.uint8(1), (rows & 7).astype(np.uint8))
                if run.live is None:
                    live = all_live(run.n_rows)
                else:
                    if not (run.live[byte] & bit).all():
                        raise InternalError(f"relation {self.name}: a row was deleted twice")
                    live = run.live.copy()
                np.bitwise_and.at(live, byte, ~bit)
                runs[r] = replace(run, live=live, n_live=run.n_live - len(rows))
        if inserts is not None and inserts.num_rows:
            if inserts.schema != self.schema:
                inserts = inserts.select(self.schema.names)
                if inserts.schema != self.schema:
                    inserts = _cast(inserts, self.schema)
            runs.append(make_run(inserts, self.index_keys, coder, self.spill))
        runs = [run for run in runs if run.n_live]
        runs = _settle(runs, self.index_keys, self.spill)
        return replace(self, runs=tuple(runs), _cache={}, _cache_lock=threading.Lock())

    def replace_all(self, table: pa.Table, coder: KeyCoder) -> "Relation":
        """A new version holding exactly ``table``."""
        runs = []
        if table.num_rows:
            runs = [make_run(table.select(self.schema.names).cast(self.schema), self.index_keys, coder, self.spill)]
        return replace(self, runs=tuple(runs), _cache={}, _cache_lock=threading.Lock())


# (run, row) pairs sort as one integer: the run above this many bits of row position.
_ROW_BITS = 40


def _by_run(runs: np.ndarray, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each run named in ``runs`` (ascending) with its distinct ``rows``, sorted (pairs given twice
    count once): one sort of the pairs, not a mask and a sort per run."""
    runs = np.asarray(runs, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    if int(runs.max()) >= 1 << (63 - _ROW_BITS) or int(rows.max()) >= 1 << _ROW_BITS or int(rows.min()) < 0:
        return [(int(r), sorted_unique(rows[runs == r])) for r in sorted_unique(runs)]
    pairs = sorted_unique((runs << _ROW_BITS) | rows)
    which = pairs >> _ROW_BITS
    starts = np.flatnonzero(np.concatenate(([True], which[1:] != which[:-1])))
    ends = np.append(starts[1:], len(pairs))
    low = pairs & ((1 << _ROW_BITS) - 1)
    return [(int(which[a]), low[a:b]) for a, b in zip(starts, ends)]


def _scaled_bounds(column_type: pa.DataType, low: pa.Scalar, high: pa.Scalar) -> tuple[int, int] | None:
    """Integer bounds on a DECIMAL column's unscaled values, or None to compare otherwise.

    A DECIMAL of at most 18 digits is an integer times 10**-scale that fits in
    64 bits, so comparing the integers in numpy replaces casting every value
    to a double (at SF 10, TPC-H customer's 1.5M balances: 8 ms a pass).
    Double bounds round outward to the next integer, so no value between
    them is left out.
    """
    if not (pa.types.is_decimal128(column_type) and column_type.precision <= 18 and pa.types.is_floating(low.type)
            and sys.byteorder == "little"):
        return None
    factor = 10 ** column_type.scale
    lo, hi = low.as_py() * factor, high.as_py() * factor
    limit = 2.0 ** 62
    if not (-limit < lo < limit and -limit < hi < limit):
        return None  # also infinities: the double comparison handles them
    return int(np.floor(lo)), int(np.ceil(hi))


def _decimal_inside(chunk: pa.Array, low: int, high: int) -> np.ndarray:
    """For each value of a decimal128 chunk: is it non-NULL with low <= unscaled value <= high?

    The low 64 bits of a decimal128 (little-endian two's complement) are the
    value itself when it fits in 64 bits, as every DECIMAL(18) or narrower does.
    """
    data = chunk.buffers()[1]
    if not len(chunk) or data is None:
        return np.zeros(len(chunk), dtype=bool)
    words = np.frombuffer(data, dtype=np.int64)
    unscaled = words[2 * chunk.offset: 2 * (chunk.offset + len(chunk)): 2]
    inside = (unscaled >= low) & (unscaled <= high)
    if chunk.null_count:
        inside &= pc.is_valid(chunk).to_numpy(zero_copy_only=False)
    return inside


def _level(run: Run) -> int:
    """Runs of FAN_IN**L to FAN_IN**(L+1) - 1 live rows are on level L."""
    return (max(run.n_live, 1).bit_length() - 1) // LOG2_FAN_IN


def _settle(runs: list[Run], keys: tuple[Key, ...], spill: Spill | None) -> list[Run]:
    """Merge runs until, oldest first, no run is on a lower level than the run after it and no
    level holds FAN_IN adjacent runs (size-tiered: oldest and largest first), so a lookup probes
    at most FAN_IN - 1 runs per level.

    Anywhere in the list, not only at its end: a run's level falls as its rows die (a state
    relation replaces the rows of every group a batch changes), and runs that fell mid-list
    must merge with their neighbours too. Checking only the newest runs let a view's group
    state keep 14 runs on average instead of 4 (per_customer at 2M rows), each probed by
    every lookup."""
    # A run that is mostly dead is rewritten on its own first.
    runs = [_merge([run], keys, spill) if run.n_live * 2 < run.n_rows else run for run in runs]
    while True:
        span = _next_merge([_level(run) for run in runs])
        if span is None:
            return runs
        start, end = span
        runs[start:end] = [_merge(runs[start:end], keys, spill)]


def _next_merge(levels: list[int]) -> tuple[int, int] | None:
    """[start, end) of the adjacent runs to merge next, newest first, or None when settled.

    >>> _next_merge([8, 6, 7])   # the older run fell below a newer one: the two merge
    (1, 3)
    >>> _next_merge([8, 6, 6, 6, 6, 5])   # FAN_IN runs on one level, not at the end
    (1, 5)
    >>> _next_merge([8, 7, 7, 7, 6, 5, 5]) is None
    True
    """
    for i in range(len(levels) - 1, 0, -1):
        if levels[i - 1] < levels[i]:
            return i - 1, i + 1
    for i in range(len(levels) - FAN_IN, -1, -1):
        if len(set(levels[i:i + FAN_IN])) == 1:
            return i, i + FAN_IN
    return None


def _merge(runs: list[Run], keys: tuple[Key, ...], spill: Spill | None) -> Run:
    """One run with the live rows of ``runs`` (oldest first; one run: compacted); indexes
    merged without re-hashing. Columns are combined one at a time, so merging spilled runs
    holds one column of the result in anonymous memory before it is spilled in turn.

    Each run's liveness is unpacked once and shared by every column and index: a merge is
    a few numpy calls per column, and merges are about a fifth of a small batch's cost
    (bench.core per_customer at 2M rows: ~8,000 rows merged per 1,000-row batch)."""
    n_rows = sum(run.n_live for run in runs)
    alive = [None if run.live is None else unpack_live(run.live, run.n_rows) for run in runs]
    kept = [None if a is None else np.flatnonzero(a) for a in alive]
    schema = runs[0].table.schema
    readers: list = [None] * len(runs)  # each run's live_pieces, made when a column needs Arrow

    def column(i: int, type_: pa.DataType) -> pa.Array:
        values = [run.values(i) for run in runs]
        if all(v is not None for v in values):  # plain values: one copy into the merged column
            out = np.empty((n_rows,) + values[0].shape[1:], dtype=values[0].dtype)
            at = 0
            for v, rows in zip(values, kept):
                n = len(v) if rows is None else len(rows)
                if rows is None:
                    out[at:at + n] = v
                else:
                    np.take(v, rows, axis=0, out=out[at:at + n])
                at += n
            return pa.Array.from_buffers(type_, n_rows, [None, pa.py_buffer(out)])
        for r, run in enumerate(runs):
            if readers[r] is None:
                readers[r] = run.live_pieces()
        return _one_array([p for read in readers for p in read(i)], type_)

    columns = (column(i, f.type) for i, f in enumerate(schema))
    origin = tuple((run.serial, run.live, run.n_rows, _truncated(run.origin, ORIGIN_DEPTH - 1)) for run in runs)
    return _new_run(schema, columns, n_rows, lambda table: _merged_indexes(runs, keys, alive), spill, origin)


def _truncated(origin: Origin | None, depth: int) -> Origin | None:
    if origin is None or depth <= 0:
        return None
    return tuple((serial, live, n, _truncated(sub, depth - 1)) for serial, live, n, sub in origin)


def _merged_indexes(runs: list[Run], keys: tuple[Key, ...], alive: list[np.ndarray | None]) -> dict[Key, RunIndex]:
    """Each key's index of the merged run: the runs' indexes without their dead rows, renumbered
    (``alive``: each run's rows as bools, None = all live) and offset, merged by a stable sort
    (timsort merges sorted runs in O(n log len(runs)))."""
    n_rows = sum(run.n_live for run in runs)
    dtype = np.int32 if n_rows < 2**31 else np.int64
    renumbers = [None if a is None else np.cumsum(a, dtype=dtype) - 1 for a in alive]
    starts = np.cumsum([0] + [run.n_live for run in runs[:-1]])
    indexes = {}
    for k in keys:
        if not k:
            continue
        if len(runs) == 1 and alive[0] is None:  # nothing to drop or renumber: the index as it is
            indexes[k] = runs[0].indexes[k]
            continue
        codes, rows = [], []
        for run, live, renumber, start in zip(runs, alive, renumbers, starts):
            index = run.indexes[k]
            if live is None:
                codes.append(index.codes)
                rows.append(index.rows.astype(dtype, copy=False) + dtype(start))
            else:
                keep = live[index.rows]
                codes.append(index.codes[keep])
                rows.append(renumber[index.rows[keep]] + dtype(start))
        if len(codes) == 1:
            indexes[k] = RunIndex(codes=codes[0], rows=rows[0], unique=runs[0].indexes[k].unique)
            continue
        codes, rows = np.concatenate(codes), np.concatenate(rows)
        order = np.argsort(codes, kind="stable")
        indexes[k] = run_index(codes[order], rows[order])
    return indexes


# --- the difference between two versions (what a checkpoint appends) ---------------------------

@dataclass(frozen=True)
class Difference:
    """The Z-set difference ``new - old`` of two versions of one relation, as parts of runs.

    Each part is (run, packed row mask or None for the run's live rows, sign). Found from
    the runs alone: a run is an immutable table, identified by its serial, and only its
    liveness bits change (deletes clear bits). Runs in both versions give the rows whose
    bit changed; runs only in ``new`` (inserted or merged) give their live rows, added;
    runs only in ``old`` (merged away or emptied) give the rows live in ``old``, removed,
    except rows a merge only moved: a merged run's ``origin`` maps its rows to the rows
    of its sources, so a live row copied from a row live in ``old`` is neither added nor
    removed. Without that map (origins past ORIGIN_DEPTH) a moved row appears twice,
    removed and added; the two cancel when the stored files are summed."""

    schema: pa.Schema
    parts: tuple[tuple[Run, np.ndarray | None, int], ...]
    rows: int  # rows of the difference (removed + added)

    def table(self) -> pa.Table:
        """The difference as rows with signed weights: +w for rows added, -w for rows removed."""
        weight = self.schema.get_field_index(WEIGHT)
        tables = []
        for run, mask, sign in self.parts:
            if mask is None:
                t = run.live_table()
            else:
                t = run.table.filter(pa.Array.from_buffers(pa.bool_(), run.n_rows, [None, pa.py_buffer(mask)]))
            if sign < 0:
                t = t.set_column(weight, self.schema.field(weight), pc.negate(t.column(weight)))
            tables.append(t)
        return pa.concat_tables(tables) if tables else self.schema.empty_table()


def difference(old: Relation, new: Relation) -> Difference:
    """``new - old`` (see Difference). Both must have the same schema."""
    if old.schema != new.schema:
        raise InternalError(f"relation {new.name}: no difference between versions of different schemas")
    try:
        return _difference(old, new, moved=True)
    except _Tangled:  # origins that do not fit a linear history: leave moved rows in
        return _difference(old, new, moved=False)


class _Tangled(Exception):
    pass


def _pack(mask: np.ndarray) -> np.ndarray:
    return np.packbits(mask, bitorder="little")


def _difference(old: Relation, new: Relation, moved: bool) -> Difference:
    before = {run.serial: run for run in old.runs}
    now = {run.serial for run in new.runs}
    gone = {serial: run for serial, run in before.items() if serial not in now}
    # old runs merged away -> per row: copied (by merges) into a row live in new
    survived: dict[int, np.ndarray] = {}
    parts: list[tuple[Run, np.ndarray | None, int]] = []
    rows = 0
    for run in new.runs:
        previous = before.get(run.serial)
        if previous is not None:
            if previous.live is run.live:
                continue
            was, is_ = previous.packed_live(), run.packed_live()
            for mask, sign in ((was & ~is_, -1), (is_ & ~was, 1)):
                count = int(np.bitwise_count(mask).sum())
                if count:
                    parts.append((run, mask, sign))
                    rows += count
            continue
        if not run.n_live:
            continue
        if moved and run.origin is not None:
            live = unpack_live(run.live, run.n_rows)
            added = live & ~_trace(run.origin, live, gone, now, survived)
            count = int(added.sum())
            if count:
                parts.append((run, _pack(added), 1))
                rows += count
        else:
            parts.append((run, None, 1))
            rows += run.n_live
    for serial, run in gone.items():
        if not run.n_live:
            continue
        kept = survived.get(serial)
        if kept is None:
            parts.append((run, None, -1))
            rows += run.n_live
            continue
        removed = unpack_live(run.live, run.n_rows) & ~kept
        count = int(removed.sum())
        if count:
            parts.append((run, _pack(removed), -1))
            rows += count
    return Difference(new.schema, tuple(parts), rows)


def _trace(origin: Origin, keep: np.ndarray, gone: dict[int, Run], now: set[int],
           survived: dict[int, np.ndarray]) -> np.ndarray:
    """Per row of a run made by a merge from ``origin``: is it a copy of a row live in the old
    version? ``keep``: its rows live in the new version, whose old originals are marked in
    ``survived`` (so they are not removed). Runs between the two versions are followed
    through their own origins; rows from inserted runs (or past ORIGIN_DEPTH) are new."""
    from_old = np.zeros(len(keep), dtype=bool)
    start = 0
    for serial, live, n_rows, sub in origin:
        if serial in now:
            raise _Tangled  # a source of a new run is still a run of the new version
        positions = np.flatnonzero(unpack_live(live, n_rows))
        end = start + len(positions)
        if end > len(keep):
            raise _Tangled
        source = gone.get(serial)
        if source is not None:
            if source.n_rows != n_rows:
                raise _Tangled
            was = unpack_live(source.live, source.n_rows)[positions]  # a copied row live in old: the same row
            taken = positions[keep[start:end] & was]
            mark = survived.setdefault(serial, np.zeros(n_rows, dtype=bool))
            if mark[taken].any():
                raise _Tangled  # one old row copied into two live rows
            mark[taken] = True
            from_old[start:end] = was
        elif sub is not None:
            source_keep = np.zeros(n_rows, dtype=bool)
            source_keep[positions] = keep[start:end]
            from_old[start:end] = _trace(sub, source_keep, gone, now, survived)[positions]
        start = end
    if start != len(keep):
        raise _Tangled
    return from_old
