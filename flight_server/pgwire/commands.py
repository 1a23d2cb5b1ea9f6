"""Statements a PostgreSQL session answers itself, and command tags.

Drivers and tools send session statements on connect (``SET
extra_float_digits = 3``, ``SHOW transaction_isolation``, ``BEGIN``); they
are about this connection, not the data, so they are answered here and never
reach the Database:

* ``BEGIN``/``START TRANSACTION``/``COMMIT``/``END``/``ROLLBACK``/``ABORT``
  are accepted and answer their tags, but change nothing: every statement
  is its own atomic change batch, committed when acknowledged. A ROLLBACK
  undoes nothing (the tag is PostgreSQL's; docs/serving.md says so). So are
  ``SAVEPOINT``, ``RELEASE`` and ``ROLLBACK TO`` (``savepoint``).
* ``SET``/``RESET``/``SHOW`` of the parameters in ``PARAMETERS``. A value
  ivm cannot honour (a TimeZone other than UTC, a DateStyle other than
  ISO, an encoding other than UTF8) is refused with 0A000, not accepted and
  ignored. ``SET ivm.engine`` goes to the Database. ``SHOW ivm_offset`` is
  the offset the connection last read or wrote.
* ``SELECT version()`` and ``SELECT current_database()``: DuckDB answers
  its own version (clients parse "PostgreSQL x.y") and ``memory``.

>>> tag("insert into t values (1)", 3), tag("CREATE OR REPLACE MATERIALIZED VIEW v AS SELECT 1", 0)
('INSERT 0 3', 'CREATE MATERIALIZED VIEW')
>>> tag("refresh materialized view v", 0)
'REFRESH MATERIALIZED VIEW'
>>> parse_set("SET SESSION TIME ZONE UTC"), parse_set("set search_path to public, x")
(('timezone', 'UTC'), ('search_path', 'public, x'))
>>> savepoint('SAVEPOINT "_pg3_1"'), savepoint("ROLLBACK TO SAVEPOINT s"), savepoint("release s"), savepoint("ROLLBACK")
('SAVEPOINT', 'ROLLBACK', 'RELEASE', None)
"""

from __future__ import annotations

import functools
import re

from flight_server.pgwire.errors import PgError, UNSUPPORTED
from sql_frontend.errors import SqlSyntaxError
from sql_frontend.statements import statement_texts

SERVER_VERSION = "15.0 (ivm)"
VERSION_TEXT = "PostgreSQL 15.0 (ivm {version}) on DuckDB {duckdb}, an incremental materialized-view database"

_TRANSACTION = {"BEGIN": "BEGIN", "START": "START TRANSACTION", "COMMIT": "COMMIT", "END": "COMMIT",
                "ROLLBACK": "ROLLBACK", "ABORT": "ROLLBACK"}
_OBJECTS = ("MATERIALIZED VIEW", "TABLE", "VIEW", "SOURCE", "INDEX", "SCHEMA", "SEQUENCE")
_WORDS = re.compile(r"[A-Za-z_]+")
_SAVEPOINT = re.compile(r'\s*(SAVEPOINT|RELEASE(?:\s+SAVEPOINT)?|ROLLBACK(?:\s+(?:WORK|TRANSACTION))?\s+TO'
                        r'(?:\s+SAVEPOINT)?)\s+(?:"(?:[^"]|"")+"|[A-Za-z_]\w*)\s*;?\s*$', re.IGNORECASE)


@functools.lru_cache(maxsize=512)
def split(sql: str) -> tuple[str, ...]:
    """The ';'-separated statements of a Query message, as written (the parser's own split)."""
    texts = statement_texts(sql)
    if texts is None:
        raise SqlSyntaxError("syntax error: the text does not tokenize (an unterminated string, quoted name "
                             "or comment?)")
    return tuple(texts)


def words(sql: str, n: int = 6) -> list[str]:
    return [w.upper() for w in _WORDS.findall(sql[:200])[:n]]


def transaction(sql: str) -> str | None:
    """The tag of a transaction-control statement (accepted as a no-op), or None."""
    first = words(sql, 3)
    if not first or first[0] not in _TRANSACTION:
        return None
    if first[0] == "START" and first[1:2] != ["TRANSACTION"]:
        return None
    if first[0] == "ROLLBACK" and "TO" in first:
        return None  # ROLLBACK TO SAVEPOINT: ``savepoint``
    return _TRANSACTION[first[0]]


def savepoint(sql: str) -> str | None:
    """The tag of ``SAVEPOINT s``, ``RELEASE [SAVEPOINT] s`` or ``ROLLBACK TO [SAVEPOINT] s``, or None.

    Accepted as no-ops, like BEGIN and COMMIT: every statement has already
    committed, so there is nothing to mark, and ROLLBACK TO undoes nothing
    (as ROLLBACK). Drivers need them: psycopg's ``conn.transaction()``
    inside a transaction (which SQLAlchemy's psycopg dialect runs on
    connect, to look up the hstore type) sends SAVEPOINT, then RELEASE or,
    after an error, ROLLBACK TO SAVEPOINT.
    """
    match = _SAVEPOINT.match(sql)
    return None if match is None else match[1].split()[0].upper()


def tag(sql: str, count: int) -> str:
    """The CommandComplete tag of a statement that ran (``count``: rows affected or returned)."""
    first = words(sql, 8)
    head = first[0] if first else ""
    if head == "INSERT":
        return f"INSERT 0 {count}"
    if head in ("UPDATE", "DELETE", "SELECT", "COPY"):
        return f"{head} {count}"
    if head in ("CREATE", "DROP", "ALTER"):
        rest = " ".join(w for w in first[1:] if w not in ("OR", "REPLACE", "TEMP", "TEMPORARY", "IF", "NOT"))
        for kind in _OBJECTS:
            if rest.startswith(kind):
                return f"{head} {kind}"
        return head
    if head in ("WITH", "VALUES", "TABLE", "FROM"):
        return f"SELECT {count}"
    if first[:3] == ["REFRESH", "MATERIALIZED", "VIEW"]:
        return "REFRESH MATERIALIZED VIEW"
    return head or "OK"


# --- SET / SHOW ----------------------------------------------------------------------------------
_SET = re.compile(r"SET\s+(?:SESSION\s+|LOCAL\s+)?(?P<name>TIME\s+ZONE|[\w.]+)\s*(?:=|\bTO\b)?\s*(?P<value>.*?)\s*;?\s*$",
                  re.IGNORECASE | re.DOTALL)
_SHOW = re.compile(r"SHOW\s+(?P<name>TIME\s+ZONE|TRANSACTION\s+ISOLATION\s+LEVEL|[\w.]+)\s*;?\s*$",
                   re.IGNORECASE)
_RESET = re.compile(r"RESET\s+(?P<name>TIME\s+ZONE|ALL|[\w.]+)\s*;?\s*$", re.IGNORECASE)


def _canonical(name: str) -> str:
    name = re.sub(r"\s+", " ", name.strip().lower())
    return {"time zone": "timezone", "transaction isolation level": "transaction_isolation",
            "names": "client_encoding"}.get(name, name)


def parse_set(sql: str) -> tuple[str, str] | None:
    """(parameter, value text) of a SET statement, or None."""
    match = _SET.match(sql.strip())
    if match is None or match["name"].upper() in ("TRANSACTION", "CONSTRAINTS", "ROLE", "SESSION"):
        return None
    value = match["value"].strip()
    return _canonical(match["name"]), value


def parse_show(sql: str) -> str | None:
    match = _SHOW.match(sql.strip())
    return _canonical(match["name"]) if match else None


def parse_reset(sql: str) -> str | None:
    match = _RESET.match(sql.strip())
    return _canonical(match["name"]) if match else None


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace(value[0] * 2, value[0])
    return value


def _one_of(name: str, allowed: tuple[str, ...], shown: str):
    def check(value: str) -> str:
        if value.upper().replace("-", "").replace(" ", "") not in allowed:
            raise PgError(UNSUPPORTED, f"{name} {value!r} is not supported: ivm serves {shown} only")
        return shown

    return check


def _datestyle(value: str) -> str:
    parts = [p.strip().upper() for p in value.split(",")]
    if any(p not in ("ISO", "MDY", "DMY", "YMD", "") for p in parts):
        raise PgError(UNSUPPORTED, f"DateStyle {value!r} is not supported: ivm prints dates in ISO style only")
    order = next((p for p in parts if p in ("MDY", "DMY", "YMD")), "MDY")
    return f"ISO, {order}"


def _number(name: str, cast):
    def check(value: str) -> str:
        try:
            return str(cast(value))
        except ValueError:
            raise PgError("22023", f"invalid value for parameter {name}: {value!r}") from None

    return check


def _milliseconds(value: str) -> str:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|h)?\s*", value)
    if match is None:
        raise PgError("22023", f"invalid value for parameter statement_timeout: {value!r}")
    factor = {"ms": 1, "s": 1000, "min": 60000, "h": 3600000, None: 1}[match[2]]
    return str(int(float(match[1]) * factor))


# name: (default, validator (None: read-only), reported with ParameterStatus)
PARAMETERS = {
    "server_version": (SERVER_VERSION, None, True),
    "server_encoding": ("UTF8", None, True),
    # SQL_ASCII (what psql asks for under the C locale) means "no conversion": UTF-8 bytes pass as they are
    "client_encoding": ("UTF8", _one_of("client_encoding", ("UTF8", "UNICODE", "SQL_ASCII"), "UTF8"), True),
    "datestyle": ("ISO, MDY", _datestyle, True),
    "intervalstyle": ("postgres", _one_of("IntervalStyle", ("POSTGRES",), "postgres"), True),
    "integer_datetimes": ("on", None, True),
    "standard_conforming_strings": ("on", _one_of("standard_conforming_strings", ("ON", "TRUE"), "on"), True),
    "timezone": ("UTC", _one_of("TimeZone", ("UTC", "ETC/UTC", "GMT", "Z", "ZULU", "UCT", "+00", "+00:00", "0"),
                                "UTC"), True),
    "application_name": ("", str, True),
    "is_superuser": ("on", None, True),
    "session_authorization": ("ivm", None, True),
    "search_path": ('"$user", public', str, False),
    "extra_float_digits": ("1", _number("extra_float_digits", int), False),
    "statement_timeout": ("0", _milliseconds, False),
    "client_min_messages": ("notice", str, False),
    "bytea_output": ("hex", _one_of("bytea_output", ("HEX",), "hex"), False),
    "transaction_isolation": ("serializable", None, False),
    "default_transaction_isolation": ("serializable", None, False),
    "transaction_read_only": ("off", None, False),
    "max_identifier_length": ("63", None, False),
    "lc_messages": ("C", None, False),
}
_SHOWN_NAMES = {"datestyle": "DateStyle", "timezone": "TimeZone", "intervalstyle": "IntervalStyle"}


class Parameters:
    """One connection's run-time parameters."""

    def __init__(self, startup: dict[str, str]):
        self.values = {name: default for name, (default, _, _) in PARAMETERS.items()}
        for name, value in startup.items():
            name = _canonical(name)
            if name in PARAMETERS and PARAMETERS[name][1] is not None:
                self.set(name, value)

    def set(self, name: str, value: str) -> str | None:
        """Set a parameter; returns the name to report with ParameterStatus (if it is one)."""
        if name not in PARAMETERS:
            raise PgError("42704", f'unrecognized configuration parameter "{name}"')
        default, check, reported = PARAMETERS[name]
        if check is None:
            raise PgError("55P02", f'parameter "{name}" cannot be changed')
        text = _unquote(value)
        if text.upper() == "DEFAULT":
            text = default
        self.values[name] = check(text) if text != default else text
        return _SHOWN_NAMES.get(name, name) if reported else None

    def reset(self, name: str) -> list[str]:
        names = [n for n, (_, check, _) in PARAMETERS.items() if check is not None] if name == "all" else [name]
        reported = []
        for n in names:
            shown = self.set(n, "DEFAULT")
            if shown:
                reported.append(shown)
        return reported

    def show(self, name: str) -> str:
        if name not in self.values:
            raise PgError("42704", f'unrecognized configuration parameter "{name}"')
        return self.values[name]

    def reported(self) -> list[tuple[str, str]]:
        return [(_SHOWN_NAMES.get(n, n), self.values[n]) for n, (_, _, r) in PARAMETERS.items() if r]

    def timeout_seconds(self) -> float | None:
        milliseconds = int(self.values["statement_timeout"])
        return milliseconds / 1000 if milliseconds else None


_INTERCEPTED = re.compile(r"SELECT\s+(?:pg_catalog\.)?(?P<function>version|current_database)\s*\(\s*\)\s*;?\s*$",
                          re.IGNORECASE)


def intercepted_function(sql: str) -> str | None:
    """``version`` or ``current_database`` when ``sql`` is just ``SELECT version()`` (or the other)."""
    match = _INTERCEPTED.match(sql.strip())
    return match["function"].lower() if match else None


def unsupported(sql: str) -> str | None:
    """A message for session statements ivm does not have (cursors, LISTEN, prepared SQL statements)."""
    head = (words(sql, 1) or [""])[0]
    if head in ("DECLARE", "FETCH", "MOVE", "CLOSE", "LISTEN", "UNLISTEN", "NOTIFY", "PREPARE", "EXECUTE",
                "DEALLOCATE", "LOCK", "VACUUM", "ANALYZE", "GRANT", "REVOKE", "TRUNCATE"):
        if head == "DEALLOCATE":
            return None
        return f"{head} is not supported by ivm's PostgreSQL door"
    return None
