"""Errors as Flight clients see them: a gRPC status code and a clean message.

pyarrow turns an exception raised by a handler into a gRPC status by its
builtin base class (ValueError -> INVALID_ARGUMENT, KeyError -> NOT_FOUND,
NotImplementedError -> UNIMPLEMENTED) and appends a formatted Python
traceback to the message; its Flight error classes carry no such codes.
So every handler runs inside ``translated``: ivm's errors (whose classes
already derive from those builtins, see sql_frontend/errors.py) become the
three classes below, and ``quiet_tracebacks`` (called once by the server
process) keeps tracebacks out of the appended part, which the three classes
make just ``Detail: Python exception: NotFound`` (see ``_Once``): the
message is not said twice. SQL refused for reaching outside the database
(AccessDeniedError) is PERMISSION_DENIED. A statement
that ran out of Python recursion is INVALID_ARGUMENT (sql_frontend/limits.py),
one cancelled by the statement timeout DEADLINE_EXCEEDED, and no message is
longer than MESSAGE_CHARS (DuckDB's errors may repeat a whole statement).
Anything unexpected is logged with its traceback and reaches the client as
INTERNAL.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import traceback
from typing import Any, Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.flight as fl

from sql_frontend.errors import AccessDeniedError, IvmError, StatementTimeoutError
from sql_frontend.limits import too_complex

log = logging.getLogger("ivm.flight")
MESSAGE_CHARS = 2000


class _Once(Exception):
    """An error whose message the client reads once.

    pyarrow makes the gRPC status message ``str(error)``, then appends
    ``. Detail: Python exception: `` and ``traceback.format_exception(error)``,
    which ends with ``Name: str(error)``: the message again. So the
    traceback module, alone, reads no text here and formats just the name.
    """

    def __str__(self) -> str:
        caller = sys._getframe(0).f_back  # None when pyarrow's C++ asks (for the status message)
        if caller is not None and caller.f_globals.get("__name__") == "traceback":
            return ""
        return str(self.args[0]) if self.args else ""  # KeyError's own str would quote the message


class InvalidArgument(_Once, ValueError):
    """INVALID_ARGUMENT: bad SQL, bad data, a conflicting request."""


class NotFound(_Once, KeyError):
    """NOT_FOUND: an unknown table, view, statement or result."""


class Unimplemented(_Once, NotImplementedError):
    """UNIMPLEMENTED: a construct, command or mode ivm does not support."""


# Their name is what a client reads after "Detail: Python exception:".
for _cls in (InvalidArgument, NotFound, Unimplemented):
    _cls.__module__ = "builtins"


def quiet_tracebacks() -> None:
    """Keep server tracebacks out of clients' messages (process-wide).

    pyarrow formats the traceback it sends with ``traceback.format_exception``,
    which honours ``sys.tracebacklimit``; the server logs its own tracebacks
    with an explicit limit (``log_internal``).
    """
    sys.tracebacklimit = 0


def log_internal(error: BaseException) -> None:
    lines = traceback.format_exception(type(error), error, error.__traceback__, limit=64)
    log.error("internal error\n%s", "".join(lines))


def flight_error(error: BaseException) -> BaseException:
    """The exception to raise to a client for ``error``."""
    if isinstance(error, (fl.FlightError, InvalidArgument, NotFound, Unimplemented)):
        return error
    if isinstance(error, RecursionError):
        return InvalidArgument(str(too_complex(error)))
    message = bounded(str(error))
    if isinstance(error, AccessDeniedError):
        return fl.FlightUnauthorizedError(message)  # PERMISSION_DENIED
    if isinstance(error, StatementTimeoutError):
        return fl.FlightTimedOutError(message)
    if isinstance(error, (IvmError, pa.ArrowInvalid, pa.ArrowTypeError)):
        if isinstance(error, KeyError):
            return NotFound(message)
        if isinstance(error, NotImplementedError):
            return Unimplemented(message)
        if isinstance(error, (ValueError, TypeError)):
            return InvalidArgument(message)
        if not isinstance(error, RuntimeError):  # e.g. the database is closed (shutting down)
            return fl.FlightUnavailableError(message)
    log_internal(error)
    return fl.FlightInternalError(f"internal error ({type(error).__name__}: {message}); the server log has details")


def bounded(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[:MESSAGE_CHARS]}… (message cut: {len(message)} characters)"


@contextlib.contextmanager
def translating() -> Iterator[None]:
    try:
        yield
    except Exception as error:  # noqa: BLE001 (every error becomes a clean status)
        raise flight_error(error) from None


F = TypeVar("F", bound=Callable[..., Any])


def translated(handler: F) -> F:
    """Run a Flight handler with its errors translated for clients."""

    @functools.wraps(handler)
    def run(*args: Any, **kwargs: Any) -> Any:
        with translating():
            return handler(*args, **kwargs)

    return run  # type: ignore[return-value]


def translated_stream(items: Iterator[Any]) -> Iterator[Any]:
    """A generator's items, with errors raised while streaming translated."""
    with translating():
        yield from items
