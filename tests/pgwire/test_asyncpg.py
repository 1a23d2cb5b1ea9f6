"""asyncpg (binary protocol throughout, its own codecs chosen from ParameterDescription/RowDescription)."""

from __future__ import annotations

import asyncio
import datetime
import decimal

import asyncpg
import pytest

TIMEOUT = 20


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


async def _connect(server):
    return await asyncpg.connect(host="127.0.0.1", port=server.pg_port, user="ivm", database="ivm",
                                 timeout=TIMEOUT, statement_cache_size=100)


def test_fetch_with_parameters_and_binary_codecs(server):
    async def go():
        conn = await _connect(server)
        try:
            await conn.execute("CREATE TABLE a (id BIGINT PRIMARY KEY, name TEXT, price DECIMAL(10, 2), "
                               "day DATE, at TIMESTAMP, ok BOOLEAN, score DOUBLE, n INTEGER)")
            await conn.executemany("INSERT INTO a VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", [
                (1, "x", decimal.Decimal("1.25"), datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4, 5),
                 True, 0.5, 7),
                (2, None, None, None, None, None, None, None)])
            rows = await conn.fetch("SELECT * FROM a WHERE id >= $1 ORDER BY id", 1)
            assert [tuple(r) for r in rows] == [
                (1, "x", decimal.Decimal("1.25"), datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4, 5),
                 True, 0.5, 7),
                (2, None, None, None, None, None, None, None)]
            assert await conn.fetchval("SELECT name FROM a WHERE id = $1 AND price = $2", 1,
                                       decimal.Decimal("1.25")) == "x"
            assert await conn.fetchval("SELECT count(*) FROM a WHERE day < $1", datetime.date(2030, 1, 1)) == 1
        finally:
            await conn.close()

    run(go())


def test_prepared_statement_and_cursor(server):
    async def go():
        conn = await _connect(server)
        try:
            await conn.execute("CREATE TABLE p (k BIGINT PRIMARY KEY, v TEXT)")
            await conn.execute("INSERT INTO p SELECT i, 'v' || i FROM (VALUES (1), (2), (3), (4), (5)) t(i)")
            statement = await conn.prepare("SELECT v FROM p WHERE k = $1")
            assert [await statement.fetchval(k) for k in (1, 3, 5)] == ["v1", "v3", "v5"]
            assert [a.name for a in statement.get_attributes()] == ["v"]
            async with conn.transaction():  # a cursor fetches in pieces: Execute with a row limit
                got = [r["k"] async for r in conn.cursor("SELECT k FROM p ORDER BY k", prefetch=2)]
            assert got == [1, 2, 3, 4, 5]
        finally:
            await conn.close()

    run(go())


def test_errors(server):
    async def go():
        conn = await _connect(server)
        try:
            with pytest.raises(asyncpg.UndefinedTableError):
                await conn.fetch("SELECT * FROM nowhere WHERE x = $1", 1)
            with pytest.raises(asyncpg.PostgresSyntaxError):
                await conn.fetch("SELEC 1")
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()

    run(go())


def test_lists_of_strings_are_text_arrays_in_binary(server):
    # asyncpg asks for binary results: a list of strings arrives as text[] in array_send format and decodes to a
    # list without a catalog query; a list of lists has no PostgreSQL array type here and stays text.
    async def go():
        conn = await _connect(server)
        try:
            row = await conn.fetchrow("SELECT ['x', 'y z', NULL] AS t, []::VARCHAR[] AS e, NULL::VARCHAR[] AS n, "
                                      "[[1], [2]] AS nested")
            assert tuple(row) == (["x", "y z", None], [], None, "{{1},{2}}")
        finally:
            await conn.close()

    run(go())


def test_list_columns_are_arrays_asyncpg_introspects(server):
    # int4[] (1007), int8[] (1016) and the other array OIDs are not built into asyncpg's codecs: it looks them up
    # with its own introspection query (WITH RECURSIVE over pg_type's typelem and typarray, pg_range,
    # current_setting('jit') and set_config), then decodes array_send with the element's codec.
    async def go():
        conn = await _connect(server)
        try:
            await conn.execute("CREATE TABLE lists (id BIGINT PRIMARY KEY, i INTEGER[], b BIGINT[], s VARCHAR[], "
                               "d DOUBLE[], p DECIMAL(10,2)[], day DATE[])")
            await conn.execute("INSERT INTO lists VALUES (1, [1, NULL, 3], [9007199254740993], ['a', 'b c'], [0.5], "
                               "[1.25], ['2024-01-02'::DATE]), (2, [], NULL, [NULL], [], [], [])")
            rows = await conn.fetch("SELECT i, b, s, d, p, day FROM lists ORDER BY id")
            assert [tuple(r) for r in rows] == [
                ([1, None, 3], [9007199254740993], ["a", "b c"], [0.5], [decimal.Decimal("1.25")],
                 [datetime.date(2024, 1, 2)]),
                ([], None, [None], [], [], [])]
            statement = await conn.prepare("SELECT i, b FROM lists WHERE id = $1")
            assert [a.type.name for a in statement.get_attributes()] == ["int4[]", "int8[]"]
            assert await statement.fetchrow(1) == ([1, None, 3], [9007199254740993])
            # the catalog says the same
            assert await conn.fetch("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                                    "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname = 'lists' AND a.attnum > 1 "
                                    "ORDER BY a.attnum") == [
                ("i", "integer[]"), ("b", "bigint[]"), ("s", "text[]"), ("d", "double precision[]"),
                ("p", "numeric(10,2)[]"), ("day", "date[]")]
        finally:
            await conn.close()

    run(go())
