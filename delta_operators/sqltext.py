"""SQL written as text, for rules whose queries read better as SQL than as trees.

Text is parsed into a sqlglot tree at once, so programs hold trees as every
other rule's (rendered per dialect, inlined by the optimizer). Identifiers are
always quoted here; only standard SQL is written (window functions, GROUP BY,
IS NOT DISTINCT FROM), so the trees transpile.

>>> parse(f"SELECT {columns(['a', 'b'], 'x')} FROM {q('t')} AS {q('x')}").sql("duckdb")
'SELECT "x"."a", "x"."b" FROM "t" AS "x"'
"""

from __future__ import annotations

from typing import Iterable, Sequence

import sqlglot
from sqlglot import exp

from sql_frontend.plan import SortKey
from storage.zset import WEIGHT


def q(name: str) -> str:
    """A quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def columns(names: Iterable[str], table: str | None = None, as_names: bool = False) -> str:
    """``t.a, t.b`` (optionally ``t.a AS a``); empty text for no columns."""
    prefix = f"{q(table)}." if table else ""
    return ", ".join(f"{prefix}{q(n)}" + (f" AS {q(n)}" if as_names else "") for n in names)


def order_by(keys: Sequence[SortKey], table: str, reverse: bool = False) -> str:
    """ORDER BY items with explicit direction and NULL placement."""
    items = []
    for k in keys:
        desc = k.descending != reverse
        nulls_first = k.nulls_first != reverse
        items.append(f"{q(table)}.{q(k.column)} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nulls_first else 'LAST'}")
    return ", ".join(items)


def sorts_before_or_with(keys: Sequence[SortKey], left: str, right: str) -> str:
    """``left`` sorts before ``right`` or ties with it, by ``keys`` (lexicographic, NULL placement included)."""
    equal: list[str] = []
    alternatives = []
    for k in keys:
        a, b = f"{q(left)}.{q(k.column)}", f"{q(right)}.{q(k.column)}"
        op = ">" if k.descending else "<"
        null_first = f"({a} IS NULL AND {b} IS NOT NULL)" if k.nulls_first else f"({a} IS NOT NULL AND {b} IS NULL)"
        before = f"COALESCE({a} {op} {b}, FALSE) OR {null_first}"
        alternatives.append(" AND ".join(equal + [f"({before})"]))
        equal.append(f"{a} IS NOT DISTINCT FROM {b}")
    alternatives.append(" AND ".join(equal))
    return "(" + " OR ".join(f"({alt})" for alt in alternatives) + ")"


def same(names: Sequence[str], left: str, right: str) -> str:
    """NULL-safe equality of ``names`` between two tables (TRUE for none)."""
    if not names:
        return "TRUE"
    return " AND ".join(f"{q(left)}.{q(n)} IS NOT DISTINCT FROM {q(right)}.{q(n)}" for n in names)


def expand(source: str, names: Sequence[str], weight: str = WEIGHT) -> str:
    """FROM-less SELECT of ``names`` repeating each row of ``source`` ``weight`` times."""
    return (f"SELECT {columns(names, '__e')} FROM {q(source)} AS __e "
            f"CROSS JOIN UNNEST(GENERATE_SERIES(1, __e.{q(weight)})) AS __copies(__copy)")


def parse(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, dialect="duckdb")
