"""WITH RECURSIVE: the least fixpoint R = base ∪ step(R), kept exact under inserts and deletes.

Contract: with UNION, the set of facts derivable from the base by any number
of steps (as DuckDB's recursive CTE computes it, cycles included); with UNION
ALL, the bag base + step(base) + step(step(base)) + … (finite only when the
derivations are: a cycle makes it diverge, here and in DuckDB alike).

Incremental rule. ``step`` is linear in R (it reads R once) and reads other
inputs E. Let δB be the base's change, U = Δ_E step(R_old) the product
rule's terms for E's changes with R held at R_old, and step' the step over
the new E. Rounds run as a program Loop; each round's work is proportional
to the facts it handles, and each round handles only facts not seen before.

UNION ALL (bag, counting):

    δR = W + step'(W) + step'(step'(W)) + …        W = δB + U

UNION (set): delete and re-derive (DRed) with derivation counts. The state
keeps, per fact f of R, cnt(f) = base multiplicity of f + number of one-step
derivations of f from R.

    1. over-delete  D = facts of R_old that lost a derivation (a negative row
                    of U or δB), closed under step' within R_old
    2. re-derive    N = {f ∈ D or f ∉ R_old : cnt(f) + U(f) + δB(f) - step'(D)(f) > 0}
       and insert       (derivable from R_old - D), closed under step' outside R_old - D
    3.              R_new = (R_old - D) ∪ N,   δR = N - D,
                    cnt_new = cnt + U + δB - step'(D) + step'(N)

Deletes are exact, also on cycles: a fact survives only if re-derived from
facts that did not depend on anything deleted.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import SPJ, Column, Recursive, RecursiveRef
from delta_operators.merge import merge
from delta_operators.optimize import optimize
from delta_operators.program import Lookup, Loop, Program, Replace, StateSpec, Step
from delta_operators.rule import NEW, Context, rule_for
from delta_operators.sqltext import columns, parse, q, same
from delta_operators.state_reads import StateRule
from storage.zset import EVERY, POS, RUN, WEIGHT, consolidate

MAX_ROUNDS = 1000  # rounds of one loop before the recursion is declared divergent
CNT = "__cnt"  # derivations of a fact (UNION)
KEEP = "__keep"
CHANGE = "__change"


def state_name(ctx: Context, ref: RecursiveRef) -> str:
    return ctx.state_name(ref, "rec")


@rule_for(Recursive)
class RecursiveRule(StateRule):
    """Semi-naive: δR = W + step'(W) + step'(step'(W)) + …, W = δB + U (UNION ALL); DRed with counts (UNION)."""

    looked_up, rows_note = "fixpoint rows", "fixpoint rows"

    def __init__(self, node: Recursive):
        self.node = node
        self.names = node.column_names
        self.types = [c.type for c in node.columns]
        assert isinstance(node.step, SPJ)
        self.step: SPJ = node.step

    # --- state ------------------------------------------------------------
    def states(self, ctx: Context) -> list[StateSpec]:
        if self.node.distinct:
            cols = self.node.columns + (Column(CNT, "BIGINT"),)
            role = "the facts of the fixpoint, each with its number of derivations (DRed)"
        else:
            cols, role = self.node.columns, "the rows of the fixpoint with their multiplicities"
        return [StateSpec(name=state_name(ctx, self.node.ref), columns=cols, identity=self.names,
                          indexes=(self.names,), role=role)]

    # --- SQL pieces -------------------------------------------------------
    def _cast(self, temp: str, source_names: tuple[str, ...], negative_only: bool = False) -> str:
        """SELECT a change temp's rows under this node's names and types (by position)."""
        cast = ", ".join(f"CAST(x.{q(s)} AS {t}) AS {q(n)}" for s, n, t in zip(source_names, self.names, self.types))
        where = f" WHERE x.{q(WEIGHT)} < 0" if negative_only else ""
        return f"SELECT {cast}, x.{q(WEIGHT)} FROM {q(temp)} AS x{where}"

    def _sum(self, parts: list[str]) -> exp.Expression:
        """The consolidated sum of Z-set parts (rows with zero weight dropped)."""
        n = self.names
        return parse(consolidate(f"({' UNION ALL '.join(parts)}) AS u", n, table="u"))

    def _changes(self, ctx: Context) -> tuple[list[tuple[str, tuple[str, ...]]], str | None]:
        """(change temps with their column names, consolidated δB + U)."""
        parts = []
        for child in (self.node.base, self.step):
            d = ctx.delta(child)
            if d is not None:
                parts.append((d, child.column_names))
        if not parts:
            return parts, None
        total = ctx.query("rchange", self._sum([self._cast(t, c) for t, c in parts]),
                          drivers=tuple(t for t, _ in parts), skip="all", note="base change + U (consolidated)")
        return parts, total

    def _round(self, ctx: Context, frontier: str) -> tuple[list[Step], str]:
        """Steps computing step'(frontier): heads with derivation counts."""
        sub = ctx.with_delta(self.node.ref, frontier)
        at = next(i for i, (_, child) in enumerate(self.step.inputs) if child is self.node.ref)
        modes = {a: NEW for j, (a, _) in enumerate(self.step.inputs) if j != at}
        term = ctx.rule(self.step).term(sub, at, modes)
        heads = sub.query("rheads", self._sum([self._cast(term, self.step.column_names)]), drivers=(term,),
                          transparent=True, pinned=True, note="facts derived in one step, with derivation counts")
        ctx.program.indexes |= sub.program.indexes
        ctx.program.scans |= sub.program.scans
        return sub.program.steps, heads

    def _loop(self, ctx: Context, init: dict[str, str], body: list[Step], next_: dict[str, str], until: str,
              collect: dict[str, str], note: str) -> None:
        body_program = optimize(Program(steps=body, inputs=tuple(init)))
        ctx.emit(Loop(init=tuple(init.items()), body=body_program.steps, next=tuple(next_.items()), until=until,
                      collect=tuple(collect.items()), max_rounds=MAX_ROUNDS,
                      what=f"WITH RECURSIVE {self.node.name}", note=note))

    # --- delta ------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        parts, total = self._changes(ctx)
        if total is None:
            return None
        if self.node.distinct:
            return self._set_delta(ctx, parts, total)
        return self._bag_delta(ctx, total)

    def _bag_delta(self, ctx: Context, total: str) -> str:
        frontier, collected = ctx.temp("rW"), ctx.temp("rall")
        body, heads = self._round(ctx, frontier)
        self._loop(ctx, {frontier: total}, body, {frontier: heads}, heads, {collected: heads},
                   "semi-naive: derive from the last round's change only")
        delta = ctx.query("rdelta", self._sum([f"SELECT * FROM {q(total)}", f"SELECT * FROM {q(collected)}"]),
                          drivers=(total,), note="change of the fixpoint")
        merge(ctx, state_name(ctx, self.node.ref), self.node.columns, delta, nonnegative=True)
        return delta

    def _set_delta(self, ctx: Context, parts: list[tuple[str, tuple[str, ...]]], total: str) -> str:
        st, n = state_name(ctx, self.node.ref), self.names
        lost = ctx.query("rneg", parse(f"SELECT DISTINCT {columns(n, 'x')} FROM ("
                                       + " UNION ALL ".join(self._cast(t, c, negative_only=True) for t, c in parts)
                                       + ") AS x"),
                         drivers=tuple(t for t, _ in parts), skip="all", note="facts that lost a derivation")
        lost_old = self._lookup_facts(ctx, st, lost)
        d0 = ctx.query("rlost", parse(f"SELECT DISTINCT {columns(n, 'x')}, 1 AS {q(WEIGHT)} FROM {q(lost)} AS x "
                                      f"WHERE EXISTS (SELECT 1 FROM {q(lost_old)} AS o WHERE {same(n, 'x', 'o')})"),
                       drivers=(lost,), note="... of them, facts of R_old")
        over_deleted, derived_from_deleted = self._closure(ctx, d0, outside=None, note="over-delete")
        touched = ctx.query("rtouch", parse(f"SELECT {columns(n, 't')} FROM {q(total)} AS t UNION "
                                            f"SELECT {columns(n, 'd')} FROM {q(over_deleted)} AS d"),
                            drivers=(total,), note="facts whose support changed")
        touched_old = self._lookup_facts(ctx, st, touched)
        n0 = ctx.query("rderive", self._derivable_sql(touched, touched_old, total, derived_from_deleted,
                                                       over_deleted), drivers=(touched,),
                       note="re-derived or new facts: derivable from R_old - D")
        inserted, derived_from_inserted = self._closure(ctx, n0, outside=over_deleted, note="re-derive and insert")
        return self._apply(ctx, total, over_deleted, derived_from_deleted, inserted, derived_from_inserted)

    def _lookup_facts(self, ctx: Context, state: str, probe: str, positions: bool = False) -> str:
        out = ctx.temp("rfacts")
        ctx.emit(Lookup(out=out, relation=state, index=self.names, probe=probe, probe_columns=self.names,
                        positions=positions, note="stored facts and their derivation counts"))
        return out

    def _closure(self, ctx: Context, start: str, outside: str | None, note: str) -> tuple[str, str]:
        """Close ``start`` under step': (all facts reached, derivation counts of all rounds).

        Without ``outside``: only facts of R_old are followed (over-deletion).
        With it (the over-deleted facts D): only facts not in R_old - D.
        """
        n, st = self.names, state_name(ctx, self.node.ref)
        frontier, reached, counts = ctx.temp("rF"), ctx.temp("rR"), ctx.temp("rS")
        body, heads = self._round(ctx, frontier)
        mark = len(ctx.program.steps)
        old = self._lookup_facts(ctx, st, heads)
        in_old = f"EXISTS (SELECT 1 FROM {q(old)} AS o WHERE {same(n, 'h', 'o')})"
        if outside is None:
            keep = in_old
        else:
            keep = f"(NOT {in_old} OR EXISTS (SELECT 1 FROM {q(outside)} AS d WHERE {same(n, 'h', 'd')}))"
        new = ctx.query("rnext", parse(
            f"SELECT DISTINCT {columns(n, 'h')}, 1 AS {q(WEIGHT)} FROM {q(heads)} AS h WHERE {keep} "
            f"AND NOT EXISTS (SELECT 1 FROM {q(reached)} AS r WHERE {same(n, 'h', 'r')})"),
            drivers=(heads,), pinned=True, note="facts reached for the first time")
        grown = ctx.query("rgrow", parse(f"SELECT * FROM {q(reached)} UNION ALL SELECT * FROM {q(new)}"),
                          drivers=(), pinned=True, note="facts reached so far")
        body = body + ctx.program.steps[mark:]
        del ctx.program.steps[mark:]
        self._loop(ctx, {frontier: start, reached: start}, body, {frontier: new, reached: grown}, new,
                   {counts: heads}, note)
        return reached, counts

    def _derivable_sql(self, touched: str, touched_old: str, total: str, derived: str, deleted: str) -> exp.Expression:
        n = self.names
        sums = consolidate(f"{q(derived)} AS s", n, table="s", keep=EVERY, name="w", cast=False)
        return parse(f"""
            WITH sd AS ({sums})
            SELECT {columns(n, 't')}, 1 AS {q(WEIGHT)}
            FROM {q(touched)} AS t
            LEFT JOIN {q(touched_old)} AS o ON {same(n, 't', 'o')}
            LEFT JOIN {q(total)} AS c ON {same(n, 't', 'c')}
            LEFT JOIN sd ON {same(n, 't', 'sd')}
            WHERE COALESCE(o.{q(CNT)}, 0) + COALESCE(c.{q(WEIGHT)}, 0) - COALESCE(sd.w, 0) > 0
              AND (o.{q(CNT)} IS NULL OR EXISTS (SELECT 1 FROM {q(deleted)} AS d WHERE {same(n, 't', 'd')}))
        """)

    def _apply(self, ctx: Context, total: str, deleted: str, from_deleted: str, inserted: str,
               from_inserted: str) -> str:
        """New counts and membership of every touched fact; the fixpoint's change."""
        n, st = self.names, state_name(ctx, self.node.ref)
        everything = ctx.query("rall", parse(" UNION ".join(
            f"SELECT {columns(n, 'x')} FROM {q(t)} AS x" for t in (total, deleted, from_deleted, inserted,
                                                                     from_inserted))),
            drivers=(total,), note="every fact whose count or membership may change")
        old = self._lookup_facts(ctx, st, everything, positions=True)

        def summed(t: str) -> str:
            return f"({consolidate(f'{q(t)} AS x', n, table='x', keep=EVERY, name='w', cast=False)})"

        def member(t: str) -> str:
            return f"EXISTS (SELECT 1 FROM {q(t)} AS m WHERE {same(n, 'a', 'm')})"

        was = f"(o.{q(CNT)} IS NOT NULL)"
        now = f"(({was} AND NOT {member(deleted)}) OR {member(inserted)})"
        new = ctx.query("rnew", parse(f"""
            SELECT {columns(n, 'a')},
                CAST(COALESCE(o.{q(CNT)}, 0) + COALESCE(c.{q(WEIGHT)}, 0) - COALESCE(sd.w, 0)
                     + COALESCE(si.w, 0) AS BIGINT) AS {q(CNT)},
                CAST(1 AS BIGINT) AS {q(WEIGHT)}, {now} AS {q(KEEP)},
                CAST({now} AS INTEGER) - CAST({was} AS INTEGER) AS {q(CHANGE)},
                o.{q(RUN)} AS {q(RUN)}, o.{q(POS)} AS {q(POS)}
            FROM {q(everything)} AS a
            LEFT JOIN {q(old)} AS o ON {same(n, 'a', 'o')}
            LEFT JOIN {q(total)} AS c ON {same(n, 'a', 'c')}
            LEFT JOIN {summed(from_deleted)} AS sd ON {same(n, 'a', 'sd')}
            LEFT JOIN {summed(from_inserted)} AS si ON {same(n, 'a', 'si')}
        """), drivers=(everything,), note="new derivation counts and membership")
        ctx.replace(Replace(relation=st, deletes=new, inserts=new, keep=KEEP))
        return ctx.query("rdelta", parse(f"SELECT {columns(n, 'x')}, x.{q(CHANGE)} AS {q(WEIGHT)} "
                                         f"FROM {q(new)} AS x WHERE x.{q(CHANGE)} <> 0"),
                         drivers=(new,), note="facts that appeared or vanished")

    # --- reads: OLD = the stored fixpoint (state_reads.py) -------------------------
    def state(self, ctx: Context) -> str:
        return state_name(ctx, self.node.ref)


@rule_for(RecursiveRef)
class RecursiveRefRule(StateRule):
    """The recursive CTE read inside its own step: reads give R_old; δ(ref) = 0, or the round's frontier.

    Its delta is None where U is computed (R held at R_old); inside the
    rounds the compiler supplies the round's frontier as its delta, which
    reads of R_old do not add (``adds_delta``).
    """

    looked_up, rows_note = "R_old", "R_old rows"
    adds_delta = False

    def __init__(self, node: RecursiveRef):
        self.node = node

    def delta(self, ctx: Context) -> str | None:
        return None

    def states(self, ctx: Context) -> list[StateSpec]:
        return []

    def state(self, ctx: Context) -> str:
        return state_name(ctx, self.node)
