"""The errors ivm raises on purpose: one vocabulary for every layer.

Each class also derives from the builtin that protocol layers map to a status
code (ValueError -> INVALID_ARGUMENT, KeyError -> NOT_FOUND,
NotImplementedError -> UNIMPLEMENTED, RuntimeError -> INTERNAL), so the Flight
server needs no table of our own types.

Storage is the lowest layer, so the vocabulary lives here and everything
above imports it (``sql_frontend.errors`` and ``ivm.errors`` re-export it).
"""

from __future__ import annotations


class IvmError(Exception):
    """Base class of every error raised deliberately by ivm."""


class SqlSyntaxError(IvmError, ValueError):
    """The text is not SQL we can parse."""


class BindError(IvmError, ValueError):
    """The SQL parses but does not make sense against the catalog (types, names)."""


class UnsupportedError(IvmError, NotImplementedError):
    """A construct ivm does not maintain; the message names it."""


class UnknownObjectError(IvmError, KeyError):
    """A table, view or column that does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AccessDeniedError(IvmError, ValueError):
    """SQL that would reach outside the database: a file, a URL, an extension, a setting.

    The Flight server answers it with PERMISSION_DENIED (flight_server/errors.py).
    """


class CatalogError(IvmError, ValueError):
    """A catalog change that conflicts with what exists (duplicates, dependents)."""


class ChangeError(IvmError, ValueError):
    """A change batch that cannot be applied (schema, keys, operations)."""


class ExecutionError(IvmError, ValueError):
    """Evaluating a view's expressions over the new data failed (e.g. a cast)."""


class OffsetError(IvmError, ValueError):
    """An offset outside the retained change history (or ahead of the log)."""


class TooComplexError(IvmError, ValueError):
    """A statement over a limit (size, nesting, time): the message names the limit."""


class StatementTimeoutError(IvmError, TimeoutError):
    """A statement ran past the statement timeout and was cancelled; nothing changed."""


class StatementCancelledError(StatementTimeoutError):
    """A client asked to cancel its running statement (ivm/reads/cancel.py); nothing changed."""


class InternalError(IvmError, RuntimeError):
    """An invariant of the engine was violated; this is a bug in ivm."""
