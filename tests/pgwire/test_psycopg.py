"""psycopg 3 over the PostgreSQL door: simple and extended protocol, prepared statements,
binary and text results for every ivm type, COPY in and out, SQLSTATEs, session parameters."""

from __future__ import annotations

import datetime
import decimal

import psycopg
import pytest

from tests.pgwire.conftest import connect

TYPES = ("CREATE TABLE ty (id BIGINT PRIMARY KEY, d DECIMAL(12,2), v VARCHAR, dt DATE, ts TIMESTAMP, "
         "tz TIMESTAMPTZ, iv INTERVAL, b BLOB, l INTEGER[], f REAL, g DOUBLE, s SMALLINT, i INTEGER, bo BOOLEAN)")
ROW = ("INSERT INTO ty VALUES (1, -12.34, 'x''y', DATE '2024-01-02', TIMESTAMP '2024-01-02 03:04:05.5', "
       "TIMESTAMPTZ '2024-01-02 03:04:05+00', INTERVAL '1 month 2 days 3 hours', '\\x01\\x02'::BLOB, [1, NULL, 3], "
       "0.5, 0.1, 3, 4, true), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
EXPECTED = (1, decimal.Decimal("-12.34"), "x'y", datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4, 5, 500000),
            datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
            datetime.timedelta(days=32, hours=3), b"\x01\x02", [1, None, 3], 0.5, 0.1, 3, 4, True)
HUGE = decimal.Decimal("123456789012345678901234567890")


@pytest.fixture(scope="module", autouse=True)
def tables(server):
    with connect(server) as conn:
        conn.execute(TYPES)
        conn.execute(ROW)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("prepare", [False, True], ids=["unprepared", "prepared"])
def test_every_type_round_trips(conn, binary, prepare):
    cur = conn.cursor(binary=binary)
    cur.execute("SELECT *, CAST(%s AS HUGEINT) AS h FROM ty WHERE id >= %s ORDER BY id", (str(HUGE), 1),
                prepare=prepare)
    first, second = cur.fetchall()
    assert first == EXPECTED + (HUGE,)
    assert second == (2,) + (None,) * 13 + (HUGE,)
    oids = [c.type_code for c in cur.description]
    assert oids == [20, 1700, 25, 1082, 1114, 1184, 1186, 17, 1007, 700, 701, 21, 23, 16, 1700]


def test_simple_protocol_runs_each_statement(conn):
    cur = psycopg.ClientCursor(conn)  # values interpolated by the client: one Query message
    cur.execute("SELECT v FROM ty WHERE id = %s; SELECT 2 AS two", (1,))
    assert cur.fetchall() == [("x'y",)]
    assert cur.nextset()
    assert cur.fetchall() == [(2,)]
    assert cur.nextset() is None


def test_parameters_are_values_not_sql(conn):
    cur = conn.cursor()
    evil = "x'); DROP TABLE ty; --"
    cur.execute("SELECT count(*) FROM ty WHERE v = %s", (evil,))
    assert cur.fetchone() == (0,)
    cur.execute("SELECT count(*) FROM ty")
    assert cur.fetchone() == (2,)


def test_dml_tags_and_offset_status(conn):
    conn.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v TEXT)")
    before = int(conn.info.parameter_status("ivm_offset"))
    cur = conn.execute("INSERT INTO kv VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
    assert cur.rowcount == 2 and cur.statusmessage == "INSERT 0 2"
    after = int(conn.info.parameter_status("ivm_offset"))
    assert after > before
    assert conn.execute("SHOW ivm_offset").fetchone() == (str(after),)
    cur = conn.execute("UPDATE kv SET v = 'c' WHERE k = 1")
    assert cur.statusmessage == "UPDATE 1"
    cur = conn.execute("DELETE FROM kv WHERE k >= %s", (1,))
    assert cur.statusmessage == "DELETE 2"
    cur = conn.execute("DROP TABLE kv")
    assert cur.statusmessage == "DROP TABLE"


def test_executemany_and_prepared_insert(conn):
    conn.execute("CREATE TABLE many (k BIGINT PRIMARY KEY, x DOUBLE)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO many VALUES (%s, %s)", [(i, i / 2) for i in range(20)])
        cur.execute("SELECT count(*), sum(x) FROM many")
        assert cur.fetchone() == (20, 95.0)


def test_copy_in_is_one_batch_and_copy_out(conn):
    conn.execute("CREATE TABLE cp (id BIGINT PRIMARY KEY, name TEXT, amount DECIMAL(10,2), day DATE)")
    offset = int(conn.info.parameter_status("ivm_offset"))
    cur = conn.cursor()
    with cur.copy("COPY cp (id, name, amount, day) FROM STDIN") as copy:
        copy.write_row((1, "tab\there", decimal.Decimal("1.50"), datetime.date(2024, 5, 6)))
        copy.write_row((2, None, None, None))
        copy.write_row((3, "back\\slash\nnewline", decimal.Decimal("-2"), datetime.date(2000, 1, 1)))
    assert cur.rowcount == 3
    assert int(conn.info.parameter_status("ivm_offset")) == offset + 1  # one change batch
    rows = conn.execute("SELECT * FROM cp ORDER BY id").fetchall()
    assert rows == [(1, "tab\there", decimal.Decimal("1.50"), datetime.date(2024, 5, 6)), (2, None, None, None),
                    (3, "back\\slash\nnewline", decimal.Decimal("-2.00"), datetime.date(2000, 1, 1))]
    with cur.copy("COPY (SELECT id, name FROM cp ORDER BY id) TO STDOUT") as copy:
        out = [row for row in copy.rows()]
    assert out == [("1", "tab\there"), ("2", None), ("3", "back\\slash\nnewline")]
    with cur.copy("COPY cp TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
        text = b"".join(bytes(chunk) for chunk in copy).decode()
    assert text.splitlines()[0] == "id,name,amount,day"
    assert "1,tab\there,1.50,2024-05-06" in text


def test_copy_with_op_column_and_csv(conn):
    conn.execute("CREATE TABLE cdc (id BIGINT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO cdc VALUES (1, 'a'), (2, 'b')")
    cur = conn.cursor()
    with cur.copy("COPY cdc (id, v, __op) FROM STDIN WITH (FORMAT csv)") as copy:
        copy.write(b'1,"A, changed",u\n2,,d\n3,"",c\n')
    assert conn.execute("SELECT * FROM cdc ORDER BY id").fetchall() == [(1, "A, changed"), (3, "")]


def test_copy_fail_applies_nothing(conn):
    conn.execute("CREATE TABLE cf (id BIGINT PRIMARY KEY)")
    cur = conn.cursor()
    with pytest.raises(RuntimeError):  # psycopg sends CopyFail, then raises the client's error
        with cur.copy("COPY cf FROM STDIN") as copy:
            copy.write_row((1,))
            raise RuntimeError("client gives up")
    with pytest.raises(psycopg.errors.UniqueViolation):  # a bad batch applies nothing either
        with cur.copy("COPY cf FROM STDIN") as copy:
            copy.write_row((5,))
            copy.write_row((5,))
    assert conn.execute("SELECT count(*) FROM cf").fetchone() == (0,)


def test_copy_refuses_an_unknown_option_by_name(conn):
    conn.execute("CREATE TABLE co (id BIGINT PRIMARY KEY)")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="unknown option 'force_quote' for COPY; valid "
                                                                  "options: format, header, delimiter, null, quote"):
        with conn.cursor().copy("COPY co FROM STDIN WITH (FORMAT csv, FORCE_QUOTE *)") as copy:
            copy.write_row((1,))
    assert conn.execute("SELECT count(*) FROM co").fetchone() == (0,)


@pytest.mark.parametrize("sql, state", [
    ("SELEC 1", "42601"),
    ("SELECT * FROM missing_table", "42P01"),
    ("SELECT nope FROM ty", "42703"),
    ("INSERT INTO ty (id) VALUES (1)", "23505"),
    ("CREATE TABLE nn (id BIGINT PRIMARY KEY, v TEXT NOT NULL)", None),
    ("INSERT INTO nn VALUES (1, NULL)", "23502"),
    ("SET TimeZone = 'Europe/Paris'", "0A000"),
    ("DECLARE c CURSOR FOR SELECT 1", "0A000"),
    ("SET no_such_parameter = 1", "42704"),
])
def test_errors_carry_their_sqlstate(conn, sql, state):
    if state is None:
        conn.execute(sql)
        return
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql)
    assert caught.value.sqlstate == state, caught.value
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on


def test_session_statements(conn):
    conn.execute("BEGIN")
    conn.execute("COMMIT")
    with conn.transaction():  # psycopg's own BEGIN/COMMIT
        conn.execute("SELECT 1")
    conn.execute("SET application_name = 'dash'")
    assert conn.info.parameter_status("application_name") == "dash"
    assert conn.execute("SHOW application_name").fetchone() == ("dash",)
    conn.execute("SET search_path TO public")
    assert conn.execute("SHOW search_path").fetchone() == ("public",)
    assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
    assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
    assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 15.0 (ivm")
    assert conn.execute("SELECT current_database()").fetchone() == ("ivm",)
    assert conn.execute("SELECT current_schema()").fetchone() == ("public",)  # as pg_catalog.pg_namespace says


def test_savepoints_are_accepted_and_undo_nothing(conn):
    conn.execute("CREATE TABLE sp (id BIGINT PRIMARY KEY)")
    with conn.transaction():
        with conn.transaction():  # inside a block, psycopg sends SAVEPOINT ... RELEASE SAVEPOINT
            conn.execute("INSERT INTO sp VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            with conn.transaction():  # ... and ROLLBACK TO SAVEPOINT after an error
                conn.execute("INSERT INTO sp VALUES (2)")
                conn.execute("INSERT INTO sp VALUES (1)")
    # every statement committed on its own: the rollback to the savepoint undid nothing
    assert conn.execute("SELECT id FROM sp ORDER BY id").fetchall() == [(1,), (2,)]
    for sql in ("SAVEPOINT", "RELEASE", "ROLLBACK TO"):  # without a name: not a savepoint statement
        with pytest.raises(psycopg.Error):
            conn.execute(sql)


def test_server_side_cursors_are_refused_clearly(conn):
    with conn.cursor(name="big_portal") as cur:  # psycopg's named cursor: DECLARE ... CURSOR
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            cur.execute("SELECT 1")


def test_empty_query(conn):
    cur = conn.cursor()
    cur.execute("-- nothing")
    assert cur.pgresult.status == psycopg.pq.ExecStatus.EMPTY_QUERY


def test_writes_on_either_door_are_visible_on_the_other(server, conn):
    import adbc_driver_flightsql.dbapi as flight_sql

    conn.execute("CREATE TABLE doors (k BIGINT PRIMARY KEY, door TEXT)")
    conn.execute("CREATE MATERIALIZED VIEW door_counts AS SELECT door, COUNT(*) AS n FROM doors GROUP BY door")
    with flight_sql.connect(server.uri, autocommit=True) as flight, flight.cursor() as cur:
        for k in range(5):
            conn.execute("INSERT INTO doors VALUES (%s, 'pg')", (2 * k,))
            cur.execute("SELECT n FROM door_counts WHERE door = 'pg'")  # Flight reads pgwire's write at once
            assert cur.fetchall() == [(k + 1,)]
            cur.execute(f"INSERT INTO doors VALUES ({2 * k + 1}, 'flight')")
            got = conn.execute("SELECT n FROM door_counts WHERE door = %s", ("flight",)).fetchall()
            assert got == [(k + 1,)]  # and pgwire reads Flight's


def test_show_materialized_views(conn):
    conn.execute("CREATE TABLE mv_src (k BIGINT PRIMARY KEY)")
    conn.execute("CREATE MATERIALIZED VIEW mv_count AS SELECT COUNT(*) AS n FROM mv_src")
    cur = conn.execute("SHOW MATERIALIZED VIEWS")
    assert cur.statusmessage.startswith("SHOW")
    names = {row[0]: row[1] for row in cur.fetchall()}
    assert names.get("mv_count") == "materialized view" and "mv_src" not in names


def test_show_create_materialized_view(conn):
    conn.execute("CREATE TABLE sc_src (k BIGINT PRIMARY KEY, v BIGINT)")
    conn.execute("CREATE MATERIALIZED VIEW sc_view AS SELECT v, COUNT(*) AS n FROM sc_src GROUP BY v")
    name, create = conn.execute("SHOW CREATE MATERIALIZED VIEW sc_view").fetchone()
    assert name == "sc_view" and create.startswith('CREATE MATERIALIZED VIEW "sc_view" AS SELECT')
    conn.execute("DROP MATERIALIZED VIEW sc_view")
    conn.execute(create)  # the statement creates the view again
    assert conn.execute("SELECT count(*) FROM sc_view").fetchone() == (0,)
    with pytest.raises(psycopg.Error):
        conn.execute("SHOW CREATE MATERIALIZED VIEW sc_src")
