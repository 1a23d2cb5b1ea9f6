"""SELECT statements compiled once into physical operators over frames of columns.

        rel = compile_query(parse_one("SELECT k, SUM(w) AS s FROM d GROUP BY k"), {"d": schema})
        rel.run({"d": table})     # a Frame; nothing is parsed or bound per run

The operators and the SQL shapes they implement (each with DuckDB's meaning):

- ``scan``: ``FROM temp [AS a]``, a CTE, or ``(SELECT ...) AS a``.
- ``join``: ``[INNER|LEFT] JOIN r ON`` a condition: its conjuncts ``x = y`` /
  ``x IS NOT DISTINCT FROM y`` with ``x`` over the left and ``y`` over the
  right side are the keys, the others a residual. Keys are coded together
  (kernels.codes), so a join is a sort and a gather; without keys (``ON
  TRUE``, ``ON a.x < b.y``, ``FROM a, b``) every pair is formed, at most
  ``CROSS_PAIRS`` per batch (more fall back). The residual keeps the pairs
  where it is true; in a LEFT join it decides the match, and a left row with
  no match is padded with NULLs. ``CROSS JOIN r`` (or ``JOIN r ON TRUE``)
  with equalities in the WHERE is an inner join on them.
- ``exists``: ``WHERE [NOT] EXISTS (SELECT ... FROM r WHERE <equalities
  between outer and r> AND <conditions on r>)``: a semi (anti) join.
- ``filter``: ``WHERE``/``HAVING`` (rows where the predicate is true); an
  uncorrelated scalar subquery in the WHERE is computed once per batch
  (NULL without a row; more than one row falls back, as DuckDB raises).
- ``aggregate``: ``GROUP BY`` expressions with COUNT(*), COUNT(x), SUM, MIN,
  MAX, BOOL_AND, BOOL_OR (and a global aggregate: one row, also over no
  rows). SUM of integers is HUGEINT, SUM of DECIMAL(p,s) is DECIMAL(38,s)
  (both held in int64; a sum that may leave it falls back); MIN/MAX also of
  decimals and dates.
- ``window``: SUM (of integers) / COUNT ``OVER (PARTITION BY ... ORDER BY
  ...)`` in the select list, with DuckDB's default frame, the whole
  partition, or ``ROWS`` up to the current row (peers that differ fall back).
- ``project``: the select list (``*``, ``t.*``, expressions), ``DISTINCT``.
- ``limit``: ``ORDER BY`` keys (ASC/DESC, NULLS FIRST/LAST) with ``LIMIT``/
  ``OFFSET``, where DuckDB's rows are determined (rows tied across the cut
  that differ fall back; a LIMIT without ORDER BY must take every row).
- ``union``: ``UNION [ALL]``, ``EXCEPT``, ``INTERSECT`` (set forms: distinct
  rows, NULL equals NULL), each side cast to the columns' common type.

Anything else (other window functions and frames, RIGHT/FULL joins, EXCEPT
ALL, subqueries in expressions...) raises ``Unsupported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
from sqlglot import exp

from ivm.execute.compiled import generated as gen
from ivm.execute.compiled.expressions import Common, Expr, Shape, compile_expr, convert, finish, truth, unify
from ivm.execute.compiled.kernels import (
    codes, group_all, group_count, group_extreme, group_sum, groups, joint_codes, matches, order_ranks,
    same_scale,
)
from ivm.execute.compiled.vectors import (
    TEMPORAL, Fallback, Unsupported, Vec, constant, decimal, decimal_of, is_decimal, is_int, is_number,
    logical, negative_zero,
)

SELECT_ARGS = {"kind", "hint", "distinct", "expressions", "from_", "joins", "where", "group", "having", "with_",
               "order", "limit", "offset"}


class Frame:
    """Rows of a relation while a compiled step runs: one Vec per column of its Shape."""

    __slots__ = ("cols", "n", "memo")

    def __init__(self, cols: list[Vec], n: int):
        self.cols = cols
        self.n = n
        self.memo: dict | None = None  # results of shared subexpressions over this frame (expressions.Common)

    def take(self, index: np.ndarray) -> "Frame":
        return Frame([c.take(index) for c in self.cols], len(index))


@dataclass
class Rel:
    shape: Shape
    run: Callable[[dict], Frame]  # ctx: input tables by name, plus per-run memos of CTEs
    # emit(g) -> generated.GFrame: the same operator written as source (generated.py); None: not covered
    emit: Callable | None = None


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
    return Rel(Shape([(alias, n, t) for _, n, t in rel.shape.columns]), rel.run, rel.emit)


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
        if isinstance(node, exp.SetOperation):
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

        def emit(g):
            frame = g.ctes.get(key)
            if frame is None:
                frame = g.ctes[key] = rel.emit(g)
            return frame
        return Rel(rel.shape, run, emit if rel.emit else None), names

    def union(self, node: exp.SetOperation, env) -> tuple[Rel, list[str]]:
        """UNION ALL; UNION, EXCEPT and INTERSECT (DuckDB's set forms: distinct rows, NULL equal to NULL).

        The sides' columns must have one type each, or integer types (the
        result is the widest, as DuckDB casts a union), or NULL against a type.
        A DOUBLE -0.0 in a set operation falls back (DuckDB keeps the zero it
        met first); NaN equals NaN. EXCEPT ALL / INTERSECT ALL stay on DuckDB.
        """
        what = type(node).__name__.upper()
        distinct = bool(node.args.get("distinct"))
        if any(node.args.get(k) for k in ("order", "limit", "offset")):
            raise Unsupported(f"{what} with ORDER BY/LIMIT")
        if what != "UNION" and not distinct:
            raise Unsupported(f"{what} ALL")
        (left, names), (right, _) = self.query(node.this, env), self.query(node.expression, env)
        lt, rt = [t for *_, t in left.shape.columns], [t for *_, t in right.shape.columns]
        if len(lt) != len(rt):
            raise Unsupported(f"{what} of inputs with different numbers of columns")
        types = [_set_type(a, b, what) for a, b in zip(lt, rt)]
        shape = Shape([("", n.lower(), t) for n, t in zip(names, types)])

        def sides(ctx):
            a, b = left.run(ctx), right.run(ctx)
            return ([_as(c, s, t) for c, s, t in zip(a.cols, lt, types)], a.n,
                    [_as(c, s, t) for c, s, t in zip(b.cols, rt, types)], b.n)

        if what == "UNION":
            def run(ctx):
                a, na, b, nb = sides(ctx)
                return Frame([Vec.concat(x, y) for x, y in zip(a, b)], na + nb)

            def emit(g):
                a, b = left.emit(g), right.emit(g)

                def column(g, i):
                    x = _emit_as(g, a.col(g, i), lt[i], types[i], a.n)
                    y = _emit_as(g, b.col(g, i), rt[i], types[i], b.n)
                    d, v = g.var("d"), g.var("m")
                    if gen.is_string(types[i]):
                        base = g.var("a")
                        g.line(f"{d}, {v}, {base} = concat_strings({gen.string_values(g, x)}, {gen.string_values(g, y)})")
                        return gen.Col(types[i], d, v, base=base)
                    g.line(f"{d}, {v} = concat(({x.data}, {x.valid}), ({y.data}, {y.valid}))")
                    return gen.Col(types[i], d, v)
                return gen.GFrame([lambda g, i=i: column(g, i) for i in range(len(types))],
                                  g.let(f"{a.n} + {b.n}", "n"))
            emitted = all(_emits_as(x, t) and _emits_as(y, t) for x, y, t in zip(lt, rt, types))
            rel = Rel(shape, run, emit if emitted and left.emit and right.emit else None)
            return (_distinct(rel) if distinct else rel), names
        keep_found = what == "INTERSECT"

        def run_set(ctx):
            a, na, b, nb = sides(ctx)
            if any(c.type == "DOUBLE" and negative_zero(*c.np()) for c in a + b):
                raise Fallback(f"{what} over a DOUBLE -0.0 (DuckDB keeps the zero it met first)")
            if na == 0:
                return Frame(a, 0)
            ca, cb = joint_codes(a, b, na, nb) if a else (np.zeros(na, np.int64), np.zeros(nb, np.int64))
            _, _, first = groups(ca)
            first = np.sort(first)
            chosen = first[np.isin(ca[first], cb) == keep_found]
            return Frame([c.take(chosen) for c in a], len(chosen))
        return Rel(shape, run_set), names

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
            if e.find(exp.Subquery, exp.Select, exp.Exists):
                raise Unsupported("a subquery in the select list")
        from_ = node.args.get("from_")
        if from_ is None:
            raise Unsupported("SELECT without FROM")
        rel = self.source(from_.this, env)
        where = conjuncts(node.args["where"].this) if node.args.get("where") else []
        for join in node.args.get("joins") or []:
            rel, where = self.join(rel, join, env, where)
        rel, where = self.scalars(rel, where, env)
        rel = self.where(rel, where, env)
        group = node.args.get("group")
        having = node.args.get("having")
        items = node.expressions
        if any(e.find(exp.Window) for e in items):
            if group is not None or having is not None or any(_aggregates(e) for e in items):
                raise Unsupported("a window function with GROUP BY or aggregates")
            rel, items = self.windows(rel, items)
        ordered = node.args["order"].expressions if node.args.get("order") else []
        if any(isinstance(o.this, exp.Literal) for o in ordered):
            raise Unsupported("ORDER BY a position")
        if ordered and distinct is not None:
            raise Unsupported("DISTINCT with ORDER BY")
        aggs = [a for e in items for a in _aggregates(e)]
        if having is not None:
            aggs += _aggregates(having.this)
        aggs += [a for o in ordered for a in _aggregates(o.this)]
        keys = [o.this for o in ordered]
        if group is not None or aggs:
            rel, subst = self.aggregate(rel, group, aggs)
            if having is not None:
                rel = self.filter(rel, [having.this], subst)
            out, names = self.project(rel, items, subst, keys)
        else:
            if having is not None:
                raise Unsupported("HAVING without aggregates")
            out, names = self.project(rel, items, None, keys)
        if distinct is not None:
            out = _distinct(out)
        if ordered or node.args.get("limit") or node.args.get("offset"):
            out = _limit(out, len(names), [(bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
                                           for o in ordered],
                         _count(node.args.get("limit")), _count(node.args.get("offset")) or 0)
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

            types = [t for *_, t in shape.columns]  # fixed: the step runs only on inputs of this schema

            def run(ctx):
                table = ctx[real]
                return Frame([Vec.input(t, table, i) for i, t in enumerate(types)], table.num_rows)

            def emit(g):
                table = g.let(f"inputs[{real!r}]", "t")

                def column(g, i):
                    array, d, v = g.let(f"one_array({table}.column({i}))", "a"), g.var("d"), g.var("m")
                    g.line(f"{d}, {v} = read({array}, {gen.read_kind(types[i])!r})")  # (removed if not read)
                    return gen.Col(types[i], d, v, arrow=array, base=array if gen.is_string(types[i]) else None)
                return gen.GFrame([lambda g, i=i: column(g, i) for i in range(len(types))],
                                  g.let(f"{table}.num_rows", "n"))
            return Rel(shape, run, emit)
        if isinstance(node, exp.Subquery):
            rel, _ = self.query(node.this, env)
            return requalify(rel, (node.alias or "").lower())
        raise Unsupported(f"FROM {type(node).__name__}")

    def join(self, left: Rel, join: exp.Join, env, where: list) -> tuple[Rel, list]:
        """The join and the WHERE conditions left; a CROSS JOIN takes its equalities from the WHERE.

        ``ON`` is split into equalities between the sides (the keys) and the
        rest (the residual). Rows are paired on the keys (or, with no keys,
        every left row with every right row: at most ``CROSS_PAIRS`` pairs per
        batch, else a Fallback), then the residual keeps the pairs where it is
        true. In a LEFT join the residual decides what matches: a left row
        none of whose pairs pass is kept once, NULL-extended (SQL's ON, not a
        WHERE after the join). An INNER join ON TRUE is a CROSS JOIN.
        """
        side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "").upper()
        on = join.args.get("on")
        ons = [c for c in conjuncts(on) if not _is_true(c)]
        cross = kind == "CROSS" or (not side and kind in ("", "INNER") and not ons)
        if join.args.get("using") or not cross and (side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER")
                                                    or on is None):
            raise Unsupported(f"{side} {kind} JOIN".replace("  ", " "))
        right = self.source(join.this, env)
        if cross:  # FROM a CROSS JOIN b WHERE a.x = b.y: an inner join on the WHERE's equalities
            pairs, where = _key_pairs(where, left.shape, right.shape)
            rest = []
        else:
            pairs, rest = _key_pairs(ons, left.shape, right.shape)
        outer = side == "LEFT"
        shape = Shape(left.shape.columns + right.shape.columns)
        residual = self._predicates(rest, shape, None)

        def run(ctx):
            lf, rf = left.run(ctx), right.run(ctx)
            if pairs:
                li, ri, _ = matches(*_pair_codes(pairs, lf, rf))
                if residual:
                    li, ri = _passing(residual, lf, rf, li, ri)
            else:
                li, ri = _cross(residual, lf, rf)
            missing = None
            if outer:
                lonely = np.flatnonzero(np.bincount(li, minlength=lf.n) == 0)
                if len(lonely):
                    li = np.concatenate([li, lonely])
                    ri = np.concatenate([ri, np.zeros(len(lonely), np.int64)])
                    missing = np.zeros(len(li), bool)
                    missing[len(li) - len(lonely):] = True
            # Probing a lookup by its delta usually keeps every left row once, in order: pass them on.
            same = len(li) == lf.n and (not len(li) or (li[0] == 0 and bool((np.diff(li) == 1).all())))
            cols = (lf.cols if same else [c.take(li) for c in lf.cols]) + [c.take(ri, missing) for c in rf.cols]
            return Frame(cols, len(li))

        def emit(g):
            lf, rf = left.emit(g), right.emit(g)
            li, ri, missing = g.var("li"), g.var("ri"), g.var("missing")
            if residual or not pairs:  # as run: the pairs, those on which every residual is true, the lonely rows
                pl, pr = g.var("pl"), g.var("pr")
                if pairs:
                    g.line(f"{pl}, {pr}, _ = matches({_emit_pair_codes(g, pairs, lf, rf)})")
                else:  # every left row with every right row (a global aggregate's one row with its old one)
                    g.line(f"{pl}, {pr} = {g.const(cross_pairs, 'cross_pairs')}({lf.n}, {rf.n})")
                paired = gen.GFrame([(lambda g, i=i: _emit_rows(g, lf.col(g, i), pl)) for i in range(len(lf.makers))]
                                    + [(lambda g, i=i: _emit_rows(g, rf.col(g, i), pr)) for i in range(len(rf.makers))],
                                    g.let(f"len({pl})", "n"))
                keep = None
                for p in residual:
                    t, _ = gen.truth(g, p.emit(g, paired), paired.n)
                    keep = t if keep is None else g.let(f"{keep} & {t}")
                if keep is not None:
                    pl, pr = g.let(f"{pl}[{keep}]", "pl"), g.let(f"{pr}[{keep}]", "pr")
                g.line(f"{li}, {ri}, {missing} = outer({pl}, {pr}, {lf.n}, {outer})")
            else:
                g.line(f"{li}, {ri}, {missing} = pairs({_emit_pair_codes(g, pairs, lf, rf)}, {lf.n}, {outer})")

            def left_column(g, i):
                c = lf.col(g, i)
                data = g.let(f"{c.data} if {li} is None else {c.data}[{li}]", "d")
                valid = None if c.valid is None else g.let(
                    f"{c.valid} if {li} is None or {c.valid} is None else {c.valid}[{li}]", "m")
                return gen.moved(c, data, valid)

            def right_column(g, i):
                c = rf.col(g, i)
                d, v = g.var("d"), g.var("m")
                g.line(f"{d}, {v} = take({c.data}, {c.valid}, {ri}, {missing})")
                return gen.moved(c, d, v)
            makers = [lambda g, i=i: left_column(g, i) for i in range(len(left.shape.columns))]
            makers += [lambda g, i=i: right_column(g, i) for i in range(len(right.shape.columns))]
            return gen.GFrame(makers, g.let(f"len({ri})", "n"))
        generated = left.emit and right.emit and all(p.emit for p in residual) and all(
            x.emit and y.emit and _generated_key(x.type, y.type) for x, y, _ in pairs)
        return Rel(shape, run, emit if generated else None), where

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
                                                                                     "with_", "distinct", "limit",
                                                                                     "offset")):
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

        def emit(g):
            of, inf = outer.emit(g), inner.emit(g)
            for cond in local:
                keep, _ = gen.truth(g, cond.emit(g, inf), inf.n)
                inf = _emit_take(g, inf, g.let(f"np.flatnonzero({keep})", "rows"))
            count = g.var("count")
            g.line(f"_, _, {count} = matches({_emit_pair_codes(g, pairs, of, inf)})")
            return _emit_take(g, of, g.let(f"np.flatnonzero({count} {'==' if anti else '>'} 0)", "rows"))
        generated = outer.emit and inner.emit and all(c.emit for c in local) and all(
            x.emit and y.emit and _generated_key(x.type, y.type) for x, y, _ in pairs)
        return Rel(outer.shape, run, emit if generated else None)

    @staticmethod
    def _predicates(conds: list[exp.Expression], shape: Shape, subst) -> list[Expr]:
        predicates = [compile_expr(c, shape, subst) for c in conds]
        for p in predicates:
            if p.type not in ("BOOLEAN", "NULL"):
                raise Unsupported(f"a condition of type {p.type}")
        return predicates

    def filter(self, rel: Rel, conds: list[exp.Expression], subst) -> Rel:
        predicates = self._predicates(conds, rel.shape, subst)

        def run(ctx):
            frame = rel.run(ctx)
            for p in predicates:
                if frame.n == 0:
                    break
                keep, _ = truth(p.fn(frame))
                if not keep.all():
                    frame = frame.take(np.flatnonzero(keep))
            return frame

        def emit(g):
            frame = rel.emit(g)
            for p in predicates:
                keep, _ = gen.truth(g, p.emit(g, frame), frame.n)
                frame = _emit_take(g, frame, g.let(f"np.flatnonzero({keep})", "rows"))
            return frame
        generated = rel.emit and all(p.emit for p in predicates)
        return Rel(rel.shape, run, emit if generated else None)

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

        def emit(g):
            frame = rel.emit(g)
            key_cols = [k.emit(g, frame) for k in keys]
            _emit_no_negative_zero(g, key_cols, "GROUP BY a DOUBLE -0.0")
            order, starts, first = g.var("order"), g.var("starts"), g.var("first")
            empty = None
            if global_:  # one group of every row; over no rows, one row of empty results (as run)
                empty = g.let(f"{frame.n} == 0", "e")
                g.line(f"{order}, {starts} = np.arange({frame.n}), np.zeros(1, np.int64)")
            else:
                g.line(f"{order}, {starts}, {first} = groups({gen.key_codes(g, key_cols, None, frame.n, None)})")
            cols = [_emit_rows(g, k, first) for k in key_cols]
            cols += [c.emit(g, frame, order, starts, empty) for c in calls]
            return gen.GFrame([lambda g, c=c: c for c in cols], g.let(f"len({starts})", "n"))
        generated = rel.emit and all(k.emit and _generated_key(k.type) for k in keys) and all(
            c.arg is None or (c.arg.emit and (c.func == "count" or isinstance(c.arg.type, str))) for c in calls)
        return Rel(shape, run, emit if generated else None), subst

    def scalars(self, rel: Rel, conds: list[exp.Expression], env) -> tuple[Rel, list[exp.Expression]]:
        """Each scalar subquery in the WHERE conditions computed as a column of ``rel`` ("#sub<i>"), and the
        conditions reading those columns (a correlated one does not compile: its outer columns are unknown
        inside it)."""
        out, count = [], 0
        for cond in conds:
            if not cond.find(exp.Subquery):
                out.append(cond)
                continue
            cond = cond.copy()  # detached: its ancestors are its own nodes
            for sub in list(cond.find_all(exp.Subquery)):
                if isinstance(sub.parent, (exp.In, exp.Exists)) or (
                        sub.parent is not None and sub.parent.find_ancestor(exp.Subquery, exp.Exists, exp.In)):
                    continue  # not a scalar subquery, or one inside another subquery
                name = f"#sub{count}"
                inner, _ = self.query(sub.this, env)
                rel = _scalar(rel, inner, name)
                column = exp.column(name)
                if sub is cond:
                    cond = column
                else:
                    sub.replace(column)
                count += 1
            out.append(cond)
        return rel, out

    def windows(self, rel: Rel, items: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        """Each window function of the select list computed as a column of ``rel`` ("#win<i>"), and the
        select list reading those columns."""
        items = [item.copy() for item in items]
        count = 0
        for item in items:
            for node in list(item.find_all(exp.Window)):
                if node is item:
                    raise Unsupported("a window function without an alias")
                name = f"#win{count}"
                rel = _window(rel, node, name)
                node.replace(exp.column(name))
                count += 1
        return rel, items

    def project(self, rel: Rel, items: list[exp.Expression], subst, hidden=()) -> tuple[Rel, list[str]]:
        """The select list over ``rel``; ``hidden`` expressions (ORDER BY keys) follow as unnamed columns."""
        exprs: list[Expr] = []
        names: list[str] = []
        stars: list[int | None] = []  # per column: the input column a * passes on (None: an expression)
        common = Common([i for i in items if not isinstance(i, exp.Star)] + list(hidden))
        for item in items:
            star = isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
            if star:
                if subst is not None:
                    raise Unsupported("* with GROUP BY")
                table = item.table.lower() if isinstance(item, exp.Column) else ""
                for i, (q, n, t) in enumerate(rel.shape.columns):
                    if (not table or q == table) and not n.startswith("#"):  # "#...": a window's column
                        exprs.append(Expr(t, _slot(i)))
                        names.append(n)
                        stars.append(i)
                continue
            body = item.this if isinstance(item, exp.Alias) else item
            exprs.append(finish(compile_expr(body, rel.shape, subst, common)))
            names.append(item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else item.sql("duckdb"))
            stars.append(None)
        keys = [compile_expr(k, rel.shape, subst, common) for k in hidden]
        shape = Shape([("", n.lower(), e.type) for n, e in zip(names, exprs)]
                      + [("", f"#order{i}", k.type) for i, k in enumerate(keys)])
        exprs += keys
        stars += [None] * len(keys)

        def run(ctx):
            frame = rel.run(ctx)
            return Frame([e.fn(frame) for e in exprs], frame.n)

        def emit(g):
            frame = rel.emit(g)
            makers = []
            for e, star in zip(exprs, stars):
                if star is not None:  # a column passed on: made where first used
                    makers.append(frame.maker(star))
                else:  # computed here, as the closures do (its checks too)
                    col = e.emit(g, frame)
                    makers.append(lambda g, col=col: col)
            return gen.GFrame(makers, frame.n)
        generated = rel.emit and all(star is not None or e.emit for e, star in zip(exprs, stars))
        return Rel(shape, run, emit if generated else None), names


def _slot(i: int):
    return lambda f: f.cols[i]


def _aggregates(node: exp.Expression) -> list[exp.AggFunc]:
    found = []
    for a in node.find_all(exp.AggFunc):
        if a.find_ancestor(exp.AggFunc, exp.Window) is None:  # a window's function is not a grouping one
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



CROSS_PAIRS = 4_000_000  # row pairs a join without equalities may form per batch (else Fallback)
CROSS_CHUNK = 65_536  # pairs whose residual is computed at once (bounds the memory of a large cross)


def _is_true(node: exp.Expression) -> bool:
    return isinstance(node, exp.Boolean) and node.this is True


def _emit_pair_codes(g, pairs, lf, rf) -> str:
    """_pair_codes written out: source of the arguments of ``matches`` (both sides' codes, and skips)."""
    lv = [x.emit(g, lf) for x, _, _ in pairs]
    rv = [y.emit(g, rf) for _, y, _ in pairs]
    lc, rc = g.var("lc"), g.var("rc")
    g.line(f"{lc}, {rc} = {gen.key_codes(g, lv, rv, lf.n, rf.n)}")
    skips = []
    for side in (lv, rv):
        skip = "None"
        for (_, _, null_safe), c in zip(pairs, side):
            if not null_safe and c.valid is not None:
                skip = g.let(f"{skip} if {c.valid} is None else (~{c.valid} if {skip} is None else {skip} | ~{c.valid})")
        skips.append(skip)
    return f"{lc}, {rc}, {skips[0]}, {skips[1]}"


def _generated_key(*types) -> bool:
    """Key columns generated code codes: our computed types, or strings of one Arrow type (coded from their
    gathered arrays, as the closures code them)."""
    if all(isinstance(t, str) for t in types):
        return True
    return all(gen.is_string(t) for t in types) and len(set(types)) == 1


def _emit_no_negative_zero(g, cols, reason: str) -> None:
    """Fall back where a DOUBLE key column holds -0.0 (DuckDB keeps the zero it met first)."""
    zero = g.const(negative_zero, "negative_zero")
    for c in cols:
        if c.type == "DOUBLE":
            g.fallback_if(f"{zero}({c.data}, {c.valid})", reason)


def _emit_rows(g, c, rows: str):
    """Column ``c`` at the positions in variable ``rows``."""
    valid = None if c.valid is None else g.let(f"None if {c.valid} is None else {c.valid}[{rows}]", "m")
    return gen.moved(c, g.let(f"{c.data}[{rows}]", "d"), valid)


def _emit_take(g, frame, rows: str):
    """``frame``'s rows at the positions in variable ``rows`` (each column gathered where first used).

    A take of a take (filters in a row, a filter after a join) composes the positions and gathers
    each column once from the first frame, not once per take: one gather of the positions per
    take instead of one per column per take."""
    if frame.taken is not None:
        source, before = frame.taken
        rows = g.let(f"{before}[{rows}]", "rows")
        frame = source
    return gen.GFrame([lambda g, i=i: _emit_rows(g, frame.col(g, i), rows) for i in range(len(frame.makers))],
                      g.let(f"len({rows})", "n"), taken=(frame, rows))


def _passing(residual: list[Expr], lf: Frame, rf: Frame, li: np.ndarray, ri: np.ndarray):
    """The pairs (li, ri) on which every residual condition is true."""
    frame = Frame([c.take(li) for c in lf.cols] + [c.take(ri) for c in rf.cols], len(li))
    keep = np.ones(len(li), bool)
    for p in residual:
        keep &= truth(p.fn(frame))[0]
    return li[keep], ri[keep]


def _pairs_with(left: np.ndarray, right_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of the ``left`` rows with every one of ``right_rows`` rows: (left rows, right rows)."""
    return np.repeat(left, right_rows), np.tile(np.arange(right_rows), len(left))


def cross_pairs(left_rows: int, right_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (left row, right row) pair, for generated code: at most CROSS_CHUNK of them (the residual is
    computed over all at once), else a Fallback (the closures then form them in chunks, or hand the
    batch to DuckDB)."""
    if left_rows * right_rows > CROSS_CHUNK:
        raise Fallback(f"a join without equalities over {left_rows} x {right_rows} rows")
    return _pairs_with(np.arange(left_rows), right_rows)


def _cross(residual: list[Expr], lf: Frame, rf: Frame) -> tuple[np.ndarray, np.ndarray]:
    """Every (left row, right row) pair where the residual is true, formed in chunks of left rows."""
    total = lf.n * rf.n
    if total > CROSS_PAIRS:
        raise Fallback(f"a join without equalities over {lf.n} x {rf.n} rows")
    if not residual or total <= CROSS_CHUNK:
        li, ri = _pairs_with(np.arange(lf.n), rf.n)
        return _passing(residual, lf, rf, li, ri) if residual else (li, ri)
    step = max(1, CROSS_CHUNK // rf.n)
    parts = []
    for start in range(0, lf.n, step):  # chunks of rows, not a loop over rows
        rows = np.arange(start, min(start + step, lf.n))
        parts.append(_passing(residual, lf, rf, *_pairs_with(rows, rf.n)))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])



def _set_type(a, b, what: str):
    """The type of a set operation's column whose sides have types ``a`` and ``b``: DuckDB casts both
    sides to their common type, as it does CASE's branches (integers widen; NULL takes the other type)."""
    return unify([Expr(a, None), Expr(b, None)], f"{what} of inputs with different column types:")


def _as(v: Vec, source, t) -> Vec:
    """A column of a set operation's side (of the shape's type ``source``) as the operation's type ``t`` (a
    _set_type result). A NULL column of the shape is every row NULL, whatever type its vector holds (a NULL
    literal's is BIGINT)."""
    if source == t or str(source) == str(t):
        return v
    if source == "NULL" or v.type == "NULL":
        return constant(t, None, len(v)) if isinstance(t, str) else Vec(t, array=pa.nulls(len(v), t))
    return Vec.of(t, *convert(v, t))


def _emits_as(source, t) -> bool:
    """Whether generated code casts a set operation's column of type ``source`` to ``t`` (``_emit_as``)."""
    if source == t:
        return isinstance(t, str) or gen.is_string(t)
    return isinstance(t, str) and isinstance(source, str) or (source == "NULL" and gen.is_string(t))


def _emit_as(g, c, source, t, n: str):
    """``_as`` while generating: a side's column (of the shape's type ``source``) as the set operation's
    type ``t``. A NULL column of the shape is every row NULL, whatever numpy type holds it."""
    if source == t:
        return c
    if source == "NULL":
        return gen.string_nulls(g, n) if gen.is_string(t) else gen.constant(g, t, None, n)
    return gen.convert(g, c, t)


def _count(node: exp.Expression | None) -> int | None:
    """The row count of a LIMIT/OFFSET clause: a non-negative integer literal (None: no clause)."""
    if node is None:
        return None
    value = node.args.get("expression")
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()) or node.args.get(
            "percent") or node.args.get("with_ties") or node.args.get("expressions"):
        raise Unsupported(f"{node.sql(dialect='duckdb')[:40]}")
    return int(value.this)


def _limit(rel: Rel, visible: int, keys: list[tuple[bool, bool]], count: int | None, skip: int) -> Rel:
    """ORDER BY the columns after the first ``visible`` (``keys``: (descending, NULLs first) each), then
    OFFSET ``skip`` LIMIT ``count``; the ordering columns are dropped.

    The result must be the one DuckDB gives, which is a choice when rows tie:
    where rows equal in every ORDER BY key straddle the cut (the OFFSET or the
    LIMIT), DuckDB may take any of them, so they must be the same row in the
    output columns, else the batch falls back. Without ORDER BY, a LIMIT is
    exact only when it takes every row (more rows fall back), and an OFFSET
    is Unsupported. ORDER BY alone orders rows (a result is a multiset).
    """
    if not keys and skip:
        raise Unsupported("OFFSET without ORDER BY (DuckDB's choice of rows is arbitrary)")
    shape = Shape(rel.shape.columns[:visible])

    def run(ctx):
        frame = rel.run(ctx)
        cols, n = frame.cols[:visible], frame.n
        if not keys:
            if count is not None and n > count:
                raise Fallback(f"LIMIT {count} without ORDER BY over {n} rows (DuckDB's choice is arbitrary)")
            return Frame(cols, n)
        ranks = [order_ranks(v, desc, first) for v, (desc, first) in zip(frame.cols[visible:], keys)]
        order = np.lexsort(ranks[::-1]) if n else np.empty(0, np.int64)
        end = n if count is None else min(n, skip + count)
        for cut in (skip, end) if count is not None or skip else ():
            if 0 < cut < n and all(r[order[cut - 1]] == r[order[cut]] for r in ranks):
                tied = np.ones(n, bool)
                for r in ranks:
                    tied &= r == r[order[cut]]
                _same_rows_or_fallback(cols, np.flatnonzero(tied))
        chosen = order[skip:end]
        return Frame([c.take(chosen) for c in cols], len(chosen))
    return Rel(shape, run)


def _same_rows_or_fallback(cols: list[Vec], rows: np.ndarray) -> None:
    """Fallback unless ``rows`` hold one row in ``cols`` (rows tied in ORDER BY across a LIMIT's cut)."""
    taken = [c.take(rows) for c in cols]
    for c in taken:
        if c.type == "DOUBLE" and negative_zero(*c.np()):
            raise Fallback("rows tied across a LIMIT with a DOUBLE -0.0 (DuckDB may take either zero)")
    if taken and len(np.unique(codes(taken, len(rows)))) > 1:
        raise Fallback("different rows tie in ORDER BY across a LIMIT/OFFSET (DuckDB's choice is arbitrary)")



def _window(rel: Rel, node: exp.Window, name: str) -> Rel:
    """``rel`` with the window function ``node`` as one more column ``name``.

    SUM (of integers) or COUNT over ``PARTITION BY ... ORDER BY ...`` with
    DuckDB's frames: without ORDER BY the whole partition; with it and no
    frame clause, RANGE from the partition's start to the current row's last
    peer (rows equal in every ORDER BY key); ``ROWS BETWEEN UNBOUNDED
    PRECEDING AND CURRENT ROW``, a running sum up to the row itself, which
    depends on the order DuckDB gives peers: a batch where peers differ in
    any column falls back. SUM over no non-NULL value is NULL. DOUBLE sums
    stay on DuckDB (its segment tree adds in another order: inf - inf).
    """
    extra = [k for k, v in node.args.items() if v and k not in ("this", "partition_by", "order", "spec", "over")]
    if extra or node.args.get("over", "OVER").upper() != "OVER":
        raise Unsupported(f"window {node.sql(dialect='duckdb')[:40]}")
    func = node.this
    if not isinstance(func, (exp.Sum, exp.Count)):
        raise Unsupported(f"window function {type(func).__name__.upper()}")
    call = _aggregate_call(func, rel.shape)
    if call.func == "sum" and call.type != "HUGEINT":
        raise Unsupported(f"SUM OVER of {call.arg.type} (DuckDB's segment tree adds in another order)")
    parts = [compile_expr(p, rel.shape) for p in node.args.get("partition_by") or []]
    ordered = node.args["order"].expressions if node.args.get("order") else []
    if any(isinstance(o.this, exp.Literal) for o in ordered):
        raise Unsupported("a window ordered by a constant")
    keys = [(compile_expr(o.this, rel.shape), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
            for o in ordered]
    spec = node.args.get("spec")
    frame = "partition" if not keys else "range"
    if spec is not None:
        bounds = (str(spec.args.get("kind") or "").upper(), str(spec.args.get("start") or "").upper(),
                  str(spec.args.get("start_side") or "").upper(), str(spec.args.get("end") or "").upper(),
                  str(spec.args.get("end_side") or "").upper())
        if bounds[1:3] != ("UNBOUNDED", "PRECEDING") or spec.args.get("exclude"):
            raise Unsupported(f"window frame {spec.sql(dialect='duckdb')}")
        if bounds[3:] == ("UNBOUNDED", "FOLLOWING"):
            frame = "partition"
        elif bounds[3] == "CURRENT ROW" and bounds[0] in ("ROWS", "RANGE"):
            frame = "rows" if bounds[0] == "ROWS" and keys else frame
        else:
            raise Unsupported(f"window frame {spec.sql(dialect='duckdb')}")
    shape = Shape(rel.shape.columns + [("", name, call.type)])

    def run(ctx):
        f = rel.run(ctx)
        n = f.n
        part = codes([p.fn(f) for p in parts], n) if parts else np.zeros(n, np.int64)
        ranks = [order_ranks(k.fn(f), desc, first) for k, desc, first in keys]
        order = np.lexsort(ranks[::-1] + [part]) if n else np.empty(0, np.int64)
        if call.arg is None:
            values, valid = np.ones(n, np.int64), None
        else:
            values, valid = call.arg.fn(f).np()
            if call.func == "count":
                values, valid = (np.ones(n, np.int64) if valid is None else valid.astype(np.int64)), None
        values = values[order] if valid is None else np.where(valid[order], values[order], 0)
        if call.func == "sum" and n:
            biggest = int(np.abs(values).max())
            if biggest and (biggest >= 2**62 or float(biggest) * n >= 2.0**62):
                raise Fallback("a windowed SUM that may leave BIGINT")
        present = np.ones(n, np.int64) if valid is None else valid[order].astype(np.int64)
        new_part = np.ones(n, bool)
        new_part[1:] = part[order][1:] != part[order][:-1]
        new_peer = new_part.copy()
        for r in ranks:
            new_peer[1:] |= r[order][1:] != r[order][:-1]
        totals, counts = _running(values, new_part), _running(present, new_part)
        if frame != "rows":  # every row takes the value at its last peer (or its partition's last row)
            last = _group_last(new_part if frame == "partition" else new_peer)
            totals, counts = totals[last], counts[last]
        elif n and not new_peer.all():  # peers: the running sums they get depend on DuckDB's order
            if any(c.type == "DOUBLE" and negative_zero(*c.np()) for c in f.cols):
                raise Fallback("a ROWS window over rows with a DOUBLE -0.0 (peers may differ in the zero)")
            rows = codes(f.cols, n)[order]
            if (rows[1:] != rows[:-1])[~new_peer[1:]].any():
                raise Fallback("rows that tie in a ROWS window's ORDER BY differ (DuckDB's order among them "
                               "is arbitrary)")
        out = np.empty(n, np.int64)
        out[order] = totals
        has = np.empty(n, bool)
        has[order] = counts > 0
        result = Vec.of(call.type, out, None if call.func == "count" else has)
        return Frame(f.cols + [result], n)
    return Rel(shape, run)


def _running(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``values`` restarting where ``starts`` is true."""
    total = np.cumsum(values)
    if not len(values):
        return total
    first = np.maximum.accumulate(np.where(starts, np.arange(len(values)), 0))  # each row's group start
    return total - (total - values)[first]


def _group_last(starts: np.ndarray) -> np.ndarray:
    """For each position, the last position of the group it is in (groups begin where ``starts``)."""
    n = len(starts)
    if not n:
        return np.empty(0, np.int64)
    begin = np.flatnonzero(starts)
    ends = np.append(begin[1:], n) - 1
    return np.repeat(ends, np.diff(np.append(begin, n)))



def _scalar(rel: Rel, sub: Rel, name: str) -> Rel:
    """``rel`` with the value of the uncorrelated scalar subquery ``sub`` as one more column ``name``:
    NULL when it has no row, and (as DuckDB raises there) a fallback when it has more than one."""
    if len(sub.shape.columns) != 1:
        raise Unsupported("a scalar subquery with more than one column")
    shape = Shape(rel.shape.columns + [("", name, sub.shape.columns[0][2])])

    def run(ctx):
        f, s = rel.run(ctx), sub.run(ctx)
        if s.n > 1:
            raise Fallback("a scalar subquery returned more than one row (DuckDB raises)")
        value = s.cols[0].take(np.zeros(f.n, np.int64), None if s.n else np.ones(f.n, bool))
        return Frame(f.cols + [value], f.n)
    return Rel(shape, run)


def _distinct(rel: Rel) -> Rel:
    def run(ctx):
        frame = rel.run(ctx)
        if frame.n == 0:
            return frame
        if any(c.type == "DOUBLE" and negative_zero(*c.np()) for c in frame.cols):
            raise Fallback("DISTINCT over a DOUBLE -0.0 (DuckDB keeps the zero it met first)")
        _, _, first = groups(codes(frame.cols, frame.n))
        return frame.take(np.sort(first))

    def emit(g):
        frame = rel.emit(g)
        cols = [frame.col(g, i) for i in range(len(frame.makers))]
        _emit_no_negative_zero(g, cols, "DISTINCT over a DOUBLE -0.0")
        first = g.var("first")
        g.line(f"_, _, {first} = groups({gen.key_codes(g, cols, None, frame.n, None)})")
        return _emit_take(g, frame, g.let(f"np.sort({first})", "rows"))
    generated = rel.emit and all(_generated_key(t) for *_, t in rel.shape.columns)
    return Rel(rel.shape, run, emit if generated else None)


class _Call:
    """One aggregate call: COUNT(*), COUNT(x), SUM(x), MIN(x), MAX(x), BOOL_AND(x), BOOL_OR(x).

    Each ignores NULLs and gives NULL over a group without a value (COUNT: 0).
    """

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
        if self.func in ("bool_and", "bool_or"):
            return Vec.of("BOOLEAN", group_all(data, valid, order, starts, self.func == "bool_and"), count > 0)
        if self.func == "sum":
            out = group_sum(data, valid, order, starts)
        else:
            out = group_extreme(data, valid, order, starts, self.func == "max")
        return Vec.of(self.type, out, count > 0)

    def emit(self, g, frame, order: str, starts: str, empty: str | None = None):
        """``run`` written out (generated.py): the group values of this call. ``empty``: the variable that
        says a global aggregate has no rows; its one group then holds ``empty_result`` (the kernels are
        not called: they reduce at the group starts of the rows there are)."""
        def guarded(text: str, instead: str) -> str:
            return text if empty is None else f"{instead} if {empty} else {text}"
        zero = "np.zeros(1, np.int64)"
        if self.arg is None:
            return gen.Col("BIGINT", g.let(guarded(f"group_count(None, {order}, {starts}, {frame.n})", zero), "d"),
                           None)
        x = self.arg.emit(g, frame)
        count = guarded(f"group_count({x.valid}, {order}, {starts}, {frame.n})", zero)
        if self.func == "count":
            return gen.Col("BIGINT", g.let(count, "d"), None)
        # Counted only to find the groups without a value (NULL): none when no value is NULL.
        count = g.let(f"None if {x.valid} is None else {count}", "d")
        if self.func in ("bool_and", "bool_or"):
            data = f"group_all({x.data}, {x.valid}, {order}, {starts}, {self.func == 'bool_and'})"
        elif self.func == "sum":
            data = f"group_sum({x.data}, {x.valid}, {order}, {starts})"
        else:
            data = f"group_extreme({x.data}, {x.valid}, {order}, {starts}, {self.func == 'max'})"
        data = guarded(data, f"np.zeros(1, {g.const(gen.numpy_type(self.type), 'dt')})")
        # A group has a row, so without NULLs it has a value: valid where it has a non-NULL one.
        valid = None if x.valid is None else g.let(f"None if {count} is None else {count} > 0", "m")
        if empty is not None:  # no rows: NULL
            valid = g.let(f"np.zeros(1, bool) if {empty} else {valid}", "m")
        return gen.Col(self.type, g.let(data, "d"), valid)

    def empty_result(self) -> Vec:
        if self.func == "count":
            return constant("BIGINT", 0, 1)
        return constant(self.type, None, 1)


def _aggregate_call(node: exp.AggFunc, shape: Shape) -> _Call:
    name = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.LogicalAnd: "bool_and",
            exp.LogicalOr: "bool_or"}.get(type(node))
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
    if name in ("bool_and", "bool_or"):
        if t != "BOOLEAN":  # DuckDB casts the argument to BOOLEAN; only booleans are taken as they are
            raise Unsupported(f"{name.upper()} of {t}")
        return _Call(name, compiled, "BOOLEAN")
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
