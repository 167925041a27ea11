"""Every statement the service runs against the tasks table.

Reads return plain dicts (one per row, every column). Writes that change a task's status are
compare-and-set statements (`UPDATE ... WHERE status IN (...)`), so two instances, or a late
result racing a cancel, can never overwrite each other: the database decides who wins.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import JSON, String, bindparam, cast, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.processors import int_to_boolean
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskgrove.storage import executions
from taskgrove.storage import statements as S
from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.models import with_defaults

log = logging.getLogger(__name__)
Row = dict[str, Any]
_CHUNK = 500  # ids per IN (...) list: well below every backend's bound-parameter limit
# An engine pass with at most this many writes, claims and ends may run on the event loop's
# thread (TaskRepository._run_here): at a few tens of microseconds a row, it never holds the
# loop for long.
SMALL_PASS = 64
# Commits on the loop's thread between two WAL checkpoints on the database thread: about what
# SQLite's own automatic checkpoint (1000 pages) would see, at a few pages a commit.
CHECKPOINT_EVERY = 300


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]


class TaskRepository:
    def __init__(self, engine: AsyncEngine, batch_engine: Engine | None = None,
                 loop_engine: Engine | None = None) -> None:
        self.engine = engine
        # SQLite only: a synchronous engine driven from one worker thread, so a whole batch of
        # engine writes costs one thread hop instead of one per statement (see write_pass).
        self._batch_engine = batch_engine
        self._batch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskgrove-db") \
            if batch_engine is not None else None
        # When a transaction of ours last committed (monotonic): proof the database answers.
        self.answered_at = float("-inf")
        # SQLite on a file: reads go through plain sqlite3 connections of their own (see _read).
        self._reader = _SqliteReader.for_engine(batch_engine) if batch_engine is not None else None
        # Operations sent to the database thread whose caller has not resumed yet (see _read).
        self._queued = 0
        # SQLite on a file: the same file with no busy wait, for small transactions run on the
        # event loop's own thread (see _run_here). Not for in-memory databases, which another
        # connection would not see.
        self._loop_engine = loop_engine if self._reader is not None else None
        if loop_engine is not None and self._loop_engine is None:
            loop_engine.dispose()
        # Its connection per thread, kept open: a pool checkout per pass costs as much as the pass.
        self._loop_connections: dict[int, Connection] = {}
        # Commits there since the database thread last checkpointed the WAL (see _checkpoint_later).
        self._loop_commits = 0
        self._checkpointing = False
        # PostgreSQL: the engine's passes and the hot reads through plain asyncpg (storage/pg.py,
        # loaded only then: SQLite needs neither it nor asyncpg).
        self._pg: Any = None
        if engine.dialect.name == "postgresql":
            from taskgrove.storage import pg

            self._pg = pg.PgPool(engine)

    async def close(self) -> None:
        if self._batch_thread is not None:
            self._batch_thread.shutdown(wait=True)
        if self._reader is not None:  # after the thread: a read may have been running there
            self._reader.close()
        for connection in self._loop_connections.values():
            connection.close()
        self._loop_connections.clear()
        for sync_engine in (self._batch_engine, self._loop_engine):
            if sync_engine is not None:
                sync_engine.dispose()
        if self._pg is not None:
            await self._pg.close()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self, conn: AsyncConnection | None = None) -> AsyncIterator[AsyncConnection]:
        """A transaction, or the caller's one when `conn` is given (so operations compose)."""
        if conn is not None:
            yield conn
            return
        async with self.engine.begin() as new_conn:
            yield new_conn

    async def serialise_tree(self, task_id: str, conn: AsyncConnection) -> None:
        """Make the caller's transaction the only one changing `task_id`'s tree until it commits.

        A check that reads the tree and then writes it (no dependency cycle) is one decision only
        if nobody else decides meanwhile: two opposite `tasks.update` calls must not both see
        "no cycle". PostgreSQL: an advisory lock on the tree id, after which each statement sees
        what others committed. SQLite: a write first, which takes the one write lock before this
        transaction reads anything (so its reads are current). Called before any other statement
        of the transaction."""
        await conn.exec_driver_sql(S.SERIALISE_TREE.form(conn.dialect.name), (task_id,))

    async def run(self, fn: Callable[..., Any], *args: Any, small: bool = False) -> Any:
        """Run `fn(sync_connection, *args)` in a transaction of its own (storage/executions.py).
        `small`: a few rows, so it may run on the event loop's thread (see _run_here)."""
        return await self._run(fn, *args, small=small)

    async def _run(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None,
                   small: bool = False) -> Any:
        """Run `fn(sync_connection, *args)` in the caller's transaction or a new one.

        Every statement is written once, as a plain synchronous function. On SQLite a new
        transaction runs on the dedicated database thread (one thread hop per operation instead
        of one per statement), or for a `small` one on the event loop's thread when it can
        (_run_here); on PostgreSQL and inside a caller's transaction it runs through the async
        driver.
        """
        if conn is not None:
            return await conn.run_sync(fn, *args)
        if small and self._loop_engine is not None and not self._queued:
            done, result = self._run_here(fn, args)
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
            async with self.engine.begin() as async_conn:
                result = await async_conn.run_sync(fn, *args)
        self.answered_at = time.monotonic()
        return result

    def _run_here(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[bool, Any]:
        """Run a small transaction on the calling (event loop's) thread: (True, its result), or
        (False, None) when the database is locked by another connection.

        Why: handing a transaction to the database thread and resuming after it costs two thread
        wake-ups and a GIL hand-over each way, several times what an engine pass of a few rows
        costs SQLite itself; a 1000-task chain is 1000 such passes (bench/README.md).

        Guarantees kept: it runs only when the database thread has nothing of ours in flight
        (the caller checks `_queued`), so it is ordered after everything sent there, as reads
        are (see _read). It never waits on the event loop: its connection has no busy timeout,
        so a write lock held elsewhere (a transaction of the async engine, another process)
        fails it at once, rolled back whole, and the caller sends it to the database thread,
        which waits as it always did. Any other error is raised as the thread would raise it.
        """
        sync_conn = self._loop_connection()
        try:
            with sync_conn.begin():
                result = fn(sync_conn, *args)
        except (sqlite3.OperationalError, OperationalError) as exc:
            if "locked" not in str(exc):
                raise
            return False, None
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

    async def _autocommit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """PostgreSQL: `fn` on a connection in autocommit, for work that is one statement (a read
        the asyncpg path left to SQLAlchemy): no BEGIN and COMMIT round trips around it. Each statement sees what was committed
        when it began, as each statement of a READ COMMITTED transaction does."""
        async with self.engine.connect() as async_conn:
            autocommit = await async_conn.execution_options(isolation_level="AUTOCOMMIT")
            result = await autocommit.run_sync(fn, *args)
        self.answered_at = time.monotonic()
        return result

    async def _read_run(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None) -> Any:
        """A read: in the caller's transaction if given, else in autocommit on PostgreSQL."""
        if conn is not None or self._batch_engine is not None:
            return await self._run(fn, *args, conn=conn)
        return await self._autocommit(fn, *args)

    async def ping(self, fresh_within: float = 0.0) -> None:
        """Raise if the database does not answer; a transaction that committed within the last
        `fresh_within` seconds counts as an answer (health checks cost nothing under load)."""
        if time.monotonic() - self.answered_at < fresh_within:
            return
        await self._run(lambda c: c.execute(select(1)))

    # --- reads ----------------------------------------------------------------------------
    # A read outside a caller's transaction is one plain prepared statement: on SQLite (a file)
    # through _SqliteReader, decoded by SQLAlchemy's own column processors; on PostgreSQL through
    # asyncpg on a pooled connection (storage/pg.py). The same rows as the statements below, at a
    # fraction of the cost (see bench/README.md). Anything unusual (a busy database, an error, a
    # large SQLite result) takes the SQLAlchemy path, which behaves as it always did.

    async def _fast(self, statement: S.Statement, args: Sequence[Any]) -> list[Row] | None:
        """Rows of a read statement by the plain path; None: take the SQLAlchemy path."""
        if self._reader is not None:
            return await self._read(statement.sqlite, args)
        if self._pg is not None:
            found = await self._pg.rows(statement.postgresql, args)
            if found is not None:
                self.answered_at = time.monotonic()
            return found
        return None

    async def _read(self, sql: str, args: Sequence[Any]) -> list[Row] | None:
        """Rows of a read statement through the SQLite reader; None: take the SQLAlchemy path.

        Read on the event loop's thread when the database thread has nothing of ours in
        flight. Otherwise on the database thread, behind what was sent there: a read must not
        see a write (a claim, an outcome) before its caller (the engine) has taken in the
        answer, or a task could show `in_progress` while `tasks.running.list` does not list it
        yet. The database thread answers in order, and each caller resumes before a later
        read's caller does, as with every read before this path existed.
        """
        assert self._reader is not None
        if self._queued:
            found = await asyncio.get_running_loop().run_in_executor(self._batch_thread, self._reader.rows, sql, args)
        else:
            found = self._reader.rows(sql, args)
        if found is not None:
            self.answered_at = time.monotonic()
        return found

    async def get(self, task_id: str, conn: AsyncConnection | None = None) -> Row | None:
        if conn is None:
            found = await self._fast(S.TASK_BY_ID, (task_id,))
            if found is not None:
                return found[0] if found else None

        def op(c: Connection) -> Row | None:
            row = c.execute(select(T).where(T.c.id == task_id)).first()
            return dict(row._mapping) if row else None

        return await self._read_run(op, conn=conn)

    async def get_many(self, ids: Iterable[str], conn: AsyncConnection | None = None) -> dict[str, Row]:
        wanted = list(dict.fromkeys(ids))
        if conn is None and len(wanted) <= _CHUNK:
            found_rows = await self._fast(S.tasks_by_ids(len(wanted)), wanted) if wanted else []
            if found_rows is not None:
                return {row["id"]: row for row in found_rows}

        def op(c: Connection) -> dict[str, Row]:
            found: dict[str, Row] = {}
            for chunk in _chunks(wanted):
                for row in c.execute(select(T).where(T.c.id.in_(chunk))):
                    found[row.id] = dict(row._mapping)
            return found

        return await self._read_run(op, conn=conn)

    async def tree(self, tree_id: str, conn: AsyncConnection | None = None) -> list[Row]:
        if conn is None:
            found = await self._fast(S.TASK_TREE, (tree_id,))
            if found is not None:
                return found
        return await self._read_run(read_tree, tree_id, conn=conn)

    async def list(
        self,
        *,
        user_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        root_only: bool = False,
        search: str | None = None,
    ) -> list[Row]:
        """Newest first. `root_only`: only tasks without a parent (one per tree); `search`: a
        case-insensitive part of the name, or the start of the id (the dashboard's search box)."""
        if not root_only and search is None:
            filters = tuple(value for value in (user_id, status) if value is not None)
            listing = S.task_listing(user_id is not None, status is not None)
            found = await self._fast(listing, (*filters, limit, offset))
            if found is not None:
                return found
        query = _filtered(select(T), user_id=user_id, status=status)
        if root_only:
            query = query.where(T.c.parent_id.is_(None))
        if search is not None:
            pattern = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(or_(func.lower(T.c.name).like(f"%{pattern.lower()}%", escape="\\"),
                                    T.c.id.like(f"{pattern}%", escape="\\")))
        query = query.order_by(T.c.created_at.desc(), T.c.id.desc()).limit(limit).offset(offset)
        return await self._read_run(_rows, query)

    async def status_counts(self, tree_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Tasks per status of each tree in `tree_ids`: one grouped query over the tree index."""
        counts: dict[str, dict[str, int]] = {tree_id: {} for tree_id in tree_ids}
        if not tree_ids:
            return counts
        query = (select(T.c.task_tree_id, T.c.status, func.count())
                 .where(T.c.task_tree_id.in_(list(tree_ids))).group_by(T.c.task_tree_id, T.c.status))
        found = await self._read_run(lambda c: list(c.execute(query)))
        for tree_id, status, n in found:
            counts[tree_id][status] = int(n)
        return counts

    async def count(self, *, user_id: str | None = None, status: str | None = None,
                    product_id: str | None = None) -> int:
        query = _filtered(select(func.count()).select_from(T), user_id=user_id, status=status,
                          product_id=product_id)
        return await self._read_run(lambda c: int(c.execute(query).scalar_one()))

    async def unfinished_count(self, user_id: str | None, at_most: int) -> int:
        """Tasks of `user_id` (None: the tasks without one) that are pending or in progress,
        counted up to `at_most` only: a range of ix_tasks_user_unfinished, so the cost is bounded
        by the quota however many tasks the user ever had (SERVICE_MAX_PENDING_PER_USER)."""
        statement, args = (S.UNFINISHED_OF_NOBODY, (at_most,)) if user_id is None else \
            (S.UNFINISHED_OF_USER, (user_id, at_most))
        if self._reader is not None:
            # On the loop's thread even while the database thread is busy (unlike _read): a count
            # a write or two behind is as good a quota check, and a create must not queue behind
            # the engine's writes for it (measured: 6 % of 5-task-tree throughput when it did).
            found = self._reader.scalar(statement.sqlite, args)
        elif self._pg is not None:
            rows = await self._pg.rows(statement.postgresql, args)
            found = rows[0]["n"] if rows else None
        else:
            found = None
        if found is not None:
            return int(found)

        def op(c: Connection) -> int:
            return int(c.exec_driver_sql(statement.form(c.dialect.name), args).scalar_one())

        return await self._read_run(op)

    async def count_by_status(self) -> dict[str, int]:
        """Tasks per status (metrics): one grouped count over the status index."""
        query = select(T.c.status, func.count()).group_by(T.c.status)
        return await self._read_run(lambda c: {status: int(n) for status, n in c.execute(query)})

    async def children(self, parent_id: str) -> list[Row]:
        found = await self._fast(S.TASK_CHILDREN, (parent_id,))
        if found is not None:
            return found
        query = select(T).where(T.c.parent_id == parent_id).order_by(T.c.created_at, T.c.id)
        return await self._read_run(_rows, query)

    async def dependents(self, task_ids: Sequence[str], conn: AsyncConnection | None = None) -> list[Row]:
        """Tasks (in any tree) that list one of `task_ids` among their dependencies.

        Up to one chunk of ids: one LIKE scan. More (deleting a large subtree): one scan of the
        tasks that have dependencies at all, matched here; a scan per chunk of 500 LIKEs made
        deleting a 10,000-task chain take 20 s.
        """
        wanted = set(task_ids)
        text = cast(T.c.dependencies, String)

        def by_like(c: Connection) -> list[Row]:
            # The JSON text holds an id as json.dumps writes it (non-ASCII escaped); match that.
            needles = (json.dumps(tid).replace("!", "!!").replace("%", "!%").replace("_", "!_")
                       for tid in sorted(wanted))
            return _rows(c, select(T).where(or_(*(text.like(f"%{n}%", escape="!") for n in needles))))

        def by_scan(c: Connection) -> list[Row]:
            with_deps = select(T.c.id, T.c.dependencies).where(text.notin_(["[]", "null"]))
            ids = [row.id for row in c.execute(with_deps)
                   if any(isinstance(d, dict) and d.get("id") in wanted for d in row.dependencies or ())]
            found: list[Row] = []
            for chunk in _chunks(ids):
                found.extend(_rows(c, select(T).where(T.c.id.in_(chunk))))
            return found

        rows = await self._run(by_like if len(wanted) <= _CHUNK else by_scan, conn=conn)
        return [r for r in rows if any(isinstance(d, dict) and d.get("id") in wanted for d in r["dependencies"] or ())]

    # --- writes ---------------------------------------------------------------------------

    async def insert(self, rows: Sequence[Mapping[str, Any]], conn: AsyncConnection | None = None) -> None:
        if rows:
            full = [with_defaults(row) for row in rows]
            await self._run(lambda c: c.execute(insert(T), full), conn=conn)

    async def update(
        self,
        task_id: str,
        values: Mapping[str, Any],
        *,
        only_status: Sequence[str] | None = None,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Set `values` on one task; with `only_status`, only if its status is one of those."""
        query = update(T).where(T.c.id == task_id).values(**values)
        if only_status is not None:
            query = query.where(T.c.status.in_(list(only_status)))
        return await self._run(lambda c: c.execute(query).rowcount > 0, conn=conn)

    async def update_many(
        self,
        ids: Sequence[str],
        values: Mapping[str, Any],
        *,
        only_status: Sequence[str] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[str]:
        """Compare-and-set on many tasks at once; returns the ids that actually changed."""
        status = tuple(only_status) if only_status is not None else None
        return await self._run(lambda c: _update_many(c, list(ids), values, status), conn=conn)

    async def write_pass(self, writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str],
                         owner: str, until: str, stamp: str,
                         ends: Sequence[tuple[str, str]] = ()) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
        """The engine's pass in one transaction: fenced writes (outcomes, progress), claims, and
        the end of executions whose last task just ended (`ends`: execution id and version).
        Returns the ids whose write was accepted, the claimed ids with their tokens, and each
        ended execution's final status (None: it cannot end now)."""
        if self._pg is not None:
            return await self._pg_write_pass(writes, claims, owner, until, stamp, ends)

        def op(c: Connection) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
            accepted = executions.fenced_writes(c, writes, owner)
            claimed = executions.claim(c, claims, owner, until, stamp)
            ended = {eid: executions.end_execution(c, eid, owner, version, stamp) for eid, version in ends}
            return accepted, claimed, ended

        return await self._run(op, small=len(writes) + len(claims) + len(ends) <= SMALL_PASS)

    async def _pg_write_pass(self, writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str],
                             owner: str, until: str, stamp: str,
                             ends: Sequence[tuple[str, str]]) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
        """PostgreSQL: the whole pass in one round trip (statements.pass_statement)."""
        assert self._pg is not None
        rows = executions.pg_step_params(writes, claims, owner, until, stamp, ends)
        found = await self._pg.fetchmany(S.pass_statement().postgresql, rows) if rows else []
        self.answered_at = time.monotonic()
        accepted, claimed, ended = executions.pg_step_results(found)
        return accepted, claimed, {eid: ended.get(eid) for eid, _ in ends}

    async def delete(self, ids: Sequence[str], conn: AsyncConnection | None = None, *,
                     only_status: str | None = None) -> int:
        """Delete physically; with `only_status`, only rows still in that status (compare-and-set)."""
        def op(c: Connection) -> int:
            deleted = 0
            for chunk in _chunks(list(ids)):
                query = delete(T).where(T.c.id.in_(chunk))
                if only_status is not None:
                    query = query.where(T.c.status == only_status)
                deleted += c.execute(query).rowcount
            return deleted

        return await self._run(op, conn=conn)


def _rows(c: Connection, query: Any) -> list[Row]:
    return [dict(row._mapping) for row in c.execute(query)]


def read_tree(c: Connection, tree_id: str) -> list[Row]:
    """The tasks of a tree, oldest first, in the caller's transaction (TaskRepository.tree reads
    through it when the plain path does not answer; storage/schedules.py reads templates)."""
    return [dict(row._mapping) for row in c.execute(S.TREE_QUERY, {"tree_id": tree_id})]


def _filtered(query: Any, **equal: Any) -> Any:
    for column, value in equal.items():
        if value is not None:
            query = query.where(T.c[column] == value)
    return query


def _update_many(c: Connection, ids: list[str], values: Mapping[str, Any],
                 only_status: tuple[str, ...] | None) -> list[str]:
    query = _update_many_statement(tuple(values), only_status)
    params = {f"_v_{key}": value for key, value in values.items()}
    changed: list[str] = []
    for chunk in _chunks(ids):
        changed.extend(c.execute(query, {**params, "_ids": list(chunk)}).scalars())
    return changed


# The engine's hot statements are built once per shape: constructing a statement costs more
# than running it on SQLite.
@functools.lru_cache(maxsize=64)
def _update_many_statement(keys: tuple[str, ...], only_status: tuple[str, ...] | None) -> Any:
    query = update(T).where(T.c.id.in_(bindparam("_ids", expanding=True)))
    if only_status is not None:
        query = query.where(or_(*(T.c.status == s for s in only_status)))
    return query.values({key: bindparam(f"_v_{key}") for key in keys}).returning(T.c.id)


# --- SQLite reads through the DB-API --------------------------------------------------------
# The SQLite forms of storage/statements.py's reads. Their column list is the table's, in the
# table's order (what `select(T)` selects), so a row is the same dict.

def _row_builder(processors: Sequence[tuple[str, Callable[[Any], Any]]]) -> Callable[[Sequence[Any]], Row]:
    """A function from a DB-API tuple to the row dict, every processor applied: written out as
    one dict display (a third of the cost of a zip and a loop over the processors)."""
    index = {name: i for i, name in enumerate(S.TASK_COLUMNS)}
    calls = dict(processors)
    scope: dict[str, Any] = {"read_stored": read_stored}
    items = []
    for name in S.TASK_COLUMNS:
        value = f"v[{index[name]}]"
        processor = calls.get(name)
        if processor is _stored_json:  # inlined: the call is most of its cost
            item = f"None if {value} is None else read_stored({value})"
        elif processor is _stored_boolean:
            item = f"None if {value} is None else bool({value})"
        elif processor is not None:
            scope[f"p_{name}"] = processor
            item = f"p_{name}({value})"
        else:
            item = value
        items.append(f"{name!r}: {item}")
    exec(f"def row(v):\n    return {{{', '.join(items)}}}", scope)  # noqa: S102 - our own column names
    return scope["row"]


def _stored_json(value: Any) -> Any:
    return None if value is None else read_stored(value)


def _stored_boolean(value: Any) -> bool | None:
    return None if value is None else bool(value)


class _SqliteReader:
    """Reads of a SQLite file on the calling thread, through a sqlite3 connection of its own.

    Why: a read through the database thread costs a thread hop and a wait for the GIL behind
    the event loop, and SQLAlchemy's execution layer around one indexed lookup costs about
    five times the lookup; under load that made `tasks.get` run at a sixth of the framework's
    ceiling. In WAL mode a reader never waits for the writer and sees every committed
    transaction as soon as its statement starts, so a read here sees at least what any answer
    already sent showed.

    Guarantees kept: every statement runs to its end (`fetchmany` past the last row, or the
    cursor is closed), so no read transaction stays open; values are decoded by SQLAlchemy's own
    result processors for each column (JSON through jsonvalues.read_stored, booleans), so a row
    is exactly what the SQLAlchemy path returns, bad stored values reported the same way.
    `rows` returns None, having changed nothing, when the read should take the usual path
    instead: the database is busy (no waiting on the event loop: busy_timeout 0), any error
    (the usual path raises it as it always did), or more than INLINE_ROWS rows (large reads
    go through SQLAlchemy on the database thread, where the event loop can still interleave).
    """

    INLINE_ROWS = 2000

    def __init__(self, path: str, processors: list[tuple[str, Callable[[Any], Any]]]) -> None:
        self.path = path
        self._processors = processors
        self._row = _row_builder(processors)
        # One connection per thread (the app's event loop; tests may run loops in other threads).
        self._connections: dict[int, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine: Engine) -> "_SqliteReader | None":
        url = engine.url
        path = url.database
        if not path or path == ":memory:" or path.startswith("file:") or url.query:
            return None  # in-memory or URI databases: another connection would not see the same data
        dialect = engine.dialect
        processors: list[tuple[str, Callable[[Any], Any]]] = []
        for column in T.c:
            processor = column.type._cached_result_processor(dialect, None)
            if processor is None:
                continue
            # SQLAlchemy's processors, called directly where they are known: what JSON does with
            # a dialect whose deserializer is read_stored (None stays None), what Boolean does
            # on SQLite (sqlalchemy.engine.processors.int_to_boolean). Any other: as it is.
            if isinstance(column.type, JSON) and getattr(dialect, "_json_deserializer", None) is read_stored:
                processor = _stored_json
            elif processor is int_to_boolean:
                processor = _stored_boolean
            processors.append((column.name, processor))
        return cls(path, processors)

    def _connection(self) -> sqlite3.Connection:
        ident = threading.get_ident()
        conn = self._connections.get(ident)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
            with self._lock:
                self._connections[ident] = conn
        return conn

    def rows(self, sql: str, args: Sequence[Any]) -> list[Row] | None:
        try:
            cursor = self._connection().execute(sql, args)
            try:
                raw = cursor.fetchmany(self.INLINE_ROWS + 1)
            finally:
                cursor.close()
        except Exception:  # busy, or anything else: the usual path, which raises what it always did
            return None
        if len(raw) > self.INLINE_ROWS:
            return None
        try:
            return list(map(self._row, raw))
        except Exception:  # a value no processor expected: the usual path decides what happens
            return None

    def scalar(self, sql: str, args: Sequence[Any]) -> Any:
        """The first value of the first row of a read; None when it should take the usual path."""
        try:
            cursor = self._connection().execute(sql, args)
            try:
                row = cursor.fetchone()
                cursor.fetchall()  # to the end: no read transaction stays open
            finally:
                cursor.close()
        except Exception:  # busy, or anything else: the usual path, which raises what it always did
            return None
        return row[0] if row else None

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()
