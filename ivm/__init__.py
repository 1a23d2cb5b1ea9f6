"""ivm: incremental materialized-view maintenance.

    import ivm
    db = ivm.connect()
"""

from sql_frontend.errors import (  # noqa: F401  (the public error vocabulary)
    AccessDeniedError,
    BindError,
    CatalogError,
    ChangeError,
    ExecutionError,
    InternalError,
    IvmError,
    OffsetError,
    SqlSyntaxError,
    StatementCancelledError,
    StatementTimeoutError,
    TooComplexError,
    UnknownObjectError,
    UnsupportedError,
)
from ivm.database import Database, connect  # noqa: F401

__all__ = [
    "connect",
    "Database",
    "IvmError",
    "AccessDeniedError",
    "SqlSyntaxError",
    "StatementTimeoutError",
    "StatementCancelledError",
    "TooComplexError",
    "BindError",
    "UnsupportedError",
    "UnknownObjectError",
    "CatalogError",
    "ChangeError",
    "ExecutionError",
    "OffsetError",
    "InternalError",
]
