"""Scalar SQL expressions compiled once into vectorized closures over a frame's columns.

    >>> e = compile_expr(parse_one("CASE WHEN x > 0 THEN x * 2 ELSE NULL END"), shape)
    >>> e.type, e.fn(frame)        # ("BIGINT", Vec) for a BIGINT x

Implements, with DuckDB's meaning (DuckDB is the reference):
integer (TINYINT..BIGINT, HUGEINT held in int64) and DOUBLE ``+ - *`` and
unary minus, ``/`` (always DOUBLE; a zero divisor falls back), with DuckDB's result types (the wider integer; DOUBLE when
either side is; an integer literal takes the other side's type when it fits);
an integer result outside its type is a ``Fallback`` (DuckDB raises, numpy
wraps); comparisons ``= <> < <= > >=`` of numbers (DOUBLE: NaN equals NaN
and sorts above everything, -0.0 = 0.0), of booleans, and ``=``/``<>`` of
two columns of one other type (strings by bytes, dates...); ``IS [NOT]
DISTINCT FROM`` of the same; AND/OR/NOT with three-valued logic; ``IS
NULL``; searched CASE, COALESCE, GREATEST/LEAST (skip NULLs) over numbers
and booleans (COALESCE also other types); CAST among integers, DOUBLE and
BOOLEAN and DECIMAL(38,0) (DOUBLE to integer rounds half to even; NaN, infinities and values
out of range fall back), CAST of a string literal to DOUBLE (folded);
ISFINITE, ISNAN. Anything else raises ``Unsupported`` at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from ivm.compiled.vectors import (
    INT_RANGE, INT_RANK, NUMPY, Fallback, Unsupported, Vec, check_range, constant, is_int, is_number, negative_zero,
)

INTLIT = "INTLIT"  # an integer literal, typed by what it meets (DuckDB's INTEGER_LITERAL)
CASTS = {
    exp.DataType.Type.TINYINT: "TINYINT", exp.DataType.Type.SMALLINT: "SMALLINT", exp.DataType.Type.INT: "INTEGER",
    exp.DataType.Type.BIGINT: "BIGINT", exp.DataType.Type.INT128: "HUGEINT", exp.DataType.Type.DOUBLE: "DOUBLE",
    exp.DataType.Type.BOOLEAN: "BOOLEAN",
}
COMPARISONS = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}
ARITHMETIC = {exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul"}


@dataclass
class Expr:
    type: object  # a logical type (vectors.py), INTLIT, or an Arrow type
    fn: Callable[["Frame"], Vec]  # noqa: F821 (relational.Frame: .cols, .n)
    value: object = None  # a literal's Python value
    literal: bool = False


class Shape:
    """The columns a frame will hold, at compile time: (qualifier, name, type) each, lower case names."""

    def __init__(self, columns: list[tuple[str, str, object]]):
        self.columns = columns

    def resolve(self, column: exp.Column) -> int:
        name, table = column.name.lower(), column.table.lower()
        hits = [i for i, (q, n, _) in enumerate(self.columns) if n == name and (not table or q == table)]
        if len(hits) != 1:
            raise Unsupported(f"column {column.sql()} is {'ambiguous' if hits else 'not found'} here")
        return hits[0]


def lit_type(value: int) -> str:
    """The narrowest integer type holding ``value`` (what DuckDB gives a literal it widens to)."""
    for name, (low, high) in INT_RANGE.items():
        if low <= value <= high:
            return name
    raise Unsupported(f"integer literal {value} outside BIGINT")


def unify(exprs: list[Expr], what: str):
    """The common type of CASE/COALESCE/GREATEST arguments, as DuckDB binds it."""
    types = [e.type for e in exprs if e.type != "NULL"]
    if not types:
        return "NULL"
    if all(t == INTLIT for t in types):
        return _lits_type(exprs)
    known = [t for t in types if t != INTLIT]
    if all(is_int(t) for t in known):
        wide = max(known, key=INT_RANK.get)
        for e in exprs:
            if e.type == INTLIT:
                wide = max(wide, lit_type(e.value), key=INT_RANK.get)
        return wide
    if all(is_number(t) or t == INTLIT for t in types):
        return "DOUBLE"
    if len(set(map(str, types))) == 1 and INTLIT not in types:
        return types[0]
    raise Unsupported(f"{what} over types {', '.join(map(str, types))}")


def _lits_type(exprs: list[Expr]) -> str:
    widest = "INTEGER"
    for e in exprs:
        if e.type == INTLIT:
            widest = max(widest, lit_type(e.value), key=INT_RANK.get)
    return widest


def convert(v: Vec, target) -> tuple[np.ndarray, np.ndarray | None]:
    """(data, valid) of a computed column as numpy data of ``target`` (a unify() result, widening only)."""
    data, valid = v.np()
    dtype = NUMPY.get(target)
    if dtype is not None and data.dtype != dtype:
        data = data.astype(dtype)
    return data, valid


def as_type(e: Expr, target) -> Callable:
    """fn(frame) -> (data, valid) of ``e`` widened to ``target`` (a unify() result)."""
    return lambda f: convert(e.fn(f), target)


def compile_expr(node: exp.Expression, shape: Shape, subst: dict[str, int] | None = None) -> Expr:
    """Compile ``node`` over ``shape``; ``subst`` maps an expression's SQL to a column (grouped values)."""
    return _Compiler(shape, subst or {}).compile(node)


def finish(e: Expr) -> Expr:
    """``e`` as a column of a result: an integer literal becomes an INTEGER (or wider) constant."""
    if e.type != INTLIT:
        return e
    t = lit_type(e.value)
    t = t if INT_RANK[t] >= INT_RANK["INTEGER"] else "INTEGER"
    value = e.value
    return Expr(t, lambda f: constant(t, value, f.n))


class _Compiler:
    def __init__(self, shape: Shape, subst: dict[str, int]):
        self.shape = shape
        self.subst = subst

    def compile(self, node: exp.Expression) -> Expr:
        if self.subst:
            slot = self.subst.get(node.sql(dialect="duckdb"))
            if slot is not None:
                return self._slot(slot)
        if isinstance(node, exp.Paren):
            return self.compile(node.this)
        if isinstance(node, exp.Column):
            if self.subst:
                raise Unsupported(f"column {node.sql()} is neither grouped nor aggregated")
            if isinstance(node.this, exp.Star):
                raise Unsupported("* inside an expression")
            return self._slot(self.shape.resolve(node))
        method = getattr(self, "_" + type(node).__name__.lower(), None)
        if method is None:
            if isinstance(node, exp.AggFunc):
                raise Unsupported(f"aggregate {node.sql()} outside a grouping SELECT")
            raise Unsupported(f"expression {type(node).__name__} ({node.sql(dialect='duckdb')[:60]})")
        return method(node)

    def _slot(self, index: int) -> Expr:
        t = self.shape.columns[index][2]
        return Expr(t, lambda f: f.cols[index])

    # --- literals -------------------------------------------------------------
    def _literal(self, node: exp.Literal) -> Expr:
        if node.is_string:
            value = node.this
            return Expr(pa.string(), lambda f: Vec(pa.string(), array=pa.array([value] * f.n, pa.string())),
                        value=value, literal=True)
        try:
            value = int(node.this)
        except ValueError:
            raise Unsupported(f"non-integer numeric literal {node.this} (DuckDB types it DECIMAL)") from None
        lit_type(value)
        return Expr(INTLIT, lambda f: constant("BIGINT", value, f.n), value=value, literal=True)

    def _boolean(self, node: exp.Boolean) -> Expr:
        value = bool(node.this)
        return Expr("BOOLEAN", lambda f: constant("BOOLEAN", value, f.n), value=value, literal=True)

    def _null(self, node: exp.Null) -> Expr:
        return Expr("NULL", lambda f: constant("BIGINT", None, f.n), literal=True)

    # --- arithmetic -------------------------------------------------------------
    def _arith(self, node: exp.Expression, op: str) -> Expr:
        a, b = self.compile(node.this), self.compile(node.expression)
        if a.type == INTLIT and b.type == INTLIT:
            raise Unsupported("arithmetic of two literals (not folded)")
        t = unify([a, b], f"arithmetic {op}")
        if not is_number(t):
            raise Unsupported(f"arithmetic {op} over {a.type} and {b.type}")
        fa, fb = as_type(a, t), as_type(b, t)

        def run(f):
            (x, vx), (y, vy) = fa(f), fb(f)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            return Vec.of(t, _arith_kernel(op, t, x, y, valid), valid)
        return Expr(t, run)

    def _add(self, node):
        return self._arith(node, "add")

    def _sub(self, node):
        return self._arith(node, "sub")

    def _mul(self, node):
        return self._arith(node, "mul")

    def _div(self, node: exp.Div) -> Expr:
        """``/``: DOUBLE division (of integers too); a zero divisor falls back (DuckDB's x/-0.0 is +inf)."""
        if node.args.get("typed") or node.args.get("safe"):
            raise Unsupported("typed or safe division")
        a, b = self.compile(node.this), self.compile(node.expression)
        if not all(is_number(e.type) or e.type in (INTLIT, "NULL") for e in (a, b)) or INTLIT == a.type == b.type:
            raise Unsupported(f"division of {a.type} by {b.type}")
        fa, fb = as_type(a, "DOUBLE"), as_type(b, "DOUBLE")

        def run(f):
            (x, vx), (y, vy) = fa(f), fb(f)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            zero = y == 0
            if (zero.any() if valid is None else (zero & valid).any()):
                raise Fallback("division by zero")
            with np.errstate(all="ignore"):
                return Vec.of("DOUBLE", x / np.where(zero, 1.0, y), valid)
        return Expr("DOUBLE", run)

    def _neg(self, node: exp.Neg) -> Expr:
        a = self.compile(node.this)
        if a.type == INTLIT:
            value = -a.value
            return Expr(INTLIT, lambda f: constant("BIGINT", value, f.n), value=value, literal=True)
        if not is_number(a.type):
            raise Unsupported(f"unary minus of {a.type}")
        t = a.type

        def run(f):
            x, valid = a.fn(f).np()
            if t != "DOUBLE":
                low = INT_RANGE[t][0]
                if ((x == low) if valid is None else ((x == low) & valid)).any():
                    raise Fallback(f"-({low}) outside {t}")
            return Vec.of(t, -x, valid)
        return Expr(t, run)

    # --- comparisons ------------------------------------------------------------
    def _compare(self, node: exp.Expression, op: str, null_safe: bool = False) -> Expr:
        a, b = self.compile(node.this), self.compile(node.expression)
        kernel = _comparison(a, b, "eq" if null_safe else op)

        def run(f):
            x, y = a.fn(f), b.fn(f)
            data = kernel(x, y)
            vx, vy = x.valid(), y.valid()
            if null_safe:
                if vx is not None or vy is not None:
                    vx = np.ones(f.n, bool) if vx is None else vx
                    vy = np.ones(f.n, bool) if vy is None else vy
                    data = np.where(vx & vy, data, ~vx & ~vy)
                return Vec.of("BOOLEAN", data if op == "eq" else ~data)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            return Vec.of("BOOLEAN", data, valid)
        return Expr("BOOLEAN", run)

    def _eq(self, node):
        return self._compare(node, "eq")

    def _neq(self, node):
        return self._compare(node, "ne")

    def _lt(self, node):
        return self._compare(node, "lt")

    def _lte(self, node):
        return self._compare(node, "le")

    def _gt(self, node):
        return self._compare(node, "gt")

    def _gte(self, node):
        return self._compare(node, "ge")

    def _nullsafeeq(self, node):
        return self._compare(node, "eq", null_safe=True)

    def _nullsafeneq(self, node):
        return self._compare(node, "ne", null_safe=True)

    # --- logic ----------------------------------------------------------------
    def _bools(self, *nodes) -> list[Expr]:
        out = [self.compile(n) for n in nodes]
        for e in out:
            if e.type not in ("BOOLEAN", "NULL"):
                raise Unsupported(f"boolean operator over {e.type}")
        return out

    def _and(self, node):
        return self._logic(node, True)

    def _or(self, node):
        return self._logic(node, False)

    def _logic(self, node, conjunction: bool) -> Expr:
        a, b = self._bools(node.this, node.expression)

        def run(f):
            ta, fa = truth(a.fn(f))
            tb, fb = truth(b.fn(f))
            t, fl = (ta & tb, fa | fb) if conjunction else (ta | tb, fa & fb)
            return Vec.of("BOOLEAN", t, t | fl)
        return Expr("BOOLEAN", run)

    def _not(self, node: exp.Not) -> Expr:
        (a,) = self._bools(node.this)

        def run(f):
            t, fl = truth(a.fn(f))
            return Vec.of("BOOLEAN", fl, t | fl)
        return Expr("BOOLEAN", run)

    def _is(self, node: exp.Is) -> Expr:
        if not isinstance(node.expression, exp.Null):
            raise Unsupported(f"IS {node.expression.sql()}")
        a = self.compile(node.this)

        def run(f):
            valid = a.fn(f).valid()
            return Vec.of("BOOLEAN", np.zeros(f.n, bool) if valid is None else ~valid)
        return Expr("BOOLEAN", run)

    # --- conditionals -------------------------------------------------------------
    def _case(self, node: exp.Case) -> Expr:
        if node.this is not None:
            raise Unsupported("CASE x WHEN ... (simple CASE)")
        conds = self._bools(*[i.this for i in node.args["ifs"]])
        values = [self.compile(i.args["true"]) for i in node.args["ifs"]]
        default = self.compile(node.args["default"]) if node.args.get("default") is not None else None
        t = unify(values + ([default] if default else []), "CASE")
        if not isinstance(t, str) or t == "NULL":
            raise Unsupported(f"CASE over {t}")
        branches = [as_type(v, t) for v in values]
        otherwise = as_type(default, t) if default is not None else None

        def run(f):
            if otherwise is None:
                data, valid = constant(t, None, f.n).np()
            else:
                data, valid = otherwise(f)
                valid = np.ones(f.n, bool) if valid is None else valid
            for cond, branch in zip(reversed(conds), reversed(branches)):
                hit, _ = truth(cond.fn(f))
                if hit.any():
                    x, vx = branch(f)
                    data = np.where(hit, x, data)
                    valid = np.where(hit, True if vx is None else vx, valid)
            return Vec.of(t, data, valid)
        return Expr(t, run)

    def _coalesce(self, node: exp.Coalesce) -> Expr:
        args = [self.compile(a) for a in [node.this, *node.expressions]]
        t = unify(args, "COALESCE")
        if t == "NULL":
            raise Unsupported("COALESCE of NULLs")
        if not isinstance(t, str):
            def run_arrow(f):
                return Vec(t, array=pc.coalesce(*[a.fn(f).arrow() for a in args]))
            return Expr(t, run_arrow)
        parts = [as_type(a, t) for a in args]

        def run(f):
            data, valid = parts[0](f)
            if valid is None:
                return Vec.of(t, data)
            data, valid = data.copy(), valid.copy()
            for part in parts[1:]:
                x, vx = part(f)
                take = ~valid if vx is None else (~valid & vx)
                data[take] = x[take]
                valid |= take
                if valid.all():
                    break
            return Vec.of(t, data, valid)
        return Expr(t, run)

    def _greatest(self, node):
        return self._extreme([node.this, *node.expressions], "gt")

    def _least(self, node):
        return self._extreme([node.this, *node.expressions], "lt")

    def _extreme(self, nodes, op: str) -> Expr:
        args = [self.compile(a) for a in nodes]
        t = unify(args, "GREATEST/LEAST")
        if not is_number(t):
            raise Unsupported(f"GREATEST/LEAST over {t}")
        parts = [as_type(a, t) for a in args]
        better = _order_kernel(op, t == "DOUBLE")

        def run(f):
            data, valid = parts[0](f)
            valid = np.ones(f.n, bool) if valid is None else valid
            for part in parts[1:]:
                x, vx = part(f)
                vx = np.ones(f.n, bool) if vx is None else vx
                if t == "DOUBLE" and (negative_zero(x, vx) or negative_zero(data, valid)):
                    raise Fallback("GREATEST/LEAST of -0.0")
                pick = vx & (~valid | better(x, data))
                data = np.where(pick, x, data)
                valid = valid | vx
            return Vec.of(t, data, valid)
        return Expr(t, run)

    def _anonymous(self, node: exp.Anonymous) -> Expr:
        name = str(node.this).upper()
        args = node.expressions
        if name in ("ISFINITE", "ISNAN") and len(args) == 1:
            return self._float_test(args[0], np.isfinite if name == "ISFINITE" else np.isnan)
        if name in ("GREATEST", "LEAST") and args:
            return self._extreme(args, "gt" if name == "GREATEST" else "lt")
        raise Unsupported(f"function {name}")

    def _isnan(self, node):
        return self._float_test(node.this, np.isnan)

    def _float_test(self, arg, test) -> Expr:
        a = self.compile(arg)
        if a.type != "DOUBLE":
            raise Unsupported(f"ISFINITE/ISNAN of {a.type}")

        def run(f):
            x, valid = a.fn(f).np()
            return Vec.of("BOOLEAN", test(x), valid)
        return Expr("BOOLEAN", run)

    def _cast(self, node: exp.Cast) -> Expr:
        to = node.args["to"]
        target = CASTS.get(to.this) if not to.expressions else None
        if to.this == exp.DataType.Type.DECIMAL and [p.sql() for p in to.expressions] == ["38", "0"]:
            target = "HUGEINT"  # DECIMAL(38,0): integers whose + - * and SUM are HUGEINT's (same Arrow type)
        if target is None:
            raise Unsupported(f"CAST to {to.sql(dialect='duckdb')}")
        a = self.compile(node.this)
        if a.literal:
            return self._cast_literal(a, target)
        source = a.type
        if source == target:
            return a
        if source == "NULL":
            return Expr(target, lambda f: constant(target, None, f.n))
        if is_int(source) and is_int(target):
            def narrow(f):
                x, valid = a.fn(f).np()
                check_range(target, x, valid, "CAST")
                return Vec.of(target, x, valid)
            return Expr(target, narrow)
        if is_int(source) and target == "DOUBLE":
            return Expr(target, lambda f: _map(a.fn(f), target, lambda x: x.astype(np.float64)))
        if source == "DOUBLE" and is_int(target):
            def round_(f):
                x, valid = a.fn(f).np()
                live = x if valid is None else x[valid]
                low, high = INT_RANGE[target]
                if len(live) and not (np.isfinite(live).all() and live.min() >= max(low, -9.2e18)
                                      and live.max() <= min(high, 9.2e18)):
                    raise Fallback(f"CAST of a DOUBLE outside {target} (or not finite)")
                return Vec.of(target, np.rint(np.where(np.isfinite(x), x, 0)).astype(np.int64), valid)
            return Expr(target, round_)
        if source == "BOOLEAN" and is_int(target):
            return Expr(target, lambda f: _map(a.fn(f), target, lambda x: x.astype(np.int64)))
        raise Unsupported(f"CAST from {source} to {target}")

    def _cast_literal(self, a: Expr, target: str) -> Expr:
        value = a.value
        if value is None:
            return Expr(target, lambda f: constant(target, None, f.n), literal=True)
        if target == "DOUBLE":
            try:
                value = float(value)
            except ValueError:
                raise Unsupported(f"CAST({value!r} AS DOUBLE)") from None
            if isinstance(a.value, str) and a.value.strip().lower() not in ("inf", "-inf", "nan", "+inf", "infinity",
                                                                          "-infinity"):
                raise Unsupported(f"CAST of string {a.value!r} (only infinities and NaN are folded)")
        elif is_int(target) and isinstance(value, int) and not isinstance(value, bool):
            low, high = INT_RANGE[target]
            if not low <= value <= high:
                raise Unsupported(f"literal {value} outside {target}")
        elif target == "BOOLEAN" and isinstance(value, bool):
            pass
        else:
            raise Unsupported(f"CAST of literal {value!r} to {target}")
        return Expr(target, lambda f: constant(target, value, f.n), value=value, literal=True)


def truth(v: Vec) -> tuple[np.ndarray, np.ndarray]:
    """(is true, is false) of a boolean column; NULL is neither."""
    data, valid = v.np()
    if v.type == "NULL":
        z = np.zeros(len(data), bool)
        return z, z
    data = data.astype(bool, copy=False)
    if valid is None:
        return data, ~data
    return data & valid, ~data & valid


def _map(v: Vec, t, fn) -> Vec:
    data, valid = v.np()
    return Vec.of(t, fn(data), valid)


def _arith_kernel(op: str, t: str, x: np.ndarray, y: np.ndarray, valid) -> np.ndarray:
    if t == "DOUBLE":
        with np.errstate(all="ignore"):
            return x + y if op == "add" else x - y if op == "sub" else x * y
    with np.errstate(all="ignore"):
        if op == "add":
            r = x + y
            bad = ((x ^ r) & (y ^ r)) < 0
        elif op == "sub":
            r = x - y
            bad = ((x ^ y) & (x ^ r)) < 0
        else:
            r = x * y
            bad = np.abs(x.astype(np.float64) * y.astype(np.float64)) >= 2.0**62
    if valid is not None:
        bad &= valid
    if bad.any():
        raise Fallback(f"integer {op} may overflow")
    check_range(t, r, valid, f"integer {op}")
    return r


def _order_kernel(op: str, floating: bool):
    """x op y in DuckDB's order (DOUBLE: NaN above everything, equal to itself)."""
    if not floating:
        return {"lt": np.less, "gt": np.greater, "le": np.less_equal, "ge": np.greater_equal}[op]
    if op == "lt":
        return lambda x, y: (x < y) | (~np.isnan(x) & np.isnan(y))
    if op == "gt":
        return lambda x, y: (x > y) | (np.isnan(x) & ~np.isnan(y))
    if op == "le":
        return lambda x, y: (x <= y) | np.isnan(y)
    return lambda x, y: (x >= y) | np.isnan(x)


def _comparison(a: Expr, b: Expr, op: str):
    """kernel(x: Vec, y: Vec) -> bool data (NULLs decided by the caller)."""
    if a.type == "NULL" or b.type == "NULL":
        return lambda x, y: np.zeros(len(x), bool)
    if (is_number(a.type) or a.type == INTLIT) and (is_number(b.type) or b.type == INTLIT):
        t = "DOUBLE" if "DOUBLE" in (a.type, b.type) else "BIGINT"
        if op in ("eq", "ne"):
            def eq(x, y):
                return (x == y) | (np.isnan(x) & np.isnan(y)) if t == "DOUBLE" else x == y
            if op == "eq":
                return lambda x, y: eq(convert(x, t)[0], convert(y, t)[0])
            return lambda x, y: ~eq(convert(x, t)[0], convert(y, t)[0])
        kernel = _order_kernel(op, t == "DOUBLE")
        return lambda x, y: kernel(convert(x, t)[0], convert(y, t)[0])
    if a.type == "BOOLEAN" and b.type == "BOOLEAN":
        ops = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
               "ge": np.greater_equal}
        kernel = ops[op]
        return lambda x, y: kernel(x.np()[0].astype(np.int8), y.np()[0].astype(np.int8))
    if a.type == b.type and not isinstance(a.type, str) and op in ("eq", "ne") and not (
            pa.types.is_floating(a.type) or pa.types.is_null(a.type) or pa.types.is_nested(a.type)):
        def opaque(x, y):
            same = pc.equal(x.arrow(), y.arrow()).fill_null(False)
            out = np.asarray(same)
            return out if op == "eq" else ~out
        return opaque
    raise Unsupported(f"comparison {op} of {a.type} and {b.type}")
