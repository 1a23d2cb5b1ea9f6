"""Binding prepared-statement parameters into SQL, safely.

Clients send ``?`` placeholders (or DuckDB's ``$1``) and, separately, one
Arrow row of values per execution. Values never reach the SQL text as text:
the statement is tokenized and parsed once per distinct text (so a ``?``
inside a string or comment is not a placeholder, and a statement that does
not parse fails before any value is looked at); each execution then splices,
at the placeholders' token positions, a literal expression built from the
Arrow value and type and rendered by sqlglot with correct quoting. Splicing
instead of re-rendering the tree keeps the per-execution cost to rendering
the literals (a lookup runs hundreds of times a second; rendering and
re-parsing the whole statement each time cost ~1 ms).

>>> import pyarrow as pa
>>> row = pa.record_batch({"0": [7], "1": ["it's"]})
>>> bind("SELECT * FROM t WHERE id = ? AND name = ? AND note <> '?'", row, 0)
"SELECT * FROM t WHERE id = 7 AND name = 'it''s' AND note <> '?'"
"""

from __future__ import annotations

import datetime
import functools
import math
from dataclasses import dataclass

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


def _placeholders(sql: str) -> list[tuple[int, int, int]]:
    """(start, end, number) of each placeholder token in ``sql``; ``?`` are numbered in order."""
    tokens = _tokens(sql)
    marks = [t for t in tokens if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    dollars = [(t, tokens[i + 1]) for i, t in enumerate(tokens) if t.token_type == TokenType.PARAMETER
               and t.text == "$" and i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.NUMBER]
    if marks and dollars:
        raise SqlSyntaxError("a statement uses either ? or $n parameters, not both")
    if dollars:
        return [(dollar.start, number.end + 1, int(number.text)) for dollar, number in dollars]
    return [(t.start, t.end + 1, n) for n, t in enumerate(marks, start=1)]


def _numbered(sql: str) -> tuple[str, int]:
    """The text with every ``?`` as ``$n``, and the number of parameters."""
    spots = _placeholders(sql)
    pieces, last = [], 0
    for start, end, number in spots:
        pieces += [sql[last:start], f"${number} "]  # the space keeps "$1,$2" from reading as a $-quoted string
        last = end
    return "".join(pieces) + sql[last:], max((n for _, _, n in spots), default=0)


def count(sql: str) -> int:
    """How many parameters a statement takes (tokenized only: some statements sqlglot cannot parse)."""
    return max((n for _, _, n in _placeholders(sql)), default=0)


@dataclass(frozen=True)
class Template:
    """A statement parsed once: its trees (``$n`` parameters) and its text cut at the placeholders."""

    text: str  # with $n parameters: what the trees were parsed from
    trees: tuple[exp.Expression, ...]  # never modified: callers copy
    wanted: int
    pieces: tuple[str, ...]  # len(numbers) + 1 pieces of the original text around the placeholders
    numbers: tuple[int, ...]  # parameter number of each placeholder, in text order

    def splice(self, literals: list[str]) -> str:
        """The original text with placeholder n replaced by ``literals[n - 1]``."""
        out = [self.pieces[0]]
        for number, after in zip(self.numbers, self.pieces[1:]):
            if not 1 <= number <= len(literals):
                raise BindError(f"parameter ${number} has no value")
            text = literals[number - 1]
            before = out[-1][-1:]
            # Never glue a literal to a neighbouring token ("1-?" with -5 must not become the comment "1--5").
            if before and not before.isspace() and before not in "(,":
                text = " " + text
            if after[:1] and not after[:1].isspace() and after[:1] not in "),;":
                text += " "
            out += [text, after]
        return "".join(out)


@functools.lru_cache(maxsize=512)
def _template(sql: str) -> Template:
    spots = _placeholders(sql)
    text, wanted = _numbered(sql)
    try:
        trees = tuple(t for t in sqlglot.parse(text, dialect=DIALECT) if t is not None)
    except (ParseError, TokenError) as e:
        raise SqlSyntaxError(f"syntax error: {str(e).splitlines()[0]}") from None
    cuts = [0] + [edge for start, end, _ in spots for edge in (start, end)] + [len(sql)]
    pieces = tuple(sql[cuts[i]:cuts[i + 1]] for i in range(0, len(cuts), 2))
    return Template(text, trees, wanted, pieces, tuple(n for _, _, n in spots))


def numbered(sql: str) -> str:
    """The text with ``$n`` parameters (what a prepared query is parsed as, once)."""
    return _template(sql).text


def bind(sql: str, values: pa.RecordBatch, row: int) -> str:
    """The statement with parameter n replaced by column n-1 of ``values[row]``."""
    template = _template(sql)
    if values.num_columns != template.wanted:
        raise BindError(f"the statement takes {template.wanted} parameter(s) but {values.num_columns} were bound")
    return template.splice([literal(values.column(i)[row]).sql(DIALECT) for i in range(values.num_columns)])


def bind_rows(sql: str, values: pa.RecordBatch) -> list[str]:
    """One statement per parameter row, or one INSERT for all rows when it can be.

    ``INSERT ... VALUES (?, ...)`` with several rows (``executemany``) becomes
    one INSERT with a VALUES row per parameter row: one change batch, applied
    atomically (and at the cost of one).
    """
    texts = [bind(sql, values, row) for row in range(values.num_rows)]
    trees = _template(sql).trees
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


_LIST_TYPES = {pa.int64(): "BIGINT[]", pa.float64(): "DOUBLE[]", pa.bool_(): "BOOLEAN[]", pa.date32(): "DATE[]"}


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
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):  # (a PostgreSQL array parameter: x = ANY($1))
        items = exp.Array(expressions=[literal(item) for item in scalar.values])
        return items if len(scalar.values) else exp.cast(items, _LIST_TYPES.get(kind.value_type, "VARCHAR[]"))
    raise UnsupportedError(f"parameters of type {kind} are not supported")
