"""The names of a stream table's hidden relations: its on-time twin and its watermark.

A table with event time T has a twin ``__ontime_T`` holding the rows that were
on time when they arrived (views with ``late = 'drop'`` read it wherever
their SELECT names T), and a one-row relation ``__wm_T`` holding its
watermark (event_time.py says how both are kept). The names live here, below
the modules of this package, so that interval joins and window state can
name the twin without importing event_time.py, which imports them.
"""

from __future__ import annotations

ON_TIME_PREFIX = "__ontime_"
WATERMARK_PREFIX = "__wm_"


def on_time_name(table: str) -> str:
    return ON_TIME_PREFIX + table


def watermark_name(table: str) -> str:
    return WATERMARK_PREFIX + table
