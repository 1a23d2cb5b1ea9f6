"""The Nexmark queries as ivm views, and the stream tables they read: one registry.

Each query is written in our SQL (TUMBLE/HOP/SESSION in FROM, see docs/sql.md's
"Event streams" section) after the published versions (the Nexmark suites of
Apache Beam, Flink and RisingWave), over the generator's tables
(bench/nexmark.py). ``QUERIES`` maps a name to its view SQL and the tables it
reads; ``ivm bench nexmark`` and tests/test_nexmark.py run whatever is in it,
so a new query is one more entry. ``reference_sql`` is how DuckDB computes a query in batch.
"""

from __future__ import annotations

from dataclasses import dataclass

LATENESS = "INTERVAL '4' SECOND"
TABLES = {
    "person": ("id BIGINT, name VARCHAR, email VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, "
               "date_time TIMESTAMP, extra VARCHAR"),
    "auction": ("id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, "
                "date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR"),
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR",
}
GENERATED = ("person", "auction", "bid")  # the order of bench.nexmark.generate's tables


def stream_ddl(table: str) -> str:
    """The table as an event stream: APPEND ONLY, watermark 4 s behind its newest date_time."""
    return (f"CREATE TABLE {table} ({TABLES[table]}, WATERMARK FOR date_time AS date_time - {LATENESS}) "
            "APPEND ONLY")


def reference_ddl(table: str) -> str:
    """The same table, plain, for the DuckDB batch computation."""
    return f"CREATE TABLE {table} ({TABLES[table]})"


@dataclass(frozen=True)
class NexmarkQuery:
    name: str
    title: str
    sql: str
    tables: tuple[str, ...]
    options: str = ""  # WITH (...) of the CREATE MATERIALIZED VIEW, if any


QUERIES: dict[str, NexmarkQuery] = {}


def register(query: NexmarkQuery) -> None:
    QUERIES[query.name] = query


# q5, hot items: the auctions with the most bids in each 10 s window sliding by 2 s (RisingWave's form).
register(NexmarkQuery("q5", "hot items (HOP 10 s / 2 s, max bid count per window)", """
SELECT AuctionBids.auction, AuctionBids.num
FROM (SELECT auction, COUNT(*) AS num, window_start AS starttime
      FROM HOP(bid, date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
      GROUP BY window_start, auction) AS AuctionBids
JOIN (SELECT MAX(CountBids.num) AS maxn, CountBids.starttime_c
      FROM (SELECT COUNT(*) AS num, window_start AS starttime_c
            FROM HOP(bid, date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
            GROUP BY auction, window_start) AS CountBids
      GROUP BY CountBids.starttime_c) AS MaxBids
  ON AuctionBids.starttime = MaxBids.starttime_c AND AuctionBids.num >= MaxBids.maxn""", ("bid",)))

# q7, highest bid: the bids at the maximum price of each 10 s window, as published (a join on the price
# with a time range, not on the window).
register(NexmarkQuery("q7", "highest bid (TUMBLE 10 s, joined back on price and time)", """
SELECT b.auction, b.price, b.bidder, b.date_time
FROM bid b JOIN (SELECT MAX(price) AS maxprice, window_end AS date_time
                 FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) GROUP BY window_start, window_end) b1
  ON b.price = b1.maxprice
WHERE b.date_time >= b1.date_time - INTERVAL '10' SECOND AND b.date_time < b1.date_time""", ("bid",)))

# q11, user sessions: bids per bidder per session, sessions closing after 10 s without a bid (Flink's form,
# GROUP BY bidder, SESSION(date_time, INTERVAL '10' SECOND)).
register(NexmarkQuery("q11", "user sessions (SESSION 10 s per bidder, bids per session)", """
SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, window_end AS endtime
FROM SESSION(bid, date_time, INTERVAL '10' SECOND, bidder)
GROUP BY bidder, window_start, window_end""", ("bid",)))

# q8, monitor new users: people who opened an auction in the 10 s window they registered in (Beam's and
# Flink's form: person and auction each grouped by the tumbling window, joined on id = seller and window).
register(NexmarkQuery("q8", "monitor new users (person and auction by TUMBLE 10 s, joined on id = seller)", """
SELECT P.id, P.name, P.starttime
FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(person, date_time, INTERVAL '10' SECOND)
      GROUP BY id, name, window_start, window_end) P
JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
      FROM TUMBLE(auction, date_time, INTERVAL '10' SECOND)
      GROUP BY seller, window_start, window_end) A
  ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""", ("person", "auction")))


def reference_sql(query: NexmarkQuery, schema) -> str:
    """The query as DuckDB computes it in batch over the same tables: TUMBLE/HOP/SESSION expanded as the
    planner does (SESSION as gaps-and-islands SQL; tests/test_nexmark.py also checks q11 against an
    independent definition of sessions)."""
    from sql_frontend.statements import parse_query
    from sql_frontend.time_windows import expand_time_windows

    return expand_time_windows(parse_query(query.sql), schema).sql("duckdb")
