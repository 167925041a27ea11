"""From an A2A message to the task tree it executes, decided before the SDK creates its task.

SPEC.md wants the agent task's `context_id` to be the root task id, and the SDK fixes the context
id before the executor runs. So the tree is created (or found, or copied) here, in the SDK's
request-context builder step: its root id becomes the context id, and a bad tree is answered as a
JSON-RPC error instead of a failed agent task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from a2a.server.agent_execution import RequestContext, RequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import Message, SendMessageRequest, Task
from a2a.utils.errors import A2AError, InvalidParamsError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict

from agent.a2a.calls import PUSH_KEY, call_of
from agent.a2a.push import PushConfigError, PushTarget, PushTargets, check_url, parse_target
from agent.a2a.wire import restore_ints
from agent.errors import PERMISSION_DENIED, RpcError
from agent.rpc import params as p
from agent.rpc.jsonrpc import CallContext

if TYPE_CHECKING:  # pragma: no cover
    from agent.app import Services

STREAMING_METHODS = frozenset({"SendStreamingMessage", "message/stream"})
PUSH_METADATA_KEY = "push_notification_config"


@dataclass
class TreePlan:
    """What one agent task executes, and the numbers its status messages report."""

    task_id: str  # the task handed to the engine: the root of a new tree, or the named/copied one
    root_task_id: str  # the tree's root = the agent task's context id
    task_count: int
    user_id: str | None
    original_task_id: str | None = None
    stream: bool = False  # report every engine event as a status update
    # Per-execution context for executors (user, LLM key of the request); never stored.
    call: dict[str, Any] = field(default_factory=dict, repr=False)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"protocol": "a2a", "root_task_id": self.root_task_id}
        if self.user_id is not None:
            meta["user_id"] = self.user_id
        if self.original_task_id is not None:
            meta["original_task_id"] = self.original_task_id
        return meta


class TreeRequestContext(RequestContext):
    """The SDK's request context plus our plan, handed to TaskTreeAgentExecutor.execute."""

    def __init__(self, *args: Any, plan: TreePlan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan


def request_metadata(params: SendMessageRequest) -> dict[str, Any]:
    """Message metadata, overridden by request metadata (both places are used by clients)."""
    merged: dict[str, Any] = {}
    if params.message.HasField("metadata"):
        merged.update(MessageToDict(params.message.metadata))
    if params.HasField("metadata"):
        merged.update(MessageToDict(params.metadata))
    return restore_ints(merged)


def push_requested(params: SendMessageRequest, context: ServerCallContext) -> bool:
    """A push config anywhere in the request makes the execution asynchronous (SPEC.md rule 1)."""
    return (
        params.configuration.HasField("task_push_notification_config")
        or bool(context.state.get(PUSH_KEY))
        or PUSH_METADATA_KEY in request_metadata(params)
    )


def tasks_in(message: Message) -> Any:
    """The `tasks` of the first data part that carries them (`{tasks: [...]}` or a bare array)."""
    for part in message.parts:
        if not part.HasField("data"):
            continue
        value = restore_ints(MessageToDict(part.data))
        if isinstance(value, Mapping) and "tasks" in value:
            return value["tasks"]
        if isinstance(value, list):
            return value
    return None


def a2a_error(exc: RpcError) -> A2AError:
    """Our service errors in the SDK's terms (the SDK renders A2AError into JSON-RPC errors).

    Permission denied maps to TaskNotFoundError, whose JSON-RPC code (-32001) is ours as well.
    """
    detail = exc.data if isinstance(exc.data, str) and exc.data else exc.message
    if exc.code == PERMISSION_DENIED:
        return TaskNotFoundError(message=f"Permission denied: {detail}")
    return InvalidParamsError(message=detail)


class TreeRequestContextBuilder(RequestContextBuilder):
    def __init__(self, services: "Services", push_targets: PushTargets) -> None:
        self._services = services
        self._push = push_targets

    async def build(
        self,
        context: ServerCallContext,
        params: SendMessageRequest | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        task: Task | None = None,
    ) -> RequestContext:
        if params is None:
            return RequestContext(call_context=context, task_id=task_id, context_id=context_id, task=task)
        if task_id:
            raise InvalidParamsError(
                message=f"Agent task {task_id} cannot take another message: every message executes a task "
                        "tree; send a new message without taskId (use metadata.task_id to run a stored tree)"
            )
        call = call_of(context)
        metadata = request_metadata(params)
        extras = await self._push_extras(params, context, metadata)
        try:
            plan = await self._plan(params.message, metadata, call)
        except RpcError as exc:
            raise a2a_error(exc) from None
        plan.stream = (
            context.state.get("method") in STREAMING_METHODS
            or metadata.get("stream") is True
            or push_requested(params, context)
        )
        request_context = TreeRequestContext(
            call_context=context, request=params, context_id=plan.root_task_id, plan=plan,
        )
        if push_requested(params, context):
            assert request_context.task_id is not None
            self._push.enable(request_context.task_id, extras)
        return request_context

    async def _push_extras(self, params: SendMessageRequest, context: ServerCallContext,
                           metadata: Mapping[str, Any]) -> list[PushTarget]:
        """Headers/method from the raw body or metadata; every url checked against SSRF now."""
        extras: list[PushTarget] = list(context.state.get(PUSH_KEY) or [])
        try:
            if PUSH_METADATA_KEY in metadata:
                extras.append(parse_target(metadata[PUSH_METADATA_KEY], f"metadata.{PUSH_METADATA_KEY}"))
            urls = [e.url for e in extras if e.url]
            if params.configuration.HasField("task_push_notification_config"):
                urls.append(params.configuration.task_push_notification_config.url)
            for url in urls:
                await check_url(url, self._services.settings.allow_private_urls)
        except PushConfigError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return extras

    async def _plan(self, message: Message, metadata: Mapping[str, Any], call: CallContext) -> TreePlan:
        tasks = tasks_in(message)
        task_id = p.string(metadata, "task_id")
        copy_execution = p.boolean(metadata, "copy_execution", False)
        copy_children = p.boolean(metadata, "copy_children", False)
        if tasks is not None and task_id is not None:
            raise InvalidParamsError(message="Give either a data part {tasks: [...]} or metadata.task_id, not both")
        if copy_execution and task_id is None:
            raise InvalidParamsError(
                message="metadata.copy_execution needs metadata.task_id (it copies a stored tree; "
                        "it cannot be used with a data part {tasks: [...]})")
        if copy_children and not copy_execution:
            raise InvalidParamsError(message="metadata.copy_children needs metadata.copy_execution: true")
        run_call = {"user_id": call.caller.user_id, "llm_api_key": call.llm_api_key,
                    "llm_provider": call.llm_provider}
        if tasks is not None:
            rows = await self._services.tasks.create_tree({"tasks": tasks}, call.caller)
            root = rows[0]
            return TreePlan(task_id=root["id"], root_task_id=root["task_tree_id"], task_count=len(rows),
                            user_id=root["user_id"], call=run_call)
        if task_id is None:
            raise InvalidParamsError(
                message='The message must carry a data part {"tasks": [task objects]} to create and execute '
                        "a tree, or metadata.task_id to execute a stored one")
        return await self._existing(task_id, copy_execution, copy_children, call, run_call)

    async def _existing(self, task_id: str, copy_execution: bool, copy_children: bool, call: CallContext,
                        run_call: dict[str, Any]) -> TreePlan:
        repo = self._services.repo
        row = await repo.get(task_id)
        if row is None:
            raise InvalidParamsError(message=f"Task '{task_id}' not found")
        if not call.caller.can_access(row["user_id"]):
            raise TaskNotFoundError(message=f"Permission denied: you may not execute task '{task_id}'")
        original = None
        if copy_execution:
            copies = await self._services.tasks.copy_tree(task_id, copy_children, call.caller)
            original, task_id = task_id, {c["original_task_id"]: c["id"] for c in copies}[task_id]
            row = await repo.get(task_id)
            assert row is not None
        if row["origin_type"] == "archive":
            raise InvalidParamsError(message=f"Task '{task_id}' is an archive (read-only) and cannot be executed")
        if row["status"] == "in_progress" or task_id in self._services.engine.running:
            raise InvalidParamsError(message=f"Task '{task_id}' is already running")
        tree_id = row["task_tree_id"]
        count = len(await repo.tree(tree_id))
        return TreePlan(task_id=task_id, root_task_id=tree_id, task_count=count, user_id=row["user_id"],
                        original_task_id=original, call=run_call)
