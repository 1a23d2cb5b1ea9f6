"""Pruning source deltas to the columns a view reads (delta_operators/prune.py).

An update of columns a view does not read must not run the view's program,
and must not change its result; an update that does touch a read column in
the same batch must still be maintained. Readers that cannot be analysed
(DISTINCT or a set operation straight over a table, stars) keep every column.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

import ivm
from delta_operators.prune import read_columns
from tests.oracle.compare import multiset_diff


@pytest.fixture()
def db():
    db = ivm.connect()
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, a VARCHAR, b INTEGER, c DOUBLE)")
    db.execute("CREATE TABLE u (k BIGINT PRIMARY KEY, x INTEGER)")
    rows = pa.table({"k": [1, 2, 3, 4], "a": ["p", "q", None, "p"], "b": [1, 2, 3, None], "c": [0.5, 1.5, 2.5, 3.5]})
    db.apply_changes("t", rows.append_column("__op", pa.array(["c"] * 4)))
    db.apply_changes("u", pa.table({"k": [1, 2, 3], "x": [10, 20, 30], "__op": ["c"] * 3}))
    yield db
    db.close()


def reads(db, view: str) -> dict:  # noqa: ANN001
    plan = db._engine.catalog.views[view].plan
    return {r: (None if c is None else sorted(c)) for r, c in read_columns(plan).items()}


def runs(db, view: str) -> int:  # noqa: ANN001
    return sum(db.status()["maintenance"]["views"][view]["batches"].values())


def equals_recompute(db, views: dict[str, str]) -> None:  # noqa: ANN001
    con = duckdb.connect()
    for table in ("t", "u"):
        data = db.sql(f"SELECT * FROM {table}")  # noqa: F841  (read by DuckDB)
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM data")
    for name, sql in views.items():
        assert multiset_diff(db.sql(f"SELECT * FROM {name}"), con.sql(sql).to_arrow_table()) is None, name


def update(db, table: str, **columns) -> None:  # noqa: ANN001
    n = len(next(iter(columns.values())))
    db.apply_changes(table, pa.table({**columns, "__op": ["u"] * n}))


def test_read_columns_follow_the_joins_and_filters(db):
    db.execute("CREATE MATERIALIZED VIEW j AS SELECT t.a, SUM(u.x) AS s FROM t JOIN u ON t.k = u.k WHERE t.b > 0 GROUP BY t.a")
    assert reads(db, "j") == {"t": ["a", "b", "k"], "u": ["k", "x"]}
    db.execute("CREATE MATERIALIZED VIEW self AS SELECT t1.a, t2.c FROM t t1 JOIN t t2 ON t1.k = t2.b")
    assert reads(db, "self") == {"t": ["a", "b", "c", "k"]}  # both aliases' columns
    db.execute("CREATE MATERIALIZED VIEW n AS SELECT COUNT(k) AS n FROM t")
    assert reads(db, "n") == {"t": ["k"]}


@pytest.mark.parametrize("sql", [
    "SELECT DISTINCT * FROM t",
    "SELECT * FROM t EXCEPT SELECT k, a, b, c FROM t WHERE b > 1",
    "SELECT * FROM t",
])
def test_unanalysed_readers_keep_every_column(db, sql):
    db.execute(f"CREATE MATERIALIZED VIEW v AS {sql}")
    got = reads(db, "v")["t"]
    assert got is None or got == ["a", "b", "c", "k"]
    before = runs(db, "v")
    update(db, "t", k=[1], a=["p"], b=[1], c=[9.5])
    assert runs(db, "v") == before + 1
    equals_recompute(db, {"v": sql})


def test_update_of_unread_columns_runs_nothing(db):
    views = {"g": "SELECT a, COUNT(*) AS n, SUM(b) AS s FROM t GROUP BY a",
             "n": "SELECT COUNT(k) AS n FROM t",
             "j": "SELECT t.a, u.x FROM t JOIN u ON t.k = u.k"}
    for name, sql in views.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    before = {name: runs(db, name) for name in views}
    update(db, "t", k=[1, 2, 4], a=["p", "q", "p"], b=[1, 2, None], c=[7.0, 8.0, 9.0])  # only c changes
    assert {name: runs(db, name) for name in views} == before
    equals_recompute(db, views)
    # The same batch moves one row across groups (a read column) and changes c elsewhere.
    update(db, "t", k=[1, 3], a=["q", None], b=[1, 3], c=[0.0, 0.0])
    assert runs(db, "g") == before["g"] + 1 and runs(db, "j") == before["j"] + 1
    assert runs(db, "n") == before["n"]  # reads only the key: an update never changes it
    equals_recompute(db, views)
    # Deletes and inserts are never pruned.
    db.apply_changes("t", pa.table({"k": [2], "a": ["q"], "b": [2], "c": [1.5], "__op": ["d"]}))
    db.apply_changes("t", pa.table({"k": [9], "a": [None], "b": [None], "c": [None], "__op": ["c"]}))
    assert runs(db, "n") == before["n"] + 2
    equals_recompute(db, views)


def test_pruned_view_over_a_view(db):
    db.execute("CREATE MATERIALIZED VIEW base AS SELECT k, a, b * 2 AS b2, c FROM t")
    db.execute("CREATE MATERIALIZED VIEW top AS SELECT a, SUM(b2) AS s FROM base GROUP BY a")
    before = runs(db, "top")
    update(db, "t", k=[1, 2], a=["p", "q"], b=[1, 2], c=[5.0, 6.0])  # base changes (c), top reads no c
    assert runs(db, "top") == before
    update(db, "t", k=[1, 2], a=["p", "q"], b=[5, 2], c=[5.0, 1.0])
    assert runs(db, "top") == before + 1
    equals_recompute(db, {"base": "SELECT k, a, b * 2 AS b2, c FROM t",
                          "top": "SELECT a, SUM(b * 2) AS s FROM t GROUP BY a"})


def test_cancelled_pairs_keep_each_read_projection_as_a_z_set():
    """The numpy pruning of keyed tables' deltas (delta_operators/prune.py: cancelled_pairs)
    drops -old/+new pairs of one key equal in the read columns, and keeps π_P(δ) as a Z-set."""
    import random

    import numpy as np

    from delta_operators.prune import cancelled_pairs

    nan, values = float("nan"), [0.0, -0.0, 1.5, None, float("nan")]
    for seed in range(30):
        rng = random.Random(seed)
        rows = []
        for k in range(rng.randrange(1, 40)):
            old = (k, rng.choice("xy"), rng.choice(values))
            new = (k, rng.choice("xy"), rng.choice(values)) if rng.random() < 0.5 else old
            kind = rng.choice(["update", "insert", "delete"])
            rows += ([(*old, -1)] if kind != "insert" else []) + ([(*new, 1)] if kind != "delete" else [])
        delta = pa.table({"k": [r[0] for r in rows], "a": [r[1] for r in rows], "c": [r[2] for r in rows],
                          "__weight": [r[3] for r in rows]}, schema=pa.schema(
            [("k", pa.int64()), ("a", pa.string()), ("c", pa.float64()), ("__weight", pa.int64())]))
        for columns in [("a",), ("c",), ("a", "c"), ("k", "a")]:
            pruned = cancelled_pairs(delta, delta.column("k").to_numpy(), ("k",), columns)

            def projection(t):
                sums: dict = {}
                for r in t.to_pylist():
                    value = tuple("nan" if isinstance(r[c], float) and r[c] != r[c] else
                                  (r[c], str(r[c])) for c in columns)
                    sums[value] = sums.get(value, 0) + r["__weight"]
                return {v: w for v, w in sums.items() if w}

            assert projection(pruned) == projection(delta), (seed, columns)
            assert set(map(str, pruned.to_pylist())) <= set(map(str, delta.to_pylist()))
    # an update of nothing read goes; -0.0 is not 0.0; NULL and NaN equal themselves
    delta = pa.table({"k": [1, 1, 2, 2, 3, 3, 4, 4], "c": [0.0, -0.0, None, None, nan, nan, 1.0, 1.0],
                      "b": ["p", "q", "p", "q", "p", "q", "p", "p"], "__weight": [-1, 1] * 4})
    kept = cancelled_pairs(delta, np.array([1, 1, 2, 2, 3, 3, 4, 4]), ("k",), ("c",))
    assert kept.column("k").to_pylist() == [1, 1]
    assert cancelled_pairs(delta, np.array([1, 1, 2, 2, 3, 3, 4, 4]), ("k",), ("c", "b")).column("k").to_pylist() \
        == [1, 1, 2, 2, 3, 3]
    # projections of one delta share their column comparisons (Engine._pruned): the same rows as alone
    from delta_operators.prune import key_pairs, without_equal_pairs

    pairs, compared = key_pairs(delta, np.array([1, 1, 2, 2, 3, 3, 4, 4])), {}
    for columns in [("c",), ("c", "b"), ("b",), ("b", "c")]:
        shared = without_equal_pairs(delta, pairs, ("k",), columns, compared)
        alone = without_equal_pairs(delta, pairs, ("k",), columns)
        assert str(shared.to_pylist()) == str(alone.to_pylist()), columns  # str: NaN is not == NaN
    assert set(compared) == {"k", "c", "b"}


def test_a_key_of_several_columns_prunes_in_numpy():
    """lineitem's and partsupp's keys have two columns: their deltas are pruned by pairs of one key
    in numpy (one hash of the key per delta), not by a window query per projection, and the
    views still equal their recompute."""
    from delta_operators import prune

    db = ivm.connect()
    try:
        db.execute("CREATE TABLE t (k BIGINT, n VARCHAR, a VARCHAR, b INTEGER, c DOUBLE, PRIMARY KEY (k, n))")
        db.execute("CREATE TABLE u (k BIGINT PRIMARY KEY, x INTEGER)")
        rows = {"k": [1, 1, 2, 3], "n": ["x", "y", "x", "z"], "a": ["p", "q", None, "p"], "b": [1, 2, 3, None],
                "c": [0.5, 1.5, 2.5, 3.5]}
        db.apply_changes("t", pa.table({**rows, "__op": ["c"] * 4}))
        db.apply_changes("u", pa.table({"k": [1, 2, 3], "x": [10, 20, 30], "__op": ["c"] * 3}))
        views = {"g": "SELECT a, COUNT(*) AS n, SUM(b) AS s FROM t GROUP BY a",
                 "h": "SELECT n, MAX(c) AS c FROM t GROUP BY n",
                 "j": "SELECT t.a, u.x FROM t JOIN u ON t.k = u.k"}
        for name, sql in views.items():
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        windows = []
        template = prune.prune_template
        prune_template = lambda columns: windows.append(columns) or template(columns)  # noqa: E731
        from ivm import engine

        engine.prune_template, before = prune_template, {name: runs(db, name) for name in views}
        try:
            update(db, "t", k=[1, 1, 2], n=["x", "y", "x"], a=["p", "q", None], b=[1, 2, 3], c=[9.0, 1.5, 7.0])
            assert {name: runs(db, name) for name in views} == {**before, "h": before["h"] + 1}
            equals_recompute(db, views)
            update(db, "t", k=[1, 3], n=["y", "z"], a=["p", "q"], b=[2, None], c=[1.5, 3.5])  # moves rows in g, j
            assert runs(db, "g") == before["g"] + 1 and runs(db, "j") == before["j"] + 1
            assert runs(db, "h") == before["h"] + 1
            equals_recompute(db, views)
        finally:
            engine.prune_template = template
        assert windows == []
    finally:
        db.close()
