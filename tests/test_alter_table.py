"""ALTER TABLE … ADD COLUMN / DROP COLUMN / ALTER COLUMN … TYPE (ivm/schema_change.py).

Every view must equal DuckDB running its stored SELECT (SHOW CREATE
MATERIALIZED VIEW: a ``SELECT *`` view keeps the columns it had, as in
PostgreSQL) over the current tables, after each change and after the writes
that follow it; views a change does not concern keep their state (no
recompute); a refused change changes nothing; all of it survives a reopen and
a crash, and runs the same over Flight SQL.
"""

from __future__ import annotations

import random

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pytest

import ivm
from sql_frontend.statements import AlterTable, parse_one
from tests.flight.server import ServerProcess
from tests.oracle.compare import multiset_diff
from tests.durable.test_durable import run_child

SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, cust INTEGER, amount DOUBLE, qty INTEGER, note VARCHAR)",
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, region VARCHAR)",
    "CREATE TABLE visits (cust INTEGER, page VARCHAR)",  # no key: a bag
]
VIEWS = {
    "per_cust": "SELECT cust, SUM(amount) AS total, SUM(qty) AS units, COUNT(*) AS n FROM orders GROUP BY cust",
    "by_region": "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM orders o JOIN customers c ON o.cust = c.id "
                 "GROUP BY region",
    "noted": "SELECT id, note FROM orders WHERE note IS NOT NULL",
    "everything": "SELECT * FROM orders WHERE amount > 50",
    "pages": "SELECT cust, COUNT(*) AS n FROM visits GROUP BY cust",
    "top_cust": "SELECT cust, total FROM per_cust WHERE total > 100",  # a view over a view
}


def make(path=None) -> ivm.Database:
    db = ivm.connect(path)
    for statement in SCHEMA:
        db.execute(statement)
    db.execute("INSERT INTO orders SELECT i, i % 13, i * 1.5, i % 4, CASE WHEN i % 3 = 0 THEN 'n' || i END "
               "FROM range(200) t(i)")
    db.execute("INSERT INTO customers SELECT i, 'r' || (i % 3) FROM range(13) t(i)")
    db.execute("INSERT INTO visits SELECT i % 13, 'p' || (i % 2) FROM range(60) t(i)")
    for name, sql in VIEWS.items():
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    return db


def stored_select(db: ivm.Database, view: str) -> str:
    text = db.sql(f"SHOW CREATE MATERIALIZED VIEW {view}").column("create_sql")[0].as_py()
    return text.split(" AS ", 1)[1]


def assert_views_equal_recompute(db: ivm.Database) -> None:
    """Every view equals its stored SELECT run by DuckDB over copies of the current tables."""
    ref = duckdb.connect()
    objects = db.objects()
    for table in (o for o in objects if o.kind == "table"):
        ref.register(table.name, db.sql(f"SELECT * FROM {table.name}"))
    problems = []
    for view in (o for o in objects if o.kind == "view"):
        want = ref.sql(stored_select(db, view.name)).to_arrow_table()
        got = db.sql(f"SELECT * FROM {view.name}")
        diff = multiset_diff(got, want)
        if diff:
            problems.append(f"{view.name}: {diff}")
        ref.register(view.name, got)  # views over views read the view's own rows
    ref.close()
    assert not problems, problems


def writes(db: ivm.Database, rng: random.Random, rounds: int = 6) -> None:
    """Random inserts, updates and deletes through SQL, naming only the columns the table has now."""
    columns = {o.name: o.schema.names for o in db.objects() if o.kind == "table"}
    for _ in range(rounds):
        first = rng.randint(1000, 10**6)
        extra = ", flag" if "flag" in columns["orders"] else ""
        value = ", true" if extra else ""
        note = ", note" if "note" in columns["orders"] else ""
        db.execute(f"INSERT INTO orders (id, cust, amount, qty{note}{extra}) SELECT {first} + i, i % 13, i * 7.0, i"
                   f"{', NULL' if note else ''}{value} FROM range({rng.randint(1, 20)}) t(i)")
        db.execute(f"UPDATE orders SET amount = amount + 1, qty = qty + 1 WHERE id % {rng.randint(2, 9)} = 0")
        db.execute(f"DELETE FROM orders WHERE id % {rng.randint(5, 20)} = 1")
        db.execute(f"INSERT INTO visits VALUES ({rng.randint(0, 15)}{', ' + repr('q') if 'page' in columns['visits'] else ''})")
        db.execute(f"DELETE FROM visits WHERE cust = {rng.randint(0, 15)}")
        assert_views_equal_recompute(db)


def state_of(db: ivm.Database, view: str):
    """The relations a view holds (its output or operator state) as published now."""
    engine = db._engine
    snapshot = engine.store.snapshot
    return [snapshot[s.name] for s in engine.catalog.views[view].states]


# --- parsing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sql, expected", [
    ("ALTER TABLE t ADD COLUMN c INT DEFAULT 5 NOT NULL", ("t", "add", "c", "INT", True)),
    ("alter table T add C varchar(10)", ("t", "add", "c", "TEXT", False)),  # (the catalog normalises it)
    ("ALTER TABLE t DROP COLUMN c CASCADE", ("t", "drop", "c", None, False)),
    ("ALTER TABLE IF EXISTS t DROP COLUMN c", ("t", "drop", "c", None, False)),
    ("ALTER TABLE public.t ALTER COLUMN c TYPE BIGINT", ("t", "type", "c", "BIGINT", False)),
    ("ALTER TABLE t ALTER c SET DATA TYPE DECIMAL(12,2)", ("t", "type", "c", "DECIMAL(12, 2)", False)),
])
def test_alter_table_parses(sql, expected):
    statement = parse_one(sql)
    assert isinstance(statement, AlterTable)
    definition = statement.definition
    assert (statement.table, statement.action, statement.column, definition and definition.type,
            bool(definition and definition.not_null)) == expected
    assert statement.cascade == ("CASCADE" in sql)
    assert statement.if_exists == ("IF EXISTS" in sql)


@pytest.mark.parametrize("sql, error, words", [
    ("ALTER TABLE t RENAME COLUMN a TO b", ivm.UnsupportedError, "ADD [COLUMN] c type"),
    ("ALTER TABLE t RENAME TO u", ivm.UnsupportedError, "ADD [COLUMN] c type"),
    ("ALTER TABLE t DROP c", ivm.UnsupportedError, "DROP COLUMN c [CASCADE]"),
    ("ALTER TABLE t ADD COLUMN a INT, DROP COLUMN b", ivm.UnsupportedError, "one action per statement"),
    ("ALTER TABLE t ALTER COLUMN c SET NOT NULL", ivm.UnsupportedError, "ALTER [COLUMN] c [SET DATA] TYPE"),
    ("ALTER TABLE t ALTER COLUMN c TYPE BIGINT USING c + 1", ivm.UnsupportedError, "USING"),
    ("ALTER TABLE t ADD COLUMN c INT PRIMARY KEY", ivm.UnsupportedError, "key is set when it is created"),
    ("ALTER TABLE t ADD COLUMN c INT CHECK (c > 0)", ivm.UnsupportedError, "CHECK"),
    ("ALTER VIEW v RENAME TO w", ivm.UnsupportedError, "ALTER VIEW is not supported"),
    ("ALTER TABLE information_schema.tables ADD COLUMN x INT", ivm.AccessDeniedError, "read-only"),
])
def test_unsupported_alter_forms_are_refused_by_name(sql, error, words):
    with pytest.raises(error) as raised:
        parse_one(sql)
    assert words in str(raised.value)


# --- refused changes change nothing ---------------------------------------------------------------

REFUSED = [
    ("ALTER TABLE nowhere ADD COLUMN x INT", ivm.UnknownObjectError, "table nowhere does not exist"),
    ("ALTER TABLE per_cust ADD COLUMN x INT", ivm.CatalogError, "per_cust is a materialized view"),
    ("ALTER TABLE orders ADD COLUMN note INT", ivm.CatalogError, "column note of table orders already exists"),
    ("ALTER TABLE orders ADD COLUMN x INT NOT NULL", ivm.CatalogError,
     "column x cannot be added NOT NULL without a DEFAULT: table orders holds 200 rows"),
    ("ALTER TABLE orders ADD COLUMN x INT DEFAULT cust", ivm.BindError, "must be a constant"),
    ("ALTER TABLE orders ADD COLUMN x NOSUCHTYPE", ivm.BindError, "unknown type NOSUCHTYPE"),
    ("ALTER TABLE orders DROP COLUMN nope", ivm.UnknownObjectError, "table orders has no column nope"),
    ("ALTER TABLE orders DROP COLUMN id", ivm.CatalogError, "part of the primary key of orders"),
    ("ALTER TABLE orders DROP COLUMN note", ivm.CatalogError,
     "cannot drop column note of table orders: materialized view(s) noted, everything read it"),
    ("ALTER TABLE orders DROP COLUMN amount", ivm.CatalogError,
     "materialized view(s) per_cust, by_region, everything read it"),
    ("ALTER TABLE orders ALTER COLUMN amount TYPE FLOAT", ivm.UnsupportedError,
     "cannot change from DOUBLE to FLOAT: ivm changes a column's type only to a wider one"),
    ("ALTER TABLE orders ALTER COLUMN qty TYPE SMALLINT", ivm.UnsupportedError, "from INTEGER to SMALLINT"),
    ("ALTER TABLE orders ALTER COLUMN cust TYPE BIGINT", ivm.CatalogError,
     "cannot change the type of column cust of table orders: materialized view(s) per_cust, everything read it "
     "and would change (per_cust: "),
]


def test_refused_changes_change_nothing():
    with make() as db:
        before = {o.name: (o.schema, db.sql(f"SELECT * FROM {o.name}")) for o in db.objects()}
        states = {v: state_of(db, v) for v in VIEWS}
        for sql, error, words in REFUSED:
            with pytest.raises(error) as raised:
                db.execute(sql)
            assert words in str(raised.value), (sql, str(raised.value))
            after = {o.name: (o.schema, db.sql(f"SELECT * FROM {o.name}")) for o in db.objects()}
            assert after.keys() == before.keys(), sql
            for name, (schema, rows) in before.items():
                assert after[name][0] == schema and not multiset_diff(after[name][1], rows), (sql, name)
            assert all(state_of(db, v) == states[v] for v in VIEWS), sql
        db.execute("INSERT INTO orders VALUES (9999, 1, 99.0, 1, 'x')")  # the catalog still works as before
        assert_views_equal_recompute(db)


def test_a_watermarked_table_is_not_altered():
    with ivm.connect() as db:
        db.execute("CREATE TABLE events (ts TIMESTAMP, v INTEGER, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
                   "APPEND ONLY")
        with pytest.raises(ivm.UnsupportedError, match="it has a WATERMARK"):
            db.execute("ALTER TABLE events ADD COLUMN w INTEGER")


# --- changes with views ------------------------------------------------------------------------------

def test_add_drop_and_widen_keep_every_view_equal_to_recompute():
    rng = random.Random(7)
    with make() as db:
        untouched = {v: state_of(db, v) for v in VIEWS}
        db.execute("ALTER TABLE orders ADD COLUMN flag BOOLEAN DEFAULT true")
        assert db.sql("SELECT COUNT(*) AS n FROM orders WHERE flag").column("n")[0].as_py() == 200
        db.execute("ALTER TABLE orders ADD COLUMN IF NOT EXISTS flag INTEGER")  # exists: nothing happens
        db.execute("ALTER TABLE customers ADD COLUMN since DATE")  # no default: NULL
        assert db.sql("SELECT COUNT(since) AS n FROM customers").column("n")[0].as_py() == 0
        # No view was computed again: each holds the very relations it held.
        assert {v: state_of(db, v) for v in VIEWS} == untouched
        # SELECT * keeps the columns it had (PostgreSQL's rule): its SELECT is stored with them spelled out.
        assert db.sql("SELECT * FROM everything").schema.names == ["id", "cust", "amount", "qty", "note"]
        assert "flag" not in stored_select(db, "everything") and '"note"' in stored_select(db, "everything")
        assert_views_equal_recompute(db)
        writes(db, rng, rounds=2)

        db.execute("DROP MATERIALIZED VIEW noted")
        with pytest.raises(ivm.CatalogError, match="materialized view\\(s\\) everything read it"):
            db.execute("ALTER TABLE orders DROP COLUMN note")
        db.execute("ALTER TABLE orders DROP COLUMN note CASCADE")  # everything goes with it
        assert sorted(o.name for o in db.objects() if o.kind == "view") == ["by_region", "pages", "per_cust",
                                                                            "top_cust"]
        db.execute("ALTER TABLE visits DROP COLUMN page")  # a bag: rows that became equal add up
        assert db.sql("SELECT COUNT(*) AS n FROM visits").column("n")[0].as_py() > 0
        db.execute("ALTER TABLE orders DROP COLUMN IF EXISTS note")
        assert_views_equal_recompute(db)
        writes(db, rng, rounds=2)

        per_cust = state_of(db, "per_cust")
        db.execute("ALTER TABLE orders ALTER COLUMN qty TYPE BIGINT")  # SUM(qty) keeps its type: per_cust stays
        assert db.sql("SELECT qty FROM orders").schema.field("qty").type == "int64"
        assert state_of(db, "per_cust") == per_cust
        db.execute("ALTER TABLE orders ALTER COLUMN qty TYPE BIGINT")  # the same type: nothing to do
        writes(db, rng, rounds=2)


def test_a_new_column_that_would_change_a_view_leaves_the_view_as_it_was():
    """An unqualified name the new column would make ambiguous, or capture in a subquery, stays bound as before."""
    with make() as db:
        db.execute("CREATE MATERIALIZED VIEW regions AS SELECT o.id, region FROM orders o JOIN customers c "
                   "ON o.cust = c.id")
        db.execute("CREATE MATERIALIZED VIEW north AS SELECT id FROM customers c WHERE EXISTS "
                   "(SELECT 1 FROM orders o WHERE o.cust = c.id AND region = 'r1')")
        before = {v: db.sql(f"SELECT * FROM {v}") for v in ("regions", "north")}
        db.execute("ALTER TABLE orders ADD COLUMN region VARCHAR DEFAULT 'r1'")
        for view, rows in before.items():
            assert not multiset_diff(db.sql(f"SELECT * FROM {view}"), rows), view
            assert '"c"."region"' in stored_select(db, view)
        db.execute("UPDATE customers SET region = 'r1' WHERE id = 2")
        assert_views_equal_recompute(db)


# --- durability and Flight SQL ---------------------------------------------------------------------

def test_changes_survive_a_reopen_and_a_crash(tmp_path):
    path = tmp_path / "db"
    with make(path) as db:
        db.execute("ALTER TABLE orders ADD COLUMN flag BOOLEAN DEFAULT false")  # everything: pinned to its columns
        db.execute("DROP MATERIALIZED VIEW everything")  # (it outputs qty, whose type changes next)
        db.execute("ALTER TABLE orders ALTER COLUMN qty TYPE BIGINT")
        db.execute("ALTER TABLE visits DROP COLUMN page")
        db.execute("INSERT INTO orders VALUES (5000, 3, 70.0, 2, 'kept', true)")
        expected = {o.name: db.sql(f"SELECT * FROM {o.name}") for o in db.objects()}
    with ivm.connect(path) as db:
        assert {o.name for o in db.objects()} == expected.keys()
        for name, rows in expected.items():
            got = db.sql(f"SELECT * FROM {name}")
            assert got.schema == rows.schema and not multiset_diff(got, rows), name
        assert_views_equal_recompute(db)
    done = run_child("""
        db = ivm.connect(path, checkpoint_seconds=3600)
        db.execute("ALTER TABLE orders DROP COLUMN flag")
        db.execute("ALTER TABLE customers ADD COLUMN code INTEGER DEFAULT 7")
        db.execute("INSERT INTO orders VALUES (5001, 4, 80.0, 3, 'logged')")  # only in the log
        db.execute("INSERT INTO customers VALUES (99, 'r9', 8)")
        os._exit(0)  # no close: the batches after the ALTERs are replayed in their new shape
    """, path)
    assert done.returncode == 0, done.stderr
    with ivm.connect(path) as db:
        assert db.sql("SELECT * FROM orders").schema.names == ["id", "cust", "amount", "qty", "note"]
        assert db.sql("SELECT code FROM customers ORDER BY id").column("code").to_pylist() == [7] * 13 + [8]
        assert db.sql("SELECT note FROM orders WHERE id = 5001").column("note").to_pylist() == ["logged"]
        assert_views_equal_recompute(db)


def test_alter_table_over_flight_sql(tmp_path):
    server = ServerProcess("--data", str(tmp_path / "db"))
    try:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, v VARCHAR);"
                              "CREATE MATERIALIZED VIEW n AS SELECT COUNT(*) AS n FROM t;"
                              "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
            cur.execute("SELECT * FROM t ORDER BY id")
            assert cur.fetch_arrow_table().schema.names == ["id", "v"]
            cur.execute("ALTER TABLE t ADD COLUMN w BIGINT DEFAULT 5")
            cur.execute("SELECT * FROM t ORDER BY id")  # the same text: the schema cached for it is not reused
            assert cur.fetchall() == [(1, "a", 5), (2, "b", 5)]
            cur.execute("INSERT INTO t VALUES (3, 'c', 6)")
            cur.execute("ALTER TABLE t DROP COLUMN v")
            cur.execute("SELECT * FROM t ORDER BY id")
            assert cur.fetchall() == [(1, 5), (2, 5), (3, 6)]
            cur.execute("SELECT n FROM n")
            assert cur.fetchall() == [(3,)]
            with pytest.raises(flight_sql.ProgrammingError, match="table t has no column v"):
                cur.execute("ALTER TABLE t DROP COLUMN v")
    finally:
        assert server.stop() == 0, "".join(server.stderr)
