"""Our own methods on POST `/`: `tasks.execute` / `execute_task_tree` with a task tree, and `cancel`.

`tasks.execute` with `params.tasks` (or `metadata.task_id` and no `params.task_id`) is an agent
execution: it is turned into an A2A SendMessage and goes through the SDK handler like
`message/send`, so both share one implementation; the answer is the agent-surface task object.
With `params.task_id` it is the `/tasks` method, answered by TaskService with `protocol: a2a`.

`cancel` answers with a status-update object (SPEC.md, `cancel` method) and does its work with
`TaskService.cancel_one`, so its messages are the ones `tasks.cancel` gives.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from a2a.server.routes import ServerCallContextBuilder
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError
from google.protobuf import struct_pb2
from google.protobuf.json_format import ParseDict, ParseError

from taskgrove.agent.surfaces.a2a.caller_context import CALL_KEY, PUSH_KEY
from taskgrove.agent.surfaces.a2a.handler import TaskgroveRequestHandler
from taskgrove.agent.surfaces.a2a.push import PushConfigError, parse_target
from taskgrove.agent.surfaces.a2a.wire import PROTOCOL, event_json, task_json
from taskgrove.agent.foundations.errors import INTERNAL_ERROR, RpcError, invalid_params
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply
from taskgrove.agent.foundations.params import checked_text
from taskgrove.storage.clock import now_iso

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

log = logging.getLogger(__name__)
EXECUTE_METHODS = ("tasks.execute", "execute_task_tree")
PUSH_CONFIG_KEYS = ("push_notification_config", "pushNotificationConfig")
MISSING_TASK_ID = "Task ID not found in context"


def _wants_message(method: Any) -> Handler:
    """A handler that also receives the whole request object (top-level `metadata`, `task_id`)."""

    async def handler(params: Any, ctx: CallContext, message: Mapping[str, Any]) -> Any:
        return await method(params, ctx, message)

    handler.wants_message = True  # type: ignore[attr-defined]  # read by agent.surfaces.jsonrpc.call_one
    return handler  # type: ignore[return-value]


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid_params(f"{where} must be an object")
    return dict(value)


def rpc_error(exc: A2AError) -> RpcError:
    """An SDK error as our JSON-RPC error, with the code the SDK would send for it."""
    return RpcError(JSON_RPC_ERROR_CODE_MAP.get(type(exc), INTERNAL_ERROR), exc.message, exc.message)


class AgentMethods:
    """The methods POST `/` answers itself (everything else goes to the SDK's JSON-RPC app)."""

    def __init__(self, services: "A2AServices", handler: TaskgroveRequestHandler,
                 context_builder: ServerCallContextBuilder) -> None:
        self._services = services
        self._handler = handler
        self._context_builder = context_builder

    def table(self) -> dict[str, Handler]:
        methods: dict[str, Handler] = dict(self._services.task_methods)
        for name in EXECUTE_METHODS:
            methods[name] = _wants_message(self.execute)
        methods["cancel"] = _wants_message(self.cancel)
        return methods

    # --- tasks.execute --------------------------------------------------------------------

    async def execute(self, params: Any, ctx: CallContext, message: Mapping[str, Any]) -> Any:
        params = _object(params, "params")
        metadata = {**_object(message.get("metadata"), "metadata"), **_object(params.get("metadata"), "params.metadata")}
        is_agent_run = "tasks" in params or ("task_id" not in params and "id" not in params and "task_id" in metadata)
        if not is_agent_run:
            return await self._services.task_methods["tasks.execute"](params, ctx)
        return await self._agent_execute(params, metadata, ctx, message)

    async def _agent_execute(self, params: dict[str, Any], metadata: dict[str, Any], ctx: CallContext,
                             message: Mapping[str, Any]) -> Any:
        request = SendMessageRequest(message=Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4())))
        try:
            if "tasks" in params:
                request.message.parts.append(Part(data=ParseDict({"tasks": params["tasks"]}, struct_pb2.Value())))
            else:  # a message needs a part; the stored tree is named by metadata.task_id
                request.message.parts.append(Part(data=ParseDict({"task_id": metadata.get("task_id")},
                                                                 struct_pb2.Value())))
            if metadata:
                ParseDict(metadata, request.metadata)
        except (ParseError, TypeError, ValueError):
            raise invalid_params("params.tasks and metadata must be plain JSON objects and arrays "
                                 "(strings, finite numbers, booleans, null)") from None
        configuration = {**_object(message.get("configuration"), "configuration"),
                         **_object(params.get("configuration"), "params.configuration")}
        raw_push = next((configuration[k] for k in PUSH_CONFIG_KEYS if configuration.get(k) is not None), None)
        extras = []
        if raw_push is not None:
            try:
                target = parse_target(raw_push, "configuration.push_notification_config")
            except PushConfigError as exc:
                raise invalid_params(str(exc)) from None
            if target.url is None:
                raise invalid_params("configuration.push_notification_config.url is required")
            request.configuration.task_push_notification_config.url = target.url
            for key in ("token", "id"):
                if isinstance(raw_push.get(key), str):
                    setattr(request.configuration.task_push_notification_config, key, raw_push[key])
            extras.append(target)
        if ctx.request is None:
            raise RuntimeError("tasks.execute on / needs the HTTP request")
        setattr(ctx.request.state, CALL_KEY, ctx)
        setattr(ctx.request.state, PUSH_KEY, extras)
        server_ctx = self._context_builder.build(ctx.request)
        try:
            if metadata.get("stream") is True:
                stream = self._handler.on_message_send_stream(request, server_ctx)
                first = await anext(stream)
                return StreamReply(first=event_json(first), events=_rendered(stream))
            return task_json(await self._handler.on_message_send(request, server_ctx))
        except A2AError as exc:
            raise rpc_error(exc) from None

    # --- cancel ---------------------------------------------------------------------------

    async def cancel(self, params: Any, ctx: CallContext, message: Mapping[str, Any]) -> dict[str, Any]:
        params = params if isinstance(params, Mapping) else {}
        given = message.get("metadata")
        metadata = given if isinstance(given, Mapping) else {}
        candidates = (message.get("task_id"), message.get("context_id"), metadata.get("task_id"),
                      metadata.get("context_id"), params.get("task_id"), params.get("context_id"))
        task_id = next((c for c in candidates if isinstance(c, str) and c), None)
        force = metadata.get("force") is True
        error_message = metadata.get("error_message") if isinstance(metadata.get("error_message"), str) else None
        if error_message:
            checked_text(error_message, "metadata.error_message")
        if task_id is None:
            return _cancel_event(None, None, {"status": "failed", "message": MISSING_TASK_ID,
                                              "error": "missing_task_id"})
        checked_text(task_id, "task_id")
        if force:
            log.info("cancel of task %s asked with force=true (force is logged only)", task_id)
        outcome = await self._services.executions.cancel_one(task_id, ctx.caller, force=force, error_message=error_message)
        row = await self._services.repo.get(task_id)
        context_id = row["task_tree_id"] if row is not None else task_id
        data: dict[str, Any] = {
            "status": "cancelled" if outcome["status"] == "cancelled" else "failed",
            "message": outcome["message"],
            "force": force,
        }
        for key in ("token_usage", "result", "error"):
            if outcome.get(key) is not None:
                data[key] = outcome[key]
        return _cancel_event(task_id, context_id, data)


async def _rendered(stream: AsyncIterator[Any]) -> AsyncIterator[dict[str, Any]]:
    try:
        async for event in stream:
            yield event_json(event)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _cancel_event(task_id: str | None, context_id: str | None, data: dict[str, Any]) -> dict[str, Any]:
    """SPEC.md's cancel result: a final status update with the outcome in a data part."""
    stamp = now_iso()
    message_id = str(uuid.uuid4())
    return {
        "kind": "status-update",
        "task_id": task_id,
        "taskId": task_id,
        "context_id": context_id,
        "contextId": context_id,
        "status": {
            "state": "canceled" if data["status"] == "cancelled" else "failed",
            "message": {
                "kind": "message",
                "role": "agent",
                "message_id": message_id,
                "messageId": message_id,
                "parts": [{"kind": "data", "data": {"protocol": PROTOCOL, **data, "timestamp": stamp}}],
            },
            "timestamp": stamp,
        },
        "final": True,
    }
