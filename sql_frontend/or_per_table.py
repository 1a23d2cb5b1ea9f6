"""Add, beside an OR in a WHERE, what it implies about each table alone.

If every branch of ``E = B1 OR ... OR Bn`` has conditions on table ``t``
alone (``Ti``, the AND of them), then ``X = T1 OR ... OR Tn`` is implied:
``E`` is ``E AND X``, in three-valued logic too. When ``E`` is TRUE some
``Bi`` is, so its ``Ti`` is and ``X`` is TRUE; when ``X`` is FALSE every
``Ti`` is, so every ``Bi`` is FALSE and so is ``E``; when ``E`` is NULL, ``X``
is not FALSE and ``E AND X`` is NULL. Adding ``X`` changes no result.

Why: a condition on one table is applied to that table's changes before they
are joined. TPC-H Q19 keeps lineitem-part pairs that pass one of three
branches, each mixing part's brand, container and size with lineitem's
quantity, ship mode and ship instruction. Without ``X`` a changed part looks
up every lineitem of that part (~30 per part at SF 10, each a few page faults
on a large table) to find that none passes; with it, the part's own
conditions drop it first.

>>> q = sqlglot.parse_one("SELECT 1 FROM t JOIN u ON t.k = u.k "
...                       "WHERE (t.a = 1 AND u.b = 2) OR (t.a = 3 AND u.b = 4 AND t.c > 0)")
>>> imply_per_table(q).sql()
'SELECT 1 FROM t JOIN u ON t.k = u.k WHERE ((t.a = 1 AND u.b = 2) OR (t.a = 3 AND u.b = 4 AND t.c > 0)) AND (t.a = 1 OR (t.a = 3 AND t.c > 0)) AND (u.b = 2 OR u.b = 4)'

Columns must be qualified (``resolve`` runs first). A condition counts for a
table when every column in it is that table's and it holds no subquery.
"""

from __future__ import annotations

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp

from sql_frontend.correlation import conjuncts, local_aliases
from sql_frontend.factor_or import disjuncts


def _table_of(condition: exp.Expression) -> str | None:
    """The one table alias every column of ``condition`` names (None: none, several, or a subquery)."""
    if condition.find(exp.Select, exp.Subquery, exp.Exists):
        return None
    tables = {c.table for c in condition.find_all(exp.Column)}
    return tables.pop() if len(tables) == 1 and "" not in tables else None


def _implied(disjunction: exp.Expression, aliases: set[str]) -> list[exp.Expression]:
    """For each of ``aliases`` that every branch conditions on alone: the OR of those conditions.

    Nothing when the OR already names one table only (it would be itself).
    """
    branches = [[(c, _table_of(c)) for c in conjuncts(d)] for d in disjuncts(disjunction)]
    implied = []
    for alias in sorted(aliases):
        own = [[c for c, table in branch if table == alias] for branch in branches]
        if not all(own) or all(len(o) == len(b) for o, b in zip(own, branches)):
            continue
        ors = [exp.and_(*[c.copy() for c in o]) for o in own]
        implied.append(exp.Paren(this=exp.or_(*ors)))
    return implied


def imply_per_table(query: exp.Expression) -> exp.Expression:
    """Every SELECT's WHERE gains, per top-level OR, the per-table conditions it implies (a new tree)."""
    query = query.copy()
    for select in list(query.find_all(exp.Select)):
        where = select.args.get("where")
        if where is None:
            continue
        aliases = local_aliases(select)
        terms = conjuncts(where.this)
        added = [x for t in terms if isinstance(t.unnest(), exp.Or) for x in _implied(t.unnest(), aliases)]
        if added:
            where.set("this", exp.and_(*[t.copy() for t in terms], *added))
    return query

