"""Issue 27, operating sources (see the module docstring as it grows): a source's snapshot, against a real
PostgreSQL (tests/cdc/pg_server.py), with test_source_failures.py's upstream (publication p of x1 and x2).
"""

from __future__ import annotations

import ivm
from tests.cdc.test_source_failures import create_source, items, rows, upstream

__all__ = ["items"]  # the fixture, used by name


def test_the_snapshot_keeps_text_that_spells_null_in_other_tools(items, tmp_path):
    """Only PostgreSQL's NULL is NULL: 'NA', 'null', 'NaN', 'N/A' and '' are text (Arrow's CSV reader reads them
    as NULL unless told otherwise)."""
    upstream(items, "INSERT INTO x2 VALUES (11, 'NA'), (12, 'null'), (13, 'NaN'), (14, 'N/A'), (15, ''), (16, NULL)")
    with ivm.connect(tmp_path / "db") as db:
        db.execute(create_source(items))
        assert rows(db, "x2")[10:] == [(11, "NA"), (12, "null"), (13, "NaN"), (14, "N/A"), (15, ""), (16, None)]
