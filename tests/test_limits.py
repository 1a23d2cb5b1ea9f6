"""Statement limits, embedded: nesting, size, time, what an error repeats, one query per call.

Deeply nested statements used to run out of Python recursion somewhere
between parse and DuckDB (INTERNAL over Flight); now a statement at exactly
sql_frontend/limits.py's limits works end to end, as a query and as a view
that is then maintained, and one level more is refused by a TooComplexError
that names the limit, before anything changes.
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa
import pytest

import ivm
from sql_frontend.limits import MAX_DEPTH, MAX_NESTING, MAX_VIEW_SELECTS

N = MAX_NESTING


def parens(n: int) -> str:
    return "SELECT id, " + "(" * n + "x" + ")" * n + " AS c FROM t"


def coalesce(n: int) -> str:  # n levels: the n - 1 calls and the SELECT's own parenthesis-free level
    return "SELECT id, " + "COALESCE(" * n + "x" + ", 0)" * n + " AS c FROM t"


def case(n: int) -> str:
    return "SELECT id, " + "CASE WHEN x > 0 THEN " * n + "x" + " ELSE 0 END" * n + " AS c FROM t"


def derived(n: int) -> str:
    return "SELECT * FROM " + "(SELECT id, x FROM " * n + "t" + ") AS s" * n


def scalar_subqueries(n: int) -> str:
    return "SELECT id, " + "(SELECT " * n + "1" + ")" * n + " AS c FROM t"


def chain(operators: int) -> str:
    return "SELECT id, " + " + ".join(["x"] * (operators + 1)) + " AS c FROM t"


@pytest.fixture
def db():
    database = ivm.connect()
    database.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, x BIGINT)")
    database.execute("INSERT INTO t VALUES (1, 2), (2, 3)")
    yield database
    database.close()


SHAPES = [("parentheses", parens), ("COALESCE", coalesce), ("CASE", case), ("derived tables", derived)]
VIEW_SHAPES = [(parens, N), (coalesce, N), (case, N), (derived, MAX_VIEW_SELECTS - 1)]  # + the outer SELECT


@pytest.mark.parametrize("shape", [s for _, s in SHAPES] + [scalar_subqueries], ids=[n for n, _ in SHAPES] + ["scalar subqueries"])
def test_a_query_nested_to_the_limit_runs(db, shape):
    assert db.sql(shape(N)).num_rows == 2


@pytest.mark.parametrize("shape,levels", VIEW_SHAPES, ids=[n for n, _ in SHAPES])
def test_a_view_nested_to_the_limit_is_created_and_maintained(db, shape, levels):
    db.execute("CREATE MATERIALIZED VIEW v AS " + shape(levels))
    db.execute("INSERT INTO t VALUES (3, 4)")
    db.execute("UPDATE t SET x = 5 WHERE id = 1")
    db.execute("DELETE FROM t WHERE id = 2")
    assert sorted(db.sql("SELECT id FROM v").column("id").to_pylist()) == [1, 3]


@pytest.mark.parametrize("shape", [s for _, s in SHAPES] + [scalar_subqueries], ids=[n for n, _ in SHAPES] + ["scalar subqueries"])
def test_one_level_more_is_refused_by_name_and_nothing_changes(db, shape):
    with pytest.raises(ivm.TooComplexError, match=f"more than {N} levels.*the limit is {N}"):
        db.sql(shape(N + 1))
    with pytest.raises(ivm.TooComplexError, match=f"the limit is {N}"):
        db.execute("CREATE MATERIALIZED VIEW v AS " + shape(N + 1))
    assert db.sql("SHOW TABLES").column("name").to_pylist() == ["t"]


def test_a_view_nesting_selects_past_its_limit_is_refused_quickly(db):
    started = time.perf_counter()
    with pytest.raises(ivm.TooComplexError, match=f"nests SELECTs .* more than {MAX_VIEW_SELECTS} levels"):
        db.execute("CREATE MATERIALIZED VIEW v AS " + derived(MAX_VIEW_SELECTS))
    assert time.perf_counter() - started < 1.0
    assert db.sql(derived(MAX_VIEW_SELECTS)).num_rows == 2  # a query may nest more
    assert db.sql("SHOW TABLES").column("name").to_pylist() == ["t"]


def test_operators_chained_to_the_depth_limit_work_and_one_more_is_refused(db):
    db.execute("CREATE MATERIALIZED VIEW v AS " + chain(MAX_DEPTH))
    db.execute("INSERT INTO t VALUES (3, 1)")
    assert db.sql("SELECT c FROM v WHERE id = 3").column(0).to_pylist() == [MAX_DEPTH + 1]
    with pytest.raises(ivm.TooComplexError, match=f"more than {MAX_DEPTH} levels.*x \\+ x"):
        db.sql(chain(MAX_DEPTH + 1))


@pytest.mark.parametrize("sql", [
    "SELECT " + "(" * 3000 + "1" + ")" * 3000,
    "SELECT " + "(SELECT " * 300 + "1" + ")" * 300,
    "CREATE MATERIALIZED VIEW deep AS SELECT id, " + "COALESCE(" * 3000 + "x" + ", 0)" * 3000 + " FROM t",
    "SELECT " + "NOT " * 3000 + "TRUE",
    "SELECT " + "- " * 3000 + "1",
], ids=["3000 parentheses", "300 subqueries", "3000 COALESCE in a view", "3000 NOT", "3000 minus"])
def test_the_reported_statements_are_refused_quickly(db, sql):
    started = time.perf_counter()
    with pytest.raises(ivm.TooComplexError, match="the limit is"):
        db.execute(sql)
    assert time.perf_counter() - started < 1.0
    assert db.sql("SHOW TABLES").column("name").to_pylist() == ["t"]


def test_a_megabyte_of_x_plus_x_is_refused_in_well_under_a_second(db):
    sql = "SELECT " + " + ".join(["x"] * 250_000) + " FROM t"  # ~1 MB: under the size limit
    assert len(sql) < 1 << 20
    started = time.perf_counter()
    with pytest.raises(ivm.TooComplexError, match=f"more than {MAX_DEPTH} levels"):
        db.sql(sql)
    assert time.perf_counter() - started < 1.0


def test_running_out_of_recursion_anywhere_is_a_clear_error(db):
    # A shape the text scan does not see must still not escape as a RecursionError: with the
    # interpreter's limit lowered, a statement within ivm's limits runs out of recursion for real.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        with pytest.raises(ivm.TooComplexError, match="too deeply nested"):
            db.sql(parens(40))
        with pytest.raises(ivm.TooComplexError, match="too deeply nested"):
            db.execute("CREATE MATERIALIZED VIEW v AS " + coalesce(40))
    finally:
        sys.setrecursionlimit(limit)
    assert db.sql("SHOW TABLES").column("name").to_pylist() == ["t"]


def test_parentheses_in_literals_identifiers_and_comments_do_not_count(db):
    deep = "(" * (3 * N)
    rows = db.sql(f"SELECT '{deep}' AS \"{deep}\" -- {deep}\n /* {deep} */ FROM t").num_rows
    assert rows == 2


def test_a_statement_over_the_size_limit_is_refused_naming_the_limit(db):
    big = "INSERT INTO t VALUES " + ", ".join(f"({i}, {i})" for i in range(10, 200_000))
    assert len(big) > 1 << 20
    with pytest.raises(ivm.TooComplexError, match=r"bytes; the limit is 1048576 bytes \(max_statement_bytes"):
        db.execute(big)
    assert db.sql("SELECT count(*) FROM t").column(0).to_pylist() == [2]


def test_the_size_limit_is_a_setting():
    with ivm.connect(max_statement_bytes=100) as small:
        small.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        with pytest.raises(ivm.TooComplexError, match="the limit is 100 bytes"):
            small.sql("SELECT id FROM t WHERE id IN (" + ", ".join(map(str, range(40))) + ")")
        # multi-byte text counts in UTF-8 bytes
        with pytest.raises(ivm.TooComplexError, match="statement is 1[0-9][0-9] bytes"):
            small.sql("SELECT '" + "é" * 50 + "' AS a")
    with ivm.connect(max_statement_bytes=0) as unlimited:
        assert unlimited.sql("SELECT " + " + ".join(["1"] * 200) + " AS a").column(0).to_pylist() == [200]
    with pytest.raises(ValueError, match="max_statement_bytes"):
        ivm.connect(max_statement_bytes=-1)
    with pytest.raises(ValueError, match="statement_timeout"):
        ivm.connect(statement_timeout="soon")


def test_an_error_repeats_at_most_a_little_of_the_statement():
    with ivm.connect(max_statement_bytes=0) as db:
        # 200 KB statements: a hundred times the message bounds asserted, and seconds to parse
        # (the 2 MB ones took sqlglot ~25 s, most of it in the CREATE below, for the same proof)
        garbage = "SELEC " + "garbage " * 25_000
        with pytest.raises(ivm.SqlSyntaxError) as caught:
            db.sql(garbage)
        assert len(str(caught.value)) < 2100
        name = "a" * 2_000_000  # DuckDB's own message repeats the unknown column
        with pytest.raises(ivm.IvmError) as caught:
            db.sql(f"SELECT {name}")
        assert len(str(caught.value)) < 2100 and "message cut" in str(caught.value)
        # a statement sqlglot gives up on is echoed as its first 200 characters and its size
        with pytest.raises(ivm.SqlSyntaxError, match=r"… \([0-9]+ bytes\)") as caught:
            db.execute("CREATE " + "x " * 100_000)
        assert len(str(caught.value)) < 400


# --- one query per call -------------------------------------------------------------------------
def test_execute_refuses_a_script_that_mixes_a_query_with_changes_before_running_any(db):
    with pytest.raises(ivm.SqlSyntaxError, match="query.*Nothing was run"):
        db.execute("SELECT * FROM t; DROP TABLE t")
    with pytest.raises(ivm.SqlSyntaxError, match="Nothing was run"):
        db.execute("INSERT INTO t VALUES (9, 9); SELECT * FROM t")
    assert db.sql("SELECT count(*) FROM t").column(0).to_pylist() == [2]


def test_execute_still_runs_a_script_of_changes_and_one_query(db):
    assert db.execute("INSERT INTO t VALUES (3, 3); INSERT INTO t VALUES (4, 4), (5, 5)") == 2
    assert db.execute("SELECT * FROM t") == 5


def test_sql_runs_exactly_one_statement(db):
    with pytest.raises(ivm.SqlSyntaxError, match="one statement; this text holds 2"):
        db.sql("SELECT 1; SELECT 2")
    with pytest.raises(ivm.SqlSyntaxError, match="holds 2"):
        db.sql("INSERT INTO t VALUES (3, 3); DROP TABLE t")
    assert db.sql("SELECT count(*) FROM t").column(0).to_pylist() == [2]
    assert db.sql("INSERT INTO t VALUES (3, 3)").to_pylist() == [{"rows_affected": 1}]


def test_executescript_runs_changes_in_order_and_refuses_queries(db):
    assert db.executescript("CREATE TABLE u (a BIGINT); INSERT INTO u VALUES (1), (2); "
                            "CREATE MATERIALIZED VIEW s AS SELECT SUM(a) AS s FROM u; DELETE FROM u WHERE a = 1") == 3
    assert db.sql("SELECT s FROM s").column(0).to_pylist() == [2]
    with pytest.raises(ivm.SqlSyntaxError, match="Nothing was run"):
        db.executescript("DROP MATERIALIZED VIEW s; SELECT 1")
    assert "s" in db.sql("SHOW TABLES").column("name").to_pylist()


# --- time -------------------------------------------------------------------------------------------
SLOW = "SELECT count(*) AS n FROM t, range(100000000) a, range(100000) b"


def test_a_query_past_the_statement_timeout_is_cancelled():
    with ivm.connect(statement_timeout=0.3) as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, x BIGINT)")
        db.execute("INSERT INTO t VALUES (1, 2)")
        started = time.perf_counter()
        with pytest.raises(ivm.StatementTimeoutError, match="statement timeout of 0.3 s"):
            db.sql(SLOW)
        assert time.perf_counter() - started < 3.0
        assert db.sql("SELECT x FROM t").column(0).to_pylist() == [2]  # the connection still works


def test_a_change_past_the_statement_timeout_changes_nothing():
    with ivm.connect(statement_timeout=0.3) as db:
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, x BIGINT)")
        db.execute("INSERT INTO t VALUES (1, 2)")
        db.execute("CREATE MATERIALIZED VIEW v AS SELECT SUM(x) AS s FROM t")
        offset = db.offset
        with pytest.raises(ivm.StatementTimeoutError):
            db.execute("INSERT INTO t SELECT n + 10, n FROM (" + SLOW + ")")
        with pytest.raises(ivm.StatementTimeoutError):
            db.execute("UPDATE t SET x = x + 1 WHERE id IN (SELECT n FROM (" + SLOW + "))")
        with pytest.raises(ivm.StatementTimeoutError):
            db.execute("CREATE TABLE copy AS " + SLOW)
        assert db.offset == offset
        assert db.sql("SELECT s FROM v").column(0).to_pylist() == [2]
        assert db.sql("SHOW TABLES").column("name").to_pylist() == ["t", "v"]
