"""The FROM clause of one SELECT while it is being planned.

Expressions in the SELECT name columns as ``alias.column``. While the FROM
clause is plain inner joins, each alias is an input of the SPJ being built.
An outer join, a semi join or a NULL-aware anti join turns everything joined
so far into one composite node whose columns are named ``"alias.column"``;
the aliases then *live* in that node, and ``map`` rewrites references to
them. Only the columns the query reads are carried (``needed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from sql_frontend.errors import BindError
from sql_frontend.plan import SPJ, Column, Node
from sql_frontend.plan_sql import column


def flat_name(alias: str, name: str) -> str:
    """The name of ``alias.name`` as a column of a composite node."""
    return f"{alias}.{name}"


def needed_columns(select: exp.Expression) -> dict[str, set[str]]:
    """alias -> names of the columns the query reads through it (a superset)."""
    needed: dict[str, set[str]] = {}
    for col in select.find_all(exp.Column):
        if col.table:
            needed.setdefault(col.table, set()).add(col.name)
    return needed


@dataclass
class FromClause:
    needed: dict[str, set[str]]
    inputs: list[tuple[str, Node]] = field(default_factory=list)
    conjuncts: list[exp.Expression] = field(default_factory=list)  # over the inputs (mapped)
    columns: dict[str, tuple[Column, ...]] = field(default_factory=dict)  # alias -> all its columns
    homes: dict[str, str] = field(default_factory=dict)  # alias -> input holding its columns

    # --- building ----------------------------------------------------------
    def add(self, alias: str, node: Node) -> None:
        if alias in self.columns:
            raise BindError(f'table alias "{alias}" is used twice in one FROM clause')
        self.inputs.append((alias, node))
        self.columns[alias] = node.columns

    def absorb(self, other: "FromClause") -> None:
        """Take over the aliases of ``other`` (joined into this clause by the caller)."""
        for alias, cols in other.columns.items():
            if alias in self.columns:
                raise BindError(f'table alias "{alias}" is used twice in one FROM clause')
            self.columns[alias] = cols
        self.homes.update(other.homes)

    def wrap(self, node: Node, alias: str) -> None:
        """From now on every alias lives in ``node`` (columns named ``alias.column``)."""
        self.inputs = [(alias, node)]
        self.conjuncts = []
        self.homes = {a: alias for a in self.columns}

    # --- reading -----------------------------------------------------------
    @property
    def aliases(self) -> list[str]:
        return list(self.columns)

    def kept(self, alias: str) -> tuple[Column, ...]:
        """The columns of ``alias`` carried through composites."""
        wanted = self.needed.get(alias, set())
        return tuple(c for c in self.columns[alias] if c.name in wanted)

    def ref(self, alias: str, name: str) -> exp.Column:
        home = self.homes.get(alias)
        return column(flat_name(alias, name), home) if home else column(name, alias)

    def map(self, expression: exp.Expression) -> exp.Expression:
        """Rewrite ``alias.column`` references to where the columns live now."""
        if not self.homes:
            return expression.copy()

        def swap(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and node.table in self.homes:
                return self.ref(node.table, node.name)
            return node

        return expression.copy().transform(swap)

    def flat_outputs(self, only: set[tuple[str, str]] | None = None) -> list[tuple[str, exp.Expression]]:
        return [
            (flat_name(a, c.name), self.ref(a, c.name))
            for a in self.aliases
            for c in self.kept(a)
            if only is None or (a, c.name) in only
        ]

    def flatten(
        self,
        filters: list[exp.Expression] = (),  # type: ignore[assignment]
        extra: list[tuple[str, exp.Expression]] = (),  # type: ignore[assignment]
        only: set[tuple[str, str]] | None = None,
    ) -> SPJ:
        """One SPJ joining the inputs, with every kept column as ``alias.column``.

        ``filters`` are extra conditions in original alias terms; ``extra``
        outputs likewise; ``only`` restricts the flattened columns.
        """
        predicate = list(self.conjuncts) + [self.map(f) for f in filters]
        outputs = self.flat_outputs(only) + [(name, self.map(e)) for name, e in extra]
        return SPJ(
            inputs=tuple(self.inputs),
            predicate=exp.and_(*predicate) if predicate else None,
            outputs=tuple(outputs),
        )
