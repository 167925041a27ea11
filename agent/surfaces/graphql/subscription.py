"""taskStatusChanged: one task's status changes, from the event bus, until a terminal status.

The stream opens with the task's current state (so a client that subscribes just after
createTask, or to a task that already finished, is never left waiting for an event that has
passed), then emits a TaskType each time the status changes, whoever changes it: IN_PROGRESS when
the engine starts the task, PENDING while it waits for a retry, any status set by hand
(`status_changed` events), then COMPLETED, FAILED or CANCELLED, after which it completes.
Progress-only events do not change the status and are not emitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import strawberry
from graphql import GraphQLError

from taskgrove.agent.engine import bus
from taskgrove.agent.engine.bus import BusSubscription
from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE, task_not_found
from taskgrove.agent.surfaces.graphql.graphql_errors import checked, from_rpc, service_call
from taskgrove.agent.surfaces.graphql.resolvers import GraphQLContext, required
from taskgrove.agent.surfaces.graphql.types import TERMINAL, TaskStatusEnum, TaskType
from taskgrove.agent.foundations.requests import GetTask, task_id_text
from taskgrove.agent.services.task_service import TaskService

STATUS_EVENTS = frozenset({bus.TASK_START, bus.TASK_COMPLETED, bus.TASK_FAILED, bus.TASK_CANCELLED})
# Status changes are a handful per task; the queue only has to bridge a slow consumer.
BUFFER_EVENTS = 64
# How long to wait for an event before reading the stored task: an event from another instance
# can be lost (NOTIFY), and the database is the truth.
CHECK_EVERY = 2.0


async def _next_change(subscription: BusSubscription, service: TaskService, tid: str, ctx: GraphQLContext) -> Mapping[str, Any] | None:
    """The next status event, or the stored task once it has ended without its event arriving;
    None when the task is gone."""
    while True:
        try:  # asyncio.timeout, not wait_for: a cancel (the client went away) must end the wait
            async with asyncio.timeout(CHECK_EVERY):
                return await subscription.get()
        except TimeoutError:
            try:
                stored = await service_call(service.get, GetTask(tid), ctx.call)
            except GraphQLError as exc:  # the database away: the events still come; look again later
                if (exc.extensions or {}).get("code") == DATABASE_UNAVAILABLE:
                    continue
                raise
            if stored is None or TaskStatusEnum(stored["status"]) in TERMINAL:
                return stored


def _overlay(task: Mapping[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
    """The stored task with the event's own values: the row may already be a step further."""
    merged = dict(task)
    merged["status"] = event["status"]
    merged["progress"] = event.get("progress", merged.get("progress"))
    if "result" in event:
        merged["result"] = event["result"]
    if "error" in event:
        merged["error"] = event["error"]
    return merged


async def task_status_changes(info: strawberry.Info, task_id: str | None) -> AsyncGenerator[TaskType, None]:
    ctx: GraphQLContext = info.context
    tid = checked(task_id_text, required(task_id, "taskId"))
    service = ctx.services.tasks
    subscription = ctx.services.bus.subscribe(
        lambda e: e["task_id"] == tid and (e["type"] in STATUS_EVENTS or e.get("status_changed", False)),
        maxsize=BUFFER_EVENTS)
    try:
        live = ctx.services.engine.live_state(tid)  # same step as subscribing: no gap
        current = await service_call(service.get, GetTask(tid), ctx.call)
        if current is None:
            raise from_rpc(task_not_found(tid))
        if live is not None:
            current = {**current, **live}
        last = TaskStatusEnum(current["status"])
        yield TaskType.from_wire(current)
        while last not in TERMINAL:
            event = await _next_change(subscription, service, tid, ctx)
            if event is None:  # deleted meanwhile: nothing more will happen to it
                return
            status = TaskStatusEnum(event["status"])
            if status == last:
                continue
            stored = await service_call(service.get, GetTask(tid), ctx.call)
            if stored is None:  # deleted meanwhile: nothing more will happen to it
                return
            last = status
            yield TaskType.from_wire(_overlay(stored, event))
    finally:
        subscription.close()
