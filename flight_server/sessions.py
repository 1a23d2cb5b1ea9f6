"""Server-side state between calls: prepared statements and pending results.

A Flight SQL query takes two calls: GetFlightInfo (which runs it here, so the
FlightInfo can carry the result's schema and offset) and DoGet (which streams
it). Results wait in between, bounded in number and age: a client that never
fetches costs nothing for long. Prepared statements live until closed, also
bounded (the oldest are closed first). Handles are random, so one client
cannot guess another's.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

import pyarrow as pa

from flight_server.errors import NotFound
from flight_server.subscribe import Subscription

T = TypeVar("T")
K = TypeVar("K")


class Lru(Generic[K, T]):
    """A small thread-safe cache of derived facts (least recently used go first)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[K, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: T) -> T:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return value


class Bounded(Generic[T]):
    """A thread-safe map from random handles to values, oldest evicted first."""

    def __init__(self, what: str, limit: int, ttl: float | None = None,
                 budget: int | None = None, size: Callable[[T], int] | None = None):
        self.what = what
        self.limit = limit
        self.ttl = ttl
        self.budget = budget  # bound on the sum of size(value), e.g. bytes of pending results
        self.size = size or (lambda value: 0)
        self._items: OrderedDict[bytes, tuple[float, T, int]] = OrderedDict()  # (created, value, size)
        self._used = 0
        self._lock = threading.Lock()

    def add(self, value: T, size: int | None = None) -> bytes:
        """Keep ``value``; ``size``: its size(value) when the caller knows it (a table's nbytes costs ~10 us)."""
        handle = secrets.token_bytes(16)
        size = self.size(value) if size is None else size
        with self._lock:
            self._expire()
            self._items[handle] = (time.monotonic(), value, size)
            self._used += size
            while len(self._items) > 1 and (len(self._items) > self.limit or
                                            (self.budget is not None and self._used > self.budget)):
                self._pop(next(iter(self._items)))
        return handle

    def _pop(self, handle: bytes) -> tuple[float, T, int] | None:
        found = self._items.pop(handle, None)
        if found is not None:
            self._used -= found[2]  # the size it was added with
        return found

    def get(self, handle: bytes) -> T:
        with self._lock:
            self._expire()
            found = self._items.get(handle)
        if found is None:
            raise NotFound(f"unknown or expired {self.what}")
        return found[1]

    def take(self, handle: bytes) -> T:
        with self._lock:
            self._expire()
            found = self._pop(handle)
        if found is None:
            raise NotFound(f"unknown or expired {self.what} (results are fetched once; run the query again)")
        return found[1]

    def discard(self, handle: bytes) -> None:
        with self._lock:
            self._pop(handle)

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self) -> None:
        if self.ttl is None:
            return
        cutoff = time.monotonic() - self.ttl
        while self._items:
            handle, (created, _, _) = next(iter(self._items.items()))
            if created >= cutoff:
                return
            self._pop(handle)


@dataclass
class Prepared:
    sql: str
    parameters: int  # how many ? it takes
    is_query: bool
    bound: pa.RecordBatch | None = None  # the parameter row(s) of the next execution
    # A parameterless query runs when prepared; its result (a handle in the
    # result store) is reused by the next execution if nothing was published
    # since (same database version).
    cached: tuple[int, bytes] | None = None
    subscription: Subscription | None = None  # a SUBSCRIBE: each execution opens a stream (server.py)
    lock: threading.Lock = field(default_factory=threading.Lock)
