"""What the Spark executor ships of a driver temporary (ivm/execute/spark/temps.py, spark_columns_read).

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
from ivm.execute.spark.temps import SparkTemps, spark_columns_read, driver_columns


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
    needed = spark_columns_read(program)
    assert needed["t"] == {"x", "mixed", "y"}
    assert needed["s"] is None and needed["u"] is None  # a star selects from them directly
    assert needed["v"] is None  # the outer star reads v's columns as well as w's
    assert needed["p"] == {"pk", "flag"}


def test_programs_with_loops_ship_whole_temporaries():
    loop = Loop(init=(("x", "a"),), body=[query("b", "SELECT x.k FROM x")], next=(("x", "b"),), until="b")
    assert spark_columns_read(Program(steps=[query("a", "SELECT t.k FROM t"), loop])) == {}


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
    needed = spark_columns_read(program)
    delta = next(name for name in program.inputs if "lineitem" in name)
    assert {"l_orderkey", "l_returnflag", "l_quantity", "l_extendedprice", "l_discount", "__weight"} <= needed[delta]
    assert not {"l_comment", "l_shipmode", "l_shipdate"} & needed[delta]


def test_the_driver_copy_of_a_join_term_holds_its_lookups_columns_only():
    """driver_columns: what driver steps read of each temporary (Spark readers read the checkpoint)."""
    with ivm.connect(engine="duckdb", maintenance="incremental") as db:
        for table in ("orders", "lineitem"):
            db.execute(f"CREATE TABLE {table} ({SCHEMA[table]})")
        db.execute(f"CREATE MATERIALIZED VIEW revenue AS {VIEW}")
        program = db._engine.catalog.views["revenue"].program(frozenset({"lineitem"}), frozenset({"lineitem", "orders"}))
    driver = driver_columns(program)
    lookups = [s for s in program.steps if isinstance(s, Lookup)]
    # the join term (read by the state lookups and by queries): the lookups' probe columns only
    term = next(s.probe for s in lookups if s.probe not in program.inputs and not s.probe.startswith("look"))
    assert driver[term] == {c for s in lookups if s.probe == term for c in s.probe_columns}
    assert 2 <= len(driver[term]) < len(spark_columns_read(program)[term] or ())
    for replace in program.replaces:  # Replace steps and the output take whole temporaries
        assert all(driver[n] is None for n in (replace.deletes, replace.inserts) if n is not None)
    assert driver[program.output] is None
    # steps on stored state may run on the driver (executor._run_beside_state): every column of what they read
    merges = [s for s in program.steps if isinstance(s, Query) and s.beside_state]
    assert {s.out.rstrip("0123456789") for s in merges} == {"aggnew", "valnew", "rescan"}
    for merge in merges:
        assert all(driver[t.name] is None for t in merge.sql.find_all(sqlglot.exp.Table))
    # a MIN/MAX guard on the driver: its probe's value, weight and keys, its values' extremes and keys
    guard = next(s.guard for s in program.steps if isinstance(s, Query) and s.guard is not None)
    assert guard.keys
    guarded = Program(steps=[Query("r", sqlglot.parse_one("SELECT n.k FROM n"), ("n",), guard=guard)])
    assert driver_columns(guarded) == {guard.probe: {guard.column, "__weight", *guard.keys},
                                       guard.values: {*guard.value_columns, *guard.keys}}
    loop = Loop(init=(("x", "a"),), body=[query("b", "SELECT x.k FROM x")], next=(("x", "b"),), until="b")
    assert driver_columns(Program(steps=[query("a", "SELECT t.k FROM t"), loop])) is None


# --- the MIN/MAX rescan guard (program.Guard, ivm/execute/executor.py guard_empty) ---------------
# A rescan query finds groups whose current extreme was deleted; on Spark it
# costs a job for, on most batches, no rows. The guard decides on the driver.

def guard_test(probe: dict, values: dict, value_columns=("__m0",)) -> bool:
    from delta_operators.program import Guard
    from ivm.execute.executor import guard_empty

    return guard_empty(Guard("n", "__v", "o", value_columns), pa.table(probe), pa.table(values))


def test_the_guard_skips_only_when_no_deleted_value_is_an_old_extreme():
    old = {"__m0": [10, 20], "__m1": [1, 2]}
    # 10 is deleted (weight 0) and is an old extreme: the rescan must run
    assert not guard_test({"__v": [10, 5], "__weight": [0, 1]}, old)
    # 10 is still present (weight 1); 5 is deleted but no extreme: skip
    assert guard_test({"__v": [10, 5], "__weight": [1, -1]}, old)
    # every extreme column counts (a MIN and a MAX of the same argument)
    assert not guard_test({"__v": [2], "__weight": [-1]}, old, ("__m0", "__m1"))
    assert guard_test({"__v": [], "__weight": []}, {"__m0": pa.array([], pa.int64())})


def test_the_guard_never_skips_where_arrow_and_sql_equality_may_differ():
    # -0.0 = 0.0 in SQL: floats are left to the query
    assert not guard_test({"__v": [-0.0], "__weight": [0]}, {"__m0": [5.0]})
    # different types (a decimal scale, a width): the query decides
    assert not guard_test({"__v": pa.array([1], pa.int32()), "__weight": [0]}, {"__m0": pa.array([7], pa.int64())})
    # NULLs only make it run (is_in matches NULL to NULL, SQL finds nothing)
    assert not guard_test({"__v": pa.array([None], pa.int64()), "__weight": [0]}, {"__m0": pa.array([None], pa.int64())})


def test_the_guard_compares_deleted_values_with_their_own_groups_extremes():
    import duckdb

    from delta_operators.program import Guard
    from ivm.execute import duck
    from ivm.execute.executor import guard_empty
    from storage.keys import KeyCoder

    coder = KeyCoder(duck.Runner(duckdb.connect()).run)

    def test(probe: dict, values: dict, keys=("g", "h")) -> bool:
        return guard_empty(Guard("n", "__v", "o", ("__m0", "__m1"), keys), pa.table(probe), pa.table(values), coder)

    old = {"g": ["a", "b", None], "h": [1, 1, 2], "__m0": [10, 20, 30], "__m1": [1, 2, 3]}
    deleted = lambda g, h, v: {"g": pa.array([g], pa.string()), "h": pa.array([h], pa.int64()), "__v": [v], "__weight": [0]}  # noqa: E731
    assert test(deleted("a", 1, 20), old)  # 20 is b's extreme, not a's: skip (ignoring groups would run it)
    assert not test(deleted("b", 1, 20), old)  # b's own MAX deleted
    assert not test(deleted(None, 2, 3), old)  # the NULL group's MIN: NULL keys match NULL keys
    assert test(deleted(None, 1, 3), old)  # (NULL, 1) is no group of old
    assert test({"g": ["a"], "h": pa.array([1], pa.int64()), "__v": pa.array([None], pa.int64()), "__weight": [-1]},
                old)  # a NULL value is nobody's extreme (the rescan compares with =)
    # key types that differ between the sides (a width, here) code differently: groups are ignored
    other = {**old, "h": pa.array([1, 1, 2], pa.int32())}
    assert not test(deleted("a", 1, 20), other)
    assert test(deleted("a", 1, 5), other)
    # floating-point keys (-0.0 and 0.0 are one group in SQL): groups are ignored
    floats = {"g": [0.0], "__m0": [7], "__m1": [7]}
    assert not test({"g": [-0.0], "__v": [7], "__weight": [0]}, floats, ("g",))


def test_max_rescans_run_only_when_a_groups_max_is_deleted(monkeypatch):
    from ivm.execute import executor

    answers = []
    real = executor.guard_empty
    monkeypatch.setattr(executor, "guard_empty", lambda *a: answers.append(real(*a)) or answers[-1])
    with ivm.connect(engine="duckdb", maintenance="incremental") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, g VARCHAR, x INTEGER)")
        db.execute("CREATE MATERIALIZED VIEW m AS SELECT g, MAX(x) AS top, MIN(x) AS low FROM t GROUP BY g")
        db.apply_changes("t", pa.table({"id": [1, 2, 3, 4], "g": ["a", "a", "a", None], "x": [5, 9, 1, 3],
                                        "__op": ["c"] * 4}))
        db.apply_changes("t", pa.table({"id": [5], "g": ["a"], "x": [4], "__op": ["c"]}))  # no deletes
        answers.clear()
        db.apply_changes("t", pa.table({"id": [5], "g": ["a"], "x": [6], "__op": ["u"]}))  # 4 deleted: no extreme
        assert answers and all(answers)
        answers.clear()
        db.apply_changes("t", pa.table({"id": [2, 4], "g": ["a", None], "x": [9, 3], "__op": ["d", "d"]}))
        assert answers and not any(answers)  # 9 (a's MAX) and 3 (the NULL group's) deleted: rescan
        assert sorted(db.sql("SELECT * FROM m").to_pylist(), key=str) == [{"g": "a", "top": 6, "low": 1}]
