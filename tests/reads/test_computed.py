"""A computed view's rows kept per run of its state (ivm/reads/computed.py): equal to DuckDB, costing the change."""

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ivm
from delta_operators.program import scan_name
from ivm import database as database_module
from ivm.reads import computed
from sql_frontend.errors import InternalError
from tests.oracle.compare import multiset_diff
from tests.reads.test_point_reads import read

VIEWS_KEYED = {
    "agg": "SELECT grp, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY grp",
    "pairs": "SELECT grp, name, COUNT(*) AS n FROM t GROUP BY grp, name HAVING COUNT(*) > 1",
}
VIEWS = {
    "agg": "SELECT grp, COUNT(*) AS n, SUM(x) AS s, AVG(x) AS m, MAX(x) AS hi, MIN(name) AS lo FROM t GROUP BY grp",
    "pairs": "SELECT grp, COUNT(x) AS n FROM t GROUP BY grp HAVING COUNT(*) > 1",
    "names": "SELECT DISTINCT name FROM t",
    "total": "SELECT COUNT(*) AS n, SUM(x) AS s FROM t",  # one group, present with no row
}


def database() -> ivm.Database:
    db = ivm.connect(maintenance="incremental")
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, grp BIGINT, x DOUBLE, name VARCHAR)")
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    return db


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_each_view_here_is_read_per_run(name):
    with database() as db:
        view = db._engine.catalog.views[name]
        select, scans = view.read_sql()
        assert not view.stored_output and len(scans) == 1
        assert computed.positional(select, scan_name(next(iter(scans)))) is not None


@pytest.mark.parametrize("sql", [
    "SELECT s.k, COUNT(*) AS n FROM \"__scan__v.agg2\" AS s GROUP BY s.k",
    "SELECT DISTINCT s.k FROM \"__scan__v.agg2\" AS s",
    "SELECT s.k FROM \"__scan__v.agg2\" AS s JOIN other AS o ON s.k = o.k",
    "SELECT s.k FROM \"__scan__v.agg2\" AS s ORDER BY s.k LIMIT 3",
    "SELECT SUM(s.k) OVER () AS w FROM \"__scan__v.agg2\" AS s",
    "SELECT s.k FROM \"__scan__v.agg2\" AS s WHERE s.k IN (SELECT k FROM other)",
    "SELECT v.k FROM (SELECT s.k FROM \"__scan__v.agg2\" AS s GROUP BY s.k) AS v",
    "SELECT s.k FROM other AS s",
    "SELECT * FROM \"__scan__v.agg2\" AS s",
])
def test_anything_but_a_row_wise_chain_over_the_state_is_computed_whole(sql):
    assert computed.positional(duckdb_tree(sql), "__scan__v.agg2") is None


def duckdb_tree(sql):
    import sqlglot
    return sqlglot.parse_one(sql, read="duckdb")


rows_strategy = st.lists(
    st.tuples(st.integers(0, 11),  # id: few, so upserts and deletes hit stored rows
              st.sampled_from(["c", "u", "d"]),
              st.one_of(st.none(), st.integers(0, 3)),  # grp: groups vanish and return
              st.one_of(st.none(), st.sampled_from([-1.5, 0.0, 2.0, 7.25, float("inf")])),
              st.one_of(st.none(), st.sampled_from(["a", "b", "it's"]))),
    min_size=1, max_size=8)


@settings(max_examples=20, deadline=None)
@given(batches=st.lists(rows_strategy, min_size=1, max_size=12))
def test_views_read_after_every_batch_equal_duckdb(batches):
    """Random upserts and deletes (NULLs, repeated keys, the current MAX deleted, groups that vanish and
    return), each view read after every batch: DuckDB's answer over the table as it is then."""
    with database() as db:
        reference = duckdb.connect()
        for batch in batches:
            last = {}
            for key, op, grp, x, name in batch:  # one row per key (the last), as the table keeps it
                last[key] = (op, grp, x, name)
            ids = sorted(last)
            table = pa.table({"id": pa.array(ids, pa.int64()),
                              "grp": pa.array([last[k][1] for k in ids], pa.int64()),
                              "x": pa.array([last[k][2] for k in ids], pa.float64()),
                              "name": pa.array([last[k][3] for k in ids], pa.string()),
                              "__op": [("u" if last[k][0] != "d" else "d") for k in ids]})
            db.apply_changes("t", table, on_missing_delete="ignore")
            current = db.sql("SELECT * FROM t WHERE TRUE")
            reference.register("t", current)
            # Point reads first: the version's rows are still parts (ivm/reads/computed.py ViewRows), filtered
            # by liveness after the match; the whole reads below make them one table.
            # By a key (the state's index: ivm/reads/reads.py _keyed_answer), and by a column that is not
            # one (matched in each part).
            for name, key, values in (("agg", "grp", [0, 1, 2, 3]), ("pairs", "grp", [0, 1, 2, 3]),
                                      ("names", "name", ["a", "b", "it's"]), ("agg", "n", [1, 2])):
                for value in values:
                    got = read(db, f"SELECT * FROM {name} WHERE {key} = ?", value)
                    expected = reference.sql(f"SELECT * FROM ({VIEWS[name]}) WHERE {key} = $1",
                                             params=[value]).to_arrow_table()
                    difference = multiset_diff(got, expected)
                    assert difference is None, f"{name} where {key} = {value!r}: {difference}"
            for name, sql in VIEWS.items():
                got = db.sql(f"SELECT * FROM {name}")
                difference = multiset_diff(got, reference.sql(sql).to_arrow_table())
                assert difference is None, f"{name}: {difference}"


def test_a_batch_projects_only_the_runs_it_made(monkeypatch):
    """The rows a batch projects are the state rows it wrote (and a merge's), not the whole state."""
    projected = []
    project = computed.RunRows.project

    def counted(self, cursor, table):
        projected.append(table.num_rows)
        return project(self, cursor, table)

    monkeypatch.setattr(computed.RunRows, "project", counted)
    with database() as db:
        groups = 20_000
        db.apply_changes("t", pa.table({"id": pa.array(range(groups), pa.int64()),
                                        "grp": pa.array(range(groups), pa.int64()),
                                        "x": pa.array([1.0] * groups), "name": ["a"] * groups}))
        assert db.sql("SELECT * FROM agg").num_rows == groups
        for i in range(5):
            projected.clear()
            db.apply_changes("t", pa.table({"id": pa.array([i, 100 + i], pa.int64()),
                                            "grp": pa.array([i, 100 + i], pa.int64()),
                                            "x": pa.array([5.0, 6.0]), "name": ["b", "c"], "__op": ["u", "u"]}))
            got = db.sql("SELECT * FROM agg WHERE TRUE")
            assert got.num_rows == groups
            assert sum(projected) < 100, projected  # two groups changed; 20,000 are stored
        assert db.sql("SELECT hi FROM agg WHERE grp = 104").to_pylist() == [{"hi": 6.0}]


def test_a_reader_of_an_older_version_gets_its_rows():
    with database() as db:
        db.apply_changes("t", pa.table({"id": pa.array([1, 2], pa.int64()), "grp": pa.array([1, 2], pa.int64()),
                                        "x": pa.array([1.0, 2.0]), "name": ["a", "b"]}))
        engine = db._engine
        old = engine.store.snapshot
        tree = database_module._parsed_reads("SELECT grp, n FROM agg WHERE TRUE")[0].expression
        before = engine.reader.query("SELECT grp, n FROM agg WHERE TRUE", tree, snapshot=old)
        for i in range(4):  # new versions: their runs replace the old ones in the per-run rows
            db.apply_changes("t", pa.table({"id": pa.array([1], pa.int64()), "grp": pa.array([3 + i], pa.int64()),
                                            "x": pa.array([9.0]), "name": ["z"], "__op": ["u"]}))
            assert db.sql("SELECT * FROM agg").num_rows == 2
        again = engine.reader.query("SELECT grp, n FROM agg WHERE TRUE", tree, snapshot=old)
        assert sorted(again.to_pylist(), key=str) == sorted(before.to_pylist(), key=str) == \
            [{"grp": 1, "n": 1}, {"grp": 2, "n": 1}]


def lose_a_row(monkeypatch, shadow: str) -> None:
    """From now on every compiled projection loses its last row; IVM_SHADOW=``shadow``."""
    run = computed.CompiledStep.run

    def wrong(self, inputs):
        out = run(self, inputs)
        return out.slice(0, max(0, out.num_rows - 1))

    monkeypatch.setenv("IVM_SHADOW", shadow)
    monkeypatch.setattr(computed.CompiledStep, "run", wrong)


def test_in_shadow_mode_a_compiled_projection_that_differs_from_duckdb_raises(monkeypatch):
    with database() as db:
        lose_a_row(monkeypatch, "1")
        db.apply_changes("t", pa.table({"id": pa.array([1, 2], pa.int64()), "grp": pa.array([1, 2], pa.int64()),
                                        "x": pa.array([1.0, 2.0]), "name": ["a", "b"]}))
        with pytest.raises(InternalError, match="computed view's projection .* differs from DuckDB"):
            db.sql("SELECT * FROM agg")


def test_outside_shadow_mode_a_projection_that_differs_on_its_first_runs_is_left_to_duckdb(monkeypatch):
    with database() as db:
        lose_a_row(monkeypatch, "0")
        for i in range(3):
            db.apply_changes("t", pa.table({"id": pa.array([i], pa.int64()), "grp": pa.array([i], pa.int64()),
                                            "x": pa.array([1.0]), "name": ["a"]}))
            assert sorted(r["grp"] for r in db.sql("SELECT * FROM agg").to_pylist()) == list(range(i + 1))
        runs = db._engine.reader._computed_runs["agg"][1]
        assert runs is not None and set(runs._compiled.values()) == {None}  # DuckDB projects from now on


@pytest.mark.parametrize("compute_once_rows", [0, 200_000])
def test_a_point_read_by_the_views_key_reads_the_state_rows_of_that_key(monkeypatch, compute_once_rows):
    """``WHERE grp = $1`` on a view grouped by grp: one lookup in the state's index and the view's projection
    of the rows found, equal to DuckDB, without computing the view's rows for the version (``_computed``),
    for large states (read through DuckDB otherwise: COMPUTE_ONCE_ROWS 0) and small ones. HAVING still
    filters; values outside the key's type, NULLs and non-key columns take the other paths."""
    from ivm.reads import reads
    from storage import relation
    monkeypatch.setattr(reads, "COMPUTE_ONCE_ROWS", compute_once_rows)
    monkeypatch.setattr(reads, "KEYED_READ_ROWS", 0)  # these states are small
    monkeypatch.setattr(relation, "SMALL_RELATION", 0)  # the lookup probes the index, however small the state
    computed_rows, keyed = [], []
    compute, keyed_answer = reads.Reader._computed, reads.Reader._keyed_answer

    def counted(self, *args):
        computed_rows.append(args[2].name)
        return compute(self, *args)

    def answered(self, *args):
        found = keyed_answer(self, *args)
        keyed.append(found is not None)
        return found

    monkeypatch.setattr(reads.Reader, "_computed", counted)
    monkeypatch.setattr(reads.Reader, "_keyed_answer", answered)
    with ivm.connect(maintenance="incremental") as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, grp INTEGER, x DOUBLE, name VARCHAR)")
        db.execute("CREATE MATERIALIZED VIEW agg AS SELECT grp, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY grp")
        db.execute("CREATE MATERIALIZED VIEW pairs AS SELECT grp, name, COUNT(*) AS n FROM t GROUP BY grp, name "
                   "HAVING COUNT(*) > 1")
        reference = duckdb.connect()
        seen = set()
        for step in range(4):
            ids = list(range(step * 7, step * 7 + 40))
            db.apply_changes("t", pa.table({
                "id": pa.array(ids, pa.int64()),
                "grp": pa.array([None if i % 11 == 0 else i % (5 + step) for i in ids], pa.int32()),
                "x": pa.array([float(i % 4) for i in ids]), "name": pa.array([["a", "b"][i % 2] for i in ids]),
                "__op": ["u"] * len(ids)}))
            reference.register("t", db.sql("SELECT * FROM t WHERE TRUE"))
            # (view, condition, values, read by the whole key of the state's index)
            reads_ = [("agg", "grp = ?", (g,), g < 2**31) for g in (0, 1, 4, 9, 2**40)] + \
                [("pairs", "grp = ? AND name = ?", (g, v), True) for g in (0, 1, 3) for v in ("a", "b", "c")] + \
                [("pairs", "grp = ?", (1,), False), ("agg", "n = ?", (3,), False)]
            for name, where, values, by_key in reads_:
                computed_rows.clear()
                first = (name, where) not in seen
                seen.add((name, where))
                got = read(db, f"SELECT * FROM {name} WHERE {where}", *values)
                numbered = where.replace("?", "$1", 1).replace("?", "$2")
                expected = reference.sql(f"SELECT * FROM ({VIEWS_KEYED[name]}) WHERE {numbered}",
                                         params=list(values)).to_arrow_table()
                difference = multiset_diff(got, expected)
                assert difference is None, f"{name} where {where} {values}: {difference}"
                # A template's first read may run on DuckDB, which gives the result's schema (remembered
                # per parsed template and input schema, so only if no test before read it so).
                assert keyed[-1] == by_key or (first and not keyed[-1]), (name, where, values)
                if keyed[-1]:
                    assert computed_rows == [], "a read by the key computed the view's rows"
        assert keyed.count(True) >= 4 * (4 + 9) - 2
