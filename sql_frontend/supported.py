"""Reject, by name, every construct ivm cannot maintain incrementally.

A view is checked before anything is created, so an unsupported view never
half-exists. The message names the construct as the user wrote it.

>>> check_supported(sqlglot.parse_one("SELECT a FROM t GROUP BY ROLLUP (a)", dialect="duckdb"))
Traceback (most recent call last):
...
storage.errors.UnsupportedError: ROLLUP is not supported in a materialized view
"""

from __future__ import annotations

from typing import Iterable

import sqlglot  # noqa: F401  (used by the doctest)
from sqlglot import exp

from sql_frontend.errors import UnsupportedError
from sql_frontend.windows import check_window

# Aggregates with an incremental rule in delta_operators/aggregate.py.
SUPPORTED_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)

# Functions whose value changes between evaluations: a view over them cannot
# be maintained (its "current" value is not a function of the tables).
NONDETERMINISTIC = {
    "random", "rand", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "now",
    "current_timestamp", "current_date", "current_time", "localtimestamp",
    "localtime", "get_current_time", "get_current_timestamp", "transaction_timestamp",
    "nextval", "currval", "setseed", "txid_current", "current_setting",
    "current_query", "today",
}

_NONDETERMINISTIC_NODES = (
    exp.Rand, exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Uuid,
)


def check_supported(query: exp.Expression, aggregate_names: Iterable[str] = ()) -> None:
    """Raise UnsupportedError naming the first construct ivm cannot maintain.

    Args:
        query: the view body (a SELECT or set operation).
        aggregate_names: names of every aggregate function the engine knows, so
            an aggregate sqlglot does not model (e.g. ``product``) is not
            mistaken for a scalar function.
    """
    aggregates = {n.lower() for n in aggregate_names}
    for node in query.walk():
        _check_node(node, aggregates)


def _fail(what: str, hint: str = "") -> None:
    raise UnsupportedError(f"{what} is not supported in a materialized view{hint}")


def _check_node(node: exp.Expression, aggregates: set[str]) -> None:
    if isinstance(node, exp.Window):
        check_window(node)
    elif isinstance(node, (exp.Limit, exp.Fetch, exp.Offset)):
        pass  # a TopK node: sql_frontend.top_k checks the counts and the ORDER BY
    elif isinstance(node, exp.Join):
        _check_join(node)
    elif isinstance(node, exp.Lateral):
        _fail("LATERAL")
    elif isinstance(node, (exp.Unnest, exp.Explode)):
        _fail("UNNEST")
    elif isinstance(node, exp.GroupingSets):
        _fail("GROUPING SETS")
    elif isinstance(node, exp.Rollup):
        _fail("ROLLUP")
    elif isinstance(node, exp.Cube):
        _fail("CUBE")
    elif isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
        _fail(f"table function {_func_name(node.this)}")
    elif isinstance(node, exp.Values):
        _fail("VALUES in FROM")
    elif isinstance(node, (exp.Any, exp.All)):
        _fail(f"{type(node).__name__.upper()} (subquery)", "; write it with IN, EXISTS or an aggregate")
    elif isinstance(node, exp.TableSample):
        _fail("TABLESAMPLE")
    elif isinstance(node, (exp.Pivot,)):
        _fail("PIVOT")
    elif isinstance(node, exp.Group):
        _check_group(node)
    elif isinstance(node, exp.Select) and isinstance(node.args.get("distinct"), exp.Distinct):
        if node.args["distinct"].args.get("on"):
            _fail("DISTINCT ON")
    elif isinstance(node, exp.Placeholder) or isinstance(node, exp.Parameter):
        _fail("a query parameter")
    elif isinstance(node, exp.AggFunc) and not _is_window_function(node):
        _check_aggregate(node)
    elif isinstance(node, _NONDETERMINISTIC_NODES):
        _fail(f"non-deterministic function {_func_name(node)}")
    elif isinstance(node, exp.Func):
        name = _func_name(node).lower()
        if name in NONDETERMINISTIC:
            _fail(f"non-deterministic function {name}")
        if isinstance(node, exp.Anonymous) and name in aggregates:
            _fail(f"aggregate function {name}")


def _is_window_function(node: exp.Expression) -> bool:
    """True for the function of an OVER (...) clause (checked by check_window)."""
    parent = node.parent
    while isinstance(parent, (exp.Filter, exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return isinstance(parent, exp.Window) and not isinstance(node.parent, exp.Where)


def _check_join(join: exp.Join) -> None:
    # Outer, semi and anti joins are planned by sql_frontend.builder (shapes it cannot
    # maintain are rejected there, by name).
    kind = (join.args.get("kind") or "").upper()
    method = (join.args.get("method") or "").upper()
    if kind in ("ASOF", "POSITIONAL"):
        _fail(f"{kind} JOIN")
    if method:
        _fail(f"{method} JOIN", "; write the join condition with ON or USING")


def _check_group(group: exp.Group) -> None:
    for key, label in (("grouping_sets", "GROUPING SETS"), ("cube", "CUBE"), ("rollup", "ROLLUP")):
        if group.args.get(key):
            _fail(label)
    if group.args.get("all"):
        _fail("GROUP BY ALL", "; list the grouping columns")


def _check_aggregate(node: exp.AggFunc) -> None:
    if not isinstance(node, SUPPORTED_AGGREGATES):
        _fail(
            f"aggregate function {_func_name(node)}",
            " (supported: COUNT, SUM, AVG, MIN, MAX, each optionally DISTINCT)",
        )
    inner = node.this
    if isinstance(inner, exp.Distinct) and len(inner.expressions) != 1:
        _fail(f"{_func_name(node)}(DISTINCT ...) over several columns")
    if isinstance(node, exp.Count) and node.expressions:
        _fail("COUNT over several columns")
    if node.find(exp.Order) is not None:
        _fail(f"ORDER BY inside {_func_name(node)}")


def _func_name(node: exp.Expression | None) -> str:
    if node is None:
        return "?"
    if isinstance(node, exp.Anonymous):
        return str(node.this)
    if isinstance(node, exp.Func):
        return node.sql_name()
    return type(node).__name__.upper()
