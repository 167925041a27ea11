"""PostgreSQL through plain asyncpg: the engine's passes and the hot reads.

SQLAlchemy's execution layer costs about 0.4 ms around each statement on asyncpg, more than
PostgreSQL takes to run an engine pass or an indexed read. These statements go to asyncpg
directly instead, as plain prepared statements: the PostgreSQL forms of storage/statements.py,
the same text the SQLAlchemy path runs (`exec_driver_sql`), so there is one text per statement.

They run on connections of their own, outside any transaction (autocommit, as the SQLAlchemy
reads and the engine's one-statement pass did), which decode JSON with the engine's
deserializer, as SQLAlchemy's do, so a row is the same dict the SQLAlchemy path returns.

- The engine's passes run on one connection: one pass runs at a time per instance, and a pass
  pays no pool acquire. It plans every statement once, generically (`plan_cache_mode`), which
  the pass statement is written for: every row it touches is found through an index that stays
  right however the table grows (storage/executions.py); the connection's `PASS_SETTINGS` keep
  the planner from reading a whole table or index instead, which a plan made while the table
  was small would do for every pass once it has grown. Its errors come out as SQLAlchemy's, a
  lost connection as an OperationalError, so the engine retries what it always retried.
- Reads use a small pool of their own (`ReadPool`), not SQLAlchemy's: a burst of reads waits
  for one of its connections, where SQLAlchemy's pool would open overflow connections and close
  them again (a connection per request under load). Its connections are not reset when given
  back (no session state is ever set on them): the reset would cost a round trip per read. A read
  that fails returns None and takes the SQLAlchemy path, which raises what it always did. A new
  tree's insert (one statement, `value`) uses the same pool; its failure is raised.
- A connection the server ended while nobody used it (pg_terminate_backend, a restart) may be
  taken before asyncpg has seen its socket close: it read the server's last words (a FATAL
  error) while idle, which leaves its protocol refusing the next statement before sending it
  (InternalClientError "another operation is in progress"). A statement refused so, or cut off
  before it was sent to run, runs again on another connection (`ReadPool.run`, and the pass
  connection once reopened): nothing of it reached the server.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskgrove.storage.jsonvalues import read_stored

POOL_SIZE = 4
# The pass connection plans each statement once, generically, and must find rows by key only.
# No sequential scan and no merge join (whose sorted input is a whole index): a plan made while
# the table was small would pick them and keep them, paying for the whole table on every pass.
# No bitmap scan: a plain index scan marks the dead index entries of updated rows as it meets
# them, a bitmap scan does not, so every pass would step over more of them. Nothing else runs on
# that connection.
PASS_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "enable_bitmapscan": "off",
                 "enable_mergejoin": "off"}
# Server errors that say the connection, not the statement, is gone: a cut (class 08), or the
# server shutting it down or cancelling it (class 57: pg_terminate_backend, a restart, a failover).
_LOST = (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)
# A pass normally takes milliseconds; one that gets no answer for this long is on a dead connection.
PASS_TIMEOUT_SECONDS = 30.0
T = TypeVar("T")


def _still_usable(conn: asyncpg.Connection, exc: BaseException) -> bool:
    """Whether `conn` may run another statement after `exc`: only after the server's own error
    about a statement (autocommit: nothing is left open). After anything else (a cut, a cancel
    mid-statement, a timeout) nobody knows the protocol's state."""
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(exc, _LOST) and not conn.is_closed()


def _sent(conn: asyncpg.Connection) -> int:
    """How many statements `conn` has sent to run (asyncpg's own count, the one its Pool reads for
    `max_queries`): the same before and after a failed call means nothing of it ran. -1 once
    asyncpg has let go of the protocol (terminated): nobody can say then."""
    protocol = conn._protocol
    return -1 if protocol is None else int(protocol.queries_count)


def closed_on_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pool checkout event: a connection whose backend is gone (killed with
    pg_terminate_backend, a restart) is replaced before it is used, at no round trip (asyncpg
    saw its socket close), instead of failing the request that took it."""
    inner = getattr(dbapi_conn, "_connection", None)
    if inner is not None and inner.is_closed():
        raise DisconnectionError("the connection's backend is gone")


async def _setup(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("json", encoder=str, decoder=read_stored, schema="pg_catalog")


class ReadPool:
    """At most `size` asyncpg connections, each lent to one caller at a time, opened when first needed.

    asyncpg's own Pool cost 40-55 us of CPU around every use here (it spawns a task to give a
    connection back, rearms a timer for idle connections and runs timeouts), more than an indexed
    read costs PostgreSQL; a use here is a pop and an append. After an error a connection comes
    back only if `_still_usable`; otherwise it is terminated and a new one opened when next
    needed. One the server closed meanwhile is noticed when it is next taken, or, its close not
    read yet, when it refuses the next statement (`run` then runs it on another).
    """

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: list[asyncpg.Connection] = []
        self._opened: set[asyncpg.Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()

    async def run(self, sql: str, operation: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`operation(conn)` (one statement, `sql`) on a lent connection.

        A connection found dead before `operation` sent anything to run (see the module's
        docstring: killed while idle, its end not seen yet) is dropped and `operation` runs on
        another, at most once for each connection the pool can hold and once more: each try drops
        one connection that was open before. Any other failure is raised as it came, except that
        one which left its connection dead after the statement was sent is raised as a lost
        connection (OperationalError, connection_invalidated: storage/outage.py reads it as the
        database unavailable): whether it ran is unknown, so it is not run again here.
        """
        failure: Exception | None = None
        for _ in range(self._size + 1):
            conn = await self._take()
            sent = _sent(conn)
            try:
                result = await operation(conn)
            except Exception as exc:
                usable = _still_usable(conn, exc)
                dead = not usable and conn.is_closed()  # closed by the server, or aborted by asyncpg
                unsent = _sent(conn) == sent
                self._give_back(conn, usable=usable)
                if not dead:
                    raise  # the statement's own error, or the call's (a bad argument): not the connection's
                if not unsent:
                    raise OperationalError(sql, None, exc, connection_invalidated=True) from exc
                failure = exc
                continue
            except BaseException:
                self._give_back(conn, usable=False)  # a cancel: whatever it left is unknown
                raise
            self._give_back(conn, usable=True)
            return result
        assert failure is not None
        raise OperationalError(sql, None, failure, connection_invalidated=True) from failure

    async def _take(self) -> asyncpg.Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
            self._opened.discard(conn)
        if len(self._opened) + self._opening < self._size:
            return await self._open()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over as the wait was cancelled: pass it on
                self._hand_over(waiter.result())
            raise
        return handed if handed is not None else await self._take()  # None: a place to open one

    async def _open(self) -> asyncpg.Connection:
        self._opening += 1
        try:
            conn = await self._connect()
        except BaseException:
            self._opening -= 1
            self._hand_over(None)  # a caller waiting for a place may try in this one's
            raise
        self._opening -= 1
        self._opened.add(conn)
        return conn

    def _give_back(self, conn: asyncpg.Connection, usable: bool) -> None:
        if not usable or conn.is_closed():
            self._opened.discard(conn)
            conn.terminate()
            self._hand_over(None)
        else:
            self._hand_over(conn)

    def _hand_over(self, conn: asyncpg.Connection | None) -> None:
        """To the longest waiting caller (None: a place to open a connection in), else idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    async def close(self) -> None:
        """Close every connection, lent or idle (at shutdown)."""
        opened, self._opened, self._idle = self._opened, set(), []
        for conn in opened:
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()


class PgPool:
    """The pass connection and the read pool, each opened when first needed."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pool: ReadPool | None = None
        self._pass: asyncpg.Connection | None = None
        self._passing = asyncio.Lock()

    def _reads(self) -> ReadPool:
        if self._pool is None:
            cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)

            async def connect() -> asyncpg.Connection:
                conn = await asyncpg.connect(*cargs, **cparams)
                try:
                    await _setup(conn)
                except BaseException:
                    conn.terminate()
                    raise
                return conn

            self._pool = ReadPool(connect, POOL_SIZE)
        return self._pool

    async def _passes(self) -> asyncpg.Connection:
        if self._pass is None or self._pass.is_closed():
            cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)
            settings = {**cparams.pop("server_settings", {}), **PASS_SETTINGS}
            conn = await asyncpg.connect(*cargs, **cparams, server_settings=settings)
            await _setup(conn)
            self._pass = conn
        return self._pass

    async def fetchmany(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """`sql` once for each of `rows` (its arguments), in one round trip and one transaction.

        An error the server gives about the statement comes out as a DBAPIError on a connection
        that stays. Anything else (the connection cut, the server shutting it down, asyncpg's
        protocol left mid-operation by a cut or a cancel, no answer within PASS_TIMEOUT_SECONDS)
        leaves the connection in a state nobody can know: it is dropped, the next pass opens a
        new one, and the error comes out as a lost connection, which the engine retries.
        """
        async with self._passing:
            for attempt in (1, 2):
                conn = await self._passes_or_lost(sql)
                sent = _sent(conn)
                try:
                    return await conn.fetchmany(sql, rows, timeout=PASS_TIMEOUT_SECONDS)
                except BaseException as exc:
                    if _still_usable(conn, exc):
                        raise DBAPIError(sql, None, exc) from exc
                    # Dead before the pass was sent (killed while idle): once more on a new connection.
                    again = attempt == 1 and isinstance(exc, Exception) and conn.is_closed() and _sent(conn) == sent
                    lost = self._lost(conn, sql, exc)
                    if again:
                        continue
                    if isinstance(exc, Exception):
                        raise lost from exc
                    raise  # a cancel: the connection is dropped all the same
            raise AssertionError("unreachable")

    async def _passes_or_lost(self, sql: str) -> asyncpg.Connection:
        try:
            return await self._passes()
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise OperationalError(sql, None, exc, connection_invalidated=True) from exc

    def _lost(self, conn: asyncpg.Connection, sql: str, exc: BaseException) -> OperationalError:
        """Drop the pass connection (whatever state it is in); the error to raise instead."""
        if self._pass is conn:
            self._pass = None
        conn.terminate()
        return OperationalError(sql, None, exc, connection_invalidated=True)

    async def value(self, sql: str, args: Sequence[Any]) -> Any:
        """The one value of a statement that writes, run alone (autocommit) on a connection of
        the read pool: a new tree's insert, which through SQLAlchemy's transaction paid about as
        much again in the server's CPU and twice its wall time (bench/README.md, tenth round).
        Unlike `rows`, a failure is raised, never retried elsewhere, once the statement was sent
        (it may have been applied; ReadPool.run runs again only one that was not). A unique key
        taken comes out as SQLAlchemy's IntegrityError (what the SQLAlchemy path raises), a
        connection lost as an OperationalError (ReadPool.run), any other error as asyncpg raises it."""
        try:
            return await self._reads().run(sql, lambda conn: conn.fetchval(sql, *args))
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise IntegrityError(sql, None, exc) from exc

    async def rows(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]] | None:
        """The rows of a read (a statement's PostgreSQL form); None when it failed (the caller
        takes the SQLAlchemy path)."""
        try:
            found = await self._reads().run(sql, lambda conn: conn.fetch(sql, *args))
        except Exception:
            return None
        return [dict(record) for record in found]

    async def close(self) -> None:
        conn, self._pass = self._pass, None
        pool, self._pool = self._pool, None
        try:
            if conn is not None:
                await conn.close(timeout=2)
            if pool is not None:
                await pool.close()
        except Exception:
            if conn is not None:
                conn.terminate()
