"""dbt-postgres against ivm: ``dbt run`` of a project whose models are ivm materialized views.

dbt-postgres (1.6+) has ``materialized='materialized_view'``: it sends
``create materialized view if not exists "ivm"."public"."m" as ...`` the
first time and, when the view exists and its configuration (indexes) is
unchanged, ``refresh materialized view`` (a no-op: ivm's views are always
fresh). Around them: catalog queries (pg_namespace, pg_tables/pg_views/
pg_matviews/pg_proc, pg_depend joined on ``'pg_rewrite'::regclass``,
pg_index/pg_am/pg_attribute for the view's indexes), ``drop materialized view
if exists ... cascade`` of its backup and intermediate names, BEGIN/COMMIT/
ROLLBACK. ``--full-refresh`` drops the view (cascade: the view over it goes
too) and creates it again. The project is fixtures/dbt_project; dbt needs no
network (no ``dbt deps``, no usage statistics).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

from tests.pgwire.conftest import connect

pytest.importorskip("dbt.adapters.postgres", reason="dbt-postgres is in the test extras (pyproject.toml)")

PROJECT = Path(__file__).parent / "fixtures" / "dbt_project"
ORDERS = [(1, 7, Decimal("90.50"), "open"), (2, 7, Decimal("20.00"), "open"), (3, 8, Decimal("5.00"), "open"),
          (4, 9, Decimal("300.00"), "cancelled"), (5, 9, Decimal("150.00"), "open")]
# The models' SELECTs over the same rows, as DuckDB answers them
EXPECTED = {
    "customer_totals": "SELECT cust, sum(amount) AS total, count(*) AS orders FROM orders WHERE status <> 'cancelled' "
                       "GROUP BY cust",
    "big_customers": "SELECT cust, total FROM (SELECT cust, sum(amount) AS total FROM orders "
                     "WHERE status <> 'cancelled' GROUP BY cust) WHERE total >= 100",
}


def dbt(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DBT_SEND_ANONYMOUS_USAGE_STATS": "false", "DBT_PROFILES_DIR": str(project.parent),
           "DBT_LOG_PATH": str(project / "logs"), "DBT_USE_COLORS": "false"}
    binary = Path(sys.executable).with_name("dbt")
    return subprocess.run([str(binary), *args, "--no-version-check"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=120)


def statuses(project: Path) -> dict[str, str]:
    results = json.loads((project / "target" / "run_results.json").read_text())["results"]
    return {r["unique_id"].rsplit(".", 1)[1]: r["status"] for r in results}


def expected(rows) -> dict[str, list[tuple]]:
    with duckdb.connect() as duck:
        duck.execute("CREATE TABLE orders (id BIGINT, cust BIGINT, amount DECIMAL(12,2), status VARCHAR)")
        duck.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", rows)
        return {name: sorted(duck.execute(sql).fetchall()) for name, sql in EXPECTED.items()}


def actual(conn) -> dict[str, list[tuple]]:
    return {name: sorted(conn.execute(f"SELECT {'cust, total, orders' if name == 'customer_totals' else 'cust, total'} "
                                      f"FROM {name}").fetchall()) for name in EXPECTED}


@pytest.fixture
def project(server, tmp_path):
    with connect(server) as conn:
        conn.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, cust BIGINT, amount DECIMAL(12,2), status VARCHAR)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s)", ORDERS)
    (tmp_path / "profiles.yml").write_text(f"""ivm:
  target: dev
  outputs:
    dev:
      type: postgres
      host: 127.0.0.1
      port: {server.pg_port}
      user: ivm
      password: ""
      dbname: ivm
      schema: public
      threads: 1
      connect_timeout: 20
""")
    return Path(shutil.copytree(PROJECT, tmp_path / "project"))


def test_dbt_run_builds_materialized_views_that_stay_fresh(server, project):
    first = dbt(project, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert statuses(project) == {"customer_totals": "success", "big_customers": "success"}
    with connect(server) as conn:
        assert {row[0] for row in conn.execute("SHOW MATERIALIZED VIEWS")} == {"big_customers", "customer_totals"}
        assert actual(conn) == expected(ORDERS)
        # big_customers reads customer_totals: dbt learns that from pg_depend
        assert conn.execute("SELECT v.relname, t.relname FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid "
                            "JOIN pg_class v ON v.oid = r.ev_class JOIN pg_class t ON t.oid = d.refobjid "
                            "WHERE d.deptype = 'n' ORDER BY 1").fetchall() == [
            ("big_customers", "customer_totals"), ("customer_totals", "orders")]

    # The views exist: dbt compares their indexes with the models' (none) and refreshes them (a no-op)
    second = dbt(project, "run")
    assert second.returncode == 0, second.stdout + second.stderr
    assert statuses(project) == {"customer_totals": "success", "big_customers": "success"}
    assert "refresh materialized view" in (project / "logs" / "dbt.log").read_text()

    # --full-refresh: drop ... cascade (big_customers goes with customer_totals), then create both again
    third = dbt(project, "run", "--full-refresh")
    assert third.returncode == 0, third.stdout + third.stderr

    with connect(server) as conn:
        assert actual(conn) == expected(ORDERS)
        # fresh without dbt: every acknowledged change is in the views
        conn.execute("UPDATE orders SET amount = 200 WHERE id = 3")
        conn.execute("UPDATE orders SET status = 'cancelled' WHERE id = 5")
        changed = [(i, c, Decimal("200.00") if i == 3 else a, "cancelled" if i == 5 else s) for i, c, a, s in ORDERS]
        assert actual(conn) == expected(changed)
        assert actual(conn)["big_customers"] == [(7, Decimal("110.50")), (8, Decimal("200.00"))]


@pytest.mark.parametrize("sql, message", [
    # a model or profile schema other than public (dbt creates it first)
    ('create schema if not exists "public_marts"', "CREATE SCHEMA is not supported: ivm's relations are all in "
                                                   "schema public"),
    # materialized='table' / 'view' models (dbt's table and view materializations rename a staged relation)
    ('alter table "ivm"."public"."orders" rename to "x"', "is not supported: ivm's ALTER TABLE is"),
    ('create view "ivm"."public"."v" as select 1', "CREATE VIEW (a plain view) is not supported"),
    ('alter materialized view "ivm"."public"."m" rename to "x"', "ALTER MATERIALIZED VIEW … RENAME is not supported"),
    # indexes=[...] in a model's config; persist_docs
    ('create index if not exists "i" on "ivm"."public"."orders" using btree (cust)', "CREATE INDEX is not supported"),
    ('comment on materialized view "ivm"."public"."m" is $$x$$', "is not supported"),
    ('refresh materialized view "ivm"."public"."m" with no data', "WITH NO DATA is not supported"),
])
def test_what_dbt_may_send_that_ivm_refuses(server, sql, message):
    # a clear 0A000, never a success that changed nothing
    with connect(server) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        assert caught.value.sqlstate == "0A000" and message in str(caught.value), str(caught.value)
