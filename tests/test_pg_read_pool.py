"""storage/pg.py ReadPool, the few asyncpg connections the PostgreSQL reads and a create's insert
take turns on, against a real PostgreSQL: never more connections than its size however many
callers, each connection lent to one caller at a time, and a connection nobody can vouch for (a
statement cancelled midway, one the server closed) never lent again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from taskgrove.storage.pg import ReadPool
from tests.conftest import POSTGRES_URL, terminate_backend
from tests.deadlines import EVENT_WAIT

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")


@pytest.fixture
async def pool() -> AsyncIterator[tuple[ReadPool, list[asyncpg.Connection]]]:
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncpg.connect(POSTGRES_URL)
        opened.append(conn)
        return conn

    reads = ReadPool(connect, 3)
    yield reads, opened
    await reads.close()
    assert all(conn.is_closed() for conn in opened)


async def backend_of(reads: ReadPool, sleep: float = 0.0) -> int:
    sql = "SELECT pg_backend_pid() FROM pg_sleep($1)"
    return await reads.run(sql, lambda conn: conn.fetchval(sql, sleep))


async def test_many_callers_share_at_most_size_connections_one_caller_each(pool: tuple[ReadPool, list]) -> None:
    reads, opened = pool
    lent: set[int] = set()
    most = 0

    async def use(n: int) -> int:
        async def select(conn: asyncpg.Connection) -> int:
            nonlocal most
            assert id(conn) not in lent, "a connection lent to two callers at once"
            lent.add(id(conn))
            most = max(most, len(lent))
            try:
                return await conn.fetchval("SELECT $1::int FROM pg_sleep(0.02)", n)
            finally:
                lent.discard(id(conn))

        return await reads.run("SELECT $1::int FROM pg_sleep(0.02)", select)

    assert await asyncio.gather(*(use(n) for n in range(30))) == list(range(30))
    assert len(opened) == 3 and most == 3
    assert len({await backend_of(reads) for _ in range(10)}) == 1  # one at a time: the same idle one


async def test_a_statement_error_keeps_the_connection_anything_else_drops_it(pool: tuple[ReadPool, list]) -> None:
    reads, opened = pool
    first = await backend_of(reads)
    with pytest.raises(asyncpg.DivisionByZeroError):
        await reads.run("SELECT 1 / 0", lambda conn: conn.fetchval("SELECT 1 / 0"))
    assert await backend_of(reads) == first and len(opened) == 1

    async def failing(_conn: asyncpg.Connection) -> None:
        raise RuntimeError("the caller failed while holding it")

    with pytest.raises(RuntimeError):
        await reads.run("", failing)
    assert opened[0].is_closed()
    assert await backend_of(reads) != first and len(opened) == 2


async def test_a_statement_cancelled_midway_never_answers_the_next_caller(pool: tuple[ReadPool, list]) -> None:
    reads, opened = pool

    async def slow() -> None:
        sql = "SELECT 'stale' FROM pg_sleep(5)"
        await reads.run(sql, lambda conn: conn.fetchval(sql))

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert opened[0].is_closed()
    assert await reads.run("SELECT 'fresh'", lambda conn: conn.fetchval("SELECT 'fresh'")) == "fresh"
    assert len(opened) == 2


async def test_a_caller_cancelled_while_waiting_takes_no_connection_with_it(pool: tuple[ReadPool, list]) -> None:
    reads, opened = pool
    holders = [asyncio.create_task(backend_of(reads, 0.3)) for _ in range(3)]
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(backend_of(reads))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.gather(*holders)
    # all three are idle again: three callers at once get three different connections, no fourth
    assert len(set(await asyncio.gather(*(backend_of(reads, 0.05) for _ in range(3))))) == 3
    assert len(opened) == 3


async def test_a_connection_the_server_closed_while_idle_is_replaced(pool: tuple[ReadPool, list]) -> None:
    reads, opened = pool
    first = await backend_of(reads)
    await terminate_backend(first)
    await asyncio.sleep(0.3)
    assert await backend_of(reads) != first and len(opened) == 2


async def test_a_failed_open_frees_its_place(pool: tuple[ReadPool, list]) -> None:
    failures = 0

    async def connect() -> asyncpg.Connection:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise OSError("refused")
        return await asyncpg.connect(POSTGRES_URL)

    reads = ReadPool(connect, 1)
    try:
        for _ in range(2):
            with pytest.raises(OSError):
                await backend_of(reads)
        assert await backend_of(reads) > 0
    finally:
        await reads.close()


async def test_callers_waiting_for_a_place_are_not_stranded_when_opens_fail() -> None:
    """Two callers open (both fail, the database refusing), a third waits for a place: it is told
    when an open fails and tries itself, instead of waiting for a connection nobody will give back."""
    attempts = 0

    async def connect() -> asyncpg.Connection:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.05)
        raise OSError("refused")

    reads = ReadPool(connect, 2)
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(backend_of(reads) for _ in range(3)), return_exceptions=True), 5)
        assert [type(o) for o in outcomes] == [OSError] * 3 and attempts == 3
    finally:
        await reads.close()


async def test_a_place_handed_to_a_caller_cancelled_meanwhile_goes_to_the_next(pool: tuple[ReadPool, list]) -> None:
    """The one connection is dropped while two callers wait: the first is told to open one in its
    place and is cancelled before it runs again; the second must get the place, not wait for ever."""
    reads, _ = pool
    small = ReadPool(reads._connect, 1)
    waiters: list[asyncio.Task[int]] = []

    async def holding(_conn: asyncpg.Connection) -> None:
        waiters.extend([asyncio.create_task(backend_of(small)), asyncio.create_task(backend_of(small))])
        await asyncio.sleep(0.05)  # both wait for the one place
        raise RuntimeError("dropped: its state unknown")

    try:
        with pytest.raises(RuntimeError):
            await small.run("", holding)
        first, second = waiters
        first.cancel()  # no await since the drop: `first` holds the place and has not run
        assert await asyncio.wait_for(second, EVENT_WAIT) > 0
        with pytest.raises(asyncio.CancelledError):
            await first
    finally:
        await small.close()
