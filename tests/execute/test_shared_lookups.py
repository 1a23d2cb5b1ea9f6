"""Shared lookups (ivm.execute.executor.SharedLookups): one maintenance pass probes a relation once per distinct probe.

Two views joining the same delta to the same dimension by the same key read
the same rows; the second view's lookup must reuse the first one's result,
and both views must still equal DuckDB's answer. A lookup of another
relation version, other probe keys or other columns never reuses a result.
"""

from __future__ import annotations

import pyarrow as pa

import ivm
from ivm.execute.executor import SharedLookups
from delta_operators.program import Lookup


def _db():
    db = ivm.connect()
    db.execute("CREATE TABLE customers (id BIGINT PRIMARY KEY, nation VARCHAR, segment VARCHAR)")
    db.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount BIGINT)")
    db.apply_changes("customers", pa.table({
        "id": list(range(5000)), "nation": [f"n{i % 7}" for i in range(5000)],
        "segment": [f"s{i % 3}" for i in range(5000)]}))
    db.apply_changes("orders", pa.table({"id": list(range(20000)), "cust": [i % 5000 for i in range(20000)],
                                         "amount": [i % 97 for i in range(20000)]}))
    return db


def test_two_views_probing_alike_share_the_lookup_and_stay_correct(lookups_run):
    db = _db()
    views = {
        "totals": "SELECT c.nation, SUM(o.amount) AS total, COUNT(*) AS n FROM orders o JOIN customers c "
                  "ON o.cust = c.id GROUP BY c.nation",
        "biggest": "SELECT c.nation, MAX(o.amount) AS biggest FROM orders o JOIN customers c "
                   "ON o.cust = c.id GROUP BY c.nation",
    }
    for name, sql in views.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    lookups_run.clear()
    db.apply_changes("orders", pa.table({"id": [20001, 20002, 20003], "cust": [7, 4999, None], "amount": [3, 4, 5]}))
    probes = [step for step, _ in lookups_run if step.relation == "customers"]
    # Each view's program reads customers once for the delta; the first ran the probe, the second reused it.
    assert len(probes) == 1, lookups_run
    for name, sql in views.items():
        got = sorted(tuple(r.values()) for r in db.sql(f"SELECT * FROM {name}").to_pylist())
        want = sorted(tuple(r.values()) for r in db.sql(sql).to_pylist())
        assert got == want


class _Relation:
    """A stand-in for one version of a stored relation: SharedLookups reads only its schema."""

    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _step(**changes) -> Lookup:
    base = dict(out="l", relation="r", index=("id",), probe="p", probe_columns=("k",))
    return Lookup(**{**base, **changes})


def test_a_result_is_reused_only_for_the_same_version_keys_and_columns():
    shared = SharedLookups()
    version, other_version = _Relation(), _Relation()
    ran: list[str] = []

    def run(tag: str):
        def go() -> pa.Table:
            ran.append(tag)
            return pa.table({"id": [1], "name": ["a"]})
        return go

    probe = pa.table({"k": [1, 2, 3], "x": ["a", "b", "c"]})
    same_keys = pa.table({"k": pa.chunked_array([[1], [2, 3]]), "y": [0, 0, 0]})  # other object, other chunks
    first = shared.lookup(_step(), probe, version, run("first"))
    assert shared.lookup(_step(), same_keys, version, run("again")) is first
    shared.lookup(_step(), probe, other_version, run("new version"))
    shared.lookup(_step(), pa.table({"k": [1, 2, 4]}), version, run("other keys"))
    narrow = shared.lookup(_step(columns=frozenset({"id"})), probe, version, run("narrower columns"))
    assert narrow.column_names == ["id"]
    shared.lookup(_step(columns=frozenset({"id", "name"})), probe, version, run("all columns again"))
    shared.lookup(_step(probe_columns=("x",)), probe, version, run("other probe column"))
    # A narrow result cannot serve a lookup copying more columns.
    seven = pa.table({"k": [7]})
    shared.lookup(_step(columns=frozenset({"id"})), seven, version,
                  lambda: ran.append("narrow first") or pa.table({"id": [1]}))
    shared.lookup(_step(), seven, version, run("wider after"))
    assert ran == ["first", "new version", "other keys", "other probe column", "narrow first", "wider after"]
    assert shared.hits == 3


def test_results_past_the_budget_are_not_kept():
    shared = SharedLookups(budget=0)
    ran = []
    probe = pa.table({"k": [1]})
    version = _Relation()
    for _ in range(2):
        shared.lookup(_step(), probe, version, lambda: ran.append(1) or pa.table({"id": [1]}))
    assert len(ran) == 2 and shared.hits == 0
