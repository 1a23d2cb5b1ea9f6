"""Groups compared with a global aggregate (``HAVING SUM(x) > (SELECT SUM(x) * 0.1 FROM t)``, TPC-H q11):
when the total moves, only the groups between the old and the new threshold can enter or leave the view,
and those are read from the aggregate's state by a range of the column that orders the compared output
(delta_operators/aggregate.py ``AggregateRule.between``, delta_operators/spj.py ``_between_old_and_new``),
not by a scan of every group. The view equals DuckDB's recompute after every batch."""

from __future__ import annotations

from unittest import mock

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from storage import relation
from tests.oracle.compare import multiset_diff

VIEWS = {
    # a share of the total, the threshold's expression over the total (DECIMAL sums, as q11's)
    "share": "SELECT g, SUM(p) AS s FROM t GROUP BY g HAVING SUM(p) > (SELECT SUM(p) * 0.15 FROM t)",
    # reversed, and against an average: integers summed into HUGEINT
    "above_avg": "SELECT g, SUM(q) AS s FROM t GROUP BY g HAVING (SELECT AVG(q) * 4 FROM t) <= SUM(q)",
    "counts": "SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING COUNT(*) < (SELECT COUNT(*) / 5 FROM t)",
    "tops": "SELECT g, MAX(q) AS top FROM t GROUP BY g HAVING MAX(q) >= (SELECT MIN(q) + 3 FROM t)",
    # not ranged: a floating SUM's NaN and infinity counters come first, and AVG is a quotient
    "floats": "SELECT g, SUM(x) AS s, AVG(q) AS m FROM t GROUP BY g HAVING SUM(x) > (SELECT SUM(x) / 8 FROM t) "
              "AND AVG(q) > (SELECT AVG(q) FROM t)",
}
RANGED = {"share", "above_avg", "counts", "tops"}
# A view's rows are read from its operators' state; its change (what the range read computes) feeds the
# views over it and SUBSCRIBE. A view over each one checks that change: it is maintained from it alone.
OVER = {f"{name}_over": f"SELECT COUNT(*) AS n, COUNT(g) AS groups, SUM(g) AS g_total FROM {name}" for name in VIEWS}

rows = st.lists(st.tuples(st.integers(0, 60),  # id: upserts and deletes hit stored rows
                          st.sampled_from(["u", "u", "d"]),
                          st.one_of(st.none(), st.integers(0, 14)),  # g: groups vanish and return
                          st.one_of(st.none(), st.integers(-3, 40)),  # q
                          st.one_of(st.none(), st.integers(-500, 5000)),  # p in cents
                          st.one_of(st.none(), st.sampled_from([0.5, -2.0, 9.0]))),
                min_size=1, max_size=40)


def database() -> ivm.Database:
    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, q INTEGER, p DECIMAL(12,2), x DOUBLE)")
    return db


def test_each_ranged_view_reads_its_groups_by_a_range_and_no_view_scans_its_groups():
    with database() as db:
        for name, sql in VIEWS.items():
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            lines = db.sql(f"EXPLAIN {name}").column(0).to_pylist()
            ranged = [line for line in lines if "within the range of compared" in line]
            assert bool(ranged) == (name in RANGED), (name, lines)


def apply(db: ivm.Database, batch: list[tuple]) -> None:
    last = {}
    for key, op, g, q, p, x in batch:  # one row per key (the last), as the table keeps it
        last[key] = (op, g, q, p, x)
    ids = sorted(last)
    db.apply_changes("t", pa.table({
        "id": pa.array(ids, pa.int64()), "g": pa.array([last[k][1] for k in ids], pa.int64()),
        "q": pa.array([last[k][2] for k in ids], pa.int32()),
        "p": pa.array([None if last[k][3] is None else last[k][3] / 100 for k in ids]).cast(pa.decimal128(12, 2)),
        "x": pa.array([last[k][4] for k in ids], pa.float64()),
        "__op": [last[k][0] for k in ids]}), on_missing_delete="ignore")


def create(db: ivm.Database, names) -> None:
    for name in names:
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {VIEWS[name]}")
        db.execute(f"CREATE MATERIALIZED VIEW {name}_over AS {OVER[name + '_over']}")


def check(db: ivm.Database, reference: duckdb.DuckDBPyConnection, names) -> None:
    reference.register("t", db.sql("SELECT * FROM t WHERE TRUE"))
    for name in names:
        want = reference.sql(VIEWS[name]).to_arrow_table()
        difference = multiset_diff(db.sql(f"SELECT * FROM {name}"), want)
        assert difference is None, f"{name}: {difference}"
        reference.register(name, want)
        over = OVER[name + "_over"]
        difference = multiset_diff(db.sql(f"SELECT * FROM {name}_over"), reference.sql(over).to_arrow_table())
        assert difference is None, f"{name}_over (maintained from {name}'s change): {difference}"


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(rows, min_size=1, max_size=10))
def test_views_of_groups_against_a_moving_threshold_equal_duckdb(batches):
    """Random upserts and deletes (NULLs, groups that vanish and return, thresholds that move both ways)."""
    with database() as db:
        create(db, VIEWS)
        reference = duckdb.connect()
        for batch in batches:
            apply(db, batch)
            check(db, reference, VIEWS)


def test_a_small_move_of_the_total_reads_few_groups():
    """1,000 groups; a change of one row moves the share's threshold a little: the range read returns
    the groups near it, not the 1,000, and the view is still DuckDB's."""
    reads = []
    between = relation.Relation.between

    def counted(self, *args, **kwargs):
        found = between(self, *args, **kwargs)
        reads.append((self.name, found.num_rows, self.num_rows))
        return found

    with database() as db, mock.patch.object(relation.Relation, "between", counted):
        create(db, ["share"])
        # group g holds one row of g cents: the share (15% of the total) keeps the largest groups
        apply(db, [(g, "u", g, 1, g, None) for g in range(1, 1001)])
        reference = duckdb.connect()
        for step in range(3):
            reads.clear()
            apply(db, [(5000 + step, "u", 2000 + step, 1, 30000 + step, None)])  # a new group: the total moves
            state_reads = [r for r in reads if r[0].startswith("share.agg")]
            assert state_reads, reads
            assert all(found < 200 and whole >= 1000 for _, found, whole in state_reads), state_reads
            check(db, reference, ["share"])
