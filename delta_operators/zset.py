"""Z-set SQL the compiler needs beyond ``storage.zset`` (which names the weight column and consolidates).

>>> not_distinct("l", "r", ["a", "b"]).sql("duckdb")
'"l"."a" IS NOT DISTINCT FROM "r"."a" AND "l"."b" IS NOT DISTINCT FROM "r"."b"'
"""

from __future__ import annotations

from typing import Sequence

from sqlglot import exp

from sql_frontend.plan_sql import column


def not_distinct(left: str, right: str, columns: Sequence[str]) -> exp.Expression:
    """NULL-safe equality of ``columns`` between two aliases (TRUE when none)."""
    if not columns:
        return exp.true()
    return exp.and_(
        *[
            exp.NullSafeEQ(this=column(c, left), expression=column(c, right))
            for c in columns
        ]
    )
