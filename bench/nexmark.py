"""Nexmark events: people, auctions and bids (the generator only; ``ivm bench nexmark`` needs issue 8).

    >>> people, auctions, bids = generate(5_000)
    >>> (people.num_rows, auctions.num_rows, bids.num_rows)
    (100, 300, 4600)

The parameters are those of the published benchmark (Tucker et al., "NEXMark
- A Benchmark for Queries over Data Streams", and the reference generator in
Apache Beam's ``org.apache.beam.sdk.nexmark.sources.generator``): events come
in epochs of 50 with person : auction : bid = 1 : 3 : 46; a bid goes to a
"hot" auction (the newest id that is a multiple of HOT_AUCTION_RATIO = 2) in
1 - 1/2 of the cases, otherwise to one of the last 100 auctions in flight;
bidders are hot (HOT_BIDDER_RATIO = 4) or one of the last 1,000 active
people; sellers likewise (HOT_SELLER_RATIO = 4); prices are 10^U(0,6) cents
(Beam's ``nextPrice``); events are spaced evenly at ``rate`` per second from
``start``. Everything is vectorised (numpy), deterministic for a seed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PERSON, AUCTION, BID = 1, 3, 46
PROPORTION = PERSON + AUCTION + BID
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID, NUM_CATEGORIES = 1000, 1000, 10, 5
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS = 1000, 100
AUCTION_LENGTH_MS = 10_000  # how long an auction stays open (event time)
US_STATES = np.array(["AZ", "CA", "ID", "OR", "WA", "WY"])
US_CITIES = np.array(["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
                      "Seattle", "Kent", "Cheyenne"])
FIRST_NAMES = np.array(["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"])
LAST_NAMES = np.array(["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"])
CHANNELS = np.array(["Google", "Facebook", "Baidu", "Apple"])


def _kinds(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    epoch, offset = np.divmod(ids, PROPORTION)
    return epoch, offset


def _last_person(epoch: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest person at each event (as Beam's lastBase0PersonId)."""
    return epoch * PERSON + np.minimum(offset, PERSON - 1)


def _last_auction(epoch: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest auction at each event (as Beam's lastBase0AuctionId)."""
    return np.maximum(epoch * AUCTION + np.clip(offset - PERSON, 0, AUCTION - 1), 0)


def _recent(rng: np.random.Generator, last: np.ndarray, window: int, hot_ratio: int) -> np.ndarray:
    """A hot id (the latest multiple of ``hot_ratio``) 1 - 1/hot_ratio of the time, else one of the last ``window``."""
    hot = (last // hot_ratio) * hot_ratio
    recent = last - rng.integers(0, window, size=len(last)) % (last + 1)
    return np.where(rng.integers(0, hot_ratio, size=len(last)) > 0, hot, recent)


def generate(events: int, first_event: int = 0, seed: int = 1, rate: int = 10_000,
             start: np.datetime64 = np.datetime64("2026-01-01T00:00:00", "ms")) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(person, auction, bid) tables for events ``first_event`` .. ``first_event + events - 1``."""
    rng = np.random.default_rng([seed, first_event])
    ids = np.arange(first_event, first_event + events, dtype=np.int64)
    epoch, offset = _kinds(ids)
    times = start + (ids * 1000 // rate).astype("timedelta64[ms]")
    is_person, is_auction = offset < PERSON, (offset >= PERSON) & (offset < PERSON + AUCTION)
    is_bid = ~(is_person | is_auction)
    return (_people(rng, epoch[is_person], offset[is_person], times[is_person]),
            _auctions(rng, epoch[is_auction], offset[is_auction], times[is_auction]),
            _bids(rng, epoch[is_bid], offset[is_bid], times[is_bid]))


def _people(rng, epoch, offset, times) -> pa.Table:  # noqa: ANN001
    n = len(epoch)
    ids = FIRST_PERSON_ID + _last_person(epoch, offset)
    first, last = rng.choice(FIRST_NAMES, n), rng.choice(LAST_NAMES, n)
    names = np.char.add(np.char.add(first, " "), last)
    return pa.table({
        "id": ids, "name": names, "email": np.char.add(np.char.lower(np.char.add(first, last)), "@example.com"),
        "credit_card": _joined([np.char.zfill(rng.integers(0, 10_000, n).astype(str), 4) for _ in range(4)], " "),
        "city": rng.choice(US_CITIES, n), "state": rng.choice(US_STATES, n),
        "date_time": pa.array(times, pa.timestamp("ms")), "extra": np.full(n, ""),
    })


def _auctions(rng, epoch, offset, times) -> pa.Table:  # noqa: ANN001
    n = len(epoch)
    ids = FIRST_AUCTION_ID + _last_auction(epoch, offset)
    initial = np.round(10 ** (rng.random(n) * 6) * 100).astype(np.int64)
    seller = FIRST_PERSON_ID + _recent(rng, _last_person(epoch, offset), NUM_ACTIVE_PEOPLE, HOT_SELLER_RATIO)
    return pa.table({
        "id": ids, "item_name": _joined([np.full(n, "item"), ids.astype(str)], "-"), "description": np.full(n, "an item for sale"),
        "initial_bid": initial, "reserve": initial + np.round(10 ** (rng.random(n) * 6) * 100).astype(np.int64),
        "date_time": pa.array(times, pa.timestamp("ms")),
        "expires": pa.array(times + np.timedelta64(AUCTION_LENGTH_MS, "ms"), pa.timestamp("ms")),
        "seller": seller, "category": FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n), "extra": np.full(n, ""),
    })


def _bids(rng, epoch, offset, times) -> pa.Table:  # noqa: ANN001
    n = len(epoch)
    auction = FIRST_AUCTION_ID + _recent(rng, _last_auction(epoch, offset), NUM_IN_FLIGHT_AUCTIONS, HOT_AUCTION_RATIO)
    bidder = FIRST_PERSON_ID + _recent(rng, _last_person(epoch, offset), NUM_ACTIVE_PEOPLE, HOT_BIDDER_RATIO)
    return pa.table({
        "auction": auction, "bidder": bidder, "price": np.round(10 ** (rng.random(n) * 6) * 100).astype(np.int64),
        "channel": rng.choice(CHANNELS, n), "url": _joined([np.full(n, "https://www.nexmark.com/item.htm?query=1&a"), auction.astype(str)], "="),
        "date_time": pa.array(times, pa.timestamp("ms")), "extra": np.full(n, ""),
    })


def _joined(parts: list[np.ndarray], separator: str) -> pa.Array:
    return pc.binary_join_element_wise(*[pa.array(p, pa.string()) for p in parts], separator)
