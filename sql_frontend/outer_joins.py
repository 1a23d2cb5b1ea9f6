"""LEFT, RIGHT and FULL OUTER JOIN as the inner join plus the unmatched rows.

    A ⟕ B  =  (A ⋈ B)  ⊎  pad_B(A ▷ B)
    A ⟖ B  =  (A ⋈ B)  ⊎  pad_A(B ▷ A)
    A ⟗ B  =  (A ⋈ B)  ⊎  pad_B(A ▷ B)  ⊎  pad_A(B ▷ A)

where ▷ is the anti join on the ON condition (a ``SemiJoin`` with
``anti=True``, which keeps per-key match counts of the other side, so a row
flips between matched and unmatched exactly when its count crosses zero) and
pad_X fills X's columns with NULLs. The ON condition is split first:

* ``a = b`` with one side over each input: join keys (index lookups);
* conditions over the other side only: filter it before the anti join;
* conditions over the preserved side only: a preserved row failing them can
  never match, so it is unmatched without looking (``P_f``);
* anything else: the anti join's residual condition.

Everything joined so far is the left side, so any number of tables works;
the result becomes one composite input whose columns are ``alias.column``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from sql_frontend.correlation import conjuncts
from sql_frontend.errors import UnsupportedError
from sql_frontend.join_keys import align_keys
from sql_frontend.plan import LEFT, RIGHT, SPJ, Node, SemiJoin, UnionAll
from sql_frontend.plan_sql import column
from sql_frontend.scope import FromClause, flat_name
from sql_frontend.statements import DIALECT

if TYPE_CHECKING:
    from sql_frontend.building import Building

SIDES = ("left", "right", "full")


def aliases_in(expression: exp.Expression) -> set[str]:
    return {c.table for c in expression.find_all(exp.Column) if c.table}


def typed_null(type_sql: str) -> exp.Expression:
    return exp.cast(exp.null(), exp.DataType.build(type_sql, dialect=DIALECT))


def outer_join(b: "Building", fc: FromClause, alias: str, node: Node, on: exp.Expression | None, side: str) -> None:
    """Join ``node`` (as ``alias``) to everything in ``fc`` with a ``side`` OUTER JOIN."""
    if on is not None and on.find(exp.Subquery, exp.Exists) is not None:
        raise UnsupportedError("a subquery in the ON condition of an OUTER JOIN is not supported in a materialized view")
    right = FromClause(needed=fc.needed)
    right.add(alias, node)
    conds = conjuncts(on)
    inner = SPJ(
        inputs=tuple(fc.inputs + right.inputs),
        predicate=_and(fc.conjuncts + [fc.map(c) for c in conds]),  # the right alias is never moved
        outputs=tuple(fc.flat_outputs() + right.flat_outputs()),
    )
    layout = b.typed(inner).columns
    parts: list[Node] = [inner]
    if side in ("left", "full"):
        parts.extend(_padded(part, layout) for part in unmatched(b, fc, right, conds))
    if side in ("right", "full"):
        parts.extend(_padded(part, layout) for part in unmatched(b, right, fc, conds))
    fc.absorb(right)
    fc.wrap(b.typed(UnionAll(tuple(parts))), b.fresh("__oj"))


def _and(parts: list[exp.Expression]) -> exp.Expression | None:
    return exp.and_(*parts) if parts else None


def _padded(node: Node, layout) -> SPJ:  # noqa: ANN001
    """``node``'s columns in the composite's layout, NULL where ``node`` has none."""
    have = set(node.column_names)
    outputs = tuple(
        (c.name, column(c.name, "__u") if c.name in have else typed_null(c.type)) for c in layout
    )
    return SPJ((("__u", node),), None, outputs)


def split_on(
    conds: list[exp.Expression], preserved: set[str], other: set[str]
) -> tuple[list, list, list[tuple[exp.Expression, exp.Expression]], list]:
    """(preserved-only, other-only, key pairs (preserved expr, other expr), residual)."""
    p_only, o_only, keys, residual = [], [], [], []
    for cond in conds:
        refs = aliases_in(cond)
        if refs and refs <= preserved:
            p_only.append(cond)
        elif refs <= other:
            o_only.append(cond)  # constants too: ON FALSE filters the other side to nothing
        elif isinstance(cond, exp.EQ) and _key(cond, preserved, other) is not None:
            keys.append(_key(cond, preserved, other))
        else:
            residual.append(cond)
    return p_only, o_only, keys, residual


def _key(cond: exp.EQ, preserved: set[str], other: set[str]) -> tuple[exp.Expression, exp.Expression] | None:
    for p, o in ((cond.this, cond.expression), (cond.expression, cond.this)):
        p_refs, o_refs = aliases_in(p), aliases_in(o)
        if p_refs and o_refs and p_refs <= preserved and o_refs <= other:
            return p, o
    return None


def unmatched(b: "Building", preserved: FromClause, other: FromClause, conds: list[exp.Expression]) -> list[Node]:
    """Nodes holding the rows of ``preserved`` that match no row of ``other``."""
    p_aliases, o_aliases = set(preserved.aliases), set(other.aliases)
    p_only, o_only, pairs, residual = split_on(conds, p_aliases, o_aliases)
    names = [f"__k{i}" for i in range(len(pairs))]
    residual_refs = {(c.table, c.name) for r in residual for c in r.find_all(exp.Column)}
    left = preserved.flatten(filters=p_only, extra=[(n, p) for n, (p, _) in zip(names, pairs)])
    right = other.flatten(
        filters=o_only, extra=[(n, o) for n, (_, o) in zip(names, pairs)], only=residual_refs
    )
    if not right.outputs:  # only whether a row exists matters
        right = SPJ(right.inputs, right.predicate, (("__one", exp.Literal.number(1)),))
    left, right, keys, equalities = align_keys(b.typed, b.describe, left, right, names)
    matcher = [_two_sided(r, p_aliases, o_aliases) for r in residual] + equalities
    origin = f"rows of {', '.join(preserved.aliases)} without a match in {', '.join(other.aliases)} (outer join)"
    anti = SemiJoin(left, right, keys, exp.and_(*matcher) if matcher else None, anti=True, origin=origin)
    parts: list[Node] = [b.typed(anti)]
    if p_only:
        never = exp.Not(this=exp.Coalesce(this=exp.Paren(this=exp.and_(*p_only)), expressions=[exp.false()]))
        parts.append(b.typed(preserved.flatten(filters=[never])))
    return parts


def _two_sided(expression: exp.Expression, left: set[str], right: set[str]) -> exp.Expression:
    """An ON condition over the anti join's inputs: ``__l."a.c"`` and ``__r."b.c"``."""

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table in left:
            return column(flat_name(node.table, node.name), LEFT)
        if isinstance(node, exp.Column) and node.table in right:
            return column(flat_name(node.table, node.name), RIGHT)
        return node

    return expression.copy().transform(swap)
