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


def read_statements(path: Path) -> list[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def read_views(path: Path) -> list[ViewFixture]:
    views = []
    for block in re.split(r"^-- name:\s*", path.read_text(), flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        sql = "\n".join(l for l in body.splitlines() if not l.strip().startswith("--")).strip().rstrip(";")
        views.append(ViewFixture(name.strip(), sql.strip()))
    return views


def oracle_schema() -> list[str]:
    return read_statements(FIXTURES / "oracle_schema.sql")


def oracle_views(name: str = "") -> list[ViewFixture]:
    """The views of ``oracle_views.sql``, or of ``oracle_views_<name>.sql`` (all over one schema)."""
    return read_views(FIXTURES / (f"oracle_views_{name}.sql" if name else "oracle_views.sql"))


# Every catalogue of views over the oracle's schema (issue 2's core views, then issue 3's).
VIEW_SETS = ("", "joins", "setops", "subqueries")
