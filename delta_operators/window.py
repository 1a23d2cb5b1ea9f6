"""Window functions, recomputed for the partitions a change touches.

Contract: every input row, extended by the value of each window call; a row
of weight w counts as w rows (ROW_NUMBER numbers each copy). Rows tied in a
call's ORDER BY may get their values in any order, as in SQL.

Incremental rule. A row's window values depend only on the rows of its
partition P (the PARTITION BY columns every call shares). The state W holds
the node's output rows (input row + window values, with weights), indexed by
P. For the partitions T touched by δX:

    δ(window X) = window(X_new|T) - W|T       X_new|T = input part of W|T + δX

so only rows of touched partitions are read (one index lookup), recomputed
in SQL and rewritten; W|T is replaced by window(X_new|T). Without PARTITION
BY the whole input is one partition.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import WINDOW_INPUT, Window
from delta_operators.compiler import Context
from delta_operators.partition_reads import PartitionedRowsReads
from delta_operators.program import Lookup, Replace, StateSpec
from delta_operators.sqltext import columns, expand, parse, q, same
from delta_operators.zset import POS, RUN, WEIGHT, consolidate_sql

KEEP = "__keep"
ALL = "__all"  # probe column when the whole input is one partition


class WindowRule(PartitionedRowsReads):
    what = "window rows"

    def __init__(self, node: Window):
        self.node = node
        self.inputs = node.input.column_names
        self.names = node.column_names
        self.partition = node.partition

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "window")

    def states(self, ctx: Context) -> list[StateSpec]:
        role = "input rows with their window values" + ("" if self.partition else " (one partition)")
        return [StateSpec(name=self.state(ctx), columns=self.node.columns, identity=(),
                          indexes=(self.partition,) if self.partition else (), role=role)]

    # --- delta ------------------------------------------------------------
    def delta(self, ctx: Context) -> str | None:
        delta_in = ctx.delta(self.node.input)
        if delta_in is None:
            return None
        if self.partition:
            touched_sql = parse(f"SELECT DISTINCT {columns(self.partition, 'd', as_names=True)} FROM {q(delta_in)} AS d")
        else:
            touched_sql = parse(f"SELECT TRUE AS {q(ALL)} FROM {q(delta_in)} LIMIT 1")
        touched = ctx.query("wparts", touched_sql, drivers=(delta_in,), note="partitions the change touches",
                            transparent=bool(self.partition))
        old = ctx.temp("wold")
        ctx.emit(Lookup(out=old, relation=self.state(ctx), index=self.partition, probe=touched,
                        probe_columns=self.partition or (ALL,), positions=True,
                        note="stored rows of touched partitions"))
        wide = ctx.query("window", self._recompute_sql(delta_in, touched, old), drivers=(delta_in,),
                         note="touched partitions: old rows out, recomputed rows in")
        ctx.replace(Replace(relation=self.state(ctx), deletes=wide, inserts=wide, keep=KEEP))
        return ctx.query("wdelta", consolidate_sql(wide, self.names), drivers=(wide,),
                         note="rows whose window values changed")

    def _recompute_sql(self, delta_in: str, touched: str, old: str) -> exp.Expression:
        """Old rows of touched partitions (weight negated, with RUN/POS) and their recomputation."""
        inputs, names = self.inputs, self.names
        calls = ", ".join(f"{call.sql('duckdb')} AS {q(name)}" for name, call in self.node.calls)
        in_touched = f"EXISTS (SELECT 1 FROM {q(touched)} AS t WHERE {same(self.partition, 't', 'o')})"
        return parse(f"""
            WITH o AS (SELECT o.* FROM {q(old)} AS o WHERE {in_touched}),
            n AS (
                SELECT {columns(inputs, 'u')}, CAST(SUM(u.{q(WEIGHT)}) AS BIGINT) AS {q(WEIGHT)}
                FROM (SELECT {columns(inputs, 'o')}, o.{q(WEIGHT)} FROM o
                      UNION ALL SELECT {columns(inputs, 'd')}, d.{q(WEIGHT)} FROM {q(delta_in)} AS d) AS u
                GROUP BY {columns(inputs, 'u') or 'ALL'} HAVING SUM(u.{q(WEIGHT)}) > 0),
            x AS ({expand('n', inputs)}),
            r AS (SELECT {columns(inputs, WINDOW_INPUT)}, {calls} FROM x AS {q(WINDOW_INPUT)})
            SELECT {columns(names, 'r')}, COUNT(*) AS {q(WEIGHT)}, TRUE AS {q(KEEP)},
                   CAST(NULL AS INTEGER) AS {q(RUN)}, CAST(NULL AS BIGINT) AS {q(POS)}
            FROM r GROUP BY {columns(names, 'r')}
            UNION ALL
            SELECT {columns(names, 'o')}, -o.{q(WEIGHT)}, FALSE, o.{q(RUN)}, o.{q(POS)} FROM o
        """)
