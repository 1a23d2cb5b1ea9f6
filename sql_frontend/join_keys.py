"""Equality keys of a semi/anti join, made comparable through an index.

Index lookups compare key codes, so both sides of a key must have types
whose equal values get equal codes: the same type, or two integer types.
Other pairs are cast to their common type when DuckDB has one for them
(``DECIMAL(15,2)`` and ``DECIMAL(12,2)``, ``DATE`` and ``TIMESTAMP``), and are
otherwise compared by the join's residual condition, with exactly the
engine's ``=`` (a string and a number, say).
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from sql_frontend.errors import BindError
from sql_frontend.plan import INTEGER_TYPES, LEFT, RIGHT, SPJ, Column
from sql_frontend.plan_sql import column
from sql_frontend.statements import DIALECT


def comparable(left_type: str, right_type: str) -> bool:
    """Equal values of the two types get equal key codes."""
    return left_type == right_type or (left_type in INTEGER_TYPES and right_type in INTEGER_TYPES)


def supertype(describe: Callable[[str], tuple[Column, ...]], a: str, b: str) -> str | None:
    """DuckDB's common type of ``a`` and ``b`` for comparison, if it is a safe one."""
    if (a == "VARCHAR") != (b == "VARCHAR"):
        return None  # strings compare with numbers by DuckDB's own cast rules: keep its ``=``
    try:
        listed = describe(f"SELECT [CAST(NULL AS {a}), CAST(NULL AS {b})] AS x")[0].type
    except BindError:
        return None
    return listed[:-2] if listed.endswith("[]") else None


def key_type(describe: Callable[[str], tuple[Column, ...]], a: str, b: str) -> str | None:
    """The type a key is looked up in (a side of another type is cast), or None: compare by residual."""
    return a if comparable(a, b) else supertype(describe, a, b)


def cast_outputs(node: SPJ, casts: dict[str, str]) -> SPJ:
    outputs = tuple(
        (name, exp.cast(e, exp.DataType.build(casts[name], dialect=DIALECT)) if name in casts else e)
        for name, e in node.outputs
    )
    return SPJ(node.inputs, node.predicate, outputs)


def align_keys(
    typed: Callable[[SPJ], SPJ],
    describe: Callable[[str], tuple[Column, ...]],
    left: SPJ,
    right: SPJ,
    names: list[str],
) -> tuple[SPJ, SPJ, tuple[tuple[str, str], ...], list[exp.Expression]]:
    """(left, right, key pairs, residual equalities) for key columns ``names`` on both sides."""
    left, right = typed(left), typed(right)
    left_types = {c.name: c.type for c in left.columns}
    right_types = {c.name: c.type for c in right.columns}
    keys: list[tuple[str, str]] = []
    residual: list[exp.Expression] = []
    left_casts: dict[str, str] = {}
    right_casts: dict[str, str] = {}
    for name in names:
        a, b = left_types[name], right_types[name]
        if comparable(a, b):
            keys.append((name, name))
            continue
        common = supertype(describe, a, b)
        if common is None:
            residual.append(exp.EQ(this=column(name, LEFT), expression=column(name, RIGHT)))
            continue
        if a != common:
            left_casts[name] = common
        if b != common:
            right_casts[name] = common
        keys.append((name, name))
    if left_casts:
        left = typed(cast_outputs(left, left_casts))
    if right_casts:
        right = typed(cast_outputs(right, right_casts))
    return left, right, tuple(keys), residual
