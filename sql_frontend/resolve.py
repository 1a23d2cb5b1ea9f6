"""Resolve names in a view body against the catalog.

Three small rules, run in order (sqlglot-style):

1. ``check_relations``: every table a query reads exists in the catalog.
2. ``qualify``: sqlglot's qualifier expands ``*``, qualifies every column
   with its table alias and aliases every projection.
3. ``inline_ctes``: each reference to a CTE becomes a derived table, so the
   planner sees only tables and subqueries.

>>> tree = sqlglot.parse_one("WITH x AS (SELECT a FROM t) SELECT a FROM x", dialect="duckdb")
>>> resolve(tree, {"t": {"a": "INT"}}).sql("duckdb")
'SELECT "x"."a" AS "a" FROM (SELECT "t"."a" AS "a" FROM "t" AS "t") AS "x"'
"""

from __future__ import annotations

from typing import Mapping

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify as sqlglot_qualify
from sqlglot.schema import MappingSchema

from sql_frontend.errors import BindError, UnknownObjectError
from sql_frontend.statements import DIALECT, normalize_name

Schema = Mapping[str, Mapping[str, str]]  # relation -> column -> DuckDB type


def resolve(query: exp.Expression, schema: Schema) -> exp.Expression:
    """Run the resolution rules over a copy of ``query``."""
    check_relations(query, schema)
    qualified = qualify(query, schema)
    return inline_ctes(qualified)


def referenced_relations(query: exp.Expression) -> list[str]:
    """Names of catalog relations a query reads (CTE names excluded)."""
    names: list[str] = []
    for table in query.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue
        name = normalize_name(table.this)
        if _is_cte_reference(table, name) or name in names:
            continue
        names.append(name)
    return names


def check_relations(query: exp.Expression, schema: Schema) -> None:
    for table in query.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue
        if table.args.get("db") or table.args.get("catalog"):
            raise UnknownObjectError(
                f"relation {table.sql(DIALECT)} does not exist (schema-qualified names are not supported)"
            )
        name = normalize_name(table.this)
        if name not in schema and not _is_cte_reference(table, name):
            raise UnknownObjectError(f"table or view {name} does not exist")


def _is_cte_reference(table: exp.Table, name: str) -> bool:
    scope: exp.Expression | None = table
    while scope is not None:
        with_ = scope.args.get("with_") or scope.args.get("with")
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                if normalize_name(cte.alias) == name and (
                    with_.args.get("recursive") or table.find_ancestor(exp.CTE) is not cte
                ):
                    return True
        scope = scope.parent
    return False


def qualify(query: exp.Expression, schema: Schema) -> exp.Expression:
    mapping = MappingSchema(
        {name: dict(columns) for name, columns in schema.items()}, dialect=DIALECT
    )
    try:
        return sqlglot_qualify(
            query.copy(),
            schema=mapping,
            dialect=DIALECT,
            validate_qualify_columns=True,
            quote_identifiers=True,
            identify=True,
        )
    except OptimizeError as e:
        raise BindError(str(e).splitlines()[0]) from None


def inline_ctes(query: exp.Expression) -> exp.Expression:
    """Replace every CTE reference by a derived table holding the CTE's body."""

    def visit(node: exp.Expression, ctes: dict[str, exp.Expression]) -> exp.Expression:
        with_ = node.args.get("with_") or node.args.get("with")
        if isinstance(with_, exp.With):
            ctes = dict(ctes)
            for cte in with_.expressions:
                # A CTE may read earlier CTEs of the same WITH.
                name = normalize_name(cte.alias)
                body = visit(cte.this, ctes)
                if with_.args.get("recursive") and _reads(body, name):
                    body = recursive_query(cte, body)
                ctes[name] = body
            node.set("with_" if "with_" in node.args else "with", None)
        for child in list(node.iter_expressions()):
            if isinstance(child, exp.Table) and isinstance(child.this, exp.Identifier):
                name = normalize_name(child.this)
                if name in ctes and not child.args.get("db"):
                    alias = child.alias or name
                    child.replace(
                        exp.Subquery(
                            this=ctes[name].copy(),
                            alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
                        )
                    )
                    continue
            visit(child, ctes)
        return node

    return visit(query, {})


def _reads(query: exp.Expression, name: str) -> bool:
    return any(
        isinstance(t.this, exp.Identifier) and normalize_name(t.this) == name for t in query.find_all(exp.Table)
    )


def recursive_query(cte: exp.CTE, body: exp.Expression) -> exp.Select:
    """A recursive CTE as a self-contained query: ``WITH RECURSIVE name AS (body) SELECT * FROM name``.

    Inlined like any CTE; the planner turns it into one Recursive node.
    """
    alias = cte.args["alias"].copy()
    first = body
    while isinstance(first, exp.SetOperation):
        first = first.this
    names = [c.name for c in alias.columns] or [p.alias_or_name for p in first.expressions]
    if not alias.columns:
        alias.set("columns", [exp.to_identifier(n, quoted=True) for n in names])
    ref = alias.this.copy()
    select = exp.select(
        *[exp.alias_(exp.column(n, ref.name, quoted=True), n, quoted=True) for n in names]
    ).from_(exp.Table(this=ref, alias=exp.TableAlias(this=ref.copy())))
    select.set("with_", exp.With(expressions=[exp.CTE(this=body, alias=alias)], recursive=True))
    return select
