"""The attempt history: one row per attempt of a task (the timeline, docs/observability.md).

A task row holds only its current attempt; this table keeps every one. Rows are written where the
outcome they record is written, in the same transaction: the engine's pass (storage/executions.py
and statements.pass_statement, whose `history` part inserts them on PostgreSQL), the settling of
an interrupted attempt, a cancel. They are deleted with their task (`delete_of`, called by every
deleter of tasks), so nothing else ever needs to clean them up.

Durations are computed here only (`public`), so every surface reports them alike.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection

from taskgrove.storage import statements
from taskgrove.storage.models import task_attempts_table as A
from taskgrove.storage.status import TaskStatus

# How an attempt ended (the `outcome` column).
COMPLETED, FAILED, RETRY, INTERRUPTED, CANCELLED, WAITING = (
    "completed", "failed", "retry", "interrupted", "cancelled", "waiting")
OUTCOMES = (COMPLETED, FAILED, RETRY, INTERRUPTED, CANCELLED, WAITING)
RUNNING = "running"  # shown for the attempt in progress, never stored


class Attempt(NamedTuple):
    """One row of the history, in statements.INSERT_ATTEMPT's argument order."""

    task_id: str
    attempt: int
    queued_at: str | None
    started_at: str | None
    ended_at: str | None
    outcome: str
    error: str | None


def insert_rows(c: Connection, rows: Sequence[Attempt]) -> None:
    """Add rows in the caller's transaction. SQLite: one executemany on the driver's cursor (the
    pass's own path, see executions._sqlite_fenced_writes for why)."""
    if not rows:
        return
    if c.dialect.name == "sqlite":
        insert_on_cursor(c.connection.driver_connection.cursor(), rows)
    else:
        c.execute(insert(A), [row._asdict() for row in rows])


def insert_on_cursor(cursor: sqlite3.Cursor, rows: Sequence[Attempt]) -> None:
    """SQLite: add rows on a cursor of the driver's connection (executions.sqlite_pass passes its
    own). One row, a chain's every pass, is one execute: no executemany around it."""
    if len(rows) == 1:
        cursor.execute(statements.INSERT_ATTEMPT.sqlite, rows[0])
    elif rows:
        cursor.executemany(statements.INSERT_ATTEMPT.sqlite, rows)


def delete_of(c: Connection, task_ids: Sequence[str]) -> None:
    """Delete the history of these tasks, in the transaction that deletes the tasks."""
    for start in range(0, len(task_ids), 500):
        c.execute(delete(A).where(A.c.task_id.in_(task_ids[start:start + 500])))


def of_task(c: Connection, task_id: str) -> list[dict[str, Any]]:
    """A task's attempts, oldest first, with their durations."""
    query = select(A).where(A.c.task_id == task_id).order_by(A.c.id)
    return [public(row._mapping) for row in c.execute(query)]


def of_tasks(c: Connection, task_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The attempts of many tasks (a tree's), by task id, each list oldest first."""
    found: dict[str, list[dict[str, Any]]] = {tid: [] for tid in task_ids}
    for start in range(0, len(task_ids), 500):
        query = select(A).where(A.c.task_id.in_(task_ids[start:start + 500])).order_by(A.c.id)
        for row in c.execute(query):
            found[row.task_id].append(public(row._mapping))
    return found


def public(row: Mapping[str, Any]) -> dict[str, Any]:
    """An attempt as the API shows it: its columns without the row id, plus `queued_ms` (runnable
    until started) and `ran_ms` (started until ended); None where a time is missing (still
    running, or never started)."""
    shown = {key: row[key] for key in ("attempt", "queued_at", "started_at", "ended_at", "outcome", "error")}
    shown["queued_ms"] = ms_between(row["queued_at"], row["started_at"])
    shown["ran_ms"] = ms_between(row["started_at"], row["ended_at"])
    return shown


def with_current(history: list[dict[str, Any]], task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A task's history, each attempt with its `task_id`, plus the attempt running now (it has no
    row until it ends): outcome `running`, no `ended_at`. A parked task's attempt ended `waiting`;
    it shows no running attempt."""
    shown = [{"task_id": task["id"], **attempt} for attempt in history]
    if task["status"] == TaskStatus.IN_PROGRESS and task.get("waiting") is None and task.get("started_at"):
        shown.append({"task_id": task["id"], **public({
            "attempt": task.get("attempt") or 1, "queued_at": None, "started_at": task["started_at"],
            "ended_at": None, "outcome": RUNNING, "error": None})})
    return shown


def ms_between(earlier: str | None, later: str | None) -> float | None:
    """Milliseconds from one stored time to another (every duration the API shows: attempts
    here, schedules' runs in storage/schedule_store.py), None if one is missing."""
    if not earlier or not later:
        return None
    delta = datetime.fromisoformat(later) - datetime.fromisoformat(earlier)
    return round(max(0.0, delta.total_seconds() * 1000.0), 3)


def seconds_between(earlier: str | None, later: str | None) -> float | None:
    """Seconds from one stored time to another (the queue wait metric, once per attempt), None if
    one is missing, never negative. Two stored times (clock.now_iso: `...THH:MM:SS.ffffff+00:00`)
    of the same minute, the usual case, are told apart by their seconds alone: a fifth of the
    cost of parsing both."""
    if not earlier or not later:
        return None
    if len(earlier) == len(later) == 32 and earlier[:17] == later[:17] and earlier[26:] == later[26:]:
        return max(0.0, float(later[17:26]) - float(earlier[17:26]))
    ms = ms_between(earlier, later)
    return None if ms is None else ms / 1000.0


def rows_for(accepted: Iterable[str], history: Mapping[str, Attempt]) -> list[Attempt]:
    """The history rows of the writes the database accepted (an attempt whose token was refused
    recorded nothing)."""
    return [history[tid] for tid in accepted if tid in history]
