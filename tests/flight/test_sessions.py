"""The server's bounded state: pending results and prepared statements."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from flight_server.errors import NotFound
from flight_server.sessions import Bounded, Lru


def test_results_are_taken_once_and_bounded_by_count_age_and_bytes():
    results = Bounded("result", limit=3, ttl=0.2, budget=100, size=lambda t: t.nbytes)
    small = pa.table({"a": pa.array([1], pa.int64())})  # 8 bytes
    first = results.add(small)
    assert results.take(first) is small
    with pytest.raises(NotFound, match="fetched once"):
        results.take(first)
    handles = [results.add(small) for _ in range(5)]
    assert len(results) == 3  # oldest evicted
    with pytest.raises(NotFound):
        results.take(handles[0])
    big = pa.table({"a": pa.array(range(20), pa.int64())})  # 160 bytes: over budget alone
    kept = results.add(big)
    assert len(results) == 1 and results.take(kept) is big  # the newest always stays
    stale = results.add(small)
    time.sleep(0.3)
    with pytest.raises(NotFound, match="expired"):
        results.take(stale)


def test_a_size_given_on_add_is_the_one_counted_and_given_back_on_eviction():
    results = Bounded("result", limit=10, budget=100, size=lambda t: t.nbytes)
    small = pa.table({"a": pa.array([1], pa.int64())})  # 8 bytes, counted as given
    first = results.add(small, 60)
    results.add(small, 30)
    assert len(results) == 2  # 90 of 100
    results.add(small, 20)  # 110: the oldest (60) goes, and only its 60
    assert len(results) == 2
    with pytest.raises(NotFound):
        results.take(first)
    results.add(small, 50)  # 100 again (30 + 20 + 50): nothing more is evicted
    assert len(results) == 3


def test_lru_keeps_the_recently_used():
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
