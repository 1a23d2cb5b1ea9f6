"""What the Spark executor ships of a driver temporary (ivm/spark/temps.py, columns_read).

Shipping rows to Spark costs by their bytes, so a temporary goes with only the
columns the program's queries can read. Dropping one a query reads would make
Spark fail (an unknown column) or, worse, a ``*`` return fewer columns: these
tests pin the superset rule. No Spark session is needed.
"""

from __future__ import annotations

import pyarrow as pa
import sqlglot

import ivm
from bench.spark import VIEW
from bench.tpch import SCHEMA
from delta_operators.program import Loop, Lookup, Program, Query
from ivm.spark.temps import SparkTemps, columns_read


def query(out: str, sql: str) -> Query:
    return Query(out=out, sql=sqlglot.parse_one(sql, read="duckdb"), drivers=())


def test_columns_named_in_queries_are_shipped_and_stars_ship_everything():
    program = Program(steps=[
        query("a", 'SELECT t.x, t."Mixed" FROM t WHERE t.y > 0'),
        query("b", "SELECT s.* FROM s"),
        query("c", "SELECT q.k FROM (SELECT * FROM u) AS q"),
        query("d", "SELECT *, v.k AS k2 FROM (SELECT v.k FROM v) AS w JOIN v ON w.k = v.k"),
        Lookup(out="e", relation="r", index=("k",), probe="p", probe_columns=("pk",), probe_filter="flag"),
    ])
    needed = columns_read(program)
    assert needed["t"] == {"x", "mixed", "y"}
    assert needed["s"] is None and needed["u"] is None  # a star selects from them directly
    assert needed["v"] is None  # the outer star reads v's columns as well as w's
    assert needed["p"] == {"pk", "flag"}


def test_programs_with_loops_ship_whole_temporaries():
    loop = Loop(init=(("x", "a"),), body=[query("b", "SELECT x.k FROM x")], next=(("x", "b"),), until="b")
    assert columns_read(Program(steps=[query("a", "SELECT t.k FROM t"), loop])) == {}


def test_shipped_tables_keep_needed_columns_in_any_case_and_at_least_one():
    shipped = {}
    temps = SparkTemps({"t": pa.table({"X": [1], "y": [2], "z": [3]}), "n": pa.table({"a": [1], "b": [2]})},
                       lambda table: shipped.setdefault(table.column_names[0], table), lambda lazy: None,
                       {"t": {"x", "z"}, "n": set()})
    temps.frame("t")
    temps.frame("n")
    assert shipped["X"].column_names == ["X", "z"]
    assert shipped["a"].column_names == ["a"]  # COUNT(*) over n still sees its rows


def test_a_lineitem_batch_ships_the_joined_and_aggregated_columns_only():
    with ivm.connect(engine="duckdb", maintenance="incremental") as db:
        for table in ("orders", "lineitem"):
            db.execute(f"CREATE TABLE {table} ({SCHEMA[table]})")
        db.execute(f"CREATE MATERIALIZED VIEW revenue AS {VIEW}")
        view = db._engine.catalog.views["revenue"]
        program = view.program(frozenset({"lineitem"}), frozenset({"lineitem", "orders"}))
    needed = columns_read(program)
    delta = next(name for name in program.inputs if "lineitem" in name)
    assert {"l_orderkey", "l_returnflag", "l_quantity", "l_extendedprice", "l_discount", "__weight"} <= needed[delta]
    assert not {"l_comment", "l_shipmode", "l_shipdate"} & needed[delta]
