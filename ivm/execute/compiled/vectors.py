"""Columns of a compiled step: DuckDB's logical types over numpy data with NULL masks.

A ``Vec`` is one column in one of two forms, converted lazily: an Arrow
array (as it came in, or as it goes out), or numpy ``data`` with a boolean
``valid`` mask (None: no NULLs). Numbers, decimals, dates, timestamps and
booleans are computed in the numpy form; every other type (strings...)
stays an Arrow array that compiled steps move, compare for equality, group
by and hand to Arrow's string kernels.

Types are DuckDB's names for the ones we compute (``INT_RANK`` and
``DOUBLE``, ``BOOLEAN``, ``NULL``, ``DECIMAL(p,s)``, ``DATE``,
``TIMESTAMP``) or an Arrow type for the ones we only move. HUGEINT
(DuckDB's SUM of integers; Arrow's decimal128(38,0) like DECIMAL(38,0)) is
held in int64, and so is every DECIMAL(p,s), as its
value times 10^s (read from Arrow's decimal128 buffer, little-endian): a
value outside int64 is a ``Fallback`` (the batch runs on DuckDB), never a
wrong answer. DATE is held as int64 days since 1970-01-01 (Arrow date32),
TIMESTAMP as int64 microseconds (Arrow timestamp[us], no time zone).
"""

from __future__ import annotations

import datetime
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.buffers import fixed_width_values, int64_values, one_array


class Fallback(Exception):
    """This batch of a compiled step must run on DuckDB (the reason says why)."""


class Unsupported(Exception):
    """A step's SQL is outside the compiled set (the reason says which construct)."""


INT_RANK = {"TINYINT": 0, "SMALLINT": 1, "INTEGER": 2, "BIGINT": 3, "HUGEINT": 4}
INT_RANGE = {
    "TINYINT": (-(2**7), 2**7 - 1), "SMALLINT": (-(2**15), 2**15 - 1), "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1), "HUGEINT": (-(2**63), 2**63 - 1),  # held in int64 (see above)
}
HUGE_ARROW = pa.decimal128(38, 0)
TO_ARROW = {
    "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(), "BIGINT": pa.int64(),
    "HUGEINT": HUGE_ARROW, "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
}
TO_ARROW["DATE"] = pa.date32()
TO_ARROW["TIMESTAMP"] = pa.timestamp("us")
FROM_ARROW = {v: k for k, v in TO_ARROW.items()}
NUMPY = {"TINYINT": np.int64, "SMALLINT": np.int64, "INTEGER": np.int64, "BIGINT": np.int64,
         "HUGEINT": np.int64, "DOUBLE": np.float64, "BOOLEAN": np.bool_, "DATE": np.int64, "TIMESTAMP": np.int64}
TEMPORAL = ("DATE", "TIMESTAMP")
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)$")


def is_int(t) -> bool:
    return isinstance(t, str) and t in INT_RANK


def is_number(t) -> bool:
    return is_int(t) or t == "DOUBLE"


def decimal(width: int, scale: int) -> str:
    """The name of DECIMAL(width, scale) (DECIMAL(38,0) is not HUGEINT: they combine differently with decimals)."""
    return f"DECIMAL({width},{scale})"


def decimal_of(t) -> tuple[int, int] | None:
    """(width, scale) of a DECIMAL type name (HUGEINT: (38, 0)); None for any other type."""
    if not isinstance(t, str):
        return None
    # Memoized: operators ask at every run, and a type name is one of a few dozen.
    try:
        return _DECIMAL_OF[t]
    except KeyError:
        m = _DECIMAL.match(t)
        found = (38, 0) if t == "HUGEINT" else (int(m.group(1)), int(m.group(2))) if m else None
        _DECIMAL_OF[t] = found
        return found


_DECIMAL_OF: dict[str, tuple[int, int] | None] = {}


def is_decimal(t) -> bool:
    return isinstance(t, str) and t.startswith("DECIMAL(")


def logical(arrow_type: pa.DataType):
    """DuckDB's logical type for an Arrow column: a name we compute with, or the Arrow type itself."""
    found = _LOGICAL.get(arrow_type)  # memoized: every input column of every run asks
    if found is None:
        if pa.types.is_decimal128(arrow_type):  # decimal128(38,0) too: DuckDB reads it as DECIMAL(38,0)
            found = decimal(arrow_type.precision, arrow_type.scale)
        else:
            found = FROM_ARROW.get(arrow_type, arrow_type)
        _LOGICAL[arrow_type] = found
    return found


_LOGICAL: dict[pa.DataType, object] = {}


def arrow_type(t) -> pa.DataType:
    """The Arrow type DuckDB gives a column of logical type ``t`` (NULL: Arrow's null)."""
    if isinstance(t, pa.DataType):
        return t
    dec = decimal_of(t)
    if dec is not None:
        return pa.decimal128(*dec)
    return TO_ARROW.get(t, pa.null())


def numpy_type(t):
    """The numpy dtype a computed type is held in (decimals: scaled int64)."""
    return NUMPY.get(t, np.int64) if isinstance(t, str) else np.int64


class Vec:
    """One column: Arrow ``array`` or numpy ``data`` + ``valid`` (None: all valid); see the module doc.

    A ``take`` is lazy: it keeps the source column and the row positions, and
    gathers only when the column is read, so joins that pass columns along
    (``SELECT *`` over three LEFT JOINs) gather each column once, at the end.
    An input column (``Vec.input``) is read from its table when first used:
    a step reads a few of its inputs' many columns. So is a ``concat`` of
    two columns (UNION ALL): a delta program's "state after the change" is
    ``SELECT * FROM old UNION ALL SELECT * FROM delta`` and the join after
    it reads a few of those columns.
    """

    __slots__ = ("type", "_array", "_data", "_valid", "_source", "_index", "_missing", "_column", "_parts")

    def __init__(self, type_, array: pa.Array | None = None, data: np.ndarray | None = None,
                 valid: np.ndarray | None = None):
        self.type = type_
        self._array = array
        self._data = data
        self._valid = valid
        self._source: Vec | None = None  # a lazy take: rows ``_index`` of ``_source`` (NULL where ``_missing``)
        self._index: np.ndarray | None = None
        self._missing: np.ndarray | None = None
        self._column: tuple[pa.Table, int] | None = None  # an input column not read yet
        self._parts: tuple[Vec, Vec] | None = None  # a concatenation not made yet

    @staticmethod
    def input(type_, table: pa.Table, i: int) -> "Vec":
        """Column ``i`` of ``table``, read (its chunks combined) when first used."""
        vec = Vec(type_)
        vec._column = (table, i)
        return vec

    @staticmethod
    def concat(a: "Vec", b: "Vec") -> "Vec":
        """``a``'s rows then ``b``'s (both of ``a``'s type), made when first read."""
        vec = Vec(a.type)
        vec._parts = (a, b)
        return vec

    def _resolve(self) -> None:
        """Carry out a pending take, input read or concatenation, so the column holds its values."""
        if self._source is not None:
            self._gather()
        elif self._column is not None:
            (table, i), self._column = self._column, None
            self._array = one_array(table.column(i))
        elif self._parts is not None:
            (a, b), self._parts = self._parts, None
            if a.numeric and a.type != "NULL":
                (x, vx), (y, vy) = a.np(), b.np()
                if vx is not None or vy is not None:
                    self._valid = np.concatenate([np.ones(len(x), bool) if vx is None else vx,
                                                  np.ones(len(y), bool) if vy is None else vy])
                    if self._valid.all():
                        self._valid = None
                self._data = np.concatenate([x, y])
            else:
                self._array = pa.concat_arrays([a.arrow(), b.arrow()])

    @staticmethod
    def of(type_, data: np.ndarray, valid: np.ndarray | None = None) -> "Vec":
        if valid is not None and valid.all():
            valid = None
        return Vec(type_, data=data, valid=valid)

    def __len__(self) -> int:
        if self._source is not None:
            return len(self._index)
        if self._column is not None:
            return self._column[0].num_rows
        if self._parts is not None:
            return len(self._parts[0]) + len(self._parts[1])
        return len(self._array) if self._array is not None else len(self._data)

    @property
    def numeric(self) -> bool:
        return isinstance(self.type, str)

    def np(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(data, valid) with values at NULL positions unspecified; only for our computed types."""
        if self._data is not None:  # the common case, read many times per step: no call at all
            return self._data, self._valid
        self._resolve()
        if self._data is None:
            arr = self._array
            valid = np.asarray(arr.is_valid()) if arr.null_count else None
            if pa.types.is_decimal128(arr.type):
                data = _decimal_to_int64(arr, valid)
            elif self.type == "BOOLEAN":
                if arr.null_count:
                    arr = arr.fill_null(False)
                data = arr.to_numpy(zero_copy_only=False)
            else:  # fixed-width numbers, dates, timestamps: the value buffer as it is (no kernel call)
                data = fixed_width_values(arr)
                if self.type != "DOUBLE":
                    data = data.astype(np.int64, copy=False)
            self._data, self._valid = data, valid
        return self._data, self._valid

    def valid(self) -> np.ndarray | None:
        self._resolve()
        if self._data is None and self._array is not None:
            return np.asarray(self._array.is_valid()) if self._array.null_count else None
        return self._valid

    def arrow(self) -> pa.Array:
        if self._array is not None:  # an input column already read, or converted before
            return self._array
        self._resolve()
        if self._array is None:
            data, valid = self._data, self._valid
            mask = None if valid is None else ~valid
            if self.type == "NULL":
                self._array = pa.nulls(len(data))
            elif self.type == "HUGEINT" or is_decimal(self.type):
                self._array = _int64_to_decimal(data, mask, arrow_type(self.type))
            elif self.type == "DATE":
                self._array = pa.array(data.astype(np.int32), pa.int32(), mask=mask).view(pa.date32())
            elif self.type == "TIMESTAMP":
                self._array = pa.array(data, pa.int64(), mask=mask).view(TO_ARROW["TIMESTAMP"])
            else:
                self._array = pa.array(data, TO_ARROW[self.type], mask=mask)
        return self._array

    def take(self, index: np.ndarray, missing: np.ndarray | None = None) -> "Vec":
        """Rows at ``index``; where ``missing`` is true a NULL (outer joins). Gathered when read."""
        out = Vec(self.type)
        if self._source is not None:  # compose with the pending take
            if missing is not None:
                index = np.where(missing, 0, index)
            inner = self._index[index] if len(self._index) else np.zeros(len(index), np.int64)
            if self._missing is not None:
                inherited = self._missing[index] if len(self._index) else np.ones(len(index), bool)
                missing = inherited if missing is None else (missing | inherited)
            out._source, out._index, out._missing = self._source, inner, missing
        else:
            out._source, out._index, out._missing = self, index, missing
        return out

    def _gather(self) -> None:
        source, index, missing = self._source, self._index, self._missing
        self._source = self._index = self._missing = None
        source._resolve()
        if source._data is None and source.numeric and source.type != "NULL" and (
                not is_decimal(source.type) or 4 * len(index) >= len(source)):
            # A fancy index costs ~1 us where Arrow's take kernel costs ~15 us a call, and reading
            # the source as numpy is a view (decimals: a pass over it, worth it for a large share).
            source.np()
        if source._data is not None:
            data, valid = source._data, source._valid
            if missing is not None:
                index = np.where(missing, 0, index)
            self._data = data[index] if len(data) else np.zeros(len(index), data.dtype)
            v = None if valid is None else (valid[index] if len(data) else np.zeros(len(index), bool))
            if missing is not None:
                v = ~missing if v is None else (v & ~missing)
            self._valid = None if v is not None and v.all() else v
        else:
            indices = pa.array(index, pa.int64(), mask=missing)
            self._array = source._array.take(indices)


def _decimal_to_int64(arr: pa.Array, valid: np.ndarray | None) -> np.ndarray:
    """decimal128 values (scaled integers) as int64 (their low 8 bytes); Fallback when one does not fit."""
    low, fits = int64_values(arr)
    if not (fits if valid is None else (fits | ~valid)).all():
        raise Fallback(f"a {arr.type} value outside int64")
    return low


def _int64_to_decimal(data: np.ndarray, mask: np.ndarray | None, type_: pa.DataType = HUGE_ARROW) -> pa.Array:
    """int64 (scaled) values as decimal128 ``type_`` (sign-extended to 16 bytes), without a cast kernel."""
    pairs = np.empty((len(data), 2), np.int64)
    pairs[:, 0] = data
    pairs[:, 1] = data >> 63
    validity = None
    nulls = 0
    if mask is not None:
        ints = pa.array(data, pa.int64(), mask=mask)
        validity, nulls = ints.buffers()[0], ints.null_count
    return pa.Array.from_buffers(type_, len(data), [validity, pa.py_buffer(pairs)], null_count=nulls)


def constant(type_, value, n: int) -> Vec:
    if value is None:
        return Vec(type_, data=np.zeros(n, numpy_type(type_)), valid=np.zeros(n, bool))
    return Vec(type_, data=np.full(n, value, numpy_type(type_)))


def column_of(array: pa.Array | pa.ChunkedArray) -> Vec:
    if isinstance(array, pa.ChunkedArray):
        array = one_array(array)
    return Vec(logical(array.type), array=array)


def int_bounds(type_: str) -> tuple[int, int] | None:
    """The least and greatest value of integer or DECIMAL type ``type_`` as int64 (scaled); None when every
    int64 fits (BIGINT, HUGEINT, a DECIMAL wider than 18 digits)."""
    if type_ in ("BIGINT", "HUGEINT"):
        return None
    dec = decimal_of(type_)
    if dec is not None:
        return None if dec[0] > 18 else (-(10 ** dec[0]) + 1, 10 ** dec[0] - 1)
    return INT_RANGE[type_]


def check_range(type_: str, data: np.ndarray, valid: np.ndarray | None, what: str) -> None:
    """Fallback unless every valid value fits ``type_`` (DuckDB raises where numpy would wrap).

    A DECIMAL(p,s) holds values below 10^p in magnitude (scaled); p > 18 holds all of int64.
    """
    bounds = int_bounds(type_)
    if bounds is None or not len(data):
        return
    low, high = bounds
    values = data if valid is None else data[valid]
    if len(values) and (values.min() < low or values.max() > high):
        raise Fallback(f"{what} outside {type_}")


DAY_MICROS = 86_400_000_000
EPOCH = datetime.date(1970, 1, 1)
# Dates whose EXTRACT and casts numpy's calendar gives as DuckDB does (years 1..9999).
FIRST_DAY, LAST_DAY = (datetime.date(1, 1, 1) - EPOCH).days, (datetime.date(9999, 12, 31) - EPOCH).days


def check_years(days: np.ndarray, valid: np.ndarray | None, what: str) -> None:
    """Fallback unless every valid day is in the years 1..9999 (where numpy's calendar is DuckDB's)."""
    live = days if valid is None else days[valid]
    if len(live) and (live.min() < FIRST_DAY or live.max() > LAST_DAY):
        raise Fallback(f"{what} outside the years 1..9999")


def date_micros(days: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """DATE as TIMESTAMP (microseconds); a date past the years 1..9999 falls back (not checked further).
    Shared by the closures and generated code, so both refuse the same dates."""
    check_years(days, valid, "a DATE as TIMESTAMP")
    return days * DAY_MICROS


def negative_zero(data: np.ndarray, valid: np.ndarray | None) -> bool:
    """True when a valid double is -0.0 (DuckDB keeps whichever zero it met first: we cannot tell)."""
    hit = (data == 0) & np.signbit(data)
    if valid is not None:
        hit &= valid
    return bool(hit.any())


def nulls_of(arrays: list[pa.Array]) -> np.ndarray:
    """Positions where any of ``arrays`` is NULL."""
    out = np.zeros(len(arrays[0]) if arrays else 0, bool)
    for a in arrays:
        if a.null_count:
            out |= np.asarray(pc.is_null(a))
    return out
