"""How large and how deeply nested a statement may be, checked before it is parsed.

sqlglot's parser, ivm's planner and delta compiler and sqlglot's SQL
generator all recurse over the syntax tree: sqlglot alone takes 23 to 28
Python frames per level of parentheses, so ``SELECT ((((…1…))))`` a few
dozen deep already exhausts Python's default recursion limit (1,000 frames)
and 3,000 deep used to surface as an INTERNAL error. A database refuses such
a statement up front, by a limit it names (SQLite's parser stops at 100
levels, DuckDB's parser at an expression depth of 1,000, and ivm renders a chain
x + x as ((x + x) + x), two levels per operator). So:

* ``MAX_NESTING`` levels of parentheses, brackets and CASE … END (function
  calls and subqueries are parenthesised, so they count too);
* ``MAX_DEPTH`` for the depth of the expression tree as the text shows it:
  the nesting levels plus the operators chained at each of them
  (``x + x + … + x`` is a left-deep tree as deep as its operator count).

Both are counted on the text by one regular-expression scan (quoted strings,
quoted identifiers and comments skipped), so a 1 MiB ``x + x + …`` is refused
in well under a second instead of being parsed for ten. The count is a close
upper estimate of the tree's depth (``a BETWEEN 1 AND 2`` counts its AND).
Every stage (parse, plan, delta compile, SQL generation, DuckDB binding)
handles a statement at both limits with a wide margin once the interpreter's
recursion limit is at least ``RECURSION_LIMIT`` (``ensure_recursion_limit``;
at the limits the deepest stage used about 3,200 frames). A statement that
still runs out of recursion (a shape the scan does not see, e.g. a deep
chain of set operations) is reported as ``TooComplexError``
(``too_complex``), never as an internal error.
"""

from __future__ import annotations

import re
import sys

from sql_frontend.errors import TooComplexError

MAX_NESTING = 128
MAX_DEPTH = 256
# SELECTs nested in a materialized view's query: planning a view costs more than linear time in
# its nesting (16 nested derived tables plan in ~1 s, 20 in ~2 s, 128 in many minutes), so a
# view is held to fewer levels than a query (which DuckDB plans alone).
MAX_VIEW_SELECTS = 16
MAX_STATEMENT_BYTES = 1 << 20  # the default of Settings.max_statement_bytes
RECURSION_LIMIT = 10_000  # 3x the deepest stage at the limits; low enough that Python 3.10, whose calls grow the C stack, stays within an 8 MiB thread stack
ECHO_CHARS = 200  # how much of a user's statement an error message repeats

# One token of interest per match; everything else (identifiers, numbers, blanks) is skipped by finditer.
_TOKENS = re.compile(
    r"""'[^']*(?:''[^']*)*'?            # string literal (unterminated: to the end)
      | "[^"]*(?:""[^"]*)*"?            # quoted identifier
      | --[^\n]*                        # line comment
      | /\*.*?(?:\*/|\Z)                # block comment
      | (?P<open>[(\[{])
      | (?P<close>[)\]}])
      | (?P<sep>[,;])
      | (?P<op>::|\|\||->>|->|<=|>=|<>|!=|[-+*/%<>=|&^~])
      | \b(?P<word>[A-Za-z_]+)\b
    """, re.VERBOSE | re.DOTALL)

# Words that chain operands like an operator does.
_OPERATOR_WORDS = frozenset({"and", "or", "not", "is", "like", "ilike", "in", "between", "collate", "glob",
                             "similar"})
# Words that start a new expression at the same level (a clause, a CASE branch, a set operation).
_CLAUSE_WORDS = frozenset({"select", "from", "where", "group", "by", "having", "order", "limit", "offset", "on",
                           "using", "join", "when", "then", "else", "as", "union", "except", "intersect",
                           "values", "set", "qualify", "window", "with", "distinct", "all", "into", "over",
                           "partition", "rows", "range", "returning"})


def check_text(sql: str) -> None:
    """Refuse ``sql`` when it nests deeper than MAX_NESTING or MAX_DEPTH (TooComplexError)."""
    # Each open level: [operators chained at this level, depth of the tree above this level].
    stack: list[list[int]] = [[0, 0]]
    for m in _TOKENS.finditer(sql):
        kind = m.lastgroup
        if kind is None:  # literal, quoted identifier or comment: one operand
            continue
        if kind == "word":
            word = m.group("word").lower()
            if word == "case":
                _open(stack, sql)
            elif word == "end":
                if len(stack) > 1:
                    stack.pop()
            elif word in _OPERATOR_WORDS:
                _chain(stack, sql)
            elif word in _CLAUSE_WORDS:
                stack[-1][0] = 0
        elif kind == "open":
            _open(stack, sql)
        elif kind == "close":
            if len(stack) > 1:
                stack.pop()
        elif kind == "sep":
            stack[-1][0] = 0
        else:
            _chain(stack, sql)


def _open(stack: list[list[int]], sql: str) -> None:
    if len(stack) > MAX_NESTING:
        raise TooComplexError(f"statement nests parentheses, subqueries or CASE more than {MAX_NESTING} levels "
                              f"deep (the limit is {MAX_NESTING}): {echo(sql)}")
    chained, above = stack[-1]
    stack.append([0, above + chained + 1])


def _chain(stack: list[list[int]], sql: str) -> None:
    level = stack[-1]
    level[0] += 1
    if level[1] + level[0] > MAX_DEPTH:
        raise TooComplexError(f"an expression is nested more than {MAX_DEPTH} levels deep, counting operators "
                              f"chained like x + x + … (the limit is {MAX_DEPTH}): {echo(sql)}")


def check_view_nesting(query: "exp.Expression") -> None:
    """Refuse a view query that nests SELECTs more than MAX_VIEW_SELECTS deep (TooComplexError)."""
    from sqlglot import exp

    # Iterative: the tree may be as deep as MAX_DEPTH allows.
    stack = [(query, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, exp.Select):
            depth += 1
            if depth > MAX_VIEW_SELECTS:
                raise TooComplexError(f"a materialized view nests SELECTs (subqueries, derived tables) more than "
                                      f"{MAX_VIEW_SELECTS} levels deep (the limit is {MAX_VIEW_SELECTS})")
        stack.extend((child, depth) for child in node.iter_expressions())


def check_size(sql: str, max_bytes: int | None) -> None:
    """Refuse a statement text longer than ``max_bytes`` UTF-8 bytes (None or 0: no limit)."""
    if not max_bytes:
        return
    # A str's length bounds its UTF-8 size from below (and from above by 4x): encode only when it may be over.
    if len(sql) > max_bytes or (len(sql) * 4 > max_bytes and len(sql.encode("utf-8", "surrogatepass")) > max_bytes):
        size = len(sql.encode("utf-8", "surrogatepass"))
        raise TooComplexError(f"statement is {size} bytes; the limit is {max_bytes} bytes "
                              f"(max_statement_bytes, ivm serve --max-statement-bytes): {echo(sql)}")


def echo(sql: str, limit: int = ECHO_CHARS) -> str:
    """``sql`` as an error message may repeat it: the first ``limit`` characters, then its size."""
    text = sql.strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(sql.encode('utf-8', 'surrogatepass'))} bytes)"


def too_complex(error: RecursionError) -> TooComplexError:
    """The error a statement that ran out of recursion is reported as."""
    return TooComplexError(f"statement is too deeply nested to process (ran out of recursion; ivm allows "
                           f"{MAX_NESTING} levels of parentheses, subqueries or CASE and an expression depth of "
                           f"{MAX_DEPTH})")


def ensure_recursion_limit() -> None:
    """Raise the interpreter's recursion limit to RECURSION_LIMIT if it is lower (never lowers it).

    In CPython 3.11+ Python-to-Python calls do not grow the C stack, so the
    limit can be this high on ordinary 8 MiB thread stacks; the statements
    the limits above admit measured well under 1 MiB of C stack.
    """
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
