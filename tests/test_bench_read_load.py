"""``python -m bench.read_load`` as CI's smoke test of reads under write load (10 s): a durable server,
16 readers and 2 writers at once; no read or write fails and read-your-writes holds. The latencies
are for the report, not asserted here (speed lives in benchmarks)."""

from __future__ import annotations

import pytest

from bench import read_load


@pytest.mark.slow
def test_reads_under_write_load_fail_nothing_and_read_your_writes_holds():
    result = read_load.run(seconds=10, readers=16, writers=2, rows=20_000, batch=1_000)
    assert result["errors"] == []
    assert result["checks"] > 0  # read-your-writes checked at least once, and every check held
    assert result["point"]["n"] > 0 and result["scan"]["n"] > 0
    assert result["written_rows"] >= 1_000 and result["ack"]["n"] == result["written_rows"] // 1_000
    text = read_load.report(result, "python -m bench.read_load --seconds 10")
    assert "Errors: 0." in text and f"{result['checks']:,} checks" in text
