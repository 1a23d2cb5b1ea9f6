"""Debezium events -> table changes (ivm/cdc/debezium.py), from Python, the CLI and the Flight server.

Fixtures (tests/fixtures/debezium/): ops.jsonl has every row op (r, c, u with
and without before, a key change, d with a full and a key-only before) and
tombstones, bare; wrapped.jsonl is the same stream in the JSON converter's
schema/payload wrapper (timestamps in milliseconds, as its schema says), with
a null-payload tombstone; truncate.jsonl has a t; malformed/ holds one good
event followed by one bad one per file.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import ivm
from flight_server.process import ROOT, ServerProcess
from ivm.cdc import debezium

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
DDL = "CREATE TABLE customers (id BIGINT PRIMARY KEY, name VARCHAR, score DOUBLE, born DATE, seen TIMESTAMP)"
VIEW = "CREATE MATERIALIZED VIEW by_name AS SELECT name, SUM(score) AS total, COUNT(*) AS n FROM customers GROUP BY name"
Y2K = dt.datetime(2000, 1, 1)
# What ops.jsonl leaves: 1 updated, 2 moved to 20, 3 deleted, 4 inserted with NULLs then upserted, 5 in and out.
EXPECTED = [
    {"id": 1, "name": "ann2", "score": 10.0, "born": dt.date(2000, 1, 1), "seen": Y2K},
    {"id": 4, "name": "dee", "score": 4.5, "born": dt.date(2000, 1, 3), "seen": Y2K},
    {"id": 20, "name": "bob", "score": 2.5, "born": dt.date(2000, 1, 1), "seen": Y2K},
]
MALFORMED = {
    "not_json": "line 2: not valid JSON",
    "not_object": "line 2: an event must be a JSON object, not ARRAY",
    "no_op": "line 2: the event has no op",
    "unknown_op": "line 2: unknown op 'x'",
    "create_without_after": "line 2: a 'c' event needs an after object, not NULL",
    "delete_without_before": "line 2: a 'd' event needs a before object",
    "delete_without_key": "line 2: the 'd' event's before has no value for key column id",
    "unknown_field": "line 2: after has field 'nickname', which is not a column of customers",
    "missing_column": "line 2: after lacks column score of customers",
    "bad_value": "line 2: column score of customers is DOUBLE, and 'lots' cannot be converted",
    "backwards": "line 2: its position (sequence) is below the previous event's",
    "mixed_positions": "line 2: it has no source.sequence, which earlier events have",
}


def fresh(path=None) -> ivm.Database:
    db = ivm.connect(path)
    db.execute(DDL)
    db.execute(VIEW)
    return db


def rows(db: ivm.Database) -> list[dict]:
    return db.sql("SELECT * FROM customers ORDER BY id").to_pylist()


def check_view(db: ivm.Database) -> None:
    view = db.sql("SELECT * FROM by_name ORDER BY name").to_pylist()
    recomputed = db.sql("SELECT name, SUM(score) AS total, COUNT(*) AS n FROM customers GROUP BY name ORDER BY name")
    assert view == recomputed.to_pylist()


@pytest.mark.parametrize("fixture", ["ops.jsonl", "wrapped.jsonl"])
def test_every_op_and_both_envelopes(fixture):
    with fresh() as db:
        result = debezium.ingest_text(db, "customers", (FIXTURES / fixture).read_bytes())
        assert rows(db) == EXPECTED
        check_view(db)
        assert result.events == 10 and result.applied == 10 and result.skipped == 0
        assert result.tombstones == (2 if fixture == "ops.jsonl" else 1)
        assert len(result.offsets) == 1  # no truncate: one atomic batch


def test_truncate_deletes_what_came_before():
    with fresh() as db:
        db.execute("INSERT INTO customers VALUES (99, 'old', 1.0, NULL, NULL)")
        result = debezium.ingest_text(db, "customers", (FIXTURES / "truncate.jsonl").read_bytes())
        assert [r["id"] for r in rows(db)] == [7]
        check_view(db)
        assert len(result.offsets) == 3  # before the truncate, the truncate, after it


def test_redelivery_is_applied_once():
    text = (FIXTURES / "ops.jsonl").read_bytes()
    lines = text.splitlines(keepends=True)
    with fresh() as db:
        first = debezium.ingest_text(db, "customers", b"".join(lines[:5]))  # r, r, c, u, key change
        assert first.applied == 5
        again = debezium.ingest_text(db, "customers", text)  # the whole stream again, from the start
        assert (again.skipped, again.applied) == (5, 5)
        assert rows(db) == EXPECTED
        assert debezium.ingest_text(db, "customers", text).applied == 0
        assert rows(db) == EXPECTED
        check_view(db)


def test_snapshot_reads_sharing_a_position_are_reapplied_not_lost():
    """Debezium gives a whole snapshot one position: a delivery split inside it must not lose the rest."""
    lines = (FIXTURES / "ops.jsonl").read_bytes().splitlines(keepends=True)
    with fresh() as db:
        debezium.ingest_text(db, "customers", lines[0])  # the first snapshot read only
        result = debezium.ingest_text(db, "customers", b"".join(lines))
        assert result.skipped == 0  # both snapshot reads (same position) applied as upserts
        assert rows(db) == EXPECTED


def test_redelivery_after_a_restart(tmp_path):
    text = (FIXTURES / "wrapped.jsonl").read_bytes()
    with fresh(tmp_path / "db") as db:
        debezium.ingest_text(db, "customers", text)
    with ivm.connect(tmp_path / "db") as db:
        assert debezium.ingest_text(db, "customers", text).applied == 0
        assert rows(db) == EXPECTED
        check_view(db)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_event_is_rejected_and_nothing_applied(case):
    with fresh() as db:
        db.execute("INSERT INTO customers VALUES (99, 'old', 1.0, NULL, NULL)")
        before = rows(db), db.offset
        with pytest.raises(ivm.ChangeError) as caught:
            debezium.ingest_text(db, "customers", (FIXTURES / "malformed" / f"{case}.jsonl").read_bytes())
        assert str(caught.value) == str(caught.value).strip()
        assert MALFORMED[case].replace("line 2: ", "Debezium event at line 2: ") in str(caught.value)
        assert (rows(db), db.offset) == before


def test_unknown_table_changes_nothing():
    with fresh() as db:
        with pytest.raises(ivm.UnknownObjectError):
            debezium.ingest_text(db, "nope", (FIXTURES / "ops.jsonl").read_bytes())
        assert rows(db) == []


def test_keyless_table_update_is_delete_plus_insert():
    with ivm.connect() as db:
        db.execute("CREATE TABLE bag (a BIGINT, b VARCHAR)")
        events = [{"op": "c", "after": {"a": 1, "b": "x"}, "ts_ms": 1}, {"op": "c", "after": {"a": 1, "b": "x"}, "ts_ms": 2},
                  {"op": "u", "before": {"a": 1, "b": "x"}, "after": {"a": 1, "b": "y"}, "ts_ms": 3}]
        debezium.ingest_text(db, "bag", "\n".join(json.dumps(e) for e in events))
        assert sorted(db.sql("SELECT * FROM bag").to_pylist(), key=str) == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}]
        with pytest.raises(ivm.ChangeError, match="bag has no primary key, so a 'u' event needs the whole before"):
            debezium.ingest_text(db, "bag", json.dumps({"op": "u", "after": {"a": 1, "b": "z"}, "ts_ms": 4}))


def test_cli_from_file_and_stdin(tmp_path):
    data = tmp_path / "db"
    fresh(data).close()
    run = lambda *args, **kw: subprocess.run([sys.executable, "-m", "ivm", "ingest", "debezium", "--data", str(data),
                                              "--table", "customers", *args], cwd=ROOT, capture_output=True,
                                             text=True, timeout=120, **kw)
    done = run(str(FIXTURES / "ops.jsonl"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["applied"] == 10
    again = run("-", input=(FIXTURES / "wrapped.jsonl").read_text())  # same positions: nothing new
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] == 10
    bad = run(str(FIXTURES / "malformed" / "bad_value.jsonl"))
    assert bad.returncode == 1 and "line 2: column score of customers is DOUBLE" in bad.stderr
    with ivm.connect(data) as db:
        assert rows(db) == EXPECTED


def test_through_the_flight_server(tmp_path):
    with ServerProcess("--data", str(tmp_path / "db")) as server:
        client = fl.connect(server.uri)
        try:
            with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(DDL)
                cur.execute(VIEW)
            body = json.dumps({"table": "customers"}).encode() + b"\n" + (FIXTURES / "ops.jsonl").read_bytes()
            result = json.loads(next(iter(client.do_action(fl.Action("IngestDebezium", body)))).body.to_pybytes())
            assert result["applied"] == 10
            bad = json.dumps({"table": "customers"}).encode() + b"\n" + (FIXTURES / "malformed" / "no_op.jsonl").read_bytes()
            with pytest.raises(pa.ArrowInvalid, match="line 2: the event has no op"):
                list(client.do_action(fl.Action("IngestDebezium", bad)))
            with pytest.raises(pa.ArrowInvalid, match="the first line must be"):
                list(client.do_action(fl.Action("IngestDebezium", b"not a header\n")))
            table = client.do_get(fl.Ticket(json.dumps({"read": "customers"}).encode())).read_all()
            assert table.sort_by("id").to_pylist() == EXPECTED
        finally:
            client.close()
