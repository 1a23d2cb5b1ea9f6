"""``pg_catalog`` and ``information_schema``: what they hold, built from ivm's catalog.

PostgreSQL clients learn what a database holds by reading these relations
(psql's ``\\d``, SQLAlchemy's inspector, BI tools, ``information_schema``
over Flight SQL). DuckDB has its own versions of them, but they describe
DuckDB's state: every Arrow input a cursor registered (``__ivm_s37_rows``,
``__scan__…``, operator state) and none of ivm's tables. So ivm answers
them itself: this module turns the catalog into Arrow tables with
PostgreSQL's column names and types, listing exactly the user's tables
(relkind ``r``), materialized views (``m``) and each table's primary key
(an index ``<table>_pkey`` and a constraint of the same name), never a
hidden twin of a watermarked table nor any state. They are rebuilt when the
catalog's version changes and are read-only: a read registers them on its
cursor as Arrow data, like a snapshot's relations (ivm/reads/reads.py), and
sql_frontend/system_queries.py points the query's names at them.

Types are PostgreSQL's built-in ones with their OIDs, matching what the
PostgreSQL door sends for each Arrow type (flight_server/pgwire/types.py):
BIGINT is int8, UINTEGER is oid (PostgreSQL's unsigned 4-byte type, as the
catalog's own OID columns are), DECIMAL(12,2) is numeric with typmod for
(12,2), VARCHAR is text, a list of one of these is its array type (int4[]
is ``_int4``, OID 1007); lists of lists, structs and maps are text, as they
are sent.

Relations PostgreSQL has and ivm has nothing for (triggers, policies,
inheritance, publications…) are present and empty, so the queries that look
for them (psql's ``\\d t`` footers) find no rows instead of failing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from sqlglot import exp

from ivm.reads.point_reads import per_tree
from sql_frontend.system_queries import DATABASE, needs_rewrite, rewrite

if TYPE_CHECKING:
    from ivm.catalog import Catalog

SCHEMA = "public"  # the one schema of user relations, as PostgreSQL clients expect it
OWNER = "ivm"
PG_CATALOG, PUBLIC, INFORMATION_SCHEMA = 11, 2200, 13000  # pg_namespace OIDs (PostgreSQL's for the first two)
HEAP, BTREE = 2, 403  # pg_am OIDs
PG_CLASS, PG_REWRITE = 1259, 2618  # pg_depend's classid/refclassid: PostgreSQL's OIDs of these catalogs


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str  # pg_type.typname
    sql_name: str  # format_type's name ("bigint"), and information_schema's data_type
    length: int  # typlen (-1: variable)
    category: str
    element: int = 0  # typelem of an array type


TYPES = (
    PgType(16, "bool", "boolean", 1, "B"),
    PgType(17, "bytea", "bytea", -1, "U"),
    PgType(20, "int8", "bigint", 8, "N"),
    PgType(21, "int2", "smallint", 2, "N"),
    PgType(23, "int4", "integer", 4, "N"),
    PgType(25, "text", "text", -1, "S"),
    PgType(26, "oid", "oid", 4, "N"),
    PgType(700, "float4", "real", 4, "N"),
    PgType(701, "float8", "double precision", 8, "N"),
    PgType(1082, "date", "date", 4, "D"),
    PgType(1083, "time", "time without time zone", 8, "D"),
    PgType(1114, "timestamp", "timestamp without time zone", 8, "D"),
    PgType(1184, "timestamptz", "timestamp with time zone", 8, "D"),
    PgType(1186, "interval", "interval", 16, "T"),
    PgType(1700, "numeric", "numeric", -1, "N"),
)
# Each type's array type (pg_type.typarray), as the PostgreSQL door sends a list column of that element type
# (flight_server/pgwire/types.py's ARRAYS; tests/reads/test_system_catalog.py checks they agree).
ARRAY_TYPES = {16: 1000, 17: 1001, 21: 1005, 23: 1007, 25: 1009, 20: 1016, 26: 1028, 700: 1021, 701: 1022, 1114: 1115,
               1082: 1182, 1083: 1183, 1184: 1185, 1186: 1187, 1700: 1231}
TYPES += tuple(PgType(array, "_" + t.name, t.sql_name + "[]", -1, "A", t.oid)
               for t in TYPES for array in [ARRAY_TYPES[t.oid]])
TYPE_BY_OID = {t.oid: t for t in TYPES}
NUMERIC = 1700

# pg_type's regproc columns: each type's I/O functions by PostgreSQL's names (ADBC's PostgreSQL driver maps
# types by typreceive, so these must be the real ones). ivm has no pg_proc rows to point at, so the columns
# hold the names as regproc prints them, and '-' (regproc 0) where PostgreSQL's type has no such function;
# sql_frontend/system_queries.py reads ``typreceive != 0`` as ``typreceive != '-'``.
_IO_STEMS = {16: "bool", 17: "bytea", 20: "int8", 21: "int2", 23: "int4", 25: "text", 26: "oid", 700: "float4",
             701: "float8", 1082: "date_", 1083: "time_", 1114: "timestamp_", 1184: "timestamptz_",
             1186: "interval_", 1700: "numeric_"}
_TYPMOD = {1083: "time", 1114: "timestamp", 1184: "timestamptz", 1186: "interval", 1700: "numeric"}


def io_functions(t: PgType) -> dict[str, str]:
    """pg_type's typinput ... typanalyze of ``t``, as PostgreSQL 15's catalog has them.

    >>> io_functions(TYPE_BY_OID[23])["typreceive"], io_functions(TYPE_BY_OID[1231])["typmodin"]
    ('int4recv', 'numerictypmodin')
    """
    element = t.element or t.oid
    stem = "array_" if t.element else _IO_STEMS[t.oid]
    typmod = _TYPMOD.get(element)
    return {"typinput": stem + "in", "typoutput": stem + "out", "typreceive": stem + "recv", "typsend": stem + "send",
            "typmodin": f"{typmod}typmodin" if typmod else "-", "typmodout": f"{typmod}typmodout" if typmod else "-",
            "typanalyze": "array_typanalyze" if t.element else "-",
            "typsubscript": "array_subscript_handler" if t.element else "-"}

# DuckDB type SQL (as the catalog stores it) -> PostgreSQL type OID; anything else is text (see the docstring).
_DUCKDB_TYPES = {
    "BOOLEAN": 16, "BLOB": 17, "TINYINT": 21, "SMALLINT": 21, "UTINYINT": 21, "INTEGER": 23, "USMALLINT": 23,
    "BIGINT": 20, "UINTEGER": 26, "UBIGINT": NUMERIC, "HUGEINT": NUMERIC, "UHUGEINT": NUMERIC, "FLOAT": 700,
    "DOUBLE": 701, "DATE": 1082, "TIME": 1083, "TIMESTAMP": 1114, "TIMESTAMP_S": 1114, "TIMESTAMP_MS": 1114,
    "TIMESTAMP_NS": 1114, "TIMESTAMP WITH TIME ZONE": 1184, "INTERVAL": 1186, "VARCHAR": 25,
}
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def pg_type(duckdb_type: str) -> tuple[int, int]:
    """(type OID, typmod) of a column of this DuckDB type; typmod -1 when it has none.

    >>> pg_type("BIGINT"), pg_type("DECIMAL(12,2)"), pg_type("INTEGER[]"), pg_type("INTEGER[][]")
    ((20, -1), (1700, 786438), (1007, -1), (25, -1))
    """
    if duckdb_type.endswith("[]"):  # a list: an array of its element's type (typmod: the element's), else text
        element, typmod = pg_type(duckdb_type[:-2])
        if element in ARRAY_TYPES and (element != 25 or duckdb_type[:-2] == "VARCHAR"):
            return ARRAY_TYPES[element], typmod
        return 25, -1
    decimal = _DECIMAL.fullmatch(duckdb_type)
    if decimal:
        return NUMERIC, (int(decimal[1]) << 16 | int(decimal[2])) + 4  # PostgreSQL's numeric typmod
    return _DUCKDB_TYPES.get(duckdb_type, 25), -1


def format_type(oid: int, typmod: int) -> str | None:
    """PostgreSQL's ``format_type``: ``numeric(12,2)``, ``bigint``…

    >>> format_type(1700, 786438), format_type(20, -1)
    ('numeric(12,2)', 'bigint')
    """
    found = TYPE_BY_OID.get(oid)
    if found is None:
        return None
    if found.element:
        return format_type(found.element, typmod) + "[]"
    if oid == NUMERIC and typmod >= 4:
        return f"numeric({(typmod - 4) >> 16},{(typmod - 4) & 0xFFFF})"
    return found.sql_name


# --- the relations' columns (PostgreSQL 15's, in its order) ------------------------------------------
_ARROW = {"oid": pa.uint32(), "int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "text": pa.string(),
          "bool": pa.bool_(), "float4": pa.float32(), "text[]": pa.list_(pa.string()),
          "int2[]": pa.list_(pa.int16()), "oid[]": pa.list_(pa.uint32())}


def _schema(columns: str) -> pa.Schema:
    fields = []
    for column in columns.split(","):
        name, kind = column.split()
        fields.append(pa.field(name, _ARROW[kind]))
    return pa.schema(fields)


PG_CATALOG_COLUMNS = {
    "pg_namespace": "oid oid, nspname text, nspowner oid, nspacl text[]",
    "pg_class": "oid oid, relname text, relnamespace oid, reltype oid, reloftype oid, relowner oid, relam oid, "
                "relfilenode oid, reltablespace oid, relpages int4, reltuples float4, relallvisible int4, "
                "reltoastrelid oid, relhasindex bool, relisshared bool, relpersistence text, relkind text, "
                "relnatts int2, relchecks int2, relhasrules bool, relhastriggers bool, relhassubclass bool, "
                "relrowsecurity bool, relforcerowsecurity bool, relispopulated bool, relreplident text, "
                "relispartition bool, relrewrite oid, relfrozenxid int8, relminmxid int8, relacl text[], "
                "reloptions text[], relpartbound text",
    "pg_attribute": "attrelid oid, attname text, atttypid oid, attstattarget int4, attlen int2, attnum int2, "
                    "attndims int4, attcacheoff int4, atttypmod int4, attbyval bool, attalign text, "
                    "attstorage text, attcompression text, attnotnull bool, atthasdef bool, atthasmissing bool, "
                    "attidentity text, attgenerated text, attisdropped bool, attislocal bool, attinhcount int4, "
                    "attcollation oid, attacl text[], attoptions text[], attfdwoptions text[], attmissingval text",
    "pg_type": "oid oid, typname text, typnamespace oid, typowner oid, typlen int2, typbyval bool, typtype text, "
               "typcategory text, typispreferred bool, typisdefined bool, typdelim text, typrelid oid, "
               "typsubscript text, typelem oid, typarray oid, typinput text, typoutput text, typreceive text, "
               "typsend text, typmodin text, typmodout text, typanalyze text, typalign text, typstorage text, "
               "typnotnull bool, typbasetype oid, typtypmod int4, typndims int4, typcollation oid, "
               "typdefaultbin text, typdefault text, typacl text[]",
    "pg_index": "indexrelid oid, indrelid oid, indnatts int2, indnkeyatts int2, indisunique bool, "
                "indnullsnotdistinct bool, indisprimary bool, indisexclusion bool, indimmediate bool, "
                "indisclustered bool, indisvalid bool, indcheckxmin bool, indisready bool, indislive bool, "
                "indisreplident bool, indkey int2[], indcollation oid[], indclass oid[], indoption int2[], "
                "indexprs text, indpred text",
    "pg_constraint": "oid oid, conname text, connamespace oid, contype text, condeferrable bool, condeferred bool, "
                     "convalidated bool, conrelid oid, contypid oid, conindid oid, conparentid oid, confrelid oid, "
                     "confupdtype text, confdeltype text, confmatchtype text, conislocal bool, coninhcount int4, "
                     "connoinherit bool, conkey int2[], confkey int2[], conpfeqop oid[], conppeqop oid[], "
                     "conffeqop oid[], confdelsetcols int2[], conexclop oid[], conbin text",
    "pg_attrdef": "oid oid, adrelid oid, adnum int2, adbin text",
    "pg_description": "objoid oid, classoid oid, objsubid int4, description text",
    "pg_am": "oid oid, amname text, amhandler text, amtype text",
    "pg_database": "oid oid, datname text, datdba oid, encoding int4, datlocprovider text, datistemplate bool, "
                   "datallowconn bool, datconnlimit int4, datfrozenxid int8, datminmxid int8, dattablespace oid, "
                   "datcollate text, datctype text, daticulocale text, datcollversion text, datacl text[]",
    "pg_roles": "oid oid, rolname text, rolsuper bool, rolinherit bool, rolcreaterole bool, rolcreatedb bool, "
                "rolcanlogin bool, rolreplication bool, rolconnlimit int4, rolpassword text, rolvaliduntil text, "
                "rolbypassrls bool",
    "pg_auth_members": "roleid oid, member oid, grantor oid, admin_option bool",
    # ivm has no user-defined functions: empty, so psql's \\df lists none instead of failing
    "pg_proc": "oid oid, proname text, pronamespace oid, proowner oid, prolang oid, procost float4, "
               "prorows float4, provariadic oid, prosupport text, prokind text, prosecdef bool, "
               "proleakproof bool, proisstrict bool, proretset bool, provolatile text, proparallel text, "
               "pronargs int2, pronargdefaults int2, prorettype oid, proargtypes oid[], proallargtypes oid[], "
               "proargmodes text[], proargnames text[], proargdefaults text, protrftypes oid[], prosrc text, "
               "probin text, prosqlbody text, proconfig text[], proacl text[]",
    "pg_collation": "oid oid, collname text, collnamespace oid, collowner oid, collprovider text, "
                    "collisdeterministic bool, collencoding int4, collcollate text, collctype text, "
                    "colliculocale text, collversion text",
    "pg_opclass": "oid oid, opcmethod oid, opcname text, opcnamespace oid, opcowner oid, opcfamily oid, "
                  "opcintype oid, opcdefault bool, opckeytype oid",
    "pg_inherits": "inhrelid oid, inhparent oid, inhseqno int4, inhdetachpending bool",
    "pg_trigger": "oid oid, tgrelid oid, tgparentid oid, tgname text, tgfoid oid, tgtype int2, tgenabled text, "
                  "tgisinternal bool, tgconstrrelid oid, tgconstrindid oid, tgconstraint oid, tgdeferrable bool, "
                  "tginitdeferred bool, tgnargs int2, tgattr int2[], tgargs text, tgqual text, tgoldtable text, "
                  "tgnewtable text",
    "pg_policy": "oid oid, polname text, polrelid oid, polcmd text, polpermissive bool, polroles oid[], "
                 "polqual text, polwithcheck text",
    "pg_rewrite": "oid oid, rulename text, ev_class oid, ev_type text, ev_enabled text, is_instead bool, "
                  "ev_qual text, ev_action text",
    "pg_statistic_ext": "oid oid, stxrelid oid, stxname text, stxnamespace oid, stxowner oid, stxstattarget int4, "
                        "stxkeys int2[], stxkind text[], stxexprs text",
    "pg_publication": "oid oid, pubname text, pubowner oid, puballtables bool, pubinsert bool, pubupdate bool, "
                      "pubdelete bool, pubtruncate bool, pubviaroot bool",
    "pg_publication_rel": "oid oid, prpubid oid, prrelid oid, prqual text, prattrs int2[]",
    "pg_publication_namespace": "oid oid, pnpubid oid, pnnspid oid",
    "pg_partitioned_table": "partrelid oid, partstrat text, partnatts int2, partdefid oid, partattrs int2[], "
                            "partclass oid[], partcollation oid[], partexprs text",
    "pg_foreign_table": "ftrelid oid, ftserver oid, ftoptions text[]",
    "pg_sequence": "seqrelid oid, seqtypid oid, seqstart int8, seqincrement int8, seqmax int8, seqmin int8, "
                   "seqcache int8, seqcycle bool",
    "pg_depend": "classid oid, objid oid, objsubid int4, refclassid oid, refobjid oid, refobjsubid int4, "
                 "deptype text",
    "pg_tablespace": "oid oid, spcname text, spcowner oid, spcacl text[], spcoptions text[]",
    "pg_enum": "oid oid, enumtypid oid, enumsortorder float4, enumlabel text",
    "pg_range": "rngtypid oid, rngsubtype oid, rngmultitypid oid, rngcollation oid, rngsubopc oid, "
                "rngcanonical text, rngsubdiff text",
    "pg_tables": "schemaname text, tablename text, tableowner text, tablespace text, hasindexes bool, "
                 "hasrules bool, hastriggers bool, rowsecurity bool",
    "pg_views": "schemaname text, viewname text, viewowner text, definition text",
    "pg_matviews": "schemaname text, matviewname text, matviewowner text, tablespace text, hasindexes bool, "
                   "ispopulated bool, definition text",
    "pg_indexes": "schemaname text, tablename text, indexname text, tablespace text, indexdef text",
}
INFORMATION_SCHEMA_COLUMNS = {
    "schemata": "catalog_name text, schema_name text, schema_owner text, default_character_set_catalog text, "
                "default_character_set_schema text, default_character_set_name text, sql_path text",
    "tables": "table_catalog text, table_schema text, table_name text, table_type text, "
              "self_referencing_column_name text, reference_generation text, user_defined_type_catalog text, "
              "user_defined_type_schema text, user_defined_type_name text, is_insertable_into text, "
              "is_typed text, commit_action text",
    "columns": "table_catalog text, table_schema text, table_name text, column_name text, ordinal_position int4, "
               "column_default text, is_nullable text, data_type text, character_maximum_length int4, "
               "character_octet_length int4, numeric_precision int4, numeric_precision_radix int4, "
               "numeric_scale int4, datetime_precision int4, interval_type text, interval_precision int4, "
               "udt_catalog text, udt_schema text, udt_name text, is_identity text, is_generated text, "
               "generation_expression text, is_updatable text",
    "views": "table_catalog text, table_schema text, table_name text, view_definition text, check_option text, "
             "is_updatable text, is_insertable_into text, is_trigger_updatable text, "
             "is_trigger_deletable text, is_trigger_insertable_into text",
    "table_constraints": "constraint_catalog text, constraint_schema text, constraint_name text, "
                         "table_catalog text, table_schema text, table_name text, constraint_type text, "
                         "is_deferrable text, initially_deferred text, enforced text, nulls_distinct text",
    "key_column_usage": "constraint_catalog text, constraint_schema text, constraint_name text, "
                        "table_catalog text, table_schema text, table_name text, column_name text, "
                        "ordinal_position int4, position_in_unique_constraint int4",
}
# ivm's own: the text of pg_get_indexdef, pg_get_constraintdef and pg_get_viewdef by object OID, and
# format_type's name of each type by type OID (no user object's OID is below ivm/catalog.py's FIRST_OID).
DEFINITIONS_COLUMNS = "oid oid, definition text"

SCHEMAS = {"pg_catalog": {n: _schema(c) for n, c in PG_CATALOG_COLUMNS.items()},
           "information_schema": {n: _schema(c) for n, c in INFORMATION_SCHEMA_COLUMNS.items()}}
DEFINITIONS = ("ivm", "definitions")


def provided() -> frozenset[tuple[str, str]]:
    """(schema, name) of every relation answered here."""
    return frozenset((schema, name) for schema, names in SCHEMAS.items() for name in names)


PREFIX = "__ivm_system_"  # registered names: a bare name no user relation can have (ivm/reads/reads.py refuses it)
_BARE = frozenset(name for (schema, name) in provided() if schema == "pg_catalog")


def registered_name(schema: str, name: str) -> str:
    return f"{PREFIX}{schema}_{name}"


def reads_system(expression: exp.Expression) -> bool:
    """Whether a query reads the system catalog or needs PostgreSQL's syntax lowered (computed once per tree)."""
    return per_tree(expression, "ivm.reads_system", lambda tree: needs_rewrite(tree, _BARE))


class SystemRelations:
    """The relations of one catalog version, built on first use and kept until the catalog changes."""

    def __init__(self, catalog: "Catalog"):
        self.catalog = catalog
        self._built: tuple[int, dict[tuple[str, str], pa.Table]] | None = None
        self._names = {key: registered_name(*key) for key in provided()}

    def prepare(self, expression: exp.Expression) -> tuple[exp.Expression, dict[str, pa.Table]]:
        """The query over the registered relations (sql_frontend/system_queries.py), and what to register."""
        tables = self.tables()
        tree, used = rewrite(expression, self._names, registered_name(*DEFINITIONS), self.catalog.exists)
        by_name = {registered_name(*key): table for key, table in tables.items()}  # (DEFINITIONS too)
        return tree, {name: by_name[name] for name in used}

    def tables(self) -> dict[tuple[str, str], pa.Table]:
        """Every relation, keyed by (schema, name); ``DEFINITIONS`` holds ivm's definition texts."""
        built = self._built
        version = self.catalog.version
        if built is None or built[0] != version:
            built = self._built = (version, _Builder(self.catalog).build())
        return built[1]


class _Builder:
    """One pass over the catalog, filling each relation's rows (lists of dicts)."""

    def __init__(self, catalog: "Catalog"):
        self.catalog = catalog
        self.rows: dict[tuple[str, str], list[dict]] = {key: [] for key in provided()}
        self.rows[DEFINITIONS] = []

    def add(self, schema: str, name: str, **row) -> None:
        self.rows[(schema, name)].append(row)

    def build(self) -> dict[tuple[str, str], pa.Table]:
        self._fixed()
        definitions = sorted(self.catalog.visible_tables() + list(self.catalog.views.values()), key=lambda d: d.name)
        oids = self.catalog.oids  # each relation's, kept for its life (ivm/catalog.py)
        for definition in definitions:
            self._relation(definition, oids[definition.name])
        for definition in definitions:
            if definition.kind != "table":
                self._rule(definition, oids)
        out = {}
        for key, rows in self.rows.items():
            schema = _schema(DEFINITIONS_COLUMNS) if key == DEFINITIONS else SCHEMAS[key[0]][key[1]]
            out[key] = pa.Table.from_pylist(rows, schema=schema)
        return out

    def _fixed(self) -> None:
        for oid, name in ((PG_CATALOG, "pg_catalog"), (PUBLIC, SCHEMA), (INFORMATION_SCHEMA, "information_schema")):
            self.add("pg_catalog", "pg_namespace", oid=oid, nspname=name, nspowner=10)
            self.add("information_schema", "schemata", catalog_name=DATABASE, schema_name=name, schema_owner=OWNER)
        for t in TYPES:
            self.add("pg_catalog", "pg_type", oid=t.oid, typname=t.name, typnamespace=PG_CATALOG, typowner=10,
                     typlen=t.length, typbyval=0 < t.length <= 8, typtype="b", typcategory=t.category,
                     typispreferred=False, typisdefined=True, typdelim=",", typrelid=0, typelem=t.element,
                     typarray=ARRAY_TYPES.get(t.oid, 0),
                     typalign="d" if t.length in (8, 16) else "i", typstorage="p" if t.length > 0 else "x",
                     typnotnull=False, typbasetype=0, typtypmod=-1, typndims=0,
                     typcollation=100 if t.oid == 25 else 0, **io_functions(t))
            self.add("ivm", "definitions", oid=t.oid, definition=t.sql_name)  # format_type's text
        self.add("pg_catalog", "pg_am", oid=HEAP, amname="heap", amhandler="heap_tableam_handler", amtype="t")
        self.add("pg_catalog", "pg_am", oid=BTREE, amname="btree", amhandler="bthandler", amtype="i")
        self.add("pg_catalog", "pg_database", oid=1, datname=DATABASE, datdba=10, encoding=6, datlocprovider="c",
                 datistemplate=False, datallowconn=True, datconnlimit=-1, dattablespace=1663, datcollate="C",
                 datctype="C")
        self.add("pg_catalog", "pg_roles", oid=10, rolname=OWNER, rolsuper=True, rolinherit=True,
                 rolcreaterole=True, rolcreatedb=True, rolcanlogin=True, rolreplication=False, rolconnlimit=-1,
                 rolbypassrls=True)
        self.add("pg_catalog", "pg_collation", oid=100, collname="default", collnamespace=PG_CATALOG,
                 collowner=10, collprovider="d", collisdeterministic=True, collencoding=-1)

    def _relation(self, definition, oid: int) -> None:
        is_table = definition.kind == "table"
        key = definition.primary_key if is_table else ()
        name = definition.name
        self.add("pg_catalog", "pg_class", **_class_row(oid, name, "r" if is_table else "m", len(definition.columns),
                                                         HEAP, bool(key)))
        defaults = definition.defaults if is_table else {}
        not_null = definition.not_null if is_table else frozenset()
        for number, column in enumerate(definition.columns, start=1):
            self._column(oid, name, number, column, column.name in not_null, defaults.get(column.name))
        if is_table:
            self.add("pg_catalog", "pg_tables", schemaname=SCHEMA, tablename=name, tableowner=OWNER,
                     hasindexes=bool(key), hasrules=False, hastriggers=False, rowsecurity=False)
            self.add("information_schema", "tables", **_table_row(name, "BASE TABLE", "YES"))
        else:
            select = f" {definition.sql};"
            self.add("pg_catalog", "pg_matviews", schemaname=SCHEMA, matviewname=name, matviewowner=OWNER,
                     hasindexes=False, ispopulated=True, definition=select)
            self.add("ivm", "definitions", oid=oid, definition=select)
            # Listed as views: information_schema has no kind for a materialized view (PostgreSQL leaves them
            # out), and the tools that read it look for 'BASE TABLE' and 'VIEW'.
            self.add("information_schema", "tables", **_table_row(name, "VIEW", "NO"))
            self.add("information_schema", "views", table_catalog=DATABASE, table_schema=SCHEMA, table_name=name,
                     view_definition=definition.sql, check_option="NONE", is_updatable="NO",
                     is_insertable_into="NO", is_trigger_updatable="NO", is_trigger_deletable="NO",
                     is_trigger_insertable_into="NO")
        if key:
            self._primary_key(oid, definition, key)

    def _rule(self, view, oids: dict[str, int]) -> None:
        """A view's ``_RETURN`` rule and what it depends on, as PostgreSQL records a materialized view's.

        pg_depend: the rule depends internally ('i') on the view, and normally ('n') on each relation
        the view reads (dbt reads these to learn which views depend on which relation).
        """
        oid = oids[view.name] + 3  # (the fourth of its OIDs: ivm/catalog.py's OID_STRIDE)
        self.add("pg_catalog", "pg_rewrite", oid=oid, rulename="_RETURN", ev_class=oids[view.name], ev_type="1",
                 ev_enabled="O", is_instead=True)
        self.add("pg_catalog", "pg_depend", classid=PG_REWRITE, objid=oid, objsubid=0, refclassid=PG_CLASS,
                 refobjid=oids[view.name], refobjsubid=0, deptype="i")
        read = set()
        for source in view.sources:
            table = self.catalog.tables.get(source)
            name = table.shadow_of or source if table is not None else source  # a hidden twin: its table
            if name in oids and name not in read and name != view.name:
                read.add(name)
                self.add("pg_catalog", "pg_depend", classid=PG_REWRITE, objid=oid, objsubid=0, refclassid=PG_CLASS,
                         refobjid=oids[name], refobjsubid=0, deptype="n")

    def _column(self, relation: int, table: str, number: int, column, not_null: bool, default) -> None:
        oid, typmod = pg_type(column.type)
        kind = TYPE_BY_OID[oid]
        self.add("pg_catalog", "pg_attribute", attrelid=relation, attname=column.name, atttypid=oid,
                 attstattarget=-1, attlen=kind.length, attnum=number, attndims=1 if kind.element else 0, attcacheoff=-1, atttypmod=typmod,
                 attbyval=0 < kind.length <= 8, attalign="d" if kind.length in (8, 16) else "i",
                 attstorage="p" if kind.length > 0 else "x", attcompression="", attnotnull=not_null,
                 atthasdef=default is not None, atthasmissing=False, attidentity="", attgenerated="",
                 attisdropped=False, attislocal=True, attinhcount=0, attcollation=100 if oid == 25 else 0)
        default_text = default.sql("postgres") if default is not None else None
        if default is not None:
            self.add("pg_catalog", "pg_attrdef", oid=relation, adrelid=relation, adnum=number, adbin=default_text)
        precision, scale = _numeric(oid, typmod, kind)
        self.add("information_schema", "columns", table_catalog=DATABASE, table_schema=SCHEMA, table_name=table,
                 column_name=column.name, ordinal_position=number, column_default=default_text,
                 is_nullable="NO" if not_null else "YES", data_type="ARRAY" if kind.element else kind.sql_name,
                 numeric_precision=precision, numeric_precision_radix=10 if oid == NUMERIC else (
                     2 if precision is not None else None), numeric_scale=scale,
                 datetime_precision=6 if kind.category == "D" and oid != 1082 else (0 if oid == 1082 else None),
                 udt_catalog=DATABASE, udt_schema="pg_catalog", udt_name=kind.name, is_identity="NO",
                 is_generated="NEVER", is_updatable="YES")

    def _primary_key(self, relation: int, table, key: tuple[str, ...]) -> None:
        index, constraint = relation + 1, relation + 2
        name = f"{table.name}_pkey"
        positions = [table.column_names.index(column) + 1 for column in key]
        columns = ", ".join(_ident(column) for column in key)
        self.add("pg_catalog", "pg_class", **_class_row(index, name, "i", len(key), BTREE, False))
        for number, column in enumerate(key, start=1):
            source = table.columns[positions[number - 1] - 1]
            oid, typmod = pg_type(source.type)
            self.add("pg_catalog", "pg_attribute", attrelid=index, attname=column, atttypid=oid, attstattarget=-1,
                     attlen=TYPE_BY_OID[oid].length, attnum=number, attndims=0, attcacheoff=-1, atttypmod=typmod,
                     attbyval=False, attalign="i", attstorage="p", attcompression="", attnotnull=True,
                     atthasdef=False, atthasmissing=False, attidentity="", attgenerated="", attisdropped=False,
                     attislocal=True, attinhcount=0, attcollation=0)
        self.add("pg_catalog", "pg_index", indexrelid=index, indrelid=relation, indnatts=len(key),
                 indnkeyatts=len(key), indisunique=True, indnullsnotdistinct=False, indisprimary=True,
                 indisexclusion=False, indimmediate=True, indisclustered=False, indisvalid=True, indcheckxmin=False,
                 indisready=True, indislive=True, indisreplident=False, indkey=positions, indcollation=[0] * len(key),
                 indclass=[0] * len(key), indoption=[0] * len(key))
        self.add("pg_catalog", "pg_constraint", oid=constraint, conname=name, connamespace=PUBLIC, contype="p",
                 condeferrable=False, condeferred=False, convalidated=True, conrelid=relation, contypid=0,
                 conindid=index, conparentid=0, confrelid=0, confupdtype=" ", confdeltype=" ", confmatchtype=" ",
                 conislocal=True, coninhcount=0, connoinherit=True, conkey=positions)
        indexdef = f"CREATE UNIQUE INDEX {name} ON {SCHEMA}.{_ident(table.name)} USING btree ({columns})"
        self.add("pg_catalog", "pg_indexes", schemaname=SCHEMA, tablename=table.name, indexname=name,
                 indexdef=indexdef)
        self.add("ivm", "definitions", oid=index, definition=indexdef)
        self.add("ivm", "definitions", oid=constraint, definition=f"PRIMARY KEY ({columns})")
        self.add("information_schema", "table_constraints", constraint_catalog=DATABASE, constraint_schema=SCHEMA,
                 constraint_name=name, table_catalog=DATABASE, table_schema=SCHEMA, table_name=table.name,
                 constraint_type="PRIMARY KEY", is_deferrable="NO", initially_deferred="NO", enforced="YES")
        for number, column in enumerate(key, start=1):
            self.add("information_schema", "key_column_usage", constraint_catalog=DATABASE,
                     constraint_schema=SCHEMA, constraint_name=name, table_catalog=DATABASE, table_schema=SCHEMA,
                     table_name=table.name, column_name=column, ordinal_position=number)


def _ident(name: str) -> str:
    """A name as PostgreSQL prints it in a definition: quoted only when it must be."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else '"' + name.replace('"', '""') + '"'


def _class_row(oid: int, name: str, kind: str, columns: int, access_method: int, has_index: bool) -> dict:
    return dict(oid=oid, relname=name, relnamespace=PUBLIC, reltype=0, reloftype=0, relowner=10, relam=access_method,
                relfilenode=oid, reltablespace=0, relpages=0, reltuples=-1.0, relallvisible=0, reltoastrelid=0,
                relhasindex=has_index, relisshared=False, relpersistence="p", relkind=kind, relnatts=columns,
                relchecks=0, relhasrules=False, relhastriggers=False, relhassubclass=False, relrowsecurity=False,
                relforcerowsecurity=False, relispopulated=True, relreplident="d" if kind != "i" else "n",
                relispartition=False, relrewrite=0, relfrozenxid=0, relminmxid=0)


def _table_row(name: str, kind: str, insertable: str) -> dict:
    return dict(table_catalog=DATABASE, table_schema=SCHEMA, table_name=name, table_type=kind,
                is_insertable_into=insertable, is_typed="NO")


def _numeric(oid: int, typmod: int, kind: PgType) -> tuple[int | None, int | None]:
    """information_schema's numeric_precision and numeric_scale."""
    if oid == NUMERIC:
        return ((typmod - 4) >> 16, (typmod - 4) & 0xFFFF) if typmod >= 4 else (None, None)
    bits = {20: 64, 21: 16, 23: 32, 700: 24, 701: 53}.get(oid)
    return (bits, 0 if kind.category == "N" and oid not in (700, 701) else None) if bits else (None, None)
