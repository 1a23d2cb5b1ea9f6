"""GROUP BY with COUNT, SUM, AVG, MIN, MAX and their DISTINCT forms.

Contract: one output row per group with at least one input row (with no
GROUP BY: exactly one row, where COUNT is 0 and SUM/AVG/MIN/MAX are NULL over
an empty input), equal to what the engine's aggregate functions return.

Incremental rule. Per group g the state S(g) holds invertible components,
each a sum over the input's rows r with weight w:

    count(g)      = Σ w                     COUNT(*), and whether g exists
    n_k(g)        = Σ w·[x_k(r) IS NOT NULL] COUNT(x), and when SUM/AVG are NULL
    s_k(g)        = Σ w·x_k(r)               SUM/AVG (floats: finite part, plus
                                              counts of NaN, +inf and -inf so a
                                              deleted infinity leaves no NaN behind)

so S_new(g) = S_old(g) + Σ_{r ∈ δX, g(r)=g} component(r): only touched groups
are read and written. MIN/MAX are not invertible. An insert can only lower
the minimum, so new_min = LEAST(old_min, min of the values δX adds),
unless δX deletes a value equal to old_min; only those groups are
re-scanned. A re-scan reads the group's rows where they are already kept:

- the input itself, through an index on the group key, when the input is a
  stored table (maybe projected or filtered) that keeps every row: the
  table is the arrangement, and the aggregate keeps no copy of it;
- otherwise a value multiset V(g, v) = Σ w of every group's values, kept
  beside the state, through its index on the group key.

DISTINCT aggregates use V's presence changes [V_new(g,v) > 0] - [V_old(g,v) > 0]
as their input, so they always keep V.

The node's delta is -old_row(g) + new_row(g) for every touched group.

The per-group change (the partial aggregate of δX, and δV) is computed apart
from the merges S_old + change and V_old + δV and the rescan test, which
read only it, the state rows looked up by key and each other
(``beside_state``): Spark computes the change over the large inputs and
merges it on the driver, where the state lives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from sql_frontend.errors import UnsupportedError
from sql_frontend.plan import FLOAT_TYPES, SPJ, AggCall, Aggregate, Column, Source
from sql_frontend.plan_sql import alias, column, lit, quoted, table
from delta_operators.distinct import presence
from delta_operators.program import Guard, Lookup, Replace, Stack, StateSpec
from delta_operators.rule import NEW, Context, rule_for
from delta_operators.sqltree import cast, union_all
from delta_operators.state_reads import StateRule
from delta_operators.zset import not_distinct
from storage.zset import POS, RUN, WEIGHT

COUNT = "__count"
OLD_PREFIX = "__o_"
NEW_PREFIX = "__n_"
HAD_OLD = "__had_old"
EMIT_OLD = "__emit_old"
EMIT_NEW = "__emit_new"
VALUE = "__v"
KEEP = "__keep"
RESCAN = "__rescan"

INTEGERS = {
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
    "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "BOOLEAN",
}


@dataclass(frozen=True)
class Accumulator:
    type: str  # SQL type of the running sum
    floating: bool  # track NaN/±inf apart from the finite sum


def accumulator(arg_type: str, func: str) -> Accumulator:
    t = arg_type.upper()
    if t in INTEGERS:
        # DuckDB sums integers exactly (HUGEINT); DECIMAL(38,0) is the same range
        # and survives the trip through Arrow unchanged.
        return Accumulator("DECIMAL(38,0)", False)
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", t)
    if m:
        return Accumulator(f"DECIMAL(38,{m.group(2)})", False)
    if t in FLOAT_TYPES:
        return Accumulator("DOUBLE", True)
    raise UnsupportedError(f"{func.upper()} over type {arg_type} is not supported in a materialized view")


def coalesce0(e: exp.Expression) -> exp.Expression:
    return exp.Coalesce(this=e, expressions=[lit(0)])


def weight_sum(weights: exp.Expression) -> exp.Expression:
    """A group's sum of row weights in a change (0 for none) as BIGINT, not the HUGEINT DuckDB types a
    SUM of BIGINT.

    The counts it adds to are BIGINT in the state, and a sum too large for BIGINT fails there as
    it fails here (counts are never negative, so no sum outside BIGINT gives one inside). As BIGINT
    the compiled steps keep int64 counts from the change to the new state, where a HUGEINT was
    written out as 128-bit decimals, read back, added and range-checked to be stored as BIGINT
    (~8 numpy calls per count per batch)."""
    return cast(coalesce0(exp.Sum(this=weights)), "BIGINT")


def when(condition: exp.Expression, then: exp.Expression, default: exp.Expression) -> exp.Case:
    return exp.Case(ifs=[exp.If(this=condition, true=then)], default=default)


def float_literal(text: str) -> exp.Expression:
    return exp.cast(exp.Literal.string(text), exp.DataType.build("DOUBLE"))


@rule_for(Aggregate)
class AggregateRule(StateRule):
    """δ(γ X)(g) = row(S_old(g) + δS(g)) − row(S_old(g)) for each group g of δX (δS: δX's components)."""

    looked_up, rows_note = "groups", "aggregate rows"

    def __init__(self, node: Aggregate):
        self.node = node
        self.keys = node.keys
        self.input_types = {c.name: c.type for c in node.input.columns}
        self.value_args = list(
            dict.fromkeys(c.arg for c in node.aggregates if c.func in ("min", "max") or c.distinct)
        )
        self.acc = {
            i: accumulator(self.input_types[c.arg], c.func)
            for i, c in enumerate(node.aggregates)
            if c.func in ("sum", "avg")
        }

    @property
    def is_global(self) -> bool:
        return not self.keys

    # --- state layout -----------------------------------------------------
    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "agg")

    def values_state(self, ctx: Context, arg: str) -> str:
        return f"{ctx.state_name(self.node, 'vals')}_{self.value_args.index(arg)}"

    def rescans_input(self, arg: str) -> bool:
        """Whether MIN/MAX(``arg``) re-scans a group by looking up the input, keeping no multiset.

        The input must be one stored table that keeps every row (a RETAIN stream does not),
        read through at most a projection and filter whose group key columns the table can be
        looked up by: a re-scan then reads the group's rows (the index is shared with every
        other reader of the table). Joins keep the multiset: re-reading a group through a
        join would redo the join for it. DISTINCT needs the multiset's presence changes.
        """
        if not self.keys or any(c.arg == arg and c.distinct for c in self.node.aggregates):
            return False
        source = self._table(self.node.input)
        if source is None or source.kind != "table" or not source.complete:
            return False
        if not isinstance(self.node.input, SPJ):
            return True
        # Every key a column of the table: the lookup finds the group's rows and no more.
        outputs = dict(self.node.input.outputs)
        return all(isinstance(outputs.get(k), exp.Column) for k in self.keys)

    @staticmethod
    def _table(node) -> Source | None:  # noqa: ANN001
        """The one stored relation ``node`` reads through at most a projection and filter, or None."""
        if isinstance(node, SPJ) and len(node.inputs) == 1:
            node = node.inputs[0][1]
        return node if isinstance(node, Source) else None

    def key_columns(self) -> tuple[Column, ...]:
        return tuple(Column(k, self.input_types[k]) for k in self.keys)

    def components(self) -> list[Column]:
        cols = [Column(COUNT, "BIGINT")]
        for i, c in enumerate(self.node.aggregates):
            if c.func == "count_star":
                continue
            if c.func in ("min", "max"):
                cols.append(Column(f"__m{i}", self.input_types[c.arg]))
                continue
            cols.append(Column(f"__n{i}", "BIGINT"))
            if c.func in ("sum", "avg"):
                acc = self.acc[i]
                cols.append(Column(f"__s{i}", acc.type))
                if acc.floating:
                    cols.extend(Column(f"__{s}{i}", "BIGINT") for s in ("nan", "pinf", "ninf"))
        return cols

    def states(self, ctx: Context) -> list[StateSpec]:
        specs = [
            StateSpec(
                name=self.state(ctx),
                columns=self.key_columns() + tuple(self.components()),
                identity=self.keys,
                indexes=(self.keys,) if self.keys else (),
                role="per-group counts and sums",
            )
        ]
        for arg in self.value_args:
            if self.rescans_input(arg):
                continue
            specs.append(
                StateSpec(
                    name=self.values_state(ctx, arg),
                    columns=self.key_columns() + (Column(VALUE, self.input_types[arg]),),
                    identity=self.keys + (VALUE,),
                    indexes=(self.keys + (VALUE,),) + ((self.keys,) if self.keys else ()),
                    role=f"multiset of {arg} per group (MIN/MAX/DISTINCT)",
                )
            )
        return specs

    # --- finalize: state row -> output row ---------------------------------
    def finalize(self, s: str) -> list[exp.Expression]:
        out: list[exp.Expression] = [alias(column(k, s), k) for k in self.keys]
        for i, c in enumerate(self.node.aggregates):
            out.append(alias(cast(self._final(i, c, s), c.type), c.name))
        return out

    def _final(self, i: int, c: AggCall, s: str) -> exp.Expression:
        if c.func == "count_star":
            return column(COUNT, s)
        if c.func == "count":
            return column(f"__n{i}", s)
        if c.func in ("min", "max"):
            return column(f"__m{i}", s)
        total: exp.Expression = column(f"__s{i}", s)
        if self.acc[i].floating:
            nan, pinf, ninf = (column(f"__{x}{i}", s) for x in ("nan", "pinf", "ninf"))
            gt0 = lambda e: exp.GT(this=e, expression=lit(0))  # noqa: E731
            total = exp.Case(
                ifs=[
                    exp.If(this=exp.or_(gt0(nan), exp.and_(gt0(pinf), gt0(ninf))), true=float_literal("nan")),
                    exp.If(this=gt0(pinf.copy()), true=float_literal("inf")),
                    exp.If(this=gt0(ninf.copy()), true=float_literal("-inf")),
                ],
                default=total,
            )
        n = column(f"__n{i}", s)
        if c.func == "avg":
            total = exp.Div(this=cast(total, "DOUBLE"), expression=n.copy())
        return when(exp.EQ(this=n, expression=lit(0)), exp.null(), total)

    # --- delta --------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        delta_in = ctx.delta(self.node.input)
        if delta_in is None:
            return None
        # With no GROUP BY the one row exists even over no input, so the first
        # computation must run even when the input is empty.
        always = self.is_global and ctx.options.initial
        partial = ctx.query("aggd", self._partial_sql(delta_in), drivers=() if always else (delta_in,),
                            note="per-group change of counts and sums", transparent=True, pinned=True)
        old = ctx.temp("aggold")
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=self.keys, probe=partial,
                        probe_columns=self.keys, positions=True, note="state of touched groups"))
        extreme: dict[str, tuple[str, str]] = {}
        presence_of: dict[str, str] = {}
        for arg in self.value_args:
            if self.rescans_input(arg):
                extreme[arg] = self._extremes_from_input(ctx, arg, delta_in, old)
                continue
            merged = self._values(ctx, arg, delta_in)
            if any(c.arg == arg and c.func in ("min", "max") for c in self.node.aggregates):
                extreme[arg] = self._extremes(ctx, arg, merged, old)
            if any(c.arg == arg and c.distinct and c.func not in ("min", "max") for c in self.node.aggregates):
                presence_of[arg] = self._presence(ctx, arg, merged)
        wide = ctx.query("aggnew", self._wide_sql(partial, old, extreme, presence_of), drivers=(partial,),
                         note="new state and old/new output row of touched groups", beside_state=True)
        ctx.replace(Replace(relation=self.state(ctx), deletes=wide, inserts=wide, keep=KEEP))
        names = self.node.column_names
        out = ctx.temp("agg")
        ctx.emit(Stack(out=out, source=wide, note="-old row +new row per changed group", parts=(
            (EMIT_OLD, -1, tuple((n, OLD_PREFIX + n) for n in names)),
            (EMIT_NEW, 1, tuple((n, NEW_PREFIX + n) for n in names)),
        )))
        return out

    def _group_by(self, select: exp.Select, source: str, extra: list[exp.Expression] = ()) -> exp.Select:
        cols = [column(k, source) for k in self.keys] + list(extra)
        return select.group_by(*cols) if cols else select

    def _partial_sql(self, delta_in: str) -> exp.Select:
        w = column(WEIGHT, "d")
        projections = [alias(column(k, "d"), k) for k in self.keys]
        projections.append(alias(weight_sum(w.copy()), COUNT))
        for i, c in enumerate(self.node.aggregates):
            if c.func in ("count_star", "min", "max") or c.distinct:
                continue
            x = column(c.arg, "d")
            not_null = exp.Not(this=exp.Is(this=x.copy(), expression=exp.null()))
            projections.append(alias(weight_sum(when(not_null, w.copy(), lit(0))), f"__n{i}"))
            if c.func in ("sum", "avg"):
                projections.extend(self._sum_components(i, x, w))
        select = exp.select(*projections).from_(table(delta_in, "d"))
        return self._group_by(select, "d")

    def _sum_components(self, i: int, x: exp.Expression, w: exp.Expression) -> list[exp.Expression]:
        acc = self.acc[i]
        if not acc.floating:
            value = exp.Mul(this=cast(x.copy(), acc.type), expression=w.copy())
            return [alias(exp.Sum(this=value), f"__s{i}")]
        finite = exp.Anonymous(this="isfinite", expressions=[x.copy()])
        parts = [alias(exp.Sum(this=when(finite, exp.Mul(this=cast(x.copy(), "DOUBLE"), expression=w.copy()), lit(0))), f"__s{i}")]
        tests = {
            "nan": exp.Anonymous(this="isnan", expressions=[x.copy()]),
            "pinf": exp.EQ(this=x.copy(), expression=float_literal("inf")),
            "ninf": exp.EQ(this=x.copy(), expression=float_literal("-inf")),
        }
        for name, test in tests.items():
            parts.append(alias(weight_sum(when(test, w.copy(), lit(0))), f"__{name}{i}"))
        return parts

    def _values(self, ctx: Context, arg: str, delta_in: str) -> str:
        """Merge the input's values of ``arg`` into V; return the merged temp."""
        relation = self.values_state(ctx, arg)
        names = self.keys + (VALUE,)
        w = column(WEIGHT, "d")
        x = column(arg, "d")
        select = exp.select(
            *[alias(column(k, "d"), k) for k in self.keys],
            alias(x, VALUE),
            alias(exp.Sum(this=w.copy()), WEIGHT),
        ).from_(table(delta_in, "d")).where(exp.Not(this=exp.Is(this=x.copy(), expression=exp.null())))
        select = self._group_by(select, "d", [x.copy()]).having(
            exp.NEQ(this=exp.Sum(this=w.copy()), expression=lit(0))
        )
        changes = ctx.query("vald", select, drivers=(delta_in,), note=f"change of {arg} multiset", transparent=True,
                            pinned=True)
        old = ctx.temp("valold")
        ctx.emit(Lookup(out=old, relation=relation, index=names, probe=changes, probe_columns=names,
                        positions=True, note=f"stored multiplicities of {arg}"))
        before = coalesce0(column(WEIGHT, "o"))
        after = exp.Add(this=before.copy(), expression=column(WEIGHT, "d"))
        merged_sql = (
            exp.select(
                *[alias(column(n, "d"), n) for n in names],
                alias(before, "__old"),
                alias(cast(after, "BIGINT"), WEIGHT),  # stored as BIGINT (a SUM of weights is a HUGEINT)
                alias(exp.GT(this=after.copy(), expression=lit(0)), KEEP),
                alias(column(RUN, "o"), RUN),
                alias(column(POS, "o"), POS),
            )
            .from_(table(changes, "d"))
            .join(table(old, "o"), on=not_distinct("d", "o", names), join_type="left")
        )
        merged = ctx.query("valnew", merged_sql, drivers=(changes,), note=f"new multiplicities of {arg}",
                           beside_state=True)
        ctx.replace(Replace(relation=relation, deletes=merged, inserts=merged, keep=KEEP, nonnegative=True))
        return merged

    def _rescan(self, ctx: Context, arg: str, changed: str, old: str, value_column: str = VALUE) -> str:
        """The touched groups whose old MIN/MAX(``arg``) is among ``changed``'s rows with WEIGHT <= 0
        (a value deleted, or whose multiplicity fell to zero): their extreme must be found again."""
        calls = [(i, c) for i, c in enumerate(self.node.aggregates) if c.arg == arg and c.func in ("min", "max")]
        value = column(value_column, "n")
        hits = [exp.EQ(this=value.copy(), expression=column(f"__m{i}", "o")) for i, _ in calls]
        rescan_sql = (
            exp.select(*[alias(column(k, "n"), k) for k in self.keys], alias(exp.true(), RESCAN))
            .distinct()
            .from_(table(changed, "n"))
            .join(table(old, "o"), on=not_distinct("n", "o", self.keys), join_type="inner")
            .where(exp.and_(exp.LTE(this=column(WEIGHT, "n"), expression=lit(0)), exp.or_(*hits)))
        )
        # Most batches delete no group's current extreme: the guard sees that
        # on the driver (deleted values vs the old extremes) and skips the query.
        guard = Guard(probe=changed, column=value_column, values=old, value_columns=tuple(f"__m{i}" for i, _ in calls),
                      keys=tuple(self.keys), result=RESCAN)
        return ctx.query("rescan", rescan_sql, drivers=(changed, old),
                         note=f"groups whose MIN/MAX({arg}) was deleted", guard=guard, beside_state=True)

    def _extremes_from_input(self, ctx: Context, arg: str, delta_in: str, old: str) -> tuple[str, str]:
        """(rescanned groups, per-group min/max over the values that decide it), re-scanning a
        group by looking up its rows in the input (``rescans_input``): its new version holds
        every value the group has, the values this batch added included.

        Read from the input's delta row by row, unconsolidated: a value with a row of positive
        weight is in the new version (NEW(v) = OLD(v) + plus(v) - minus(v) and minus(v) <= OLD(v),
        so NEW(v) >= plus(v)), and a deleted row equal to the old extreme re-scans its group even
        when another copy stays (the re-scan finds it)."""
        rescan = self._rescan(ctx, arg, delta_in, old, value_column=arg)
        rows = ctx.rule(self.node.input).lookup(ctx, self.keys, rescan, self.keys, NEW)
        x = column(arg, "g")
        # The lookup may find more than the groups (a superset, as every lookup): the join keeps
        # the re-scanned ones.
        found = (
            exp.select(*[alias(column(k, "g"), k) for k in self.keys], alias(x, VALUE))
            .from_(table(rows, "g"))
            .join(table(rescan, "r"), on=not_distinct("g", "r", self.keys), join_type="inner")
            .where(exp.Not(this=exp.Is(this=x.copy(), expression=exp.null())))
        )
        if self._table(self.node.input).relation not in ctx.options.stored_new:
            # Its rows are a Z-set (the stored version and the delta): a value is there if its
            # weights add up above 0. A table holding the new version has only rows that are there.
            found = self._group_by(found, "g", [x.copy()]).having(
                exp.GT(this=exp.Sum(this=column(WEIGHT, "g")), expression=lit(0))
            )
        added_value = column(arg, "c")
        added = exp.select(*[alias(column(k, "c"), k) for k in self.keys], alias(added_value, VALUE)).from_(
            table(delta_in, "c")).where(exp.and_(
                exp.GT(this=column(WEIGHT, "c"), expression=lit(0)),
                exp.Not(this=exp.Is(this=added_value.copy(), expression=exp.null()))))
        values = exp.Subquery(this=union_all([found, added]), alias=exp.TableAlias(this=quoted("v")))
        ext_sql = self._group_by(exp.select(
            *[alias(column(k, "v"), k) for k in self.keys],
            alias(exp.Min(this=column(VALUE, "v")), "__min"),
            alias(exp.Max(this=column(VALUE, "v")), "__max"),
        ).from_(values), "v")
        extremes = ctx.query("ext", ext_sql, drivers=(delta_in,), note=f"MIN/MAX({arg}) candidates")
        return rescan, extremes

    def _extremes(self, ctx: Context, arg: str, merged: str, old: str) -> tuple[str, str]:
        """(rescanned groups, per-group min/max over the values that decide it), re-scanning a
        group through the multiset V."""
        relation = self.values_state(ctx, arg)
        rescan = self._rescan(ctx, arg, merged, old)
        group_rows = ctx.temp("valgrp")
        ctx.emit(Lookup(out=group_rows, relation=relation, index=self.keys, probe=rescan,
                        probe_columns=self.keys, note=f"all values of {arg} in rescanned groups"))
        ctx.need_index(relation, self.keys)
        names = self.keys + (VALUE,)
        untouched = (
            exp.select(*[column(n, "g") for n in names])
            .from_(table(group_rows, "g"))
            .where(
                exp.Not(
                    this=exp.Exists(
                        this=exp.select(lit(1)).from_(table(merged, "m")).where(not_distinct("g", "m", names))
                    )
                )
            )
        )
        present = exp.select(*[column(n, "m") for n in names]).from_(table(merged, "m")).where(
            exp.GT(this=column(WEIGHT, "m"), expression=lit(0))
        )
        values = exp.Subquery(this=union_all([untouched, present]), alias=exp.TableAlias(this=quoted("v")))
        ext_sql = exp.select(
            *[alias(column(k, "v"), k) for k in self.keys],
            alias(exp.Min(this=column(VALUE, "v")), "__min"),
            alias(exp.Max(this=column(VALUE, "v")), "__max"),
        ).from_(values)
        ext_sql = self._group_by(ext_sql, "v")
        extremes = ctx.query("ext", ext_sql, drivers=(merged,), note=f"MIN/MAX({arg}) candidates")
        return rescan, extremes

    def _presence(self, ctx: Context, arg: str, merged: str) -> str:
        """Per-group change of the DISTINCT values of ``arg``: count and sum."""
        change = exp.Sub(this=presence(column(WEIGHT, "m")), expression=presence(column("__old", "m")))
        projections = [alias(column(k, "m"), k) for k in self.keys]
        projections.append(alias(coalesce0(exp.Sum(this=change.copy())), "__dn"))
        for i, c in enumerate(self.node.aggregates):
            if c.arg != arg or not c.distinct or c.func not in ("sum", "avg"):
                continue
            w = change.copy()
            projections.extend(
                alias(p.this, f"__p{p.alias}") for p in self._sum_components(i, column(VALUE, "m"), w)
            )
        select = exp.select(*projections).from_(table(merged, "m"))
        return ctx.query("pres", self._group_by(select, "m"), drivers=(merged,),
                         note=f"change of DISTINCT {arg} per group")

    def _new_sql(self, partial: str, old: str, extreme: dict, presence_of: dict) -> exp.Select:
        p, o = column, lambda name: column(name, "o")  # noqa: E731
        # Each new state column in its stored type: a SUM of BIGINTs is a HUGEINT, which the
        # state holds as BIGINT (an overflow fails here instead of when the rows are stored), so the
        # compiled step keeps int64 values instead of building 128-bit decimals that storing casts back.
        stored = {c.name: c.type for c in self.components()}
        typed = lambda e, name: alias(cast(e, stored[name]), name)  # noqa: E731
        projections: list[exp.Expression] = [alias(p(k, "p"), k) for k in self.keys]
        new_count = exp.Add(this=coalesce0(o(COUNT)), expression=p(COUNT, "p"))
        projections.append(typed(new_count, COUNT))
        for i, c in enumerate(self.node.aggregates):
            if c.func == "count_star":
                continue
            if c.func in ("min", "max"):
                r, e = (f"r{self.value_args.index(c.arg)}", f"e{self.value_args.index(c.arg)}")
                candidate = column("__min" if c.func == "min" else "__max", e)
                # LEAST/GREATEST skip NULLs in DuckDB and Spark alike; spelled as plain
                # calls because sqlglot rewrites its own nodes to propagate NULL.
                combine = "LEAST" if c.func == "min" else "GREATEST"
                rescanned = exp.Not(this=exp.Is(this=column(RESCAN, r), expression=exp.null()))
                value = when(rescanned, candidate, exp.Anonymous(this=combine, expressions=[o(f"__m{i}"), candidate.copy()]))
                projections.append(alias(value, f"__m{i}"))
                continue
            source, prefix = ("p", "__") if not c.distinct else (f"d{self.value_args.index(c.arg)}", "__p__")
            if c.distinct:
                n_delta = coalesce0(column("__dn", source))
            else:
                n_delta = column(f"__n{i}", source)
            projections.append(typed(exp.Add(this=coalesce0(o(f"__n{i}")), expression=n_delta), f"__n{i}"))
            if c.func in ("sum", "avg"):
                names = ["s"] + (["nan", "pinf", "ninf"] if self.acc[i].floating else [])
                for name in names:
                    delta_col = column(f"{prefix}{name}{i}", source)
                    projections.append(
                        typed(exp.Add(this=coalesce0(o(f"__{name}{i}")), expression=coalesce0(delta_col)), f"__{name}{i}")
                    )
        projections.append(alias(cast(lit(1), "BIGINT"), WEIGHT))
        keep = exp.true() if self.is_global else exp.GT(this=new_count.copy(), expression=lit(0))
        projections.append(alias(keep, KEEP))
        projections.extend([alias(column(RUN, "o"), RUN), alias(column(POS, "o"), POS)])
        select = exp.select(*projections).from_(table(partial, "p"))
        select = select.join(table(old, "o"), on=not_distinct("p", "o", self.keys), join_type="left")
        for arg, (rescan, extremes) in extreme.items():
            n = self.value_args.index(arg)
            select = select.join(table(extremes, f"e{n}"), on=not_distinct("p", f"e{n}", self.keys), join_type="left")
            select = select.join(table(rescan, f"r{n}"), on=not_distinct("p", f"r{n}", self.keys), join_type="left")
        for arg, pres in presence_of.items():
            n = self.value_args.index(arg)
            select = select.join(table(pres, f"d{n}"), on=not_distinct("p", f"d{n}", self.keys), join_type="left")
        return select

    def _wide_sql(self, partial: str, old: str, extreme: dict, presence_of: dict) -> exp.Select:
        """Per touched group: the new state, and the old and new output rows.

        Emit flags say which output rows change: a group's old row goes out and
        its new row comes in unless both exist and are equal.
        """
        names = self.node.column_names
        inner = self._new_sql(partial, old, extreme, presence_of)
        inner = inner.select(
            *[alias(e.this, OLD_PREFIX + e.alias) for e in self.finalize("o")],
            alias(exp.Not(this=exp.Is(this=column(COUNT, "o"), expression=exp.null())), HAD_OLD),
            copy=False,
        )
        with_new = exp.select(
            exp.Star(), *[alias(e.this, NEW_PREFIX + e.alias) for e in self.finalize("n")]
        ).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=quoted("n"))))
        same = exp.and_(*[
            exp.NullSafeEQ(this=column(OLD_PREFIX + c, "w"), expression=column(NEW_PREFIX + c, "w")) for c in names
        ])
        keep, had = column(KEEP, "w"), column(HAD_OLD, "w")
        unchanged = exp.and_(keep.copy(), had.copy(), same)
        return exp.select(
            exp.Star(),
            alias(exp.and_(had, exp.Not(this=unchanged.copy())), EMIT_OLD),
            alias(exp.and_(keep, exp.Not(this=unchanged.copy())), EMIT_NEW),
        ).from_(exp.Subquery(this=with_new, alias=exp.TableAlias(this=quoted("w"))))

    # --- state reads: OLD = the finalized state rows (state_reads.py) ----------
    def rows(self, ctx: Context, source: str) -> exp.Select:
        return exp.select(*self.finalize("s"), alias(lit(1), WEIGHT)).from_(table(source, "s"))

    def ranged_column(self, column: str) -> str | None:
        """The state column whose order is output ``column``'s, or None.

        An output that is a state column as it is (or NULL, for a group with
        no value): COUNT(*), COUNT, MIN, MAX, and SUM of integers or
        decimals, each cast to its output type, which keeps the order. Not
        AVG (a quotient) or a floating SUM (its NaN and infinity counters
        decide it before the sum does).
        """
        for i, c in enumerate(self.node.aggregates):
            if c.name != column:
                continue
            if c.func == "count_star":
                return COUNT
            if c.func == "count" and not c.distinct:
                return f"__n{i}"
            if c.func in ("min", "max"):
                return f"__m{i}"
            if c.func == "sum" and not c.distinct and not self.acc[i].floating:
                return f"__s{i}"
        return None

    def can_read_range(self, ctx: Context, column: str) -> bool:
        """An output ordered as a state column (``ranged_column``), after the first computation."""
        return not ctx.options.initial and self.ranged_column(column) is not None

    def between(self, ctx: Context, column: str, probe: str, value: str, mode: str) -> str | None:
        """The groups (in ``mode``) whose output ``column`` lies within the range of ``probe``'s ``value``,
        maybe more: one pass over the state column that orders it, not a scan of the state.

        TPC-H q11's groups compared with a share of the total: a change of the
        total moves the threshold a little, and only the groups between the old
        and the new threshold can enter or leave (SPJRule._between_old_and_new).
        Groups whose output is NULL (no value) are not read: no comparison keeps them.
        """
        stored = self.ranged_column(column)
        if ctx.options.initial or stored is None:
            return None
        found = ctx.temp("range")
        ctx.emit(Lookup(out=found, relation=self.state(ctx), index=(), probe=probe, probe_columns=(value,),
                        between=stored, note=f"groups whose {stored} lies within the range of {probe}.{value}"))
        return ctx.query("range", self.with_delta(ctx, self.rows(ctx, found), mode), drivers=(),
                         note=f"{mode} aggregate rows in range")

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """By group key columns (the state's rows are per group)."""
        return bool(columns) and set(columns) <= set(self.keys)

    def unique(self, columns: tuple[str, ...]) -> bool:
        return set(self.keys) <= set(columns)  # one row per group
