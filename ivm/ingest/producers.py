"""Idempotent producers: (source, seq) -> the offset the batch got.

A producer that retries after a timeout or a crash sends the same batch with
the same (source, seq) again. The first one is applied and gets an offset;
a repeat returns that offset and applies nothing. Sequence numbers of one
source must grow: a seq below the last applied one is an error unless it is
exactly a remembered one (then its original offset). Each source remembers
its last ``REMEMBER`` sequence numbers; the map is saved with every
checkpoint and rebuilt from the log on recovery.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sql_frontend.errors import ChangeError

REMEMBER = 10_000


def check_producer(source: str | None, seq: int | None) -> None:
    if source is None and seq is None:
        return
    if not isinstance(source, str) or not source:
        raise ChangeError("source must be a non-empty string when seq is given")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise ChangeError(f"seq must be a non-negative integer (the producer's batch number), not {seq!r}")


class Producers:
    def __init__(self) -> None:
        self._seqs: dict[str, OrderedDict[int, int]] = {}
        self._lock = threading.Lock()

    def known(self, source: str, seq: int) -> int | None:
        """The offset of an applied (source, seq); None when it is new."""
        with self._lock:
            seqs = self._seqs.get(source)
            if not seqs:
                return None
            if seq in seqs:
                return seqs[seq]
            last = next(reversed(seqs))
            if seq < last:
                raise ChangeError(
                    f"seq {seq} of source {source!r} is below the last applied seq {last} and is not a "
                    "remembered batch: sequence numbers of a source must grow"
                )
            return None

    def record(self, source: str | None, seq: int | None, offset: int) -> None:
        if source is None or seq is None:
            return
        with self._lock:
            seqs = self._seqs.setdefault(source, OrderedDict())
            seqs[seq] = offset
            while len(seqs) > REMEMBER:
                seqs.popitem(last=False)

    def upto(self, offset: int) -> dict[str, list[list[int]]]:
        """What a checkpoint at ``offset`` saves: batches at or below it."""
        with self._lock:
            out = {}
            for source, seqs in self._seqs.items():
                kept = [[s, o] for s, o in seqs.items() if o <= offset]
                if kept:
                    out[source] = kept
            return out

    def load(self, doc: dict[str, list[list[int]]]) -> None:
        with self._lock:
            self._seqs = {source: OrderedDict((s, o) for s, o in pairs) for source, pairs in doc.items()}

    def last(self) -> dict[str, tuple[int, int]]:
        """source -> (last seq, its offset), for status."""
        with self._lock:
            return {source: next(reversed(seqs.items())) for source, seqs in self._seqs.items() if seqs}
