"""Key codes: 64-bit values that equal keys share, for index lookups.

Two keys that are equal (with NULL equal to NULL) always get the same code;
two different keys usually do not. Indexes only ever use codes to find
candidate rows; the SQL that follows re-checks keys exactly, so a collision
costs a little work and never a wrong answer.

A single integer column is its own code (no hashing at all); anything else
is hashed here, in numpy, column by column (``hash_columns``): integers of
any width by value, -0.0 as 0.0 and every NaN alike (as DuckDB's joins and
GROUP BY compare them), decimals by their unscaled value, dates and times
by their integer, strings and binaries by their bytes. A key holding a type
this does not hash (nested values, intervals, which DuckDB compares
normalized: 1 month = 30 days) is hashed by DuckDB's ``hash()``; the
choice depends on the key's types alone, so a relation's index and its
probes always agree.

Codes live only in memory (indexes are rebuilt when a database is opened),
so the hash may change between versions. It was DuckDB's ``hash()`` for
every multi-column key: a statement of ~1.5 ms per lookup or new run, where
these few numpy passes cost tens of microseconds for a 1,000-row batch.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.buffers import fixed_width_values

NULL_CODE = np.uint64(0x9E3779B97F4A7C15)  # any value works: collisions are re-checked
# A NULL value of a hashed column (the same for every type, as in DuckDB's hash()).
NULL_HASH = np.uint64(0xD6E8FEB86659FD93)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STEP = np.uint64(0x9E3779B97F4A7C15)
_BYTE = np.uint64(0x100000001B3)  # FNV's prime: odd, so a byte's weight P**j is never 0 mod 2**64
_HIGH = np.uint64(0xC2B2AE3D27D4EB4F)
_SEED = np.uint64(0x27D4EB2F165667C5)
# Bytes of strings hashed in one pass: bounds the temporaries (8 bytes per byte) of hashing a large run.
BYTES_PER_PASS = 1 << 22


# Up to this many 64-bit values numpy's stable sort (timsort) is faster than its default
# (introsort): 1,400 codes 14.5 vs 19.8 us, 4,000 48 vs 79 us; at 8,000 the default wins
# (249 vs 188 us), measured here. A batch's keys are ~1,000-1,400.
STABLE_SORT_MAX = 6_000


def sort_kind(n: int) -> str | None:
    """The faster ``kind`` for sorting ``n`` 64-bit values, where any order of equal values will do."""
    return "stable" if n <= STABLE_SORT_MAX else None


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (sorted distinct values) by sorting.

    numpy 2.4's ``np.unique`` goes through a hash table first: measured on
    this machine, 27,000 codes took 2-85 ms (the table's allocation under
    load) where sorting takes 0.5 ms, and it ran on every lookup and delete
    of a fold (over half of a fold's CPU in the ingest benchmark).
    """
    if len(values) < 2:  # (a point read's one probe: nothing to sort)
        return values.copy()
    values = np.sort(values, kind=sort_kind(len(values)))
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


class KeyCoder:
    """Computes key codes; one per thread (it owns a DuckDB cursor, for keys numpy does not hash)."""

    def __init__(self, run: Callable[..., pa.Table]):
        """``run(template, **inputs)`` executes SQL with ``{name}`` placeholders over Arrow inputs."""
        self._run = run
        self._lock = threading.Lock()

    def codes(self, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
        if table.num_rows == 0:
            return np.empty(0, dtype=np.uint64)
        if not columns:
            return np.zeros(table.num_rows, dtype=np.uint64)
        if len(columns) == 1 and _is_integer(table.schema.field(columns[0]).type):
            return self._integer_codes(table.column(columns[0]))
        return self._hashed(table, columns)

    @staticmethod
    def _integer_codes(col: pa.ChunkedArray) -> np.ndarray:
        unsigned = pa.types.is_unsigned_integer(col.type)
        if not col.null_count:
            # The values as they are in their buffers (a view, widened if narrower): a cast kernel and a
            # conversion were ~19 us a call, and a batch codes integer keys ~9 times.
            dtype = np.uint64 if unsigned else np.int64
            parts = [fixed_width_values(chunk).astype(dtype, copy=False) for chunk in col.chunks]
            values = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)
            return values.view(np.uint64)
        target = pa.uint64() if unsigned else pa.int64()
        values = pc.cast(col, target)
        if values.null_count:
            filled = pc.fill_null(values, pa.scalar(0, target))
            codes = filled.to_numpy().view(np.uint64).copy()
            codes[pc.is_null(values).to_numpy(zero_copy_only=False)] = NULL_CODE
            return codes
        return np.ascontiguousarray(values.to_numpy()).view(np.uint64)

    def _hashed(self, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
        codes = hash_columns([table.column(c) for c in columns])
        if codes is not None:
            return codes
        cols = ", ".join('"' + c.replace('"', '""').replace("{", "{{").replace("}", "}}") + '"' for c in columns)
        with self._lock:
            result = self._run(f"SELECT hash({cols}) AS h FROM {{keys}}", keys=table.select(list(columns)))
        return np.asarray(result.column(0).to_numpy(), dtype=np.uint64)


def hashable(t: pa.DataType) -> bool:
    """True when ``hash_columns`` hashes values of this type (else DuckDB does)."""
    if pa.types.is_dictionary(t):
        return hashable(t.value_type)
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_duration(t)
            or _is_decimal(t) or _is_bytes(t))


def _is_decimal(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t) and not (pa.types.is_decimal256(t) and t.precision > 38)


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t))


def hash_columns(columns: Sequence[pa.ChunkedArray | pa.Array]) -> np.ndarray | None:
    """One uint64 per row, equal for rows whose columns are all equal (NULL = NULL); None: a type not hashed.

    Each column's values become 64 bits (``_value_bits``), and the row's code
    folds them in order through splitmix64's finalizer, so equal rows fold
    equal bits and different rows collide about as often as random 64-bit
    values do.
    """
    if not all(hashable(c.type) for c in columns):
        return None
    code = np.full(len(columns[0]), _SEED, dtype=np.uint64)
    for column in columns:
        bits = _value_bits(column)
        code *= _STEP
        code += bits
        _mix(code)
    return code


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place (uint64 arithmetic wraps)."""
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _value_bits(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """64 bits per value of one column (a fresh array): equal values give equal bits; NULL gives NULL_HASH."""
    if isinstance(column, pa.ChunkedArray):
        chunks = column.chunks
        if len(chunks) != 1:
            if not chunks:
                return np.empty(0, np.uint64)
            return np.concatenate([_value_bits(c) for c in chunks])
        column = chunks[0]
    array = column
    t = array.type
    if pa.types.is_dictionary(t):
        array = array.dictionary_decode()
        t = array.type
    n = len(array)
    if pa.types.is_null(t):
        return np.full(n, NULL_HASH, dtype=np.uint64)
    if pa.types.is_floating(t):
        values = pc.cast(array, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        values = values + 0.0  # -0.0 -> 0.0 (a copy)
        values[np.isnan(values)] = np.nan  # one NaN
        bits = values.view(np.uint64)
    elif _is_bytes(t):
        bits = _distinct_bytes_hash(array)
    elif pa.types.is_decimal(t):
        bits = _decimal_bits(array)
    elif pa.types.is_boolean(t):
        bits = pc.cast(array, pa.uint8()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
    else:  # integers, dates, times, timestamps, durations: their integer value
        bits = _fixed_values(array).astype(np.uint64)  # sign-extended: -1 is the same at every width
    if array.null_count:
        bits[~pc.is_valid(array).to_numpy(zero_copy_only=False)] = NULL_HASH
    return bits


def _fixed_values(array: pa.Array) -> np.ndarray:
    """The values of a fixed-width integer-like array as numpy integers (whatever NULLs hold)."""
    width = array.type.bit_width
    signed = not pa.types.is_unsigned_integer(array.type)
    dtype = np.dtype(f"{'i' if signed else 'u'}{width // 8}")
    data = array.buffers()[1]
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _decimal_bits(array: pa.Array) -> np.ndarray:
    """Decimals by their unscaled value (as 128 bits: one value at every precision of a scale)."""
    t = array.type
    if not pa.types.is_decimal128(t):
        array = pc.cast(array, pa.decimal128(38, t.scale))
    words = np.frombuffer(array.buffers()[1], dtype=np.uint64, count=2 * len(array), offset=array.offset * 16)
    low, high = words[0::2], words[1::2]
    mixed = high + _HIGH
    _mix(mixed)
    return low ^ mixed


def _distinct_bytes_hash(array: pa.Array) -> np.ndarray:
    """``_bytes_hash`` of each value, hashing each distinct value once.

    Keys repeat (a delta's group keys, a segment or a nation name): one
    dictionary encoding in Arrow's C++ hash table and a gather cost less
    than hashing every byte of every row (0.38 -> 0.1 ms for two name
    columns of 1,600 rows).
    """
    if len(array) < 32 or pa.types.is_fixed_size_binary(array.type):
        return _bytes_hash(array)
    encoded = pc.dictionary_encode(array)
    hashes = _bytes_hash(encoded.dictionary)
    indices = encoded.indices
    positions = pc.fill_null(indices, 0).to_numpy(zero_copy_only=False) if indices.null_count else \
        indices.to_numpy(zero_copy_only=False)
    return hashes[positions] if len(hashes) else np.zeros(len(array), np.uint64)


def _bytes_hash(array: pa.Array) -> np.ndarray:
    """A hash of each value's bytes: sum over j of (byte_j + 1) * P**j mod 2**64, mixed with the length.

    Strings differing in one byte never share the sum (P is odd), and the
    length keeps a trailing byte from vanishing. Vectorized over all bytes,
    ``BYTES_PER_PASS`` bytes at a time.
    """
    t = array.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        array = pc.cast(array, pa.large_binary())
        t = array.type
    n = len(array)
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        offsets = np.arange(n + 1, dtype=np.int64) * width
        base = array.offset * width
        data = array.buffers()[1]
    else:
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32, count=n + 1,
                                offset=array.offset * (8 if large else 4)).astype(np.int64)
        base = 0
        data = array.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    out = lengths.astype(np.uint64)
    out += _HIGH
    _mix(out)
    start = 0
    while start < n:
        # rows [start, end) whose bytes fit in one pass (at least one row)
        end = int(np.searchsorted(offsets, offsets[start] + BYTES_PER_PASS, side="right")) - 1
        end = min(max(end, start + 1), n)
        out[start:end] ^= _byte_sums(raw, offsets[start:end + 1] + base, lengths[start:end])
        start = end
    return out


_powers = np.ones(1, dtype=np.uint64)


def _byte_powers(count: int) -> np.ndarray:
    """P**j mod 2**64 for j < count (kept between calls)."""
    global _powers
    if len(_powers) < count:
        size = max(count, 2 * len(_powers))
        steps = np.full(size, _BYTE, dtype=np.uint64)
        steps[0] = 1
        _powers = np.cumprod(steps, dtype=np.uint64)
    return _powers[:count]


def _byte_sums(raw: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    sums = np.zeros(len(lengths), dtype=np.uint64)
    first, last = int(offsets[0]), int(offsets[-1])
    if last == first:
        return sums
    starts = offsets[:-1] - first
    position = np.arange(last - first, dtype=np.int64) - np.repeat(starts, lengths)
    terms = raw[first:last].astype(np.uint64)
    terms += np.uint64(1)
    terms *= _byte_powers(int(lengths.max()))[position]
    filled = lengths > 0
    sums[filled] = np.add.reduceat(terms, starts[filled])
    return sums
