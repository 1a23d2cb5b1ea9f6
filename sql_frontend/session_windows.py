"""SESSION windows in FROM: ``SESSION(t, ts, INTERVAL gap [, key, …])``.

Contract. The table ``t`` with two more columns, ``window_start`` and
``window_end``: every row of ``t`` whose ``ts`` is not NULL, once, with the
session it belongs to. As in Flink, each event opens the window ``[ts, ts +
gap)`` and windows that overlap merge, per value of the optional key columns
(Flink's ``PARTITION BY``): two events of one key are in the same session
exactly when a chain of that key's events, each less than ``gap`` after the
previous one, links them. A session's ``window_start`` is its first ``ts``,
its ``window_end`` its last ``ts`` + gap. Without key columns every event of
``t`` is in one sequence.

``SESSION`` is a keyword to sqlglot, so ``quote_session_calls`` quotes it in
the statement text before parsing (only where it is called in FROM). The call
expands (``expand_session``) into a derived table whose body is the batch
"gaps and islands" SQL (``islands_sql``): DuckDB's binder, ad-hoc reads and
the planner's checks read it as plain SQL, and the builder recognises it by
the alias ``__session_<gap µs>`` of its inner table and plans a ``Session``
node over ``t`` instead (``session_call``), which ``delta_operators/session.py``
maintains. Rows with a NULL ``ts`` are in no session (stream tables have a
NOT NULL event time).

Incremental rule: see ``delta_operators/session.py`` (recompute the sessions
a change touches, as a Z-set difference).

>>> quote_session_calls("SELECT * FROM SESSION(b, ts, INTERVAL '1' MINUTE) AS s -- SESSION(")
'SELECT * FROM "SESSION"(b, ts, INTERVAL \\'1\\' MINUTE) AS s -- SESSION('
"""

from __future__ import annotations

from typing import Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

from sql_frontend.errors import BindError, SqlSyntaxError, UnknownObjectError

USAGE = "SESSION(table, time_column, INTERVAL gap [, key_column, …])"
MARK = "__session_"  # alias prefix of the inner derived table of an expanded SESSION
NEW, SID = "__new", "__sid"  # helper columns of the islands SQL (names users cannot write)

Schema = Mapping[str, Mapping[str, str]]


def quote_session_calls(sql: str) -> str:
    """``"SESSION"(`` for every ``SESSION(`` token (not inside strings or comments)."""
    try:
        tokens = sqlglot.Tokenizer().tokenize(sql)
    except sqlglot.errors.TokenError:
        return sql  # the parser reports the error
    spans = [t for t, n in zip(tokens, tokens[1:]) if t.token_type == TokenType.SESSION and n.token_type == TokenType.L_PAREN]
    for token in reversed(spans):
        sql = sql[:token.start] + '"SESSION"' + sql[token.end + 1:]
    return sql


def expand_session(call: exp.Table, schema: Schema, source_of, time_column_of, interval_of) -> exp.Subquery:
    """The derived table of one ``SESSION(…)`` call (argument checks shared with TUMBLE/HOP)."""
    args = call.this.expressions
    if len(args) < 3:
        raise SqlSyntaxError(f"SESSION takes at least 3 arguments: {USAGE}")
    source = source_of("SESSION", args[0], schema)
    time = time_column_of("SESSION", args[1], args[0], schema)
    if schema[source][time].upper() != "TIMESTAMP":
        raise BindError(f"SESSION: the time column {source}.{time} must be a TIMESTAMP, not {schema[source][time]}")
    _, gap_us = interval_of("SESSION", args[2])
    keys = [_key(a, source, schema) for a in args[3:]]
    if len(set(keys)) != len(keys):
        raise BindError(f"SESSION({source}, …) names a key column twice")
    clash = [c for c in ("window_start", "window_end") if c in schema[source]]
    if clash:
        raise BindError(f"SESSION({source}, …) adds a column {clash[0]}, which {source} already has")
    names = list(schema[source])
    inner = islands_sql(exp.to_table(source), names, keys, time, gap_us)
    body = exp.select(*[exp.column(n, table=MARK + str(gap_us), quoted=True) for n in names + ["window_start", "window_end"]])
    body = body.from_(inner.subquery(MARK + str(gap_us), copy=False))
    return exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(call.alias or source)))


def _key(arg: exp.Expression, source: str, schema: Schema) -> str:
    if not isinstance(arg, exp.Column) or arg.table:
        raise SqlSyntaxError(f"SESSION key columns must be columns of {source}: {USAGE}; got {arg.sql('duckdb')}")
    name = arg.name.lower()
    if name not in schema[source]:
        raise UnknownObjectError(f"SESSION: {source} has no column {name}")
    return name


def gap_sql(gap_us: int) -> str:
    return f"TO_MICROSECONDS(CAST({gap_us} AS BIGINT))"


def islands_sql(source: exp.Expression, names: Sequence[str], keys: Sequence[str], time: str,
                gap_us: int) -> exp.Select:
    """``SELECT *, window_start, window_end`` of every non-NULL-time row of ``source`` (a table or a query).

    Gaps and islands: a row starts a session when the previous row of its key
    is ``gap`` or more before it; the running count of starts numbers the
    sessions; a session's bounds are its MIN and MAX(ts) + gap. Rows tied on
    ``ts`` may come in any order, and differently in the two windows: the
    count runs over a RANGE frame, so it includes all of a row's ties (at
    most one of which, whichever LAG saw first, can start a session) and
    every tie gets the same session.
    """
    def quoted(n: str) -> str:
        return '"' + n.replace('"', '""') + '"'

    by = ", ".join(quoted(k) for k in keys)
    part = f"PARTITION BY {by} " if keys else ""
    t, gap = quoted(time), gap_sql(gap_us)
    cols = ", ".join(quoted(n) for n in names)
    text = f"""
        SELECT {cols}, MIN({t}) OVER (PARTITION BY {by + ', ' if keys else ''}{SID}) AS window_start,
               MAX({t}) OVER (PARTITION BY {by + ', ' if keys else ''}{SID}) + {gap} AS window_end
        FROM (SELECT {cols}, SUM({NEW}) OVER ({part}ORDER BY {t} RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                     AS {SID}
              FROM (SELECT {cols}, CASE WHEN {t} - LAG({t}) OVER ({part}ORDER BY {t}) < {gap} THEN 0 ELSE 1 END
                           AS {NEW}
                    FROM __src WHERE {t} IS NOT NULL) AS __s1) AS __s2"""
    select = sqlglot.parse_one(text, dialect="duckdb")
    if isinstance(source, exp.Table):
        source = exp.Table(this=source.this.copy(), alias=exp.TableAlias(this=exp.to_identifier("__src")))
    else:
        source = exp.Subquery(this=source.copy(), alias=exp.TableAlias(this=exp.to_identifier("__src")))
    for table in list(select.find_all(exp.Table)):
        if table.name == "__src":
            table.replace(source)
    return select


def session_call(derived: exp.Subquery) -> tuple[str, tuple[str, ...], str, int] | None:
    """(source table, key columns, time column, gap µs) when ``derived`` is an expanded SESSION."""
    body = derived.this
    if not isinstance(body, exp.Select):
        return None
    inner = body.args.get("from_")
    inner = inner.this if inner is not None else None
    if not isinstance(inner, exp.Subquery) or not inner.alias.startswith(MARK):
        return None
    lag = next(inner.find_all(exp.Lag))
    window = lag.parent
    keys = tuple(p.name for p in window.args.get("partition_by") or [])
    time = window.args["order"].expressions[0].this.name
    source = next(t for t in inner.find_all(exp.Table))
    return source.name, keys, time, int(inner.alias[len(MARK):])


def session_tables(query: exp.Expression) -> set[str]:
    """Tables windowed by SESSION in ``query`` (before expansion)."""
    found = set()
    for table in query.find_all(exp.Table):
        if isinstance(table.this, exp.Anonymous) and table.this.name.upper() == "SESSION":
            args = table.this.expressions
            if args and isinstance(args[0], exp.Column):
                found.add(args[0].name.lower())
    return found
