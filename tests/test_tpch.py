"""All 22 TPC-H queries as materialized views under a refresh stream (issue 3, acceptance 2).

Data comes from ``tpchgen-cli`` at a small scale factor; the stream
(bench/tpch.py) inserts new orders with their lineitems, deletes old orders
with theirs, and updates prices, dates, quantities, statuses, comments and
balances. After every change batch each view must equal DuckDB running the
query over the same tables.

The five queries whose result ORDER BY ... LIMIT decides (top-K, issue 3
part B) are strict xfails until top-K lands; their bodies without the LIMIT
are maintained and checked now, so part B only adds the top-K on top.
"""

from __future__ import annotations

import pytest

import ivm
from bench import tpch
from ivm.errors import UnsupportedError
from tests.oracle.compare import multiset_diff

QUERIES = tpch.query_files()
CASES = [(name, sql) for name, sql in QUERIES.items()] + [
    (f"{name}_nolimit", tpch.without_limit(sql)) for name, sql in QUERIES.items() if int(name[1:]) in tpch.TOP_K
]


def _param(name: str, sql: str):  # noqa: ANN202
    if name[0] == "q" and name[1:].isdigit() and int(name[1:]) in tpch.TOP_K:
        return pytest.param(name, sql, id=name,
                            marks=pytest.mark.xfail(strict=True, reason="needs top-K (issue 3 part B)"))
    return pytest.param(name, sql, id=name)


def run_stream(directory, scale: float, refreshes: int, seed: int) -> dict[str, str | None]:  # noqa: ANN001
    """Create every case as a view, stream ``refreshes`` refreshes, and report the first problem of each."""
    tpch.generate(scale, directory)
    con = tpch.reference(directory)
    db = ivm.connect()
    problems: dict[str, str | None] = {}
    try:
        tpch.create_tables(db)
        tpch.load(db, con)
        live = {}
        for name, sql in CASES:
            try:
                db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            except UnsupportedError as e:
                problems[name] = f"not created: {e}"
                continue
            problems[name] = None
            live[name] = sql
        refresh = tpch.Refresh(con, seed=seed)

        def check(context: str) -> None:
            for name, sql in list(live.items()):
                diff = multiset_diff(db.sql(f"SELECT * FROM {name}"), con.sql(sql).to_arrow_table())
                if diff:
                    problems[name] = f"{context}: {diff}"
                    del live[name]  # report its first difference only

        check("after creating the views")
        for step in range(refreshes):
            for table, changes in refresh.batches():
                db.apply_changes(table, changes)
                refresh.apply(table, changes)
                check(f"refresh {step}, {changes.num_rows} changes to {table}")
    finally:
        db.close()
        con.close()
    return problems


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return run_stream(tmp_path_factory.mktemp("tpch"), scale=0.01, refreshes=3, seed=7)


@pytest.mark.parametrize("name, sql", [_param(n, s) for n, s in CASES])
def test_tpch_query_equals_recompute_under_refresh(stream, name, sql):
    assert stream[name] is None, stream[name]


@pytest.mark.slow
def test_tpch_longer_stream_at_larger_scale(tmp_path):
    problems = run_stream(tmp_path, scale=0.05, refreshes=8, seed=11)
    failing = {n: p for n, p in problems.items() if p is not None and not (
        n[1:].isdigit() and int(n[1:]) in tpch.TOP_K)}
    assert not failing, failing
