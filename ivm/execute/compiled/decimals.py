"""DuckDB's DECIMAL: its binder's result types, and scaled-int64 kernels that round as it does.

A DECIMAL(p,s) value v is held as the int64 v * 10^s (vectors.py). The
result types are the ones DuckDB 2.0's binder gives (checked against
``typeof`` for every width in tests/execute/test_compiled_decimal.py):

- an integer operand counts as DECIMAL(3,0) TINYINT, (5,0) SMALLINT, (10,0)
  INTEGER, (19,0) BIGINT, (38,0) HUGEINT; an integer literal as the
  narrowest of INTEGER/BIGINT holding it (Arrow's decimal128(38,0) is a
  DECIMAL(38,0) to DuckDB, not a HUGEINT);
- ``+``/``-``: scale max(s), width max(max(p - s) + max(s), max(p)) + 1,
  capped at 38;
- ``*``: width pa + pb, scale sa + sb; a width over 18 from two operands of
  at most 18 digits is cut to 18 when the scale is below 18 (DuckDB then
  checks the product against 10^18), a width over 38 to 38; a scale over 38
  is an error in DuckDB (here: Unsupported);
- the common type of CASE/COALESCE/GREATEST/comparisons, pairwise: of two
  decimals max(p - s) + max(s) digits (past 38 the scale shrinks to fit);
  of an integer of d digits and DECIMAL(p,s), DECIMAL(min(d + s, 38), s)
  when d > p - s, else the decimal;
- comparisons (BETWEEN, IN: over all their sides): the largest scale and
  integer digits, width capped at 38 with the scale kept;
- ``/`` of decimals is DOUBLE; DOUBLE with a decimal is DOUBLE.

Values: a result whose magnitude reaches 10^p is an error in DuckDB, and a
value outside int64 cannot be held here: both are a ``Fallback``. Lowering
the scale (CAST, a narrower common type) and a cast to an integer round half
away from zero; a DOUBLE becomes a decimal as C's ``round(x * 10^s)`` (so
0.285 -> 0.28, as DuckDB gives, since 0.285 * 100 is 28.4999...).
"""

from __future__ import annotations

import numpy as np

from ivm.execute.compiled.vectors import Fallback, Unsupported, check_range, decimal, decimal_of

INT_DECIMAL = {"TINYINT": (3, 0), "SMALLINT": (5, 0), "INTEGER": (10, 0), "BIGINT": (19, 0), "HUGEINT": (38, 0)}
MAX_WIDTH = 38
INT64_DIGITS = 18  # every value of fewer than 19 digits fits int64


def props(t) -> tuple[int, int]:
    """(width, scale) DuckDB gives type ``t`` (a decimal or an integer type) in decimal arithmetic."""
    dec = decimal_of(t)
    if dec is not None:
        return dec
    if t in INT_DECIMAL:
        return INT_DECIMAL[t]
    raise Unsupported(f"{t} in decimal arithmetic")


def add_type(a, b) -> str:
    (pa_, sa), (pb, sb) = props(a), props(b)
    scale = max(sa, sb)
    width = min(max(max(pa_ - sa, pb - sb) + scale, pa_, pb) + 1, MAX_WIDTH)
    return decimal(width, scale)


def mul_type(a, b) -> str:
    (pa_, sa), (pb, sb) = props(a), props(b)
    width, scale = pa_ + pb, sa + sb
    if scale > MAX_WIDTH:
        raise Unsupported(f"a product of scale {scale} (DuckDB refuses it)")
    if width > INT64_DIGITS and max(pa_, pb) <= INT64_DIGITS and scale < INT64_DIGITS:
        width = INT64_DIGITS
    return decimal(min(width, MAX_WIDTH), scale)


def common_type(types: list) -> str:
    """The type all of ``types`` (decimals and integers, one decimal at least) are cast to when they meet
    (CASE, COALESCE, comparisons): DuckDB's pairwise max type, left to right."""
    out = types[0]
    for t in types[1:]:
        out = _max_type(out, t)
    return out


def comparison_type(types: list) -> str:
    """The type DuckDB casts the sides of a comparison to (folded over BETWEEN's and IN's sides): the largest
    scale and integer digits, the width capped at 38 without cutting the scale (a value that then does not
    fit is an error in DuckDB: a Fallback here)."""
    out = types[0]
    for t in types[1:]:
        if out in INT_DECIMAL and t in INT_DECIMAL:
            out = max(out, t, key=list(INT_DECIMAL).index)
            continue
        (pa_, sa), (pb, sb) = props(out), props(t)
        scale = max(sa, sb)
        out = decimal(min(max(max(pa_ - sa, pb - sb) + scale, pa_, pb), MAX_WIDTH), scale)
    return out


def _max_type(a, b):
    if a in INT_DECIMAL and b in INT_DECIMAL:
        return max(a, b, key=list(INT_DECIMAL).index)
    if a in INT_DECIMAL or b in INT_DECIMAL:
        # an integer meets a decimal: the decimal, widened for the integer's digits (the scale is kept)
        integer, dec = (a, b) if a in INT_DECIMAL else (b, a)
        width, scale = props(dec)
        digits = INT_DECIMAL[integer][0]
        if digits > width - scale:
            return decimal(min(digits + scale, MAX_WIDTH), scale)
        return dec
    (pa_, sa), (pb, sb) = props(a), props(b)
    over, scale = max(pa_ - sa, pb - sb), max(sa, sb)
    if over + scale > MAX_WIDTH:  # it does not fit: DuckDB keeps the integer digits and cuts the scale
        return decimal(MAX_WIDTH, MAX_WIDTH - over)
    return decimal(over + scale, scale)


def scale_of(t) -> int:
    return props(t)[1]


def rescale(data: np.ndarray, valid: np.ndarray | None, source: int, target: int) -> np.ndarray:
    """Scaled values from scale ``source`` to ``target``: exact upwards (Fallback on int64 overflow),
    rounded half away from zero downwards."""
    if target == source:
        return data
    if target > source:
        if target - source > INT64_DIGITS:
            factor = None
        else:
            factor = 10 ** (target - source)
        live = data if valid is None else np.where(valid, data, 0)
        if factor is None or (len(live) and np.abs(live).max(initial=0) > (2**63 - 1) // factor):
            if factor is None and not live.any():
                return np.zeros_like(data)
            raise Fallback("a decimal rescaled outside int64")
        return data * factor
    if source - target > INT64_DIGITS:
        return np.zeros_like(data)  # every int64 rounds to 0 at 10^19 and more
    return round_down(data, 10 ** (source - target))


def round_down(data: np.ndarray, factor: int) -> np.ndarray:
    """data / factor rounded half away from zero (DuckDB's decimal rounding), exactly in integers."""
    if factor == 1:
        return data
    q = np.abs(data) // factor  # abs of int64 min wraps: such a value is past every decimal width anyway
    r = np.abs(data) - q * factor
    q = q + (2 * r >= factor)
    return np.where(data < 0, -q, q)


def to_double(data: np.ndarray, scale: int) -> np.ndarray:
    """Scaled values as DOUBLE (as DuckDB: the integer as a double, divided by 10^scale)."""
    out = data.astype(np.float64)
    return out / 10.0**scale if scale else out


def from_double(data: np.ndarray, valid: np.ndarray | None, t: str) -> np.ndarray:
    """DOUBLEs cast to decimal ``t``: round(x * 10^s), half away from zero; NaN, infinities and values
    of width past t's fall back (DuckDB raises)."""
    width, scale = props(t)
    with np.errstate(all="ignore"):
        scaled = data * 10.0**scale
    live = scaled if valid is None else scaled[valid]
    limit = min(10.0**width, 2.0**62)
    if len(live) and not (np.isfinite(live).all() and np.abs(live).max() < limit - 1):
        raise Fallback(f"CAST of a DOUBLE outside {t} (or not finite)")
    scaled = np.where(np.isfinite(scaled), scaled, 0.0)
    whole = np.trunc(scaled)
    out = whole + np.where(np.abs(scaled - whole) >= 0.5, np.sign(scaled), 0.0)
    return out.astype(np.int64)


def cast(data: np.ndarray, valid: np.ndarray | None, source, target) -> np.ndarray:
    """Decimal or integer ``source`` values as decimal ``target``; Fallback where DuckDB raises."""
    out = rescale(data, valid, scale_of(source), scale_of(target))
    check_range(target, out, valid, f"CAST to {target}")
    return out
