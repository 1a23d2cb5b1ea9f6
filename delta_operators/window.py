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
from delta_operators.partition_reads import KEEP, PartitionedRowsReads, Steps
from delta_operators.rule import Context, rule_for
from delta_operators.sqltext import columns, expand, parse, q, same
from storage.zset import POS, PRESENT, RUN, WEIGHT, consolidate, counted, negate


@rule_for(Window)
class WindowRule(PartitionedRowsReads):
    """δ(window X) = window(X_new|T) − W|T, T = the partitions δX touches, X_new|T = input part of W|T + δX."""

    looked_up = rows_note = "window rows"
    role, whole = "input rows with their window values", " (one partition)"
    steps = Steps("wparts", "partitions the change touches", "wold", "stored rows of touched partitions",
                  "window", "touched partitions: old rows out, recomputed rows in",
                  "wdelta", "rows whose window values changed")

    def __init__(self, node: Window):
        self.node = node
        self.inputs = node.input.column_names
        self.names = node.column_names
        self.partition = node.partition

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, "window")

    def _recompute_sql(self, delta_in: str, touched: str, old: str) -> exp.Expression:
        """Old rows of touched partitions (weight negated, with RUN/POS) and their recomputation."""
        inputs, names = self.inputs, self.names
        calls = ", ".join(f"{call.sql('duckdb')} AS {q(name)}" for name, call in self.node.calls)
        in_touched = f"EXISTS (SELECT 1 FROM {q(touched)} AS t WHERE {same(self.partition, 't', 'o')})"
        both = (f"(SELECT {columns(inputs, 'o')}, o.{q(WEIGHT)} FROM o "
                f"UNION ALL SELECT {columns(inputs, 'd')}, d.{q(WEIGHT)} FROM {q(delta_in)} AS d) AS u")
        return parse(f"""
            WITH o AS (SELECT o.* FROM {q(old)} AS o WHERE {in_touched}),
            n AS ({consolidate(both, inputs, table='u', keep=PRESENT)}),
            x AS ({expand('n', inputs)}),
            r AS (SELECT {columns(inputs, WINDOW_INPUT)}, {calls} FROM x AS {q(WINDOW_INPUT)})
            SELECT {columns(names, 'r')}, {counted()}, TRUE AS {q(KEEP)},
                   CAST(NULL AS INTEGER) AS {q(RUN)}, CAST(NULL AS BIGINT) AS {q(POS)}
            FROM r GROUP BY {columns(names, 'r')}
            UNION ALL
            SELECT {columns(names, 'o')}, {negate('o')}, FALSE, o.{q(RUN)}, o.{q(POS)} FROM o
        """)
