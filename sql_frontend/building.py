"""What the planning rules see of the plan builder, as an interface.

``builder.Builder`` builds plan nodes and hands itself to the rules that plan
outer joins, subqueries, recursion, top-K and windows (outer_joins.py,
predicates.py, scalars.py, recursion.py, top_k.py, windows.py); they call
back into it. They name it by this Protocol, not by the class, so no rule
imports the builder that imports them (tests/test_import_circles.py).
"""

from __future__ import annotations

from typing import Protocol

from sqlglot import exp

from sql_frontend.plan import Column, Node


class CatalogReader(Protocol):
    """What the planner needs from the catalog."""

    def relation_columns(self, name: str) -> tuple[Column, ...]: ...

    def relation_kind(self, name: str) -> str: ...

    def relation_key(self, name: str) -> tuple[str, ...]: ...

    def relation_not_null(self, name: str) -> frozenset[str]: ...

    def relation_complete(self, name: str) -> bool: ...

    def schema(self) -> dict[str, dict[str, str]]: ...

    def describe(self, sql: str) -> tuple[Column, ...]: ...

    def aggregate_names(self) -> frozenset[str]: ...


class Building(Protocol):
    """The builder as the planning rules use it (builder.Builder implements it)."""

    catalog: CatalogReader
    bound: dict[str, Node]  # names planned as a node (recursive CTEs), see recursion.py
    recursions: dict[str, Node]

    def describe(self, sql: str) -> tuple[Column, ...]: ...

    def typed(self, node: Node) -> Node: ...

    def fresh(self, prefix: str) -> str: ...

    def query(self, q: exp.Expression) -> Node: ...

    def select(self, sel: exp.Select) -> Node: ...
