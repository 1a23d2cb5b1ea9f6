"""Change subscriptions: a view's or table's change stream over plain Flight ``DoGet``.

(The stream is subscribe.py's ``Feed``, which SUBSCRIBE in SQL sends too.)

Ticket (JSON)::

    {"subscribe": "region_sales", "from": 0}       changes after offset 0, live
    {"subscribe": "region_sales", "from": 0, "until": 40}   changes after 0 through 40, then the end
    {"subscribe": "region_sales"}                   the view's rows now, then live

Every batch has the view's columns, ``__weight`` (int64: +n rows added, -n
removed) and ``__offset`` (int64: the batch that changed them). Batches end
at offset boundaries, and each carries app metadata ``{"through": N}``: every
change up to offset N has been sent, so a consumer that stops resumes with
``"from": N`` (or from the last ``__offset`` it received). Without ``from``
the stream starts with the view's current rows (weight 1 each, ``__offset``
= the offset read), for consumers that have no state yet. When nothing
changes, an empty batch with the current ``through`` arrives every
``heartbeat`` seconds (default 1), which also notices departed clients.

Slow consumers: the stream produces a batch only when gRPC has room for it,
so a consumer that reads slowly holds one batch on the server; the history it
reads from is bounded (storage/view_history.py), and a consumer that falls
behind the retained history gets INVALID_ARGUMENT telling it to re-read the
view.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

import ivm
from flight_server.errors import InvalidArgument, translated_stream
from flight_server.subscribe import CHUNK_ROWS, OFFSET, Feed



@dataclass
class Subscription:
    view: str
    since: int | None  # None: start with the view's current rows
    until: int | None = None
    heartbeat: float = 1.0

    @classmethod
    def from_ticket(cls, ticket: dict) -> "Subscription":
        view = ticket.get("subscribe")
        if not isinstance(view, str) or not view:
            raise InvalidArgument('a subscription ticket names a view or table: {"subscribe": "<name>", "from": <offset>}')
        since, until, heartbeat = ticket.get("from"), ticket.get("until"), ticket.get("heartbeat", 1.0)
        for name, value in (("from", since), ("until", until)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise InvalidArgument(f'"{name}" must be an offset (an integer >= 0), not {json.dumps(value)}')
        if since is not None and until is not None and until < since:
            raise InvalidArgument(f'"until" ({until}) is before "from" ({since})')
        if not isinstance(heartbeat, (int, float)) or not 0.05 <= heartbeat <= 60:
            raise InvalidArgument('"heartbeat" must be a number of seconds between 0.05 and 60')
        return cls(view.lower(), since, until, float(heartbeat))


def open_stream(db: ivm.Database, sub: Subscription, stopping: threading.Event) -> fl.GeneratorStream:
    """The stream for ``sub``; bad views and offsets fail here, before streaming."""
    feed = Feed(db, sub.view, sub.since, sub.heartbeat)
    return fl.GeneratorStream(feed.schema, translated_stream(_stream(feed, sub, stopping)))


def _stream(feed: Feed, sub: Subscription, stopping: threading.Event) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """The feed's steps (the current rows, if any, then changes), through ``sub.until`` when given."""
    after = feed.start
    for step in feed.steps(stopping.is_set):
        rows, through = step.rows, step.through
        if step.snapshot:
            if rows.num_rows:
                yield from _chunks(rows, through)
            continue
        if sub.until is not None and through > sub.until:  # end exactly at "until": a resume from it repeats nothing
            rows = rows.filter(pc.less_equal(rows.column(OFFSET), sub.until))
            through = max(sub.until, after)  # (current rows read past "until" were sent as they were)
        if rows.num_rows:
            yield from _chunks(rows, through)
        else:
            yield _empty(rows.schema), _through(through)
        if sub.until is not None and through >= sub.until:
            return
        after = through


def _chunks(rows: pa.Table, through: int) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """Batches of about CHUNK_ROWS rows, each ending where an offset ends."""
    offsets = rows.column(OFFSET).to_numpy()
    start = 0
    while start < rows.num_rows:
        end = min(start + CHUNK_ROWS, rows.num_rows)
        if end < rows.num_rows:  # extend to the end of the offset the chunk stops in
            end = int(offsets.searchsorted(offsets[end - 1], side="right"))
        done = through if end == rows.num_rows else int(offsets[end]) - 1
        for batch in rows.slice(start, end - start).combine_chunks().to_batches():
            yield batch, _through(done)
        start = end


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def _through(offset: int) -> bytes:
    return json.dumps({"through": offset}).encode()


