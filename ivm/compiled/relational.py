"""SELECT statements compiled once into physical operators over frames of columns.

    >>> rel = compile_query(parse_one("SELECT k, SUM(w) AS s FROM d GROUP BY k"), {"d": schema})
    >>> rel.run({"d": table})     # a Frame; nothing is parsed or bound per run

The operators and the SQL shapes they implement (each with DuckDB's meaning):

- ``scan``: ``FROM temp [AS a]``, a CTE, or ``(SELECT ...) AS a``.
- ``join``: ``[INNER|LEFT] JOIN r ON`` a conjunction of ``x = y`` / ``x IS NOT
  DISTINCT FROM y`` with ``x`` over the left and ``y`` over the right side
  (an inner join may add other conjuncts: a filter after it); ``CROSS JOIN
  r`` with such equalities in the WHERE is an inner join on them. Keys are coded
  together (kernels.codes), so a join is a sort and a gather; a LEFT join
  pads unmatched rows with NULLs.
- ``exists``: ``WHERE [NOT] EXISTS (SELECT ... FROM r WHERE <equalities
  between outer and r> AND <conditions on r>)``: a semi (anti) join.
- ``filter``: ``WHERE``/``HAVING`` (rows where the predicate is true).
- ``aggregate``: ``GROUP BY`` expressions with COUNT(*), COUNT(x), SUM, MIN,
  MAX (and a global aggregate: one row, also over no rows). SUM of integers
  is HUGEINT, SUM of DECIMAL(p,s) is DECIMAL(38,s) (both held in int64; a
  sum that may leave it falls back); MIN/MAX also of decimals and dates.
- ``project``: the select list (``*``, ``t.*``, expressions), ``DISTINCT``.
- ``union``: ``UNION ALL`` of inputs with the same column types.

Anything else (ORDER BY, LIMIT, window functions, other joins, UNION
without ALL, subqueries in expressions...) raises ``Unsupported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
from sqlglot import exp

from ivm.compiled.expressions import Expr, Shape, compile_expr, convert, finish, truth, unify
from ivm.compiled.kernels import (
    codes, group_count, group_extreme, group_sum, groups, joint_codes, matches, same_scale,
)
from ivm.compiled.vectors import (
    TEMPORAL, Fallback, Unsupported, Vec, column_of, constant, decimal, decimal_of, is_decimal, is_int, is_number,
    logical, negative_zero,
)

SELECT_ARGS = {"kind", "hint", "distinct", "expressions", "from_", "joins", "where", "group", "having", "with_"}


class Frame:
    """Rows of a relation while a compiled step runs: one Vec per column of its Shape."""

    __slots__ = ("cols", "n")

    def __init__(self, cols: list[Vec], n: int):
        self.cols = cols
        self.n = n

    def take(self, index: np.ndarray) -> "Frame":
        return Frame([c.take(index) for c in self.cols], len(index))


@dataclass
class Rel:
    shape: Shape
    run: Callable[[dict], Frame]  # ctx: input tables by name, plus per-run memos of CTEs


def compile_query(tree: exp.Expression, schemas: dict[str, pa.Schema]) -> tuple[Rel, list[str]]:
    """The compiled relation of a query over named inputs and its output column names."""
    return _Query(schemas).query(tree, {})


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [node]


def requalify(rel: Rel, alias: str) -> Rel:
    return Rel(Shape([(alias, n, t) for _, n, t in rel.shape.columns]), rel.run)


class _Query:
    def __init__(self, schemas: dict[str, pa.Schema]):
        self.schemas = {k.lower(): v for k, v in schemas.items()}
        self.names = {k.lower(): k for k in schemas}

    def query(self, node: exp.Expression, env: dict[str, tuple[Rel, list[str]]]) -> tuple[Rel, list[str]]:
        env = dict(env)
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise Unsupported("WITH RECURSIVE")
            for cte in with_.expressions:
                env[cte.alias.lower()] = self._memo(self.query(cte.this, env))
        if isinstance(node, exp.Subquery):
            return self.query(node.this, env)
        if isinstance(node, exp.Select):
            return self.select(node, env)
        if isinstance(node, exp.Union) and not isinstance(node, (exp.Except, exp.Intersect)):
            return self.union(node, env)
        raise Unsupported(f"query {type(node).__name__}")

    @staticmethod
    def _memo(compiled: tuple[Rel, list[str]]) -> tuple[Rel, list[str]]:
        rel, names = compiled
        key = object()

        def run(ctx):
            frame = ctx.get(key)
            if frame is None:
                frame = ctx[key] = rel.run(ctx)
            return frame
        return Rel(rel.shape, run), names

    def union(self, node: exp.Union, env) -> tuple[Rel, list[str]]:
        if node.args.get("distinct") or any(node.args.get(k) for k in ("order", "limit", "offset")):
            raise Unsupported("UNION without ALL (or with ORDER BY/LIMIT)")
        (left, names), (right, _) = self.query(node.this, env), self.query(node.expression, env)
        lt, rt = [t for *_, t in left.shape.columns], [t for *_, t in right.shape.columns]
        if len(lt) != len(rt):
            raise Unsupported("UNION ALL of inputs with different numbers of columns")
        types = [a if str(a) == str(b) else _union_type(a, b) for a, b in zip(lt, rt)]

        def run(ctx):
            a, b = left.run(ctx), right.run(ctx)
            cols = [_concat(_as(x, t), _as(y, t)) for x, y, t in zip(a.cols, b.cols, types)]
            return Frame(cols, a.n + b.n)
        return Rel(Shape([("", n, t) for n, t in zip(names, types)]), run), names

    # --- SELECT -----------------------------------------------------------------
    def select(self, node: exp.Select, env) -> tuple[Rel, list[str]]:
        extra = [k for k, v in node.args.items() if v and k not in SELECT_ARGS]
        if extra:
            raise Unsupported(f"SELECT with {', '.join(extra).upper()}")
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise Unsupported("DISTINCT ON")
        if node.args.get("kind"):
            raise Unsupported(f"SELECT {node.args['kind']}")
        for e in node.expressions:
            if e.find(exp.Window, exp.Subquery, exp.Select, exp.Exists):
                raise Unsupported("a window function or subquery in the select list")
        from_ = node.args.get("from_")
        if from_ is None:
            raise Unsupported("SELECT without FROM")
        rel = self.source(from_.this, env)
        where = conjuncts(node.args["where"].this) if node.args.get("where") else []
        for join in node.args.get("joins") or []:
            rel, where = self.join(rel, join, env, where)
        rel = self.where(rel, where, env)
        group = node.args.get("group")
        having = node.args.get("having")
        aggs = [a for e in node.expressions for a in _aggregates(e)]
        if having is not None:
            aggs += _aggregates(having.this)
        if group is not None or aggs:
            rel, subst = self.aggregate(rel, group, aggs)
            if having is not None:
                rel = self.filter(rel, [having.this], subst)
            out, names = self.project(rel, node.expressions, subst)
        else:
            if having is not None:
                raise Unsupported("HAVING without aggregates")
            out, names = self.project(rel, node.expressions, None)
        if distinct is not None:
            out = _distinct(out)
        return out, names

    def source(self, node: exp.Expression, env) -> Rel:
        if isinstance(node, exp.Table):
            if node.args.get("db") or node.args.get("catalog") or node.args.get("joins"):
                raise Unsupported(f"table {node.sql()}")
            name = node.name.lower()
            alias = (node.alias or node.name).lower()
            if name in env:
                return requalify(env[name][0], alias)
            if name not in self.schemas:
                raise Unsupported(f"table {node.name} is not an input of the step")
            schema, real = self.schemas[name], self.names[name]
            shape = Shape([(alias, f.name.lower(), logical(f.type)) for f in schema])

            def run(ctx):
                table = ctx[real]
                return Frame([column_of(c) for c in table.columns], table.num_rows)
            return Rel(shape, run)
        if isinstance(node, exp.Subquery):
            rel, _ = self.query(node.this, env)
            return requalify(rel, (node.alias or "").lower())
        raise Unsupported(f"FROM {type(node).__name__}")

    def join(self, left: Rel, join: exp.Join, env, where: list) -> tuple[Rel, list]:
        """The join and the WHERE conditions left; a CROSS JOIN takes its equalities from the WHERE."""
        side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "").upper()
        cross = kind == "CROSS" or (not side and not kind and join.args.get("on") is None)
        if join.args.get("using") or not cross and (
                side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER") or join.args.get("on") is None):
            raise Unsupported(f"{side} {kind} JOIN".replace("  ", " "))
        right = self.source(join.this, env)
        if cross:  # FROM a CROSS JOIN b WHERE a.x = b.y: an inner join on the WHERE's equalities
            pairs, where = _key_pairs(where, left.shape, right.shape)
            rest = []
        else:
            pairs, rest = _key_pairs(conjuncts(join.args["on"]), left.shape, right.shape)
        if not pairs or (rest and side == "LEFT"):
            raise Unsupported("a join whose ON is not a conjunction of equalities")
        outer = side == "LEFT"
        shape = Shape(left.shape.columns + right.shape.columns)

        def run(ctx):
            lf, rf = left.run(ctx), right.run(ctx)
            li, ri, count = matches(*_pair_codes(pairs, lf, rf))
            missing = None
            if outer:
                lonely = np.flatnonzero(count == 0)
                if len(lonely):
                    li = np.concatenate([li, lonely])
                    ri = np.concatenate([ri, np.zeros(len(lonely), np.int64)])
                    missing = np.zeros(len(li), bool)
                    missing[len(li) - len(lonely):] = True
            cols = [c.take(li) for c in lf.cols] + [c.take(ri, missing) for c in rf.cols]
            return Frame(cols, len(li))
        rel = Rel(shape, run)
        return (self.filter(rel, rest, None) if rest else rel), where

    def where(self, rel: Rel, conds: list[exp.Expression], env) -> Rel:
        plain = []
        for cond in conds:
            negated = isinstance(cond, exp.Not) and isinstance(cond.this, exp.Exists)
            if isinstance(cond, exp.Exists) or negated:
                rel = self.exists(rel, cond.this if negated else cond, negated, env)
            else:
                plain.append(cond)
        return self.filter(rel, plain, None) if plain else rel

    def exists(self, outer: Rel, node: exp.Exists, anti: bool, env) -> Rel:
        inner_q = node.this
        if not isinstance(inner_q, exp.Select) or any(inner_q.args.get(k) for k in ("joins", "group", "having",
                                                                                     "with_", "distinct")):
            raise Unsupported("EXISTS over more than one filtered relation")
        extra = [k for k, v in inner_q.args.items() if v and k not in SELECT_ARGS]
        if extra or inner_q.args.get("from_") is None:
            raise Unsupported("EXISTS with " + ", ".join(extra))
        inner = self.source(inner_q.args["from_"].this, env)
        local, pairs = [], []
        for cond in conjuncts(inner_q.args["where"].this) if inner_q.args.get("where") else []:
            try:
                local.append(compile_expr(cond, inner.shape))
                continue
            except Unsupported:
                pass
            found, rest = _key_pairs([cond], outer.shape, inner.shape)
            if rest:
                raise Unsupported("EXISTS with a condition that is not an equality with the outer row")
            pairs += found
        if not pairs:
            raise Unsupported("EXISTS not correlated by equalities")

        def run(ctx):
            of, inf = outer.run(ctx), inner.run(ctx)
            for cond in local:
                inf = inf.take(np.flatnonzero(truth(cond.fn(inf))[0]))
            _, _, count = matches(*_pair_codes(pairs, of, inf))
            return of.take(np.flatnonzero(count == 0 if anti else count > 0))
        return Rel(outer.shape, run)

    def filter(self, rel: Rel, conds: list[exp.Expression], subst) -> Rel:
        predicates = [compile_expr(c, rel.shape, subst) for c in conds]
        for p in predicates:
            if p.type not in ("BOOLEAN", "NULL"):
                raise Unsupported(f"a condition of type {p.type}")

        def run(ctx):
            frame = rel.run(ctx)
            for p in predicates:
                if frame.n == 0:
                    break
                keep, _ = truth(p.fn(frame))
                if not keep.all():
                    frame = frame.take(np.flatnonzero(keep))
            return frame
        return Rel(rel.shape, run)

    def aggregate(self, rel: Rel, group: exp.Group | None, aggs: list[exp.AggFunc]) -> tuple[Rel, dict]:
        if group is not None and any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets", "totals")):
            raise Unsupported("GROUP BY ROLLUP/CUBE/GROUPING SETS")
        keys_sql = group.expressions if group is not None else []
        if any(isinstance(k, exp.Literal) for k in keys_sql):
            raise Unsupported("GROUP BY a position")
        keys = [compile_expr(k, rel.shape) for k in keys_sql]
        for k in keys:
            if k.type in ("NULL", "INTLIT"):
                raise Unsupported("GROUP BY a constant")
        calls, seen = [], {}
        for a in aggs:
            text = a.sql(dialect="duckdb")
            if text not in seen:
                seen[text] = len(calls)
                calls.append(_aggregate_call(a, rel.shape))
        subst = {k.sql(dialect="duckdb"): i for i, k in enumerate(keys_sql)}
        subst.update({text: len(keys) + i for text, i in seen.items()})
        shape = Shape([("", f"#key{i}", k.type) for i, k in enumerate(keys)]
                      + [("", f"#agg{i}", c.type) for i, c in enumerate(calls)])
        global_ = not keys

        def run(ctx):
            frame = rel.run(ctx)
            key_vecs = [k.fn(frame) for k in keys]
            for k in key_vecs:
                if k.type == "DOUBLE":
                    if negative_zero(*k.np()):
                        raise Fallback("GROUP BY a DOUBLE -0.0 (DuckDB keeps the zero it met first)")
            if global_:
                order = np.arange(frame.n)
                starts = np.zeros(1 if frame.n else 0, np.int64)
                first = starts
            else:
                order, starts, first = groups(codes(key_vecs, frame.n))
            cols = [k.take(first) for k in key_vecs]
            cols += [c.run(frame, order, starts) for c in calls]
            if global_ and frame.n == 0:
                cols = [c.empty_result() for c in calls]
            return Frame(cols, len(starts) if not (global_ and frame.n == 0) else 1)
        return Rel(shape, run), subst

    def project(self, rel: Rel, items: list[exp.Expression], subst) -> tuple[Rel, list[str]]:
        exprs: list[Expr] = []
        names: list[str] = []
        for item in items:
            star = isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
            if star:
                if subst is not None:
                    raise Unsupported("* with GROUP BY")
                table = item.table.lower() if isinstance(item, exp.Column) else ""
                for i, (q, n, t) in enumerate(rel.shape.columns):
                    if not table or q == table:
                        exprs.append(Expr(t, _slot(i)))
                        names.append(n)
                continue
            body = item.this if isinstance(item, exp.Alias) else item
            exprs.append(finish(compile_expr(body, rel.shape, subst)))
            names.append(item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else item.sql("duckdb"))
        shape = Shape([("", n.lower(), e.type) for n, e in zip(names, exprs)])

        def run(ctx):
            frame = rel.run(ctx)
            return Frame([e.fn(frame) for e in exprs], frame.n)
        return Rel(shape, run), names


def _slot(i: int):
    return lambda f: f.cols[i]


def _aggregates(node: exp.Expression) -> list[exp.AggFunc]:
    found = []
    for a in node.find_all(exp.AggFunc):
        if a.find_ancestor(exp.AggFunc) is None:
            found.append(a)
    return found


def _key_pairs(conds, left: Shape, right: Shape) -> tuple[list, list]:
    """Equalities x = y / x IS NOT DISTINCT FROM y between the two sides ((left Expr, right Expr, null_safe));
    and the other conditions."""
    pairs, rest = [], []
    for cond in conds:
        if isinstance(cond, (exp.EQ, exp.NullSafeEQ)):
            for a, b in ((cond.this, cond.expression), (cond.expression, cond.this)):
                try:
                    x, y = compile_expr(a, left), compile_expr(b, right)
                except Unsupported:
                    continue
                if _keyable(x.type, y.type):
                    pairs.append((x, y, isinstance(cond, exp.NullSafeEQ)))
                    break
            else:
                rest.append(cond)
        else:
            rest.append(cond)
    return pairs, rest


def _keyable(a, b) -> bool:
    if a in ("NULL", "INTLIT") or b in ("NULL", "INTLIT"):
        return False
    if is_number(a) and is_number(b) or same_scale(a, b):
        return True
    return a == b and not (isinstance(a, pa.DataType) and pa.types.is_floating(a))


def _pair_codes(pairs, lf: Frame, rf: Frame) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Both sides' key codes, and the rows whose NULL key in an ``=`` pair matches nothing."""
    lv = [x.fn(lf) for x, _, _ in pairs]
    rv = [y.fn(rf) for _, y, _ in pairs]
    lc, rc = joint_codes(lv, rv, lf.n, rf.n)
    lskip = rskip = None
    for (_, _, null_safe), a, b in zip(pairs, lv, rv):
        if not null_safe:
            va, vb = a.valid(), b.valid()
            if va is not None:
                lskip = ~va if lskip is None else (lskip | ~va)
            if vb is not None:
                rskip = ~vb if rskip is None else (rskip | ~vb)
    return lc, rc, lskip, rskip


def _distinct(rel: Rel) -> Rel:
    def run(ctx):
        frame = rel.run(ctx)
        if frame.n == 0:
            return frame
        if any(c.type == "DOUBLE" and negative_zero(*c.np()) for c in frame.cols):
            raise Fallback("DISTINCT over a DOUBLE -0.0 (DuckDB keeps the zero it met first)")
        _, _, first = groups(codes(frame.cols, frame.n))
        return frame.take(np.sort(first))
    return Rel(rel.shape, run)


def _union_type(a, b):
    """The type DuckDB gives a UNION ALL column whose sides differ: numbers and decimals meet as in CASE."""
    if a == "NULL" or b == "NULL":
        raise Unsupported("UNION ALL of a NULL column with a typed one")
    t = unify([Expr(a, None), Expr(b, None)], "UNION ALL")
    if not isinstance(t, str) or not (is_number(t) or is_decimal(t)):
        raise Unsupported(f"UNION ALL of {a} and {b}")
    return t


def _as(v: Vec, t) -> Vec:
    """``v`` cast to the union's type ``t`` (a no-op when it has it)."""
    if v.type == t:
        return v
    return Vec.of(t, *convert(v, t))


def _concat(a: Vec, b: Vec) -> Vec:
    if a.numeric and a.type != "NULL":
        (x, vx), (y, vy) = a.np(), b.np()
        valid = None
        if vx is not None or vy is not None:
            valid = np.concatenate([np.ones(len(x), bool) if vx is None else vx,
                                    np.ones(len(y), bool) if vy is None else vy])
        return Vec.of(a.type, np.concatenate([x, y]), valid)
    return Vec(a.type, array=pa.concat_arrays([a.arrow(), b.arrow()]))


class _Call:
    """One aggregate call: COUNT(*), COUNT(x), SUM(x), MIN(x), MAX(x)."""

    def __init__(self, func: str, arg: Expr | None, type_):
        self.func, self.arg, self.type = func, arg, type_

    def run(self, frame: Frame, order: np.ndarray, starts: np.ndarray) -> Vec:
        if self.arg is None:
            return Vec.of("BIGINT", group_count(None, order, starts, frame.n))
        vec = self.arg.fn(frame)
        if self.func == "count":
            return Vec.of("BIGINT", group_count(vec.valid(), order, starts, frame.n))
        data, valid = vec.np()
        count = group_count(valid, order, starts, frame.n)
        if self.func == "sum":
            out = group_sum(data, valid, order, starts)
        else:
            out = group_extreme(data, valid, order, starts, self.func == "max")
        return Vec.of(self.type, out, count > 0)

    def empty_result(self) -> Vec:
        if self.func == "count":
            return constant("BIGINT", 0, 1)
        return constant(self.type, None, 1)


def _aggregate_call(node: exp.AggFunc, shape: Shape) -> _Call:
    name = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max"}.get(type(node))
    if name is None:
        raise Unsupported(f"aggregate {node.sql(dialect='duckdb')[:40]}")
    arg = node.this
    if isinstance(arg, exp.Distinct) or node.args.get("distinct"):
        raise Unsupported(f"{name.upper()}(DISTINCT ...)")
    if name == "count" and (arg is None or isinstance(arg, exp.Star)):
        return _Call("count", None, "BIGINT")
    if node.expressions if hasattr(node, "expressions") else False:
        raise Unsupported(f"{name.upper()} with several arguments")
    compiled = compile_expr(arg, shape)
    t = compiled.type
    if name == "count":
        return _Call("count", compiled, "BIGINT")
    if name == "sum":
        if is_int(t):
            return _Call("sum", compiled, "HUGEINT")
        if t == "DOUBLE":
            return _Call("sum", compiled, "DOUBLE")
        if is_decimal(t):  # DuckDB: SUM(DECIMAL(p,s)) is DECIMAL(38,s); held in int64 (a sum past it falls back)
            return _Call("sum", compiled, decimal(38, decimal_of(t)[1]))
    elif is_number(t) or is_decimal(t) or t in TEMPORAL:
        return _Call(name, compiled, t)
    raise Unsupported(f"{name.upper()} of {t}")
