"""SESSION windows, recomputed for the sessions a change touches.

Contract (sql_frontend/session_windows.py): every input row with a non-NULL
time ``ts``, with the ``window_start``/``window_end`` of its session: per key
K, the events whose windows ``[ts, ts + gap)`` chain into one overlapping run;
``window_start = MIN(ts)``, ``window_end = MAX(ts) + gap``. A row of weight w
counts as w rows.

Incremental rule. Sessions of one key are disjoint, maximal intervals; an
input row at ``t`` can only join (insert) or split (delete) a session S of its
key whose interval meets its own window:

    touches(S, t)  =  S.window_start < t + gap  AND  S.window_end > t

(a deleted row lies inside its session, which then touches it). Sessions that
touch no row of δX keep their rows and bounds: they are separated from every
changed row by a gap, so no chain runs through them. The state W holds the
node's output rows (input row + bounds, with weights), indexed by K. With T =
the sessions of W touching some row of δX (same key):

    δ(session X) = session(rows(T) + δX) - T

``session`` is the batch gaps-and-islands SQL over the touched rows only; the
result's sessions are closed under the rule (merges chain only through
changed rows, which are all in the recomputation). W|T is replaced by the
recomputed rows. Work: one index lookup of the changed keys' stored rows, and
SQL over the touched sessions. With ``late = 'drop'`` over a watermarked
stream, rows of sessions the watermark W has passed (``window_end <= W``:
every later event has ``ts >= W``, so touches no such session) are dropped
from W after each batch (ivm/streams/event_time.py), so a key's stored rows are those
of its open sessions, not its history.

Cost: the rows of the touched sessions, not of the stream, but all of
them: an event that extends a session moves its window_end, so every row
of that session is retracted and inserted again (the output is per event).
Long sessions (Nexmark q11's active bidders) make that most of the open
state per batch; a session aggregate fused into this operator (per-session
partial aggregates, combined on merge) would make it per changed session.
"""

from __future__ import annotations

from sqlglot import exp

from sql_frontend.plan import Session
from sql_frontend.session_windows import gap_sql, islands_sql
from delta_operators.partition_reads import KEEP, PartitionedRowsReads, Steps
from delta_operators.rule import Context, rule_for
from delta_operators.sqltext import columns, parse, q, same
from storage.zset import POS, PRESENT, RUN, WEIGHT, consolidate, negate
STATE = "session"  # the state's role in its name (ivm/streams/event_time.py finds it by this)


@rule_for(Session)
class SessionRule(PartitionedRowsReads):
    """δ(session X) = session(rows(T) + δX) − T, T = the stored sessions that meet a row of δX."""

    looked_up = rows_note = "session rows"
    role, whole = "input rows with their session bounds", " (one sequence)"
    steps = Steps("skeys", "session keys the change touches", "sold", "stored rows of the changed keys' sessions",
                  "session", "touched sessions: old rows out, recomputed rows in",
                  "sdelta", "rows whose session changed")

    def __init__(self, node: Session):
        self.node = node
        self.inputs = node.input.column_names
        self.names = node.column_names
        self.keys = self.partition = node.keys

    def state(self, ctx: Context) -> str:
        return ctx.state_name(self.node, STATE)

    def _recompute_sql(self, delta_in: str, touched: str, old: str) -> exp.Expression:
        """Rows of touched sessions (weight negated, with RUN/POS) and their recomputation."""
        inputs, names, t = self.inputs, self.names, q(self.node.time)
        gap = gap_sql(self.node.gap_us)
        touches = (f"EXISTS (SELECT 1 FROM {q(delta_in)} AS d WHERE {same(self.keys, 'd', 'o')} "
                   f"AND o.window_start < d.{t} + {gap} AND o.window_end > d.{t})")
        both = (f"(SELECT {columns(inputs, 'o')}, o.{q(WEIGHT)} FROM o "
                f"UNION ALL SELECT {columns(inputs, 'd')}, d.{q(WEIGHT)} FROM {q(delta_in)} AS d) AS u")
        rows = parse(consolidate(both, inputs, table="u", keep=PRESENT))
        sessions = islands_sql(rows, list(inputs) + [WEIGHT], self.keys, self.node.time, self.node.gap_us)
        return parse(f"""
            WITH o AS (SELECT o.* FROM {q(old)} AS o WHERE {touches}),
            r AS ({sessions.sql('duckdb')})
            SELECT {columns(names, 'r')}, r.{q(WEIGHT)}, TRUE AS {q(KEEP)},
                   CAST(NULL AS INTEGER) AS {q(RUN)}, CAST(NULL AS BIGINT) AS {q(POS)}
            FROM r
            UNION ALL
            SELECT {columns(names, 'o')}, {negate('o')}, FALSE, o.{q(RUN)}, o.{q(POS)} FROM o
        """)
