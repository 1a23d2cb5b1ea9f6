"""``ivm status`` text (ivm/reads/status_text.py): 80 columns whatever the names and messages."""

from __future__ import annotations

import re

import ivm
from ivm.reads.status_text import status_lines

NOW = 1_700_000_000.0


def test_long_names_failures_and_sources_fit_80_columns():
    with ivm.connect() as db:
        db.execute("CREATE TABLE a_table_whose_name_is_longer_than_any_column_could_hold (id BIGINT PRIMARY KEY, "
                   "v DOUBLE)")
        db.execute("INSERT INTO a_table_whose_name_is_longer_than_any_column_could_hold VALUES (1, 2.0)")
        db.execute("CREATE MATERIALIZED VIEW total AS SELECT SUM(v) AS s "
                   "FROM a_table_whose_name_is_longer_than_any_column_could_hold")
        facts = db.status()
    facts["sources"] = [{
        "name": "upstream", "kind": "postgres", "phase": "streaming", "confirmed_lsn": "0/1A2B3C4",
        "lag_bytes": 5 * 1024 * 1024 + 300 * 1024, "lag_seconds": 1.25, "rows": 1234, "updated": NOW - 3,
        "status": "failed: " + "could not receive data from the server: connection reset by peer " * 3}]
    lines = status_lines(facts, now=NOW)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, text
    assert "{" not in text and not re.search(r"\d{9,}\.\d", text)
    [source] = [line for line in lines if line.startswith("upstream ")]
    assert source.split()[:3] == ["upstream", "streaming", "0/1A2B3C4"]
    assert "5.3 MiB, 1.2 s" in source and "3 s ago" in source and source.endswith("FAILED")
    failure = text[text.index("source failed: upstream: "):]
    assert " ".join(failure.split()).count("connection reset by peer") == 3  # the whole message, wrapped
    [table] = [line for line in lines if line.startswith("a_table_whose")]
    assert "…" in table and table.split()[1:3] == ["table", "1"]
    assert any(line.startswith("total ") and " view " in line for line in lines)
    assert lines[0] == "database     in memory"


def test_only_sources_when_the_database_is_open_elsewhere():
    assert status_lines({"sources": []}) == ["no sources (CREATE SOURCE, ivm replicate)"]


def test_an_empty_database_says_so():
    with ivm.connect() as db:
        lines = status_lines(db.status())
    assert "no tables or views yet" in lines and lines[0] == "database     in memory"
