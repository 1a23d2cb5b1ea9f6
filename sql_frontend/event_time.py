"""Event-time clauses of CREATE TABLE: ``WATERMARK FOR … AS …`` and ``APPEND ONLY``.

sqlglot's DuckDB dialect parses neither, so they are cut out of the text
here (close to Flink and RisingWave), checked, and the rest goes to sqlglot:

>>> sql, spec = strip_stream_clauses(
...     "CREATE TABLE bids (auction BIGINT, ts TIMESTAMP, "
...     "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) APPEND ONLY")
>>> sql
'CREATE TABLE bids (auction BIGINT, ts TIMESTAMP)'
>>> spec
StreamSpec(append_only=True, event_time='ts', lateness_us=5000000, retain_us=None)

The watermark of a table is the largest event time it has seen minus the
lateness; it only moves forward. A watermark needs an append-only table
(a stream whose past can be retracted has no meaningful watermark).
``APPEND ONLY RETAIN INTERVAL '1' MINUTE`` bounds what the table keeps:
rows whose event time the watermark passed by more than that are dropped
(ivm/streams/event_time.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sql_frontend.errors import SqlSyntaxError

UNITS_US = {
    "microsecond": 1, "millisecond": 1_000, "second": 1_000_000, "minute": 60_000_000,
    "hour": 3_600_000_000, "day": 86_400_000_000,
}
_UNIT = r"(microsecond|millisecond|second|minute|hour|day)s?"
# INTERVAL '5' SECOND, INTERVAL '5 seconds', INTERVAL 5 SECOND
_INTERVAL = re.compile(r"INTERVAL\s+(?:'\s*(\d+)\s*'\s+" + _UNIT + r"|'\s*(\d+)\s+" + _UNIT + r"\s*'|(\d+)\s+"
                       + _UNIT + r")", re.IGNORECASE)
_IDENT = r'("[^"]+"|[A-Za-z_][A-Za-z0-9_]*)'
_WATERMARK = re.compile(r",\s*WATERMARK\b(\s+FOR\b.*?)(?=\)\s*(?:APPEND\b|;|$))", re.IGNORECASE | re.DOTALL)
_WATERMARK_BODY = re.compile(r"\s*FOR\s+" + _IDENT + r"\s+AS\s+" + _IDENT + r"(?:\s*-\s*(.+?))?\s*",
                             re.IGNORECASE | re.DOTALL)
_APPEND_ONLY = re.compile(r"\)\s*APPEND\s+ONLY(?:\s+RETAIN\s+(.+?))?\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_MENTIONS = re.compile(r"\b(WATERMARK\s+FOR|APPEND\s+ONLY)\b", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"\s*CREATE\s+TABLE\b", re.IGNORECASE)
WATERMARK_SYNTAX = "WATERMARK FOR <column> AS <column> - INTERVAL '<n>' <unit>"


@dataclass(frozen=True)
class StreamSpec:
    append_only: bool = False
    event_time: str | None = None  # the column the watermark is declared on
    lateness_us: int | None = None  # allowed lateness in microseconds
    retain_us: int | None = None  # RETAIN: rows the watermark passed by more than this are dropped


def interval_us(text: str) -> int:
    """Microseconds of an interval literal (units from microseconds to days).

    >>> interval_us("INTERVAL '1' MINUTE"), interval_us("INTERVAL '10 seconds'")
    (60000000, 10000000)
    """
    m = _INTERVAL.fullmatch(text.strip())
    if m is None:
        raise SqlSyntaxError(f"expected an interval such as INTERVAL '5' SECOND (units microsecond to day), "
                             f"got {text.strip()}")
    count, unit = next((m[i], m[i + 1]) for i in (1, 3, 5) if m[i] is not None)
    return int(count) * UNITS_US[unit.lower()]


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith('"') else name.lower()


def strip_stream_clauses(sql: str) -> tuple[str, StreamSpec | None]:
    """Cut WATERMARK and APPEND ONLY out of a CREATE TABLE; None when neither is there."""
    if not _CREATE_TABLE.match(sql) or not _MENTIONS.search(sql):
        return sql, None  # elsewhere the words are names (or sqlglot's syntax error)
    if ";" in sql.strip().rstrip(";"):
        raise SqlSyntaxError("a CREATE TABLE with WATERMARK or APPEND ONLY must be a statement of its own")
    text = sql.strip()
    append_only = False
    retain = None
    m = _APPEND_ONLY.search(text)
    if m is not None:
        append_only = True
        retain = None if m[1] is None else interval_us(m[1])
        text = text[:m.start()] + ")"
    elif re.search(r"\bAPPEND\s+ONLY\b", text, re.IGNORECASE):
        raise SqlSyntaxError("APPEND ONLY must end the CREATE TABLE statement: CREATE TABLE t (…) APPEND ONLY "
                         "[RETAIN INTERVAL '<n>' <unit>]")
    event_time = lateness = None
    w = _WATERMARK.search(text)
    if w is not None:
        event_time, lateness = _watermark(w[1])
        text = text[:w.start()] + text[w.end():]
        if not append_only:
            raise SqlSyntaxError("a WATERMARK needs an APPEND ONLY table: CREATE TABLE t (…, "
                                 f"{WATERMARK_SYNTAX}) APPEND ONLY")
    elif re.search(r"\bWATERMARK\s+FOR\b", text, re.IGNORECASE):
        raise SqlSyntaxError(f"the WATERMARK clause must come last in the column list: {WATERMARK_SYNTAX}")
    if retain is not None and event_time is None:
        raise SqlSyntaxError("RETAIN needs a WATERMARK: rows are dropped once the watermark passed them by that much")
    return text, StreamSpec(append_only, event_time, lateness, retain)


def _watermark(body: str) -> tuple[str, int]:
    m = _WATERMARK_BODY.fullmatch(body)
    if m is None:
        raise SqlSyntaxError(f"malformed WATERMARK clause {('WATERMARK' + body).strip()!r}: "
                             f"expected {WATERMARK_SYNTAX}")
    column, again, delay = _unquote(m[1]), _unquote(m[2]), m[3]
    if column != again:
        raise SqlSyntaxError(f"WATERMARK FOR {column} must subtract from the same column ({column} - INTERVAL …), "
                             f"not from {again}")
    return column, 0 if delay is None else interval_us(delay)
