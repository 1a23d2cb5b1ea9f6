"""The tie-aware comparison the oracle uses for ORDER BY with ties: it must reject wrong answers."""

from __future__ import annotations

import pyarrow as pa

from tests.oracle.compare import tie_aware_diff

CANDIDATES = pa.table({"id": [1, 2, 3, 4], "score": [9, 7, 7, 5]})


def top2(ids, scores):
    return pa.table({"id": ids, "score": scores})


def test_any_choice_among_tied_rows_is_accepted():
    reference = top2([1, 2], [9, 7])
    assert tie_aware_diff(top2([1, 3], [9, 7]), reference, CANDIDATES, ("score",), ()) is None
    assert tie_aware_diff(top2([1, 2], [9, 7]), reference, CANDIDATES, ("score",), ()) is None


def test_a_row_above_the_boundary_must_be_there():
    reference = top2([1, 2], [9, 7])
    assert "sort keys differ" in tie_aware_diff(top2([2, 3], [7, 7]), reference, CANDIDATES, ("score",), ())


def test_rows_must_be_candidates_and_counts_must_match():
    reference = top2([1, 2], [9, 7])
    assert "not candidates" in tie_aware_diff(top2([1, 9], [9, 7]), reference, CANDIDATES, ("score",), ())
    assert "rows vs" in tie_aware_diff(top2([1], [9]), reference, CANDIDATES, ("score",), ())


def test_rank_columns_are_keys_but_not_row_identity():
    """ROW_NUMBER over ties: tied rows may swap numbers, but the numbers per key are fixed."""
    candidates = pa.table({"id": [1, 2, 3], "score": [7, 7, 5], "rn": [1, 2, 3]})
    swapped = pa.table({"id": [2, 1, 3], "score": [7, 7, 5], "rn": [1, 2, 3]})
    assert tie_aware_diff(swapped, candidates, candidates, ("score", "rn"), ("rn",)) is None
    wrong = pa.table({"id": [1, 2, 3], "score": [7, 7, 5], "rn": [1, 3, 2]})
    assert "sort keys differ" in tie_aware_diff(wrong, candidates, candidates, ("score", "rn"), ("rn",))
