"""The Nexmark event generator (bench/nexmark.py): proportions, references, determinism."""

from __future__ import annotations

import duckdb

from bench import nexmark


def test_proportions_references_and_time():
    people, auctions, bids = nexmark.generate(50_000)
    assert (people.num_rows, auctions.num_rows, bids.num_rows) == (1_000, 3_000, 46_000)
    con = duckdb.connect()
    con.register("person", people)
    con.register("auction", auctions)
    con.register("bid", bids)
    # Ids are unique; every bid names an auction and a person that exist; sellers exist.
    assert con.execute("SELECT COUNT(DISTINCT id) FROM person").fetchone()[0] == 1_000
    assert con.execute("SELECT COUNT(DISTINCT id) FROM auction").fetchone()[0] == 3_000
    assert con.execute("SELECT COUNT(*) FROM bid WHERE auction NOT IN (SELECT id FROM auction)").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM bid WHERE bidder NOT IN (SELECT id FROM person)").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM auction WHERE seller NOT IN (SELECT id FROM person)").fetchone()[0] == 0
    # Hot auctions: about half of the bids go to an even (hot) auction id; prices span 1 .. 10^8 cents.
    hot = con.execute("SELECT AVG(CASE WHEN auction % 2 = 0 THEN 1 ELSE 0 END) FROM bid").fetchone()[0]
    assert 0.7 < hot < 0.8  # 1/2 hot, and half of the other half is even too
    low, high = con.execute("SELECT MIN(price), MAX(price) FROM bid").fetchone()
    assert 100 <= low and high <= 100_000_000
    # Event time moves forward at the rate: 50,000 events at 10,000/s span 5 seconds.
    span = con.execute("SELECT MAX(date_time) - MIN(date_time) FROM bid").fetchone()[0]
    assert 4.9 < span.total_seconds() <= 5.0
    assert con.execute("SELECT COUNT(*) FROM auction WHERE expires <= date_time").fetchone()[0] == 0


def test_deterministic_and_continuing():
    first = nexmark.generate(1_000, seed=3)
    assert all(a.equals(b) for a, b in zip(first, nexmark.generate(1_000, seed=3)))
    people, auctions, _ = nexmark.generate(1_000, first_event=1_000, seed=3)
    assert people.column("id")[0].as_py() == nexmark.FIRST_PERSON_ID + 20
    assert auctions.column("id")[0].as_py() == nexmark.FIRST_AUCTION_ID + 60


def test_doctest():
    import doctest

    assert doctest.testmod(nexmark).failed == 0
