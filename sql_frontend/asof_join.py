"""As-of enrichment: DuckDB's ``ASOF JOIN`` in a materialized view.

Contract (DuckDB's semantics): ``FROM e ASOF JOIN v ON e.k = v.k AND e.ts >= v.valid_from``
joins each row of ``e`` with the one row of ``v`` that has the same keys and
the largest ``valid_from`` at or before ``e.ts`` (rows of ``e`` with no such
version are left out). With ``>`` the version must be strictly before; with
``<=`` / ``<`` (``e.ts <= v.valid_from``) it is the smallest ``valid_from``
at or after ``e.ts``. So a versioned table of (key, valid_from, …) enriches
a stream with the version valid at each event's time: reprocessing the same
events and versions gives the same answer whatever order they came in.
Versions must be unique per (keys, valid_from) for the answer to be one row
per event (make them the table's PRIMARY KEY; DuckDB picks one of equal
versions arbitrarily, the view would keep all of them).

Rewrite (an ASOF join is a join with the versions it beats excluded):

    e ASOF JOIN v ON keys AND e.ts >= v.f
      =  e JOIN v ON keys AND e.ts >= v.f
         WHERE NOT EXISTS (SELECT 1 FROM v AS w WHERE keys[v := w] AND e.ts >= w.f AND w.f > v.f)

(``<`` instead of ``>`` in the last comparison for the ``<=`` / ``<`` forms.)
Both are ordinary operators the engine maintains incrementally: the join and
a correlated anti-join (delta_operators). Incremental rule, therefore: an
event looks up its key's versions and keeps the newest at or before it; a
new version looks up the events of its key at or after it that the version
it displaces matched, retracting those rows and adding the new ones.

Refused by name: ``ASOF LEFT JOIN`` (events without a version), an ON
without exactly one inequality between the two sides, unqualified columns.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.errors import UnsupportedError

SYNTAX = "FROM e ASOF JOIN v ON e.key = v.key AND e.ts >= v.valid_from"
FLIP = {exp.GTE: exp.LTE, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.LT: exp.GT}


def has_asof_joins(query: exp.Expression) -> bool:
    return any(_is_asof(j) for j in query.find_all(exp.Join))


def expand_asof_joins(query: exp.Expression) -> exp.Expression:
    """The query with every ASOF JOIN rewritten into a join and a NOT EXISTS (module docstring)."""
    if not has_asof_joins(query):
        return query
    query = query.copy()
    for number, join in enumerate([j for j in query.find_all(exp.Join) if _is_asof(j)]):
        select = join.parent
        if not isinstance(select, exp.Select):
            raise UnsupportedError(f"ASOF JOIN here is not supported; write it as {SYNTAX}")
        _rewrite(select, join, f"__asof_{number}")
    return query


def _is_asof(join: exp.Join) -> bool:
    return (join.args.get("method") or "").upper() == "ASOF" or (join.args.get("kind") or "").upper() == "ASOF"


def _rewrite(select: exp.Select, join: exp.Join, alias: str) -> None:
    if join.args.get("side"):
        raise UnsupportedError(f"ASOF {join.args['side'].upper()} JOIN is not supported; only the inner "
                               f"{SYNTAX} (events without a version are left out)")
    if any((j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in select.args.get("joins") or []):
        raise UnsupportedError("ASOF JOIN with a RIGHT or FULL JOIN in the same FROM is not supported")
    table = join.this
    if not isinstance(table, exp.Table):
        raise UnsupportedError(f"ASOF JOIN needs a table on its right side ({SYNTAX})")
    right = table.alias_or_name.lower()
    on = join.args.get("on")
    if on is None:
        raise UnsupportedError(f"ASOF JOIN needs ON with its keys and one inequality ({SYNTAX})")
    conjuncts = list(on.flatten()) if isinstance(on, exp.And) else [on]
    for column in on.find_all(exp.Column):
        if not column.table:
            raise UnsupportedError(f"ASOF JOIN: qualify column {column.name} in ON with its table ({SYNTAX})")
    inequalities = [c for c in conjuncts if isinstance(c, tuple(FLIP))]
    if len(inequalities) != 1:
        raise UnsupportedError(f"ASOF JOIN needs exactly one inequality (>=, >, <=, <) in ON, found "
                               f"{len(inequalities)} ({SYNTAX})")
    version = _version_column(inequalities[0], right)
    newest = isinstance(_oriented(inequalities[0], right), (exp.GTE, exp.GT))
    inner = [_renamed(c, right, alias) for c in conjuncts]
    beats = (exp.GT if newest else exp.LT)(this=exp.column(version, table=alias), expression=exp.column(version, table=right))
    copy = exp.Table(this=table.this.copy(), db=table.args.get("db"), catalog=table.args.get("catalog"),
                     alias=exp.TableAlias(this=exp.to_identifier(alias)))
    beaten = exp.select(exp.Literal.number(1)).from_(copy).where(exp.and_(*inner, beats))
    join.set("method", None)
    join.set("kind", None)
    select.where(exp.Not(this=exp.Exists(this=beaten)), copy=False)


def _oriented(comparison: exp.Expression, right: str) -> exp.Expression:
    """The comparison with the versions' column on its right (``e.ts >= v.f``)."""
    if _side(comparison.expression) == right and _side(comparison.this) not in (right, None):
        return comparison
    if _side(comparison.this) == right and _side(comparison.expression) not in (right, None):
        return FLIP[type(comparison)](this=comparison.expression, expression=comparison.this)
    raise UnsupportedError(f"ASOF JOIN's inequality must compare a column of the left side with a column "
                           f"of {right} ({SYNTAX}), got {comparison.sql('duckdb')}")


def _version_column(comparison: exp.Expression, right: str) -> str:
    column = _oriented(comparison, right).expression
    if not isinstance(column, exp.Column):
        raise UnsupportedError(f"ASOF JOIN's inequality must name a column of {right} ({SYNTAX})")
    return column.name


def _side(node: exp.Expression) -> str | None:
    """The one table alias ``node`` reads (None: none or several)."""
    tables = {c.table.lower() for c in node.find_all(exp.Column)}
    return tables.pop() if len(tables) == 1 else None


def _renamed(node: exp.Expression, old: str, new: str) -> exp.Expression:
    node = node.copy()
    for column in node.find_all(exp.Column):
        if column.table.lower() == old:
            column.set("table", exp.to_identifier(new))
    return node
