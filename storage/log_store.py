"""The statements of task logs (agent/engine/logbook.py decides when they run).

Lines are written in batches (one statement for every line a flush holds) and read by task in
`seq` order, a page at a time: `after` is the last `seq` a reader has, so a follower asks for
what came since. They are deleted with their task, in the same transaction
(TaskRepository.delete calls `delete_of`), so every deleter of tasks deletes their lines too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection

from taskgrove.storage.models import task_logs_table as L

Row = dict[str, Any]
STREAMS = ("log", "stdout", "stderr", "http")
COLUMNS = ("task_id", "attempt", "at", "stream", "level", "text")

_INSERT = insert(L).returning(L.c.seq, sort_by_parameter_order=True)


def insert_lines(c: Connection, lines: Sequence[Mapping[str, Any]]) -> list[int]:
    """Store `lines` (each with every key of COLUMNS) in one statement; their `seq`s, in order."""
    if not lines:
        return []
    return list(c.execute(_INSERT, [{key: line[key] for key in COLUMNS} for line in lines]).scalars())


def read_lines(c: Connection, task_id: str, *, attempt: int | None = None, after: int | None = None,
               limit: int = 1000) -> list[Row]:
    """The lines of `task_id` after `seq` `after` (all when None), of one attempt or all, oldest
    first, at most `limit`."""
    query = select(L.c.seq, L.c.attempt, L.c.at, L.c.stream, L.c.level, L.c.text).where(L.c.task_id == task_id)
    if attempt is not None:
        query = query.where(L.c.attempt == attempt)
    if after is not None:
        query = query.where(L.c.seq > after)
    return [dict(row._mapping) for row in c.execute(query.order_by(L.c.seq).limit(limit))]


def delete_of(c: Connection, task_ids: Sequence[str]) -> None:
    """Delete the lines of `task_ids` (the caller's transaction deletes the tasks)."""
    if task_ids:
        c.execute(delete(L).where(L.c.task_id.in_(list(task_ids))))
