"""Point and whole reads: a prepared ``SELECT cols FROM r WHERE k = ? [AND k2 = ?]``, or
``SELECT cols FROM r``, answered without DuckDB.

Contract: for a query of exactly that shape over one table or view whose
rows are already Arrow data on the read's snapshot, with integer or string
parameters compared to columns of the same kind, the result is the rows
DuckDB would return (a multiset; SQL gives no order), with the very schema
DuckDB gave the same query over the same input schema.

Why: a 1-row lookup and a read of a whole view are the hot reads of a
serving database (hundreds a second, while ingesting). Through DuckDB each
costs ~1 ms of CPU, most of it the fixed cost of a statement (bind, plan,
Arrow in and out) and two GIL hand-offs, plus registering the relation on
the reading cursor again after every change; an Arrow equality filter costs
a few tens of microseconds, and a whole read hands over the rows as they are.

How it stays equal to DuckDB:

* the shape is checked on the parsed template once (``shape``): one plain
  table in FROM, no joins, no GROUP BY/HAVING/ORDER/LIMIT/DISTINCT/QUALIFY,
  the select list ``*`` or plain column names, no WHERE (a whole read) or a
  conjunction of ``column = $n``. Anything else, and any column name that does not match
  exactly one input column (case-insensitively, as DuckDB resolves them),
  goes to DuckDB;
* only integer parameters against integer columns and string parameters
  against string columns (float equality differs: DuckDB holds NaN = NaN;
  NULL parameters, temporal and other types also go to DuckDB). A value that
  does not fit the column's type matches no row, as in DuckDB;
* the first execution for each input schema runs on DuckDB and its result
  schema is remembered; the fast answer is used only when its schema equals
  that one (names as DuckDB spells them, types as DuckDB converts them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sql_frontend.statements import normalize_name

_ALLOWED_ARGS = {"expressions", "from_", "where"}
# Up to this many matching rows are returned as zero-copy slices, more by one take.
FEW_ROWS = 8


@dataclass(frozen=True)
class Shape:
    """``SELECT columns FROM table WHERE equalities``: names normalized, parameters numbered from 1."""

    table: str
    columns: tuple[str, ...] | None  # None: SELECT *
    equalities: tuple[tuple[str, int], ...]  # (column, parameter number); none: every row


def per_tree(expression: exp.Expression, key: str, compute):
    """``compute(expression)``, once per parsed tree: kept in the tree's meta under ``key``.

    Parsed queries are shared and never modified (prepared statements and
    repeated texts reuse one tree). Copies carry meta along, so the value is
    stored with the tree's id: a copy's id differs and computes its own.
    """
    found = expression.meta_get(key)
    if found is not None and found[0] == id(expression):
        return found[1]
    result = compute(expression)
    expression.meta[key] = (id(expression), result)
    return result


def shape(expression: exp.Expression) -> Shape | None:
    """The point-read shape of a parsed query template, or None; computed once per tree."""
    return per_tree(expression, "ivm.point_shape", _shape)


def _shape(select: exp.Expression) -> Shape | None:
    if not isinstance(select, exp.Select) or any(v for k, v in select.args.items() if k not in _ALLOWED_ARGS):
        return None
    source = select.args.get("from_")
    where = select.args.get("where")
    if source is None or not isinstance(source.this, exp.Table):
        return None
    table = source.this
    if table.args.get("db") or table.args.get("catalog") or not isinstance(table.this, exp.Identifier):
        return None
    if any(v for k, v in table.args.items() if k not in ("this", "alias")):
        return None  # TABLESAMPLE, joins hung on the table, ...
    qualifiers = {normalize_name(table.this)} | ({normalize_name(table.alias)} if table.alias else set())
    columns = _select_list(select.expressions, qualifiers)
    equalities = [] if where is None else _equalities(where.this, qualifiers)
    if columns is False or equalities is None:
        return None
    return Shape(normalize_name(table.this), columns, tuple(equalities))


def _column(node: exp.Expression, qualifiers: set[str]) -> str | None:
    if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
        return None
    if node.args.get("db") or node.args.get("catalog"):
        return None
    if node.table and normalize_name(node.args["table"]) not in qualifiers:
        return None
    return node.this.this.lower()  # DuckDB resolves column names case-insensitively, quoted or not


def _select_list(expressions: list[exp.Expression], qualifiers: set[str]) -> tuple[str, ...] | None | bool:
    """Column names, None for ``*``, False when it is anything else."""
    if len(expressions) == 1 and isinstance(expressions[0], exp.Star) and not expressions[0].args.get("except") \
            and not any(expressions[0].args.values()):
        return None
    names = [_column(e, qualifiers) for e in expressions]
    return False if not names or None in names else tuple(names)


def _equalities(condition: exp.Expression, qualifiers: set[str]) -> list[tuple[str, int]] | None:
    if isinstance(condition, exp.Paren):
        return _equalities(condition.this, qualifiers)
    if isinstance(condition, exp.And):
        left, right = _equalities(condition.this, qualifiers), _equalities(condition.expression, qualifiers)
        return left + right if left and right else None
    if not isinstance(condition, exp.EQ):
        return None
    for column_side, value_side in ((condition.this, condition.expression), (condition.expression, condition.this)):
        column = _column(column_side, qualifiers)
        if column is not None and isinstance(value_side, exp.Placeholder) and str(value_side.this).isdigit():
            return [(column, int(value_side.this))]
    return None


def answer(read: Shape, table: pa.Table, values: list[pa.Scalar],
           keep: Callable[[np.ndarray], np.ndarray] | None = None) -> pa.Table | None:
    """The rows of ``table`` the query selects, or None when this path cannot answer it exactly.

    ``keep``: of the positions the query selects, those that are rows (``table`` holds rows a
    version no longer has: ivm/reads/computed.py's parts, filtered after the match)."""
    fields = {}
    for name in table.schema.names:
        fields.setdefault(name.lower(), []).append(name)
    mask = None
    for column, number in read.equalities:
        names = fields.get(column)
        if names is None or len(names) != 1 or not 1 <= number <= len(values):
            return None
        matches = _matches(table.column(names[0]), values[number - 1])
        if matches is None:
            return None
        mask = matches if mask is None else mask & matches
    positions = None if mask is None else np.flatnonzero(mask)  # None: no equality, every row
    if keep is not None:
        positions = keep(np.arange(table.num_rows) if positions is None else positions)
    rows = table if positions is None else _rows(table, positions)
    if read.columns is None:
        return rows
    chosen = []
    for column in read.columns:
        names = fields.get(column)
        if names is None or len(names) != 1:
            return None
        chosen.append(names[0])
    return rows.select(chosen)


def _rows(table: pa.Table, positions: np.ndarray) -> pa.Table:
    """The rows at ``positions``: zero-copy slices when they are few (a lookup finds one or two)."""
    if len(positions) > FEW_ROWS:
        return table.take(positions)
    if len(positions) <= 1:
        return table.slice(int(positions[0]) if len(positions) else 0, len(positions))
    return pa.concat_tables([table.slice(int(p), 1) for p in positions])


def comparable(value: pa.Scalar, kind: pa.DataType) -> bool:
    """Whether this path compares ``value`` with a column of type ``kind`` as DuckDB does: a non-NULL
    integer with an integer column, or a string with a string column (see the module's contract)."""
    given = value.type
    return value.is_valid and ((pa.types.is_integer(kind) and pa.types.is_integer(given))
                               or (_is_string(kind) and _is_string(given)))


def _matches(column: pa.ChunkedArray, value: pa.Scalar) -> np.ndarray | None:
    """A boolean numpy mask of the rows equal to ``value``, or None when this path cannot compare them."""
    kind = column.type
    if not comparable(value, kind):
        return None
    if pa.types.is_integer(kind):
        wanted, (low, high) = value.as_py(), _range(kind)
        if not low <= wanted <= high:  # out of the column's range: cannot match
            return np.zeros(len(column), dtype=bool)
        # numpy over the values where no slot is NULL (a NULL slot's buffer may hold anything).
        return _concat([chunk.to_numpy() == wanted if not chunk.null_count else
                        _mask(pc.equal(chunk, pa.scalar(wanted, kind))) for chunk in column.chunks], len(column))
    return _concat([_mask(pc.equal(chunk, value.cast(kind))) for chunk in column.chunks], len(column))


@functools.cache
def _range(kind: pa.DataType) -> tuple[int, int]:
    bounds = np.iinfo(kind.to_pandas_dtype())
    return int(bounds.min), int(bounds.max)


def _mask(matches: pa.Array) -> np.ndarray:
    return matches.fill_null(False).to_numpy(zero_copy_only=False)


def _concat(masks: list[np.ndarray], rows: int) -> np.ndarray:
    if len(masks) == 1:
        return masks[0]
    return np.concatenate(masks) if masks else np.zeros(rows, dtype=bool)


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)
