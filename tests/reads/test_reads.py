"""Reads of views without stored output (ivm/reads/reads.py): rows computed once per state version."""

import duckdb
import pyarrow as pa
import pytest

import ivm
from ivm.reads import reads
from tests.oracle.compare import multiset_diff

VIEW = "SELECT grp, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY grp"


@pytest.fixture
def db():
    with ivm.connect() as database:
        database.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, grp BIGINT, x DOUBLE);"
                         f"CREATE MATERIALIZED VIEW v AS {VIEW}")
        yield database


def changes(ids, grps, xs, op="u"):
    return pa.table({"id": pa.array(ids, pa.int64()), "grp": pa.array(grps, pa.int64()),
                     "x": pa.array(xs, pa.float64()), "__op": [op] * len(ids)})


def recompute(db) -> pa.Table:
    con = duckdb.connect()
    con.register("t", db.sql("SELECT * FROM t"))
    return con.sql(VIEW).to_arrow_table()


def test_reads_between_two_changes_reuse_the_rows_computed_for_that_version(db):
    assert not db._engine.catalog.views["v"].stored_output  # computed from its aggregate state
    db.apply_changes("t", changes([1, 2, 3], [1, 1, 2], [1.0, 2.0, None]))
    first = db.sql("SELECT * FROM v")
    assert multiset_diff(first, recompute(db)) is None
    state = next(r for name, r in db._engine.store.snapshot.relations.items() if name.startswith("v."))
    cached = [value for key, value in state._cache.items() if key[:2] == ("computed", "v")]
    assert len(cached) == 1
    assert db.sql("SELECT * FROM v WHERE grp = 1").to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
    assert [value for key, value in state._cache.items() if key[:2] == ("computed", "v")] == cached
    db.apply_changes("t", changes([2, 4], [2, 3], [5.0, 7.0]))  # a row moves to group 2; group 3 appears
    assert db.sql("SELECT * FROM v WHERE grp = 1").to_pylist() == [{"grp": 1, "n": 1, "s": 1.0}]
    assert multiset_diff(db.sql("SELECT * FROM v"), recompute(db)) is None


def test_a_cursor_switches_between_computed_rows_and_a_view_over_large_state(db, monkeypatch):
    expected = []
    for step in range(6):
        # Alternate the threshold so the same pooled cursor goes from a registered
        # table to a DuckDB view over the state and back (each must replace the other).
        monkeypatch.setattr(reads, "COMPUTE_ONCE_ROWS", 0 if step % 2 else 10**9)
        db.apply_changes("t", changes([step, step + 10], [step % 3, 5], [float(step), 1.0]))
        got = db.sql("SELECT * FROM v")
        assert multiset_diff(got, recompute(db)) is None, step
        expected.append(got.num_rows)
    db.execute("DELETE FROM t WHERE grp = 5")
    assert db.sql("SELECT COUNT(*) AS c FROM v WHERE grp = 5").to_pylist() == [{"c": 0}]
    assert multiset_diff(db.sql("SELECT * FROM v"), recompute(db)) is None


def test_a_bound_query_reads_like_the_same_text(db):
    db.apply_changes("t", changes([1, 2, 3], [1, 1, 2], [1.0, 2.0, 4.0]))
    template = "SELECT * FROM v WHERE grp = $1 "
    assert db.bound_query(template, "SELECT * FROM v WHERE grp = 1").to_pylist() == \
        db.sql("SELECT * FROM v WHERE grp = 1").to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
    # Anything but one query takes the ordinary path, where a query is one statement (issue 23).
    with pytest.raises(ivm.IvmError, match="runs one statement; this text holds 2"):
        db.bound_query("SELECT $1 ; SELECT * FROM v WHERE grp = $2 ", "SELECT 1; SELECT * FROM v WHERE grp = 2")
    assert db.bound_query("DELETE FROM t WHERE id = $1 ", "DELETE FROM t WHERE id = 3").to_pylist() == \
        [{"rows_affected": 1}]
    assert db.sql("SELECT * FROM v ORDER BY grp").to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
    with pytest.raises(ivm.UnknownObjectError, match="nope"):
        db.bound_query("SELECT * FROM nope WHERE a = $1 ", "SELECT * FROM nope WHERE a = 1")


def computed_versions(db) -> list:
    """The computed rows of ``v`` kept with its current state version."""
    state = next(r for name, r in db._engine.store.snapshot.relations.items() if name.startswith("v."))
    return [value for key, value in state._cache.items() if key[:2] == ("computed", "v")]


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_the_writer_computes_the_rows_of_views_read_since_the_last_batch(tmp_path, durable):
    # Incremental: on tables this small the cost model may recompute v instead, which keeps its rows
    # stored while its state is stale (ivm/maintain/recompute.py) and leaves nothing to compute on read.
    with ivm.connect(tmp_path / "db" if durable else None, maintenance="incremental") as db:
        db.execute(f"CREATE TABLE t (id BIGINT PRIMARY KEY, grp BIGINT, x DOUBLE); CREATE MATERIALIZED VIEW v AS {VIEW}")
        db.apply_changes("t", changes([1, 2, 3], [1, 1, 2], [1.0, 2.0, 4.0]))
        db.apply_changes("t", changes([3], [2], [6.0]))
        db.offset  # every acknowledged change published (durable: folded)
        assert computed_versions(db) == []  # nobody read v since the batch before: nothing computed
        assert db.sql("SELECT * FROM v WHERE grp = 1").to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
        db.apply_changes("t", changes([2], [2], [5.0]))
        db.offset
        warmed = computed_versions(db)
        assert len(warmed) == 1  # computed by the writer, before any read of this version
        assert multiset_diff(warmed[0][2].table(), recompute(db)) is None
        assert db.sql("SELECT * FROM v WHERE grp = 2").to_pylist() == [{"grp": 2, "n": 2, "s": 11.0}]
        assert computed_versions(db) == warmed  # the read used them
        db.apply_changes("t", changes([4], [3], [1.0]))
        db.offset
        assert len(computed_versions(db)) == 1
        db.apply_changes("t", changes([5], [3], [1.0]))  # v was not read since the last batch
        db.offset
        assert computed_versions(db) == []
        assert multiset_diff(db.sql("SELECT * FROM v"), recompute(db)) is None


def test_a_bound_query_over_a_time_window_reads_its_values():
    """TUMBLE expands the parsed template, which holds $1 rather than the value: it takes the ordinary path."""
    from flight_server import params

    with ivm.connect() as db:
        db.execute("CREATE TABLE bids (id BIGINT PRIMARY KEY, ts TIMESTAMP, price BIGINT)")
        db.execute("INSERT INTO bids VALUES (1, TIMESTAMP '2024-01-01 00:00:01', 5), "
                   "(2, TIMESTAMP '2024-01-01 00:00:03', 7)")
        sql = "SELECT id, window_start FROM TUMBLE(bids, ts, INTERVAL '2' SECOND) WHERE price = ?"
        values = pa.record_batch([pa.array([7])], names=["0"])
        expected = db.sql(params.bind(sql, values, 0))
        assert expected.num_rows == 1
        for text in (params.bind(sql, values, 0), lambda: params.bind(sql, values, 0)):
            got = db.bound_query(params.numbered(sql), text, [values.column(0)[0]])
            assert got.to_pylist() == expected.to_pylist()


def test_a_view_the_writer_cannot_compute_does_not_fail_the_batch_and_the_read_reports_it(db, monkeypatch):
    db.apply_changes("t", changes([1], [1], [1.0]))
    assert db.sql("SELECT * FROM v").num_rows == 1  # read: the next batch warms v
    compute = reads.computed_rows

    def failing(cursor, view, states, runs=None):
        raise ivm.ExecutionError("cannot compute v")

    monkeypatch.setattr(reads, "computed_rows", failing)
    offset = db.apply_changes("t", changes([2], [1], [2.0]))  # accepted although warming v failed
    assert db.sql("SELECT COUNT(*) AS c FROM t").to_pylist() == [{"c": 2}]
    with pytest.raises(ivm.ExecutionError, match="cannot compute v"):
        db.sql("SELECT * FROM v")
    monkeypatch.setattr(reads, "computed_rows", compute)
    assert db.offset == offset
    assert db.sql("SELECT * FROM v").to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
