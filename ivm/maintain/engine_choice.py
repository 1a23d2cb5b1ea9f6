"""Which compute engine maintains a view for one step: DuckDB or Spark.

The setting comes from the view (``CREATE MATERIALIZED VIEW v WITH (engine =
'spark') AS ...``), else from the database (``SET ivm.engine = 'spark'``,
``ivm.connect(engine=...)``, ``ivm serve --engine``). ``duckdb`` and ``spark``
are taken as given. ``auto`` estimates the step's input size

    rows = rows of the changes the step folds in
         + rows of every stored relation the step reads in full (Program.scans)

(lookups are not counted: they cost in proportion to their probes on both
engines) and runs the step on Spark when ``rows >= SPARK_ROWS``. Below that,
one Spark job (tens to hundreds of milliseconds of fixed cost, plus shipping
the inputs) loses to DuckDB, which answers a small delta in milliseconds; at
tens of millions of rows the inputs no longer fit one process comfortably
and Spark's parallelism (and a cluster's memory) pays for its overhead.
"""

from __future__ import annotations

from delta_operators.program import Program
from sql_frontend.errors import UnsupportedError
from storage.store import Snapshot

ENGINES = ("auto", "duckdb", "spark")
SPARK_ROWS = 10_000_000


def check_engine(value: str, where: str = "engine") -> str:
    engine = str(value).strip().strip("'\"").lower()
    if engine not in ENGINES:
        raise UnsupportedError(f"{where} must be one of {', '.join(ENGINES)}; got {value!r}")
    return engine


def input_rows(program: Program, delta_rows: int, snapshot: Snapshot) -> int:
    return delta_rows + sum(snapshot[r].num_rows for r in program.scans if r in snapshot)


def choose(setting: str, program: Program, delta_rows: int, snapshot: Snapshot, threshold: int = SPARK_ROWS) -> str:
    """``duckdb`` or ``spark`` for one maintenance step under ``setting``."""
    if setting != "auto":
        return setting
    return "spark" if input_rows(program, delta_rows, snapshot) >= threshold else "duckdb"


def describe(setting: str, threshold: int = SPARK_ROWS) -> str:
    if setting == "auto":
        return f"auto (DuckDB below {threshold:,} rows of input per step, Spark from there)"
    return setting
