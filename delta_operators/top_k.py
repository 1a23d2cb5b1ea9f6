"""ORDER BY … LIMIT k OFFSET n: the rows at sort positions n+1 … n+k.

Contract: as many rows as the input has at those positions (all rows after
position n without LIMIT); among rows tied on the ORDER BY at a boundary any
choice is correct. A row of weight w occupies w consecutive positions.

Incremental rule. The state B is a *buffer*: a prefix of the input in sort
order, B = {r ∈ X : key(r) ≤ T} (ties at T included), holding at least
need = n + k rows unless it holds all of X ("complete"). Each row of B also
stores how many of its copies are in the output (wout). For a change δX:

    B' = B + δX|key ≤ T                   (all of δX when complete)
    if |B'| < need and not complete:      B' = the first M rows of X_new (refill)
    if |B'| > 2M:                         B' = rows of B' ranked ≤ M (trim)
    wout'(r) = copies of r at positions n+1 … n+k in B' (earlier-chosen ties first)
    δ(top X) = Σ_r (wout'(r) - wout(r)) · r

Rows of δX after T cannot change the output. Only a refill reads the whole
input (an index-free top-M over X_new); it happens when more than M - need
rows of the buffer were deleted since the last refill or trim, with
M = need + max(need, 100). Everything else works on |B| + |δX| rows.
Without LIMIT, the output is X minus the first n rows: δX - δ(top n).
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Column, Source, TopK
from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.rule import NEW, OLD, Context, rule_for
from delta_operators.sqltext import columns, order_by, parse, q, same, sorts_before_or_with
from delta_operators.sqltree import select_columns, union_all
from delta_operators.state_reads import StateRule
from storage.zset import POS, PRESENT, RUN, WEIGHT, consolidate

WOUT = "__wout"  # copies of the row in the output
COMPLETE = "__complete"  # the buffer holds the whole input
KEEP = "__keep"
WOLD = "__tk_wold"


# Rows the buffer holds beyond LIMIT + OFFSET (deletions it absorbs before a
# refill): max(need, 100) unless set (the oracle sets it tiny to force refills).
SLACK: int | None = None


def buffer_size(need: int) -> int:
    return need + (max(need, 100) if SLACK is None else SLACK)


@rule_for(TopK)
class TopKRule(StateRule):
    """B' = B + δX|key ≤ T (refilled or trimmed to M..2M rows),  δ(top X) = Σ_r (wout'(r) − wout(r)) · r."""

    def __init__(self, node: TopK):
        self.node = node
        self.names = node.input.column_names
        self.keys = node.order
        # Without LIMIT the rule tracks the first OFFSET rows and outputs the rest.
        self.complement = node.limit is None
        self.need = node.offset + (node.limit or 0)
        self.size = buffer_size(self.need)

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "topk")

    def states(self, ctx: Context) -> list[StateSpec]:
        cols = self.node.input.columns + (Column(WOUT, "BIGINT"), Column(COMPLETE, "BOOLEAN"))
        order = ", ".join(k.sql() for k in self.keys)
        return [StateSpec(name=self.state(ctx), columns=cols, identity=(),
                          role=f"buffer: the first {self.size}..{2 * self.size} input rows by ({order}), "
                               "each with its copies in the output")]

    # --- delta ------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        delta_in = ctx.delta(self.node.input)
        if delta_in is None:
            return None
        old = ctx.temp("tkold")
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=(), probe=delta_in, probe_columns=(),
                        positions=True, note="the buffer"))
        entering = ctx.query("tkin", self._entering_sql(delta_in, old), drivers=(delta_in,), pinned=True,
                             note="changed rows that sort into the buffer (none: nothing else runs)")
        candidates = ctx.query("tkcand", self._candidates_sql(entering, old), drivers=(entering,),
                               note="buffer plus the changes that sort into it")
        need = ctx.query("tkneed", self._need_sql(old, candidates), drivers=(entering,),
                         note="refill needed? (buffer shorter than LIMIT + OFFSET)", pinned=True)
        refill = ctx.query("tkrefill", self._refill_sql(ctx, need), drivers=(need,), pinned=True,
                           note=f"refill: the first {self.size} rows of the input (scans it)")
        new = ctx.query("tknew", self._new_buffer_sql(old, candidates, refill), drivers=(entering,),
                        note="new buffer and output copies per row")
        ctx.replace(Replace(relation=self.state(ctx), deletes=new, inserts=new, keep=KEEP))
        change = f"n.{q(WOUT)} - n.{q(WOLD)}"
        out = f"SELECT {columns(self.names, 'n')}, {change} AS {q(WEIGHT)} FROM {q(new)} AS n WHERE {change} <> 0"
        if self.complement:
            out = (f"SELECT {columns(self.names, 'd')}, d.{q(WEIGHT)} FROM {q(delta_in)} AS d "
                   f"UNION ALL SELECT {columns(self.names, 'n')}, -({change}) FROM {q(new)} AS n WHERE {change} <> 0")
            return ctx.query("topk", parse(out), drivers=(delta_in, new), skip="all",
                             note="output rows gained and lost")
        return ctx.query("topk", parse(out), drivers=(new,), note="output rows gained and lost")

    def _entering_sql(self, delta_in: str, old: str) -> exp.Expression:
        """Rows of δX with key ≤ T, the buffer's last key (all of δX when the buffer is complete)."""
        c, k = self.names, [key.column for key in self.keys]
        return parse(f"""
            WITH last AS (SELECT {columns(k, 'b')} FROM {q(old)} AS b
                          ORDER BY {order_by(self.keys, 'b', reverse=True)} LIMIT 1),
            st AS (SELECT COALESCE(BOOL_AND(b.{q(COMPLETE)}), TRUE) AS __tk_complete FROM {q(old)} AS b)
            SELECT {columns(c, 'd')}, d.{q(WEIGHT)}
            FROM {q(delta_in)} AS d CROSS JOIN st LEFT JOIN last AS t ON TRUE
            WHERE st.__tk_complete OR {sorts_before_or_with(self.keys, 'd', 't')}
        """)

    def _candidates_sql(self, entering: str, old: str) -> exp.Expression:
        """B + δX|key ≤ T: per row its new buffer weight and old output copies."""
        c = self.names
        return parse(f"""
            SELECT {columns(c, 'u')}, CAST(SUM(u.__tk_w) AS BIGINT) AS {q(WEIGHT)},
                   CAST(SUM(u.__tk_wold) AS BIGINT) AS {q(WOLD)}
            FROM (SELECT {columns(c, 'b')}, b.{q(WEIGHT)} AS __tk_w, b.{q(WOUT)} AS __tk_wold FROM {q(old)} AS b
                  UNION ALL
                  SELECT {columns(c, 'd')}, d.{q(WEIGHT)}, 0 FROM {q(entering)} AS d) AS u
            GROUP BY {columns(c, 'u')}
            HAVING SUM(u.__tk_w) <> 0 OR SUM(u.__tk_wold) <> 0
        """)

    def _need_sql(self, old: str, candidates: str) -> exp.Expression:
        return parse(f"""
            SELECT TRUE AS __tk_need
            FROM (SELECT COALESCE(BOOL_AND(b.{q(COMPLETE)}), TRUE) AS __tk_complete FROM {q(old)} AS b) AS m,
                 (SELECT COALESCE(SUM(c.{q(WEIGHT)}), 0) AS __tk_n FROM {q(candidates)} AS c) AS s
            WHERE NOT m.__tk_complete AND s.__tk_n < {self.need}
        """)

    def _refill_sql(self, ctx: Context, need: str) -> exp.Expression:
        """The first M rows of X_new and every row tied with the M-th; complete when fewer.

        Empty unless ``need`` has a row (the engine skips it then; the check
        keeps it right on a program's first run, which always runs).
        """
        c, k = self.names, [key.column for key in self.keys]
        scan = ctx.rule(self.node.input).scan(ctx, NEW).sql("duckdb")
        stored = isinstance(self.node.input, Source) and self.node.input.kind == "table"
        rows = (f"SELECT * FROM ({scan}) AS x" if stored else  # a table's stored rows are consolidated
                consolidate(f"({scan}) AS x", c, table="x", keep=PRESENT))
        return parse(f"""
            WITH s AS ({rows}),
            top AS (SELECT * FROM s ORDER BY {order_by(self.keys, 's')} LIMIT {self.size}),
            last AS (SELECT * FROM top ORDER BY {order_by(self.keys, 'top', reverse=True)} LIMIT 1),
            rows AS (SELECT {columns(c, 'top')}, top.{q(WEIGHT)} FROM top
                     UNION
                     SELECT {columns(c, 's')}, s.{q(WEIGHT)} FROM s JOIN last ON {same(k, 's', 'last')})
            SELECT rows.*, (SELECT COUNT(*) FROM top) < {self.size} AS {q(COMPLETE)} FROM rows
            WHERE EXISTS (SELECT 1 FROM {q(need)} AS __tk_need)
        """)

    def _new_buffer_sql(self, old: str, candidates: str, refill: str) -> exp.Expression:
        """Per row: new buffer weight, output copies before and after, whether it stays buffered."""
        c, size, need = self.names, self.size, self.need
        keys = [k.column for k in self.keys]
        # Output positions [lo, hi); without LIMIT the rule tracks the first OFFSET rows instead.
        lo, hi = (0, self.node.offset) if self.complement else (self.node.offset, need)
        return parse(f"""
            WITH c AS (SELECT * FROM {q(candidates)}),
            rf AS (SELECT * FROM {q(refill)}),
            st AS (SELECT COALESCE(BOOL_AND(b.{q(COMPLETE)}), TRUE) AS __tk_complete FROM {q(old)} AS b),
            flag AS (SELECT COUNT(*) > 0 AS __tk_refilled, COALESCE(BOOL_AND(rf.{q(COMPLETE)}), TRUE) AS __tk_complete FROM rf),
            nb AS (SELECT {columns(c, 'rf')}, rf.{q(WEIGHT)} FROM rf
                   UNION ALL
                   SELECT {columns(c, 'c')}, c.{q(WEIGHT)} FROM c CROSS JOIN flag
                   WHERE c.{q(WEIGHT)} > 0 AND NOT flag.__tk_refilled),
            joined AS (SELECT nb.*, COALESCE(o.{q(WOLD)}, 0) AS __tk_wold
                       FROM nb LEFT JOIN c AS o ON {same(c, 'nb', 'o')}),
            ranked AS (
                SELECT joined.*,
                    CAST(SUM(joined.{q(WEIGHT)}) OVER (ORDER BY {order_by(self.keys, 'joined')}, joined.__tk_wold > 0 DESC
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                      - joined.{q(WEIGHT)} AS BIGINT) AS __tk_start
                FROM joined),
            total AS (SELECT COALESCE(SUM(nb.{q(WEIGHT)}), 0) AS __tk_total FROM nb),
            boundary AS (SELECT {columns(keys, 'ranked')} FROM ranked
                         WHERE ranked.__tk_start < {size} AND ranked.__tk_start + ranked.{q(WEIGHT)} >= {size})
            SELECT {columns(c, 'ranked')}, ranked.{q(WEIGHT)},
                GREATEST(0, LEAST(ranked.__tk_start + ranked.{q(WEIGHT)}, {hi}) - GREATEST(ranked.__tk_start, {lo}))
                  AS {q(WOUT)},
                ranked.__tk_wold AS {q(WOLD)},
                total.__tk_total <= {2 * size} OR {sorts_before_or_with(self.keys, 'ranked', 'boundary')} AS {q(KEEP)},
                CASE WHEN flag.__tk_refilled THEN flag.__tk_complete ELSE st.__tk_complete AND total.__tk_total <= {2 * size} END
                  AS {q(COMPLETE)},
                o.{q(RUN)}, o.{q(POS)}
            FROM ranked CROSS JOIN flag CROSS JOIN st CROSS JOIN total LEFT JOIN boundary ON TRUE
            LEFT JOIN {q(old)} AS o ON {same(c, 'ranked', 'o')}
            UNION ALL
            SELECT {columns(c, 'x')}, 0, 0, COALESCE(c.{q(WOLD)}, 0), FALSE, FALSE, o.{q(RUN)}, o.{q(POS)}
            FROM (SELECT {columns(c, 'c')} FROM c WHERE c.{q(WOLD)} > 0
                  UNION SELECT {columns(c, 'o')} FROM {q(old)} AS o) AS x
            LEFT JOIN c ON {same(c, 'x', 'c')}
            LEFT JOIN {q(old)} AS o ON {same(c, 'x', 'o')}
            WHERE NOT EXISTS (SELECT 1 FROM nb WHERE {same(c, 'nb', 'x')})
        """)

    # --- reads: OLD = the output copies of the stored buffer (state_reads.py) ------------
    def rows(self, ctx: Context, source: str) -> exp.Expression:
        """The buffer's output copies; without LIMIT, the input (OLD) minus them."""
        def wout() -> exp.Column:
            return exp.column(WOUT, source, quoted=True)

        if self.complement:
            rest = ctx.rule(self.node.input).scan(ctx, OLD)
            return union_all([rest, select_columns(source, self.node.columns, exp.Neg(this=wout()))])
        return select_columns(source, self.node.columns, wout()).where(
            exp.GT(this=wout(), expression=exp.Literal.number(0)))

    def can_lookup(self, ctx: Context, columns_: tuple[str, ...]) -> bool:
        return False  # joins read the (small) output by scan

    def lookup(self, ctx, columns_, probe, probe_columns, mode):  # noqa: ANN001
        return None
