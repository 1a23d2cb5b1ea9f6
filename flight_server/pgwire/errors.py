"""ivm's errors as PostgreSQL ErrorResponses: a SQLSTATE and the message Flight gives.

Clients branch on the SQLSTATE (psycopg's ``e.sqlstate``, asyncpg's
exception classes), so each of ivm's error classes (sql_frontend/errors.py)
maps to the PostgreSQL code of the same meaning (Appendix A, "PostgreSQL
Error Codes"). Where one class covers several codes (a ChangeError is a
duplicate key or a NULL in a NOT NULL column; an UnknownObjectError names a
relation or a column), the message, which ivm words the same way every
time, tells them apart. The message text is Flight's (``flight_server.errors.bounded``):
the same statement fails with the same words on both doors.

>>> sqlstate(ivm.ChangeError("duplicate key: insert ('c') into t of existing (id) = (1)"))
'23505'
>>> sqlstate(ivm.UnknownObjectError("table t has no column x"))
'42703'
"""

from __future__ import annotations

import pyarrow as pa

import ivm
from flight_server.errors import bounded, log_internal
from sql_frontend.errors import (AccessDeniedError, BindError, CatalogError, ChangeError, ExecutionError, OffsetError,
                                 SqlSyntaxError, StatementTimeoutError, TooComplexError, UnknownObjectError,
                                 UnsupportedError)
from sql_frontend.limits import too_complex

SYNTAX = "42601"
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
UNSUPPORTED = "0A000"
UNIQUE_VIOLATION = "23505"
NOT_NULL_VIOLATION = "23502"
INSUFFICIENT_PRIVILEGE = "42501"
QUERY_CANCELED = "57014"
INVALID_PASSWORD = "28P01"
PROTOCOL_VIOLATION = "08P01"
PROGRAM_LIMIT = "54000"
DATA_EXCEPTION = "22000"
INTERNAL = "XX000"


class PgError(Exception):
    """An error the session raises itself, with its SQLSTATE."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _column(message: str) -> bool:
    text = message.lower()
    return "column" in text and any(w in text for w in ("not found", "has no column", "does not exist",
                                                         "no column"))


def sqlstate(error: BaseException) -> str:
    """The SQLSTATE of an error raised while running a client's statement."""
    if isinstance(error, PgError):
        return error.code
    message = str(error)
    if isinstance(error, StatementTimeoutError):
        return QUERY_CANCELED
    if isinstance(error, AccessDeniedError):
        return INSUFFICIENT_PRIVILEGE
    if isinstance(error, SqlSyntaxError):
        return SYNTAX
    if isinstance(error, UnsupportedError):
        return UNSUPPORTED
    if isinstance(error, TooComplexError):
        return PROGRAM_LIMIT
    if isinstance(error, UnknownObjectError):
        return UNDEFINED_COLUMN if _column(message) else UNDEFINED_TABLE
    if isinstance(error, BindError):
        if _column(message):
            return UNDEFINED_COLUMN
        if "does not exist" in message.lower() and ("table" in message.lower() or "relation" in message.lower()):
            return UNDEFINED_TABLE
        return "42804" if "type" in message.lower() else "42000"
    if isinstance(error, ChangeError):
        if message.startswith("duplicate key"):
            return UNIQUE_VIOLATION
        if "is NULL in" in message or "NOT NULL but" in message:
            return NOT_NULL_VIOLATION
        return "23000" if "delete ('d')" in message else DATA_EXCEPTION
    if isinstance(error, CatalogError):
        return "42P07" if "already exists" in message else "42000"
    if isinstance(error, OffsetError):
        return "22023"
    if isinstance(error, (ExecutionError, pa.ArrowInvalid, pa.ArrowTypeError)):
        return DATA_EXCEPTION
    if isinstance(error, ivm.IvmError) and isinstance(error, (ValueError, TypeError, KeyError)):
        return DATA_EXCEPTION
    if isinstance(error, ivm.IvmError) and not isinstance(error, RuntimeError):
        return "55000"  # e.g. the database is closed: the server is shutting down
    return INTERNAL


def describe(error: BaseException) -> tuple[str, str]:
    """(SQLSTATE, message) for a client; an unexpected error is logged with its traceback."""
    if isinstance(error, RecursionError):
        error = too_complex(error)
    code = sqlstate(error)
    message = bounded(str(error))
    if code == INTERNAL:
        log_internal(error)
        message = f"internal error ({type(error).__name__}: {message}); the server log has details"
    return code, message
