"""numpy kernels under the compiled operators: key codes, join matches, grouped reductions.

Keys compare as SQL's GROUP BY and IS NOT DISTINCT FROM do in DuckDB:
NULL equals NULL (``codes``; a join on ``=`` drops NULL keys first), NaN
equals NaN, -0.0 equals 0.0, strings by bytes. No row loops: sorting and
``searchsorted``/``reduceat`` only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ivm.execute.compiled.vectors import Fallback, Vec, decimal_of, is_int, is_number


def same_scale(a, b) -> bool:
    """Integers and decimals of one scale hold equal values as equal int64s (so they code together)."""
    sa = 0 if is_int(a) else (decimal_of(a) or (None, -1))[1]
    sb = 0 if is_int(b) else (decimal_of(b) or (None, -2))[1]
    return sa == sb


def _column_codes(v: Vec) -> tuple[np.ndarray, int]:
    """Dense codes of one column's values (NULL is a value of its own) and how many codes there are."""
    if v.numeric:
        data, valid = v.np()
        if data.dtype == np.int64:  # integers, decimals, dates...: offsets from the least value, no sort
            offsets = _offset_codes(data, valid)
            if offsets is not None:
                return offsets
        if v.type == "DOUBLE":
            data = data + 0.0  # -0.0 -> 0.0, so both zeros are one value (as in DuckDB)
        if valid is not None:
            data = np.where(valid, data, data[valid][0] if valid.any() else 0)
        uniques, codes = np.unique(data, return_inverse=True)  # NaNs are one value (equal_nan)
        codes = codes.astype(np.int64).reshape(-1)
        if valid is not None:
            codes = np.where(valid, codes, len(uniques))
        return codes, len(uniques) + 1
    array = v.arrow()
    if pa.types.is_floating(array.type) or pa.types.is_nested(array.type) or pa.types.is_interval(array.type):
        # DuckDB compares intervals normalized (INTERVAL '1' MONTH = INTERVAL '30' DAY), not by their fields
        raise Fallback(f"key of type {array.type}")
    encoded = pc.dictionary_encode(array, null_encoding="encode")
    return np.asarray(encoded.indices).astype(np.int64), max(len(encoded.dictionary), 1)


def _offset_codes(data: np.ndarray, valid: np.ndarray | None) -> tuple[np.ndarray, int] | None:
    """Codes of int64 values as their distance from the least one (NULL: one past the greatest),
    when the values span at most ``OFFSET_SPAN``; None otherwise (then they are sorted into dense codes).

    Two reductions instead of ``np.unique``'s sort: a key of several columns (``(ps_partkey,
    ps_suppkey)``, an integer and a date), coded one column at a time, is then coded in linear time.
    """
    values = data if valid is None else data[valid]
    if not len(values):
        return np.zeros(len(data), np.int64), 1
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span > OFFSET_SPAN:
        return None
    out = data - low
    if valid is not None:
        out = np.where(valid, out, span)
        span += 1
    return out, span


OFFSET_SPAN = 1 << 31  # values spanning more are coded densely (a sort): keys of several columns stay within int64


def codes(columns: list[Vec], n: int) -> np.ndarray:
    """One int64 code per row, equal exactly where all ``columns`` are equal (NULL-safe); not dense."""
    if len(columns) == 1 and is_int(columns[0].type):
        data, valid = columns[0].np()
        if valid is None:  # one integer key without NULLs is its own code
            return data
    out = np.zeros(n, np.int64)
    span = 1
    for v in columns:
        c, k = _column_codes(v)
        if span * k >= 2**62:
            _, out = np.unique(out, return_inverse=True)
            out = out.astype(np.int64).reshape(-1)
            span = int(out.max()) + 1 if n else 1
        out = out * k + c
        span *= k
    return out


def joint_codes(left: list[Vec], right: list[Vec], nl: int, nr: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes of two sides' keys, comparable across the sides (pairs of columns of one type each)."""
    merged = [concat(a, b) for a, b in zip(left, right)]
    both = codes(merged, nl + nr)  # one integer key without NULLs: the values themselves
    return both[:nl], both[nl:]


def concat(a: Vec, b: Vec) -> Vec:
    """Two key columns as one, for coding together; numbers of different types compare as DuckDB does."""
    if a.numeric and b.numeric:
        if a.type == "NULL" or b.type == "NULL":
            raise Fallback("a NULL-typed key")
        if a.type != b.type and not same_scale(a.type, b.type):
            if not (is_number(a.type) and is_number(b.type)):
                raise Fallback(f"keys of types {a.type} and {b.type}")
            a, b = (Vec.of("DOUBLE", data.astype(np.float64), valid) for data, valid in (a.np(), b.np()))
    elif a.type != b.type:
        raise Fallback(f"keys of types {a.type} and {b.type}")
    return Vec.concat(a, b)


def sorted_rows(codes: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``codes`` in ascending code order (stable), leaving out those ``skip`` marks."""
    if skip is None:
        return np.argsort(codes, kind="stable")
    kept = np.flatnonzero(~skip)
    return kept[np.argsort(codes[kept], kind="stable")]


def matches(left: np.ndarray, right: np.ndarray, left_skip: np.ndarray | None = None,
            right_skip: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (left row, right row) with equal codes; and per left row how many it has.

    Rows where ``left_skip``/``right_skip`` is true match nothing (NULL keys of an ``=`` join).
    """
    order = sorted_rows(right, right_skip)
    ordered = right[order]
    start = np.searchsorted(ordered, left, "left")
    count = np.searchsorted(ordered, left, "right") - start
    if left_skip is not None:
        count[left_skip] = 0
    total = int(count.sum())
    left_rows = np.repeat(np.arange(len(left)), count)
    offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    right_rows = order[np.repeat(start, count) + offsets]
    return left_rows, right_rows, count


def groups(key_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, starts, first): rows sorted by group, where each group starts in that order, and each
    group's first row (in input order, as a representative)."""
    order = np.argsort(key_codes, kind="stable")
    ordered = key_codes[order]
    if len(ordered) == 0:
        return order, np.empty(0, np.int64), np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    return order, starts, order[starts]


def group_count(valid: np.ndarray | None, order: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """Rows per group (of the valid ones, when ``valid`` is given)."""
    if valid is None:
        return np.diff(np.append(starts, n)).astype(np.int64)
    if not len(starts):
        return np.empty(0, np.int64)
    return np.add.reduceat(valid[order].astype(np.int64), starts)


def group_sum(data: np.ndarray, valid, order, starts) -> np.ndarray:
    if not len(starts):
        return np.empty(0, data.dtype)
    values = data[order]
    if valid is not None:
        values = np.where(valid[order], values, 0)
    if data.dtype == np.int64:
        # (in Python integers: numpy's abs of -2**63 is -2**63, which would pass as small)
        biggest = max(-int(values.min()), int(values.max())) if len(values) else 0
        if biggest and (biggest >= 2**62 or float(biggest) * len(values) >= 2.0**62):
            raise Fallback("a SUM that may leave BIGINT")
    with np.errstate(all="ignore"):  # inf + -inf is NaN, as in DuckDB
        return np.add.reduceat(values, starts)


def group_extreme(data: np.ndarray, valid, order, starts, largest: bool) -> np.ndarray:
    """MIN/MAX per group over valid rows, in DuckDB's order (DOUBLE: NaN is the largest)."""
    if not len(starts):
        return np.empty(0, data.dtype)
    values = data[order]
    floating = data.dtype == np.float64
    if floating and ((values == 0) & np.signbit(values) & (True if valid is None else valid[order])).any():
        raise Fallback("MIN/MAX over -0.0 (DuckDB keeps the zero it met first)")
    if valid is not None:
        if floating:
            fill = -np.inf if largest else np.nan  # fmin skips NaN
        else:
            fill = np.iinfo(np.int64).min if largest else np.iinfo(np.int64).max
        values = np.where(valid[order], values, fill)
    if floating:
        # maximum propagates NaN (NaN is the largest); fmin skips it unless all are NaN
        return np.maximum.reduceat(values, starts) if largest else np.fmin.reduceat(values, starts)
    return (np.maximum if largest else np.minimum).reduceat(values, starts)


def group_all(data: np.ndarray, valid, order, starts, conjunction: bool) -> np.ndarray:
    """BOOL_AND (``conjunction``) or BOOL_OR per group over the valid rows (a group without one: unspecified)."""
    if not len(starts):
        return np.empty(0, bool)
    values = data[order].astype(bool, copy=False)
    if valid is not None:
        values = np.where(valid[order], values, conjunction)  # a NULL changes neither
    return (np.logical_and if conjunction else np.logical_or).reduceat(values, starts)


def order_ranks(v: Vec, desc: bool, nulls_first: bool) -> np.ndarray:
    """Ranks of one ORDER BY key, in DuckDB's order: equal values rank alike, NULLs first or last.

    Numbers as numpy orders them (DOUBLE: NaN above +inf, -0.0 equal to 0.0,
    as DuckDB sorts); other types by Arrow's order (strings by bytes, as
    DuckDB's default collation; decimals, dates and timestamps by value).
    """
    if v.numeric:
        data, valid = v.np()
        if v.type == "DOUBLE":
            data = data + 0.0  # -0.0 -> 0.0
        present = data if valid is None else data[valid]
        uniques, inverse = np.unique(present, return_inverse=True)  # NaNs are one value, the largest
        ranks_present, width = inverse.astype(np.int64).reshape(-1), len(uniques)
    else:
        array = v.arrow()
        if pa.types.is_nested(array.type) or pa.types.is_floating(array.type):
            raise Fallback(f"ORDER BY a key of type {array.type}")
        valid = np.asarray(array.is_valid()) if array.null_count else None
        present = array if valid is None else array.filter(pa.array(valid))
        ranks_present = np.asarray(pc.rank(present, sort_keys="ascending", tiebreaker="dense")).astype(np.int64) - 1
        width = int(ranks_present.max()) + 1 if len(ranks_present) else 0
    if desc:
        ranks_present = width - 1 - ranks_present
    if valid is None:
        return ranks_present
    out = np.full(len(valid), -1 if nulls_first else width, np.int64)
    out[valid] = ranks_present
    return out
