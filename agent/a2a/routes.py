"""Routes of the agent surface: POST `/` and the agent card at both well-known paths.

POST `/` is one endpoint for two method tables. It authenticates, peeks at the JSON `method`, and
sends A2A methods (1.0 `SendMessage`, ...; 0.3 `message/send`, ...) to the SDK's JSON-RPC app
(`create_jsonrpc_routes(..., enable_v0_3_compat=True)`), everything else to our dispatcher
(`tasks.*`, `execute_task_tree`, `cancel`), which also answers unknown methods with -32601.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from a2a.server.routes import create_jsonrpc_routes
from a2a.server.routes.jsonrpc_dispatcher import JSONRPC03Adapter, JsonRpcDispatcher  # (the SDK's
# own import order: importing a2a.compat.v0_3.jsonrpc_adapter first is a circular import)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.a2a.calls import CALL_KEY, PUSH_KEY, CallerContextBuilder
from agent.a2a.card import build_card, card_routes
from agent.a2a.handler import build_surface
from agent.a2a.methods import PUSH_CONFIG_KEYS, AgentMethods
from agent.a2a.push import PushConfigError, PushTarget, parse_target
from agent.a2a.wire import spec_json
from agent.auth import AuthError
from agent.errors import INVALID_PARAMS, RpcError
from agent.rpc.jsonrpc import Handler, dispatch

if TYPE_CHECKING:  # pragma: no cover
    from agent.app import Services

SDK_METHODS = frozenset(JsonRpcDispatcher.METHOD_TO_MODEL) | frozenset(JSONRPC03Adapter.METHOD_TO_MODEL)
# 0.3 methods whose result is a task object: we add SPEC.md's `context_id` spelling to it.
TASK_RESULT_METHODS = frozenset({"message/send", "tasks/get", "tasks/cancel"})


def a2a_routes(services: "Services") -> list[Route]:
    card = build_card(services.settings)
    surface = build_surface(services, card)
    context_builder = CallerContextBuilder()
    sdk_endpoint = create_jsonrpc_routes(
        surface.handler, "/", context_builder=context_builder, enable_v0_3_compat=True,
    )[0].endpoint
    methods = AgentMethods(services, surface.handler, context_builder).table()
    services.shutdown_hooks.append(surface.shutdown)
    return [
        Route("/", agent_endpoint(services, methods, sdk_endpoint), methods=["POST"]),
        *card_routes(card),
    ]


def agent_endpoint(services: "Services", methods: dict[str, Handler],
                   sdk_endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    from agent.app import _error_reply, call_context, unauthorized

    async def endpoint(request: Request) -> Response:
        body = await request.body()  # cached on the request: the SDK reads it again
        try:
            ctx = call_context(request, services, "a2a")
        except RpcError as exc:  # an unusable X-LLM-API-KEY header: -32602, not HTTP 500
            return _error_reply(body, exc)
        if isinstance(ctx, AuthError):
            return unauthorized(ctx)
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            payload = None
        method = payload.get("method") if isinstance(payload, dict) else None
        if method not in SDK_METHODS:
            return await dispatch(body, methods, ctx)
        assert isinstance(payload, dict)
        setattr(request.state, CALL_KEY, ctx)
        try:
            setattr(request.state, PUSH_KEY, push_extras(payload))
        except PushConfigError as exc:
            return JSONResponse({"jsonrpc": "2.0", "id": payload.get("id"),
                                 "error": {"code": INVALID_PARAMS, "message": str(exc), "data": str(exc)}})
        response = await sdk_endpoint(request)
        if method in TASK_RESULT_METHODS:
            response = _with_spec_keys(response)
        return response

    return endpoint


def push_extras(payload: dict[str, Any]) -> list[PushTarget]:
    """`headers` and `method` of a push config in the raw body, which the SDK's types drop.

    Looked for in `params.configuration` (send), `params` (push-config set) and the body-level
    `configuration` SPEC.md lists, under the 0.3 and snake_case spellings.
    """
    params = payload.get("params") if isinstance(payload.get("params"), dict) else {}
    holders = [params.get("configuration"), params, payload.get("configuration")]
    extras = []
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        for key in PUSH_CONFIG_KEYS:
            if holder.get(key) is not None:
                extras.append(parse_target(holder[key], key))
    return extras


def _with_spec_keys(response: Response) -> Response:
    """0.3 JSON task results with `context_id` beside `contextId` and whole numbers as ints."""
    if not isinstance(response, JSONResponse) or response.status_code != 200:
        return response
    answer = json.loads(bytes(response.body))
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, dict) or result.get("kind") != "task":
        return response
    answer["result"] = spec_json(result)
    return JSONResponse(answer, status_code=response.status_code)
