"""Cancelling a client's running statement from another thread.

A protocol server runs each client's statements on that client's thread; a
cancel request (PostgreSQL's CancelRequest) arrives on another connection,
so another thread. The statement timeout already stops a DuckDB query by
calling ``cursor.interrupt()`` from a timer (ivm/reads/reads.py); a cancel does the
same from the canceller's thread. The running statement's thread opens a
``Cancellation.scope()``; every DuckDB query it runs inside the scope
registers its cursor (``running``), so ``cancel()`` interrupts whatever runs
now, and a cancel that lands between two queries of the statement stops the
next one before it starts. Work outside DuckDB (appending a change batch) is
not interrupted: like PostgreSQL's, a cancel is a request, honoured where the
statement can stop with nothing changed.

>>> token = Cancellation()
>>> with token.scope():
...     token.cancel()
...     requested()
True
>>> requested()
False
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Iterator

_current: contextvars.ContextVar["Cancellation | None"] = contextvars.ContextVar("ivm_cancellation", default=None)


class Cancellation:
    """One client's cancel switch; reset at the start of each statement (``scope``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: set[Any] = set()
        self._cancelled = False

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Run one statement under this switch (a cancel from before it started does not count)."""
        with self._lock:
            self._cancelled = False
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)
            with self._lock:
                self._cursors.clear()

    def cancel(self) -> None:
        """Interrupt the queries running in this switch's scope, and any it starts later."""
        with self._lock:
            self._cancelled = True
            cursors = list(self._cursors)
        for cursor in cursors:
            cursor.interrupt()

    @property
    def cancelled(self) -> bool:
        return self._cancelled


def requested() -> bool:
    """True when the statement running on this thread was cancelled."""
    current = _current.get()
    return current is not None and current.cancelled


@contextlib.contextmanager
def running(cursor: Any) -> Iterator[bool]:
    """Register a DuckDB cursor with this thread's cancellation while a query runs on it.

    Yields whether the statement was already cancelled (the caller then does
    not start the query: an interrupt before a query starts is cleared by DuckDB).
    """
    current = _current.get()
    if current is None:
        yield False
        return
    with current._lock:
        current._cursors.add(cursor)
        cancelled = current._cancelled
    try:
        yield cancelled
    finally:
        with current._lock:
            current._cursors.discard(cursor)
