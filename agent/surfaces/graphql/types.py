"""The GraphQL types of SPEC.md (Typed query surface types), with the names and fields it gives.

`TaskType` is built from the wire task dict every other surface returns (`storage.task_view.public`),
so GraphQL shows exactly what `/tasks` shows, only typed: `result` is JSON text (the SPEC type is
String), timestamps are `DateTime`, statuses the upper-case `TaskStatusEnum`.
"""

import json
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

import strawberry
from strawberry.scalars import JSON

from taskgrove.agent.surfaces.graphql.agent_types import WaitingAgentType
from taskgrove.agent.surfaces.graphql.list_budget import budget_of
from taskgrove.agent.surfaces.graphql.graphql_errors import checked, service_call
from taskgrove.agent.foundations.requests import ListChildren, task_id_text
from taskgrove.storage.status import TaskStatus


# The members of storage's TaskStatus, under the names GraphQL shows (PENDING, ...).
if TYPE_CHECKING:  # the same members and values, as mypy can read them
    TaskStatusEnum = TaskStatus
else:
    TaskStatusEnum = strawberry.enum(Enum("TaskStatusEnum", [(s.name, s.value) for s in TaskStatus]),
                                     description="Task status; the JSON-RPC surface spells the same values in lower case.")


TERMINAL = frozenset({TaskStatusEnum.COMPLETED, TaskStatusEnum.FAILED, TaskStatusEnum.CANCELLED})


def _timestamp(value: Any) -> Optional[datetime]:
    if not value:
        return None
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _json_text(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value, default=str)


@strawberry.type(description="What a waiting task waits for (docs/waits.md): kind INPUT, EVENT, TIMER or "
                             "AGENT_INPUT (a remote agent's question, docs/agents.md).")
class WaitingType:
    kind: str = strawberry.field(description="input, event, timer or agent_input (the wire's words).")
    prompt: Optional[str]
    schema: Optional[JSON] = strawberry.field(description="The JSON Schema an answer must pass, or null.")
    since: Optional[datetime]
    deadline: Optional[datetime]
    event: Optional[str] = strawberry.field(default=None, description="An event wait's event name.")
    match: Optional[JSON] = strawberry.field(default=None, description="An event wait's payload keys to match.")
    agent: Optional[WaitingAgentType] = strawberry.field(
        default=None, description="An agent_input wait's agent: who asks (answer with respondToTask).")

    @classmethod
    def from_wire(cls, wait: Optional[Mapping[str, Any]]) -> Optional["WaitingType"]:
        if not wait:
            return None
        return cls(kind=wait["kind"], prompt=wait.get("prompt"), schema=wait.get("schema"),
                   since=_timestamp(wait.get("since")), deadline=_timestamp(wait.get("deadline")),
                   event=wait.get("event"), match=wait.get("match"), agent=WaitingAgentType.from_wire(wait.get("agent")))


@strawberry.type(description="A task. `children` are its direct children (read on demand).")
class TaskType:
    id: str
    name: str
    status: TaskStatusEnum
    priority: int
    progress: float
    result: Optional[str] = strawberry.field(description="The task result as JSON text, or null.")
    error: Optional[str]
    created_at: Optional[datetime]
    updated_at: Optional[datetime]
    parent_id: Optional[str]
    description: Optional[str]
    waiting: Optional[WaitingType] = strawberry.field(
        default=None, description="What the task waits for while it is parked (answer with respondToTask); null otherwise.")

    @strawberry.field(description="Direct children, oldest first; tasks the caller may not see are left out.")
    async def children(self, info: strawberry.Info) -> Optional[list["TaskType"]]:
        return await children_of(info, self.id)

    @classmethod
    def from_wire(cls, task: Mapping[str, Any]) -> "TaskType":
        return cls(
            id=task["id"],
            name=task["name"],
            status=TaskStatusEnum(task["status"]),
            priority=int(task["priority"]),
            progress=float(task["progress"] or 0.0),
            result=_json_text(task.get("result")),
            error=task.get("error"),
            created_at=_timestamp(task.get("created_at")),
            updated_at=_timestamp(task.get("updated_at")),
            parent_id=task.get("parent_id"),
            description=task.get("description"),
            waiting=WaitingType.from_wire(task.get("waiting")),
        )


@strawberry.input(description="A new task. `executor` becomes `schemas.method`; `parentId` adds it under an existing task.")
class CreateTaskInput:
    name: str
    description: Optional[str] = strawberry.UNSET
    executor: Optional[str] = strawberry.UNSET
    priority: Optional[int] = strawberry.UNSET
    inputs: Optional[JSON] = strawberry.UNSET
    parent_id: Optional[str] = strawberry.UNSET


@strawberry.input(description="Fields to change; fields left out are unchanged (same rules as tasks.update).")
class UpdateTaskInput:
    name: Optional[str] = strawberry.UNSET
    description: Optional[str] = strawberry.UNSET
    status: Optional[TaskStatusEnum] = strawberry.UNSET
    inputs: Optional[JSON] = strawberry.UNSET


async def children_of(info: strawberry.Info, parent_id: str) -> list[TaskType]:
    """`parent_id`'s direct children as the caller may see them (`info.context` is a GraphQLContext)."""
    ctx = info.context
    request = ListChildren(checked(task_id_text, parent_id, "parent_id"))
    budget = budget_of(info)
    async with budget.turn():  # one list of the request at a time (list_budget.py says why)
        found = await service_call(ctx.services.tasks.children, request, ctx.call)
        budget.spend(len(found))
        return [TaskType.from_wire(t) for t in found]


def given(value: Any) -> bool:
    """True when a client supplied the input field (explicit null included)."""
    return value is not strawberry.UNSET


@strawberry.type(description="What one retention sweep deleted (purgeTasks; the answer of tasks.purge).")
class PurgeResult:
    swept: bool = strawberry.field(description="false: another instance was sweeping (PostgreSQL); nothing was done")
    trees: int
    tasks: int
    idempotency_records: int
    events: int
    trigger_events: int = strawberry.field(description="Handled inbox rows of triggers (docs/triggers.md)")
    older_than: float = strawberry.field(description="The age in seconds a tree had to have ended at")

    @classmethod
    def from_wire(cls, answer: Mapping[str, Any]) -> "PurgeResult":
        return cls(swept=answer["swept"], trees=answer["trees"], tasks=answer["tasks"],
                   idempotency_records=answer["idempotency_records"], events=answer["events"],
                   trigger_events=answer["trigger_events"], older_than=answer["older_than"])
