"""Text for people: aligned tables that fit a terminal, durations, sizes, times.

Used by ``ivm sql`` (query results) and ``ivm status`` (ivm/reads/status_text.py),
so both read the same way: numbers right-aligned, wide cells cut with ``…``,
durations as ``1.2 s``, sizes as ``12.3 MiB``, moments as ``3 s ago``.

>>> print("\\n".join(render(["name", "rows"], [["orders", 200], ["a much longer name than fits", 3]], width=24)))
name                rows
------------------  ----
orders               200
a much longer nam…     3
>>> duration(0.0123), duration(1.25), duration(75), duration(7300)
('12 ms', '1.2 s', '1 min 15 s', '2 h 1 min')
>>> size(512), size(12_900_000), size(None)
('512 B', '12.3 MiB', '')
>>> ago(1000.0, now=1003.2), ago(1000.0, now=1000.0 + 3 * 86400)
('3 s ago', '1970-01-01T00:16:40Z')
"""

from __future__ import annotations

import datetime
import numbers
from typing import Any, Sequence

ELLIPSIS = "…"
GAP = "  "  # between columns
MIN_COLUMN = 4  # a column shrunk to fit the width keeps at least this many characters


def cell(value: Any, null: str = "NULL") -> str:
    """One value as a single line of text: ``null`` for None, newlines and tabs as spaces."""
    if value is None:
        return null
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    return " ".join(str(value).split("\n")).replace("\t", " ")


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + ELLIPSIS


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int | None = None,
           max_cell: int = 40, right: Sequence[bool] | None = None, null: str = "NULL") -> list[str]:
    """Lines of an aligned table: a header, a rule, one line per row.

    Cells longer than ``max_cell`` are cut; with ``width``, the widest
    columns are cut further until a line fits (down to MIN_COLUMN each).
    Columns whose values are all numbers (or None) are right-aligned unless
    ``right`` says otherwise.
    """
    if right is None:
        right = [all(isinstance(row[i], numbers.Number) and not isinstance(row[i], bool) or row[i] is None
                     for row in rows) and any(row[i] is not None for row in rows) for i in range(len(columns))]
    texts = [[cell(v, null) for v in row] for row in rows]
    widths = [min(max([len(c)] + [len(r[i]) for r in texts]), max(max_cell, len(c)))
              for i, c in enumerate(columns)]
    if width is not None:
        while sum(widths) + len(GAP) * (len(widths) - 1) > width:
            widest = max(range(len(widths)), key=lambda i: widths[i])
            if widths[widest] <= MIN_COLUMN:
                break  # as narrow as it gets: let the terminal wrap
            widths[widest] -= 1

    def line(values: Sequence[str]) -> str:
        parts = [cut(v, w).rjust(w) if r else cut(v, w).ljust(w) for v, w, r in zip(values, widths, right)]
        return GAP.join(parts).rstrip()

    return [line(list(columns)), GAP.join("-" * w for w in widths)] + [line(r) for r in texts]


def duration(seconds: float | None) -> str:
    """``12 ms``, ``1.2 s``, ``1 min 15 s``, ``2 h 1 min``; empty for None."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def size(count: int | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.2 KiB``, ``12.3 MiB``; empty for None."""
    if count is None:
        return ""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def moment(epoch: float) -> str:
    """A UTC time in ISO 8601, to the second."""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(epoch: float | None, now: float) -> str:
    """``3 s ago`` within a day, else the ISO time; empty for None."""
    if epoch is None:
        return ""
    elapsed = now - epoch
    if -1 < elapsed < 60:
        return f"{max(int(elapsed), 0)} s ago"
    if elapsed < 86400:
        return f"{duration(elapsed)} ago"
    return moment(epoch)
