"""Where a statement runs: which connection, on which thread.

TaskRepository decides which statement runs (storage/statements.py, storage/executions.py);
this module decides where, and each path exists for a measured reason (bench/README.md):

- a caller's transaction (`conn`): the statement runs inside it, through the async engine, so
  that operations compose;
- SQLite, a new transaction: on one dedicated database thread with a synchronous engine, so a
  whole batch of engine writes costs one thread hop instead of one per statement;
- SQLite, an `inline` transaction (an engine pass of a few rows): on the event loop's own thread
  when the database thread is idle and no lock is held elsewhere (run_here), because the thread
  hop costs several times what SQLite takes for it;
- SQLite, a read outside a transaction: plain sqlite3 through storage/sqlite_reader.py on the
  calling thread (or behind the database thread's queue, see read): SQLAlchemy's execution
  layer costs about five times the indexed lookup, the thread hop more;
- PostgreSQL, a new transaction: the async engine (asyncpg under SQLAlchemy); a read outside a
  transaction in autocommit, and the hot reads and the engine's pass through plain asyncpg
  (storage/pg.py), which saves SQLAlchemy's 0.4 ms a statement.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskgrove.storage.outage import DatabaseHealth, recognise
from taskgrove.storage.sqlite_reader import SqliteReader
from taskgrove.storage.statements import Statement

log = logging.getLogger(__name__)
Row = dict[str, Any]


def is_transient(exc: BaseException) -> bool:
    """Errors a retry may cure: a busy or locked database, a lost connection, or an outage
    (storage/outage.py: unreachable, full, read-only, in any driver's words)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if recognise(exc) is not None:
        return True
    return isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, OSError, TimeoutError))
# Commits on the loop's thread between two WAL checkpoints on the database thread: about what
# SQLite's own automatic checkpoint (1000 pages) would see, at a few pages a commit.
CHECKPOINT_EVERY = 300


def _commit(sync_conn: Connection) -> None:
    """Commit what `sync_conn` did (SQLite). Statements run on the driver's own connection (an
    engine pass) leave SQLAlchemy's connection outside any transaction of its own: sqlite3 began
    one implicitly at the first write, and its commit is all SQLAlchemy's would do (pysqlite's
    BEGIN and COMMIT are the driver's; no connection events are listened to), without the
    transaction object and the dozen and a half Python calls around it (a chain link's every
    pass). A statement run through SQLAlchemy began its transaction there: committed there.
    A failed commit is raised as SQLAlchemy raises it (its DBAPIError kinds: is_transient)."""
    if sync_conn.in_transaction():
        sync_conn.commit()
        return
    try:
        sync_conn.connection.driver_connection.commit()
    except sqlite3.Error as exc:
        raise DBAPIError.instance(None, None, exc, sqlite3.Error, dialect=sync_conn.dialect) from exc


def _roll_back(sync_conn: Connection) -> None:
    """Undo what `sync_conn` did after an error, whichever of the two began it (see _commit)."""
    if sync_conn.in_transaction():
        sync_conn.rollback()
    if not sync_conn.closed and not sync_conn.invalidated:
        sync_conn.connection.driver_connection.rollback()


class Connections:
    """The engines, threads and plain connections a repository runs its statements on."""

    def __init__(self, engine: AsyncEngine, batch_engine: Engine | None = None,
                 loop_engine: Engine | None = None) -> None:
        self.engine = engine
        # SQLite only: a synchronous engine driven from one worker thread, so a whole batch of
        # engine writes costs one thread hop instead of one per statement (TaskRepository.write_pass).
        self._batch_engine = batch_engine
        self._batch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskgrove-db") \
            if batch_engine is not None else None
        # What the database did lately (storage/outage.py): answers and outages, for readiness,
        # /metrics and the engine's loops. `answered_at` is its last answer.
        self.health = DatabaseHealth()
        # Statements that do not pass through this class (the a2a-sdk's stores on the same
        # engine) report their outages too: SQLAlchemy calls handle_error on every driver error.
        event.listen(engine.sync_engine, "handle_error", self._driver_error)
        # SQLite on a file: reads go through plain sqlite3 connections of their own (see read).
        self.reader = SqliteReader.for_engine(batch_engine) if batch_engine is not None else None
        # Operations sent to the database thread whose caller has not resumed yet (see read).
        self._queued = 0
        # SQLite on a file: the same file with no busy wait, for small transactions run on the
        # event loop's own thread (see run_here). Not for in-memory databases, which another
        # connection would not see.
        self._loop_engine = loop_engine if self.reader is not None else None
        if loop_engine is not None and self._loop_engine is None:
            loop_engine.dispose()
        # Its connection per thread, kept open: a pool checkout per pass costs as much as the pass.
        self._loop_connections: dict[int, Connection] = {}
        # Commits there since the database thread last checkpointed the WAL (see _checkpoint_later).
        self._loop_commits = 0
        self._checkpointing = False
        # PostgreSQL: the engine's passes and the hot reads through plain asyncpg (storage/pg.py,
        # loaded only then: SQLite needs neither it nor asyncpg).
        self.pg: Any = None
        if engine.dialect.name == "postgresql":
            from taskgrove.storage import pg

            self.pg = pg.PgPool(engine)
            event.listen(engine.sync_engine.pool, "checkout", pg.closed_on_checkout)

    def _driver_error(self, context: Any) -> None:
        self.health.failed(context.original_exception)

    @property
    def answered_at(self) -> float:
        """When an operation of ours last got an answer (monotonic): proof the database answers."""
        return self.health.answered_at

    @answered_at.setter
    def answered_at(self, at: float) -> None:
        self.health.answered(at)

    async def transact(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None,
                       inline: bool = False) -> Any:
        """Run `fn` (see _transact); an outage it meets is remembered (self.health)."""
        try:
            return await self._transact(fn, *args, conn=conn, inline=inline)
        except Exception as exc:
            self.health.failed(exc)
            raise

    async def _transact(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None,
                        inline: bool = False) -> Any:
        """Run `fn(sync_connection, *args)` in the caller's transaction or a new one.

        Every statement is written once, as a plain synchronous function. On SQLite a new
        transaction runs on the dedicated database thread (one thread hop per operation instead
        of one per statement), or for an `inline` one (a few rows) on the event loop's thread when it can
        (run_here); on PostgreSQL and inside a caller's transaction it runs through the async
        driver.
        """
        if conn is not None:
            return await conn.run_sync(fn, *args)
        if inline and self._loop_engine is not None and not self._queued:
            done, result = self.run_here(fn, args)
            if done:
                self.answered_at = time.monotonic()
                return result
        if self._batch_engine is not None:
            engine = self._batch_engine

            def in_thread() -> Any:
                with engine.begin() as sync_conn:
                    return fn(sync_conn, *args)

            self._queued += 1
            try:
                result = await asyncio.get_running_loop().run_in_executor(self._batch_thread, in_thread)
            finally:
                self._queued -= 1
        else:
            result = await self._transaction(fn, args)
        self.answered_at = time.monotonic()
        return result

    async def _transaction(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """`fn` in a transaction of the async engine. One whose connection was lost before its
        commit was sent (a backend killed with pg_terminate_backend while it ran) is run once
        more on a fresh connection: nothing of it was stored, the server rolls back a
        transaction whose connection ends. A loss at the commit itself is raised (it may have
        been stored: the caller resends with the same ids)."""
        for attempt in (1, 2):
            committing = False
            try:
                async with self.engine.begin() as async_conn:
                    result = await async_conn.run_sync(fn, *args)
                    committing = True
                return result
            except DBAPIError as exc:
                if attempt == 2 or committing or not exc.connection_invalidated:
                    raise
        raise AssertionError("unreachable")

    def run_here(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[bool, Any]:
        """Run a small transaction on the calling (event loop's) thread: (True, its result), or
        (False, None) when the database is locked by another connection.

        Why: handing a transaction to the database thread and resuming after it costs two thread
        wake-ups and a GIL hand-over each way, several times what an engine pass of a few rows
        costs SQLite itself; a 1000-task chain is 1000 such passes (bench/README.md).

        Guarantees kept: it runs only when the database thread has nothing of ours in flight
        (the caller checks `_queued`), so it is ordered after everything sent there, as reads
        are (see read). It never waits on the event loop: its connection has no busy timeout,
        so a write lock held elsewhere (a transaction of the async engine, another process)
        fails it at once, rolled back whole, and the caller sends it to the database thread,
        which waits as it always did. Any other error is raised as the thread would raise it.
        """
        sync_conn = self._loop_connection()
        try:
            result = fn(sync_conn, *args)
            _commit(sync_conn)
        except BaseException as exc:
            _roll_back(sync_conn)
            if isinstance(exc, (sqlite3.OperationalError, OperationalError)) and "locked" in str(exc):
                return False, None
            raise
        self._loop_commits += 1
        if self._loop_commits >= CHECKPOINT_EVERY and not self._checkpointing:
            self._checkpoint_later()
        return True, result

    def _checkpoint_later(self) -> None:
        """Copy the WAL into the database file on the database thread (a PASSIVE checkpoint: it
        never blocks a writer). Commits on the loop's thread never checkpoint (create_loop_engine),
        so that the loop never waits for the copy and its fsync; without this the WAL would grow
        while only they commit."""
        assert self._batch_engine is not None and self._batch_thread is not None
        self._loop_commits = 0
        self._checkpointing = True
        engine = self._batch_engine

        def checkpoint() -> None:
            with engine.connect() as sync_conn:
                sync_conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

        def done(future: Any) -> None:
            self._checkpointing = False
            if not future.cancelled() and future.exception() is not None:
                log.warning("WAL checkpoint failed: %s", future.exception())

        asyncio.get_running_loop().run_in_executor(self._batch_thread, checkpoint).add_done_callback(done)

    def _loop_connection(self) -> Connection:
        assert self._loop_engine is not None
        ident = threading.get_ident()  # the app's event loop; tests may run loops in other threads
        sync_conn = self._loop_connections.get(ident)
        if sync_conn is None or sync_conn.closed or sync_conn.invalidated:
            sync_conn = self._loop_connections[ident] = self._loop_engine.connect()
        return sync_conn

    async def autocommit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """PostgreSQL: `fn` on a connection in autocommit, for work that is one statement (a read
        the asyncpg path left to SQLAlchemy): no BEGIN and COMMIT round trips around it. Each
        statement sees what was committed when it began, as each statement of a READ COMMITTED
        transaction does."""
        for attempt in (1, 2):
            try:
                async with self.engine.connect() as async_conn:
                    autocommit = await async_conn.execution_options(isolation_level="AUTOCOMMIT")
                    result = await autocommit.run_sync(fn, *args)
                break
            except Exception as exc:
                if attempt == 1 and isinstance(exc, DBAPIError) and exc.connection_invalidated:
                    continue  # a read on a connection whose backend was killed: once more, on a fresh one
                self.health.failed(exc)
                raise
        self.answered_at = time.monotonic()
        return result

    async def read_run(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None) -> Any:
        """A read: in the caller's transaction if given, else in autocommit on PostgreSQL."""
        if conn is not None or self._batch_engine is not None:
            return await self.transact(fn, *args, conn=conn)
        return await self.autocommit(fn, *args)

    async def fast(self, statement: Statement, args: Sequence[Any]) -> list[Row] | None:
        """Rows of a read statement by the plain path; None: take the SQLAlchemy path."""
        if self.reader is not None:
            return await self.read(statement.sqlite, args)
        if self.pg is not None:
            try:
                found = await self.pg.rows(statement.postgresql, args)
            except Exception as exc:
                self.health.failed(exc)
                raise
            if found is not None:
                self.answered_at = time.monotonic()
            return found
        return None

    async def read(self, sql: str, args: Sequence[Any]) -> list[Row] | None:
        """Rows of a read statement through the SQLite reader; None: take the SQLAlchemy path.

        Read on the event loop's thread when the database thread has nothing of ours in
        flight. Otherwise on the database thread, behind what was sent there: a read must not
        see a write (a claim, an outcome) before its caller (the engine) has taken in the
        answer, or a task could show `in_progress` while `tasks.running.list` does not list it
        yet. The database thread answers in order, and each caller resumes before a later
        read's caller does, as with every read before this path existed.
        """
        assert self.reader is not None
        try:
            if self._queued:
                found = await asyncio.get_running_loop().run_in_executor(self._batch_thread, self.reader.rows,
                                                                         sql, args)
            else:
                found = self.reader.rows(sql, args)
        except Exception as exc:
            self.health.failed(exc)
            raise
        if found is not None:
            self.answered_at = time.monotonic()
        return found

    async def close(self) -> None:
        if self._batch_thread is not None:
            self._batch_thread.shutdown(wait=True)
        if self.reader is not None:  # after the thread: a read may have been running there
            self.reader.close()
        for connection in self._loop_connections.values():
            connection.close()
        self._loop_connections.clear()
        for sync_engine in (self._batch_engine, self._loop_engine):
            if sync_engine is not None:
                sync_engine.dispose()
        if self.pg is not None:
            await self.pg.close()
        await self.engine.dispose()
