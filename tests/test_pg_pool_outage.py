"""storage/pg.py when PostgreSQL ends its connections (issue 46): a statement of a tree's insert or a
read never fails because the connection it was given had been killed while idle, never runs twice,
and a connection that died under it is never lent again.

Why a relay: a backend killed with pg_terminate_backend (or by a restart) sends its last words, a
FATAL error, and closes its socket. asyncpg reads the error first: read while no operation runs, it
leaves the protocol refusing the next statement before sending it ("cannot switch to state 12;
another operation (2) is in progress"); only a loop turn or two later does it see the socket
closed. A pooled connection taken in between failed a `tasks.create` with -32603 about one restart
in four (tests/test_database_outage_pg.py). `HoldingRelay` stands between the client and the
server and holds that moment open: it passes the server's last bytes on and keeps the client's
side of the socket open until `release`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from taskgrove.storage.outage import UNAVAILABLE, recognise
from taskgrove.storage.pg import PgPool, ReadPool
from tests.conftest import POSTGRES_URL, postgres_database, terminate_backend
from tests.deadlines import EVENT_WAIT

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")

PID = "SELECT pg_backend_pid()"


class HoldingRelay:
    """A TCP relay to PostgreSQL: when the server ends a connection, its last bytes reach the
    client and its end does not (until `release`)."""

    def __init__(self, url: str) -> None:
        self._target = urlsplit(url)
        self.ended = asyncio.Event()  # the server ended a relayed connection
        self._held: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> "HoldingRelay":
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._target.netloc.rpartition("@")[0] + "@" if "@" in self._target.netloc else ""
        self.url = urlunsplit(self._target._replace(netloc=f"{netloc}127.0.0.1:{port}"))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.release()
        assert self._server is not None
        self._server.close()

    def release(self) -> None:
        for writer in self._held:
            writer.close()
        self._held.clear()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self._target.hostname, self._target.port or 5432)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except ConnectionError:
                pass

        async def upstream() -> None:
            await pipe(client_r, server_w)
            server_w.close()
            client_w.close()  # the client left: nothing to hold

        up = asyncio.create_task(upstream())
        await pipe(server_r, client_w)
        if up.done():
            return
        up.cancel()
        server_w.close()
        self._held.append(client_w)
        self.ended.set()


async def kill_while_idle(relay: HoldingRelay, pid: int) -> None:
    """End backend `pid` and return once the client has read its last words (not its end)."""
    relay.ended.clear()
    await terminate_backend(pid, wait_ms=10_000)
    await asyncio.wait_for(relay.ended.wait(), EVENT_WAIT)
    # The relay wrote the server's FATAL error to a loopback socket: it is readable at once, and
    # the client reads it at the next turn of this loop.
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with postgres_database() as url:
        admin = await asyncpg.connect(url)
        try:
            await admin.execute("CREATE TABLE written (n int)")
        finally:
            await admin.close()
        yield url


async def written(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM written"))
    finally:
        await conn.close()


async def test_the_relay_holds_the_moment_a_pooled_connection_was_caught_in(database: str) -> None:
    """What the pool must cope with, shown on a plain asyncpg connection: killed while idle, its
    next statement is refused before it is sent, while the connection still says it is open."""
    async with HoldingRelay(database) as relay:
        conn = await asyncpg.connect(relay.url)
        try:
            await kill_while_idle(relay, await conn.fetchval(PID))
            assert not conn.is_closed()
            with pytest.raises(asyncpg.exceptions.InternalClientError, match="another operation"):
                await conn.fetchval("INSERT INTO written VALUES (1) RETURNING n")
        finally:
            conn.terminate()
    assert await written(database) == 0


async def test_a_write_on_a_connection_killed_while_idle_runs_once_on_another(database: str) -> None:
    async with HoldingRelay(database) as relay:
        opened: list[asyncpg.Connection] = []

        async def connect() -> asyncpg.Connection:
            opened.append(await asyncpg.connect(relay.url))
            return opened[-1]

        reads = ReadPool(connect, 2)
        try:
            first = await reads.run(PID, lambda conn: conn.fetchval(PID))
            await kill_while_idle(relay, first)
            sql = "INSERT INTO written VALUES (1) RETURNING pg_backend_pid()"
            second = await reads.run(sql, lambda conn: conn.fetchval(sql))
            assert second != first
            assert opened[0].is_closed() and len(opened) == 2  # dropped, never lent again
            assert await reads.run(PID, lambda conn: conn.fetchval(PID)) == second
        finally:
            await reads.close()
    assert await written(database) == 1


async def test_every_pooled_connection_killed_while_idle_none_fails_a_caller(database: str) -> None:
    """A restart or a kill of every backend: each connection the pool holds is refused once, the
    statement ends on a new one."""
    async with HoldingRelay(database) as relay:
        reads = ReadPool(lambda: asyncpg.connect(relay.url), 3)
        try:
            pids = set(await asyncio.gather(*(reads.run(PID, lambda conn: conn.fetchval(f"{PID} FROM pg_sleep(0.1)"))
                                              for _ in range(3))))
            assert len(pids) == 3
            for pid in pids:
                await kill_while_idle(relay, pid)
            sql = "INSERT INTO written VALUES (1) RETURNING pg_backend_pid()"
            assert await reads.run(sql, lambda conn: conn.fetchval(sql)) not in pids
        finally:
            await reads.close()
    assert await written(database) == 1


async def test_a_statement_cut_off_after_it_was_sent_is_not_run_again(database: str) -> None:
    """Killed mid-statement: it may have been applied (here it was not: rolled back), so it is
    raised as the connection lost, which storage/outage.py reads as the database unavailable."""
    reads = ReadPool(lambda: asyncpg.connect(database), 2)
    calls = 0
    sql = "INSERT INTO written SELECT 1 FROM pg_sleep(30)"

    async def write(conn: asyncpg.Connection) -> None:
        nonlocal calls
        calls += 1
        await conn.execute(sql)

    async def kill_when_running() -> None:
        admin = await asyncpg.connect(database)
        try:
            while (pid := await admin.fetchval("SELECT pid FROM pg_stat_activity WHERE query = $1", sql)) is None:
                await asyncio.sleep(0.05)
        finally:
            await admin.close()
        await terminate_backend(pid)

    try:
        killer = asyncio.create_task(kill_when_running())
        with pytest.raises(OperationalError) as raised:
            await reads.run(sql, write)
        await killer
        assert raised.value.connection_invalidated and calls == 1
        outage = recognise(raised.value)
        assert outage is not None and outage.reason == UNAVAILABLE
        assert await reads.run(PID, lambda conn: conn.fetchval(PID)) > 0
    finally:
        await reads.close()
    assert await written(database) == 0


async def test_a_bad_argument_is_raised_as_it_came_and_not_tried_again(database: str) -> None:
    reads = ReadPool(lambda: asyncpg.connect(database), 2)
    calls = 0

    async def bad(conn: asyncpg.Connection) -> None:
        nonlocal calls
        calls += 1
        await conn.fetchval("SELECT $1::int", "not a number")

    try:
        with pytest.raises(asyncpg.exceptions.DataError):
            await reads.run("SELECT $1::int", bad)
        assert calls == 1
    finally:
        await reads.close()


async def test_the_insert_the_reads_and_the_pass_carry_on_over_connections_killed_while_idle(database: str) -> None:
    """PgPool, as the repository uses it: a tree's insert (`value`), a read (`rows`) and an engine
    pass (`fetchmany`, on its own connection) each meet a connection killed while idle."""
    async with HoldingRelay(database) as relay:
        engine = create_async_engine(relay.url.replace("postgresql://", "postgresql+asyncpg://", 1))
        pg = PgPool(engine)
        try:
            pass_sql = "SELECT pg_backend_pid() + 0 * $1::int AS pid"
            passer = (await pg.fetchmany(pass_sql, [(0,)]))[0]["pid"]
            reader = await pg.value(PID, ())
            await kill_while_idle(relay, passer)
            await kill_while_idle(relay, reader)
            assert (await pg.fetchmany(pass_sql, [(0,)]))[0]["pid"] != passer
            assert await pg.value("INSERT INTO written VALUES (1) RETURNING n", ()) == 1
            reader2 = await pg.value(PID, ())
            await kill_while_idle(relay, reader2)
            assert await pg.rows("SELECT count(*) AS n FROM written", ()) == [{"n": 1}]
        finally:
            await pg.close()
            await engine.dispose()
    assert await written(database) == 1
