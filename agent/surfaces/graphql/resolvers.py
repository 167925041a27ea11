"""GraphQL arguments -> the TaskService operations `/tasks` uses, and their answers -> TaskType.

Each resolver only renames: it builds the typed request of the operation (agent/foundations/requests.py,
its argument rules through `checked`) and calls the same service method as `/tasks` with a
CallContext, so validation, permission rules and messages are the ones of `/tasks`. createTask
under an existing parent (`parentId`), which `tasks.create` cannot express (it takes whole
trees), uses `TaskService.add_child`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import strawberry

from taskgrove.agent.foundations.errors import invalid_params, permission_denied, task_not_found
from taskgrove.agent.surfaces.graphql.list_budget import ListBudget, budget_of
from taskgrove.agent.surfaces.graphql.graphql_errors import checked, from_rpc, service_call
from taskgrove.agent.surfaces.graphql.types import (
    CreateTaskInput,
    PurgeResult,
    TaskStatusEnum,
    TaskType,
    UpdateTaskInput,
    children_of,
    given,
)
from taskgrove.agent.foundations.requests import (CancelTasks, DeleteTask, EmitEvent, ExecuteTask, GetTask, ListTasks, NewTree,
                                      PurgeTasks, RespondToTask, UpdateTask, task_id_text)
from taskgrove.agent.foundations.calls import CallContext

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.graphql.graphql_needs import GraphQLServices


@dataclass
class GraphQLContext:
    """What every resolver gets as `info.context`."""

    services: "GraphQLServices"
    call: CallContext
    request: Any = None
    response: Any = None
    # Filled by strawberry from a graphql-transport-ws `connection_init` payload.
    connection_params: Any = None
    # List items this request may still return (agent/surfaces/graphql/list_budget.py).
    list_budget: ListBudget | None = None


def _context(info: strawberry.Info) -> GraphQLContext:
    return info.context


def required(value: Any, name: str) -> str:
    """Arguments SPEC.md types as nullable `String` but every operation needs."""
    if value is None or value == "":
        raise from_rpc(invalid_params(f"{name} is required"))
    return value


# --- queries ----------------------------------------------------------------------------------


async def task(info: strawberry.Info, task_id: str | None) -> TaskType | None:
    ctx = _context(info)
    request = GetTask(checked(task_id_text, required(task_id, "taskId")))
    found = await service_call(ctx.services.tasks.get, request, ctx.call)
    return TaskType.from_wire(found) if found is not None else None


async def tasks(info: strawberry.Info, status: TaskStatusEnum | None, limit: int | None,
                offset: int | None) -> list[TaskType]:
    ctx = _context(info)
    budget = budget_of(info)
    budget.check(limit if isinstance(limit, int) and limit > 0 else 100)  # before reading: what is asked
    request = checked(ListTasks.page, status.value if status is not None else None, limit, offset)
    async with budget.turn():  # one list of the request at a time: others are served in between
        found = await service_call(ctx.services.tasks.list, request, ctx.call)
        budget.spend(len(found))
        return [TaskType.from_wire(t) for t in found]  # type: ignore[arg-type]  # no cursor asked: a plain list


async def task_children(info: strawberry.Info, parent_id: str | None) -> list[TaskType]:
    return await children_of(info, required(parent_id, "parentId"))


# --- mutations --------------------------------------------------------------------------------


async def create_task(info: strawberry.Info, task_input: CreateTaskInput | None) -> TaskType:
    """Store the task and start executing it, like tasks.create, but answer at once: the mutation
    returns the task as stored when execution started (usually PENDING); follow it with the
    taskStatusChanged subscription or the task query."""
    if task_input is None:
        raise from_rpc(invalid_params("taskInput is required"))
    ctx = _context(info)
    new: dict[str, Any] = {"name": task_input.name}
    for field in ("description", "priority", "inputs"):
        value = getattr(task_input, field)
        if given(value):
            new[field] = value
    if given(task_input.executor) and task_input.executor is not None:
        new["schemas"] = {"method": task_input.executor}
    parent_id = task_input.parent_id if given(task_input.parent_id) else None
    service = ctx.services.tasks
    if parent_id is None:
        rows = await service_call(service.create_tree, NewTree([new]), ctx.call.caller)
    else:
        rows = await service_call(service.add_child, parent_id, NewTree([new]), ctx.call.caller)
    task_id = rows[0]["id"]
    await service_call(ctx.services.executions.execute, ExecuteTask(task_id), ctx.call)
    created = await service_call(service.get, GetTask(task_id), ctx.call)
    assert created is not None
    return TaskType.from_wire(created)


async def update_task(info: strawberry.Info, task_id: str | None,
                      task_input: UpdateTaskInput | None) -> TaskType:
    ctx = _context(info)
    tid = checked(task_id_text, required(task_id, "taskId"))
    changes: dict[str, Any] = {}
    if task_input is not None:
        for field in ("name", "description", "inputs"):
            value = getattr(task_input, field)
            if given(value):
                changes[field] = value
        if given(task_input.status):
            changes["status"] = task_input.status.value if task_input.status is not None else None
    updated = await service_call(ctx.services.tasks.update, UpdateTask(tid, changes), ctx.call)
    return TaskType.from_wire(updated)


async def cancel_task(info: strawberry.Info, task_id: str | None) -> bool:
    """True when the task was cancelled; false when it had already finished. A missing task or
    one the caller may not see is an error, as on tasks.get."""
    ctx = _context(info)
    tid = required(task_id, "taskId")
    [answer] = await service_call(ctx.services.executions.cancel, checked(CancelTasks.one, tid), ctx.call)
    if answer["status"] == "cancelled":
        return True
    if answer.get("error") == "not_found":
        raise from_rpc(task_not_found(tid))
    if answer.get("error") == "permission_denied":
        raise from_rpc(permission_denied(f"You may not cancel task '{tid}'"))
    return False


async def delete_task(info: strawberry.Info, task_id: str | None) -> bool:
    ctx = _context(info)
    request = DeleteTask(checked(task_id_text, required(task_id, "taskId")))
    answer = await service_call(ctx.services.tasks.delete, request, ctx.call)
    return bool(answer["success"])


async def respond_to_task(info: strawberry.Info, task_id: str | None, value: Any) -> TaskType:
    """tasks.respond, then the task as it is now (usually PENDING again: its wait is answered)."""
    ctx = _context(info)
    tid = required(task_id, "taskId")
    params = {"task_id": tid, "value": value} if given(value) else {"task_id": tid}
    request = checked(RespondToTask.from_params, params)
    await service_call(ctx.services.waits.respond, request, ctx.call)
    answered = await service_call(ctx.services.tasks.get, GetTask(request.task_id), ctx.call)
    if answered is None:  # deleted in between
        raise from_rpc(task_not_found(request.task_id))
    return TaskType.from_wire(answered)


async def emit_event(info: strawberry.Info, name: str | None, payload: Any, user_id: str | None) -> int:
    """events.emit; the number of waits the event resumed."""
    ctx = _context(info)
    request = checked(EmitEvent.of, required(name, "name"), payload, user_id)
    answer = await service_call(ctx.services.waits.emit, request, ctx.call)
    return int(answer["resumed"])


async def purge_tasks(info: strawberry.Info, older_than: str | None) -> PurgeResult:
    """tasks.purge (admins): one retention sweep now; what it deleted."""
    ctx = _context(info)
    request = checked(PurgeTasks.from_params, {"older_than": older_than})
    return PurgeResult.from_wire(await service_call(ctx.services.retention.purge,  # type: ignore[union-attr]  # set by Services.build
                                                    request, ctx.call))
