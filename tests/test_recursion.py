"""WITH RECURSIVE beyond the oracle: the state's invariant and divergence.

The oracle (tests/test_oracle_recursive.py) checks view contents; here we
check that the derivation counts DRed relies on are exactly what they
claim, and that a recursion without a fixpoint is an error that changes
nothing.
"""

from __future__ import annotations

import random

import duckdb
import pytest

import ivm
from delta_operators import recursive
from ivm import ExecutionError
from tests.oracle.model import Model, generate_batch, ops_to_arrow
from tests.test_errors import assert_rejected

TC = ("WITH RECURSIVE tc(a, b) AS (SELECT src, dst FROM links UNION "
      "SELECT tc.a, l.dst FROM tc JOIN links l ON tc.b = l.src) SELECT a, b FROM tc")


def state_of(db: ivm.Database, view: str, role: str):
    engine = db._engine
    (spec,) = [s for s in engine.catalog.views[view].states if role in s.name]
    return engine.store.snapshot[spec.name].table()


def test_derivation_counts_are_exact_after_random_changes():
    """cnt(a, b) = edges a->b + pairs (tc(a, x), edge x->b): what re-derivation trusts."""
    db = ivm.connect(maintenance="incremental")  # the counts are operator state: a recompute leaves it stale
    db.execute("CREATE TABLE links (id BIGINT PRIMARY KEY, src INTEGER, dst INTEGER)")
    db.execute(f"CREATE MATERIALIZED VIEW tc AS {TC}")
    model, rng = Model(), random.Random(11)
    spec = model.specs["links"]
    for step in range(25):
        ops = ([("r", spec.gen(rng)) for _ in range(rng.choice([1, 4, 10]))] if step % 3 == 0
               else generate_batch(rng, model, "links", rng.choice([1, 2, 5, 15])))
        db.apply_changes("links", ops_to_arrow(spec, ops))
        model.apply("links", ops)
        counts = state_of(db, "tc", "rec")  # noqa: F841  (both read by the SQL below)
        links = model.arrow("links")  # noqa: F841
        wrong = duckdb.sql("""
            WITH expected AS (
                SELECT a, b, COUNT(*) AS n FROM (
                    SELECT src AS a, dst AS b FROM links
                    UNION ALL SELECT c.a, l.dst FROM counts c JOIN links l ON c.b = l.src) GROUP BY a, b)
            SELECT c.a, c.b, c.__cnt, e.a, e.b, e.n FROM counts c FULL JOIN expected e
              ON c.a IS NOT DISTINCT FROM e.a AND c.b IS NOT DISTINCT FROM e.b
            WHERE c.__cnt IS DISTINCT FROM e.n
        """).fetchall()
        assert not wrong, f"after step {step}: stored counts differ from derivations: {wrong[:5]}"
    assert counts.num_rows > 0
    db.close()


@pytest.fixture
def few_rounds(monkeypatch):
    monkeypatch.setattr(recursive, "MAX_ROUNDS", 30)


WALKS = ("WITH RECURSIVE w(a, b) AS (SELECT src, dst FROM links UNION ALL "
         "SELECT w.a, l.dst FROM w JOIN links l ON w.b = l.src) SELECT a, b FROM w")


def test_union_all_over_a_cycle_cannot_be_created(few_rounds):
    db = ivm.connect()
    db.execute("CREATE TABLE links (id BIGINT PRIMARY KEY, src INTEGER, dst INTEGER)")
    db.execute("INSERT INTO links VALUES (1, 1, 2), (2, 2, 1)")
    assert_rejected(db, lambda: db.execute(f"CREATE MATERIALIZED VIEW walks AS {WALKS}"), ExecutionError,
                    "fixpoint", "30 rounds", "WITH RECURSIVE w")
    db.close()


def test_a_change_that_closes_a_cycle_under_union_all_is_rejected(few_rounds):
    db = ivm.connect()
    db.execute("CREATE TABLE links (id BIGINT PRIMARY KEY, src INTEGER, dst INTEGER)")
    db.execute("INSERT INTO links VALUES (1, 1, 2), (2, 2, 3)")
    db.execute(f"CREATE MATERIALIZED VIEW walks AS {WALKS}")
    db.execute(f"CREATE MATERIALIZED VIEW closure AS {TC}")
    assert_rejected(db, lambda: db.execute("INSERT INTO links VALUES (3, 3, 1)"), ExecutionError, "fixpoint")
    # Without the cycle the same kind of change goes through.
    db.execute("INSERT INTO links VALUES (3, 3, 4)")
    assert sorted(db.sql("SELECT * FROM walks").to_pylist(), key=repr) == sorted(
        [{"a": a, "b": b} for a, b in [(1, 2), (2, 3), (3, 4), (1, 3), (2, 4), (1, 4)]], key=repr)
    db.close()
