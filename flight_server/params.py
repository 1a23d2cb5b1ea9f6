"""Binding prepared-statement parameters into SQL, safely.

Clients send ``?`` placeholders (or DuckDB's ``$1``) and, separately, one
Arrow row of values per execution. Values never touch the SQL text: the text
is tokenized (so a ``?`` inside a string or comment is not a placeholder),
each ``?`` token becomes a numbered parameter, the statement is parsed, and
each parameter node is replaced by a literal expression built from the Arrow
value and type; sqlglot renders it with correct quoting.

>>> import pyarrow as pa
>>> row = pa.record_batch({"0": [7], "1": ["it's"]})
>>> bind("SELECT * FROM t WHERE id = ? AND name = ? AND note <> '?'", row, 0)
"SELECT * FROM t WHERE id = 7 AND name = 'it''s' AND note <> '?'"
"""

from __future__ import annotations

import datetime
import functools
import math

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sql_frontend.errors import BindError, SqlSyntaxError, UnsupportedError

DIALECT = "duckdb"


def _tokens(sql: str) -> list:
    try:
        return sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
    except TokenError as e:
        raise SqlSyntaxError(f"syntax error: {str(e).splitlines()[0]}") from None


def _numbered(sql: str) -> tuple[str, int]:
    """The text with every ``?`` as ``$n``, and the number of parameters."""
    tokens = _tokens(sql)
    marks = [t for t in tokens if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    dollars = [t for i, t in enumerate(tokens) if t.token_type == TokenType.PARAMETER and t.text == "$"
               and i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.NUMBER]
    if marks and dollars:
        raise SqlSyntaxError("a statement uses either ? or $n parameters, not both")
    if dollars:
        numbers = [int(tokens[tokens.index(t) + 1].text) for t in dollars]
        return sql, max(numbers)
    pieces, last = [], 0
    for n, token in enumerate(marks, start=1):
        pieces += [sql[last:token.start], f"${n} "]  # the space keeps "$1,$2" from reading as a $-quoted string
        last = token.end + 1
    return "".join(pieces) + sql[last:], len(marks)


def count(sql: str) -> int:
    """How many parameters a statement takes."""
    return _numbered(sql)[1]


@functools.lru_cache(maxsize=512)
def _template(sql: str) -> tuple[tuple[exp.Expression, ...], int]:
    """The parsed statements with numbered parameters (never modified: bind copies)."""
    text, wanted = _numbered(sql)
    try:
        trees = tuple(t for t in sqlglot.parse(text, dialect=DIALECT) if t is not None)
    except (ParseError, TokenError) as e:
        raise SqlSyntaxError(f"syntax error: {str(e).splitlines()[0]}") from None
    return trees, wanted


def bind(sql: str, values: pa.RecordBatch, row: int) -> str:
    """The statement with parameter n replaced by column n-1 of ``values[row]``."""
    trees, wanted = _template(sql)
    if values.num_columns != wanted:
        raise BindError(f"the statement takes {wanted} parameter(s) but {values.num_columns} were bound")
    literals = [literal(values.column(i)[row]) for i in range(values.num_columns)]

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder) and node.this is not None:
            number = int(str(node.this))
            if not 1 <= number <= len(literals):
                raise BindError(f"parameter ${number} has no value")
            return literals[number - 1].copy()
        return node

    return ";\n".join(t.transform(replace).sql(DIALECT) for t in trees)


def bind_rows(sql: str, values: pa.RecordBatch) -> list[str]:
    """One statement per parameter row, or one INSERT for all rows when it can be.

    ``INSERT ... VALUES (?, ...)`` with several rows (``executemany``) becomes
    one INSERT with a VALUES row per parameter row: one change batch, applied
    atomically (and at the cost of one).
    """
    texts = [bind(sql, values, row) for row in range(values.num_rows)]
    trees, _ = _template(sql)
    if len(texts) < 2 or len(trees) != 1 or not _single_values_insert(trees[0]):
        return texts
    inserts = [sqlglot.parse_one(text, dialect=DIALECT) for text in texts]
    merged = inserts[0]
    rows = [row for insert in inserts for row in insert.expression.expressions]
    merged.expression.set("expressions", rows)
    return [merged.sql(DIALECT)]


def _single_values_insert(tree: exp.Expression) -> bool:
    return (isinstance(tree, exp.Insert) and isinstance(tree.expression, exp.Values)
            and len(tree.expression.expressions) == 1 and not tree.args.get("returning"))


def literal(scalar: pa.Scalar) -> exp.Expression:
    """A SQL expression with exactly the value (and, where it matters, the type) of ``scalar``."""
    kind = scalar.type
    value = scalar.as_py()
    if value is None:
        return exp.null()
    if pa.types.is_boolean(kind):
        return exp.Boolean(this=value)
    if pa.types.is_integer(kind):
        return exp.Literal.number(str(value))
    if pa.types.is_floating(kind):
        text = repr(float(value)) if math.isfinite(value) else str(value)
        return exp.cast(exp.Literal.string(text), "DOUBLE")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return exp.Literal.string(value)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return exp.func("unhex", exp.Literal.string(bytes(value).hex()))
    if pa.types.is_decimal(kind):
        return exp.cast(exp.Literal.string(str(value)), f"DECIMAL({kind.precision}, {kind.scale})")
    if pa.types.is_date(kind):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if pa.types.is_timestamp(kind) and isinstance(value, datetime.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMPTZ" if kind.tz else "TIMESTAMP")
    if pa.types.is_time(kind):
        return exp.cast(exp.Literal.string(value.isoformat()), "TIME")
    raise UnsupportedError(f"parameters of type {kind} are not supported")
