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


def _bigint_sum(actual: pa.DataType, expected: pa.DataType) -> bool:
    """A view's SUM of integers is a BIGINT where DuckDB's recompute gives a HUGEINT (decimal128(38, 0)).

    Which columns are narrowed is tested in tests/test_result_types.py; here the
    values are still compared exactly (an int equals the same Decimal).
    """
    return actual == pa.int64() and expected == pa.decimal128(38, 0)


def rows_of(table: pa.Table) -> list[tuple]:
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*cols)) if cols else []


def multiset_diff(actual: pa.Table, expected: pa.Table) -> str | None:
    """None when equal as multisets; otherwise a short description of the difference."""
    if actual.column_names != expected.column_names:
        return f"columns differ: {actual.column_names} != {expected.column_names}"
    for a, e in zip(actual.schema, expected.schema):
        if a.type != e.type and not _bigint_sum(a.type, e.type):
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


def _normal(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else round(value, 6)
    if isinstance(value, decimal.Decimal):
        return round(float(value), 6)
    return value


def _project(table: pa.Table, names: list[str]) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in rows_of(table.select(names)))


def tie_aware_diff(actual: pa.Table, expected: pa.Table, candidates: pa.Table,
                   keys: tuple[str, ...], ranks: tuple[str, ...]) -> str | None:
    """None when ``actual`` is a correct answer of a query whose ORDER BY has ties.

    With ties, SQL leaves open which of the tied rows a LIMIT keeps and how a
    ROW_NUMBER numbers them. A result is correct when (1) its multiset of
    ``keys`` (sort keys and rank values: what ties cannot change) equals the
    reference's, and (2) without the ``ranks`` columns, its rows are rows the
    query could have chosen (a sub-multiset of ``candidates``) and as many
    as the reference has.
    """
    if actual.column_names != expected.column_names:
        return f"columns differ: {actual.column_names} != {expected.column_names}"
    if actual.num_rows != expected.num_rows:
        return f"{actual.num_rows} rows vs {expected.num_rows} expected"
    got, want = _project(actual, list(keys)), _project(expected, list(keys))
    if got != want:
        return (f"sort keys differ: unexpected {list((got - want).elements())[:6]}; "
                f"missing {list((want - got).elements())[:6]}")
    rest = [c for c in actual.column_names if c not in ranks]
    chosen = _project(actual, rest)
    allowed = _project(candidates, rest)
    extra = chosen - allowed
    if extra:
        return f"rows that are not candidates: {list(extra.elements())[:6]}"
    return None
