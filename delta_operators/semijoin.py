"""Semi and anti joins: the rows of one input that have (or have no) match in another.

Contract: ``SemiJoin(L, R, keys, residual, anti)`` holds each row l of L, with
its weight, for which some row of R matches (anti: none does). l matches r
when every key pair is equal under SQL ``=`` (a NULL key matches nothing) and
the residual condition holds. EXISTS, IN, NOT EXISTS, the unmatched rows of
outer joins and the parts of NOT IN are all this node (sql_frontend plans them).

Incremental rule, keys only. State: the right side's match count per key,
C(k) = Σ_{r ∈ R, key(r) = k} w_r, an arrangement keyed by k. With
f(l) = [C(key(l)) > 0] (anti: [C(key(l)) = 0]):

    δOut = δL · f_new  +  L_old · (f_new − f_old)

The first term looks up C for the changed left rows (C_new = C_old + δC for
keys δR touched). The second is non-zero only for keys whose count crossed
zero: the left rows of exactly those keys are looked up, so a right-side
change that adds a second match (or removes one of two) costs no left work.

Incremental rule, with a residual condition. Whether l matches now depends on
l itself, so the state is per distinct left row v: its multiplicity n(v)
(the weight column) and its number of matching pairs
p(v) = Σ_{l = v, r matches l} w_l·w_r. δn = δL, and δp is the delta of the
inner join L ⋈ R projected on L's columns, computed by the product rule
(spj.py, so by index lookups where keys allow):

    Out(v) = n(v) · [p(v) > 0]   (anti: [p(v) = 0])
    δOut(v) = Out_new(v) − Out_old(v)   for each v that δn or δp touch

That state holds the output too: lookups into the node read it directly.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import LEFT, RIGHT, SPJ, Column, SemiJoin
from sql_frontend.plan_sql import alias, column, lit, match_condition, subquery, table
from delta_operators.merge import merge
from delta_operators.program import Lookup, Replace, Stack, StateSpec
from delta_operators.rule import OLD, Context, rule_for
from delta_operators.sqltree import select_columns, union_all
from delta_operators.state_reads import StateRule
from delta_operators.zset import not_distinct
from storage.zset import POS, RUN, WEIGHT

PAIRS = "__pairs"
UP = "__up"
DOWN = "__down"
KEEP = "__keep"
OUT = "__out"


@rule_for(SemiJoin)
class SemiJoinRule(StateRule):
    """δ(L ⋉ R) = δL · f_new + L_old · (f_new − f_old), f(l) = [C(key(l)) > 0] (anti: = 0); by rows:
    δOut(v) = n_new(v)·[p_new(v) > 0] − n_old(v)·[p_old(v) > 0]."""

    looked_up, rows_note = "left rows", "semi-join rows"
    empty_at_first = False  # scans read the (empty) state on a first computation too

    def __init__(self, node: SemiJoin):
        self.node = node
        self.left_keys = tuple(lk for lk, _ in node.keys)
        self.right_keys = tuple(rk for _, rk in node.keys)
        self.key_names = tuple(f"k{i}" for i in range(len(node.keys)))
        self.names = node.left.column_names
        self._pairs: SPJ | None = None

    @property
    def by_rows(self) -> bool:
        """Per-row pair counts (a residual condition) rather than per-key counts."""
        return self.node.residual is not None

    # --- state --------------------------------------------------------------
    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "semi")

    def states(self, ctx: Context) -> list[StateSpec]:
        if self.by_rows:
            return [StateSpec(
                name=self.state(ctx), columns=self.node.left.columns + (Column(PAIRS, "BIGINT"),),
                identity=self.names, indexes=(self.names,),
                role="each distinct left row: its multiplicity and its number of matching right rows",
            )]
        types = {c.name: c.type for c in self.node.right.columns}
        return [StateSpec(
            name=self.state(ctx),
            columns=tuple(Column(k, types[r]) for k, r in zip(self.key_names, self.right_keys)),
            identity=self.key_names, indexes=(self.key_names,) if self.key_names else (),
            role="number of right rows per join key" if self.key_names else "number of right rows",
        )]

    def _test(self, count: exp.Expression) -> exp.Expression:
        """Whether a left row with ``count`` matches is in the output."""
        if self.node.anti:
            return exp.EQ(this=count, expression=lit(0))
        return exp.GT(this=count, expression=lit(0))

    def _key_match(self, left: str, right: str, right_names: tuple[str, ...]) -> exp.Expression:
        parts = [exp.EQ(this=column(lk, left), expression=column(rk, right))
                 for lk, rk in zip(self.left_keys, right_names)]
        return exp.and_(*parts) if parts else exp.true()

    # --- delta ----------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        terms = self._row_terms(ctx) if self.by_rows else self._key_terms(ctx)
        if not terms:
            return None
        if len(terms) == 1:
            return terms[0]
        parts = [select_columns(t, self.node.columns) for t in terms]
        return ctx.query("semi", union_all(parts), drivers=tuple(terms), note="sum of semi-join terms", skip="all")

    def _key_terms(self, ctx: Context) -> list[str]:
        d_left, d_right = ctx.delta(self.node.left), ctx.delta(self.node.right)
        terms, merged = [], None
        if d_right is not None:
            merged, flips = self._merge_counts(ctx, d_right)
            flip_term = self._flip_term(ctx, flips)
            if flip_term is not None:
                terms.append(flip_term)
        if d_left is not None:
            terms.append(self._left_term(ctx, d_left, merged))
        return terms

    def _merge_counts(self, ctx: Context, d_right: str) -> tuple[str, str]:
        """Fold δR's per-key counts into C; return (merged counts, flipped keys with ±1)."""
        d = "d"
        present = [exp.Not(this=exp.Is(this=column(rk, d), expression=exp.null())) for rk in self.right_keys]
        proj = exp.select(
            *[alias(column(rk, d), k) for rk, k in zip(self.right_keys, self.key_names)],
            alias(column(WEIGHT, d), WEIGHT),
        ).from_(table(d_right, d))
        if present:
            proj = proj.where(exp.and_(*present))  # a NULL key matches nothing
        keyed = ctx.query("semid", proj, drivers=(d_right,), note="right rows by join key", transparent=True)

        def flips(before: exp.Expression, after: exp.Expression) -> list[exp.Expression]:
            return [
                alias(exp.and_(exp.LTE(this=before, expression=lit(0)), exp.GT(this=after, expression=lit(0))), UP),
                alias(exp.and_(exp.GT(this=before.copy(), expression=lit(0)), exp.LTE(this=after.copy(), expression=lit(0))), DOWN),
            ]

        key_columns = self.states(ctx)[0].columns
        _, merged = merge(ctx, self.state(ctx), key_columns, keyed, nonnegative=True, extra=flips)
        sign = -1 if self.node.anti else 1
        renames = tuple(zip(self.left_keys, self.key_names))
        flipped = ctx.temp("flips")
        ctx.emit(Stack(out=flipped, source=merged, note="keys whose match count crossed zero",
                       parts=((UP, sign, renames), (DOWN, -sign, renames))))
        return merged, flipped

    def _flip_term(self, ctx: Context, flips: str) -> str | None:
        """L_old · (f_new − f_old): the left rows of keys that gained or lost their last match."""
        left = self.node.left
        if ctx.options.initial and ctx.rule(left).old_is_empty(ctx):
            return None
        drivers: tuple[str, ...] = (flips,)
        if self.left_keys and ctx.rule(left).can_lookup(ctx, self.left_keys):
            rows = ctx.rule(left).lookup(ctx, self.left_keys, flips, self.left_keys, OLD)
            source: exp.Expression = table(rows, "l")
            drivers = (flips, rows)
        else:
            source = subquery(ctx.rule(left).scan(ctx, OLD), "l")
        sql = (
            exp.select(*[alias(column(n, "l"), n) for n in self.names],
                       alias(exp.Mul(this=column(WEIGHT, "l"), expression=column(WEIGHT, "f")), WEIGHT))
            .from_(source)
            .join(table(flips, "f"), on=self._key_match("l", "f", self.left_keys), join_type="inner")
        )
        return ctx.query("semiflip", sql, drivers=drivers, note="left rows whose match flipped")

    def _left_term(self, ctx: Context, d_left: str, merged: str | None) -> str:
        """δL · f_new: changed left rows, kept when their key has (anti: has no) match."""
        look = ctx.temp("semilook")
        ctx.emit(Lookup(out=look, relation=self.state(ctx), index=self.key_names, probe=d_left,
                        probe_columns=self.left_keys, note="match counts of changed left rows"))
        counts = [column(WEIGHT, "c")]
        sql = exp.select(*[alias(column(n, "d"), n) for n in self.names], alias(column(WEIGHT, "d"), WEIGHT))
        sql = sql.from_(table(d_left, "d")).join(
            table(look, "c"), on=self._key_match("d", "c", self.key_names), join_type="left")
        if merged is not None:
            counts.insert(0, column(WEIGHT, "m"))
            sql = sql.join(table(merged, "m"), on=self._key_match("d", "m", self.key_names), join_type="left")
        count = exp.Coalesce(this=counts[0], expressions=counts[1:] + [lit(0)])
        sql = sql.where(self._test(count))
        return ctx.query("semileft", sql, drivers=(d_left,), note="changed left rows that pass")

    # --- delta, by rows -------------------------------------------------------------
    def pairs(self) -> SPJ:
        """L ⋈ R on the match condition, projected on L's columns (flattened for lookups)."""
        if self._pairs is None:
            from sql_frontend.planner import merge_into

            node = self.node
            spj = SPJ(inputs=((LEFT, node.left), (RIGHT, node.right)), predicate=match_condition(node),
                      outputs=tuple((c, column(c, LEFT)) for c in self.names))
            merged = merge_into(spj)  # one level only: the inputs stay the plan's own nodes
            merged.columns = node.left.columns
            self._pairs = merged
        return self._pairs

    def _row_terms(self, ctx: Context) -> list[str]:
        d_left, d_pairs = ctx.delta(self.node.left), ctx.delta(self.pairs())
        if d_left is None and d_pairs is None:
            return []
        parts = []
        for source, n, p in ((d_left, column(WEIGHT, "s"), lit(0)), (d_pairs, lit(0), column(WEIGHT, "s"))):
            if source is not None:
                parts.append(exp.select(*[column(c, "s") for c in self.names], alias(n, "__dn"), alias(p, "__dp"))
                             .from_(table(source, "s")))
        cols = [column(c, "u") for c in self.names]
        sums = [exp.Sum(this=column("__dn", "u")), exp.Sum(this=column("__dp", "u"))]
        changes_sql = (
            exp.select(*[alias(c, c.name) for c in cols], alias(sums[0], "__dn"), alias(sums[1], "__dp"))
            .from_(subquery(union_all(parts), "u"))
            .group_by(*[c.copy() for c in cols])
            .having(exp.or_(*[exp.NEQ(this=s.copy(), expression=lit(0)) for s in sums]))
        )
        drivers = tuple(s for s in (d_left, d_pairs) if s is not None)
        changes = ctx.query("semirowd", changes_sql, drivers=drivers, skip="all", transparent=True,
                            note="change of each left row's multiplicity and matches")
        old = ctx.temp("semirowold")
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=self.names, probe=changes,
                        probe_columns=self.names, positions=True, note="stored left rows"))
        n_old, p_old = (exp.Coalesce(this=column(c, "o"), expressions=[lit(0)]) for c in (WEIGHT, PAIRS))
        n_new = exp.Add(this=n_old.copy(), expression=column("__dn", "c"))
        p_new = exp.Add(this=p_old.copy(), expression=column("__dp", "c"))
        out_old = exp.Mul(this=n_old.copy(), expression=self._flag(p_old.copy()))
        out_new = exp.Mul(this=n_new.copy(), expression=self._flag(p_new.copy()))
        merged_sql = (
            exp.select(
                *[alias(column(c, "c"), c) for c in self.names],
                alias(n_new, WEIGHT), alias(p_new, PAIRS), alias(exp.GT(this=n_new.copy(), expression=lit(0)), KEEP),
                alias(exp.Sub(this=out_new, expression=out_old), OUT),
                alias(column(RUN, "o"), RUN), alias(column(POS, "o"), POS),
            )
            .from_(table(changes, "c"))
            .join(table(old, "o"), on=not_distinct("c", "o", self.names), join_type="left")
        )
        merged = ctx.query("semirows", merged_sql, drivers=(changes,), note="new multiplicities and matches")
        ctx.replace(Replace(relation=self.state(ctx), deletes=merged, inserts=merged, keep=KEEP, nonnegative=True))
        out_sql = (
            exp.select(*[alias(column(c, "m"), c) for c in self.names], alias(column(OUT, "m"), WEIGHT))
            .from_(table(merged, "m"))
            .where(exp.NEQ(this=column(OUT, "m"), expression=lit(0)))
        )
        return [ctx.query("semiout", out_sql, drivers=(merged,), note="left rows whose output changed")]

    def _flag(self, pairs: exp.Expression) -> exp.Expression:
        return exp.Case(ifs=[exp.If(this=self._test(pairs), true=lit(1))], default=lit(0))

    # --- reads: OLD from the state (state_reads.py) ---------------------------------------
    def rows(self, ctx: Context, source: str) -> exp.Select:
        """By rows: the stored left rows that pass. By keys: the left rows (OLD) whose count in ``source`` passes."""
        if self.by_rows:
            return (
                exp.select(*[alias(column(c, "s"), c) for c in self.names], alias(column(WEIGHT, "s"), WEIGHT))
                .from_(table(source, "s"))
                .where(self._test(column(PAIRS, "s")))
            )
        return self._filtered(subquery(ctx.rule(self.node.left).scan(ctx, OLD), "l"), table(source, "c"))

    def _filtered(self, rows: exp.Expression, counts: exp.Expression) -> exp.Select:
        """Left rows joined with their key's stored count, kept when they pass."""
        count = exp.Coalesce(this=column(WEIGHT, "c"), expressions=[lit(0)])
        return (
            exp.select(*[alias(column(n, "l"), n) for n in self.names], alias(column(WEIGHT, "l"), WEIGHT))
            .from_(rows)
            .join(counts, on=self._key_match("l", "c", self.key_names), join_type="left")
            .where(self._test(count))
        )

    def can_lookup(self, ctx: Context, columns: tuple[str, ...]) -> bool:
        """By rows: any columns (of the state). By keys: as the left input can be looked up."""
        if self.by_rows:
            return bool(columns)
        return ctx.rule(self.node.left).can_lookup(ctx, columns)

    def lookup(self, ctx, columns, probe, probe_columns, mode):  # noqa: ANN001
        if self.by_rows:
            return super().lookup(ctx, columns, probe, probe_columns, mode)
        rows = ctx.rule(self.node.left).lookup(ctx, columns, probe, probe_columns, OLD)
        if rows is None:
            return None
        counts = ctx.temp("semilook")
        ctx.emit(Lookup(out=counts, relation=self.state(ctx), index=self.key_names, probe=rows,
                        probe_columns=self.left_keys, note="match counts of looked-up rows"))
        old = self._filtered(table(rows, "l"), table(counts, "c"))
        return ctx.query("look", self.with_delta(ctx, old, mode), drivers=(), note=self.rows_note)

    def old_is_empty(self, ctx: Context) -> bool:
        return ctx.options.initial and (self.by_rows or ctx.rule(self.node.left).old_is_empty(ctx))
