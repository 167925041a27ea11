"""The statements of schedules (the service runs them through `TaskRepository.transact`).

A schedule's `next_run_at` is the slot its next run is due at. `claim_slot` consumes a slot with
one compare-and-set (`UPDATE schedules ... WHERE id = :id AND next_run_at = :slot AND enabled`)
and, in the same transaction, inserts the run: a copy of the template tree and the copy's
execution row. Whichever instance's statement changes the row owns the slot; every other one
changes nothing and runs nothing. A crash before the commit loses nothing (the slot is still
due), a crash after it duplicates nothing (the execution is in the database and is continued by
the engine: at the next start on SQLite, by another instance on lease expiry on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, case, delete, func, insert, literal, null, select, update
from sqlalchemy.engine import Connection

from taskgrove.storage import executions, tree_insert
from taskgrove.storage import copy_plan
from taskgrove.storage.attempts import ms_between
from taskgrove.storage.models import executions_table as X
from taskgrove.storage.repository import TaskRepository, read_tree
from taskgrove.storage.models import schedules_table
from taskgrove.storage.models import tasks_table as T

Row = dict[str, Any]


def runs_of(c: Connection, schedule: Mapping[str, Any], limit: int) -> list[Row]:
    """The trees a schedule started (their roots carry `extra.schedule_id`, see _copies), newest
    first, each with its first execution (the run the schedule started): when it began and ended,
    how, and how long it took (`duration_ms`; None while it runs)."""
    owner = T.c.user_id.is_(None) if schedule["user_id"] is None else T.c.user_id == schedule["user_id"]
    roots = c.execute(select(T.c.id, T.c.name, T.c.status, T.c.extra, T.c.created_at)
                      .where(T.c.parent_id.is_(None), owner, T.c.original_task_id == schedule["task_id"],
                             T.c.extra["schedule_id"].as_string() == schedule["id"])
                      .order_by(T.c.created_at.desc(), T.c.id).limit(limit)).all()
    first: dict[str, Row] = {}
    if roots:
        found = c.execute(select(X.c.task_tree_id, X.c.created_at, X.c.ended_at, X.c.final_status)
                          .where(X.c.task_tree_id.in_([r.id for r in roots])).order_by(X.c.created_at.desc()))
        for e in found:
            first[e.task_tree_id] = dict(e._mapping)  # the earliest wins (read last)
    runs = []
    for root in roots:
        run = first.get(root.id) or {}
        runs.append({"root_task_id": root.id, "name": root.name, "status": root.status,
                     "slot": (root.extra or {}).get("schedule_slot"),
                     "started_at": run.get("created_at", root.created_at), "ended_at": run.get("ended_at"),
                     "final_status": run.get("final_status"),
                     "duration_ms": ms_between(run.get("created_at"), run.get("ended_at"))})
    return runs


def insert_schedule(c: Connection, row: Mapping[str, Any]) -> None:
    c.execute(insert(schedules_table), dict(row))


def get_schedule(c: Connection, schedule_id: str) -> Row | None:
    found = c.execute(select(schedules_table).where(schedules_table.c.id == schedule_id)).first()
    return dict(found._mapping) if found else None


def list_schedules(c: Connection, user_id: str | None, task_id: str | None, limit: int, offset: int) -> list[Row]:
    query = select(schedules_table)
    if user_id is not None:
        query = query.where(schedules_table.c.user_id == user_id)
    if task_id is not None:
        query = query.where(schedules_table.c.task_id == task_id)
    query = query.order_by(schedules_table.c.created_at.desc(), schedules_table.c.id)
    query = query.limit(limit).offset(offset)
    return [dict(r._mapping) for r in c.execute(query)]


def update_schedule(c: Connection, schedule_id: str, values: Mapping[str, Any]) -> Row | None:
    c.execute(update(schedules_table).where(schedules_table.c.id == schedule_id).values(**values))
    return get_schedule(c, schedule_id)


def delete_schedule(c: Connection, schedule_id: str) -> bool:
    return c.execute(delete(schedules_table).where(schedules_table.c.id == schedule_id)).rowcount > 0


def due(c: Connection, now: str, limit: int = 100) -> list[Row]:
    """Enabled schedules whose slot has come, the most overdue first."""
    columns = schedules_table.c
    query = (select(schedules_table).where(columns.enabled.is_(True), columns.next_run_at.is_not(None),
                                           columns.next_run_at <= now)
             .order_by(columns.next_run_at).limit(limit))
    return [dict(r._mapping) for r in c.execute(query)]


def earliest(c: Connection) -> str | None:
    """The earliest slot of any enabled schedule (when the scheduler must look again)."""
    columns = schedules_table.c
    return c.execute(select(func.min(columns.next_run_at)).where(columns.enabled.is_(True))).scalar()


def template_rows(c: Connection, task_id: str) -> list[Row] | None:
    """The template tree rooted at `task_id`; None when that task is gone."""
    root = c.execute(select(T.c.task_tree_id).where(T.c.id == task_id)).first()
    if root is None:
        return None
    return read_tree(c, root.task_tree_id)


def claim_slot(c: Connection, schedule: Mapping[str, Any], slot: str | None, next_run_at: str | None,
               run: bool, stamp: str, owner: str, until: str, traceparent: str | None = None) -> Row | None:
    """Consume `slot` of `schedule` (None: a manual run, which consumes no slot), and start its run.

    `run=False` consumes the slot without a run (a missed slot with `catch_up: none`). With
    `overlap: skip`, a slot whose previous run is still executing is consumed without a run too.
    Returns None when the slot was not ours to take (claimed elsewhere, schedule changed or
    disabled); else {"schedule": the updated row, "execution": row or None, "copies": rows}.
    `traceparent`: the trace the run's execution belongs to (tree_insert.insert_tree).
    """
    busy = (slot is not None and schedule["overlap"] == "skip" and schedule["last_root_task_id"] is not None
            and executions.running_execution(c, schedule["last_root_task_id"]) is not None)
    copies: list[Row] = []
    template = template_rows(c, schedule["task_id"]) if run and not busy else None
    values: dict[str, Any] = {"updated_at": stamp}
    columns = schedules_table.c
    if template is not None:
        copies = _copies(template, schedule["task_id"], schedule["id"], slot)
        values.update(runs=columns.runs + 1, last_run_at=stamp, last_slot=slot, last_root_task_id=copies[0]["id"])
        ends = and_(columns.max_runs.is_not(None), columns.runs + 1 >= columns.max_runs)
    else:  # consumed without a run; a template that is gone stops the schedule
        values.update(skipped=columns.skipped + 1, last_skipped_at=stamp)
        ends = literal(run and not busy)
    if slot is not None:
        values["next_run_at"] = case((ends, null()), else_=literal(next_run_at) if next_run_at else null())
        where = and_(columns.id == schedule["id"], columns.next_run_at == slot, columns.enabled.is_(True),
                     (columns.max_runs.is_(None)) | (columns.runs < columns.max_runs))
    else:
        values["next_run_at"] = case((ends, null()), else_=columns.next_run_at)
        where = columns.id == schedule["id"]
    if template is None and run and not busy:
        values["enabled"] = False
    claimed = c.execute(update(schedules_table).where(where).values(**values).returning(*columns)).first()
    if claimed is None:
        return None
    execution = None
    if copies:
        execution = tree_insert.insert_tree(c, copies, schedule["user_id"], owner, until, stamp,
                                           webhook=schedule["webhook_config"], traceparent=traceparent)
        # Only the first run marks the template: later runs lock no template row (two schedules of
        # one template claimed at once on two instances must not wait on each other).
        originals = sorted({copy["original_task_id"] for copy in copies})
        c.execute(update(T).where(T.c.id.in_(originals), T.c.has_copy.is_(False)).values(has_copy=True))
    return {"schedule": dict(claimed._mapping), "execution": execution, "copies": copies}


def _copies(template: list[Row], task_id: str, schedule_id: str, slot: str | None) -> list[Row]:
    """A fresh copy of the template (tasks.copy semantics), root first; the root names its run."""
    selected, root = copy_plan.connect(template, copy_plan.copy_selection(template, task_id, False))
    copies = copy_plan.plan_copies(template, selected, root, origin_for=dict.fromkeys(selected, "clone"),
                                   reset=copy_plan.RESETTABLE)
    copies[0]["extra"] = {**(copies[0].get("extra") or {}), "schedule_id": schedule_id, "schedule_slot": slot}
    return copies


class ScheduleStore:
    """The schedules' named operations, each one transaction of its own running the statement
    function above of the same name: what the schedule service and the schedule loop call
    (issue 44: storage offers named operations; nothing above it hands functions to `transact`)."""

    def __init__(self, repo: TaskRepository) -> None:
        self._transact = repo.transact

    async def get(self, schedule_id: str) -> Row | None:
        return await self._transact(get_schedule, schedule_id)

    async def insert(self, row: Mapping[str, Any]) -> None:
        await self._transact(insert_schedule, row)

    async def runs_of(self, schedule: Mapping[str, Any], limit: int) -> list[Row]:
        return await self._transact(runs_of, schedule, limit)

    async def listing(self, user_id: str | None, task_id: str | None, limit: int, offset: int) -> list[Row]:
        return await self._transact(list_schedules, user_id, task_id, limit, offset)

    async def update(self, schedule_id: str, values: Mapping[str, Any]) -> Row | None:
        return await self._transact(update_schedule, schedule_id, values)

    async def delete(self, schedule_id: str) -> bool:
        return await self._transact(delete_schedule, schedule_id)

    async def due(self, now: str, limit: int = 100) -> list[Row]:
        return await self._transact(due, now, limit)

    async def earliest(self) -> str | None:
        return await self._transact(earliest)

    async def claim_slot(self, schedule: Mapping[str, Any], slot: str | None, next_run_at: str | None, run: bool,
                         stamp: str, owner: str, until: str, traceparent: str | None = None) -> Row | None:
        return await self._transact(claim_slot, schedule, slot, next_run_at, run, stamp, owner, until, traceparent)
