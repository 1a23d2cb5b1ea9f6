"""MIN/MAX re-scans (delta_operators/aggregate.py): where a group's values are read again when a batch
deletes its current extreme. Over one table that keeps every row, the table's own index on the group
key is read and the aggregate keeps no copy of the values; over a join, a RETAIN stream or with
DISTINCT it keeps its value multiset. Either way the view equals DuckDB's recompute."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ivm
from tests.oracle.compare import multiset_diff

TABLE = "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, x DOUBLE, s VARCHAR)"
OTHER = "CREATE TABLE u (id BIGINT PRIMARY KEY, label VARCHAR)"
FILTERED = ("SELECT g, MIN(x) AS lo, MAX(x) AS hi, MAX(s) AS top, COUNT(*) AS n FROM t "
            "WHERE x IS DISTINCT FROM 5 GROUP BY g")


def _states(db, view: str) -> set[str]:
    """The operator state relations EXPLAIN lists for the view."""
    lines = db.sql(f"EXPLAIN {view}").column(0).to_pylist()
    return {line.split("state ", 1)[1].split(":")[0] for line in lines if line.strip().startswith("state ")}


def _explain(db, view: str) -> str:
    return "\n".join(db.sql(f"EXPLAIN {view}").column(0).to_pylist())


def test_max_over_one_table_reads_the_tables_index_and_keeps_no_value_multiset():
    db = ivm.connect()
    db.execute(TABLE)
    db.execute(f"CREATE MATERIALIZED VIEW v AS {FILTERED}")
    assert not any(".vals" in name for name in _states(db, "v")), _states(db, "v")
    assert "lookup t by (g) from rescan" in _explain(db, "v")


def test_max_over_a_join_with_distinct_or_over_a_retain_stream_keeps_its_value_multiset():
    db = ivm.connect()
    db.execute(TABLE)
    db.execute(OTHER)
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT u.label, MAX(t.x) AS hi FROM t JOIN u ON t.g = u.id "
               "GROUP BY u.label")
    db.execute("CREATE MATERIALIZED VIEW d AS SELECT g, COUNT(DISTINCT x) AS k, MAX(x) AS hi, MIN(s) AS lo "
               "FROM t GROUP BY g")
    db.execute("CREATE MATERIALIZED VIEW e AS SELECT MAX(x) AS hi FROM t")  # no GROUP BY: no key to look up
    db.execute("CREATE TABLE bids (price BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
               "APPEND ONLY RETAIN INTERVAL '10' SECOND")
    db.execute("CREATE MATERIALIZED VIEW w AS SELECT window_start, MAX(price) AS top "
               "FROM TUMBLE(bids, ts, INTERVAL '10' SECOND) GROUP BY window_start")
    assert any(".vals" in name for name in _states(db, "j"))
    # x feeds COUNT(DISTINCT): its multiset stays; s only feeds MIN: read from t
    assert [name for name in _states(db, "d") if ".vals" in name] == ["d.vals2_0"]
    assert any(".vals" in name for name in _states(db, "e"))
    assert any(".vals" in name for name in _states(db, "w"))


def _check(db, ref) -> None:
    for view in ("v", "j"):
        got = db.sql(f"SELECT * FROM {view}")
        want = ref.sql(VIEWS[view]).to_arrow_table()
        diff = multiset_diff(got, want)
        assert diff is None, f"{view}: {diff}"


VIEWS = {"v": FILTERED, "j": "SELECT g, MAX(x) AS hi, MIN(s) AS lo FROM t JOIN u ON t.g = u.id GROUP BY g"}

# Few groups (NULL among them) and few values (duplicates, NaN, infinities, NULL) so a batch often
# deletes a group's current extreme, empties a group, and brings it back.
GROUPS = st.sampled_from([None, 0, 1, 2])
VALUES = st.sampled_from([None, -1.5, 0.0, 2.0, 5.0, 7.25, math.nan, math.inf, -math.inf])
TEXTS = st.sampled_from([None, "", "a", "b", "zz"])
OPS = st.lists(st.tuples(st.sampled_from("cud"), st.integers(0, 11), GROUPS, VALUES, TEXTS), min_size=1, max_size=14)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(OPS, min_size=1, max_size=8))
def test_extremes_equal_the_recompute_when_batches_delete_them(batches):
    db = ivm.connect()
    ref = duckdb.connect()
    for ddl in (TABLE, OTHER):
        db.execute(ddl)
        ref.execute(ddl)
    labels = pa.table({"id": [0, 1, 2], "label": ["zero", "one", "two"]})
    db.apply_changes("u", labels)
    ref.execute("INSERT INTO u SELECT * FROM labels")
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    rows: dict[int, tuple] = {}
    for ops in batches:
        before = set(rows)
        batch = {}  # one change per id and batch, from the table before the batch to after it
        for op, key, g, x, s in ops:
            if op in "cu":
                batch[key] = ("u" if key in before else "c", g, x, s)
                rows[key] = (g, x, s)
            elif key in rows:
                rows.pop(key)
                if key in before:
                    batch[key] = ("d", None, None, None)
                else:
                    del batch[key]
        if not batch:
            continue
        ids = list(batch)
        db.apply_changes("t", pa.table({
            "id": pa.array(ids, pa.int64()), "g": pa.array([batch[i][1] for i in ids], pa.int64()),
            "x": pa.array([batch[i][2] for i in ids], pa.float64()), "s": pa.array([batch[i][3] for i in ids]),
            "__op": [batch[i][0] for i in ids]}))
        current = pa.table({"id": pa.array(list(rows), pa.int64()),
                            "g": pa.array([r[0] for r in rows.values()], pa.int64()),
                            "x": pa.array([r[1] for r in rows.values()], pa.float64()),
                            "s": pa.array([r[2] for r in rows.values()], pa.string())})
        ref.execute("DELETE FROM t")
        ref.execute("INSERT INTO t SELECT * FROM current")
        _check(db, ref)
