"""tests.oracle.reference: the DuckDB copy a test keeps beside ivm follows CDC batches as ivm does."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from tests.oracle.reference import apply_cdc


def _batch(keys: list[int], values: list, ops: list[str]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(values, pa.int32()), "__op": ops})


def test_creates_updates_and_deletes_leave_one_row_per_live_key():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v INTEGER)")
    apply_cdc(con, "t", "k", _batch([1, 2, 3], [10, 20, None], ["c", "c", "r"]))
    apply_cdc(con, "t", "k", _batch([1, 2, 4], [11, 0, 40], ["u", "d", "u"]))  # an update of a new key inserts
    assert sorted(con.execute("SELECT k, v FROM t").fetchall()) == [(1, 11), (3, None), (4, 40)]


def test_a_key_changed_twice_in_one_batch_is_refused_and_changes_nothing():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k BIGINT, v INTEGER)")
    con.execute("INSERT INTO t VALUES (1, 1)")
    with pytest.raises(AssertionError, match="at most once"):
        apply_cdc(con, "t", "k", _batch([1, 1], [2, 3], ["u", "u"]))
    assert con.execute("SELECT k, v FROM t").fetchall() == [(1, 1)]
