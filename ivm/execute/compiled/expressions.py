"""Scalar SQL expressions compiled once into vectorized closures over a frame's columns.

        e = compile_expr(parse_one("CASE WHEN x > 0 THEN x * 2 ELSE NULL END"), shape)
        e.type, e.fn(frame)        # ("BIGINT", Vec) for a BIGINT x

Implements, with DuckDB's meaning (DuckDB is the reference):
integer (TINYINT..BIGINT, HUGEINT held in int64) and DOUBLE ``+ - *`` and
unary minus, ``/`` (always DOUBLE; a zero divisor falls back), with DuckDB's
result types (the wider integer; DOUBLE when either side is; an integer
literal takes the other side's type when it fits; two literals are
INTEGERs); an integer result outside its type is a ``Fallback`` (DuckDB
raises, numpy wraps); integer ``//`` and ``%`` truncating toward zero (a zero
divisor falls back: DuckDB raises). DECIMAL(p,s) of every width as scaled
int64 with the binder's types and rounding (decimals.py): ``+ - *`` with
decimals and integers, ``/`` (DOUBLE), comparisons, casts among decimals,
integers and DOUBLE, decimal literals (``0.06`` is DECIMAL(3,2)).
Comparisons ``= <> < <= > >=`` of numbers (DOUBLE: NaN equals NaN and sorts
above everything, -0.0 = 0.0), of booleans, of DATE/TIMESTAMP (a DATE meets
a TIMESTAMP as midnight), and ``=``/``<>`` of two columns of one other type
(strings by bytes...); ``BETWEEN``; ``IN`` a list; ``IS [NOT] DISTINCT
FROM``; AND/OR/NOT with three-valued logic; ``IS NULL``; searched CASE,
COALESCE, GREATEST/LEAST (skip NULLs) over numbers, decimals, booleans and
dates (COALESCE also other types); CAST among integers, DOUBLE, BOOLEAN
(DOUBLE to integer rounds half to even; NaN, infinities and values out of
range fall back), DATE to TIMESTAMP, strings to VARCHAR; TRY_CAST between
integers; constants folded at compile time: CAST of a string literal to
DOUBLE (infinities, NaN), DATE or TIMESTAMP (ISO forms), DATE/TIMESTAMP +-
INTERVAL 'n' YEAR/QUARTER/MONTH/WEEK/DAY (a TIMESTAMP; month ends clamp);
EXTRACT(YEAR/MONTH/DAY); ``[NOT] LIKE`` with a constant pattern of text and
``%``; SUBSTRING with constant bounds; ISFINITE, ISNAN. Anything else raises
``Unsupported`` at compile time.
"""

from __future__ import annotations

import calendar
import datetime
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from ivm.execute.compiled import decimals
from ivm.execute.compiled import generated as gen
from ivm.execute.compiled.vectors import (
    DAY_MICROS, EPOCH, INT_RANGE, INT_RANK, TEMPORAL, Fallback, Unsupported, Vec, check_range, check_years,
    constant, date_micros, decimal, is_decimal, is_int, is_number, negative_zero, numpy_type,
)

INTLIT = "INTLIT"  # an integer literal, typed by what it meets (DuckDB's INTEGER_LITERAL)
CASTS = {
    exp.DataType.Type.TINYINT: "TINYINT", exp.DataType.Type.SMALLINT: "SMALLINT", exp.DataType.Type.INT: "INTEGER",
    exp.DataType.Type.BIGINT: "BIGINT", exp.DataType.Type.INT128: "HUGEINT", exp.DataType.Type.DOUBLE: "DOUBLE",
    exp.DataType.Type.BOOLEAN: "BOOLEAN", exp.DataType.Type.DATE: "DATE", exp.DataType.Type.TIMESTAMP: "TIMESTAMP",
    exp.DataType.Type.TIMESTAMPNTZ: "TIMESTAMP",
}
COMPARISONS = {exp.EQ: "eq", exp.NEQ: "ne", exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}
ARITHMETIC = {exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul"}


@dataclass
class Expr:
    type: object  # a logical type (vectors.py), INTLIT, or an Arrow type
    fn: Callable[["Frame"], Vec]  # noqa: F821 (relational.Frame: .cols, .n)
    value: object = None  # a literal's Python value
    literal: bool = False
    # emit(g, frame) -> generated.Col: the same computation written as source (generated.py); None: not covered
    emit: Callable | None = None


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
    if all(is_number(t) or is_decimal(t) or t == INTLIT for t in types):
        if "DOUBLE" in types:
            return "DOUBLE"
        return decimals.common_type([operand_type(e) for e in exprs if e.type != "NULL"])
    if len(set(map(str, types))) == 1 and INTLIT not in types:
        return types[0]
    raise Unsupported(f"{what} over types {', '.join(map(str, types))}")


def operand_type(e: Expr):
    """``e``'s type where it meets a decimal: an integer literal is an INTEGER, or a BIGINT if it needs one."""
    if e.type != INTLIT:
        return e.type
    t = lit_type(e.value)
    return t if INT_RANK[t] >= INT_RANK["INTEGER"] else "INTEGER"


def _lits_type(exprs: list[Expr]) -> str:
    widest = "INTEGER"
    for e in exprs:
        if e.type == INTLIT:
            widest = max(widest, lit_type(e.value), key=INT_RANK.get)
    return widest


def convert(v: Vec, target) -> tuple[np.ndarray, np.ndarray | None]:
    """(data, valid) of a computed column as numpy data of ``target`` (a unify() result, widening only)."""
    data, valid = v.np()
    if v.type == target or v.type == "NULL":
        return data.astype(numpy_type(target), copy=False), valid
    if is_decimal(target) or (target == "HUGEINT" and is_decimal(v.type)):
        return decimals.cast(data, valid, v.type, target), valid
    if target == "DOUBLE" and is_decimal(v.type):
        return decimals.to_double(data, decimals.scale_of(v.type)), valid
    if target == "TIMESTAMP" and v.type == "DATE":
        return date_micros(data, valid), valid
    dtype = numpy_type(target)
    if data.dtype != dtype:
        data = data.astype(dtype)
    return data, valid


def extract_part(x: np.ndarray, valid: np.ndarray | None, source: str, part: str) -> np.ndarray:
    """EXTRACT(YEAR|MONTH|DAY) of DATE days or TIMESTAMP microseconds (closures and generated code)."""
    days = x if source == "DATE" else np.floor_divide(x, DAY_MICROS)
    check_years(days, valid, "EXTRACT of a date")
    days = np.where(valid, days, 0) if valid is not None else days
    moment = days.astype("datetime64[D]")
    if part == "YEAR":
        out = moment.astype("datetime64[Y]").astype(np.int64) + 1970
    elif part == "MONTH":
        out = moment.astype("datetime64[M]").astype(np.int64) % 12 + 1
    else:
        out = (moment - moment.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64) + 1
    return out.astype(np.int64)


def as_type(e: Expr, target) -> Callable:
    """fn(frame) -> (data, valid) of ``e`` widened to ``target`` (a unify() result)."""
    return lambda f: convert(e.fn(f), target)


def compile_expr(node: exp.Expression, shape: Shape, subst: dict[str, int] | None = None,
                 common: "Common | None" = None) -> Expr:
    """Compile ``node`` over ``shape``; ``subst`` maps an expression's SQL to a column (grouped values);
    ``common``: subexpressions shared with the other expressions compiled with it."""
    return _Compiler(shape, subst or {}, common).compile(node)


class Common:
    """Subexpressions that occur more than once among expressions over one frame, each computed once a frame.

    A state merge's select list compares every old and new aggregate for both
    ``__emit_old`` and ``__emit_new``, and sums ``COALESCE(o.__count, 0) +
    p.__count`` twice: per-call costs, not data, dominate these steps. An
    expression's meaning does not depend on where it occurs (only an integer
    literal's type does, and literals are never shared), so the first
    compiled form serves every occurrence; its result is kept on the frame.
    """

    def __init__(self, nodes: list[exp.Expression]):
        counts: dict[str, int] = {}
        for root in nodes:
            for node in root.walk():
                if not isinstance(node, _NEVER_SHARED):
                    text = node.sql(dialect="duckdb")
                    counts[text] = counts.get(text, 0) + 1
        self.repeated = {text for text, n in counts.items() if n > 1}
        self.compiled: dict[str, Expr] = {}

    def shared(self, text: str, compile_: Callable[[], Expr]) -> Expr:
        found = self.compiled.get(text)
        if found is None:
            inner = compile_()
            if inner.type == INTLIT or inner.literal:
                return inner
            fn, token = inner.fn, object()

            def once(f):
                memo = f.memo
                if memo is None:
                    memo = f.memo = {}
                vec = memo.get(token)
                if vec is None:
                    vec = memo[token] = fn(f)
                return vec
            def emit_once(g, f, _inner=inner.emit):
                col = f.memo.get(token)
                if col is None:
                    col = f.memo[token] = _inner(g, f)
                return col
            found = self.compiled[text] = Expr(inner.type, once, inner.value, inner.literal,
                                               emit_once if inner.emit is not None else None)
        return found


_NEVER_SHARED = (exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Identifier, exp.Star, exp.DataType,
                 exp.DataTypeParam, exp.Var, exp.Interval)


def finish(e: Expr) -> Expr:
    """``e`` as a column of a result: an integer literal becomes an INTEGER (or wider) constant."""
    if e.type != INTLIT:
        return e
    t = lit_type(e.value)
    t = t if INT_RANK[t] >= INT_RANK["INTEGER"] else "INTEGER"
    value = e.value
    return Expr(t, lambda f: constant(t, value, f.n), emit=lambda g, f: gen.constant(g, t, value, f.n))


class _Compiler:
    def __init__(self, shape: Shape, subst: dict[str, int], common: Common | None = None):
        self.shape = shape
        self.subst = subst
        self.common = common

    def compile(self, node: exp.Expression) -> Expr:
        sharable = self.common is not None and not isinstance(node, _NEVER_SHARED)
        text = node.sql(dialect="duckdb") if self.subst or sharable else ""
        if self.subst:
            slot = self.subst.get(text)
            if slot is not None:
                return self._slot(slot)
        if sharable and text in self.common.repeated:
            return self.common.shared(text, lambda: self._compile(node))
        return self._compile(node)

    def _compile(self, node: exp.Expression) -> Expr:
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
        return Expr(t, lambda f: f.cols[index], emit=lambda g, f: f.col(g, index))

    # --- literals -------------------------------------------------------------
    def _literal(self, node: exp.Literal) -> Expr:
        if node.is_string:
            value = node.this
            return Expr(pa.string(), lambda f: Vec(pa.string(), array=pa.array([value] * f.n, pa.string())),
                        value=value, literal=True, emit=lambda g, f: gen.string_constant(g, value, f.n))
        try:
            value = int(node.this)
        except ValueError:
            return self._decimal_literal(str(node.this))
        lit_type(value)
        return Expr(INTLIT, lambda f: constant("BIGINT", value, f.n), value=value, literal=True,
                    emit=lambda g, f: gen.constant(g, "BIGINT", value, f.n))

    def _decimal_literal(self, text: str) -> Expr:
        """``1.50``: DuckDB's DECIMAL(digits, digits after the point), here up to 18 digits."""
        m = re.fullmatch(r"(\d*)\.(\d+)", text)
        if not m or len(m.group(1)) + len(m.group(2)) > decimals.INT64_DIGITS:
            raise Unsupported(f"numeric literal {text}")
        t = decimal(len(m.group(1)) + len(m.group(2)), len(m.group(2)))
        value = int(m.group(1) + m.group(2))
        return Expr(t, lambda f: constant(t, value, f.n), value=value,
                    emit=lambda g, f: gen.constant(g, t, value, f.n))

    def _interval(self, node: exp.Interval) -> Expr:
        """``INTERVAL 'n' unit``: only folded into a constant date or timestamp (see _fold_interval)."""
        text = node.this.name if isinstance(node.this, exp.Literal) else None
        unit = node.args.get("unit")
        unit = unit.name.upper() if unit is not None else None
        if text is not None and unit is None and len(text.split()) == 2:
            text, unit = text.split()
            unit = unit.upper()
        if text is None or not re.fullmatch(r"[+-]?\d+", text.strip()):
            raise Unsupported(f"interval {node.sql()}")
        n = int(text)
        unit = unit.rstrip("S") if unit else unit
        months = {"YEAR": 12, "MONTH": 1, "QUARTER": 3}.get(unit)
        days = {"DAY": 1, "WEEK": 7}.get(unit)
        if months is None and days is None:
            raise Unsupported(f"interval unit {unit}")
        value = (n * months, 0) if months else (0, n * days)

        def refuse(f):
            raise Unsupported("an interval outside constant date arithmetic")
        return Expr("INTERVAL", refuse, value=value, literal=True)

    def _fold_interval(self, a: Expr, b: Expr, op: str) -> Expr:
        """DATE/TIMESTAMP constant +- INTERVAL constant, folded at compile time: a TIMESTAMP (as DuckDB
        types it); months first, clamped to the month's last day (Jan 31 + 1 month: Feb 28), then days."""
        if op == "mul" or not (a.literal and b.literal and a.value is not None and b.value is not None):
            raise Unsupported("interval arithmetic other than constant date +- constant interval")
        if a.type == "INTERVAL":
            if op == "sub":
                raise Unsupported("INTERVAL - date")
            a, b = b, a
        if a.type not in TEMPORAL or b.type != "INTERVAL":
            raise Unsupported(f"{a.type} {op} {b.type}")
        months, days = b.value
        if op == "sub":
            months, days = -months, -days
        micros = a.value * DAY_MICROS if a.type == "DATE" else a.value
        whole_days, rest = divmod(micros, DAY_MICROS)
        date = EPOCH + datetime.timedelta(days=whole_days)
        year, month = divmod(date.year * 12 + date.month - 1 + months, 12)
        if not 1 <= year <= 9999:
            raise Unsupported("a date outside the years 1..9999")
        date = datetime.date(year, month + 1, min(date.day, calendar.monthrange(year, month + 1)[1]))
        date += datetime.timedelta(days=days)
        value = (date - EPOCH).days * DAY_MICROS + rest
        return Expr("TIMESTAMP", lambda f: constant("TIMESTAMP", value, f.n), value=value, literal=True,
                    emit=lambda g, f: gen.constant(g, "TIMESTAMP", value, f.n))

    def _boolean(self, node: exp.Boolean) -> Expr:
        value = bool(node.this)
        return Expr("BOOLEAN", lambda f: constant("BOOLEAN", value, f.n), value=value, literal=True,
                    emit=lambda g, f: gen.constant(g, "BOOLEAN", value, f.n))

    def _null(self, node: exp.Null) -> Expr:
        return Expr("NULL", lambda f: constant("BIGINT", None, f.n), literal=True,
                    emit=lambda g, f: gen.constant(g, "BIGINT", None, f.n))

    # --- arithmetic -------------------------------------------------------------
    def _arith(self, node: exp.Expression, op: str) -> Expr:
        a, b = self.compile(node.this), self.compile(node.expression)
        if "INTERVAL" in (a.type, b.type):
            return self._fold_interval(a, b, op)
        if a.type == INTLIT and b.type == INTLIT:  # DuckDB: 1 + 10 is INTEGER (an overflow is an error)
            a, b = finish(a), finish(b)
        if (is_decimal(a.type) or is_decimal(b.type)) and "DOUBLE" not in (a.type, b.type):
            return self._decimal_arith(a, b, op)
        t = unify([a, b], f"arithmetic {op}")
        if not is_number(t):
            raise Unsupported(f"arithmetic {op} over {a.type} and {b.type}")
        fa, fb = as_type(a, t), as_type(b, t)

        def run(f):
            (x, vx), (y, vy) = fa(f), fb(f)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            return Vec.of(t, _arith_kernel(op, t, x, y, valid), valid)

        def emit(g, f):
            x, y = (gen.convert(g, e.emit(g, f), t) for e in (a, b))
            valid = g.both(x.valid, y.valid)
            return gen.Col(t, _emit_arith(g, op, t, *gen.operands(x, y), valid), valid)
        return Expr(t, run, emit=_emits(emit, a, b))

    def _decimal_arith(self, a: Expr, b: Expr, op: str) -> Expr:
        """DECIMAL + - * (with integers): DuckDB's result type (decimals.py); exact in int64, a result past
        int64 or past the result's width falls back."""
        ta, tb = operand_type(a), operand_type(b)
        if not all(is_int(x) or is_decimal(x) for x in (ta, tb)):
            raise Unsupported(f"arithmetic {op} over {a.type} and {b.type}")
        t = decimals.mul_type(ta, tb) if op == "mul" else decimals.add_type(ta, tb)
        scale = decimals.scale_of(t)

        def run(f):
            (x, vx), (y, vy) = a.fn(f).np(), b.fn(f).np()
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            if op != "mul":
                x = decimals.rescale(x, valid, decimals.scale_of(ta), scale)
                y = decimals.rescale(y, valid, decimals.scale_of(tb), scale)
            out = _arith_kernel(op, "BIGINT", x, y, valid)
            check_range(t, out, valid, f"decimal {op}")
            return Vec.of(t, out, valid)

        def emit(g, f):
            x, y = a.emit(g, f), b.emit(g, f)
            valid = g.both(x.valid, y.valid)
            xd, yd = gen.operands(x, y)
            if op != "mul":  # (a constant is rescaled as a column: rescale reads arrays)
                if decimals.scale_of(ta) != scale:
                    xd = _emit_rescale(g, x.data, valid, decimals.scale_of(ta), scale)
                if decimals.scale_of(tb) != scale:
                    yd = _emit_rescale(g, y.data, valid, decimals.scale_of(tb), scale)
            out = _emit_arith(g, op, "BIGINT", xd, yd, valid)
            gen.check_range(g, t, out, valid, f"decimal {op}")
            return gen.Col(t, out, valid)
        return Expr(t, run, emit=_emits(emit, a, b))

    def _intdiv(self, node):
        return self._int_division(node, "div")

    def _mod(self, node):
        return self._int_division(node, "mod")

    def _int_division(self, node, op: str) -> Expr:
        """Integer ``//`` and ``%``: truncated toward zero as DuckDB's (-7 // 2 = -3, -7 % 3 = -1), of the
        wider type; a zero divisor (an error in DuckDB) and MIN // -1 (an overflow) fall back."""
        a, b = self.compile(node.this), self.compile(node.expression)
        if INTLIT == a.type == b.type:
            a, b = finish(a), finish(b)
        t = unify([a, b], "integer division")
        if not is_int(t):
            raise Unsupported(f"{'//' if op == 'div' else '%'} over {a.type} and {b.type}")
        fa, fb = as_type(a, t), as_type(b, t)

        def run(f):
            (x, vx), (y, vy) = fa(f), fb(f)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            y = y if valid is None else np.where(valid, y, 1)
            if (y == 0).any():
                raise Fallback("integer division by zero")
            if op == "div" and ((x == INT_RANGE[t][0]) & (y == -1)).any():
                raise Fallback("MIN // -1 overflows")
            y = np.where(y == -1, 1, y) if op == "mod" else y  # x % -1 is 0, like x % 1 (and MIN % -1 too)
            floor = np.floor_divide(x, y)  # exact in int64; truncation differs where signs differ
            q = np.where((floor * y != x) & ((x < 0) != (y < 0)), floor + 1, floor)
            out = q if op == "div" else x - q * y
            check_range(t, out, valid, "integer division")
            return Vec.of(t, out, valid)
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
        if not all(is_number(e.type) or is_decimal(e.type) or e.type in (INTLIT, "NULL") for e in (a, b)) \
                or INTLIT == a.type == b.type:
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

        def emit(g, f):
            x, y = (gen.convert(g, e.emit(g, f), "DOUBLE") for e in (a, b))
            valid = g.both(x.valid, y.valid)
            xd, yd = x.data, y.data  # (columns: a constant divisor of 0 must test as one)
            zero = g.let(f"{yd} == 0")
            g.fallback_if(g.valid_any(zero, valid), "division by zero")
            return gen.Col("DOUBLE", g.let(f"{xd} / np.where({zero}, 1.0, {yd})"), valid)
        return Expr("DOUBLE", run, emit=_emits(emit, a, b))

    def _neg(self, node: exp.Neg) -> Expr:
        a = self.compile(node.this)
        if a.type == INTLIT:
            value = -a.value
            fits = -(2**63) <= value < 2**63
            return Expr(INTLIT, lambda f: constant("BIGINT", value, f.n), value=value, literal=True,
                        emit=(lambda g, f: gen.constant(g, "BIGINT", value, f.n)) if fits else None)
        if not (is_number(a.type) or is_decimal(a.type)):
            raise Unsupported(f"unary minus of {a.type}")
        t = a.type
        low = None if t == "DOUBLE" else INT_RANGE[t][0] if is_int(t) else np.iinfo(np.int64).min

        def run(f):
            x, valid = a.fn(f).np()
            if low is not None and ((x == low) if valid is None else ((x == low) & valid)).any():
                raise Fallback(f"-({low}) outside {t}")
            return Vec.of(t, -x, valid)

        def emit(g, f):
            x = a.emit(g, f)
            if low is not None:
                g.fallback_if(g.valid_any(g.let(f"{x.data} == {low}"), x.valid), f"-({low}) outside {t}")
            return gen.Col(t, g.let(f"-{x.data}"), x.valid)
        return Expr(t, run, emit=_emits(emit, a))

    # --- comparisons ------------------------------------------------------------
    def _compare(self, node: exp.Expression, op: str, null_safe: bool = False) -> Expr:
        return self._compared(self.compile(node.this), self.compile(node.expression), op, null_safe)

    def _compared(self, a: Expr, b: Expr, op: str, null_safe: bool = False, force=None) -> Expr:
        """``a op b``; ``force``: the type both sides are cast to (BETWEEN and IN bind one for all their sides)."""
        kernel = _comparison(a, b, "eq" if null_safe else op, force)

        def run(f):
            x, y = a.fn(f), b.fn(f)
            data = kernel(x, y)
            vx, vy = x.valid(), y.valid()
            if null_safe:
                data = gen.not_distinct(data, vx, vy)
                return Vec.of("BOOLEAN", data if op == "eq" else ~data)
            valid = vx if vy is None else (vy if vx is None else vx & vy)
            return Vec.of("BOOLEAN", data, valid)

        emit_kernel = _emit_comparison(a, b, "eq" if null_safe else op, force)

        def emit(g, f):
            x, y = a.emit(g, f), b.emit(g, f)
            data = emit_kernel(g, x, y)
            if null_safe:
                if x.valid is not None or y.valid is not None:  # (one call, no masks made, when neither has a NULL)
                    data = g.let(f"not_distinct({data}, {x.valid}, {y.valid})")
                return gen.Col("BOOLEAN", data if op == "eq" else g.let(f"~{data}"), None)
            return gen.Col("BOOLEAN", data, g.both(x.valid, y.valid))
        strings = gen.is_string(a.type) and a.type == b.type  # (emit_kernel takes them: _emit_comparison)
        return Expr("BOOLEAN", run, emit=(_emits_any if strings else _emits)(emit, a, b) if emit_kernel else None)

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

        def emit(g, f):
            x, y = a.emit(g, f), b.emit(g, f)
            (ta, fa), (tb, fb) = gen.truth(g, x, f.n), gen.truth(g, y, f.n)
            t, fl = (g.let(f"{ta} & {tb}"), g.let(f"{fa} | {fb}")) if conjunction else (
                g.let(f"{ta} | {tb}"), g.let(f"{fa} & {fb}"))
            return gen.boolean(g, t, fl, x, y)
        return Expr("BOOLEAN", run, emit=_emits(emit, a, b))

    def _not(self, node: exp.Not) -> Expr:
        (a,) = self._bools(node.this)

        def run(f):
            t, fl = truth(a.fn(f))
            return Vec.of("BOOLEAN", fl, t | fl)

        def emit(g, f):
            x = a.emit(g, f)
            t, fl = gen.truth(g, x, f.n)
            return gen.boolean(g, fl, t, x)
        return Expr("BOOLEAN", run, emit=_emits(emit, a))

    def _is(self, node: exp.Is) -> Expr:
        if not isinstance(node.expression, exp.Null):
            raise Unsupported(f"IS {node.expression.sql()}")
        a = self.compile(node.this)

        def run(f):
            valid = a.fn(f).valid()
            return Vec.of("BOOLEAN", np.zeros(f.n, bool) if valid is None else ~valid)

        def emit(g, f):
            valid = a.emit(g, f).valid
            if valid is None:
                return gen.Col("BOOLEAN", g.let(f"np.zeros({f.n}, bool)"), None)
            return gen.Col("BOOLEAN", g.let(f"np.zeros({f.n}, bool) if {valid} is None else ~{valid}"), None)
        return Expr("BOOLEAN", run, emit=_emits_any(emit, a))

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

        def emit(g, f):
            if default is None:
                out = gen.constant(g, t, None, f.n)
            else:
                out = gen.convert(g, default.emit(g, f), t)
            data, valid = out.scalar or out.data, out.valid
            for cond, value in zip(reversed(conds), reversed(values)):
                hit, _ = gen.truth(g, cond.emit(g, f), f.n)
                x = gen.convert(g, value.emit(g, f), t)
                data = g.let(f"np.where({hit}, {x.scalar or x.data}, {data})")  # (a column: ``hit`` is one)
                valid = _emit_case_valid(g, hit, x.valid, valid)
            return gen.Col(t, data, valid)
        return Expr(t, run, emit=_emits(emit, *conds, *values, *([default] if default else [])))

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

        def emit(g, f):
            first = gen.convert(g, args[0].emit(g, f), t)
            data, valid = first.data, first.valid
            for arg in args[1:]:
                if valid is None:
                    break
                x = gen.convert(g, arg.emit(g, f), t)
                data = g.let(f"{data} if {valid} is None else np.where({valid}, {data}, {x.scalar or x.data})")
                valid = None if x.valid is None else g.let(
                    f"None if {valid} is None or {x.valid} is None else {valid} | {x.valid}")
            return gen.Col(t, data, valid)
        return Expr(t, run, emit=_emits(emit, *args))

    def _greatest(self, node):
        return self._extreme([node.this, *node.expressions], "gt")

    def _least(self, node):
        return self._extreme([node.this, *node.expressions], "lt")

    def _extreme(self, nodes, op: str) -> Expr:
        args = [self.compile(a) for a in nodes]
        t = unify(args, "GREATEST/LEAST")
        if not (is_number(t) or is_decimal(t) or t in TEMPORAL):
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

        def emit(g, f):
            first = gen.convert(g, args[0].emit(g, f), t)
            data, valid = first.data, g.ones(first.valid, f.n)
            zero = g.const(negative_zero, "negative_zero")
            for arg in args[1:]:
                x = gen.convert(g, arg.emit(g, f), t)
                vx = g.ones(x.valid, f.n)
                if t == "DOUBLE":
                    g.fallback_if(f"{zero}({x.data}, {vx}) or {zero}({data}, {valid})", "GREATEST/LEAST of -0.0")
                pick = g.let(f"{vx} & (~{valid} | {_emit_order(op, t == 'DOUBLE', x.data, data)})")
                data = g.let(f"np.where({pick}, {x.data}, {data})")
                valid = g.let(f"{valid} | {vx}")
            return gen.Col(t, data, valid)
        return Expr(t, run, emit=_emits(emit, *args))

    def _between(self, node: exp.Between) -> Expr:
        """``x BETWEEN lo AND hi``: ``x >= lo AND x <= hi`` (NULLs included), compared in the one type DuckDB
        binds for the three."""
        if node.args.get("symmetric"):
            raise Unsupported("BETWEEN SYMMETRIC")
        x, low, high = (self.compile(n) for n in (node.this, node.args["low"], node.args["high"]))
        force = _decimal_comparison_type([x, low, high])
        tests = [self._compared(x, low, "ge", force=force), self._compared(x, high, "le", force=force)]

        def emit(g, f):
            cols = [test.emit(g, f) for test in tests]
            (ta, fa), (tb, fb) = (gen.truth(g, c, f.n) for c in cols)
            return gen.boolean(g, g.let(f"{ta} & {tb}"), g.let(f"{fa} | {fb}"), *cols)
        return Expr("BOOLEAN", lambda f: _all_of(tests, f), emit=_emits(emit, *tests))

    def _in(self, node: exp.In) -> Expr:
        """``x IN (a, b, ...)`` of values: the OR of ``x = a``... (NULL when nothing matches and a side is NULL),
        compared in the one type DuckDB binds for all."""
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field") or not node.expressions:
            raise Unsupported("IN over a subquery")
        x = self.compile(node.this)
        values = [self.compile(v) for v in node.expressions]
        if x.type in (pa.string(), pa.large_string()) and all(
                v.literal and isinstance(v.value, str) for v in values):
            # One set lookup, not an equality per value (TPC-H's IN lists of eight modes and containers).
            members = pa.array([v.value for v in values], x.type)

            def run_set(f):
                column = x.fn(f).arrow()
                hit = pc.is_in(column, value_set=members)
                valid = np.asarray(column.is_valid()) if column.null_count else None
                return Vec.of("BOOLEAN", np.asarray(hit.fill_null(False)), valid)

            def emit_set(g, f):
                col = x.emit(g, f)
                data = g.let(f"string_in({gen.string_values(g, col)}, {g.const(members, 'set')})")
                return gen.Col("BOOLEAN", data, col.valid)
            return Expr("BOOLEAN", run_set, emit=_emits_any(emit_set, x))
        force = _decimal_comparison_type([x, *values])
        tests = [self._compared(x, v, "eq", force=force) for v in values]

        def run(f):
            t = fl = None
            for test in tests:
                ti, fi = truth(test.fn(f))
                t, fl = (ti, fi) if t is None else (t | ti, fl & fi)
            return Vec.of("BOOLEAN", t, t | fl)

        def emit(g, f):  # the three-valued OR of the equalities, as run
            cols = [test.emit(g, f) for test in tests]
            t = fl = None
            for col in cols:
                ti, fi = gen.truth(g, col, f.n)
                t, fl = (ti, fi) if t is None else (g.let(f"{t} | {ti}"), g.let(f"{fl} & {fi}"))
            return gen.boolean(g, t, fl, *cols)
        return Expr("BOOLEAN", run, emit=_emits(emit, *tests))

    def _like(self, node: exp.Like) -> Expr:
        """``s [NOT] LIKE 'pattern'`` with a constant pattern of literal text and ``%`` only: an anchored RE2
        match of the text pieces in order (``%`` is any run of characters, newlines included). ``_``
        (one character) and backslashes (DuckDB has no default escape, Arrow does) stay on DuckDB."""
        if node.args.get("escape") is not None:
            raise Unsupported("LIKE ... ESCAPE")
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise Unsupported("LIKE with a pattern that is not a constant")
        text = pattern.this
        if "_" in text or "\\" in text:
            raise Unsupported(f"LIKE pattern {text!r} (only % is compiled)")
        a = self.compile(node.this)
        if a.type not in (pa.string(), pa.large_string()):
            raise Unsupported(f"LIKE over {a.type}")
        kind, matched = gen.like_matcher(text)
        negate = bool(node.args.get("negate"))

        def run(f):
            column = a.fn(f).arrow()
            valid = np.asarray(column.is_valid()) if column.null_count else None
            return Vec.of("BOOLEAN", gen.string_like(column, kind, matched, negate), valid)

        def emit(g, f):
            col = a.emit(g, f)
            data = g.let(f"string_like({gen.string_values(g, col)}, {kind!r}, {matched!r}, {negate})")
            return gen.Col("BOOLEAN", data, col.valid)
        return Expr("BOOLEAN", run, emit=_emits_any(emit, a))

    def _extract(self, node: exp.Extract) -> Expr:
        """``EXTRACT(YEAR|MONTH|DAY FROM d)`` of a DATE or TIMESTAMP: a BIGINT, by numpy's calendar (the
        proleptic Gregorian one DuckDB uses; dates outside the years 1..9999 fall back)."""
        part = node.this.name.upper()
        if part not in ("YEAR", "MONTH", "DAY"):
            raise Unsupported(f"EXTRACT({part})")
        a = self.compile(node.expression)
        if a.type not in TEMPORAL:
            raise Unsupported(f"EXTRACT from {a.type}")
        source = a.type

        def run(f):
            x, valid = a.fn(f).np()
            return Vec.of("BIGINT", extract_part(x, valid, source, part), valid)

        def emit(g, f):
            col = a.emit(g, f)
            data = g.let(f"{g.const(extract_part, 'extract')}({col.data}, {col.valid}, {source!r}, {part!r})")
            return gen.Col("BIGINT", data, col.valid)
        return Expr("BIGINT", run, emit=_emits(emit, a))

    def _substring(self, node: exp.Substring) -> Expr:
        """``SUBSTRING(s, start[, length])`` with constant start >= 1 and length >= 0: characters (code points,
        as DuckDB and Arrow's utf8_slice_codeunits count them) start .. start + length - 1."""
        a = self.compile(node.this)
        if a.type not in (pa.string(), pa.large_string()):
            raise Unsupported(f"SUBSTRING of {a.type}")
        start, length = (self.compile(node.args[k]) if node.args.get(k) is not None else None
                         for k in ("start", "length"))
        if start is None or start.type != INTLIT or start.value < 1 or (
                length is not None and (length.type != INTLIT or length.value < 0)):
            raise Unsupported("SUBSTRING with a start below 1, or not constant")
        begin = start.value - 1
        stop = begin + length.value if length is not None else None
        t = a.type

        def run(f):
            column = a.fn(f).arrow()
            return Vec(t, array=pc.utf8_slice_codeunits(column, begin, stop))

        def emit(g, f):  # a new string column: its own array, every row once
            col = a.emit(g, f)
            base = g.let(f"string_slice({gen.string_values(g, col)}, {begin}, {stop})", "a")
            return gen.Col(t, g.let(f"np.arange(len({base}), dtype=np.int64)"), col.valid, base=base)
        return Expr(t, run, emit=_emits_any(emit, a))

    def _trycast(self, node: exp.TryCast) -> Expr:
        """``TRY_CAST`` between integer types: a value outside the target is NULL (not an error)."""
        to = node.args["to"]
        target = _cast_target(to)
        a = self.compile(node.this)
        if a.type == target:  # the delta rules' TRY_CAST of a key to its own type
            return a
        if not (is_int(target) and is_int(a.type)):
            raise Unsupported(f"TRY_CAST from {a.type} to {to.sql(dialect='duckdb')}")
        if a.type == target:
            return a
        low, high = INT_RANGE[target]

        def run(f):
            x, valid = a.fn(f).np()
            fits = (x >= low) & (x <= high)
            return Vec.of(target, np.where(fits, x, 0), fits if valid is None else valid & fits)
        return Expr(target, run)

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

        def emit(g, f):
            x = a.emit(g, f)
            return gen.Col("BOOLEAN", g.let(f"np.{test.__name__}({x.data})"), x.valid)
        return Expr("BOOLEAN", run, emit=_emits(emit, a))

    def _cast(self, node: exp.Cast) -> Expr:
        to = node.args["to"]
        target = _cast_target(to)
        if to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) and not to.expressions:
            return self._cast_text(node)
        if target is None:
            raise Unsupported(f"CAST to {to.sql(dialect='duckdb')}")
        a = self.compile(node.this)
        if a.literal and a.type != "INTLIT" or a.literal and not (is_decimal(target) or target == "HUGEINT"):
            return self._cast_literal(a, target)
        source = a.type
        if source == target:
            return a
        if source == "NULL":
            return Expr(target, lambda f: constant(target, None, f.n),
                        emit=lambda g, f: gen.constant(g, target, None, f.n))
        if source == INTLIT:
            source = operand_type(a)
        if (is_decimal(source) or is_int(source)) and (is_decimal(target) or target == "HUGEINT"):
            def to_decimal(f):
                x, valid = a.fn(f).np()
                return Vec.of(target, decimals.cast(x, valid, source, target), valid)

            def emit_decimal(g, f):
                x = a.emit(g, f)
                cast = g.const(decimals.cast, "cast")
                return gen.Col(target, g.let(f"{cast}({x.data}, {x.valid}, {source!r}, {target!r})"), x.valid)
            return Expr(target, to_decimal, emit=_emits(emit_decimal, a))
        if is_decimal(source) and is_int(target):
            def to_int(f):
                x, valid = a.fn(f).np()
                out = decimals.rescale(x, valid, decimals.scale_of(source), 0)
                check_range(target, out, valid, f"CAST to {target}")
                return Vec.of(target, out, valid)

            def emit_int(g, f):
                x = a.emit(g, f)
                out = _emit_rescale(g, x.data, x.valid, decimals.scale_of(source), 0)
                gen.check_range(g, target, out, x.valid, f"CAST to {target}")
                return gen.Col(target, out, x.valid)
            return Expr(target, to_int, emit=_emits(emit_int, a))
        if is_decimal(source) and target == "DOUBLE":
            scale = decimals.scale_of(source)

            def emit_to_double(g, f):
                x = a.emit(g, f)
                return gen.Col(target, g.let(f"{g.const(decimals.to_double, 'to_double')}({x.data}, {scale})"), x.valid)
            return Expr(target, lambda f: _map(a.fn(f), target, lambda x: decimals.to_double(x, scale)),
                        emit=_emits(emit_to_double, a))
        if source == "DOUBLE" and is_decimal(target):
            def from_double(f):
                x, valid = a.fn(f).np()
                return Vec.of(target, decimals.from_double(x, valid, target), valid)
            return Expr(target, from_double)
        if source == "DATE" and target == "TIMESTAMP":
            def widen(f):
                x, valid = a.fn(f).np()
                return Vec.of(target, date_micros(x, valid), valid)

            def emit_widen(g, f):
                return gen.convert(g, a.emit(g, f), target)  # (date_micros, as above)
            return Expr(target, widen, emit=_emits(emit_widen, a))
        if is_int(source) and is_int(target):
            def narrow(f):
                x, valid = a.fn(f).np()
                check_range(target, x, valid, "CAST")
                return Vec.of(target, x, valid)

            def emit_narrow(g, f):
                x = a.emit(g, f)
                gen.check_range(g, target, x.data, x.valid, "CAST")
                return gen.Col(target, x.data, x.valid)
            return Expr(target, narrow, emit=_emits(emit_narrow, a))
        if is_int(source) and target == "DOUBLE":
            def emit_double(g, f):
                x = a.emit(g, f)
                return gen.Col(target, g.let(f"{x.data}.astype(np.float64)"), x.valid)
            return Expr(target, lambda f: _map(a.fn(f), target, lambda x: x.astype(np.float64)),
                        emit=_emits(emit_double, a))
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

    def _cast_text(self, node: exp.Cast) -> Expr:
        """CAST(x AS VARCHAR) of a string (itself) or of NULL (a NULL string column); other sources stay on DuckDB."""
        a = self.compile(node.this)
        if a.type in (pa.string(), pa.large_string()):
            return a
        if a.type == "NULL":
            return Expr(pa.string(), lambda f: Vec(pa.string(), array=pa.nulls(f.n, pa.string())), literal=True,
                        emit=lambda g, f: gen.string_nulls(g, f.n))
        raise Unsupported(f"CAST of {a.type} to VARCHAR")

    def _cast_literal(self, a: Expr, target: str) -> Expr:
        value = a.value
        if value is None:
            return Expr(target, lambda f: constant(target, None, f.n), literal=True,
                        emit=lambda g, f: gen.constant(g, target, None, f.n))
        if a.type == "TIMESTAMP" and target == "DATE" or a.type in TEMPORAL and target not in TEMPORAL:
            raise Unsupported(f"CAST of a {a.type} constant to {target}")
        if target in TEMPORAL and a.type in TEMPORAL:
            value = value * DAY_MICROS if a.type == "DATE" and target == "TIMESTAMP" else value
        elif target in TEMPORAL:
            value = _temporal_literal(value, target)
        elif target == "DOUBLE":
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
        return Expr(target, lambda f: constant(target, value, f.n), value=value, literal=True,
                    emit=lambda g, f: gen.constant(g, target, value, f.n))


def _cast_target(to: exp.DataType):
    """The logical type a CAST names, when it is one we compute (else None)."""
    if to.this == exp.DataType.Type.DECIMAL:
        params = [p.sql() for p in to.expressions] or ["18", "3"]  # DuckDB's DECIMAL is DECIMAL(18,3)
        if len(params) == 2 and all(p.isdigit() for p in params) and 1 <= int(params[0]) <= 38 \
                and int(params[1]) <= int(params[0]):
            return decimal(int(params[0]), int(params[1]))
        return None
    return CASTS.get(to.this) if not to.expressions else None


def _temporal_literal(value, target: str) -> int:
    """A string constant as DATE (days) or TIMESTAMP (microseconds); only the plain ISO forms are folded."""
    if not isinstance(value, str):
        raise Unsupported(f"CAST of {value!r} to {target}")
    text = value.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            days = (datetime.date.fromisoformat(text) - EPOCH).days
            return days if target == "DATE" else days * DAY_MICROS
        if target == "TIMESTAMP" and re.fullmatch(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,6})?", text):
            moment = datetime.datetime.fromisoformat(text.replace("T", " "))
            return (moment - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    except ValueError:
        pass
    raise Unsupported(f"CAST({value!r} AS {target}) (not a plain ISO date)")


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


def _all_of(tests: list[Expr], f) -> Vec:
    """Three-valued AND of boolean expressions."""
    t = fl = None
    for test in tests:
        ti, fi = truth(test.fn(f))
        t, fl = (ti, fi) if t is None else (t & ti, fl | fi)
    return Vec.of("BOOLEAN", t, t | fl)


def _scalar_side(e: Expr) -> pa.Scalar | None:
    """A string literal as an Arrow scalar (a kernel broadcasts it; no column of copies is built)."""
    if e.literal and isinstance(e.value, str) and isinstance(e.type, pa.DataType):
        return pa.scalar(e.value, e.type)
    return None


def _decimal_comparison_type(exprs: list[Expr]):
    """The decimal type DuckDB compares ``exprs`` in (BETWEEN, IN: folded over all sides); None when no side is
    a decimal or one is a DOUBLE (then each comparison types itself)."""
    types = [e.type for e in exprs]
    if not any(is_decimal(t) for t in types) or "DOUBLE" in types or "NULL" in types:
        return None
    if not all(is_int(t) or is_decimal(t) or t == INTLIT for t in types):
        return None
    return decimals.comparison_type([operand_type(e) for e in exprs])


def _comparison(a: Expr, b: Expr, op: str, force=None):
    """kernel(x: Vec, y: Vec) -> bool data (NULLs decided by the caller)."""
    if a.type == "NULL" or b.type == "NULL":
        return lambda x, y: np.zeros(len(x), bool)
    numeric = [is_number(e.type) or is_decimal(e.type) or e.type == INTLIT for e in (a, b)]
    if all(numeric) and (is_decimal(a.type) or is_decimal(b.type)) and "DOUBLE" not in (a.type, b.type):
        t = force or decimals.comparison_type([operand_type(a), operand_type(b)])  # both cast to it, as DuckDB
        kernel = _order_kernel(op, False) if op not in ("eq", "ne") else (np.equal if op == "eq" else np.not_equal)
        return lambda x, y: kernel(convert(x, t)[0], convert(y, t)[0])
    if a.type in TEMPORAL and b.type in TEMPORAL:
        t = "TIMESTAMP" if "TIMESTAMP" in (a.type, b.type) else "DATE"  # a DATE meets a TIMESTAMP as one
        kernel = _order_kernel(op, False) if op not in ("eq", "ne") else (np.equal if op == "eq" else np.not_equal)
        return lambda x, y: kernel(convert(x, t)[0], convert(y, t)[0])
    if all(numeric):
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
            pa.types.is_floating(a.type) or pa.types.is_null(a.type) or pa.types.is_nested(a.type)
            or pa.types.is_interval(a.type)):  # DuckDB: INTERVAL '1' MONTH = INTERVAL '30' DAY
        right = _scalar_side(b)

        def opaque(x, y):
            same = pc.equal(x.arrow(), right if right is not None else y.arrow()).fill_null(False)
            out = np.asarray(same)
            return out if op == "eq" else ~out
        return opaque
    if a.type == b.type and a.type in (pa.string(), pa.large_string()):
        # Strings order by their UTF-8 bytes in both DuckDB (its default collation) and Arrow.
        arrow_op = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater,
                    "ge": pc.greater_equal}[op]
        right = _scalar_side(b)

        def text(x, y):
            return np.asarray(arrow_op(x.arrow(), right if right is not None else y.arrow()).fill_null(False))
        return text
    raise Unsupported(f"comparison {op} of {a.type} and {b.type}")


# --- generated code (generated.py): the emitters' shared pieces ------------------------------------

def _emits(emit: Callable, *parts: Expr) -> Callable | None:
    """``emit`` when every operand has an emitter, else None (the expression is not generated). An operand
    of an Arrow type (a string) is refused: generated code holds it as positions, not values (see
    generated.Col); only emitters that read no value of it take one (``_emits_any``)."""
    return emit if all(p.emit is not None and isinstance(p.type, str) for p in parts) else None


def _emits_any(emit: Callable, *parts: Expr) -> Callable | None:
    """``_emits`` for an emitter that takes an operand of any type: it reads only its NULLs (IS NULL), or
    gathers a string operand's values itself (``gen.string_values``: LIKE, IN, SUBSTRING, comparisons)."""
    return emit if all(p.emit is not None for p in parts) else None


def _emit_arith(g, op: str, t: str, x: str, y: str, valid: str | None) -> str:
    """_arith_kernel written out: x op y in ``t``; integers fall back where they may overflow."""
    sign = {"add": "+", "sub": "-", "mul": "*"}[op]
    r = g.let(f"{x} {sign} {y}")
    if t == "DOUBLE":
        return r
    if op == "add":
        bad = g.let(f"(({x} ^ {r}) & ({y} ^ {r})) < 0")
    elif op == "sub":
        bad = g.let(f"(({x} ^ {y}) & ({x} ^ {r})) < 0")
    else:
        bad = g.let(f"np.abs({x}.astype(np.float64) * {y}.astype(np.float64)) >= 2.0**62")
    g.fallback_if(g.valid_any(bad, valid), f"integer {op} may overflow")
    gen.check_range(g, t, r, valid, f"integer {op}")
    return r


def _emit_case_valid(g, hit: str, branch: str | None, otherwise: str | None) -> str | None:
    """Validity of ``np.where(hit, branch value, value so far)`` (each validity maybe None: all valid)."""
    if branch is None and otherwise is None:
        return None
    if branch is None:
        return g.let(f"None if {otherwise} is None else {hit} | {otherwise}")
    if otherwise is None:
        return g.let(f"None if {branch} is None else np.where({hit}, {branch}, True)")
    return g.let(f"None if {branch} is None and {otherwise} is None else "
                 f"np.where({hit}, True if {branch} is None else {branch}, True if {otherwise} is None else {otherwise})")


def _emit_rescale(g, data: str, valid: str | None, source: int, target: int) -> str:
    """decimals.rescale written out (no call when the scales are equal)."""
    if source == target:
        return data
    return g.let(f"{g.const(decimals.rescale, 'rescale')}({data}, {valid}, {source}, {target})")


def _emit_order(op: str, floating: bool, x: str, y: str) -> str:
    """Source of _order_kernel(op, floating)(x, y)."""
    if not floating:
        return f"({x} {dict(lt='<', gt='>', le='<=', ge='>=')[op]} {y})"
    return {"lt": f"(({x} < {y}) | (~np.isnan({x}) & np.isnan({y})))",
            "gt": f"(({x} > {y}) | (np.isnan({x}) & ~np.isnan({y})))",
            "le": f"(({x} <= {y}) | np.isnan({y}))",
            "ge": f"(({x} >= {y}) | np.isnan({x}))"}[op]


def _emit_comparison(a: Expr, b: Expr, op: str, force=None):
    """_comparison written out: emit(g, x: Col, y: Col) -> the name of the bool data; None: not generated
    (comparisons of Arrow-held types)."""
    if a.type == "NULL" or b.type == "NULL":
        return lambda g, x, y: g.let(f"np.zeros(len({x.data}), bool)")
    numeric = [is_number(e.type) or is_decimal(e.type) or e.type == INTLIT for e in (a, b)]
    if all(numeric) and (is_decimal(a.type) or is_decimal(b.type)) and "DOUBLE" not in (a.type, b.type):
        t, floating = force or decimals.comparison_type([operand_type(a), operand_type(b)]), False
    elif a.type in TEMPORAL and b.type in TEMPORAL:
        t, floating = ("TIMESTAMP" if "TIMESTAMP" in (a.type, b.type) else "DATE"), False
    elif all(numeric):
        t = "DOUBLE" if "DOUBLE" in (a.type, b.type) else "BIGINT"
        floating = t == "DOUBLE"
    elif a.type == "BOOLEAN" and b.type == "BOOLEAN":
        t, floating = "BOOLEAN", False
    elif gen.is_string(a.type) and a.type == b.type:
        # As _comparison: Arrow's kernel over the gathered strings (UTF-8 byte order, DuckDB's default
        # collation); a literal side is one scalar.
        right = _scalar_side(b)

        def emit_text(g, x, y):
            left = gen.string_values(g, x)
            other = g.const(right, "s") if right is not None else gen.string_values(g, y)
            return g.let(f"compare_strings({op!r}, {left}, {other})")
        return emit_text
    else:
        return None

    def emit(g, x, y):
        if t == "BOOLEAN":
            xd, yd = g.let(f"{x.data}.astype(np.int8)"), g.let(f"{y.data}.astype(np.int8)")
        else:
            xd, yd = gen.operands(gen.convert(g, x, t), gen.convert(g, y, t))
        if op in ("eq", "ne"):
            same = f"({xd} == {yd}) | (np.isnan({xd}) & np.isnan({yd}))" if floating else f"{xd} == {yd}"
            return g.let(same if op == "eq" else f"~({same})")
        return g.let(_emit_order(op, floating, xd, yd))
    return emit
