"""Read the oracle's fixture files (schema and named views)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class ViewFixture:
    name: str
    sql: str
    # Tie-aware comparison (ORDER BY ties make the chosen rows ambiguous), from
    # "-- ties: keys=a,b [ranks=rn]" and "-- candidates: <SELECT>" lines:
    ties: tuple[str, ...] = ()  # columns whose multiset is determined (sort keys, ranks)
    ranks: tuple[str, ...] = ()  # columns whose values depend on how ties were broken
    candidates: str | None = None  # the rows the view may choose from (default: no LIMIT/OFFSET)


def read_statements(path: Path) -> list[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def read_views(path: Path) -> list[ViewFixture]:
    views = []
    for block in re.split(r"^-- name:\s*", path.read_text(), flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        sql = "\n".join(l for l in body.splitlines() if not l.strip().startswith("--")).strip().rstrip(";")
        views.append(ViewFixture(name.strip(), sql.strip(), **_annotations(body)))
    return views


def _annotations(body: str) -> dict:
    found: dict = {}
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("-- ties:"):
            for item in line[len("-- ties:"):].split():
                key, _, value = item.partition("=")
                found["ties" if key == "keys" else key] = tuple(v for v in value.split(",") if v)
        elif line.startswith("-- candidates:"):
            found["candidates"] = line[len("-- candidates:"):].strip().rstrip(";")
    return found


def read_fixture_views(name: str) -> list[ViewFixture]:
    """Views of another fixture file of the oracle (e.g. ``oracle_views_windows.sql``)."""
    return read_views(FIXTURES / name)


def oracle_schema() -> list[str]:
    return read_statements(FIXTURES / "oracle_schema.sql")


def oracle_views(name: str = "") -> list[ViewFixture]:
    """The views of ``oracle_views.sql``, or of ``oracle_views_<name>.sql`` (all over one schema)."""
    return read_views(FIXTURES / (f"oracle_views_{name}.sql" if name else "oracle_views.sql"))


def half_of(views: list[ViewFixture], half: int) -> list[ViewFixture]:
    """Every other view (``half`` 0 or 1), plus the views those read, in catalogue order.

    Two halves of a catalogue run as two tests that two xdist workers share.
    A view over another view needs that one created first, so a half keeps
    what its views name (transitively); together the halves cover every view.
    """
    chosen = {view.name for view in views[half::2]}
    by_name = {view.name: view for view in views}
    pending = list(chosen)
    while pending:
        sql = by_name[pending.pop()].sql
        for other in by_name:
            if other not in chosen and re.search(rf"\b{re.escape(other)}\b", sql, flags=re.I):
                chosen.add(other)
                pending.append(other)
    return [view for view in views if view.name in chosen]


# Every catalogue of views over the oracle's schema (issue 2's core views, then issue 3's).
VIEW_SETS = ("", "joins", "setops", "subqueries")
# Window, top-K and recursive views (their own tests: test_oracle_ordered, test_oracle_recursive).
ORDERED_SETS = ("windows", "topk", "recursive")
