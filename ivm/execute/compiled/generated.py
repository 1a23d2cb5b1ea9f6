"""A compiled step generated once as one Python function of numpy calls (no Vec objects or closures).

The closures of expressions.py and relational.py cost about 1 us a Python
call, and a state merge makes ~2,900 of them: objects per column per
operator (``Vec``), lazy takes, type dispatch at every run. Where every
operator and expression of a step has an emitter (``Expr.emit``,
``Rel.emit``, written beside the closure it mirrors, with the types the
closure's compiler resolved), the step is also written out as the source
text of one function:

        def step(inputs):
            t0 = inputs['aggd1']; n0 = t0.num_rows
            d1, v1 = read(t0, 1, 'd')             # a column, read where first used
            d2 = np.full(n0, 0, np.int64)
            ...
            return [pa.array(d9, T3, mask=...), ...]

compiled with ``compile``/``exec`` at the step's compile time. A column is a
pair of local variables (numpy data, and a validity mask that is None when no
value is NULL; ``Col.valid`` is None when that is known while generating),
and a column is read, gathered or computed only where the step first uses it.
Anything without an emitter raises ``Unsupported`` while generating, and the
step keeps its closures; a batch the generated code cannot compute as DuckDB
would (an overflow, a -0.0 key: the checks the closures make) raises
``Fallback``, and the step then runs that batch on its closures (which may
fall back to DuckDB in turn). The closures stay the reference: shadow mode
(IVM_SHADOW=1) runs both and compares them (step.py), besides DuckDB.
"""

from __future__ import annotations

import itertools
import re
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ivm.execute.compiled import kernels
from ivm.execute.compiled.vectors import (
    TO_ARROW, Fallback, Unsupported, Vec, _int64_to_decimal, arrow_type, date_micros, decimal_of, int_bounds,
    is_decimal, is_int, numpy_type,
)
from storage.buffers import fixed_width_values, int64_values, one_array


class Col:
    """A column while generating: the names of its data and validity variables (``valid`` None: no NULL);
    ``scalar``: for a constant, the name of its value as a numpy scalar (an operation with a column takes
    it as it is, and the column of copies is never made unless something reads ``data``); ``arrow``: for an
    input column, the name of its Arrow array (a result passing it on returns it as it is, unread).

    A string column (an Arrow type) is late-materialized: ``data`` holds int64 positions into the Arrow
    array named by ``base``, and ``valid`` its NULLs as for any column. Taking rows (filters, joins,
    group keys) then moves positions with numpy, as for numbers; the strings are gathered once, where a
    result, a key code or a set operation needs them (``strings``). No arithmetic or comparison emitter
    accepts one (expressions._emits): positions are not values."""

    __slots__ = ("type", "data", "valid", "scalar", "arrow", "base")

    def __init__(self, type_, data: str, valid: str | None, scalar: str | None = None, arrow: str | None = None,
                 base: str | None = None):
        self.type, self.data, self.valid, self.scalar, self.arrow, self.base = type_, data, valid, scalar, arrow, base


def is_string(t) -> bool:
    """A string column's type: generated code carries it as positions into an Arrow array (``Col``)."""
    return isinstance(t, pa.DataType) and (pa.types.is_string(t) or pa.types.is_large_string(t))


def string_constant(g: "Gen", value: str, n: str) -> Col:
    """A string literal as a column: position 0, on every row, into a one-value array."""
    base = g.const(pa.array([value], pa.string()), "s")
    return Col(pa.string(), g.let(f"np.zeros({n}, np.int64)"), None, base=base)


def string_nulls(g: "Gen", n: str) -> Col:
    """A string column NULL on every row: position 0 of a one-NULL array."""
    base = g.const(_ONE_NULL, "s")
    return Col(pa.string(), g.let(f"np.zeros({n}, np.int64)"), g.let(f"np.zeros({n}, bool)"), base=base)


_ONE_NULL = pa.nulls(1, pa.string())


def string_values(g: "Gen", col: Col) -> str:
    """The name of a string column's values as an Arrow array (gathered from its base)."""
    if col.base is None:
        raise Unsupported("a string column without its array in generated code")
    return g.let(f"strings({col.base}, {col.data}, {col.valid})", "a")


def moved(c: Col, data: str, valid: str | None) -> Col:
    """``c``'s column after its rows moved (a take): ``data``/``valid`` are the moved variables; a string
    column keeps its base array."""
    return Col(c.type, data, valid, base=c.base)


def operands(*cols: Col) -> list[str]:
    """What an elementwise operation over ``cols`` reads of each: the scalar of a constant, unless every
    operand is one (the result must be a column)."""
    if all(c.scalar is not None for c in cols):
        return [c.data for c in cols]
    return [c.scalar or c.data for c in cols]


class GFrame:
    """A relation's rows while generating: its columns, each made (emitted) where first used, and the name of
    the variable holding its row count."""

    __slots__ = ("makers", "made", "n", "memo", "taken")

    def __init__(self, makers: list[Callable[["Gen"], Col]], n: str,
                 taken: tuple["GFrame", str] | None = None):
        self.makers = makers
        self.made: list[Col | None] = [None] * len(makers)
        self.n = n
        self.memo: dict = {}  # shared subexpressions' columns (expressions.Common)
        # (frame, rows): these are that frame's rows at the positions in variable ``rows`` (a take),
        # so a take of a take gathers its columns once, through the composed positions.
        self.taken = taken

    def col(self, g: "Gen", i: int) -> Col:
        found = self.made[i]
        if found is None:
            found = self.made[i] = self.makers[i](g)
        return found

    def maker(self, i: int) -> Callable[["Gen"], Col]:
        """Column ``i`` as a maker for another frame (made once, for both)."""
        return lambda g: self.col(g, i)


class Gen:
    """The source text of one function being written, and the objects its names refer to."""

    def __init__(self):
        self.lines: list[str] = []
        self.names: dict[str, object] = {"np": np, "pa": pa, "Fallback": Fallback}
        self._ids = itertools.count()
        self._consts: dict[int, str] = {}
        self.lengths: dict[str, str] = {}  # a constant's scalar name -> its column's length variable
        self.ctes: dict[object, GFrame] = {}
        self._values: dict[str, str] = {}  # let's text -> the variable already holding it

    def var(self, prefix: str = "v") -> str:
        return f"{prefix}{next(self._ids)}"

    def const(self, value, prefix: str = "k") -> str:
        """A name for ``value`` in the function's namespace (one per object)."""
        name = self._consts.get(id(value))
        if name is None:
            name = self._consts[id(value)] = self.var(prefix)
            self.names[name] = value
        return name

    def line(self, text: str) -> None:
        self.lines.append(text)

    def let(self, text: str, prefix: str = "v") -> str:
        """A variable holding ``text``'s value: the one made for the same text before, if any.

        The body is straight-line code whose variables are each assigned once and whose
        operations read their operands without changing them, so the same text means the same
        value (a string column gathered for two comparisons, a take shared by two expressions)."""
        name = self._values.get(text)
        if name is None:
            name = self._values[text] = self.var(prefix)
            self.lines.append(f"{name} = {text}")
        return name

    def both(self, a: str | None, b: str | None) -> str | None:
        """Validity of a value valid where both ``a`` and ``b`` are (None: all valid)."""
        if a is None or b is None:
            return a if b is None else b
        return self.let(f"{b} if {a} is None else ({a} if {b} is None else {a} & {b})")

    def ones(self, valid: str | None, n: str) -> str:
        """``valid`` as a mask (all true when it is None)."""
        if valid is None:
            return self.let(f"np.ones({n}, bool)")
        return self.let(f"np.ones({n}, bool) if {valid} is None else {valid}")

    def fallback_if(self, test: str, reason: str) -> None:
        self.line(f"if {test}: raise Fallback({reason!r})")

    def valid_any(self, mask: str, valid: str | None) -> str:
        """Source of ``(mask & valid).any()`` (``valid`` maybe None)."""
        if valid is None:
            return f"{mask}.any()"
        return f"({mask} if {valid} is None else {mask} & {valid}).any()"

    def source(self) -> str:
        body = "\n".join("        " + line for line in _live_lines(self.lines))
        return f"def step(inputs):\n    with np.errstate(all='ignore'):\n{body}\n"


_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _live_lines(lines: list[str]) -> list[str]:
    """``lines`` without the assignments whose variables nothing after them reads (columns made and not
    used: a filter's "is false", a count beside a SUM over no NULL); tests, raises and the return stay."""
    used: set[str] = set()
    kept = []
    for line in reversed(lines):
        targets, sep, value = line.partition(" = ")
        names = [t.strip() for t in targets.split(",")] if sep and not line.startswith("if ") else None
        if names is not None and all(_NAME.fullmatch(n) for n in names):
            if not any(n in used for n in names if n != "_"):
                continue
            used.update(_NAME.findall(value))
        else:
            used.update(_NAME.findall(line))
        kept.append(line)
    return kept[::-1]


def constant(g: Gen, type_, value, n: str) -> Col:
    """A constant column (vectors.constant): ``value`` in ``type_``'s numpy type, or NULL."""
    dtype = numpy_type(type_)
    if value is None:
        return Col(type_, g.let(f"np.zeros({n}, {g.const(dtype, 'dt')})"), g.let(f"np.zeros({n}, bool)"))
    scalar = g.const(np.array([value], dtype)[0])
    g.lengths[scalar] = n
    return Col(type_, g.let(f"np.full({n}, {scalar})"), None, scalar)


def _converted(value, source, target):
    """A constant's value as ``convert`` makes it of type ``target``; None when not folded (it is then
    converted at run time, where a refusal is a Fallback as in the closures)."""
    from ivm.execute.compiled import decimals

    one = np.array([value], numpy_type(source))
    try:
        if is_decimal(target) or (target == "HUGEINT" and is_decimal(source)):
            return decimals.cast(one, None, source, target)[0]
        if target == "DOUBLE" and is_decimal(source):
            return decimals.to_double(one, decimals.scale_of(source))[0]
    except Fallback:
        return None
    if target == "TIMESTAMP" and source == "DATE":
        return None
    return one.astype(numpy_type(target))[0]


def convert(g: Gen, col: Col, target) -> Col:
    """expressions.convert while generating: ``col`` as numpy data of ``target`` (a unify() result)."""
    from ivm.execute.compiled import decimals  # (it imports vectors only; here to keep this module's imports light)

    source = col.type
    if col.scalar is not None:  # a constant: converted now, once (as the lines below would at run time)
        value = _converted(g.names[col.scalar], source, target)
        if value is not None:
            return constant(g, target, value, g.lengths[col.scalar])
    if source == target or source == "NULL":
        if numpy_type(source) == numpy_type(target) and source != "NULL":
            return Col(target, col.data, col.valid)
        return Col(target, g.let(f"{col.data}.astype({g.const(numpy_type(target), 'dt')}, copy=False)"), col.valid)
    if is_decimal(target) or (target == "HUGEINT" and is_decimal(source)):
        cast = g.const(decimals.cast, "cast")
        return Col(target, g.let(f"{cast}({col.data}, {col.valid}, {source!r}, {target!r})"), col.valid)
    if target == "DOUBLE" and is_decimal(source):
        to_double = g.const(decimals.to_double, "to_double")
        return Col(target, g.let(f"{to_double}({col.data}, {decimals.scale_of(source)})"), col.valid)
    if target == "TIMESTAMP" and source == "DATE":  # (a date past the years 1..9999 falls back, as in the closures)
        return Col(target, g.let(f"{g.const(date_micros, 'date_micros')}({col.data}, {col.valid})"), col.valid)
    if numpy_type(source) != numpy_type(target):
        return Col(target, g.let(f"{col.data}.astype({g.const(numpy_type(target), 'dt')})"), col.valid)
    return Col(target, col.data, col.valid)


def check_range(g: Gen, t, col_data: str, valid: str | None, what: str) -> None:
    """vectors.check_range while generating: Fallback unless every valid value fits integer type ``t``."""
    if t not in ("BIGINT", "HUGEINT") and decimal_of(t) is None and not is_int(t):
        raise Unsupported(f"range check of {t} in generated code")
    bounds = int_bounds(t)
    if bounds is None:
        return
    low, high = bounds
    bad = g.let(f"({col_data} < {low}) | ({col_data} > {high})")
    g.fallback_if(g.valid_any(bad, valid), f"{what} outside {t}")


def truth(g: Gen, col: Col, n: str) -> tuple[str, str]:
    """expressions.truth while generating: variables (is true, is false) of a boolean column."""
    if col.type == "NULL":
        zeros = g.let(f"np.zeros({n}, bool)")
        return zeros, zeros
    data = col.data if col.type == "BOOLEAN" else g.let(f"{col.data}.astype(bool, copy=False)")
    if col.valid is None:
        return data, g.let(f"~{data}")  # (a result from these two is never NULL: see boolean())
    t = g.let(f"{data} if {col.valid} is None else {data} & {col.valid}")
    f = g.let(f"~{data} if {col.valid} is None else ~{data} & {col.valid}")
    return t, f


def boolean(g: Gen, t: str, f: str, *operands: Col) -> Col:
    """The column of a three-valued result that is true at ``t`` and false at ``f``: NULL elsewhere, so never
    NULL when no operand can be (each row is then true or false)."""
    if all(c.valid is None for c in operands):
        return Col("BOOLEAN", t, None)
    return Col("BOOLEAN", t, g.let(f"{t} | {f}"))


def key_codes(g: Gen, left: list[Col], right: list[Col] | None, n_left: str, n_right: str | None) -> str:
    """Source of the key codes of one side's columns (``right`` None: a GROUP BY) or of two sides' (a join):
    one integer column with no NULL is its own code (kernels.codes), and so is a pair of them in a join,
    with no call; otherwise the kernels code them."""
    single = len(left) == 1 and is_int(left[0].type) and (right is None or is_int(right[0].type))
    if right is None:
        general = f"codes({_vecs(g, left)}, {n_left})"
        if not single:
            return general
        return left[0].data if left[0].valid is None else f"{left[0].data} if {left[0].valid} is None else {general}"
    general = f"joint_codes({_vecs(g, left)}, {_vecs(g, right)}, {n_left}, {n_right})"
    if not single:
        return general
    pair = f"({left[0].data}, {right[0].data})"
    tests = [f"{c.valid} is None" for c in (left[0], right[0]) if c.valid is not None]
    return pair if not tests else f"{pair} if {' and '.join(tests)} else {general}"


def _vecs(g: Gen, cols: list[Col]) -> str:
    """Source of the Vecs of generated columns (for the kernels that code keys); string columns are
    gathered into Arrow arrays (the kernels code strings as the closures' Vecs hold them)."""
    if any(is_string(c.type) and c.base is None for c in cols):
        raise Unsupported("a string key without its array in generated code")
    types = g.const(tuple(c.type for c in cols), "types")
    return f"vecs({types}, ({''.join(f'({c.data}, {c.valid}, {c.base}), ' for c in cols)}))"


# --- run time helpers (one call each where the closures make several) -------------------------------

def read(arr: pa.Array, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """An input column as Vec.np() reads it: (data, valid); ``kind``: 'f' DOUBLE, 'i' integers, dates and
    timestamps (as int64), 'b' BOOLEAN, 'd' decimal128 (as int64; Fallback past it)."""
    valid = np.asarray(arr.is_valid()) if arr.null_count else None
    if kind == "s":  # positions into ``arr`` (see Col)
        return np.arange(len(arr), dtype=np.int64), valid
    if kind == "d":
        low, fits = int64_values(arr)
        if not (fits if valid is None else (fits | ~valid)).all():
            raise Fallback(f"a {arr.type} value outside int64")
        return low, valid
    if kind == "b":
        if arr.null_count:
            arr = arr.fill_null(False)
        return arr.to_numpy(zero_copy_only=False), valid
    data = fixed_width_values(arr)
    return (data if kind == "f" else data.astype(np.int64, copy=False)), valid


def read_kind(t) -> str:
    if t == "DOUBLE":
        return "f"
    if t == "BOOLEAN":
        return "b"
    if decimal_of(t) is not None:
        return "d"
    if is_int(t) or t in ("DATE", "TIMESTAMP"):
        return "i"
    if is_string(t):
        return "s"
    raise Unsupported(f"a column of {t} in generated code")


def not_distinct(equal: np.ndarray, valid_x: np.ndarray | None, valid_y: np.ndarray | None) -> np.ndarray:
    """``x IS NOT DISTINCT FROM y`` from ``x = y`` (``equal``) and each side's validity (None: no NULL):
    equal where both are valid, true where both are NULL."""
    if valid_x is None and valid_y is None:
        return equal
    valid_x = np.ones(len(equal), bool) if valid_x is None else valid_x
    valid_y = np.ones(len(equal), bool) if valid_y is None else valid_y
    return np.where(valid_x & valid_y, equal, ~valid_x & ~valid_y)


def take(data: np.ndarray, valid: np.ndarray | None, index: np.ndarray, missing: np.ndarray | None):
    """Rows ``index`` of a column, NULL where ``missing`` (Vec._gather over numpy)."""
    if missing is not None:
        index = np.where(missing, 0, index)
    out = data[index] if len(data) else np.zeros(len(index), data.dtype)
    v = None if valid is None else (valid[index] if len(data) else np.zeros(len(index), bool))
    if missing is not None:
        v = ~missing if v is None else (v & ~missing)
    return out, v


def pairs(left_codes: np.ndarray, right_codes: np.ndarray, left_skip: np.ndarray | None,
          right_skip: np.ndarray | None, n: int, left: bool):
    """A join's pairs of rows: (left rows, or None when they are every left row once in order; right rows;
    missing: where a LEFT join's row has no match, or None).

    kernels.matches then ``outer``; but where no right key repeats (a join with a state's, a grouping's
    or a DISTINCT's rows: the usual case) one binary search pairs every left row, and a LEFT join keeps
    the left rows in their order (rows of a result are a multiset: any order is the same result).
    """
    order = kernels.sorted_rows(right_codes, right_skip)
    ordered = right_codes[order]
    if len(ordered) and not (ordered[1:] == ordered[:-1]).any():
        at = np.minimum(np.searchsorted(ordered, left_codes), len(ordered) - 1)
        hit = ordered[at] == left_codes
        if left_skip is not None:
            hit &= ~left_skip
        if left:
            return None, order[at], (None if hit.all() else ~hit)
        li = np.flatnonzero(hit)
        return (None if len(li) == n else li), order[at[li]], None
    li, ri, _ = kernels.matches(left_codes, right_codes, left_skip, right_skip)
    return outer(li, ri, n, left)


def outer(li: np.ndarray, ri: np.ndarray, n: int, left: bool):
    """A join's pairs: (left rows or None when they are every left row once in order, right rows, missing)."""
    missing = None
    if left:
        lonely = np.flatnonzero(np.bincount(li, minlength=n) == 0)
        if len(lonely):
            li = np.concatenate([li, lonely])
            ri = np.concatenate([ri, np.zeros(len(lonely), np.int64)])
            missing = np.zeros(len(li), bool)
            missing[len(li) - len(lonely):] = True
    same = len(li) == n and (not len(li) or (li[0] == 0 and bool((np.diff(li) == 1).all())))
    return (None if same else li), ri, missing


def vecs(types: tuple, columns: tuple) -> list[Vec]:
    """(data, valid, base) columns as Vecs, for the kernels that code keys (a few calls a step); a string
    column's strings are gathered from its ``base`` array."""
    return [Vec.of(t, d, v) if base is None else Vec(t, array=strings(base, d, v)) for t, (d, v, base) in zip(types, columns)]


def strings(base: pa.Array, positions: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """A string column's values: ``base`` at ``positions``, NULL where not ``valid`` (see Col)."""
    if valid is None and len(positions) == len(base) and (
            not len(positions) or (positions[0] == 0 and positions[-1] == len(base) - 1
                                   and bool((np.diff(positions) == 1).all()))):
        return base  # every row in order: the array itself
    return base.take(pa.array(positions, pa.int64(), mask=None if valid is None else ~valid))


_STRING_ORDER = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater,
                 "ge": pc.greater_equal}


def compare_strings(op: str, left: pa.Array, right) -> np.ndarray:
    """``left op right`` over strings (an array or a scalar) as bool data; NULLs are the caller's."""
    return np.asarray(_STRING_ORDER[op](left, right).fill_null(False))


def string_in(values: pa.Array, members: pa.Array) -> np.ndarray:
    """``values IN (members)`` as bool data (a NULL value: false here, NULL by the caller's validity)."""
    return np.asarray(pc.is_in(values, value_set=members).fill_null(False))


def like_matcher(pattern: str) -> tuple[str, str]:
    """How ``LIKE pattern`` (literal text and ``%`` only) is matched: ("equal" | "prefix" | "suffix" |
    "substring" | "any" | "regex", the text or anchored RE2 pattern). The plain forms are Arrow's
    substring kernels; a regex is compiled again on every call (~40 us of a ~50 us match of 500
    strings, measured), so it is kept for patterns with text between two pieces ('%a%b%', 'a%b')."""
    pieces = pattern.split("%")
    if len(pieces) == 1:
        return "equal", pattern
    first, inner, last = pieces[0], [p for p in pieces[1:-1] if p], pieces[-1]
    if not inner:
        if not first and not last:
            return "any", ""
        if not last:
            return "prefix", first
        if not first:
            return "suffix", last
    elif len(inner) == 1 and not first and not last:
        return "substring", inner[0]
    return "regex", "(?s)\\A" + ".*".join(f"\\Q{piece}\\E" if piece else "" for piece in pieces) + "\\z"


_LIKE_KERNELS = {
    "equal": lambda v, text: pc.equal(v, text),
    "prefix": lambda v, text: pc.starts_with(v, text),
    "suffix": lambda v, text: pc.ends_with(v, text),
    "substring": lambda v, text: pc.match_substring(v, text),
    "any": lambda v, _: pc.is_valid(v),
    "regex": lambda v, regex: pc.match_substring_regex(v, regex),
}


def string_like(values: pa.Array, kind: str, text: str, negate: bool) -> np.ndarray:
    """expressions._like's match (see like_matcher) as bool data; NULLs are the caller's."""
    hit = _LIKE_KERNELS[kind](values, text)
    return np.asarray((pc.invert(hit) if negate else hit).fill_null(False))


def string_slice(values: pa.Array, begin: int, stop: int | None) -> pa.Array:
    """expressions._substring's characters ``begin`` .. ``stop`` - 1 of every value."""
    return pc.utf8_slice_codeunits(values, begin, stop)


def concat_strings(a: pa.Array, b: pa.Array) -> tuple[np.ndarray, np.ndarray | None, pa.Array]:
    """UNION ALL of two string columns' values: (positions, valid, base) of one array holding both."""
    base = pa.concat_arrays([a, b])
    valid = np.asarray(base.is_valid()) if base.null_count else None
    return np.arange(len(base), dtype=np.int64), valid, base


def concat(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """UNION ALL of two (data, valid) columns."""
    (x, vx), (y, vy) = a, b
    valid = None
    if vx is not None or vy is not None:
        valid = np.concatenate([np.ones(len(x), bool) if vx is None else vx, np.ones(len(y), bool) if vy is None else vy])
    return np.concatenate([x, y]), valid


def to_arrow(g: Gen, col: Col, n: str) -> str:
    """Source of the Arrow array of an output column (Vec.arrow)."""
    t = col.type
    if col.arrow is not None:
        return col.arrow
    if is_string(t):
        return string_values(g, col)
    mask = "None" if col.valid is None else f"None if {col.valid} is None else ~{col.valid}"
    if t == "NULL":
        return f"pa.nulls({n})"
    if t == "HUGEINT" or is_decimal(t):
        return f"{g.const(_int64_to_decimal, 'dec')}({col.data}, {mask}, {g.const(arrow_type(t), 'T')})"
    if t == "DATE":
        return f"pa.array({col.data}.astype(np.int32), pa.int32(), mask={mask}).view(pa.date32())"
    if t == "TIMESTAMP":
        return f"pa.array({col.data}, pa.int64(), mask={mask}).view({g.const(TO_ARROW['TIMESTAMP'], 'T')})"
    if t not in TO_ARROW:
        raise Unsupported(f"an output column of {t} in generated code")
    return f"pa.array({col.data}, {g.const(TO_ARROW[t], 'T')}, mask={mask})"


def build(rel, expected_names: list[str]) -> tuple[Callable[[dict], list[pa.Array]], str]:
    """The generated function of a compiled relation (``Rel`` with emitters) and its source text;
    ``Unsupported`` when an operator or expression in it has no emitter."""
    if rel.emit is None:
        raise Unsupported("an operator without generated code")
    g = Gen()
    frame = rel.emit(g)
    outs = [to_arrow(g, frame.col(g, i), frame.n) for i in range(len(expected_names))]
    g.line("return [" + ", ".join(outs) + "]")
    source = g.source()
    namespace = dict(g.names)
    namespace.update(one_array=one_array, read=read, take=take, not_distinct=not_distinct, pairs=pairs, outer=outer,
                     vecs=vecs, concat=concat,
                     strings=strings, concat_strings=concat_strings, compare_strings=compare_strings,
                     string_in=string_in, string_like=string_like, string_slice=string_slice, matches=kernels.matches,
                     joint_codes=kernels.joint_codes, codes=kernels.codes, groups=kernels.groups,
                     group_count=kernels.group_count, group_sum=kernels.group_sum,
                     group_extreme=kernels.group_extreme, group_all=kernels.group_all)
    exec(compile(source, "<generated step>", "exec"), namespace)
    return namespace["step"], source
