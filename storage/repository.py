"""Every operation the service runs against the tasks table: which statements, in which order.

Where they run (which engine, thread or plain connection) is storage/connections.py's decision.

Reads return plain dicts (one per row, every column). Writes that change a task's status are
compare-and-set statements (`UPDATE ... WHERE status IN (...)`), so two instances, or a late
result racing a cancel, can never overwrite each other: the database decides who wins.
"""

from __future__ import annotations

import builtins  # `list` in annotations below TaskRepository.list is the method
import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import String, bindparam, cast, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskgrove.storage import attempts, executions, log_store, tree_insert
from taskgrove.storage.attempts import Attempt
from taskgrove.storage import statements
from taskgrove.storage import usage_store as stored_usage
from taskgrove.storage.connections import Connections
from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.models import with_defaults
from taskgrove.storage.outage import write_probe
from taskgrove.storage.status import TASK_STATUSES

Row = dict[str, Any]
_CHUNK = 500  # ids per IN (...) list: well below every backend's bound-parameter limit
# An engine pass with at most this many writes, claims and ends may run on the event loop's
# thread (Connections.run_here): at a few tens of microseconds a row, it never holds the
# loop for long.
SMALL_PASS = 64
# /metrics counts each status up to this many tasks (count_by_status): exact on a small database,
# bounded in cost on a large one (a scrape within 2x of its time at 1,000 tasks: bench/README.md).
STATUS_COUNT_CAP = 1_000
# A search (tasks.list `search`) examines at most this many entries of the index its other
# filters read, newest first, for one page: a part of the name matches no index, so without a
# bound a rare word read the whole table (1.4 s on SQLite, 2.6 s on PostgreSQL at a million
# tasks). 2,000: one search costs about what reading a whole store of 2,000 tasks does (within
# 2x of a store of 1,000 tasks at any size, bench/README.md, issue 48). A page by cursor
# continues below the window's last entry (Listing.window_end), so paging still reaches every
# match; docs/jsonrpc.md says so.
SEARCH_WINDOW = 2_000


class Listing(builtins.list[Row]):
    """The rows of TaskRepository.list, and for a search whose shape holds more tasks than its
    window, the (created_at, id) of the window's last task (`window_end`): where the next page by
    cursor starts when this one did not fill. None: the search examined every task of its shape
    (or it is no search)."""

    window_end: Row | None = None


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]


class TaskRepository:
    def __init__(self, engine: AsyncEngine, batch_engine: Engine | None = None,
                 loop_engine: Engine | None = None) -> None:
        self.engine = engine
        # Where each statement runs (engines, the database thread, plain connections).
        self.connections = Connections(engine, batch_engine, loop_engine)

    async def close(self) -> None:
        await self.connections.close()

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
        await conn.exec_driver_sql(statements.SERIALISE_TREE.form(conn.dialect.name), (task_id,))

    async def transact(self, fn: Callable[..., Any], *args: Any, inline: bool = False) -> Any:
        """Run `fn(sync_connection, *args)` in a transaction of its own (storage/executions.py).
        `inline`: a few rows, so it may run on the event loop's own thread (Connections.run_here)."""
        return await self.connections.transact(fn, *args, inline=inline)

    async def insert_tree(self, rows: Sequence[Mapping[str, Any]], user_id: str | None, owner: str, until: str,
                          stamp: str, quota: tree_insert.Quota | None, traceparent: str | None,
                          claims: Collection[str], inline: bool = False,
                          done: Mapping[str, tree_insert.Done] | None = None) -> Row:
        """A new tree and its execution (tree_insert.insert_tree, which says what is stored). On
        PostgreSQL its one statement goes to a pooled connection directly (PgPool.value): no
        SQLAlchemy transaction around it."""
        pg = self.connections.pg
        if pg is None:
            return await self.transact(tree_insert.insert_tree, rows, user_id, owner, until, stamp, None, quota,
                                       traceparent, claims, done, inline=inline)
        execution, full = tree_insert.new_tree(rows, user_id, owner, until, stamp, None, traceparent, claims, done)
        unfinished = int(await pg.value(*tree_insert.pg_insert_tree_call(full, execution, quota)) or 0)
        self.connections.answered_at = time.monotonic()
        tree_insert.check_quota(quota, unfinished)
        return execution

    async def ping(self, fresh_within: float = 0.0) -> None:
        """Raise if the database does not answer; a transaction that committed within the last
        `fresh_within` seconds counts as an answer (health checks cost nothing under load)."""
        if time.monotonic() - self.connections.answered_at < fresh_within:
            return
        if self.connections.reader is not None and self.connections.reader.scalar("SELECT 1", ()) == 1:
            # SQLite: a read of its own on the loop's thread, so that health never queues behind a
            # long read or write on the database thread (a GraphQL query of 30 x 1,000 tasks held
            # it for seconds on a loaded machine). Anything unusual takes the usual path below.
            return
        await self.connections.transact(lambda c: c.execute(select(1)))

    async def probe_read(self) -> None:
        """Readiness's read (storage/outage.py DatabaseHealth.check): one statement, no table."""
        await self.connections.transact(lambda c: c.execute(select(1)))

    async def probe_write(self) -> None:
        """Readiness's write that stores nothing (outage.write_probe): a full or read-only database fails it."""
        await self.connections.transact(write_probe)

    # --- reads ----------------------------------------------------------------------------
    # A read outside a caller's transaction is one plain prepared statement: on SQLite (a file)
    # through storage/sqlite_reader.py, decoded by SQLAlchemy's own column processors; on
    # PostgreSQL through asyncpg on a pooled connection (storage/pg.py). The same rows as the statements below, at a
    # fraction of the cost (see bench/README.md). Anything unusual (a busy database, an error, a
    # large SQLite result) takes the SQLAlchemy path, which behaves as it always did.

    async def get(self, task_id: str, conn: AsyncConnection | None = None) -> Row | None:
        if conn is None:
            found = await self.connections.fast(statements.TASK_BY_ID, (task_id,))
            if found is not None:
                return found[0] if found else None

        def op(c: Connection) -> Row | None:
            row = c.execute(select(T).where(T.c.id == task_id)).first()
            return dict(row._mapping) if row else None

        return await self.connections.read_run(op, conn=conn)

    async def attempts(self, task_ids: Sequence[str]) -> dict[str, list[Row]]:
        """The attempt history of these tasks, by id, oldest first, with durations
        (storage/attempts.py)."""
        return await self.connections.read_run(lambda c: attempts.of_tasks(c, list(task_ids)))

    async def get_many(self, ids: Iterable[str], conn: AsyncConnection | None = None) -> dict[str, Row]:
        wanted = list(dict.fromkeys(ids))
        if conn is None and len(wanted) <= _CHUNK:
            found_rows = await self.connections.fast(statements.tasks_by_ids(len(wanted)), wanted) if wanted else []
            if found_rows is not None:
                return {row["id"]: row for row in found_rows}

        def op(c: Connection) -> dict[str, Row]:
            found: dict[str, Row] = {}
            for chunk in _chunks(wanted):
                for row in c.execute(select(T).where(T.c.id.in_(chunk))):
                    found[row.id] = dict(row._mapping)
            return found

        return await self.connections.read_run(op, conn=conn)

    async def tree(self, tree_id: str, conn: AsyncConnection | None = None) -> list[Row]:
        if conn is None:
            found = await self.connections.fast(statements.TASK_TREE, (tree_id,))
            if found is not None:
                return found
        return await self.connections.read_run(read_tree, tree_id, conn=conn)

    async def list(
        self,
        *,
        user_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        root_only: bool = False,
        search: str | None = None,
        waiting: bool | None = None,
        after: tuple[str, str] | None = None,
    ) -> Listing:
        """Newest first. `root_only`: only tasks without a parent (one per tree); `search`: a
        case-insensitive part of the name, or the start of the id (the dashboard's search box),
        among the newest SEARCH_WINDOW tasks of the other filters (below `after`); `waiting`: only
        tasks parked on a wait (True), or only the others (False); `after`: the (created_at, id)
        of the previous page's last row (keyset pagination: the page starts below it through
        ix_tasks_user_created, ix_tasks_roots_* or ix_tasks_created_at, whatever came before)."""
        if not root_only and search is None and waiting is None:
            filters = tuple(value for value in (user_id, status, *(after or ())) if value is not None)
            listing = statements.task_listing(user_id is not None, status is not None, after is not None)
            found = await self.connections.fast(listing, (*filters, limit, offset))
            if found is not None:
                return Listing(found)
        shape: dict[str, Any] = dict(user_id=user_id, status=status, root_only=root_only, waiting=waiting, after=after)
        if search is not None:
            return await self.connections.read_run(_searched, shape, search, limit, offset)
        return Listing(await self.connections.read_run(_rows, list_query(**shape, limit=limit, offset=offset)))

    async def status_counts(self, tree_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Tasks per status of each tree in `tree_ids`: one grouped query over the tree index."""
        counts: dict[str, dict[str, int]] = {tree_id: {} for tree_id in tree_ids}
        if not tree_ids:
            return counts
        query = (select(T.c.task_tree_id, T.c.status, func.count())
                 .where(T.c.task_tree_id.in_(list(tree_ids))).group_by(T.c.task_tree_id, T.c.status))
        found = await self.connections.read_run(lambda c: list(c.execute(query)))
        for tree_id, status, n in found:
            counts[tree_id][status] = int(n)
        return counts

    async def count(self, *, user_id: str | None = None, status: str | None = None,
                    product_id: str | None = None) -> int:
        query = _filtered(select(func.count()).select_from(T), user_id=user_id, status=status,
                          product_id=product_id)
        return await self.connections.read_run(lambda c: int(c.execute(query).scalar_one()))

    async def tree_usages(self, tree_id: str) -> builtins.list[Any]:
        """The `usage` of every task of a tree that has one (storage/usage_store.py's tree_usages), read
        as one JSON value on the plain paths: a `tasks.get` of a root pays one small read, not an
        SQLAlchemy query and a row per task."""
        statement = statements.TREE_USAGES
        found: Any = None
        if self.connections.reader is not None:
            found = self.connections.reader.scalar(statement.sqlite, (tree_id,))
        elif self.connections.pg is not None:
            rows = await self.connections.pg.rows(statement.postgresql, (tree_id,))
            found = rows[0]["usages"] if rows else None
        if found is None:
            return await self.connections.read_run(stored_usage.tree_usages, tree_id)
        return _usages(found)

    async def get_with_tree_usages(self, task_id: str) -> tuple[Row | None, builtins.list[Any] | None]:
        """A task and, for a root, the usages of its tree (tree_usages; None for a child): what
        tasks.get shows, in one read on both backends (statements.TASK_WITH_TREE_USAGES): a
        round trip fewer on PostgreSQL, a statement fewer on SQLite. When the plain path does not
        answer: the row, then for a root its tree's usages, each by its own usual path."""
        found = await self.connections.fast(statements.TASK_WITH_TREE_USAGES, (task_id,))
        if found is not None:
            if not found:
                return None, None
            row = found[0]
            usages = row.pop("tree_usages")
            return row, None if usages is None else _usages(usages)
        row = await self.get(task_id)
        if row is None or row["parent_id"] is not None:
            return row, None
        return row, await self.tree_usages(row["task_tree_id"])

    async def unfinished_count(self, user_id: str | None, at_most: int) -> int:
        """Tasks of `user_id` (None: the tasks without one) that are pending or in progress,
        counted up to `at_most` only: two ranges of ix_tasks_user_status_created on SQLite, one of the
        partial ix_tasks_unfinished_user on PostgreSQL, so the cost is bounded by the quota however
        many tasks the user ever had (SERVICE_MAX_PENDING_PER_USER). A create that executes counts
        inside its own insert instead (tree_insert.insert_tree)."""
        statement, args = statements.unfinished_of(user_id, at_most)
        if self.connections.reader is not None:
            # On the loop's thread even while the database thread is busy (unlike Connections.read): a count
            # a write or two behind is as good a quota check, and a request must not queue behind the
            # engine's writes for it.
            found = self.connections.reader.scalar(statement.sqlite, args)
            if found is not None:
                return int(found)
        if self.connections.pg is not None:  # the read pool (storage/pg.py): never one of the transactions' connections
            rows = await self.connections.pg.rows(statement.postgresql, args)
            if rows:
                return int(rows[0]["n"])
            # None: the read pool could not answer (an outage among others): the usual path says which.
        return await self.connections.read_run(tree_insert.count_unfinished, user_id, at_most)

    async def count_by_status(self, at_most: int = STATUS_COUNT_CAP) -> dict[str, int]:
        """Tasks per status (metrics), each counted up to `at_most` only: one bounded range of
        ix_tasks_status_created per status, so a scrape costs the same at 1,000 tasks as at millions
        (a status with more shows `at_most`; docs/operations.md says so)."""
        queries = [(status, _capped_count(status, at_most)) for status in TASK_STATUSES]
        return await self.connections.read_run(
            lambda c: {status: int(c.execute(query).scalar_one()) for status, query in queries})

    async def children(self, parent_id: str) -> builtins.list[Row]:
        found = await self.connections.fast(statements.TASK_CHILDREN, (parent_id,))
        if found is not None:
            return found
        query = select(T).where(T.c.parent_id == parent_id).order_by(T.c.created_at, T.c.id)
        return await self.connections.read_run(_rows, query)

    async def dependents(self, task_ids: Sequence[str], conn: AsyncConnection | None = None) -> builtins.list[Row]:
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

        rows = await self.connections.transact(by_like if len(wanted) <= _CHUNK else by_scan, conn=conn)
        return [r for r in rows if any(isinstance(d, dict) and d.get("id") in wanted for d in r["dependencies"] or ())]

    async def log_lines(self, task_id: str, *, attempt: int | None = None, after: int | None = None,
                        limit: int = 1000) -> builtins.list[Row]:
        """A page of a task's log lines, oldest first (storage/log_store.py `read_lines`)."""
        return await self.connections.read_run(
            lambda c: log_store.read_lines(c, task_id, attempt=attempt, after=after, limit=limit))

    # --- writes ---------------------------------------------------------------------------

    async def insert(self, rows: Sequence[Mapping[str, Any]], conn: AsyncConnection | None = None) -> None:
        if rows:
            full = [with_defaults(row) for row in rows]
            await self.connections.transact(lambda c: c.execute(insert(T), full), conn=conn)

    async def add_log_lines(self, lines: Sequence[Mapping[str, Any]]) -> builtins.list[int]:
        """Store a batch of log lines in one transaction; their `seq`s, in order."""
        return await self.connections.transact(log_store.insert_lines, lines)

    async def update(
        self,
        task_id: str,
        values: Mapping[str, Any],
        *,
        only_status: Sequence[str] | None = None,
        conn: AsyncConnection | None = None,
        history: Attempt | None = None,
    ) -> bool:
        """Set `values` on one task; with `only_status`, only if its status is one of those.
        `history`: the attempt this change ends (a cancel), stored if the task changed."""
        query = update(T).where(T.c.id == task_id).values(**values)
        if only_status is not None:
            query = query.where(T.c.status.in_(list(only_status)))

        def op(c: Connection) -> bool:
            changed = c.execute(query).rowcount > 0
            if changed and history is not None:
                attempts.insert_rows(c, [history])
            return changed

        return await self.connections.transact(op, conn=conn)

    async def update_many(
        self,
        ids: Sequence[str],
        values: Mapping[str, Any],
        *,
        only_status: Sequence[str] | None = None,
        conn: AsyncConnection | None = None,
    ) -> builtins.list[str]:
        """Compare-and-set on many tasks at once; returns the ids that actually changed."""
        status = tuple(only_status) if only_status is not None else None
        return await self.connections.transact(lambda c: _update_many(c, list(ids), values, status), conn=conn)

    async def write_pass(self, writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str],
                         owner: str, until: str, stamp: str, ends: Sequence[tuple[str, str]] = (),
                         history: Mapping[str, Attempt] | None = None,
                         later: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
                         ) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
        """The engine's pass in one transaction: fenced writes (outcomes, progress) with the
        history rows of the attempts they end (`history`, by task id: storage/attempts.py), claims,
        `later` fenced writes that see those claims (pure tasks completed inline, with their
        history rows in `history`), and the end of executions whose last task just ended (`ends`:
        execution id and version). Returns the ids whose write was accepted (of both kinds), the
        claimed ids with their tokens, and each ended execution's final status (None: it cannot end now)."""
        if self.connections.pg is not None:
            return await self._pg_write_pass(writes, claims, owner, until, stamp, ends, history, later)

        size = len(writes) + len(claims) + len(ends) + len(later)
        return await self.connections.transact(executions.sqlite_pass, writes, claims, owner, until, stamp, ends,
                                               history, later, inline=size <= SMALL_PASS)

    async def _pg_write_pass(self, writes: Sequence[tuple[str, int, Mapping[str, Any]]], claims: Sequence[str],
                             owner: str, until: str, stamp: str, ends: Sequence[tuple[str, str]],
                             history: Mapping[str, Attempt] | None,
                             later: Sequence[tuple[str, int, Mapping[str, Any]]] = (),
                             ) -> tuple[set[str], dict[str, Row], dict[str, str | None]]:
        """PostgreSQL: the whole pass in one round trip (statements.pass_statement): its rows are
        statements of one transaction, so `later` writes (rows after the claims) see the claims."""
        assert self.connections.pg is not None
        if later:
            rows = (executions.pg_step_params(writes, claims, owner, until, stamp, (), history)
                    + executions.pg_step_params(later, (), owner, until, stamp, ends, history))
        else:
            rows = executions.pg_step_params(writes, claims, owner, until, stamp, ends, history)
        found = await self.connections.pg.fetchmany(statements.pass_statement().postgresql, rows) if rows else []
        self.connections.answered_at = time.monotonic()
        accepted, claimed, ended = executions.pg_step_results(found)
        return accepted, claimed, {eid: ended.get(eid) for eid, _ in ends}

    async def delete(self, ids: Sequence[str], conn: AsyncConnection | None = None, *,
                     only_status: str | None = None) -> int:
        """Delete physically; with `only_status`, only rows still in that status (compare-and-set).
        Their log lines go in the same transaction (storage/log_store.py)."""
        def op(c: Connection) -> int:
            deleted = 0
            for chunk in _chunks(list(ids)):
                query = delete(T).where(T.c.id.in_(chunk))
                if only_status is not None:
                    query = query.where(T.c.status == only_status)
                gone = list(c.execute(query.returning(T.c.id)).scalars())
                log_store.delete_of(c, gone)
                attempts.delete_of(c, gone)  # their history goes with them (storage/attempts.py)
                deleted += len(gone)
            return deleted

        return await self.connections.transact(op, conn=conn)


def list_query(*, user_id: str | None = None, status: str | None = None, limit: int = 100, offset: int = 0,
               root_only: bool = False, search: str | None = None, waiting: bool | None = None,
               after: tuple[str, str] | None = None, until: tuple[str, str] | None = None) -> Any:
    """The statement of TaskRepository.list (tests/test_task_pages.py reads its plans). `until`:
    the (created_at, id) of the last task a search may examine (window_end_query), so that a
    word no task near the top holds reads a bounded range of the shape's index, not the table."""
    query = _shaped(user_id, status, root_only, waiting, after)
    if until is not None:
        query = query.where(tuple_(T.c.created_at, T.c.id) >= tuple_(*until))
    if search is not None:
        pattern = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(or_(func.lower(T.c.name).like(f"%{pattern.lower()}%", escape="\\"),
                                T.c.id.like(f"{pattern}%", escape="\\")))
    return _in_order(query).limit(limit).offset(offset)


def window_end_query(*, user_id: str | None = None, status: str | None = None, root_only: bool = False,
                     waiting: bool | None = None, after: tuple[str, str] | None = None) -> Any:
    """The SEARCH_WINDOW-th entry of the index range a list's shape reads, newest first, and the
    one below it, if the range has that many: its keys only, no row of the table. The range is
    that of the filters an index holds: `user_id` and `status`, and `root_only` where no `status`
    is given (ix_tasks_roots_*); `waiting`, and `root_only` beside a status, filter within it, as
    they do in the page's own plan, so a window costs SEARCH_WINDOW entries whatever they select."""
    del waiting  # a filter within the window (see above)
    keys = _shaped(user_id, status, root_only and status is None, None, after, columns=(T.c.created_at, T.c.id))
    return _in_order(keys).limit(2).offset(SEARCH_WINDOW - 1)


def _shaped(user_id: str | None, status: str | None, root_only: bool, waiting: bool | None,
            after: tuple[str, str] | None, columns: Sequence[Any] = (T,)) -> Any:
    """The tasks of a list's filters but `search`, unordered."""
    query = _filtered(select(*columns), user_id=user_id, status=status)
    if root_only:
        query = query.where(T.c.parent_id.is_(None))
    if after is not None:
        query = query.where(tuple_(T.c.created_at, T.c.id) < tuple_(*after))
    if waiting is not None:
        query = query.where(T.c.waiting.is_not(None) if waiting else T.c.waiting.is_(None))
    return query


def _in_order(query: Any) -> Any:
    return query.order_by(T.c.created_at.desc(), T.c.id.desc())


def _searched(c: Connection, shape: dict[str, Any], search: str, limit: int, offset: int) -> Listing:
    """A search's page within its window, on one connection (on SQLite one read transaction):
    where the window ends if a task lies below it, then the page no further down than that."""
    keys = list(c.execute(window_end_query(**shape)))
    until = (keys[0][0], keys[0][1]) if len(keys) == 2 else None
    rows = Listing(_rows(c, list_query(**shape, search=search, until=until, limit=limit, offset=offset)))
    if until is not None:
        rows.window_end = {"created_at": until[0], "id": until[1]}
    return rows


def _capped_count(status: str, at_most: int) -> Any:
    """How many tasks are in `status`, counting no further than `at_most` (a LIMIT under the count)."""
    some = select(T.c.status).where(T.c.status == status).limit(at_most).subquery()  # the index alone
    return select(func.count()).select_from(some)


def _rows(c: Connection, query: Any) -> list[Row]:
    return [dict(row._mapping) for row in c.execute(query)]


def read_tree(c: Connection, tree_id: str) -> list[Row]:
    """The tasks of a tree, oldest first, in the caller's transaction (TaskRepository.tree reads
    through it when the plain path does not answer; storage/schedule_store.py reads templates)."""
    return [dict(row._mapping) for row in c.execute(statements.TREE_QUERY, {"tree_id": tree_id})]


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


def _usages(text: str) -> list[Any]:
    """The usages of a tree from the JSON array TREE_USAGES (or TASK_WITH_TREE_USAGES) makes.
    Most trees used no LLM: their empty array needs no parser; the others are read by the
    storage's own reader (orjson where it reads as json does)."""
    if text == "[]":
        return []
    found = read_stored(text)
    # The database wrote the array (json_group_array, json_agg): never anything but a list here.
    return [usage for usage in found if isinstance(usage, dict)] if isinstance(found, list) else []
