"""Multiset comparison of query results, tolerant only where floats demand it."""

from __future__ import annotations

import decimal
import math
from collections import Counter
from typing import Any

import pyarrow as pa


def _sort_key(value: Any) -> tuple:
    if value is None:
        return (0,)
    if isinstance(value, float):
        if math.isnan(value):
            return (1, "nan")
        return (2, round(value, 6))
    if isinstance(value, (int, decimal.Decimal)):
        return (2, float(value))
    return (3, str(value))


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if math.isinf(fa) or math.isinf(fb):
            return fa == fb
        return math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def rows_of(table: pa.Table) -> list[tuple]:
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*cols)) if cols else []


def multiset_diff(actual: pa.Table, expected: pa.Table) -> str | None:
    """None when equal as multisets; otherwise a short description of the difference."""
    if actual.column_names != expected.column_names:
        return f"columns differ: {actual.column_names} != {expected.column_names}"
    for a, e in zip(actual.schema, expected.schema):
        if a.type != e.type:
            return f"column {a.name}: type {a.type} != {e.type}"
    got = sorted(rows_of(actual), key=lambda r: tuple(_sort_key(v) for v in r))
    want = sorted(rows_of(expected), key=lambda r: tuple(_sort_key(v) for v in r))
    if len(got) == len(want) and all(
        len(g) == len(w) and all(_same(x, y) for x, y in zip(g, w)) for g, w in zip(got, want)
    ):
        return None
    extra = Counter(map(repr, got)) - Counter(map(repr, want))
    missing = Counter(map(repr, want)) - Counter(map(repr, got))
    return (
        f"{len(got)} rows vs {len(want)} expected; "
        f"unexpected: {list(extra.elements())[:6]}; missing: {list(missing.elements())[:6]}"
    )
