"""Point reads (ivm/reads/point_reads.py): ``SELECT ... FROM r WHERE k = $n`` answered from Arrow, equal to DuckDB."""

import math

import pyarrow as pa
import pytest
from sqlglot import exp

import ivm
from flight_server import params
from ivm import database
from ivm.reads import computed, point_reads, reads
from tests.oracle.compare import multiset_diff


@pytest.fixture
def db():
    # Incremental: on tables this small the cost model may recompute the views, whose refresh
    # statements (with their WHERE) would count among the DuckDB calls the tests below watch.
    with ivm.connect(maintenance="incremental") as database_:
        database_.execute(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, grp BIGINT, name VARCHAR, x DOUBLE);"
            "CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY grp;"
            "CREATE MATERIALIZED VIEW names AS SELECT name, grp FROM t;"  # a bag: names repeat
            "CREATE MATERIALIZED VIEW by_name AS SELECT name, COUNT(*) AS n FROM t GROUP BY name")
        yield database_


def rows(ids, grps, names, xs, op="u"):
    return pa.table({"id": pa.array(ids, pa.int64()), "grp": pa.array(grps, pa.int64()),
                     "name": pa.array(names, pa.string()), "x": pa.array(xs, pa.float64()),
                     "__op": [op] * len(ids)})


def read(db, sql: str, *values) -> pa.Table:
    """A prepared execution as the Flight server runs it: template, spliced text and the values."""
    batch = pa.record_batch([pa.array([v]) if not isinstance(v, pa.Array) else v for v in values],
                            names=[str(i) for i in range(len(values))])
    return db.bound_query(params.numbered(sql), lambda: params.bind(sql, batch, 0), [c[0] for c in batch.columns])


@pytest.fixture
def duckdb_calls(monkeypatch):
    """The statements reads ran on DuckDB, but for the checks of a computed view's compiled projection
    (ivm/reads/computed.py): in shadow mode (the suites' setting) DuckDB checks every one, which is the
    trust policy's statement, not the read's."""
    calls = []
    run = reads.duck.arrow

    def counted(cursor, sql):
        if computed.RUN_ROWS not in sql:
            calls.append(sql)
        return run(cursor, sql)

    monkeypatch.setattr(reads.duck, "arrow", counted)
    return calls


QUERIES = [
    ("SELECT * FROM by_grp WHERE grp = ?", (1,)),
    ("SELECT * FROM by_grp WHERE grp = ?", (3,)),  # no such group
    ("SELECT * FROM by_grp WHERE grp = ?", (2**40,)),  # beyond every row
    ("SELECT s, GRP FROM by_grp WHERE ? = grp", (2,)),  # reversed, columns in another order, other case
    ("SELECT b.n FROM by_grp AS b WHERE (b.grp = ?) AND n = ?", (1, 2)),  # alias, parentheses, two keys
    ('SELECT "name", grp FROM names WHERE name = ?', ("ann",)),  # a bag: repeated rows
    ("SELECT * FROM names WHERE name = ? AND grp = ?", ("bob", 2)),
    ("SELECT n FROM by_name WHERE name = ?", ("it's",)),
    ("SELECT * FROM t WHERE id = ?", (4,)),
]


@pytest.mark.parametrize("sql,values", QUERIES)
def test_a_point_read_answers_as_duckdb_does_and_skips_it_after_the_first(db, duckdb_calls, registrations, sql,
                                                                          values):
    db.apply_changes("t", rows([1, 2, 3, 4, 5], [1, 1, 2, 2, 1], ["ann", "ann", "bob", "it's", "ann"],
                               [1.0, 2.0, 4.0, None, 8.0]))
    assert point_reads.shape(database._parsed_reads(params.numbered(sql))[0].expression) is not None
    bound = params.bind(sql, pa.record_batch([pa.array([v]) for v in values], names=[str(i) for i in
                                                                                      range(len(values))]), 0)
    expected = db.sql(bound)
    first = read(db, sql, *values)
    assert len(duckdb_calls) >= 1  # the first execution runs on DuckDB, to learn its result schema
    calls, registered = len(duckdb_calls), len(registrations)
    again = read(db, sql, *values)
    assert len(duckdb_calls) == calls, "the second execution did not take the point-read path"
    assert len(registrations) == registered, "the second execution registered relations on a cursor"
    for got in (first, again):
        assert got.schema.remove_metadata() == expected.schema.remove_metadata()
        assert multiset_diff(got, expected) is None
        assert got.schema.metadata[b"ivm.offset"] == expected.schema.metadata[b"ivm.offset"]


def test_point_reads_see_every_change_at_once(db, duckdb_calls):
    db.apply_changes("t", rows([1, 2], [1, 1], ["a", "b"], [1.0, 2.0]))
    sql = "SELECT * FROM by_grp WHERE grp = ?"
    assert read(db, sql, 1).to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
    # The first run of each template goes through DuckDB (its result schema is learned there); parsed
    # templates are cached per process, so whether an earlier test ran this one depends on the order.
    assert read(db, "SELECT * FROM t WHERE id = ?", 1).num_rows == 1
    calls = len(duckdb_calls)
    db.apply_changes("t", rows([2, 3], [2, 1], ["b", "c"], [5.0, 7.0]))  # a row moves to group 2
    assert read(db, sql, 1).to_pylist() == [{"grp": 1, "n": 2, "s": 8.0}]
    assert read(db, sql, 2).to_pylist() == [{"grp": 2, "n": 1, "s": 5.0}]
    db.apply_changes("t", rows([1, 3], [0, 0], ["a", "c"], [0.0, 0.0], op="d"))  # group 1 vanishes
    assert read(db, sql, 1).num_rows == 0
    assert read(db, "SELECT * FROM t WHERE id = ?", 2).to_pylist() == [{"id": 2, "grp": 2, "name": "b", "x": 5.0}]
    # New versions compute the view's rows (one statement each), never the lookup itself.
    assert all("WHERE" not in sql for sql in duckdb_calls[calls:])


@pytest.mark.parametrize("sql,values", [
    ("SELECT * FROM t WHERE x = ?", (float("nan"),)),  # DuckDB holds NaN = NaN
    ("SELECT * FROM t WHERE grp = ?", ("1",)),  # a string compared to an integer column: DuckDB casts it
    ("SELECT * FROM t WHERE grp = ?", (pa.nulls(1, pa.int64()),)),  # NULL matches nothing
    ("SELECT * FROM t WHERE grp = ?", (1.0,)),
])
def test_other_parameter_types_are_left_to_duckdb(db, sql, values):
    db.apply_changes("t", rows([1, 2], [1, 2], ["a", "b"], [math.nan, 2.0]))
    bound = params.bind(sql, pa.record_batch([pa.array([v]) if not isinstance(v, pa.Array) else v for v in values],
                                             names=["0"]), 0)
    expected = db.sql(bound)
    for _ in range(2):
        got = read(db, sql, *values)
        assert multiset_diff(got, expected) is None
        assert got.schema.remove_metadata() == expected.schema.remove_metadata()
    assert expected.num_rows == (0 if "NULL" in bound else 1)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM t WHERE grp > $1",
    "SELECT * FROM t WHERE grp = $1 OR id = $2",
    "SELECT * FROM t WHERE grp = $1 LIMIT 1",
    "SELECT * FROM t WHERE grp = $1 ORDER BY id",
    "SELECT DISTINCT grp FROM t WHERE grp = $1",
    "SELECT grp, COUNT(*) FROM t WHERE grp = $1 GROUP BY grp",
    "SELECT id + 1 FROM t WHERE grp = $1",
    "SELECT id AS k FROM t WHERE grp = $1",
    "SELECT * EXCLUDE (x) FROM t WHERE grp = $1",
    "SELECT * FROM t JOIN by_grp USING (grp) WHERE id = $1",
    "SELECT * FROM t, by_grp WHERE id = $1",
    "SELECT * FROM t WHERE grp = $1 + 1",
    "SELECT * FROM t WHERE grp = 1",
    "SELECT * FROM t WHERE other.grp = $1",
    "SELECT * FROM main.t WHERE grp = $1",
    "WITH c AS (SELECT * FROM t) SELECT * FROM c WHERE grp = $1",
    "SELECT * FROM t WHERE TRUE",
    "SELECT * FROM t LIMIT 5",
    "SELECT id FROM t ORDER BY id",
])
def test_anything_but_the_point_read_shape_is_not_one(sql):
    tree = database._parsed_reads(sql)[0].expression
    assert isinstance(tree, exp.Expression)
    assert point_reads.shape(tree) is None


def test_the_shape_names_the_table_columns_and_parameters():
    tree = database._parsed_reads("SELECT B.N, s FROM By_Grp b WHERE $2 = b.grp AND (\"Name\" = $1)")[0].expression
    assert point_reads.shape(tree) == point_reads.Shape("by_grp", ("n", "s"), (("grp", 2), ("name", 1)))


def test_point_reads_over_nulls_many_matches_several_runs_and_narrow_integers(duckdb_calls):
    """NULL keys (whose buffer slots hold a value), more matches than are sliced, rows in several
    chunks, an INTEGER column with values beyond its range: as DuckDB answers them."""
    with ivm.connect(maintenance="incremental") as db:
        db.execute("CREATE TABLE s (id BIGINT PRIMARY KEY, k INTEGER, tag VARCHAR)")
        for first, last in ((0, 40), (40, 55), (55, 60)):  # each under half the last: three runs, three chunks
            ids = list(range(first, last))
            # A NULL key over a buffer slot that holds 7, the value looked up below.
            keys = pa.array([7 if i % 3 else 1 for i in ids], pa.int32(), mask=pa.array([i % 5 == 0 for i in ids]))
            db.apply_changes("s", pa.table({"id": pa.array(ids, pa.int64()), "k": keys,
                                            "tag": [None if i % 4 == 0 else f"t{i % 2}" for i in ids]}))
        assert db._engine.store.snapshot["s"].table().column("k").num_chunks > 1
        cases = [(7,), (1,), (8,), (2**40,), (-2**40,), ("t1",), ("t9",)]
        for values in cases:
            sql = "SELECT * FROM s WHERE tag = ?" if isinstance(values[0], str) else "SELECT id, k FROM s WHERE k = ?"
            expected = db.sql(params.bind(sql, pa.record_batch([pa.array(values)], names=["0"]), 0))
            calls = []
            for _ in range(2):  # the first runs on DuckDB, the second on the point-read path
                got = read(db, sql, *values)
                calls.append(len(duckdb_calls))
                assert multiset_diff(got, expected) is None, values
                assert got.schema.remove_metadata() == expected.schema.remove_metadata()
            assert calls[0] == calls[1], f"{values}: the second execution ran on DuckDB"
        assert db.sql("SELECT COUNT(*) AS c FROM s WHERE k = 7").column("c")[0].as_py() > point_reads.FEW_ROWS


WHOLE_READS = [
    "SELECT * FROM by_grp",
    "SELECT s, GRP FROM By_Grp AS b",  # columns in another order, other case, an alias
    "SELECT * FROM names",  # a bag: repeated rows
    "SELECT name FROM by_name",
    "SELECT * FROM t",
]


@pytest.fixture
def registrations(monkeypatch):
    """Relations reads registered on a DuckDB cursor."""
    names = []
    register = reads.Reader.register

    def counted(self, cursor, registered, relations, *args, **kwargs):
        names.extend(relations)
        return register(self, cursor, registered, relations, *args, **kwargs)

    monkeypatch.setattr(reads.Reader, "register", counted)
    return names


@pytest.mark.parametrize("sql", WHOLE_READS)
def test_a_whole_read_answers_as_duckdb_does_and_skips_it_after_the_first(db, duckdb_calls, registrations, sql):
    """``SELECT cols FROM r`` as a plain query (no parameters) and prepared: DuckDB's rows and schema,
    and after the first execution neither a statement on DuckDB nor a cursor to register it on."""
    db.apply_changes("t", rows([1, 2, 3, 4, 5], [1, 1, 2, 2, 1], ["ann", "ann", "bob", "it's", "ann"],
                               [1.0, 2.0, 4.0, None, 8.0]))
    assert point_reads.shape(database._parsed_reads(sql)[0].expression).equalities == ()
    for run in (lambda: db.sql(sql), lambda: read(db, sql)):
        first = run()
        calls, registered = len(duckdb_calls), len(registrations)
        again = run()
        assert len(duckdb_calls) == calls, "the second execution ran on DuckDB"
        assert len(registrations) == registered, "the second execution registered relations on a cursor"
        expected = duckdb_answer(db, sql)
        for got in (first, again):
            assert got.schema.remove_metadata() == expected.schema
            assert multiset_diff(got, expected) is None
            assert got.schema.metadata[b"ivm.offset"] == first.schema.metadata[b"ivm.offset"]


def duckdb_answer(db, sql: str) -> pa.Table:
    """``sql`` run by DuckDB itself over the relations' current rows (not through ivm's read paths)."""
    import duckdb
    con = duckdb.connect()
    for name in ("t", "by_grp", "names", "by_name"):
        con.register(name, db.sql(f"SELECT * FROM {name} WHERE TRUE"))  # (WHERE TRUE: not a whole read)
    return con.sql(sql).to_arrow_table()


def test_whole_reads_see_every_change_at_once(db, duckdb_calls):
    db.apply_changes("t", rows([1, 2], [1, 1], ["a", "b"], [1.0, 2.0]))
    before = db.sql("SELECT * FROM by_grp")
    assert before.to_pylist() == [{"grp": 1, "n": 2, "s": 3.0}]
    assert db.sql("SELECT * FROM t").num_rows == 2
    calls = len(duckdb_calls)
    db.apply_changes("t", rows([2, 3], [2, 1], ["b", "c"], [5.0, 7.0]))  # a row moves to group 2
    got = db.sql("SELECT * FROM by_grp")
    assert sorted(got.to_pylist(), key=lambda r: r["grp"]) == [{"grp": 1, "n": 2, "s": 8.0},
                                                                {"grp": 2, "n": 1, "s": 5.0}]
    assert int(got.schema.metadata[b"ivm.offset"]) > int(before.schema.metadata[b"ivm.offset"])
    db.apply_changes("t", rows([1, 2, 3], [0, 0, 0], ["a", "b", "c"], [0.0, 0.0, 0.0], op="d"))  # every group vanishes
    assert db.sql("SELECT * FROM by_grp").num_rows == 0
    assert db.sql("SELECT * FROM t").num_rows == 0
    # New versions compute a computed view's rows (one statement each), never run the read itself.
    assert not {"SELECT * FROM by_grp", "SELECT * FROM t"} & set(duckdb_calls[calls:]), duckdb_calls[calls:]


def test_a_whole_read_of_a_failed_view_still_says_so(db):
    db.apply_changes("t", rows([1], [1], ["a"], [1.0]))
    assert db.sql("SELECT * FROM by_grp").num_rows == 1
    assert db.sql("SELECT * FROM by_grp").num_rows == 1  # now answered from Arrow
    db._engine.failed["by_grp"] = "a bug while maintaining it"
    try:
        with pytest.raises(ivm.ExecutionError, match="failed while being maintained"):
            db.sql("SELECT * FROM by_grp")
    finally:
        del db._engine.failed["by_grp"]


def test_the_whole_read_shape():
    tree = database._parsed_reads('SELECT B.N, s FROM By_Grp b')[0].expression
    assert point_reads.shape(tree) == point_reads.Shape("by_grp", ("n", "s"), ())
