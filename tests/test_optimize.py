"""The program optimizer (delta_operators/optimize.py): fewer statements, the same result."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow as pa
from sqlglot import exp, parse_one

from delta_operators.optimize import optimize
from delta_operators.program import Guard, Lookup, Loop, Program, Query, Replace, Stack
from storage.zset import WEIGHT


def run(program: Program, d: pa.Table) -> list[tuple]:
    """The program's output, each query run in DuckDB over the temporaries before it."""
    con = duckdb.connect()
    con.register("d", d)
    for step in program.steps:
        con.register(step.out, con.sql(step.sql.sql("duckdb")).to_arrow_table())
    return sorted(con.sql(f"SELECT * FROM {program.output}").fetchall())


def test_a_temporary_read_through_two_inlined_readers_is_defined_once():
    """a is read by b and by c, and b by c: inlined, c holds a once, at the top, before b.

    Nested at two levels (a inside b's CTE, and a beside it), Spark rejected
    the query (DUPLICATED_CTE_NAMES; TPC-H q21's semi-join) and DuckDB
    computed a twice.
    """
    def program() -> Program:
        return Program(steps=[
            Query("a", parse_one("SELECT x, x * 2 AS y FROM d WHERE x > 1"), ("d",)),
            Query("b", parse_one("SELECT x, SUM(y) AS s FROM a GROUP BY x"), ("a",)),
            Query("c", parse_one("SELECT b.x, b.s, a.y FROM b JOIN a ON a.x = b.x"), ("a", "b")),
        ], output="c")

    d = pa.table({"x": [1, 2, 2, 3, None]})
    optimized = optimize(program())
    assert [s.out for s in optimized.steps] == ["c"]
    tree = optimized.steps[0].sql
    names = [cte.alias for cte in tree.find_all(exp.CTE)]
    assert Counter(names) == {"a": 1, "b": 1}
    assert [cte.alias for cte in tree.args["with_"].expressions] == ["a", "b"]
    assert run(optimized, d) == run(program(), d) == [(2, 8, 4), (2, 8, 4), (3, 6, 6)]


# --- fuse_renames: a query renaming a Stack's columns becomes that Stack ---------------------

def stacked(term_sql: str, extra: list | None = None, output: str = "t") -> Program:
    """An aggregate's -old/+new Stack of ``w`` and a query over it (TPC-H's top projections)."""
    from delta_operators.program import Stack

    return Program(steps=[
        Stack(out="agg", source="w", parts=(
            ("__emit_old", -1, (("k", "__o_k"), ("agg0", "__o_agg0"), ("agg1", "__o_agg1"))),
            ("__emit_new", 1, (("k", "__n_k"), ("agg0", "__n_agg0"), ("agg1", "__n_agg1"))),
        )),
        Query("t", parse_one(term_sql), ("agg",)),
        *(extra or []),
    ], output=output)


WIDE = pa.table({
    "__o_k": ["a", "b", None], "__o_agg0": [1, 2, 3], "__o_agg1": [1.5, None, 2.0],
    "__n_k": ["a", "b", None], "__n_agg0": [4, 2, None], "__n_agg1": [1.5, 7.0, None],
    "__emit_old": [True, False, True], "__emit_new": [True, True, False],
})


def run_steps(program: Program) -> pa.Table:
    """The program's output over WIDE, Stacks on the driver and queries in DuckDB (ivm's executor)."""
    from ivm.execute.executor import Executor
    from storage.keys import KeyCoder

    con = duckdb.connect()
    executor = Executor(con, KeyCoder(lambda template, **inputs: None))
    temps, _ = executor.run(program, {"w": WIDE}, snapshot=None)
    return temps[program.output]


def test_a_query_renaming_a_stacks_columns_becomes_the_stack():
    sql = 'SELECT "s"."k" AS "key", "s"."agg1" AS "avg_x", "s"."agg0" AS "n", "s"."__weight" AS "__weight" FROM agg AS s'
    fused = optimize(stacked(sql))
    assert [type(s).__name__ for s in fused.steps] == ["Stack"]
    stack = fused.steps[0]
    assert stack.out == "t" and stack.source == "w"
    assert stack.parts[0] == ("__emit_old", -1, (("key", "__o_k"), ("avg_x", "__o_agg1"), ("n", "__o_agg0")))
    got, want = run_steps(fused), run_steps(stacked(sql))
    assert got.equals(want.cast(got.schema)) and got.schema.names == want.schema.names
    assert sorted(got.to_pylist(), key=str) == sorted([
        {"key": "a", "avg_x": 1.5, "n": 1, "__weight": -1}, {"key": None, "avg_x": 2.0, "n": 3, "__weight": -1},
        {"key": "a", "avg_x": 1.5, "n": 4, "__weight": 1}, {"key": "b", "avg_x": 7.0, "n": 2, "__weight": 1},
    ], key=str)


def test_queries_that_compute_filter_or_share_the_stack_stay_queries():
    from delta_operators.program import Replace

    keep = 'SELECT s.k AS k, s.agg0 AS n, s.__weight AS __weight FROM agg AS s'
    cases = {
        "computes": 'SELECT s.k AS k, s.agg0 / s.agg1 AS r, s.__weight AS __weight FROM agg AS s',
        "filters": keep.replace(" FROM agg AS s", " FROM agg AS s WHERE s.agg0 > 1"),
        "drops the weight": 'SELECT s.k AS k FROM agg AS s',
        "renames the weight": 'SELECT s.k AS k, s.__weight AS w FROM agg AS s',
        "puts the weight first": 'SELECT s.__weight AS __weight, s.k AS k FROM agg AS s',
        "a column the stack lacks": 'SELECT s.k AS k, s.other AS o, s.__weight AS __weight FROM agg AS s',
    }
    for why, sql in cases.items():
        assert [type(s).__name__ for s in optimize(stacked(sql)).steps] == ["Stack", "Query"], why
    # another step reads the Stack's rows too
    shared = stacked(keep, extra=[Query("u", parse_one("SELECT k FROM agg"), ("agg",), pinned=True)])
    assert [type(s).__name__ for s in optimize(shared).steps] == ["Stack", "Query", "Query"]
    replaced = stacked(keep)
    replaced.replaces.append(Replace(relation="r", deletes=None, inserts="agg"))
    assert [type(s).__name__ for s in optimize(replaced).steps] == ["Stack", "Query"]


def _lookup(out: str, probe: str = "d") -> "Lookup":
    return Lookup(out, "lineitem", ("l_orderkey",), probe, ("k",))


def test_a_lookup_takes_only_the_columns_its_readers_name():
    """Two readers: the union of the names they use (a superset is safe), lower case."""
    program = optimize(Program(steps=[
        _lookup("look"),
        Query("a", parse_one("SELECT look.L_Quantity, SUM(look.l_price) AS s FROM look GROUP BY 1"), ("look",)),
        Query("b", parse_one("SELECT COUNT(*) AS n FROM look WHERE l_shipmode = 'AIR'"), ("look",)),
        Query("out", parse_one("SELECT * FROM a, b"), ("a", "b")),
    ], output="out"))
    look = next(s for s in program.steps if isinstance(s, Lookup))
    # inlined into one statement, whose names are a superset of what it reads of look
    assert {"l_quantity", "l_price", "l_shipmode"} <= look.columns
    assert "l_comment" not in look.columns


def test_a_lookup_read_whole_keeps_every_column():
    """A * over it, a Stack, a Replace, the view's output or a loop: every column."""
    star = Program(steps=[_lookup("look"), Query("a", parse_one("SELECT look.* FROM look"), ("look",), pinned=True),
                          Query("b", parse_one("SELECT k FROM a"), ("a",))], output="b")
    output = Program(steps=[_lookup("look")], output="look")
    stacked = Program(steps=[_lookup("look"), Stack("s", "look", (("f", 1, (("x", "x"),)),))], output="s")
    replaced = Program(steps=[_lookup("look")], replaces=[Replace("lineitem", "look", None)])
    looped = Program(steps=[_lookup("look"), Query("a", parse_one("SELECT k FROM look"), ("look",), pinned=True),
                            Loop((("v", "a"),), [Query("w", parse_one("SELECT k FROM v"), ("v",))], (("v", "w"),), "w")],
                     output="a")
    for program in (star, output, stacked, replaced, looped):
        assert next(s for s in optimize(program).steps if isinstance(s, Lookup)).columns is None
    guarded = Program(steps=[_lookup("look"), Query("a", parse_one("SELECT 1 AS k"), (), pinned=True,
                                                    guard=Guard("look", "l_v", "a", ("k",), ("l_g",)))], output="a")
    assert next(s for s in optimize(guarded).steps if isinstance(s, Lookup)).columns == {"l_v", WEIGHT, "l_g"}


# --- prune_projections: CTE and subquery columns nothing reads are dropped ------------------

def _state_after(out_sql: str) -> Program:
    """A product term's shape: the state after the change (old rows looked up, UNION ALL the delta
    negated) joined with the delta, reading two of the state's four columns."""
    return Program(steps=[
        Lookup("look", "orders", ("o_key",), "d", ("k",)),
        Query("t", parse_one(out_sql), ("d", "look")),
    ], output="t")


NEW_STATE = ('WITH s AS (SELECT look.o_key AS o_key, look.o_date AS o_date, look.o_note AS o_note, '
             'look.__weight AS __weight FROM look AS look UNION ALL SELECT d.k AS o_key, d.dt AS o_date, '
             'd.note AS o_note, -d.__weight AS __weight FROM d AS d) ')


def test_a_cte_keeps_only_the_columns_its_readers_use_and_the_lookup_under_it_narrows():
    sql = NEW_STATE + 'SELECT d.k AS k, s.o_date AS o_date, d.__weight * s.__weight AS __weight FROM d AS d JOIN s AS s ON s.o_key = d.k'
    program = optimize(_state_after(sql))
    query = next(s for s in program.steps if isinstance(s, Query))
    cte = query.sql.args["with_"].expressions[0]
    assert [c.alias_or_name for c in cte.this.this.selects] == ["o_key", "o_date", "__weight"]
    columns = next(s for s in program.steps if isinstance(s, Lookup)).columns  # names read: a superset
    assert {"o_key", "o_date", WEIGHT} <= columns and "o_note" not in columns
    # the same rows as the query before pruning
    con = duckdb.connect()
    con.register("d", pa.table({"k": [1, 2, 2], "dt": [10, 20, 30], "note": ["x", None, "z"], WEIGHT: [1, -1, 1]}))
    con.register("look", pa.table({"o_key": [1, 2, 5], "o_date": [7, 8, 9], "o_note": ["a", "b", "c"],
                                   WEIGHT: [1, 1, 1]}))
    assert sorted(con.sql(query.sql.sql("duckdb")).fetchall()) == sorted(con.sql(sql).fetchall())


def test_distinct_stars_and_unqualified_columns_keep_every_column():
    """Dropping a column of a DISTINCT changes its rows; ``*`` and unqualified names are not analysed."""
    distinct = ('WITH s AS (SELECT DISTINCT look.o_key AS o_key, look.o_date AS o_date, look.o_note AS o_note, '
                'look.__weight AS __weight FROM look AS look) ')
    cases = {
        "distinct": distinct + "SELECT s.o_key AS k, s.__weight AS __weight FROM s AS s",
        "star": NEW_STATE + "SELECT s.* FROM s AS s",
        "unqualified": NEW_STATE + "SELECT o_key AS k, __weight FROM s",
    }
    for why, sql in cases.items():
        query = next(s for s in optimize(_state_after(sql)).steps if isinstance(s, Query))
        cte = query.sql.args["with_"].expressions[0].this
        first = cte.this if isinstance(cte, exp.Union) else cte
        assert len(first.selects) == 4, why


def test_a_query_reads_a_tables_columns_through_its_alias():
    """``query_columns`` (what narrow_lookups copies of a lookup): a column qualified by a table's alias
    is read of that table only; unqualified, or through a subquery's alias, of every table; ``*`` all.
    Each case checked against DuckDB: the query runs over tables holding only the columns counted."""
    from delta_operators.program import query_columns

    cases = {
        "SELECT a.x, b.y, z FROM t a JOIN u b ON a.k = b.k": {"t": {"x", "z", "k"}, "u": {"y", "z", "k"}},
        "SELECT a.x, b.y, v FROM t a JOIN u b ON a.k = b.k": {"t": {"x", "v", "k"}, "u": {"y", "v", "k"}},
        "SELECT s.y FROM (SELECT a.x AS y FROM t a) s": {"t": {"x", "y"}},
        "SELECT t.x FROM t WHERE t.k > 0": {"t": {"x", "k"}},
        "SELECT * FROM t JOIN u ON t.k = u.k": {"t": None, "u": None},
        # one alias for two tables (two scopes): its columns count for both
        "SELECT o.x FROM t o WHERE EXISTS (SELECT 1 FROM u o WHERE o.y = 1)": {"t": {"x", "y"}, "u": {"x", "y"}},
    }
    columns = {"t": ["k", "x", "z", "w"], "u": ["k", "y", "v", "w"]}
    for sql, want in cases.items():
        got = query_columns(parse_one(sql))
        assert got == want, sql
        con = duckdb.connect()
        for table, names in columns.items():
            kept = [n for n in names if got.get(table) is None or n in got[table]]
            con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(f'1 AS {n}' for n in kept)}")
        con.execute(sql)  # every column it reads is there
