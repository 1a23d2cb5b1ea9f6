"""Parse SQL text into the statements ivm understands.

Everything is parsed with sqlglot's DuckDB dialect (which also reads most
Postgres-flavoured SQL: ``::`` casts, ``TEXT``, ``ILIKE``...). A statement ivm
does not run is rejected here, by name, before anything changes.

>>> [type(s).__name__ for s in parse("CREATE TABLE t (a INT PRIMARY KEY); SELECT * FROM t")]
['CreateTable', 'Query']
"""

from __future__ import annotations


import logging
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sql_frontend.access import check_statement, check_tree
from sql_frontend.errors import AccessDeniedError, SqlSyntaxError, UnknownObjectError, UnsupportedError
from sql_frontend.event_time import StreamSpec, strip_stream_clauses
from sql_frontend.limits import check_text, check_view_nesting, ensure_recursion_limit, echo, too_complex
from sql_frontend.session_windows import quote_session_calls
from sql_frontend.system_queries import DATABASE, SYSTEM_SCHEMAS, USER_SCHEMAS

DIALECT = "duckdb"

# sqlglot logs a warning for every construct it only half understands; our own
# checks report what matters, so keep its logger quiet.
logging.getLogger("sqlglot").setLevel(logging.ERROR)
# Statements within sql_frontend/limits.py's nesting limits need more than Python's default 1,000 frames.
ensure_recursion_limit()


@dataclass
class ColumnDef:
    name: str
    type: str  # DuckDB type SQL as written; the catalog normalises it
    not_null: bool = False
    default: exp.Expression | None = None


@dataclass
class CreateTable:
    name: str
    columns: list[ColumnDef]
    primary_key: tuple[str, ...] = ()
    if_not_exists: bool = False
    as_query: exp.Expression | None = None
    stream: StreamSpec | None = None  # APPEND ONLY / WATERMARK (sql_frontend/event_time.py)


@dataclass
class CreateView:
    name: str
    query: exp.Expression
    sql: str
    column_names: tuple[str, ...] | None = None
    if_not_exists: bool = False
    engine: str | None = None  # WITH (engine = 'spark'|'duckdb'|'auto'); None: the database's setting
    late: str | None = None  # WITH (late = 'drop'|'correct'): stragglers of watermarked tables
    emit: str | None = None  # WITH (emit = 'on_update'|'on_close'): windows published as they change or once closed


@dataclass
class Drop:
    kind: str  # "table" | "view"
    name: str
    if_exists: bool = False
    cascade: bool = False


@dataclass
class Insert:
    table: str
    columns: tuple[str, ...] | None
    query: exp.Expression
    replace: bool = False  # INSERT OR REPLACE: upsert by primary key


@dataclass
class Update:
    table: str
    assignments: list[tuple[str, exp.Expression]]
    where: exp.Expression | None


@dataclass
class Delete:
    table: str
    where: exp.Expression | None


@dataclass
class Query:
    """A read: SELECT, set operations, DESCRIBE. Runs on a consistent snapshot."""

    expression: exp.Expression
    sql: str


@dataclass
class Explain:
    """EXPLAIN of a view name, a SELECT or a CREATE MATERIALIZED VIEW."""

    view: str | None = None
    query: Query | None = None
    create: CreateView | None = None


@dataclass
class SetOption:
    name: str
    value: str


@dataclass
class Show:
    what: str  # "tables" | "views" | "sources" | "status" | "create" (extra["name"]: SHOW CREATE MATERIALIZED VIEW)
    extra: dict = field(default_factory=dict)


@dataclass
class Maintenance:
    """CHECKPOINT (store everything now) or COMPACT (checkpoint, compact the log, vacuum)."""

    what: str  # "checkpoint" | "compact"


@dataclass
class CreateSource:
    """CREATE SOURCE name FROM POSTGRES CONNECTION 'dsn' PUBLICATION 'pub' [SLOT 'slot'] (see ivm/cdc/postgres.py)."""

    name: str
    connection: str
    publication: str
    slot: str | None = None
    options: dict = field(default_factory=dict)  # WITH (name = value): see SOURCE_OPTIONS


@dataclass
class DropSource:
    name: str


@dataclass
class RefreshSourceTable:
    """ALTER SOURCE name REFRESH TABLE t: load one table of a source again from upstream (ivm/cdc/stream.py)."""

    source: str
    table: str


@dataclass
class RefreshView:
    """REFRESH MATERIALIZED VIEW name: accepted and does nothing, for the view is always fresh.

    Every acknowledged change is in every view a read sees (reads wait for the maintainer), so there is
    nothing to recompute; tools send it to bring a PostgreSQL view up to date (dbt's second ``dbt run``
    of a materialized_view model). The view must exist. ``WITH NO DATA`` (empty the view until the
    next refresh) is refused: an ivm view cannot be emptied.
    """

    name: str


@dataclass
class AlterView:
    """ALTER MATERIALIZED VIEW name SET (engine = '...') | RESET (engine): the view's own engine."""

    name: str
    engine: str | None  # None: RESET, the database's setting again


@dataclass
class AlterTable:
    """ALTER TABLE name ADD COLUMN … | DROP COLUMN c [CASCADE] | ALTER COLUMN c TYPE t (a widening)."""

    table: str
    action: str  # "add" | "drop" | "type"
    column: str
    definition: ColumnDef | None = None  # add: the new column; type: its new type (``definition.type``)
    if_exists: bool = False  # ALTER TABLE IF EXISTS: a missing table is no error
    column_if: bool = False  # ADD COLUMN IF NOT EXISTS / DROP COLUMN IF EXISTS
    cascade: bool = False  # DROP COLUMN … CASCADE: the views that read the column are dropped too


Statement = (
    CreateTable | CreateView | Drop | Insert | Update | Delete | Query | Explain | SetOption | Show | Maintenance
    | CreateSource | DropSource | RefreshSourceTable | AlterView | AlterTable | RefreshView
)

_LITERAL = r"'((?:[^']|'')*)'"
CREATE_SOURCE = re.compile(
    r"\s*CREATE\s+SOURCE\s+([A-Za-z_][A-Za-z0-9_]*)\s+FROM\s+POSTGRES\s+CONNECTION\s+" + _LITERAL
    + r"\s+PUBLICATION\s+" + _LITERAL + r"(?:\s+SLOT\s+" + _LITERAL + r")?(?:\s+WITH\s*\((.*)\))?\s*;?\s*",
    re.IGNORECASE | re.DOTALL)
# Options of CREATE SOURCE … WITH (name = value): the parser of each value.
SOURCE_OPTIONS = {
    # a source failing (or stopped while its slot exists) this long warns that its slot holds WAL upstream
    "wal_warning_seconds": lambda text: _non_negative_number("wal_warning_seconds", text),
}
SOURCE_OPTION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(" + _LITERAL + r"|[^,']+?)\s*(?:,|$)", re.DOTALL)
DROP_SOURCE = re.compile(r"\s*DROP\s+SOURCE\s+([A-Za-z_][A-Za-z0-9_]*)\s*;?\s*", re.IGNORECASE)
ALTER_SOURCE = re.compile(r"\s*ALTER\s+SOURCE\s+([A-Za-z_][A-Za-z0-9_]*)\s+REFRESH\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)"
                          r"\s*;?\s*", re.IGNORECASE)


ALTER_VIEW = re.compile(
    r"\s*ALTER\s+MATERIALIZED\s+VIEW\s+([A-Za-z_][A-Za-z0-9_]*)\s+(SET|RESET)\s*\((.*)\)\s*;?\s*",
    re.IGNORECASE | re.DOTALL)
ENGINE_OPTION = re.compile(r"\s*engine\s*=\s*" + _LITERAL + r"\s*", re.IGNORECASE)


def _alter_view(sql: str) -> AlterView | None:
    """ALTER MATERIALIZED VIEW, which sqlglot cannot parse: matched as a whole statement."""
    if not re.match(r"\s*ALTER\s+MATERIALIZED\s+VIEW\b", sql, re.IGNORECASE):
        return None
    m = ALTER_VIEW.fullmatch(sql)
    if m is None and re.search(r"\bRENAME\b", sql, re.IGNORECASE):
        raise UnsupportedError("ALTER MATERIALIZED VIEW … RENAME is not supported: ivm cannot rename a view; drop it "
                               "and create it under the new name")
    if m is None:
        raise SqlSyntaxError("expected ALTER MATERIALIZED VIEW name SET (engine = '<engine>') "
                             "or ALTER MATERIALIZED VIEW name RESET (engine)")
    name, action, options = m[1].lower(), m[2].upper(), m[3].strip()
    if action == "RESET":
        if options.lower() != "engine":
            raise unknown_option(options.split(",")[0].strip().lower(), "ALTER MATERIALIZED VIEW", ("engine",))
        return AlterView(name, None)
    option = ENGINE_OPTION.fullmatch(options)
    if option is None:
        named = re.match(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=", options)
        if named is None or named[1].lower() == "engine":
            raise SqlSyntaxError(f"expected ALTER MATERIALIZED VIEW {name} SET (engine = '<engine>'), got SET ({options})")
        raise unknown_option(named[1].lower(), "ALTER MATERIALIZED VIEW", ("engine",))
    value = option[1].replace("''", "'")
    if value.lower() not in VIEW_ENGINES:
        raise UnsupportedError(f"engine must be one of {', '.join(VIEW_ENGINES)}; got '{value}'")
    return AlterView(name, value.lower())


REFRESH_VIEW = re.compile(r"\s*REFRESH\s+MATERIALIZED\s+VIEW\s+(?:CONCURRENTLY\s+)?"
                          r"((?:(?:\"(?:[^\"]|\"\")+\"|[A-Za-z_][\w$]*)\s*\.\s*){0,2}(?:\"(?:[^\"]|\"\")+\"|[A-Za-z_][\w$]*))"
                          r"\s*(WITH\s+(NO\s+)?DATA)?\s*;?\s*", re.IGNORECASE)


def _refresh_view(sql: str) -> RefreshView | None:
    if not re.match(r"\s*REFRESH\s+MATERIALIZED\s+VIEW\b", sql, re.IGNORECASE):
        return None
    m = REFRESH_VIEW.fullmatch(sql)
    if m is None:
        raise SqlSyntaxError("expected REFRESH MATERIALIZED VIEW [CONCURRENTLY] name [WITH [NO] DATA]")
    if m[3]:
        raise UnsupportedError("REFRESH MATERIALIZED VIEW … WITH NO DATA is not supported: an ivm view is always "
                               "populated and fresh")
    table = sqlglot.parse_one(f"SELECT * FROM {m[1]}", read=DIALECT).find(exp.Table)
    return RefreshView(_user_relation(table, "REFRESH MATERIALIZED VIEW"))


def _source_statement(sql: str) -> Statement | None:
    """CREATE/DROP/ALTER SOURCE and REFRESH MATERIALIZED VIEW, which sqlglot cannot parse: matched as a whole."""
    altered = _alter_view(sql) or _refresh_view(sql)
    if altered is not None:
        return altered
    if re.match(r"\s*ALTER\s+SOURCE\b", sql, re.IGNORECASE):
        m = ALTER_SOURCE.fullmatch(sql)
        if m is None:
            raise SqlSyntaxError("expected ALTER SOURCE name REFRESH TABLE table")
        return RefreshSourceTable(m[1].lower(), m[2].lower())
    if re.match(r"\s*CREATE\s+SOURCE\b", sql, re.IGNORECASE):
        m = CREATE_SOURCE.fullmatch(sql)
        if m is None:
            raise SqlSyntaxError("expected CREATE SOURCE name FROM POSTGRES CONNECTION '<dsn>' "
                                 "PUBLICATION '<publication>' [SLOT '<slot>'] [WITH (option = value, …)]")
        unquote = lambda text: None if text is None else text.replace("''", "'")  # noqa: E731
        return CreateSource(m[1].lower(), unquote(m[2]), unquote(m[3]), unquote(m[4]), _source_options(m[5] or ""))
    m = DROP_SOURCE.fullmatch(sql)
    return DropSource(m[1].lower()) if m else None


def _source_options(text: str) -> dict:
    """The ``WITH (name = value, …)`` options of CREATE SOURCE, each parsed; unknown ones are refused."""
    options: dict = {}
    pos = 0
    while text[pos:].strip():
        m = SOURCE_OPTION.match(text, pos)
        if m is None:
            raise SqlSyntaxError(f"expected CREATE SOURCE … WITH (option = value, …), got WITH ({text.strip()})")
        name, value = m[1].lower(), m[3].replace("''", "'") if m[3] is not None else m[2].strip()
        if name not in SOURCE_OPTIONS:
            raise unknown_option(name, "CREATE SOURCE", tuple(SOURCE_OPTIONS))
        options[name] = SOURCE_OPTIONS[name](value)
        pos = m.end()
    return options


def _non_negative_number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UnsupportedError(f"{name} must be a number of seconds, 0 or more; got {text}")
    return value


def normalize_name(identifier: exp.Expression | str) -> str:
    """Catalog names are case-insensitive, as in DuckDB: store them lower-case."""
    if isinstance(identifier, exp.Expression):
        identifier = identifier.name
    return identifier.lower()


def parse(sql: str) -> list[Statement]:
    """Parse one or more ';'-separated statements.

    A text nested beyond sql_frontend/limits.py's limits is refused before
    it is parsed; one that still runs out of recursion is a TooComplexError.
    """
    check_text(sql)
    try:
        return _parse(sql)
    except RecursionError as e:
        raise too_complex(e) from None


def _parse(sql: str) -> list[Statement]:
    source = _source_statement(sql)
    if source is not None:
        return [source]
    sql, stream = strip_stream_clauses(sql)
    if stream is not None:
        statement = _parse_trees(sql)
        if len(statement) != 1 or not isinstance(statement[0], CreateTable):
            raise SqlSyntaxError("WATERMARK and APPEND ONLY belong to a CREATE TABLE statement")
        if statement[0].as_query is not None:
            raise UnsupportedError("CREATE TABLE … AS SELECT cannot be APPEND ONLY; create the table, then INSERT")
        statement[0].stream = stream
        return statement
    return _parse_trees(sql)


def _parse_trees(sql: str) -> list[Statement]:
    texts = statement_texts(sql)
    for text in texts or ():
        check_statement(text)  # before parsing: sqlglot cannot parse every statement of DuckDB's own
    try:
        trees = [t for t in sqlglot.parse(quote_session_calls(sql), dialect=DIALECT) if t is not None]
    except (ParseError, TokenError) as e:
        raise SqlSyntaxError(f"syntax error: {_first_line(e)}") from None
    if not trees:
        raise SqlSyntaxError("empty statement")
    if texts is None or len(texts) != len(trees):  # cannot pair them: sqlglot's text stands in
        texts = [t.sql(DIALECT) for t in trees]
    statements = [_statement(t, text) for t, text in zip(trees, texts)]
    for statement, text in zip(statements, texts):
        if isinstance(statement, Query):
            # Run the user's own text: a round trip through sqlglot could change it.
            statement.sql = text
    return statements


def statement_texts(sql: str) -> list[str] | None:
    """Each ';'-separated statement of ``sql`` exactly as written (None: the text does not tokenize).

    Messages quote these slices, never sqlglot's regenerated (upper-cased,
    re-spaced) text. The split is sqlglot's: at semicolon tokens, so a ';'
    inside a string or a comment does not split.
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
    except TokenError:
        return None
    texts, first, last = [], None, None
    for token in [*tokens, None]:
        if token is None or token.token_type == TokenType.SEMICOLON:
            if first is not None:
                texts.append(sql[first.start:last.end + 1])
            first = last = None
        else:
            first = first or token
            last = token
    return texts


def parse_one(sql: str) -> Statement:
    statements = parse(sql)
    if len(statements) != 1:
        raise SqlSyntaxError(f"expected one statement, got {len(statements)}")
    return statements[0]


def parse_query(sql: str) -> exp.Expression:
    """Parse a single SELECT-like expression (used for view bodies)."""
    statement = parse_one(sql)
    if not isinstance(statement, Query):
        raise SqlSyntaxError("expected a SELECT statement")
    return statement.expression


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


QUERY_TYPES = (exp.Select, exp.Union, exp.Except, exp.Intersect, exp.Values, exp.Describe)


MAINTENANCE = ("checkpoint", "compact")


def _maintenance(tree: exp.Expression) -> Maintenance | None:
    """CHECKPOINT / COMPACT, which sqlglot reads as a bare column name."""
    word = tree.this if isinstance(tree, exp.Alias) else tree
    if not isinstance(word, exp.Column) or word.table or word.name.lower() not in MAINTENANCE:
        return None
    if word is not tree:
        raise UnsupportedError(f"{word.name.upper()} takes no arguments (it applies to the whole database)")
    return Maintenance(what=word.name.lower())


def _statement(tree: exp.Expression, text: str) -> Statement:
    """The statement of ``tree``; ``text`` is how the user wrote it (quoted by errors)."""
    check_tree(tree)
    maintenance = _maintenance(tree)
    if maintenance is not None:
        return maintenance
    if isinstance(tree, QUERY_TYPES):
        return Query(tree, tree.sql(DIALECT))
    if isinstance(tree, exp.Create):
        return _create(tree, text)
    if isinstance(tree, exp.Drop):
        return _drop(tree)
    if isinstance(tree, exp.Alter):
        return _alter(tree, text)
    if isinstance(tree, exp.Insert):
        return _insert(tree)
    if isinstance(tree, exp.Update):
        return _update(tree)
    if isinstance(tree, exp.Delete):
        return _delete(tree)
    if isinstance(tree, exp.Set):
        return _set(tree, text)
    if isinstance(tree, exp.Command):
        return _command(tree, text)
    if isinstance(tree, exp.Show):
        return _show(tree.name)
    raise UnsupportedError(f"statement {echo(text)} is not supported")


def _create(tree: exp.Create, text: str) -> Statement:
    kind = (tree.args.get("kind") or "").upper()
    if tree.args.get("replace"):
        raise UnsupportedError("CREATE OR REPLACE is not supported; DROP the object first")
    if kind == "TABLE":
        return _create_table(tree)
    if kind == "VIEW":
        if tree.find(exp.MaterializedProperty) is None:
            raise UnsupportedError(
                "CREATE VIEW (a plain view) is not supported; use CREATE MATERIALIZED VIEW"
            )
        return _create_view(tree)
    if kind == "SCHEMA":  # (dbt sends it for a profile's or model's schema other than public)
        raise UnsupportedError("CREATE SCHEMA is not supported: ivm's relations are all in schema public")
    raise UnsupportedError(f"CREATE {kind} is not supported" if kind else f"statement {echo(text)} is not supported")


def _create_table(tree: exp.Create) -> CreateTable:
    schema = tree.this
    if isinstance(schema, exp.Schema):
        name = normalize_name(schema.this)
        elements = schema.expressions
    else:
        name = normalize_name(schema)
        elements = []
    if isinstance(schema.this if isinstance(schema, exp.Schema) else schema, exp.Table):
        name = _user_relation(schema.this if isinstance(schema, exp.Schema) else schema, "CREATE TABLE")
    columns: list[ColumnDef] = []
    primary_key: tuple[str, ...] = ()
    for element in elements:
        if isinstance(element, exp.ColumnDef):
            column, is_key = _column_def(element)
            columns.append(column)
            if is_key:
                if primary_key:
                    raise SqlSyntaxError(f"table {name} declares more than one PRIMARY KEY")
                primary_key = (column.name,)
        elif isinstance(element, exp.PrimaryKey):
            if primary_key:
                raise SqlSyntaxError(f"table {name} declares more than one PRIMARY KEY")
            primary_key = tuple(normalize_name(e) for e in element.expressions)
        else:
            raise UnsupportedError(
                f"table constraint {element.sql(DIALECT).split('(')[0].strip()} is not supported "
                "(ivm supports PRIMARY KEY, NOT NULL and DEFAULT)"
            )
    _table_options(tree)
    as_query = tree.expression if isinstance(tree.expression, QUERY_TYPES) else None
    if not columns and as_query is None:
        raise SqlSyntaxError(f"CREATE TABLE {name} needs a column list or AS SELECT")
    return CreateTable(
        name=name,
        columns=columns,
        primary_key=primary_key,
        if_not_exists=bool(tree.args.get("exists")),
        as_query=as_query,
    )


def _column_def(element: exp.ColumnDef) -> tuple[ColumnDef, bool]:
    name = normalize_name(element.this)
    kind = element.args.get("kind")
    if kind is None:
        raise SqlSyntaxError(f"column {name} has no type")
    column = ColumnDef(name=name, type=kind.sql(DIALECT))
    is_key = False
    for constraint in element.args.get("constraints") or []:
        c = constraint.args.get("kind")
        if isinstance(c, exp.PrimaryKeyColumnConstraint):
            is_key = True
        elif isinstance(c, exp.NotNullColumnConstraint):
            if c.args.get("allow_null"):
                continue  # explicit NULL
            column.not_null = True
        elif isinstance(c, exp.DefaultColumnConstraint):
            column.default = c.this
        else:
            label = c.key.replace("columnconstraint", "").upper() if c is not None else "?"
            raise UnsupportedError(
                f"column constraint {label} on {name} is not supported "
                "(ivm supports PRIMARY KEY, NOT NULL and DEFAULT)"
            )
    return column, is_key


def _create_view(tree: exp.Create) -> CreateView:
    target = tree.this
    column_names = None
    if isinstance(target, exp.Schema):
        column_names = tuple(normalize_name(e) for e in target.expressions)
        target = target.this
    if isinstance(target, exp.Table):
        _user_relation(target, "CREATE MATERIALIZED VIEW")
    query = tree.expression
    if not isinstance(query, QUERY_TYPES) or isinstance(query, exp.Describe):
        raise SqlSyntaxError("CREATE MATERIALIZED VIEW needs AS SELECT ...")
    query = unqualified(query)
    check_view_nesting(query)
    options = _view_options(tree)
    return CreateView(
        name=normalize_name(target),
        query=query,
        sql=query.sql(DIALECT),
        column_names=column_names,
        if_not_exists=bool(tree.args.get("exists")),
        engine=options.get("engine"),
        late=options.get("late"),
        emit=options.get("emit"),
    )


VIEW_ENGINES = ("auto", "duckdb", "spark")
# Options of CREATE MATERIALIZED VIEW … WITH (name = 'value') besides engine.
VIEW_OPTIONS = {"late": ("drop", "correct"), "emit": ("on_update", "on_close")}


def unknown_option(name: str, statement: str, valid: tuple[str, ...]) -> UnsupportedError:
    """The error for a ``WITH (name = …)`` option that ``statement`` does not take: names it and the valid ones."""
    return UnsupportedError(f"unknown option '{name}' for {statement}; valid options: "
                            + (", ".join(valid) if valid else "none"))


def _option_name(prop: exp.Expression) -> str | None:
    """The name of a ``name = value`` property (sqlglot makes ``engine = …`` a class of its own); None for a keyword."""
    if isinstance(prop, exp.EngineProperty):
        return "engine"
    if type(prop) is exp.Property:
        return prop.name.lower()
    return None


def _table_options(tree: exp.Create) -> None:
    """CREATE TABLE takes no ``WITH`` options, nor keywords such as TEMPORARY: refused rather than ignored."""
    properties = tree.args.get("properties")
    for prop in properties.expressions if properties is not None else []:
        name = _option_name(prop)
        if name is not None:
            error = unknown_option(name, "CREATE TABLE", ())
            raise UnsupportedError(f"{error} (WATERMARK FOR … and APPEND ONLY are clauses of CREATE TABLE, "
                                   "not WITH options)")
        raise UnsupportedError(f"CREATE {prop.sql(DIALECT)} TABLE is not supported; use CREATE TABLE")


def _view_options(tree: exp.Create) -> dict[str, str]:
    """The ``WITH (engine = '...', late = '...')`` options of CREATE MATERIALIZED VIEW; others are refused."""
    properties = tree.args.get("properties")
    options: dict[str, str] = {}
    for prop in properties.expressions if properties is not None else []:
        if isinstance(prop, exp.MaterializedProperty):
            continue
        name = _option_name(prop)
        if name is None:
            raise UnsupportedError(f"CREATE {prop.sql(DIALECT)} MATERIALIZED VIEW is not supported")
        if name == "engine":
            options["engine"] = _view_engine(prop)
        elif name in VIEW_OPTIONS:
            allowed = VIEW_OPTIONS[name]
            value = prop.args.get("value")
            text = value.name.lower() if isinstance(value, (exp.Literal, exp.Identifier, exp.Var, exp.Column)) else ""
            if text not in allowed:
                shown = value.sql(DIALECT) if value is not None else "nothing"
                raise UnsupportedError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {shown}")
            options[name] = text
        else:
            raise unknown_option(name, "CREATE MATERIALIZED VIEW", ("engine", *VIEW_OPTIONS))
    return options


def _view_engine(prop: exp.Expression) -> str:
    """The value of ``engine = '...'``, one of VIEW_ENGINES."""
    value = prop.args.get("this") if isinstance(prop, exp.EngineProperty) else prop.args.get("value")
    text = value.name.lower() if isinstance(value, (exp.Literal, exp.Identifier, exp.Var, exp.Column)) else ""
    if text not in VIEW_ENGINES:
        raise UnsupportedError(f"engine must be one of {', '.join(VIEW_ENGINES)}; got {value.sql(DIALECT)}")
    return text


def _drop(tree: exp.Drop) -> Drop:
    kind = (tree.args.get("kind") or "").upper()
    if kind not in ("TABLE", "VIEW"):
        raise UnsupportedError(f"DROP {kind} is not supported")
    tables = tree.args.get("tables") or [tree.this]
    if len(tables) != 1:
        raise UnsupportedError("DROP of several objects in one statement is not supported; drop them one by one")
    return Drop(
        kind="table" if kind == "TABLE" else "view",
        name=_user_relation(tables[0], "DROP") if isinstance(tables[0], exp.Table) else normalize_name(tables[0]),
        if_exists=bool(tree.args.get("exists")),
        cascade=bool(tree.args.get("cascade")),
    )


ALTER_TABLE_FORMS = ("ALTER TABLE t ADD [COLUMN] c type [DEFAULT v] [NOT NULL], ALTER TABLE t DROP COLUMN c "
                     "[CASCADE] or ALTER TABLE t ALTER [COLUMN] c [SET DATA] TYPE type")


def _alter(tree: exp.Alter, text: str) -> AlterTable:
    """ALTER TABLE with one action: ADD COLUMN, DROP COLUMN or ALTER COLUMN … TYPE (see ivm/schema_change.py)."""
    kind = (tree.args.get("kind") or "").upper()
    if kind != "TABLE":
        raise UnsupportedError(f"ALTER {kind or echo(text)} is not supported (ALTER TABLE and ALTER MATERIALIZED "
                               "VIEW … SET (engine = …) are)")
    table = _user_relation(tree.this, "ALTER TABLE")
    actions = tree.args.get("actions") or []
    if len(actions) != 1:
        raise UnsupportedError("ALTER TABLE takes one action per statement; run one ALTER TABLE per change")
    action, if_exists = actions[0], bool(tree.args.get("exists"))
    if isinstance(action, exp.ColumnDef):
        column, is_key = _column_def(action)
        if is_key:
            raise UnsupportedError(f"ADD COLUMN {column.name} PRIMARY KEY is not supported: a table's key is set "
                                   "when it is created")
        return AlterTable(table, "add", column.name, column, if_exists, bool(action.args.get("exists")))
    if isinstance(action, exp.Drop) and (action.args.get("kind") or "").upper() == "COLUMN":
        names = action.args.get("tables") or []
        if len(names) != 1:
            raise UnsupportedError("DROP COLUMN drops one column per statement")
        return AlterTable(table, "drop", normalize_name(names[0]), None, if_exists, bool(action.args.get("exists")),
                          cascade=bool(action.args.get("cascade")))
    if isinstance(action, exp.AlterColumn) and action.args.get("dtype") is not None:
        extra = [k for k, v in action.args.items() if k not in ("this", "dtype") and v not in (None, False)]
        if extra:
            raise UnsupportedError(f"ALTER COLUMN … TYPE with {extra[0].upper()} is not supported: ivm changes a "
                                   "column's type only to a wider one, which needs no conversion")
        name = normalize_name(action.this)
        return AlterTable(table, "type", name, ColumnDef(name, action.args["dtype"].sql(DIALECT)), if_exists)
    raise UnsupportedError(f"statement {echo(text)} is not supported: ivm's ALTER TABLE is {ALTER_TABLE_FORMS}")


def _target_table(tree: exp.Expression, what: str) -> str:
    table = tree.this
    if isinstance(table, exp.Schema):
        table = table.this
    if not isinstance(table, exp.Table):
        raise UnsupportedError(f"{what} target must be a table name")
    return _user_relation(table, what)


def _user_relation(table: exp.Table, what: str) -> str:
    """The name of a relation a statement changes: ``t``, ``public.t``, ``main.t`` or ``ivm.public.t``.

    Never another schema's or database's. (Without this check a write to ``information_schema.tables``
    went to a user table named ``tables``.)
    """
    schema = table.args.get("db")
    if schema is not None or table.args.get("catalog") is not None:
        shown = table.sql(DIALECT)
        if schema is not None and schema.name.lower() in SYSTEM_SCHEMAS and _in_database(table):
            raise AccessDeniedError(f"{what} of {shown} is not allowed: ivm's catalog relations are read-only "
                                    "(they are answered from its tables and views)")
        if not _in_user_schema(table):
            raise UnknownObjectError(f"relation {shown} does not exist: ivm's relations are in schema public "
                                     f"of database {DATABASE}")
    return normalize_name(table)


def _in_database(table: exp.Table) -> bool:
    catalog = table.args.get("catalog")
    return catalog is None or catalog.name.lower() == DATABASE


def _in_user_schema(table: exp.Table) -> bool:
    schema = table.args.get("db")
    return _in_database(table) and (schema is None or schema.name.lower() in USER_SCHEMAS)


def unqualified(query: exp.Expression) -> exp.Expression:
    """``query`` with user relations named without their schema and database (``ivm.public.t`` is ``t``).

    Tools qualify every name (dbt: ``"ivm"."public"."orders"``); a view's SELECT is planned and stored
    with the bare names. Other qualified names are kept, and refused where they are read.
    """
    if not any(t.args.get("db") is not None and _in_user_schema(t) for t in query.find_all(exp.Table)):
        return query
    query = query.copy()
    for table in query.find_all(exp.Table):
        if isinstance(table.this, exp.Identifier) and table.args.get("db") is not None and _in_user_schema(table):
            table.set("db", None)
            table.set("catalog", None)
    return query


def _insert(tree: exp.Insert) -> Insert:
    if tree.args.get("returning"):
        raise UnsupportedError("INSERT ... RETURNING is not supported")
    if tree.args.get("conflict"):
        raise UnsupportedError(
            "INSERT ... ON CONFLICT is not supported; use INSERT OR REPLACE to upsert by key"
        )
    alternative = (tree.args.get("alternative") or "").upper()
    if alternative and alternative != "REPLACE":
        raise UnsupportedError(f"INSERT OR {alternative} is not supported")
    columns = None
    if isinstance(tree.this, exp.Schema):
        columns = tuple(normalize_name(e) for e in tree.this.expressions)
    query = tree.expression
    if not isinstance(query, QUERY_TYPES):
        raise UnsupportedError("INSERT needs VALUES or a SELECT")
    return Insert(
        table=_target_table(tree, "INSERT"),
        columns=columns,
        query=query,
        replace=alternative == "REPLACE",
    )


def _update(tree: exp.Update) -> Update:
    if tree.args.get("from") or tree.args.get("from_"):
        raise UnsupportedError("UPDATE ... FROM is not supported")
    if tree.args.get("returning"):
        raise UnsupportedError("UPDATE ... RETURNING is not supported")
    assignments = []
    for eq in tree.expressions:
        if not isinstance(eq, exp.EQ) or not isinstance(eq.this, exp.Column):
            raise SqlSyntaxError(f"bad SET clause: {eq.sql(DIALECT)}")
        assignments.append((normalize_name(eq.this.this), eq.expression))
    where = tree.args.get("where")
    return Update(
        table=_target_table(tree, "UPDATE"),
        assignments=assignments,
        where=where.this if where is not None else None,
    )


def _delete(tree: exp.Delete) -> Delete:
    if tree.args.get("using") or tree.args.get("returning"):
        raise UnsupportedError("DELETE ... USING/RETURNING is not supported")
    where = tree.args.get("where")
    return Delete(table=_target_table(tree, "DELETE"), where=where.this if where else None)


def _set(tree: exp.Set, text: str) -> SetOption:
    items = tree.expressions
    if len(items) != 1:
        raise SqlSyntaxError("SET takes exactly one option")
    item = items[0].this if isinstance(items[0], exp.SetItem) else items[0]
    if not isinstance(item, exp.EQ):
        raise SqlSyntaxError(f"expected SET name = value, got {echo(text)}")
    name = item.this.sql(DIALECT).replace('"', "").lower()
    value = item.expression
    value_text = value.name if isinstance(value, (exp.Literal, exp.Column, exp.Identifier)) else value.sql(DIALECT)
    return SetOption(name=name, value=value_text)


def _command(tree: exp.Command, text: str) -> Statement:
    word = str(tree.this).upper()
    rest_node = tree.expression
    rest = rest_node.name if isinstance(rest_node, exp.Literal) else str(rest_node or "")
    rest = rest.strip().rstrip(";")
    if word == "EXPLAIN":
        return _explain(rest)
    if word == "SHOW":
        return _show(rest)
    if word in ("CHECKPOINT", "COMPACT"):
        if rest:
            raise UnsupportedError(f"{word} takes no arguments (it applies to the whole database)")
        return Maintenance(what=word.lower())
    if word in ("CREATE", "SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "DROP", "FROM"):
        # sqlglot falls back to a raw command when it cannot parse a statement.
        raise SqlSyntaxError(f"syntax error in: {echo(text, 80)}")
    if word == "ALTER":  # sqlglot's fallback for forms it cannot parse (several actions, ...)
        raise UnsupportedError(f"statement {echo(text)} is not supported: ivm's ALTER TABLE is {ALTER_TABLE_FORMS}, "
                               "one action per statement")
    raise UnsupportedError(f"statement {echo(text)} is not supported")


def _explain(rest: str) -> Explain:
    if not rest:
        raise SqlSyntaxError("EXPLAIN needs a view name or a statement")
    if " " not in rest.strip() and rest.strip().replace("_", "").replace('"', "").isalnum():
        return Explain(view=normalize_name(rest.strip().strip('"')))
    inner = parse_one(rest)
    if isinstance(inner, Query):
        return Explain(query=inner)
    if isinstance(inner, CreateView):
        return Explain(create=inner)
    raise UnsupportedError("EXPLAIN supports a view name, a SELECT or CREATE MATERIALIZED VIEW")


def _show(rest: str) -> Show:
    what = " ".join(rest.lower().split())
    if what == "materialized views":  # Materialize's and PostgreSQL clients' words for SHOW VIEWS
        what = "views"
    create = re.fullmatch(r"create\s+materialized\s+view\s+(\"(?:[^\"]|\"\")+\"|[\w$]+)", rest.strip(), re.IGNORECASE)
    if create:  # SHOW CREATE MATERIALIZED VIEW v: the statement that made it
        name = create.group(1)
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()
        return Show(what="create", extra={"name": name})
    if what in ("tables", "views", "sources", "status"):
        return Show(what=what)
    raise UnsupportedError(f"SHOW {rest} is not supported (try SHOW TABLES, SHOW MATERIALIZED VIEWS, SHOW SOURCES "
                           "or SHOW STATUS)")
