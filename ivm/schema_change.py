"""ALTER TABLE: a table's new definition, its rows in the new shape, and its views planned again.

    ALTER TABLE t ADD [COLUMN] c type [DEFAULT v] [NOT NULL]
    ALTER TABLE t DROP [COLUMN] c [CASCADE]
    ALTER TABLE t ALTER [COLUMN] c [SET DATA] TYPE wider_type

Semantics are PostgreSQL's where ivm can keep them:

* ADD COLUMN: existing rows get the DEFAULT (a constant, evaluated once) or
  NULL; NOT NULL needs a DEFAULT unless the table is empty.
* DROP COLUMN: refused for a primary-key column, the last column, and a
  column a materialized view reads (CASCADE drops those views instead).
* ALTER COLUMN … TYPE: only a widening (``WIDER``), whose values convert
  without loss; the same type is a no-op.

Every view that reads the table is planned again from its SQL, exactly as a
reopen plans it from the manifest (``ivm/durable/checkpoints.py`` ``view_from_json``).
A view whose plan is unchanged (the same output columns and the same
relational SQL) keeps its operator state and output: no recompute. When
its state's shape changed (say, a join state holding a widened column) it is
computed again from its sources. A view whose meaning the new column would
change (``SELECT *`` would grow, or an unqualified name would now be
ambiguous or bind to the new column) keeps its meaning the PostgreSQL way:
its SELECT is stored with every name resolved against the columns before the
change (``*`` expanded), which SHOW CREATE MATERIALIZED VIEW then shows. A
view that cannot keep its meaning makes the statement fail, naming it.

Watermarked (stream) tables are refused: their hidden twins and windows hold
the columns too.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pyarrow as pa
from sqlglot import exp

from ivm.catalog import Catalog, TableDef, ViewDef, check_name
from ivm.durable.checkpoints import describe_view, view_from_json
from sql_frontend.errors import BindError, CatalogError, IvmError, UnknownObjectError, UnsupportedError
from sql_frontend.plan import Column
from sql_frontend.plan_sql import render, to_sql
from sql_frontend.resolve import qualify
from sql_frontend.statements import DIALECT, AlterTable, parse_query

INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
INTEGER_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19}
DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def is_widening(old: str, new: str) -> bool:
    """Does every value of type ``old`` convert to ``new`` without loss (DuckDB's type names)?

    Integers to larger integers or to a DECIMAL with room for their digits,
    FLOAT to DOUBLE, DECIMAL(p, s) to one with at least as many digits on
    each side of the point.
    """
    if old in INTEGERS and new in INTEGERS:
        return INTEGERS.index(new) > INTEGERS.index(old)
    if old == "FLOAT" and new == "DOUBLE":
        return True
    target = DECIMAL.fullmatch(new)
    if target is None:
        return False
    precision, scale = int(target[1]), int(target[2])
    if old in INTEGERS:
        return precision - scale >= INTEGER_DIGITS[old]
    source = DECIMAL.fullmatch(old)
    return source is not None and scale >= int(source[2]) and precision - scale >= int(source[1]) - int(source[2])


def altered_definition(table: TableDef, stmt: AlterTable, binder, rows: int) -> TableDef | None:
    """The table's definition after ``stmt`` (None: nothing to do); a clear error when it cannot be done.

    ``rows``: how many rows the table holds (ADD COLUMN … NOT NULL without a
    DEFAULT is refused only on a table that has some).
    """
    if table.event_time is not None or table.shadow_of is not None:
        raise UnsupportedError(f"ALTER TABLE of {table.name} is not supported: it has a WATERMARK, whose windows "
                               "and on-time rows hold its columns (create a new table instead)")
    names = table.column_names
    column = stmt.column
    if stmt.action == "add":
        if column in names:
            if stmt.column_if:
                return None
            raise CatalogError(f"column {column} of table {table.name} already exists")
        check_name(column, "column")
        added = Column(column, binder.normalize_type(stmt.definition.type))
        binder.check_round_trip(added)
        default = stmt.definition.default
        if default is not None:
            if default.find(exp.Column) is not None:
                raise BindError(f"DEFAULT of column {column} must be a constant")
            binder.describe(f"SELECT CAST({default.sql(DIALECT)} AS {added.type})")
        if stmt.definition.not_null and default is None and rows:
            raise CatalogError(f"column {column} cannot be added NOT NULL without a DEFAULT: table {table.name} "
                               f"holds {rows} rows, which would have none (give it a DEFAULT, or add it without "
                               "NOT NULL)")
        defaults = dict(table.defaults)
        if default is not None:
            defaults[column] = default
        not_null = table.not_null | ({column} if stmt.definition.not_null else set())
        return replace(table, columns=table.columns + (added,), defaults=defaults, not_null=frozenset(not_null))
    if column not in names:
        if stmt.action == "drop" and stmt.column_if:
            return None
        raise UnknownObjectError(f"table {table.name} has no column {column}")
    if stmt.action == "drop":
        if column in table.primary_key:
            raise CatalogError(f"column {column} is part of the primary key of {table.name} and cannot be dropped")
        if len(names) == 1:
            raise CatalogError(f"column {column} is the only column of {table.name}; a table needs one "
                               f"(DROP TABLE {table.name} instead)")
        return replace(table, columns=tuple(c for c in table.columns if c.name != column),
                       defaults={c: d for c, d in table.defaults.items() if c != column},
                       not_null=frozenset(table.not_null - {column}))
    old_type = next(c.type for c in table.columns if c.name == column)
    new_type = binder.normalize_type(stmt.definition.type)
    if new_type == old_type:
        return None
    if not is_widening(old_type, new_type):
        raise UnsupportedError(f"column {column} of {table.name} cannot change from {old_type} to {new_type}: ivm "
                               "changes a column's type only to a wider one (a larger integer, DOUBLE from FLOAT, "
                               "a DECIMAL with more digits), whose values convert without loss")
    retyped = Column(column, new_type)
    binder.check_round_trip(retyped)
    return replace(table, columns=tuple(retyped if c.name == column else c for c in table.columns))


def altered_rows(rows: pa.Table, old: TableDef, new: TableDef, stmt: AlterTable, default: pa.Scalar | None,
                 arrow_schema: pa.Schema, consolidate) -> pa.Table:
    """The table's stored rows (with their weights) in the new shape; ``arrow_schema``: the new columns'.

    ``consolidate(rows)`` sums the weights of equal rows: dropping a column of
    a table without a key (a bag, whose rows are their own identity) can make
    rows equal.
    """
    if stmt.action == "add":
        field = arrow_schema.field(stmt.column)
        value = pa.nulls(rows.num_rows, field.type) if default is None or not default.is_valid else \
            pa.repeat(default.cast(field.type), rows.num_rows)
        return rows.append_column(field, value)
    if stmt.action == "drop":
        rows = rows.drop_columns([stmt.column])
        return rows if old.primary_key else consolidate(rows)
    index = rows.schema.get_field_index(stmt.column)
    return rows.set_column(index, arrow_schema.field(stmt.column), rows.column(index).cast(arrow_schema.field(stmt.column).type))


class BrokenView(Exception):
    """A view the change would break or change the meaning of (with why)."""


def replanned(view: ViewDef, catalog: Catalog, before: dict[str, dict[str, str]], may_pin: bool) -> ViewDef:
    """``view`` planned again over the changed catalog, meaning the same; BrokenView when it cannot.

    ``before``: the catalog's schema before the change, to pin the view's
    names to (``may_pin``: ADD COLUMN, where only a new name can change what
    a SELECT means).
    """
    try:
        again = view_from_json(describe_view(view), catalog)
        if _same(view, again):
            return _carried(view, again)
        why = "its columns would change" if again.columns != view.columns else "what it computes would change"
    except IvmError as e:
        why = _first_line(e)
    if may_pin:
        try:
            pinned = qualify(parse_query(view.sql), before).sql(DIALECT)
            again = view_from_json(describe_view(view, pinned), catalog)
        except IvmError as e:
            raise BrokenView(f"{why}, and its SELECT cannot be pinned to the columns before the change "
                             f"({_first_line(e)})") from None
        if _same(view, again):
            return _carried(view, again)
    raise BrokenView(why)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def _same(view: ViewDef, again: ViewDef) -> bool:
    return again.columns == view.columns and render(to_sql(again.plan.root)) == render(to_sql(view.plan.root))


def _carried(view: ViewDef, again: ViewDef) -> ViewDef:
    """The new plan with what the engine learned of the view (its costs: it computes the same)."""
    again.cost = view.cost
    return again
