"""Generated compiled steps (ivm/execute/compiled/generated.py) against their closures and DuckDB.

Each statement below is one the generated code claims (every operator and
expression in it has an emitter): it must compile to a generated function,
and on random inputs (NULLs, duplicates, extremes of each type) the
generated function, the closures and DuckDB must agree: the same rows, or
the generated code refusing the batch (``Fallback``: the closures then run
it) where it cannot compute it exactly. Where DuckDB raises (an overflow),
neither compiled path may return rows.
"""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import parse_one

from ivm.execute.compiled.step import CompiledStep, Fallback, same_rows
from sql_frontend.errors import InternalError
from tests.compiled_check import DOUBLES, INTS, SMALL_INTS, STRINGS, tables

HUGE = st.one_of(SMALL_INTS, st.sampled_from([2**63 - 1, -(2**63), 2**63, 10**20]), st.integers(-(2**62), 2**62))
CENTS = st.one_of(st.integers(-300, 300), st.sampled_from([10**11, -(10**11) + 1])).map(lambda c: Decimal(c).scaleb(-2))
A = {
    "k": (pa.int64(), st.one_of(SMALL_INTS, INTS)),
    "i": (pa.int32(), st.one_of(SMALL_INTS, st.sampled_from([2**31 - 1, -(2**31)]))),
    "x": (pa.float64(), DOUBLES),
    "b": (pa.bool_(), st.booleans()),
    "h": (pa.decimal128(38, 0), HUGE),
    "d": (pa.decimal128(12, 2), CENTS),
    "s": (pa.string(), STRINGS),
    # Dates near 1970 (days), up to 2052, and the first dates outside the years 1..9999 (a DATE met as a
    # TIMESTAMP there falls back, in the closures and in generated code alike).
    "t": (pa.date32(), st.one_of(st.integers(-30, 40), st.integers(-1000, 30000), st.sampled_from([-719163, 2932897]))),
}
R = {"k": (pa.int64(), SMALL_INTS), "v": (pa.int64(), st.one_of(SMALL_INTS, INTS)), "y": (pa.float64(), DOUBLES),
     "s": (pa.string(), STRINGS)}

GLOBAL = ("SELECT COUNT(*) AS n, COUNT(s) AS cs, SUM(k) AS sk, SUM(x) AS sx, SUM(h) AS sh, MIN(d) AS md, MAX(t) AS mt, "
          "BOOL_AND(b) AS ba, BOOL_OR(b) AS bo FROM a WHERE k > 5")

STATEMENTS = [
    "SELECT k, i + 1 AS p, k - i AS q, i * 2 AS m, x * 2.0 AS xd, x - i AS xi FROM a",
    "SELECT COALESCE(k, i, 0) AS c, COALESCE(x, 0) AS cx, COALESCE(h, 0) + k AS hk, COALESCE(b, FALSE) AS cb FROM a",
    "SELECT CASE WHEN x > 0 THEN k WHEN b THEN i ELSE NULL END AS c1, "
    "CASE WHEN NOT (k IS NULL) THEN x ELSE 0 END AS c2, CASE WHEN b THEN 1 END AS c3, "
    "CASE WHEN x = CAST('inf' AS DOUBLE) THEN CAST('nan' AS DOUBLE) ELSE x END AS c4 FROM a",
    "SELECT k = i AS e, x < 1.5 AS lt, x >= i AS ge, x <> k AS ne, k IS NOT DISTINCT FROM i AS nd, "
    "x IS DISTINCT FROM i AS di, i < x AS lt2, i >= x AS ge2, b AND x > 0 AS an, b OR k > 0 AS o, NOT b AS nb, x IS NULL AS xn, b = (k > 0) AS bb "
    "FROM a",
    "SELECT GREATEST(x, i) AS g, LEAST(k, i, 2) AS l, ISFINITE(x) AS f, ISNAN(x) AS n, CAST(i AS BIGINT) AS ci, "
    "CAST(k AS INTEGER) AS ck, CAST(k AS DOUBLE) AS kd, CAST(h AS BIGINT) AS hb, d + 1 AS d1, d * 2 AS d2, "
    "d - d AS d3, d > 1.5 AS d4, CAST(d AS DOUBLE) AS d5, h + 1 AS h1 FROM a",
    "SELECT k, COUNT(*) AS n, COUNT(x) AS cx, SUM(i) AS si, SUM(x) AS sx, MIN(x) AS mn, MAX(i) AS mx, SUM(h) AS sh, "
    "SUM(CASE WHEN ISFINITE(x) THEN x * i ELSE 0 END) AS s2, MAX(d) AS md, BOOL_AND(b) AS ba, BOOL_OR(b) AS bo "
    "FROM a GROUP BY k",
    "SELECT COALESCE(SUM(i), 0) AS s, b FROM a GROUP BY b, i > 0",
    "SELECT a.k, a.x, r.v, r.y FROM a LEFT JOIN r ON a.k IS NOT DISTINCT FROM r.k",
    "SELECT a.k, r.v, a.x + r.y AS s FROM a INNER JOIN r ON a.k = r.k WHERE r.v > 0",
    # joins with a side whose keys never repeat (a grouping's rows: one search pairs every row)
    "SELECT a.k, a.i, g.s, g.m FROM a LEFT JOIN (SELECT k, COUNT(*) AS s, MAX(v) AS m FROM r GROUP BY k) AS g ON a.k = g.k",
    "SELECT a.k, g.s FROM a INNER JOIN (SELECT k, COUNT(*) AS s, MAX(v) AS m FROM r GROUP BY k) AS g "
    "ON a.k IS NOT DISTINCT FROM g.k",
    "WITH u AS (SELECT k, x FROM a WHERE x > 0 UNION ALL SELECT k, y FROM r WHERE NOT (y IS NULL)) "
    "SELECT k, MAX(x) AS m, MIN(x) AS n FROM u GROUP BY k",
    "SELECT *, n.c > 0 AS keep, n.ok IS NOT DISTINCT FROM n.k AS same FROM (SELECT a.k, "
    "CAST(COALESCE(r.v, 0) + a.h AS BIGINT) AS c, r.k AS ok, CAST(1 AS BIGINT) AS one "
    "FROM a LEFT JOIN r ON a.k IS NOT DISTINCT FROM r.k LEFT JOIN r AS r2 ON a.i = r2.k) AS n",
    # unary minus (a Z-set term's negated weight; MIN of each integer type falls back), division, BETWEEN
    "SELECT -k AS nk, -i AS ni, -x AS nx, -d AS nd, -h AS nh, x / i AS q, k / 2 AS h2, d / x AS dq, "
    "i BETWEEN -5 AND k AS bt, x BETWEEN 0 AND 1.5 AS bx, d BETWEEN 1 AND 2.5 AS bd FROM a WHERE k BETWEEN -3 AND 3",
    # strings: carried as positions into their arrays, gathered for keys, set operations and results
    "SELECT s, k, s IS NULL AS sn FROM a WHERE k > 0 OR s IS NULL",
    "SELECT s, COUNT(*) AS n, COUNT(s) AS cs, SUM(k) AS sk FROM a GROUP BY s",
    "SELECT a.k, a.s, r.s AS rs, r.v FROM a LEFT JOIN r ON a.s = r.s",
    "SELECT a.s, r.v, r.s AS rs FROM a INNER JOIN r ON a.s IS NOT DISTINCT FROM r.s AND a.k = r.k",
    "SELECT a.i, r.s, r.y FROM a LEFT JOIN r ON a.k = r.k WHERE a.i > 0",
    "WITH u AS (SELECT s, k FROM a WHERE s IS NULL OR k > 0 UNION ALL SELECT s, k FROM r WHERE NOT (s IS NULL)) "
    "SELECT s, MAX(k) AS m, COUNT(*) AS n FROM u GROUP BY s",
    "SELECT s, k FROM a UNION ALL SELECT s, v FROM r",
    # sides of different types: integers widen, NULL takes the other side's type (strings too)
    "SELECT s, i AS n, x FROM a UNION ALL SELECT NULL, k, NULL FROM a",
    "SELECT NULL AS s, v, y FROM r UNION ALL SELECT s, i, x FROM a WHERE i > 0",
    "SELECT CAST(NULL AS TEXT) AS s, CAST(s AS TEXT) AS t, k FROM a UNION ALL SELECT s, CAST(NULL AS TEXT), v FROM r",
    "SELECT s, 'lit' AS l, s = 'ab' AS e, s < 'b' AS lt, s <> 'a' AS ne, 'b' >= s AS ge, s IS NOT DISTINCT FROM 'a' AS nd, "
    "s IN ('a', 'straße', '') AS i FROM a WHERE s > '' OR k = 0",
    "SELECT a.s, r.s AS rs, a.s = r.s AS e, a.s > r.s AS g, a.s IS DISTINCT FROM r.s AS d FROM a LEFT JOIN r ON a.k = r.k",
    "SELECT s LIKE '%a%' AS l1, s NOT LIKE 'st%' AS l2, s LIKE '' AS l3, SUBSTRING(s, 2, 2) AS sub, "
    "SUBSTRING(s, 1) AS rest FROM a WHERE SUBSTRING(s, 1, 1) IN ('a', 's') OR s IS NULL",
    "SELECT SUBSTRING(s, 1, 1) AS c, COUNT(*) AS n FROM a GROUP BY SUBSTRING(s, 1, 1)",
    "SELECT k IN (1, -2, 3) AS i1, i IN (k, 0) AS i2, x IN (1.5, 0) AS i3, d IN (1.25, 2) AS i4 FROM a "
    "WHERE k NOT IN (4, 5)",
    "SELECT DISTINCT s, k, x FROM a",
    "SELECT s, k FROM a UNION SELECT s, v FROM r",
    "SELECT k, s FROM a WHERE EXISTS (SELECT 1 FROM r WHERE r.k = a.k AND r.v > 0)",
    "SELECT k, i FROM a WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.s IS NOT DISTINCT FROM a.s AND r.k = a.k)",
    # joins with a residual condition (in a LEFT join it decides what matches, as ON does)
    "SELECT a.k, a.s, r.v, r.y FROM a LEFT JOIN r ON a.k = r.k AND r.v > a.i",
    "SELECT a.k, r.v, r.s AS rs FROM a INNER JOIN r ON a.k = r.k AND (a.s < r.s OR r.y > a.x)",
    # a global aggregate: one row, over no rows too (COUNT 0, the others NULL)
    "SELECT COUNT(*) AS n, SUM(i) AS si, MAX(x) AS mx, COUNT(s) AS cs, MIN(d) AS md FROM a WHERE k > -3",
    GLOBAL,
    # a DATE against a constant date plus an interval (a TIMESTAMP), and filters in a row: each takes the
    # rows the one before it kept (generated code composes the positions and gathers each column once)
    "SELECT k, s, t < CAST('1994-01-01' AS DATE) + INTERVAL '1' YEAR AS y1, t >= CAST('1994-01-01' AS DATE) AS y2 "
    "FROM a WHERE t < CAST('2000-01-01' AS DATE) + INTERVAL '3' MONTH AND i > 0 AND NOT (s IS NULL) AND k <> 2",
    "SELECT k, EXTRACT(YEAR FROM t) AS y, EXTRACT(MONTH FROM t) AS m, EXTRACT(DAY FROM t) AS dd, "
    "EXTRACT(YEAR FROM CAST(t AS TIMESTAMP)) AS ty FROM a WHERE EXTRACT(YEAR FROM t) > 1969",
    # joins without equalities: every left row with every right row (a global aggregate's new state with its
    # old row), then the residual; in a LEFT join a left row none of whose pairs pass is kept once
    "SELECT a.k, a.s, g.n, g.sk FROM a LEFT JOIN (SELECT COUNT(*) AS n, SUM(v) AS sk FROM r) AS g ON TRUE",
    "SELECT a.k, r.v, r.s AS rs FROM a CROSS JOIN r WHERE a.i > r.v",
    "SELECT a.k, a.x, r.y, r.s AS rs FROM a LEFT JOIN r ON a.x > r.y OR a.s = r.s",
    "SELECT a.k, a.t, a.s, r.v, r.s = a.s AS same FROM a INNER JOIN r ON a.k = r.k WHERE a.t >= CAST('1970-01-05' AS DATE) "
    "AND a.t < CAST('1970-01-01' AS DATE) + INTERVAL '20' DAY AND r.v > 0 AND NOT (a.s IS NULL) AND a.s <> 'zz'",
]


def _empty(columns: dict) -> pa.Table:
    return pa.table({name: pa.array([], t) for name, (t, _) in columns.items()})


_STEPS: dict[str, CompiledStep] = {}


def _step(sql: str) -> CompiledStep:
    """The statement compiled for A's and R's types (typed by DuckDB's result over empty inputs)."""
    if sql not in _STEPS:
        inputs = {"a": _empty(A), "r": _empty(R)}
        con = duckdb.connect()
        for name, table in inputs.items():
            con.register(name, table)
        schema = con.sql(sql).to_arrow_table().schema
        _STEPS[sql] = CompiledStep(parse_one(sql, read="duckdb"), {n: t.schema for n, t in inputs.items()}, schema)
    return _STEPS[sql]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_statement_is_generated(sql):
    step = _step(sql)
    assert step.generated is not None, step.why_not_generated


def _outcome(run, inputs):
    try:
        return run(inputs)
    except Fallback:
        return None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(a=tables(A, max_rows=10), r=tables(R, max_rows=6))
def test_generated_equals_closures_and_duckdb(a, r):
    inputs = {"a": a, "r": r}
    con = duckdb.connect()
    for name, table in inputs.items():
        con.register(name, table)
    for sql in STATEMENTS:
        step = _step(sql)
        generated = _outcome(lambda i: step._table(step.generated(i)), inputs)
        closures = _outcome(step.run_closures, inputs)
        try:
            theirs = con.sql(sql).to_arrow_table()
        except duckdb.Error:
            theirs = None
        for name, ours in (("generated", generated), ("closures", closures)):
            if ours is None:
                continue
            assert theirs is not None, f"DuckDB raised, the {name} step returned rows:\n{sql}\n{ours.to_pylist()}"
            difference = same_rows(ours, theirs)
            assert difference is None, f"{name}: {difference}\n{sql}\n{step.source}"
        if generated is not None and closures is not None:
            assert same_rows(generated, closures) is None, sql


def _fresh(sql: str) -> tuple[CompiledStep, dict]:
    """A step of its own (not the shared cache: these tests change it) and inputs with a row or two."""
    step = _step(sql)
    step = CompiledStep(parse_one(sql, read="duckdb"), step.schemas, step.expected)
    a = pa.table({"k": pa.array([1, 2], pa.int64()), "i": pa.array([3, None], pa.int32()),
                  "x": [0.5, float("nan")], "b": [True, None], "h": pa.array([7, 8], pa.decimal128(38, 0)),
                  "d": pa.array([Decimal("1.25"), None], pa.decimal128(12, 2)), "s": ["x", None],
                  "t": pa.array([3, None], pa.date32())})
    return step, {"a": a, "r": _empty(R)}


@pytest.mark.parametrize("rows", [0, 2])
def test_a_global_aggregate_over_no_rows_is_generated(rows):
    """No Fallback: the generated function makes the one row (the filter leaves none of the rows)."""
    step, inputs = _fresh(GLOBAL)
    inputs = {"a": inputs["a"].slice(0, rows), "r": inputs["r"]}
    ours = step._table(step.generated(inputs))
    con = duckdb.connect()
    con.register("a", inputs["a"])
    assert ours.to_pylist() == con.sql(GLOBAL).to_arrow_table().to_pylist() == [
        {"n": 0, "cs": 0, "sk": None, "sx": None, "sh": None, "md": None, "mt": None, "ba": None, "bo": None}]


def test_shadow_mode_compares_the_generated_function_with_its_closures(monkeypatch):
    monkeypatch.setenv("IVM_SHADOW", "1")
    step, inputs = _fresh(STATEMENTS[0])
    real = step.generated
    monkeypatch.setattr(step, "generated", lambda i: [a.slice(0, 1) for a in real(i)])
    with pytest.raises(InternalError, match="generated step differs from its closures"):
        step.run(inputs)


def test_a_batch_the_generated_function_refuses_runs_on_the_closures(monkeypatch):
    monkeypatch.setenv("IVM_SHADOW", "0")
    step, inputs = _fresh(STATEMENTS[0])

    def refuse(inputs):
        raise Fallback("refused")
    monkeypatch.setattr(step, "generated", refuse)
    assert same_rows(step.run(inputs), step.run_closures(inputs)) is None
