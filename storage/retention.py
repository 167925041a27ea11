"""The statements of retention (agent/services/retention_service.py runs them): which trees have ended, and what
goes with a tree when it is deleted.

A tree has ended when every task of it is completed, failed or cancelled, none is parked on a wait,
no execution of it is running, and its latest `updated_at` and `completed_at` are older than the
cutoff. Pending tasks are allowed in a tree that was run (an execution of it ended): those are
what a failed required dependency leaves behind (a root waiting on a failed task stays pending,
and without this rule no failed tree would ever go). A tree never run (a stored copy) is kept. A schedule's or a trigger's template tree never ends
for retention. The tasks themselves are deleted by
`TaskRepository.delete` (the function `tasks.delete` uses), so whatever is attached to a task is
deleted with it there; this module deletes the tree's executions and the idempotency records.

Stored events (`events.emit`) are not part of a tree: an event counts for a parked event wait of
its user and name that began at or before it (agent/engine/waits.py), and a wait's beginning is
stamped when it parks. So an event older than the cutoff is needed only by a wait parked now, of
its user and name, that began at or before it (`event_floors`); a wait that parks later began
after the cutoff and can never count it. `delete_events` deletes the others. The triggers' inbox
rows of events (`trigger_events`) go once handled before the cutoff (`delete_trigger_events`).

Every function takes the caller's connection: one batch is one transaction (`lock_ended`, then the
deletes), so a tree that starts again between the check and the delete is never half deleted
(PostgreSQL: the batch locks the trees' rows first; SQLite: the batch's write fails on a snapshot
another writer changed, and the batch is tried again at the next sweep).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import and_, case, delete, func, or_, select, tuple_
from sqlalchemy.engine import Connection

from taskgrove.storage import statements
from taskgrove.storage.jsonvalues import read_stored
from taskgrove.storage.status import FINISHED_STATUSES, TaskStatus
from taskgrove.storage.models import events_table as E
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.models import idempotency_table as K
from taskgrove.storage.models import schedules_table
from taskgrove.storage.models import tasks_table as T
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.trigger_models import trigger_events_table as TE
from taskgrove.storage.trigger_models import triggers_table

RUNNING = "running"  # an execution's status while it runs (storage/executions.py)
# Statuses a task of an ended tree may have: finished, or pending where the tree was run (see above).
_SETTLED = (*FINISHED_STATUSES, TaskStatus.PENDING.value)


def old_roots(c: Connection, cutoff: str, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
    """Up to `limit` roots that may head an ended tree, oldest first, after the key `after`
    ((created_at, id) of the last root seen): finished, last changed before `cutoff`. A tree created
    after the cutoff cannot have ended before it, so the walk stops there (ix_tasks_roots_created)."""
    query = (select(T.c.created_at, T.c.id)
             .where(T.c.parent_id.is_(None), T.c.created_at < cutoff, T.c.status.in_(_SETTLED),
                    T.c.updated_at < cutoff)
             .order_by(T.c.created_at, T.c.id).limit(limit))
    if after is not None:
        query = query.where(tuple_(T.c.created_at, T.c.id) > tuple_(*after))
    return [(row.created_at, row.id) for row in c.execute(query)]


def surplus_runs(c: Connection, keep: int) -> list[str]:
    """The trees of schedules' runs beyond each schedule's newest `keep` (deletable once ended,
    whatever their age). A run's root is a copy of the template's root naming its schedule: one
    read of the roots copied from any template (ix_tasks_roots_created), newest first."""
    templates = sorted({row.task_id for row in c.execute(select(schedules_table.c.task_id))})
    kept: dict[str, int] = {}
    found: list[str] = []
    for start in range(0, len(templates), 500):
        runs = c.execute(select(T.c.id, T.c.extra)
                         .where(T.c.parent_id.is_(None), T.c.original_task_id.in_(templates[start:start + 500]))
                         .order_by(T.c.created_at.desc(), T.c.id.desc()))
        for run_id, extra in runs:
            schedule_id = extra.get("schedule_id") if isinstance(extra, dict) else None
            if schedule_id is None:
                continue  # a copy made by tasks.copy, not a run
            kept[schedule_id] = kept.get(schedule_id, 0) + 1
            if kept[schedule_id] > keep:
                found.append(run_id)
    return found


def lock_ended(c: Connection, tree_ids: Sequence[str], cutoff: str) -> dict[str, list[str]]:
    """Of `tree_ids`, the trees that have ended before `cutoff`, with their task ids, their rows
    locked until the transaction ends (PostgreSQL), so none can start again before the delete."""
    if not tree_ids:
        return {}
    ids = list(tree_ids)
    tasks = c.execute(select(T.c.id, T.c.task_tree_id).where(T.c.task_tree_id.in_(ids)).with_for_update()).all()
    busy = case((or_(T.c.status.notin_(_SETTLED), T.c.waiting.is_not(None)), 1), else_=0)
    pending = case((T.c.status == TaskStatus.PENDING.value, 1), else_=0)
    settled = dict(c.execute(
        select(T.c.task_tree_id, func.sum(pending)).where(T.c.task_tree_id.in_(ids)).group_by(T.c.task_tree_id)
        .having(and_(func.sum(busy) == 0, func.max(T.c.updated_at) < cutoff,
                     func.coalesce(func.max(T.c.completed_at), "") < cutoff))).all())
    with_pending = {tree_id for tree_id, n in settled.items() if n}
    ended = (set(settled) - with_pending) | _ran(c, with_pending)
    ended -= _templates(c, ended) | _running(c, ended)
    doomed: dict[str, list[str]] = {tree_id: [] for tree_id in ended}
    for task_id, tree_id in tasks:
        if tree_id in doomed:
            doomed[tree_id].append(task_id)
    return doomed


def _templates(c: Connection, tree_ids: set[str]) -> set[str]:
    """Which of `tree_ids` hold a schedule's or a trigger's template: never deleted by retention."""
    if not tree_ids:
        return set()
    found: set[str] = set()
    for table in (schedules_table, triggers_table):
        query = (select(T.c.task_tree_id).join(table, table.c.task_id == T.c.id)
                 .where(T.c.task_tree_id.in_(list(tree_ids))))
        found |= {row[0] for row in c.execute(query)}
    return found


def _ran(c: Connection, tree_ids: set[str]) -> set[str]:
    """Which of `tree_ids` have an execution that ended (they were run)."""
    if not tree_ids:
        return set()
    query = select(X.c.task_tree_id).where(X.c.task_tree_id.in_(list(tree_ids)), X.c.status != RUNNING)
    return {row[0] for row in c.execute(query)}


def _running(c: Connection, tree_ids: set[str]) -> set[str]:
    if not tree_ids:
        return set()
    query = select(X.c.task_tree_id).where(X.c.task_tree_id.in_(list(tree_ids)), X.c.status == RUNNING)
    return {row[0] for row in c.execute(query)}


def delete_executions(c: Connection, tree_ids: Sequence[str]) -> int:
    """The executions of deleted trees (ended ones: lock_ended kept no tree with a running one)."""
    if not tree_ids:
        return 0
    return int(c.execute(delete(X).where(X.c.task_tree_id.in_(list(tree_ids)))).rowcount)


def delete_orphan_executions(c: Connection, tree_ids: Sequence[str]) -> int:
    """The ended executions of `tree_ids` (trees a sweep deleted) whose tree has no task: an
    execute that read a tree just before a sweep deleted it opens its execution after the
    delete (the execute's transaction has nothing the sweep's locks hold when it inserts)."""
    if not tree_ids:
        return 0
    has_tasks = select(T.c.id).where(T.c.task_tree_id == X.c.task_tree_id).exists()
    query = delete(X).where(X.c.task_tree_id.in_(list(tree_ids)), X.c.status != RUNNING, ~has_tasks)
    return int(c.execute(query).rowcount)


def delete_idempotency(c: Connection, before: str, limit: int) -> int:
    """Up to `limit` answered idempotency records made before `before`. A request that made or ran
    a deleted tree came before that tree ended, so before the cutoff: none of its records is left
    to answer a resend with a tree that is gone."""
    oldest = (select(K.c.owner, K.c.key).where(K.c.created_at < before, K.c.answer.is_not(None))
              .limit(limit))
    keys: list[Any] = [tuple(row) for row in c.execute(oldest)]
    if not keys:
        return 0
    return int(c.execute(delete(K).where(tuple_(K.c.owner, K.c.key).in_(keys))).rowcount)


def delete_trigger_events(c: Connection, before: str, limit: int) -> int:
    """Up to `limit` inbox rows of triggers (storage/trigger_models.py `trigger_events`) handled
    before `before`: each went into a run, was skipped, dropped or cancelled, and is read again by
    nothing (a waiting row, `handled_at` NULL, is never deleted here). The run keeps the event ids
    in its root's extra. (ix_trigger_events_pending leads with handled_at.)"""
    oldest = (select(TE.c.seq).where(TE.c.handled_at.is_not(None), TE.c.handled_at < before)
              .order_by(TE.c.handled_at).limit(limit))
    seqs = [row.seq for row in c.execute(oldest)]
    if not seqs:
        return 0
    return int(c.execute(delete(TE).where(TE.c.seq.in_(seqs))).rowcount)


def event_floors(c: Connection) -> dict[tuple[str | None, str], str]:
    """Per (user, event name), when the earliest wait parked now on that event began: the events
    of that user and name from then on may still be counted. One read of the parked tasks
    (ix_tasks_waiting_user holds only those)."""
    query = select(T.c.user_id, T.c.waiting).where(T.c.waiting.is_not(None),
                                                    T.c.status == TaskStatus.IN_PROGRESS.value)
    floors: dict[tuple[str | None, str], str] = {}
    for user_id, text in c.execute(query):
        wait = read_stored(text)  # an Unreadable (empty) for a bad row: no event
        if not isinstance(wait, dict) or wait.get("kind") != "event":
            continue
        key, since = (user_id, str(wait.get("event"))), str(wait.get("since") or "")
        if key not in floors or since < floors[key]:
            floors[key] = since
    return floors


def delete_events(c: Connection, before: str, floors: dict[tuple[str | None, str], str],
                  after: tuple[str, str] | None, limit: int) -> tuple[int, tuple[str, str] | None]:
    """Of the `limit` oldest events emitted before `before` (after the key `after`: (created_at,
    id) of the last one looked at), delete those no parked wait can count (see `event_floors`).
    Returns (deleted, the key to go on after; None when no older event is left) (ix_events_created)."""
    query = (select(E.c.id, E.c.user_id, E.c.name, E.c.created_at).where(E.c.created_at < before)
             .order_by(E.c.created_at, E.c.id).limit(limit))
    if after is not None:
        query = query.where(tuple_(E.c.created_at, E.c.id) > tuple_(*after))
    rows = c.execute(query).all()
    doomed = [row.id for row in rows if not _counted(row, floors)]
    deleted = int(c.execute(delete(E).where(E.c.id.in_(doomed))).rowcount) if doomed else 0
    return deleted, (rows[-1].created_at, rows[-1].id) if len(rows) == limit else None


def _counted(event: Any, floors: dict[tuple[str | None, str], str]) -> bool:
    """Whether a wait parked now may count `event`: one of its user and name began at or before it."""
    floor = floors.get((event.user_id, event.name))
    return floor is not None and floor <= event.created_at


class RetentionStore:
    """Retention's named operations, each one transaction of its own (a batch's delete is one:
    `delete_batch`), running the statement functions above: what the retention service calls
    (issue 44: storage offers named operations; nothing above it hands functions to `transact`)."""

    def __init__(self, repo: TaskRepository) -> None:
        self._repo = repo
        self._transact = repo.transact

    async def old_roots(self, cutoff: str, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        return await self._transact(old_roots, cutoff, after, limit)

    async def surplus_runs(self, keep: int) -> list[str]:
        return await self._transact(surplus_runs, keep)

    async def delete_orphan_executions(self, tree_ids: Sequence[str]) -> int:
        return await self._transact(delete_orphan_executions, tree_ids)

    async def delete_idempotency(self, before: str, limit: int) -> int:
        return await self._transact(delete_idempotency, before, limit)

    async def delete_trigger_events(self, before: str, limit: int) -> int:
        return await self._transact(delete_trigger_events, before, limit)

    async def event_floors(self) -> dict[tuple[str | None, str], str]:
        return await self._transact(event_floors)

    async def delete_events(self, before: str, floors: dict[tuple[str | None, str], str],
                            after: tuple[str, str] | None, limit: int) -> tuple[int, tuple[str, str] | None]:
        return await self._transact(delete_events, before, floors, after, limit)

    async def delete_batch(self, tree_ids: Sequence[str], cutoff: str) -> tuple[list[str], int]:
        """One transaction: the trees of `tree_ids` that ended before `cutoff`, checked with their
        rows locked, then deleted with their executions. Returns the trees deleted, and how many tasks."""
        repo = self._repo
        async with repo.transaction() as conn:
            # SQLite: the one write lock first, so the check below reads what no other writer can
            # change before the delete (PostgreSQL: lock_ended locks the trees' rows).
            await repo.serialise_tree(tree_ids[0], conn)
            doomed = await repo.connections.transact(lock_ended, tree_ids, cutoff, conn=conn)
            if not doomed:
                return [], 0
            tasks = await repo.delete([tid for ids in doomed.values() for tid in ids], conn)
            await repo.connections.transact(delete_executions, list(doomed), conn=conn)
        return list(doomed), tasks

    @asynccontextmanager
    async def sweep_lock(self) -> AsyncIterator[bool]:
        """PostgreSQL: the sweeper's session lock, held on a connection of its own for the sweep
        (True when this instance took it). SQLite: always True (one writer at a time anyway)."""
        engine = self._repo.engine
        if engine.dialect.name != "postgresql":
            yield True
            return
        async with engine.connect() as conn:
            lock = statements.SWEEP_LOCK.postgresql
            taken = bool((await conn.exec_driver_sql(lock)).scalar())  # type: ignore[arg-type]
            await conn.commit()
            try:
                yield taken
            finally:
                if taken:
                    await conn.exec_driver_sql(statements.SWEEP_UNLOCK.postgresql)  # type: ignore[arg-type]
                    await conn.commit()
