"""A second, independent batch definition of SESSION windows, for the oracle.

The engine's own batch SQL (sql_frontend/session_windows.py:islands_sql)
numbers sessions with LAG and a running SUM. The reference here states the
definition directly instead: an event starts a session when no event of its
key lies less than ``gap`` before it; an event's ``window_start`` is the
latest start of its key at or before it; ``window_end`` is the last event of
that session plus ``gap``. Both are evaluated by DuckDB over the same events.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from sql_frontend.event_time import interval_us
from sql_frontend.statements import parse_query
from sql_frontend.time_windows import expand_time_windows


def reference_sql(sql: str, schema) -> str:
    """``sql`` with each SESSION call replaced by the reference definition (TUMBLE/HOP as the planner does)."""
    query = parse_query(sql).copy()
    for table in list(query.find_all(exp.Table)):
        if isinstance(table.this, exp.Anonymous) and table.this.name.upper() == "SESSION":
            table.replace(_reference(table, schema))
    return expand_time_windows(query, schema).sql("duckdb")


def _reference(call: exp.Table, schema) -> exp.Expression:
    args = call.this.expressions
    source, time = args[0].name.lower(), args[1].name.lower()
    gap = f"TO_MICROSECONDS({interval_us(args[2].sql('duckdb'))})"
    keys = [a.name.lower() for a in args[3:]]
    same = " AND ".join(f"p.{k} IS NOT DISTINCT FROM e.{k}" for k in keys) or "TRUE"
    same_s = " AND ".join(f"s.{k} IS NOT DISTINCT FROM e.{k}" for k in keys) or "TRUE"
    cols = ", ".join(f"e.{c}" for c in schema[source])
    by = ", ".join(keys + ["window_start"])
    text = f"""
        SELECT *, MAX({time}) OVER (PARTITION BY {by}) + {gap} AS window_end
        FROM (SELECT {cols},
                     (SELECT MAX(s.{time}) FROM starts AS s WHERE {same_s} AND s.{time} <= e.{time}) AS window_start
              FROM {source} AS e WHERE e.{time} IS NOT NULL) AS w"""
    starts = f"""
        SELECT e.* FROM {source} AS e WHERE e.{time} IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM {source} AS p WHERE {same} AND p.{time} < e.{time} AND p.{time} > e.{time} - {gap})"""
    body = sqlglot.parse_one(f"WITH starts AS ({starts}) {text}", read="duckdb")
    return exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(call.alias or source)))
