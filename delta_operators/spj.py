"""Select-project-join: filters, projections and inner joins of any arity.

Contract: the node's output is ``SELECT outputs FROM X1, …, Xn WHERE predicate``
with each output row weighted by the product of its input rows' weights.

Incremental rule (the product rule, telescoped over n inputs):

    δ(σπ(X1 × … × Xn)) = Σ_i  σπ(X1' × … × X(i-1)' × δXi × X(i+1) × … × Xn)

where X' is the input after this step's change and X before it; only inputs
that changed contribute a term. With one input this is just σπ(δX): filters
and projections are linear.

Each term is evaluated as a lookup pipeline starting from the small δXi: the
next input joined is one reachable by an equality on a plain column, and its
matching rows are fetched through an index on that column instead of being
scanned, so a term costs work in proportion to the rows it touches. Inputs
with no usable equality are scanned and joined by the engine, except a
column compared with a global aggregate's change: only the rows between the
old and the new value can remain (``_between_old_and_new``), and those are
read by a range lookup over that column instead of a scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from sql_frontend.plan import INTEGER_TYPES, SPJ, Node, is_number_type
from sql_frontend.plan_sql import alias, column, quoted, subquery, table
from delta_operators.program import StateSpec
from delta_operators.rule import NEW, OLD, Context, Rule, rule_for
from delta_operators.sqltree import empty_select, select_columns, union_all
from storage.zset import WEIGHT, consolidate_sql



def lookup_compatible(probe_type: str, key_type: str) -> bool:
    """True when casting a probe value to the key's type finds every equal key.

    Equal types always do; among integer types an equal value survives the
    cast and a value out of range equals no key. Anything else (strings that
    compare equal to numbers, decimals of other scales…) is joined by scan.
    """
    return probe_type == key_type or (probe_type in INTEGER_TYPES and key_type in INTEGER_TYPES)


@dataclass
class Conjunct:
    expression: exp.Expression
    aliases: frozenset[str]


def split_conjuncts(predicate: exp.Expression | None) -> list[exp.Expression]:
    if predicate is None:
        return []
    if isinstance(predicate, exp.Paren):
        return split_conjuncts(predicate.this)
    if isinstance(predicate, exp.And):
        return split_conjuncts(predicate.this) + split_conjuncts(predicate.expression)
    return [predicate]


def aliases_of(expression: exp.Expression) -> frozenset[str]:
    return frozenset(c.table for c in expression.find_all(exp.Column))


@dataclass
class Segment:
    """FROM items of the SELECT being built for one stretch of a pipeline.

    Each item provides some plan aliases; a plan column ``alias.col`` is read
    either straight from the item (``alias``.``col``) or, after a stretch was
    materialized, from the temp's flattened column ``"alias.col"``.
    """

    items: list[tuple[str, exp.Expression]] = field(default_factory=list)
    where: dict[str, tuple[str, bool]] = field(default_factory=dict)  # plan alias -> (sql alias, flattened)

    def add(self, plan_alias: str, source: exp.Expression, sql_alias: str | None = None, flattened: bool = False) -> None:
        name = sql_alias or plan_alias
        if not any(n == name for n, _ in self.items):
            self.items.append((name, source))
        self.where[plan_alias] = (name, flattened)

    def probe_source(self, plan_alias: str, col: str) -> tuple[str, str] | None:
        """(temp, column) holding ``alias.col`` as plain Arrow data, if any."""
        name, flattened = self.where[plan_alias]
        source = dict(self.items)[name]
        if not isinstance(source, exp.Table):
            return None  # a scan subquery: not materialized
        return source.name, f"{plan_alias}.{col}" if flattened else col

    def ref(self, plan_alias: str, col: str) -> exp.Column:
        name, flattened = self.where[plan_alias]
        return column(f"{plan_alias}.{col}" if flattened else col, name)

    def map(self, expression: exp.Expression) -> exp.Expression:
        def swap(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and node.table in self.where:
                return self.ref(node.table, node.name)
            return node

        return expression.copy().transform(swap)

    def weight(self) -> exp.Expression:
        factors = [column(WEIGHT, name) for name, _ in self.items]
        product = factors[0]
        for f in factors[1:]:
            product = exp.Mul(this=product, expression=f)
        return product

    def select(self, projections: list[exp.Expression], conjuncts: list[exp.Expression]) -> exp.Select:
        sel = exp.select(*projections)
        for i, (name, source) in enumerate(self.items):
            src = source.copy()
            if isinstance(src, exp.Table):
                src.set("alias", exp.TableAlias(this=quoted(name)))
            sel = sel.from_(src) if i == 0 else sel.join(src, join_type="cross")
        if conjuncts:
            sel = sel.where(exp.and_(*[self.map(c) for c in conjuncts]))
        return sel


def temp_table(name: str) -> exp.Table:
    return exp.Table(this=quoted(name))


@dataclass(frozen=True)
class Range:
    """What ``SPJRule._between_old_and_new`` finds: the filter, and the column it ranges when plain."""

    condition: exp.Expression
    value: str  # the global aggregate's column in its change (or COMPARED, with ``expression``)
    value_type: str
    alias: str | None = None  # the input whose column the value is compared with, when a plain column
    column: str | None = None
    # The compared value when it is an expression of the change's columns (TPC-H q11's SUM(...) *
    # 0.0001), over the change as "__v": a range read first computes it per row (None: ``value``).
    expression: exp.Expression | None = None


COMPARED = "__compared"  # the column of the compared values a range read probes with (Range.expression)
# Expressions a compared value may be made of, over the change's number columns: each row's value is
# a function of that row alone, so the -old/+new cancellation of ``_between_old_and_new`` holds.
_ARITHMETIC = (exp.Column, exp.Literal, exp.Paren, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Cast,
               exp.DataType, exp.Identifier)


@rule_for(SPJ)
class SPJRule(Rule):
    """δ(σπ(X1 × … × Xn)) = Σ_i σπ(X1' × … × X(i-1)' × δXi × X(i+1) × … × Xn), X' = NEW, X = OLD."""

    def __init__(self, node: SPJ):
        self.node = node
        self.conjuncts = [Conjunct(c, aliases_of(c)) for c in split_conjuncts(node.predicate)]
        needed: dict[str, list[str]] = {a: [] for a, _ in node.inputs}
        refs = [e for _, e in node.outputs] + [c.expression for c in self.conjuncts]
        for expression in refs:
            for col in expression.find_all(exp.Column):
                if col.table in needed and col.name not in needed[col.table]:
                    needed[col.table].append(col.name)
        self.needed = needed

    # --- delta ------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        inputs = self.node.inputs
        changed = [i for i, (_, child) in enumerate(inputs) if ctx.delta(child) is not None]
        if not changed:
            return None
        terms = []
        for i in changed:
            modes = {
                a: (NEW if (j in changed and j < i) else OLD)
                for j, (a, _) in enumerate(inputs)
                if j != i
            }
            if ctx.options.initial and any(
                modes[a] == OLD and ctx.rule(child).old_is_empty(ctx) for a, child in inputs if a in modes
            ):
                continue  # a factor is empty: the whole term is
            terms.append(self.term(ctx, i, modes))
        if not terms:
            return None
        if len(terms) == 1:
            return terms[0]
        parts = [select_columns(t, self.node.columns) for t in terms]
        return ctx.query(
            "spj", union_all(parts), drivers=tuple(terms), note="sum of product-rule terms", skip="all"
        )

    def term(self, ctx: Context, i: int, modes: dict[str, str]) -> str:
        """The product rule's term for input ``i``: its delta joined with every other input in ``modes``
        (OLD or NEW per alias). A recursive view's round reads it with the recursive input's delta."""
        start_alias, start_node = self.node.inputs[i]
        start = ctx.delta(start_node)
        assert start is not None
        note = f"term δ{start_alias}: " + ", ".join(
            a + ("" if a == start_alias else f"[{modes[a]}]") for a, _ in self.node.inputs
        )
        bounds = None if ctx.options.initial else self._between_old_and_new(ctx, start_alias, start_node, start)
        return self._pipeline(ctx, start_alias, start, modes, note, consolidate=not ctx.options.initial,
                              extra=[bounds.condition] if bounds is not None else [], ranged=bounds)

    def _between_old_and_new(self, ctx: Context, start_alias: str, start_node: Node, start: str) -> Range | None:
        """A filter on the rows compared with a global aggregate's change, or None.

        δA of a global aggregate is -old value +new value: its weights sum to
        zero. When the only condition on A is ``x op A.v`` and the output reads
        nothing of A, a row with x past both values matches both and yields two
        equal rows that cancel; one short of both matches neither. Only rows
        between the two values can remain (v may also be arithmetic over A's
        columns, as TPC-H q11's ``SUM(...) * 0.0001``: each row of δA has its
        own value of it, and the same argument holds for those two values):

            x > v, x <= v:  min(v) <  x <= max(v)
            x >= v, x < v:  min(v) <= x <  max(v)

        A NULL value (the aggregate of no rows) matches nothing, so then no
        row is left out.

        When x is a plain number column of a stored table that the term
        would scan, the pipeline reads only the rows in the range instead
        (``SourceRule.between``): TPC-H q22 compares 14 of 150,000 customers
        per refresh at SF 1, where the scan read every one.
        """
        if not ctx.rule(start_node).is_global:
            return None
        if any(start_alias in aliases_of(e) for _, e in self.node.outputs):
            return None
        on_start = [c for c in self.conjuncts if start_alias in c.aliases]
        if len(on_start) != 1 or len(on_start[0].aliases) != 2:
            return None
        comparison = on_start[0].expression
        flipped = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}
        if type(comparison) not in flipped:
            return None
        x, v, op = comparison.this, comparison.expression, type(comparison)
        if start_alias in aliases_of(x):
            x, v, op = v, x, flipped[op]
        if start_alias in aliases_of(x) or aliases_of(v) != {start_alias}:
            return None
        types = {c.name: c.type for c in start_node.columns}
        if isinstance(v, exp.Column):
            value, value_type, expression = column(v.name, "__v"), types.get(v.name, ""), None
        else:
            # An expression of the change's row (a threshold scaled by a constant): each row of the
            # change compares x with its own value of it, so the same rows cancel.
            if not all(isinstance(node, _ARITHMETIC) for node in v.walk()):
                return None
            value = v.copy().transform(lambda n: column(n.name, "__v") if isinstance(n, exp.Column) else n)
            numbers = all(is_number_type(types.get(c.name, "")) for c in v.find_all(exp.Column))
            value_type, expression = ("DOUBLE" if numbers else ""), value

        def over_start(function: exp.Expression) -> exp.Expression:
            return exp.Subquery(this=exp.select(function).from_(table(start, "__v")))

        low, high = over_start(exp.Min(this=value.copy())), over_start(exp.Max(this=value.copy()))
        known = over_start(exp.EQ(this=exp.Count(this=value.copy()), expression=exp.Count(this=exp.Star())))
        if op in (exp.GT, exp.LTE):
            between = exp.and_(exp.GT(this=x.copy(), expression=low), exp.LTE(this=x.copy(), expression=high))
        else:
            between = exp.and_(exp.GTE(this=x.copy(), expression=low), exp.LT(this=x.copy(), expression=high))
        condition = exp.or_(exp.Not(this=known), between)
        name = v.name if expression is None else COMPARED
        if isinstance(x, exp.Column):
            return Range(condition, name, value_type, x.table, x.name, expression)
        return Range(condition, name, value_type, expression=expression)

    def _pipeline(
        self, ctx: Context, start_alias: str, start: str, modes: dict[str, str], note: str, consolidate: bool = False,
        extra: list[exp.Expression] = (),  # type: ignore[assignment]
        ranged: Range | None = None,
    ) -> str:
        """Join the rows in temp ``start`` (input ``start_alias``) with every other input.

        Each other input is read in ``modes[alias]`` through an index lookup
        when an equality reaches it, else by a scan.

        With ``consolidate``, a term that scans an input (other than a global
        aggregate's one row) is consolidated before it leaves: it may then hold
        as many rows as that input, mostly pairs that cancel. A change of a
        scalar subquery (-old value, +new value) times a table is the case: a
        row that passes the filter with both values appears once with each
        weight, and only the rows between the two values survive (TPC-H q22).
        Consolidating is the identity on Z-sets, and costs no more than the
        scan that made the rows.
        """
        scanned = False
        applied = [False] * len(self.conjuncts)
        segment = Segment()
        segment.add(start_alias, temp_table(start))
        bound = {start_alias}
        drivers: list[str] = [start]
        remaining = [(a, c) for a, c in self.node.inputs if a != start_alias]
        while remaining:
            (a_j, child_j), keys = self._next(ctx, bound, remaining)
            remaining = [(a, c) for a, c in remaining if a != a_j]
            rule_j = ctx.rule(child_j)
            direct = self._direct_probe(segment, keys)
            # A lookup that may fan out (several rows per probe) first drops the
            # rows the joined inputs' own conditions reject: one more query, but
            # the lookup and every later step then see only rows that survive.
            fans_out = bool(keys) and not rule_j.unique(tuple(k for k, _ in keys))
            if fans_out and self._applicable(bound, applied):
                direct = None
            if direct is not None:
                # The keys are plain columns of one Arrow temp already at hand:
                # look up straight from it, and join everything in one query.
                probe, probe_columns, columns = direct
                looked_up = rule_j.lookup(ctx, columns, probe, probe_columns, modes[a_j])
                assert looked_up is not None
                segment.add(a_j, temp_table(looked_up), sql_alias=a_j)
                drivers.append(looked_up)
            elif keys:
                columns = tuple(k for k, _ in keys)
                probes = [(f"__probe{n}", expr) for n, (_, expr) in enumerate(keys)]
                types = {c.name: c.type for c in child_j.columns}
                probe_exprs = [
                    (name, exp.TryCast(this=segment.map(expr), to=exp.DataType.build(types[k], dialect="duckdb")))
                    for (name, expr), (k, _) in zip(probes, keys)
                ]
                materialized = self._materialize(ctx, segment, bound, applied, probe_exprs, tuple(drivers))
                looked_up = rule_j.lookup(ctx, columns, materialized, tuple(n for n, _ in probes), modes[a_j])
                assert looked_up is not None
                segment = Segment()
                for a in bound:
                    segment.add(a, temp_table(materialized), sql_alias="__p", flattened=True)
                segment.add(a_j, temp_table(looked_up), sql_alias=a_j)
                drivers = [materialized, looked_up]
            else:
                in_range = self._in_range(ctx, ranged, a_j, child_j, start, modes[a_j])
                if in_range is not None:
                    segment.add(a_j, temp_table(in_range), sql_alias=a_j)
                    drivers.append(in_range)
                else:
                    segment.add(a_j, subquery(rule_j.scan(ctx, modes[a_j]), a_j))
                    scanned = scanned or not rule_j.is_global
            bound.add(a_j)
        conjuncts = self._take_conjuncts(bound, applied) + list(extra)
        projections = [alias(segment.map(e), n) for n, e in self.node.outputs]
        projections.append(alias(segment.weight(), WEIGHT))
        sql = segment.select(projections, conjuncts)
        term = ctx.query("term", sql, drivers=tuple(drivers), note=note, transparent=True)
        if not (consolidate and scanned):
            return term
        return ctx.query("cons", consolidate_sql(term, [n for n, _ in self.node.outputs]), drivers=(term,),
                         note=f"consolidated {note}", transparent=True)

    @staticmethod
    def _in_range(ctx: Context, ranged: Range | None, a_j: str, child_j: Node, start: str, mode: str) -> str | None:
        """Input ``a_j``'s rows within ``ranged``'s range, read instead of scanning it; None: scan it.

        Only a plain column of a stored table, compared as numbers (the
        lookup compares in doubles when the types differ; see
        ``executor.value_range``). The term keeps the exact condition.
        """
        if ranged is None or ranged.alias != a_j or ranged.column is None:
            return None
        column_type = {c.name: c.type for c in child_j.columns}.get(ranged.column, "")
        if not (is_number_type(column_type) and is_number_type(ranged.value_type)):
            return None
        rule = ctx.rule(child_j)
        if not rule.can_read_range(ctx, ranged.column):
            return None
        probe = start
        if ranged.expression is not None:  # each row's compared value, for the range read to span
            probe = ctx.query("compared", exp.select(alias(ranged.expression.copy(), ranged.value))
                              .from_(table(start, "__v")), drivers=(start,),
                              note=f"the value each row of {start} is compared with")
        return rule.between(ctx, ranged.column, probe, ranged.value, mode)

    @staticmethod
    def _direct_probe(
        segment: Segment, keys: list[tuple[str, exp.Expression]]
    ) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
        """(probe temp, its columns, index columns) when keys are plain temp columns.

        Keys may come from several bound inputs; the lookup then uses the keys
        of the one temp providing the most (a lookup by fewer columns returns
        more rows, never fewer).
        """
        by_temp: dict[str, list[tuple[str, str]]] = {}
        for key_col, expression in keys:
            if not isinstance(expression, exp.Column):
                continue
            source = segment.probe_source(expression.table, expression.name)
            if source is not None:
                by_temp.setdefault(source[0], []).append((source[1], key_col))
        if not by_temp:
            return None
        temp, pairs = max(by_temp.items(), key=lambda kv: len(kv[1]))
        return temp, tuple(p for p, _ in pairs), tuple(k for _, k in pairs)

    def _applicable(self, bound: set[str], applied: list[bool]) -> bool:
        return any(not applied[n] and c.aliases <= bound for n, c in enumerate(self.conjuncts))

    def _take_conjuncts(self, bound: set[str], applied: list[bool]) -> list[exp.Expression]:
        out = []
        for n, c in enumerate(self.conjuncts):
            if not applied[n] and c.aliases <= bound:
                applied[n] = True
                out.append(c.expression)
        return out

    def _materialize(
        self,
        ctx: Context,
        segment: Segment,
        bound: set[str],
        applied: list[bool],
        probes: list[tuple[str, exp.Expression]],
        drivers: tuple[str, ...],
    ) -> str:
        projections = [
            alias(segment.ref(a, col), f"{a}.{col}") for a in sorted(bound) for col in self.needed[a]
        ]
        projections.append(alias(segment.weight(), WEIGHT))
        projections.extend(alias(e, n) for n, e in probes)
        sql = segment.select(projections, self._take_conjuncts(bound, applied))
        return ctx.query("pipe", sql, drivers=drivers, note=f"joined {', '.join(sorted(bound))}")

    def _next(
        self, ctx: Context, bound: set[str], remaining: list[tuple[str, Node]]
    ) -> tuple[tuple[str, Node], list[tuple[str, exp.Expression]]]:
        """Pick the next input: one reachable by an index lookup if possible.

        Among those, one whose lookup finds at most one row per probe comes
        first (it cannot multiply the rows), then one with a filter of its
        own (it may drop them); otherwise the FROM order.
        """
        types = {a: {c.name: c.type for c in node.columns} for a, node in self.node.inputs}
        connected = None
        best, best_score = None, None
        for a_j, child_j in remaining:
            keys: list[tuple[str, exp.Expression]] = []
            for c in self.conjuncts:
                if not c.aliases <= bound | {a_j}:
                    continue
                if connected is None and a_j in c.aliases:
                    connected = (a_j, child_j)
                if not isinstance(c.expression, exp.EQ):
                    continue
                for side_j, side_b in ((c.expression.this, c.expression.expression),
                                       (c.expression.expression, c.expression.this)):
                    if (
                        isinstance(side_j, exp.Column)
                        and side_j.table == a_j
                        and isinstance(side_b, exp.Column)
                        and side_b.table in bound
                        and lookup_compatible(types[side_b.table][side_b.name], types[a_j][side_j.name])
                        and side_j.name not in [k for k, _ in keys]
                    ):
                        keys.append((side_j.name, side_b))
            # Look up by the equalities the input has an index for (an aggregate by
            # its group keys, not by an aggregate value): the rest are re-checked.
            rule_j = ctx.rule(child_j)
            keys = [(k, e) for k, e in keys if rule_j.can_lookup(ctx, (k,))]
            columns = tuple(k for k, _ in keys)
            if keys and rule_j.can_lookup(ctx, columns):
                filtered = any(c.aliases == {a_j} for c in self.conjuncts)
                score = (rule_j.unique(columns), filtered)
                if best_score is None or score > best_score:
                    best, best_score = ((a_j, child_j), keys), score
        if best is not None:
            return best
        return (connected or remaining[0]), []

    # --- state ------------------------------------------------------------
    def scan(self, ctx: Context, mode: str) -> exp.Expression:
        segment = Segment()
        for a, child in self.node.inputs:
            segment.add(a, subquery(ctx.rule(child).scan(ctx, mode), a))
        projections = [alias(segment.map(e), n) for n, e in self.node.outputs]
        projections.append(alias(segment.weight(), WEIGHT))
        return segment.select(projections, [c.expression for c in self.conjuncts])

    # --- lookups: a pipeline that starts from one input's lookup --------------
    def _lookup_plan(self, ctx: Context, columns: tuple[str, ...]):  # noqa: ANN202
        """(input alias, its columns, indexes into ``columns``) to start a lookup from."""
        outputs = dict(self.node.outputs)
        best = None
        for a, child in self.node.inputs:
            picked = [
                (outputs[c].name, i) for i, c in enumerate(columns)
                if isinstance(outputs[c], exp.Column) and outputs[c].table == a
            ]
            picked = list(dict((name, i) for name, i in picked).items())
            if picked and ctx.rule(child).can_lookup(ctx, tuple(n for n, _ in picked)):
                if best is None or len(picked) > len(best[1]):
                    best = (a, picked)
        return best

    def _null_column(self, columns: tuple[str, ...]) -> bool:
        """Some looked-up column is always NULL (outer-join padding): ``=`` matches nothing."""
        outputs = dict(self.node.outputs)
        return any(is_null_constant(outputs[c]) for c in columns)

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """When some input can be looked up by the columns it provides (or a column is NULL padding)."""
        return bool(columns) and (self._null_column(columns) or self._lookup_plan(ctx, columns) is not None)

    def lookup(self, ctx, columns, probe, probe_columns, mode):  # noqa: ANN001
        """Rows whose ``columns`` equal the probe's (a superset), in ``mode``."""
        if self._null_column(columns):
            return ctx.query("empty", empty_select(self.node.columns), drivers=(), note="NULL key: no match")
        plan = self._lookup_plan(ctx, columns)
        if plan is None:
            return None
        start_alias, picked = plan
        child = self.node.input(start_alias)
        start = ctx.rule(child).lookup(
            ctx, tuple(n for n, _ in picked), probe, tuple(probe_columns[i] for _, i in picked), mode
        )
        modes = {a: mode for a, _ in self.node.inputs if a != start_alias}
        note = f"lookup via {start_alias}: " + ", ".join(a for a, _ in self.node.inputs) + f" [{mode}]"
        return self._pipeline(ctx, start_alias, start, modes, note)

    def old_is_empty(self, ctx: Context) -> bool:
        return any(ctx.rule(child).old_is_empty(ctx) for _, child in self.node.inputs)

    def states(self, ctx: Context) -> list[StateSpec]:
        return []


def is_null_constant(expression: exp.Expression) -> bool:
    while isinstance(expression, (exp.Cast, exp.Paren)):
        expression = expression.this
    return isinstance(expression, exp.Null)
