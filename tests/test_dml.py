"""SQL DML (INSERT, UPDATE, DELETE, INSERT OR REPLACE, CREATE TABLE AS) against DuckDB.

Every statement runs on ivm and on a plain DuckDB database; afterwards the
tables and the views must agree, and ``execute`` must report the rows
DuckDB reports as affected.
"""

from __future__ import annotations

import duckdb
import pytest

import ivm
from tests.oracle.compare import multiset_diff

SCHEMA = [
    "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner VARCHAR NOT NULL, balance DECIMAL(12,2) DEFAULT 0, opened DATE, active BOOLEAN)",
    "CREATE TABLE moves (account BIGINT, amount DECIMAL(12,2), ts TIMESTAMP)",
]
VIEWS = {
    "balances": "SELECT owner, SUM(balance) AS total, COUNT(*) AS n, MIN(opened) AS first FROM accounts GROUP BY owner",
    "activity": """SELECT a.owner, date_trunc('day', m.ts) AS day, SUM(m.amount) AS moved, COUNT(DISTINCT m.account) AS accts
                   FROM moves m JOIN accounts a ON a.id = m.account WHERE a.active GROUP BY a.owner, date_trunc('day', m.ts)""",
    "late": "SELECT account, ts + INTERVAL 1 HOUR AS due, amount FROM moves WHERE extract('hour' FROM ts) >= 12",
}
STATEMENTS = [
    "INSERT INTO accounts VALUES (1, 'ann', 10.50, DATE '2024-01-02', true), (2, 'bob', 3, DATE '2024-02-01', true)",
    "INSERT INTO accounts (id, owner, active) VALUES (3, 'ann', false)",
    "INSERT INTO moves VALUES (1, 5.25, TIMESTAMP '2024-03-01 09:00'), (1, 1, TIMESTAMP '2024-03-01 13:30'), "
    "(2, 7, TIMESTAMP '2024-03-02 18:00'), (3, 2, TIMESTAMP '2024-03-02 18:00')",
    "INSERT INTO moves SELECT account, amount * 2, ts + INTERVAL 1 DAY FROM moves WHERE amount > 1",
    "UPDATE accounts SET balance = balance + 1 WHERE owner = 'ann'",
    "UPDATE accounts SET active = NOT active",
    "UPDATE accounts SET owner = 'cy', opened = DATE '2023-12-31' WHERE id = 2",
    "UPDATE accounts SET id = id + 10 WHERE id >= 2",
    "DELETE FROM moves WHERE amount < 3",
    "UPDATE moves SET amount = amount - 1 WHERE account = 1",
    "INSERT OR REPLACE INTO accounts VALUES (1, 'dee', 99, NULL, true), (20, 'eve', 1, NULL, true)",
    "DELETE FROM accounts WHERE opened IS NULL AND id <> 1",
    "DELETE FROM moves",
    "UPDATE accounts SET balance = 0 WHERE false",
]


@pytest.fixture
def pair():
    db, ref = ivm.connect(), duckdb.connect()
    for statement in SCHEMA:
        db.execute(statement)
        ref.execute(statement)
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        ref.execute(f"CREATE VIEW {name} AS {sql}")
    yield db, ref
    db.close()
    ref.close()


def assert_same(db, ref, context):
    for name in ["accounts", "moves", *VIEWS]:
        diff = multiset_diff(db.sql(f"SELECT * FROM {name}"), ref.sql(f"SELECT * FROM {name}").to_arrow_table())
        assert diff is None, f"{name} after {context}: {diff}"


def test_statements_match_duckdb(pair):
    db, ref = pair
    for statement in STATEMENTS:
        affected = db.execute(statement)
        expected = ref.execute(statement).fetchall()
        assert affected == (expected[0][0] if expected else 0), statement
        assert_same(db, ref, statement)


def test_create_table_as_select(pair):
    db, ref = pair
    db.execute(STATEMENTS[0])
    assert db.execute("CREATE TABLE rich AS SELECT id, owner, balance FROM accounts WHERE balance > 5") == 1
    assert db.sql("SELECT id, owner FROM rich").to_pylist() == [{"id": 1, "owner": "ann"}]
    db.execute("INSERT INTO rich VALUES (1, 'dup', 0)")  # no primary key: a bag
    assert db.sql("SELECT COUNT(*) AS n FROM rich").column("n")[0].as_py() == 2


def test_default_values_fill_missing_columns(pair):
    db, _ = pair
    db.execute("INSERT INTO accounts (id, owner) VALUES (7, 'zed')")
    row = db.sql("SELECT balance, opened, active FROM accounts WHERE id = 7").to_pylist()[0]
    assert row["balance"] == 0 and row["opened"] is None and row["active"] is None


def test_statements_in_one_script(pair):
    db, ref = pair
    script = ";\n".join(STATEMENTS[:4])
    db.execute(script)
    for statement in STATEMENTS[:4]:
        ref.execute(statement)
    assert_same(db, ref, "script")
