"""Queries over ``pg_catalog`` and ``information_schema``, made to run on the rows ivm provides.

PostgreSQL clients read the system catalog with PostgreSQL's SQL (psql's
``\\d``: ``c.relname OPERATOR(pg_catalog.~) '^(big)$' COLLATE
pg_catalog.default``, ``pg_catalog.format_type(a.atttypid, a.atttypmod)``,
``'orders'::regclass``). DuckDB has its own ``pg_catalog`` and
``information_schema``, but they describe DuckDB's state (every Arrow input
and operator state registered on a cursor, none of ivm's tables), and it
lacks some of PostgreSQL's functions and syntax. ``rewrite`` turns such a
query into one DuckDB runs over ivm's relations (ivm/reads/system_relations.py):

* a table named ``pg_catalog.x`` or ``information_schema.x`` (or a bare
  ``pg_x`` that is no user relation, as PostgreSQL's search path finds it)
  becomes the registered Arrow name of ivm's relation; one ivm does not
  provide is an UnknownObjectError (DuckDB's own is never read);
* ``public.x`` and ``main.x`` are the user's ``x``; any other qualified name
  (``temp.main.__ivm_s3_rows``, ``system.main.x``) is an UnknownObjectError,
  so a query cannot reach DuckDB's other catalogs or ivm's internal inputs;
* ``OPERATOR(pg_catalog.~)`` becomes the operator, ``COLLATE
  pg_catalog.default`` goes (it is the default), ``pg_catalog.f(...)``
  becomes ``f(...)``;
* the functions in ``FUNCTIONS`` become expressions DuckDB has: each says
  why (most read PostgreSQL's catalog, and DuckDB's versions of them read
  DuckDB's);
* casts to PostgreSQL's OID alias types (``regclass``, ``regtype``) look the
  name or OID up in ivm's ``pg_class`` / ``pg_type``; ``oid`` is UINTEGER (unsigned
  4 bytes, as PostgreSQL's);
* a ``regproc`` column (``REGPROC_COLUMNS``, held as the function's name)
  compared with OID 0 is compared with ``'-'``, which is how PostgreSQL
  prints regproc 0, "no function" (ADBC's ``typreceive != 0``).

Plain queries over user relations are left as they are (``needs_rewrite``
is False and the user's own text runs).

>>> import sqlglot
>>> tree = sqlglot.parse_one("SELECT relname FROM pg_catalog.pg_class c WHERE "
...     "c.relname OPERATOR(pg_catalog.~) '^(big)$' COLLATE pg_catalog.default", read="duckdb")
>>> names = {("pg_catalog", "pg_class"): "__pg_class"}
>>> rewrite(tree, names, "__defs", lambda name: False)[0].sql("duckdb")
"SELECT relname FROM __pg_class AS c WHERE REGEXP_MATCHES(c.relname, '^(big)$')"
>>> tree = sqlglot.parse_one("SELECT oid FROM pg_catalog.pg_type WHERE typreceive != 0 OR 0 = typsend", read="postgres")
>>> rewrite(tree, {("pg_catalog", "pg_type"): "__pg_type"}, "__defs", lambda name: False)[0].sql("duckdb")
"SELECT oid FROM __pg_type AS pg_type WHERE typreceive <> '-' OR typsend = '-'"
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

from sqlglot import exp

from sql_frontend.errors import UnknownObjectError, UnsupportedError

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")
USER_SCHEMAS = ("public", "main")  # PostgreSQL's name for the one schema, and DuckDB's
# The one database's name, as information_schema's table_catalog says and as a three-part name may
# qualify a relation (dbt writes "ivm"."public"."orders"); any other is a cross-database reference.
DATABASE = "ivm"
# PostgreSQL's OIDs of its catalog relations, for ``'pg_rewrite'::regclass`` (dbt's query of which view
# depends on which relation joins pg_depend on them): ivm's pg_class lists user relations only.
CATALOG_OIDS = {"pg_class": 1259, "pg_rewrite": 2618, "pg_type": 1247, "pg_attribute": 1249, "pg_proc": 1255,
                "pg_namespace": 2615, "pg_constraint": 2606, "pg_index": 2610, "pg_depend": 2608,
                "pg_description": 2609, "pg_attrdef": 2604, "pg_am": 2601, "pg_database": 1262,
                "pg_trigger": 2620, "pg_inherits": 2611, "pg_collation": 3456}



def _binary(kind: type[exp.Expression]) -> Callable[[exp.Expression, exp.Expression], exp.Expression]:
    return lambda a, b: kind(this=a, expression=b)


def _negated(kind: type[exp.Expression]) -> Callable[[exp.Expression, exp.Expression], exp.Expression]:
    return lambda a, b: exp.not_(kind(this=a, expression=b))


# OPERATOR(pg_catalog.op): the operator's expression (PostgreSQL's ~ is a regular-expression search, as
# DuckDB's regexp_matches).
_OPERATORS = {"~": _binary(exp.RegexpLike), "!~": _negated(exp.RegexpLike), "~*": _binary(exp.RegexpILike),
              "!~*": _negated(exp.RegexpILike), "~~": _binary(exp.Like), "!~~": _negated(exp.Like),
              "~~*": _binary(exp.ILike), "!~~*": _negated(exp.ILike), "=": _binary(exp.EQ), "<>": _binary(exp.NEQ),
              "!=": _binary(exp.NEQ), "<": _binary(exp.LT), "<=": _binary(exp.LTE), ">": _binary(exp.GT),
              ">=": _binary(exp.GTE)}

# PostgreSQL's types of catalog columns, which DuckDB does not know: the DuckDB type to cast to instead.
# (The OID alias types regclass, regtype and regnamespace are looked up: ``_LOOKUPS``.) Other type names
# are left for DuckDB to judge. oid is unsigned 4 bytes, as PostgreSQL's (UINT: sqlglot's name of UINTEGER).
_TYPES = {"oid": "UINT", "text": "TEXT", "name": "TEXT", "char": "TEXT", '"char"': "TEXT", "varchar": "TEXT",
          "int2": "SMALLINT", "int4": "INTEGER", "int8": "BIGINT", "bool": "BOOLEAN", "regproc": "TEXT",
          "regrole": "TEXT", "int2vector": "SMALLINT[]", "oidvector": "UINT[]", "pg_node_tree": "TEXT"}
_LOOKUPS = {"regclass": ("pg_class", "relname"), "regtype": ("pg_type", "typname"),
            "regnamespace": ("pg_namespace", "nspname")}
# Catalog columns of type regproc (a function's OID, printed as its name): ivm holds their text.
REGPROC_COLUMNS = frozenset({"typinput", "typoutput", "typreceive", "typsend", "typmodin", "typmodout",
                             "typanalyze", "typsubscript", "amhandler", "prosupport", "rngcanonical", "rngsubdiff"})


def _null_text(_: list[exp.Expression], __: "_Rewriter") -> exp.Expression:
    return exp.cast(exp.null(), "TEXT")


def _true(_: list[exp.Expression], __: "_Rewriter") -> exp.Expression:
    return exp.true()


def _definition(args: list[exp.Expression], rewriter: "_Rewriter") -> exp.Expression:
    """The stored text of an index, constraint or view, or a type's SQL name (ivm's ``definitions`` relation)."""
    rewriter.used.add(rewriter.definitions)
    return exp.Subquery(this=exp.select("definition").from_(exp.to_identifier(rewriter.definitions))
                        .where(exp.column("oid").eq(args[0])))


def _format_type(args: list[exp.Expression], rewriter: "_Rewriter") -> exp.Expression:
    """``numeric(p,s)`` (or ``numeric(p,s)[]``) from numeric's typmod, else the type's SQL name (kept with ivm's
    definitions)."""
    oid, typmod = args[0], args[1] if len(args) > 1 else exp.null()
    scale = exp.BitwiseAnd(this=exp.Paren(this=exp.Sub(this=typmod.copy(), expression=exp.Literal.number(4))),
                           expression=exp.Literal.number(65535))
    precision = exp.BitwiseRightShift(this=exp.Paren(this=exp.Sub(this=typmod.copy(), expression=exp.Literal.number(4))),
                                      expression=exp.Literal.number(16))
    numeric = exp.DPipe(this=exp.DPipe(this=exp.DPipe(this=exp.DPipe(
        this=exp.Literal.string("numeric("), expression=exp.cast(precision, "TEXT")), expression=exp.Literal.string(",")),
        expression=exp.cast(scale, "TEXT")), expression=exp.Literal.string(")"))
    def numeric_with(type_oid: int) -> exp.Expression:
        return exp.and_(exp.EQ(this=oid.copy(), expression=exp.Literal.number(type_oid)),
                        exp.GTE(this=typmod.copy(), expression=exp.Literal.number(4)))

    array = exp.DPipe(this=numeric.copy(), expression=exp.Literal.string("[]"))  # numeric[] (1231): the element's
    return exp.Case(ifs=[exp.If(this=numeric_with(1700), true=numeric), exp.If(this=numeric_with(1231), true=array)],
                    default=_definition([oid], rewriter))


def _to_regtype(args: list[exp.Expression], rewriter: "_Rewriter") -> exp.Expression:
    return rewriter.lookup("regtype", args[0], by_name=True)


def _to_regclass(args: list[exp.Expression], rewriter: "_Rewriter") -> exp.Expression:
    return rewriter.lookup("regclass", args[0], by_name=True)


# current_setting(name) of PostgreSQL's settings clients ask for (SQLAlchemy reads default_table_access_method);
# DuckDB's answers only DuckDB's settings. Any other name is left to DuckDB's (tests/flight/test_file_access.py
# reads the lockdown settings with it).
SETTINGS = {"default_table_access_method": "heap", "server_version": "15.0", "server_version_num": "150000",
            "server_encoding": "UTF8", "client_encoding": "UTF8", "standard_conforming_strings": "on",
            "max_identifier_length": "63", "search_path": '"$user", public', "integer_datetimes": "on",
            "lc_collate": "C", "lc_ctype": "C", "jit": "off"}  # (asyncpg turns jit off before its type queries)


def _set_config(args: list[exp.Expression], _: "_Rewriter") -> exp.Expression:
    """``set_config(name, value, is_local)`` of a setting to the value it has: that value (asyncpg's
    ``set_config('jit', 'off', false)``); changing one is refused, for these settings are fixed."""
    name, value = (_literal_text(a) for a in (args + [None, None])[:2])
    if name is not None and name.lower() in SETTINGS and value == SETTINGS[name.lower()]:
        return exp.Literal.string(value)
    raise UnsupportedError(f"set_config({name!r}, {value!r}) is not supported: ivm's {name} is "
                           f"{SETTINGS.get((name or '').lower(), 'not a setting it has')!r}")


def _literal_text(node: exp.Expression | None) -> str | None:
    while isinstance(node, exp.Cast):  # a bound parameter: CAST('jit' AS VARCHAR)
        node = node.this
    return node.name if isinstance(node, exp.Literal) and node.is_string else None


def _current_setting(args: list[exp.Expression], _: "_Rewriter") -> exp.Expression:
    name = args[0] if args else None
    while isinstance(name, exp.Cast):  # a bound parameter: CAST('default_table_access_method' AS VARCHAR)
        name = name.this
    if isinstance(name, exp.Literal) and name.is_string and name.name.lower() in SETTINGS:
        return exp.Literal.string(SETTINGS[name.name.lower()])
    return exp.Anonymous(this="current_setting", expressions=args)


# PostgreSQL functions clients call on the catalog, and why each is replaced:
FUNCTIONS: dict[str, Callable[[list[exp.Expression], "_Rewriter"], exp.Expression]] = {
    # DuckDB lacks it; ivm has one role, so every object's owner is that role.
    "pg_get_userbyid": lambda args, _: exp.Literal.string("ivm"),
    # every relation ivm answers is in a schema on the search path (public or pg_catalog)
    "pg_table_is_visible": _true, "pg_type_is_visible": _true, "pg_function_is_visible": _true,
    "pg_get_function_result": _null_text, "pg_get_function_arguments": _null_text,
    "pg_get_function_identity_arguments": _null_text,
    # DuckDB's versions look up DuckDB's own types, indexes, constraints and views
    "format_type": _format_type,
    "pg_get_indexdef": _definition, "pg_get_constraintdef": _definition, "pg_get_viewdef": _definition,
    # ivm stores the expression's text where PostgreSQL stores a node tree
    "pg_get_expr": lambda args, _: args[0],
    # no comments on anything; DuckDB lacks shobj_description
    "obj_description": _null_text, "col_description": _null_text, "shobj_description": _null_text,
    # DuckDB lacks these: ivm's only encoding is UTF8; no column has a sequence behind it
    "pg_encoding_to_char": lambda args, _: exp.Literal.string("UTF8"),
    "pg_get_serial_sequence": _null_text,
    # DuckDB lacks it; ivm has no extended statistics objects (pg_statistic_ext is empty)
    "pg_get_statisticsobjdef_columns": _null_text,
    # DuckDB lacks it; ivm publishes nothing for logical replication
    "pg_relation_is_publishable": lambda args, _: exp.false(),
    "current_setting": _current_setting, "set_config": _set_config,
    # DuckDB lacks them; sizes by OID are not known here (SHOW STATUS has each relation's stored_bytes)
    "pg_table_size": lambda args, _: exp.cast(exp.null(), "BIGINT"),
    "pg_relation_size": lambda args, _: exp.cast(exp.null(), "BIGINT"),
    "pg_total_relation_size": lambda args, _: exp.cast(exp.null(), "BIGINT"),
    "pg_indexes_size": lambda args, _: exp.cast(exp.null(), "BIGINT"),
    # DuckDB's name for it (SQLAlchemy's column reflection builds identity options with it)
    "json_build_object": lambda args, _: exp.Anonymous(this="json_object", expressions=args),
    # DuckDB lacks array_upper: an array's upper bound is its length (PostgreSQL's arrays here start at 1)
    "array_upper": lambda args, _: exp.Anonymous(this="array_length", expressions=args[:1]),
    # DuckDB lacks them: the OID of a type or relation by name, or NULL
    "to_regtype": _to_regtype, "to_regclass": _to_regclass,
}


def needs_rewrite(tree: exp.Expression, system_names: frozenset[str]) -> bool:
    """Whether ``tree`` reads a system relation, names a schema, or uses PostgreSQL-only syntax.

    ``system_names``: bare names of the pg_catalog relations (a bare
    ``pg_class`` is PostgreSQL's, unless a user relation has that name).
    """
    for node in tree.walk():
        if isinstance(node, exp.Table):
            if node.args.get("db") or node.args.get("catalog") or (
                    isinstance(node.this, exp.Identifier) and node.name.lower() in system_names):
                return True
        elif isinstance(node, (exp.Operator, exp.CurrentSchema, exp.CurrentSchemas)):
            return True
        elif isinstance(node, exp.Collate) and _is_default_collation(node.expression):
            return True
        elif isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
                and node.this.name.lower() == "pg_catalog":
            return True
        elif isinstance(node, exp.Anonymous) and node.name.lower() in FUNCTIONS:
            return True
        elif isinstance(node, exp.DataType) and node.this == exp.DataType.Type.USERDEFINED \
                and (_type_name(node) in _TYPES or _type_name(node) in _LOOKUPS):
            return True
    return False


def rewrite(tree: exp.Expression, names: Mapping[tuple[str, str], str], definitions: str,
            is_user: Callable[[str], bool]) -> tuple[exp.Expression, set[str]]:
    """``tree`` over the registered relations ``names`` ((schema, name) -> registered name).

    Returns the new tree and the registered names it reads. ``definitions``
    is the registered name of ivm's definition texts; ``is_user(name)``
    says whether a bare name is a user relation (which wins over a
    pg_catalog relation of the same name).
    """
    rewriter = _Rewriter(names, definitions, is_user)
    return rewriter.run(tree.copy()), rewriter.used


class _Rewriter:
    def __init__(self, names: Mapping[tuple[str, str], str], definitions: str, is_user: Callable[[str], bool]):
        self.names = names
        self.definitions = definitions
        self.is_user = is_user
        self.bare = {name: key for key in names for name in [key[1]] if key[0] == "pg_catalog"}
        self.used: set[str] = set()

    def run(self, tree: exp.Expression) -> exp.Expression:
        return tree.transform(self._node, copy=False)

    def registered(self, schema: str, name: str) -> exp.Expression:
        registered = self.names.get((schema, name))
        if registered is None:
            raise UnknownObjectError(f"relation {schema}.{name} does not exist (ivm answers the {schema} relations "
                                     "that clients read to describe its tables and views)")
        self.used.add(registered)
        return exp.to_identifier(registered)

    def _node(self, node: exp.Expression) -> exp.Expression:
        new = self._replace(node)
        if new is not node and isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
            return exp.alias_(new, _output_name(node))  # the column's name is PostgreSQL's, not DuckDB's rendering
        return new

    def _replace(self, node: exp.Expression) -> exp.Expression:
        # A node replaced here is not walked again by ``transform``: its parts are rewritten (``run``) first.
        if isinstance(node, exp.Table):
            return self._table(node)
        if isinstance(node, exp.Column) and node.args.get("db") is not None:
            if node.args["db"].name.lower() in SYSTEM_SCHEMAS + USER_SCHEMAS and node.args.get("catalog") is None:
                node.set("db", None)  # pg_catalog.pg_class.relname: pg_class is the relation's name or alias
            return node
        if isinstance(node, exp.Operator):
            return self._operator(node)
        if isinstance(node, (exp.EQ, exp.NEQ)) and _regproc_and_zero(node) is not None:
            return type(node)(this=self.run(_regproc_and_zero(node)), expression=exp.Literal.string("-"))
        if isinstance(node, (exp.Like, exp.ILike)) and not isinstance(node.parent, exp.Escape) \
                and isinstance(node.expression, exp.Literal) and "\\" in node.expression.name:
            # PostgreSQL's LIKE escapes with a backslash unless told otherwise, DuckDB's with nothing: dbt's
            # ``nspname not like 'pg\_%'`` leaves pg_catalog out in PostgreSQL, and must here too
            like = node.copy()  # (its args include NOT LIKE's negate)
            like.set("this", self.run(node.this))
            return exp.Escape(this=like, expression=exp.Literal.string("\\"))
        if isinstance(node, exp.Collate) and _is_default_collation(node.expression):
            return self.run(node.this)
        if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
                and node.this.name.lower() == "pg_catalog" and isinstance(node.expression, exp.Func):
            return self.run(node.expression)
        if isinstance(node, exp.Anonymous) and node.name.lower() in FUNCTIONS:
            return FUNCTIONS[node.name.lower()]([self.run(e) for e in node.expressions], self)
        if isinstance(node, exp.CurrentSchema):
            return exp.Literal.string("public")  # PostgreSQL's name for ivm's one schema
        if isinstance(node, exp.CurrentSchemas):
            return exp.Array(expressions=[exp.Literal.string("pg_catalog"), exp.Literal.string("public")])
        if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.USERDEFINED:
            return self._cast(node)
        if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.USERDEFINED:
            return self._data_type(node)
        return node

    def _table(self, table: exp.Table) -> exp.Expression:
        if not isinstance(table.this, exp.Identifier):  # a table function: pg_catalog.generate_series(...)
            if table.args.get("db") is not None and table.args["db"].name.lower() == "pg_catalog":
                table.set("db", None)
            return table
        name = table.name.lower()
        schema = table.args.get("db")
        catalog = table.args.get("catalog")
        if schema is None:
            if name in self.bare and not self.is_user(name):
                if not table.alias:
                    table.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
                table.set("this", self.registered("pg_catalog", name))
            return table
        schema_name = schema.name.lower()
        if (catalog is not None and catalog.name.lower() != DATABASE) or schema_name not in SYSTEM_SCHEMAS + USER_SCHEMAS:
            shown = table.sql("postgres").split(" ")[0]
            raise UnknownObjectError(f"relation {shown} does not exist: ivm's relations are in schema public, "
                                     "its catalog in pg_catalog and information_schema")
        table.set("db", None)
        table.set("catalog", None)
        if schema_name in SYSTEM_SCHEMAS:
            if not table.alias:  # columns may name it as pg_catalog.pg_class.relname (SQLAlchemy does)
                table.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
            table.set("this", self.registered(schema_name, name))
        return table

    def _operator(self, node: exp.Operator) -> exp.Expression:
        symbol = str(node.args.get("operator") or "").strip()
        symbol = symbol.split(".", 1)[1] if symbol.lower().startswith("pg_catalog.") else symbol
        make = _OPERATORS.get(symbol)
        if make is None:
            raise UnknownObjectError(f"operator {symbol} does not exist")
        return make(self.run(node.this), self.run(node.expression))

    def _cast(self, cast: exp.Cast) -> exp.Expression:
        kind = _type_name(cast.to)
        value = self.run(cast.this)
        if kind in _TYPES:
            return exp.cast(value, _TYPES[kind])
        if kind not in _LOOKUPS:
            cast.set("this", value)
            return cast  # DuckDB judges the type
        return self.lookup(kind, value, by_name=isinstance(value, exp.Literal) and value.is_string)

    @staticmethod
    def _data_type(data_type: exp.DataType) -> exp.Expression:
        target = _TYPES.get(_type_name(data_type))
        return exp.DataType.build(target) if target else data_type  # (DuckDB judges the others)

    def lookup(self, kind: str, value: exp.Expression, by_name: bool) -> exp.Expression:
        """A name's OID (``'orders'::regclass``) or an OID's name (``c.oid::regclass``), NULL if none."""
        relation, column = _LOOKUPS[kind]
        if kind == "regclass" and by_name and isinstance(value, exp.Literal):
            name = value.name.lower().removeprefix("pg_catalog.")
            if name in CATALOG_OIDS and not self.is_user(name):
                return exp.Literal.number(CATALOG_OIDS[name])
        source = self.registered("pg_catalog", relation)
        if by_name:
            name = _last_name(value.name) if isinstance(value, exp.Literal) else value
            found = exp.select("oid").from_(source).where(exp.column(column).eq(name))
        else:
            found = exp.select(column).from_(source).where(exp.column("oid").eq(value))
        return exp.Subquery(this=found.limit(1))


def _last_name(text: str) -> str:
    """The relation's own name in a qualified one: ``t`` of ``public.t`` and of ``"public" . "t"`` (ADBC's).

    >>> _last_name('"public" . "a""b"'), _last_name("public.t"), _last_name("t")
    ('a"b', 't', 't')
    """
    parts = re.findall(r'"((?:[^"]|"")*)"|([^\s."]+)', text)
    if not parts:
        return text
    quoted, bare = parts[-1]
    return bare or quoted.replace('""', '"')


def _regproc_and_zero(node: exp.Binary) -> exp.Column | None:
    """The regproc column of ``column = 0`` or ``0 <> column``, else None."""
    for column, other in ((node.this, node.expression), (node.expression, node.this)):
        if isinstance(column, exp.Column) and column.name.lower() in REGPROC_COLUMNS \
                and isinstance(other, exp.Literal) and not other.is_string and other.name == "0":
            return column
    return None


def _output_name(node: exp.Expression) -> str:
    """PostgreSQL's name of an unnamed result column: the function's, or the cast's type's."""
    if isinstance(node, exp.Dot):
        node = node.expression
    if isinstance(node, exp.Cast):
        kind = node.to.args.get("kind")
        return str(kind.name if isinstance(kind, exp.Expression) else kind).split(".")[-1].strip('"').lower()
    if isinstance(node, exp.CurrentSchema):
        return "current_schema"
    if isinstance(node, exp.CurrentSchemas):
        return "current_schemas"
    if isinstance(node, exp.Func):
        return node.name.lower() if isinstance(node, exp.Anonymous) else node.sql_name().lower()
    return node.alias_or_name or "?column?"


def _type_name(data_type: exp.DataType) -> str:
    """``regclass`` of ``pg_catalog.regclass``."""
    kind = data_type.args.get("kind")
    kind = str(kind.name if isinstance(kind, exp.Expression) else kind).lower()
    return kind.split(".", 1)[1] if kind.startswith("pg_catalog.") else kind


def _is_default_collation(collation: exp.Expression) -> bool:
    return isinstance(collation, exp.Column) and collation.name.lower() == "default"
