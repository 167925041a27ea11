"""Every statement the service runs against the tasks table.

Reads return plain dicts (one per row, every column). Writes that change a task's status are
compare-and-set statements (`UPDATE ... WHERE status IN (...)`), so two instances, or a late
result racing a cancel, can never overwrite each other: the database decides who wins.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import String, and_, bindparam, cast, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from storage.models import tasks_table as T

Row = dict[str, Any]
_CHUNK = 500  # ids per IN (...) list: well below every backend's bound-parameter limit


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]


class TaskRepository:
    def __init__(self, engine: AsyncEngine, batch_engine: Engine | None = None) -> None:
        self.engine = engine
        # SQLite only: a synchronous engine driven from one worker thread, so a whole batch of
        # engine writes costs one thread hop instead of one per statement (see write_batch).
        self._batch_engine = batch_engine
        self._batch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskgrove-db") \
            if batch_engine is not None else None

    async def close(self) -> None:
        if self._batch_thread is not None:
            self._batch_thread.shutdown(wait=True)
        if self._batch_engine is not None:
            self._batch_engine.dispose()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self, conn: AsyncConnection | None = None) -> AsyncIterator[AsyncConnection]:
        """A transaction, or the caller's one when `conn` is given (so operations compose)."""
        if conn is not None:
            yield conn
            return
        async with self.engine.begin() as new_conn:
            yield new_conn

    async def _run(self, fn: Callable[..., Any], *args: Any, conn: AsyncConnection | None = None) -> Any:
        """Run `fn(sync_connection, *args)` in the caller's transaction or a new one.

        Every statement is written once, as a plain synchronous function. On SQLite a new
        transaction runs on the dedicated database thread (one thread hop per operation instead
        of one per statement); on PostgreSQL and inside a caller's transaction it runs through
        the async driver.
        """
        if conn is not None:
            return await conn.run_sync(fn, *args)
        if self._batch_engine is not None:
            engine = self._batch_engine

            def in_thread() -> Any:
                with engine.begin() as sync_conn:
                    return fn(sync_conn, *args)

            return await asyncio.get_running_loop().run_in_executor(self._batch_thread, in_thread)
        async with self.engine.begin() as async_conn:
            return await async_conn.run_sync(fn, *args)

    # --- reads ----------------------------------------------------------------------------

    async def get(self, task_id: str, conn: AsyncConnection | None = None) -> Row | None:
        def op(c: Connection) -> Row | None:
            row = c.execute(select(T).where(T.c.id == task_id)).first()
            return dict(row._mapping) if row else None

        return await self._run(op, conn=conn)

    async def get_many(self, ids: Iterable[str], conn: AsyncConnection | None = None) -> dict[str, Row]:
        wanted = list(dict.fromkeys(ids))

        def op(c: Connection) -> dict[str, Row]:
            found: dict[str, Row] = {}
            for chunk in _chunks(wanted):
                for row in c.execute(select(T).where(T.c.id.in_(chunk))):
                    found[row.id] = dict(row._mapping)
            return found

        return await self._run(op, conn=conn)

    async def tree(self, tree_id: str, conn: AsyncConnection | None = None) -> list[Row]:
        query = select(T).where(T.c.task_tree_id == tree_id).order_by(T.c.created_at, T.c.id)
        return await self._run(_rows, query, conn=conn)

    async def list(
        self,
        *,
        user_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Row]:
        query = _filtered(select(T), user_id=user_id, status=status)
        query = query.order_by(T.c.created_at.desc(), T.c.id.desc()).limit(limit).offset(offset)
        return await self._run(_rows, query)

    async def count(self, *, user_id: str | None = None, status: str | None = None,
                    product_id: str | None = None) -> int:
        query = _filtered(select(func.count()).select_from(T), user_id=user_id, status=status,
                          product_id=product_id)
        return await self._run(lambda c: int(c.execute(query).scalar_one()))

    async def children(self, parent_id: str) -> list[Row]:
        query = select(T).where(T.c.parent_id == parent_id).order_by(T.c.created_at, T.c.id)
        return await self._run(_rows, query)

    async def dependents(self, task_ids: Sequence[str], conn: AsyncConnection | None = None) -> list[Row]:
        """Tasks (in any tree) that list one of `task_ids` among their dependencies."""
        wanted = set(task_ids)
        text = cast(T.c.dependencies, String)

        def op(c: Connection) -> list[Row]:
            found: dict[str, Row] = {}
            for chunk in _chunks(sorted(wanted)):  # one scan per chunk, not per id
                # The JSON text holds an id as json.dumps writes it (non-ASCII escaped); match that.
                needles = (json.dumps(tid).replace("!", "!!").replace("%", "!%").replace("_", "!_")
                           for tid in chunk)
                query = select(T).where(or_(*(text.like(f"%{n}%", escape="!") for n in needles)))
                found.update((row["id"], row) for row in _rows(c, query))
            return list(found.values())

        rows = await self._run(op, conn=conn)
        return [r for r in rows if any(d.get("id") in wanted for d in r["dependencies"] or ())]

    async def stale_in_progress(self, now: str | None) -> list[str]:
        """In-progress task ids; with `now`, only those whose lease expired before it."""
        query = select(T.c.id).where(T.c.status == "in_progress")
        if now is not None:
            query = query.where(or_(T.c.lease_expires_at.is_(None), T.c.lease_expires_at < now))
        return await self._run(lambda c: list(c.execute(query).scalars()))

    # --- writes ---------------------------------------------------------------------------

    async def insert(self, rows: Sequence[Mapping[str, Any]], conn: AsyncConnection | None = None) -> None:
        if rows:
            full = [_with_defaults(row) for row in rows]
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

    async def write_batch(
        self,
        outcomes: Sequence[Mapping[str, Any]],
        progress: Sequence[Mapping[str, Any]],
        claims: Sequence[str],
        claim_values: Mapping[str, Any],
    ) -> set[str]:
        """The engine's pass in one transaction: outcomes, progress, then claims (CAS pending ->
        in_progress). Returns the claimed ids."""
        return await self._run(_write_batch, outcomes, progress, claims, claim_values)

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


@functools.lru_cache(maxsize=64)
def _finish_many_statement(keys: tuple[str, ...], only_status: tuple[str, ...]) -> Any:
    return (
        update(T)
        .where(and_(T.c.id == bindparam("_id"), or_(*(T.c.status == s for s in only_status))))
        .values({key: bindparam(f"_v_{key}") for key in keys})
    )


def _write_batch(
    conn: Connection,
    outcomes: Sequence[Mapping[str, Any]],
    progress: Sequence[Mapping[str, Any]],
    claims: Sequence[str],
    claim_values: Mapping[str, Any],
) -> set[str]:
    for rows in (outcomes, progress):
        if rows:
            keys = tuple(key for key in rows[0] if key != "id")
            conn.execute(
                _finish_many_statement(keys, ("in_progress",)),
                [{"_id": r["id"], **{f"_v_{key}": r[key] for key in keys}} for r in rows],
            )
    return set(_update_many(conn, list(claims), claim_values, ("pending",))) if claims else set()


_DEFAULTS: dict[str, Any] = {
    "description": None, "user_id": None, "parent_id": None, "priority": 1, "dependencies": [],
    "inputs": {}, "params": {}, "schemas": {}, "status": "pending", "progress": 0.0,
    "result": None, "error": None, "started_at": None, "completed_at": None,
    "product_id": None, "token_success": 0, "token_failed": 0, "original_task_id": None,
    "has_copy": False, "has_references": False, "origin_type": "own", "extra": {},
    "lease_owner": None, "lease_expires_at": None,
}


def _with_defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    """executemany needs every row to carry the same keys."""
    return {**_DEFAULTS, **{k: v for k, v in row.items() if k in T.c}}
