"""The program optimizer (delta_operators/optimize.py): fewer statements, the same result."""

from __future__ import annotations

from collections import Counter

import duckdb
import pyarrow as pa
from sqlglot import exp, parse_one

from delta_operators.optimize import optimize
from delta_operators.program import Program, Query


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
