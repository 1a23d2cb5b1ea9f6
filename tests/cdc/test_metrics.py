"""A PostgreSQL source's lag and progress on ``ivm serve --metrics-port``, scraped over HTTP."""

from __future__ import annotations

import json
import time

import adbc_driver_flightsql.dbapi as flight_sql

from tests.cdc import workload as w
from tests.flight.server import ServerProcess
from tests.flight.test_metrics import scrape, value


def sources(cur) -> dict[str, dict]:
    """SHOW STATUS's sources (its database-wide facts are in the schema metadata)."""
    cur.execute("SHOW STATUS")
    facts = json.loads(cur.fetch_arrow_table().schema.metadata[b"ivm.status"])
    return {source["name"]: source for source in facts["sources"]}


def test_source_lag_and_rows_match_show_status(upstream, tmp_path):
    slot = "ivm_" + upstream.rsplit("dbname=", 1)[1]
    with ServerProcess("--data", str(tmp_path / "db"), "--metrics-port", "0") as server, \
            flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        _, before = scrape(server.metrics_url)
        assert not [key for key in before if key[0] == "ivm_source_lag_bytes"]  # no source yet
        cur.execute(f"CREATE SOURCE shop FROM POSTGRES CONNECTION '{upstream}' PUBLICATION 'shop' SLOT '{slot}'")
        deadline = time.monotonic() + 60
        while sources(cur).get("shop", {}).get("phase") != "streaming":
            assert time.monotonic() < deadline, sources(cur)
            time.sleep(0.1)
        load = w.Workload(upstream, seed=5)
        try:
            for _ in range(10):
                load.transaction()
            w.wait_applied(lambda: sources(cur).get("shop"), load.mark())
        finally:
            load.close()
        time.sleep(0.6)  # the source writes its progress every 0.5 s: let the last one land
        status = sources(cur)["shop"]
        _, after = scrape(server.metrics_url)

    assert value(after, "ivm_source_phase", source="shop", phase="streaming") == 1
    assert value(after, "ivm_source_failed", source="shop") == 0
    assert value(after, "ivm_source_rows_total", source="shop") == status["rows"] > 0
    assert value(after, "ivm_source_transactions_total", source="shop") == status["transactions"] > 0
    assert value(after, "ivm_source_lag_bytes", source="shop") == status["lag_bytes"]
    assert value(after, "ivm_source_lag_seconds", source="shop") == status["lag_seconds"]
    # the source's batches are the tables' ingested batches
    assert value(after, "ivm_ingested_rows_total", table="orders") > 0
