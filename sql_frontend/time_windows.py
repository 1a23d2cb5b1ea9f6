"""Expand the window table functions TUMBLE and HOP into plain SELECTs.

``TUMBLE(t, ts, size)`` and ``HOP(t, ts, slide, size)`` in FROM stand for
the table ``t`` with two more columns, ``window_start`` and ``window_end``:
one row per event and window containing it. Both become derived tables over
``t``, so aggregates, joins, the delta rules and the oracle need nothing new:

    TUMBLE(t, ts, size) AS a
      -> (SELECT t.*, time_bucket(size, ts, EPOCH) AS window_start,
                 time_bucket(size, ts, EPOCH) + size AS window_end FROM t) AS a

    HOP(t, ts, slide, size) AS a          (size = n * slide)
      -> (SELECT t.*, time_bucket(slide, ts, EPOCH) - k * slide AS window_start, … + size AS window_end
          FROM t   -- k = 0
          UNION ALL … k = n - 1) AS a

Windows are aligned to the Unix epoch (as in Flink): a row at ``ts`` is in
``[s, s + size)`` for ``s = floor_slide(ts) - k * slide``, ``k < n``, which
are exactly the windows of length ``size`` starting on multiples of
``slide`` that contain ``ts``. The alias defaults to the table's name.

Incremental rule: none of its own; the expansion is a projection (TUMBLE)
or a union of n projections (HOP) of ``t``, both linear:
``Δ TUMBLE(t) = TUMBLE(Δt)``, ``Δ HOP(t) = HOP(Δt)``.

>>> import sqlglot
>>> q = sqlglot.parse_one("SELECT window_start, COUNT(*) FROM TUMBLE(b, ts, INTERVAL '1' MINUTE) GROUP BY 1",
...                       read="duckdb")
>>> expand_time_windows(q, {"b": {"a": "INT", "ts": "TIMESTAMP"}}).sql("duckdb")  # doctest: +NORMALIZE_WHITESPACE
"SELECT window_start, COUNT(*) FROM (SELECT b.*, TIME_BUCKET(INTERVAL '1' MINUTE, ts, CAST('1970-01-01' AS TIMESTAMP)) AS window_start, TIME_BUCKET(INTERVAL '1' MINUTE, ts, CAST('1970-01-01' AS TIMESTAMP)) + INTERVAL '1' MINUTE AS window_end FROM b) AS b GROUP BY 1"
"""

from __future__ import annotations

from typing import Mapping

from sqlglot import exp

from sql_frontend.errors import BindError, SqlSyntaxError, UnknownObjectError, UnsupportedError
from sql_frontend.event_time import interval_us
from sql_frontend.statements import DIALECT, normalize_name
from sql_frontend import session_windows

WINDOW_FUNCTIONS = {"TUMBLE": "TUMBLE(table, time_column, INTERVAL size)",
                    "HOP": "HOP(table, time_column, INTERVAL slide, INTERVAL size)",
                    "SESSION": session_windows.USAGE}
WINDOW_COLUMNS = ("window_start", "window_end")
EPOCH = "CAST('1970-01-01' AS TIMESTAMP)"
MAX_HOPS = 100  # windows per event of a HOP (size / slide): each is a branch of the union

Schema = Mapping[str, Mapping[str, str]]


def window_call(node: exp.Expression) -> str | None:
    """'TUMBLE', 'HOP' or 'SESSION' when ``node`` is such a call in FROM (a Table around a function)."""
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
        name = node.this.name.upper()
        return name if name in WINDOW_FUNCTIONS else None
    return None


def has_time_windows(query: exp.Expression) -> bool:
    return any(window_call(t) for t in query.find_all(exp.Table))


def expand_time_windows(query: exp.Expression, schema: Schema) -> exp.Expression:
    """Replace every TUMBLE/HOP in FROM by its derived table (a copy; ``query`` is left alone)."""
    if not has_time_windows(query):
        return query
    query = query.copy()
    for table in list(query.find_all(exp.Table)):
        kind = window_call(table)
        if kind is not None:
            table.replace(_expand(kind, table, schema))
    return query


def _expand(kind: str, call: exp.Table, schema: Schema) -> exp.Subquery:
    if kind == "SESSION":  # not a union of projections: a node of its own (sql_frontend/session_windows.py)
        return session_windows.expand_session(call, schema, _source, _time_column, _interval)
    args = call.this.expressions
    usage = WINDOW_FUNCTIONS[kind]
    if len(args) != (3 if kind == "TUMBLE" else 4):
        raise SqlSyntaxError(f"{kind} takes {len(args) and (3 if kind == 'TUMBLE' else 4)} arguments: {usage}")
    source, column = _source(kind, args[0], schema), _time_column(kind, args[1], args[0], schema)
    sizes = [_interval(kind, a) for a in args[2:]]
    columns = schema[source]
    clash = [c for c in WINDOW_COLUMNS if c in columns]
    if clash:
        raise BindError(f"{kind}({source}, …) adds a column {clash[0]}, which {source} already has")
    if kind == "TUMBLE":
        body = _shifted(source, column, sizes[0][0], sizes[0][0], 0)
    else:
        (slide, slide_us), (size, size_us) = sizes
        if size_us % slide_us:
            raise BindError(f"HOP size {size.sql(DIALECT)} must be a whole multiple of its slide "
                            f"{slide.sql(DIALECT)}")
        hops = size_us // slide_us
        if hops > MAX_HOPS:
            raise UnsupportedError(f"HOP with more than {MAX_HOPS} windows per event (size / slide = {hops}) "
                                   "is not supported")
        body = _shifted(source, column, slide, size, 0)
        for k in range(1, hops):
            body = exp.union(body, _shifted(source, column, slide, size, k * slide_us), distinct=False)
    alias = call.alias or source
    return exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _shifted(source: str, column: str, bucket: exp.Expression, size: exp.Expression, shift_us: int) -> exp.Select:
    """SELECT source.*, its window start (the bucket moved back by shift_us) and end."""
    start = exp.func("TIME_BUCKET", bucket.copy(), exp.column(column), exp.maybe_parse(EPOCH, dialect=DIALECT))
    if shift_us:
        start = exp.Sub(this=start, expression=exp.func("TO_MICROSECONDS", exp.Literal.number(shift_us)))
    end = exp.Add(this=start.copy(), expression=size.copy())
    return exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(source)),
                      exp.alias_(start, "window_start"), exp.alias_(end, "window_end")).from_(source)


def _source(kind: str, arg: exp.Expression, schema: Schema) -> str:
    if not isinstance(arg, exp.Column) or arg.table:
        raise SqlSyntaxError(f"the first argument of {kind} must be a table or view name: {WINDOW_FUNCTIONS[kind]}")
    name = normalize_name(arg.this)
    if name not in schema:
        raise UnknownObjectError(f"relation {name} does not exist")
    return name


def _time_column(kind: str, arg: exp.Expression, source: exp.Expression, schema: Schema) -> str:
    table = normalize_name(source.this)
    if not isinstance(arg, exp.Column) or arg.table:
        raise SqlSyntaxError(f"the second argument of {kind} must be a column of {table}: {WINDOW_FUNCTIONS[kind]}")
    name = normalize_name(arg.this)
    kind_of = schema[table].get(name)
    if kind_of is None:
        raise UnknownObjectError(f"{kind}: {table} has no column {name}")
    if kind_of.upper() not in ("TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ", "DATE"):
        raise BindError(f"{kind}: the time column {table}.{name} must be a TIMESTAMP, not {kind_of}")
    return name


def _interval(kind: str, arg: exp.Expression) -> tuple[exp.Expression, int]:
    if not isinstance(arg, exp.Interval):
        raise SqlSyntaxError(f"{kind} expects INTERVAL sizes: {WINDOW_FUNCTIONS[kind]}; got {arg.sql(DIALECT)}")
    us = interval_us(arg.sql(DIALECT))
    if us <= 0:
        raise BindError(f"{kind}: window sizes must be positive, got {arg.sql(DIALECT)}")
    return arg, us


def window_sizes(query: exp.Expression) -> dict[str, int]:
    """Per table windowed by TUMBLE/HOP in ``query``: the largest window size (microseconds)."""
    sizes: dict[str, int] = {}
    for table in query.find_all(exp.Table):
        kind = window_call(table)
        if kind is None or kind == "SESSION":  # a session has no fixed size (its state goes by window_end)
            continue
        args = table.this.expressions
        if not args or not isinstance(args[0], exp.Column) or not isinstance(args[-1], exp.Interval):
            continue
        name = normalize_name(args[0].this)
        sizes[name] = max(sizes.get(name, 0), interval_us(args[-1].sql(DIALECT)))
    return sizes
