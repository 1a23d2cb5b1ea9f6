"""COPY ... FROM STDIN and COPY ... TO STDOUT: the statement, and the text and CSV data formats.

Only the client's own stream is a COPY endpoint here: ``COPY t FROM
'/file'`` or ``TO PROGRAM`` is not parsed as a COPY of ours and goes to the
Database, which refuses SQL that reaches outside it (AccessDeniedError).

Formats (PostgreSQL's "COPY" reference page):

* text: one line per row, fields separated by a tab (DELIMITER), ``\\N`` is
  NULL, backslash escapes ``\\t \\n \\r \\\\ \\b \\f \\v``, ``\\NNN`` (octal) and
  ``\\xHH``; a line ``\\.`` ends the data.
* csv: fields separated by ``,``, quoted with ``"`` (doubled inside quotes);
  an unquoted empty field is NULL, a quoted one the empty string; HEADER
  skips (in) or writes (out) a line of column names.

* binary: PostgreSQL's binary COPY format (copy_binary.py); the options
  of the text formats (DELIMITER, NULL, QUOTE, HEADER) are refused with it,
  as PostgreSQL does.

A table may be named with its schema (``public.t``, or ``"public" . "t"``
as ADBC's bulk ingest writes it): ivm's tables are in schema public.

>>> spec = parse("COPY t (a, b) FROM STDIN WITH (FORMAT csv, HEADER true)")
>>> spec.table, spec.columns, spec.inbound, spec.csv, spec.header
('t', ['a', 'b'], True, True, True)
>>> rows(b'a,b\\n1,"x,y"\\n2,\\n3,""\\n', spec)
[['1', 'x,y'], ['2', None], ['3', '']]
>>> rows(b"1\\tit\\\\ts\\n2\\t\\\\N\\n\\\\.\\n", parse("COPY t FROM STDIN"))
[['1', 'it\\ts'], ['2', None]]
>>> spec = parse('COPY "public" . "T" ("a") FROM STDIN WITH (FORMAT binary)')
>>> spec.table, spec.columns, spec.binary
('T', ['a'], True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sql_frontend.errors import SqlSyntaxError, UnknownObjectError, UnsupportedError
from sql_frontend.statements import unknown_option

COPY_OPTIONS = ("format", "header", "delimiter", "null", "quote", "encoding")

_COPY = re.compile(
    r"COPY\s+(?:(?P<query>\(.*\))|(?P<table>[\w\"$]+(?:\s*\.\s*[\w\"$]+){0,2})\s*(?P<columns>\([^()]*\))?)"
    r"\s+(?P<direction>FROM\s+STDIN|TO\s+STDOUT)\b(?P<options>.*)$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass
class CopySpec:
    inbound: bool  # FROM STDIN
    table: str | None = None
    columns: list[str] | None = None
    query: str | None = None  # COPY (query) TO STDOUT
    csv: bool = False
    binary: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    quote: str = '"'


def _name(text: str) -> str:
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1].replace('""', '"')
    return text.lower()


def _table(text: str) -> str:
    """The table of ``t``, ``public.t`` or ``ivm.public.t`` (quoted or not); another schema is unknown."""
    parts = [_name(p) for p in re.findall(r'"(?:[^"]|"")*"|[^\s."]+', text)]
    if parts[:-1] not in ([], ["public"], ["main"], ["ivm", "public"]):
        raise UnknownObjectError(f"relation {text.strip()} does not exist: ivm's tables are in schema public")
    return parts[-1]


def _options(text: str) -> list[tuple[str, str]]:
    """Option (name, value) pairs, from ``WITH (FORMAT csv, HEADER)`` or the old ``WITH CSV HEADER``."""
    text = text.strip().rstrip(";").strip()
    if text.upper().startswith("WITH"):
        text = text[4:].strip()
    if not text:
        return []
    tokens = re.findall(r"'(?:[^']|'')*'|\(|\)|,|[^\s(),']+", text)
    if tokens and tokens[0] == "(":
        if tokens[-1] != ")":
            raise SqlSyntaxError(f"COPY options: unbalanced parentheses in {text[:80]!r}")
        pairs, current = [], []
        for token in tokens[1:-1] + [","]:
            if token == ",":
                if current:
                    pairs.append((current[0].lower(), " ".join(current[1:])))
                current = []
            else:
                current.append(token)
        return pairs
    pairs, i = [], 0
    while i < len(tokens):  # the pre-9.0 syntax: CSV, HEADER, DELIMITER 'x', NULL 'x', BINARY
        word = tokens[i].lower()
        if word in ("delimiter", "null", "quote", "escape", "encoding") and i + 1 < len(tokens):
            pairs.append((word, tokens[i + 1]))
            i += 2
            continue
        pairs.append(("format", word) if word in ("csv", "binary", "text") else (word, ""))
        i += 1
    return pairs


def _string(value: str) -> str:
    value = value.strip()
    if value.startswith("'") and value.endswith("'") and len(value) >= 2:
        return value[1:-1].replace("''", "'")
    return value


def parse(sql: str) -> CopySpec | None:
    """The COPY of the client's stream ``sql`` describes, or None when it is not one (a file, a program)."""
    match = _COPY.match(sql.strip())
    if match is None:
        return None
    spec = CopySpec(inbound=match["direction"].upper().startswith("FROM"))
    if match["query"]:
        if spec.inbound:
            raise SqlSyntaxError("COPY (query) works only with TO STDOUT")
        spec.query = match["query"][1:-1]
    else:
        spec.table = _table(match["table"])
        if match["columns"]:
            spec.columns = [_name(c) for c in match["columns"][1:-1].split(",") if c.strip()]
    for name, value in _options(match["options"]):
        value = _string(value)
        if name == "format":
            if value.lower() not in ("text", "csv", "binary"):
                raise SqlSyntaxError(f"COPY format {value!r} not recognized")
            spec.csv, spec.binary = value.lower() == "csv", value.lower() == "binary"
        elif name == "header":
            spec.header = value.lower() not in ("false", "off", "0")
        elif name == "delimiter":
            spec.delimiter = value
        elif name == "null":
            spec.null = value
        elif name == "quote":
            spec.quote = value
        elif name == "encoding":
            if value.upper().replace("-", "") not in ("UTF8", "UNICODE"):
                raise UnsupportedError(f"COPY encoding {value!r} is not supported (only UTF8)")
        else:
            raise unknown_option(name, "COPY", COPY_OPTIONS)
    if spec.binary:
        given = [name for name, _ in _options(match["options"]) if name in ("delimiter", "null", "quote", "header")]
        if given:
            raise SqlSyntaxError(f"cannot specify {given[0].upper()} in BINARY mode")
        return spec
    if spec.csv and spec.null == "\\N":
        spec.null = ""
    if spec.csv and not any(name == "delimiter" for name, _ in _options(match["options"])):
        spec.delimiter = ","
    if len(spec.delimiter) != 1 or len(spec.quote) != 1:
        raise SqlSyntaxError("COPY delimiter and quote must be a single one-byte character")
    return spec


# --- reading ---------------------------------------------------------------------------------------
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)")


def _unescape(match: re.Match) -> str:
    code = match.group(1)
    if code[0] == "x" and len(code) > 1:
        return chr(int(code[1:], 16))
    if code.isdigit():
        return chr(int(code, 8))
    return _ESCAPES.get(code, code)


def _split(line: str, delimiter: str) -> list[str]:
    """A text-format line's raw fields: split at delimiters that are not backslash-escaped."""
    fields, current, i = [], [], 0
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line):
            current.append(line[i:i + 2])
            i += 2
            continue
        if char == delimiter:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    fields.append("".join(current))
    return fields


def _text_rows(text: str, spec: CopySpec) -> list[list[str | None]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last row
    out = []
    for line in lines:
        line = line[:-1] if line.endswith("\r") else line
        if line == "\\.":
            break
        out.append([None if f == spec.null else _ESCAPE.sub(_unescape, f) for f in _split(line, spec.delimiter)])
    return out[1:] if spec.header else out


def _csv_rows(text: str, spec: CopySpec) -> list[list[str | None]]:
    rows: list[list[str | None]] = []
    row: list[str | None] = []
    field: list[str] = []
    quoted = in_quotes = False
    i, n = 0, len(text)
    delimiter, quote = spec.delimiter, spec.quote

    def end_field() -> None:
        nonlocal field, quoted
        value = "".join(field)
        row.append(None if not quoted and value == spec.null else value)
        field, quoted = [], False

    while i < n:
        char = text[i]
        if in_quotes:
            if char == quote and i + 1 < n and text[i + 1] == quote:
                field.append(quote)
                i += 1
            elif char == quote:
                in_quotes = False
            else:
                field.append(char)
        elif char == quote:
            in_quotes = quoted = True
        elif char == delimiter:
            end_field()
        elif char in "\r\n":
            if char == "\r" and i + 1 < n and text[i + 1] == "\n":
                i += 1
            if row or field or quoted:
                end_field()
                if row != ["\\."]:
                    rows.append(row)
            row = []
        else:
            field.append(char)
        i += 1
    if in_quotes:
        raise SqlSyntaxError("COPY csv data ends inside a quoted field")
    if row or field or quoted:
        end_field()
        if row != ["\\."]:
            rows.append(row)
    return rows[1:] if spec.header else rows


def rows(data: bytes, spec: CopySpec) -> list[list[str | None]]:
    """The rows of COPY data (each field a string, None for NULL)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SqlSyntaxError("COPY data is not valid UTF-8") from None
    return _csv_rows(text, spec) if spec.csv else _text_rows(text, spec)


# --- writing ---------------------------------------------------------------------------------------
def line(values: list[str | None], spec: CopySpec) -> str:
    """One row of COPY TO output."""
    if spec.csv:
        special = (spec.delimiter, spec.quote, "\n", "\r")
        fields = []
        for v in values:
            if v is None:
                fields.append(spec.null)
            elif v == spec.null or any(s in v for s in special) or v != v.strip():
                fields.append(spec.quote + v.replace(spec.quote, spec.quote * 2) + spec.quote)
            else:
                fields.append(v)
        return spec.delimiter.join(fields) + "\n"
    return spec.delimiter.join(spec.null if v is None else _escape_text(v, spec.delimiter) for v in values) + "\n"


def _escape_text(value: str, delimiter: str) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return value.replace(delimiter, "\\" + delimiter) if delimiter != "\t" else value
