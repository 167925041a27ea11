"""The agent surface behind its routes: POST `/` and the HTTP+JSON routes, built on first use (front.py).

POST `/` is one endpoint for two method tables. It authenticates, parses the body and checks the
JSON-RPC envelope itself (agent.surfaces.a2a.envelope), then sends A2A methods (1.0 `SendMessage`, ...; 0.3
`message/send`, ...) with checked params to the SDK's JSON-RPC app
(`create_jsonrpc_routes(..., enable_v0_3_compat=True)`) through agent.surfaces.a2a.relay, everything else to
our dispatcher (`tasks.*`, `execute_task_tree`, `cancel`), which answers unknown methods with -32601.
A batch may mix both kinds.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from a2a.server.routes import create_jsonrpc_routes
from a2a.server.routes.jsonrpc_dispatcher import JSONRPC03Adapter, JsonRpcDispatcher  # (the SDK's
# own import order: importing a2a.compat.v0_3.jsonrpc_adapter first is a circular import)
from a2a.types.a2a_pb2 import AgentCard
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, ContentTypeNotSupportedError
from google.protobuf.json_format import ParseDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from taskgrove.agent.surfaces.a2a import quota, unavailable
from taskgrove.agent.surfaces.a2a.caller_context import BLOCKING_KEY, CALL_KEY, PUSH_KEY, CallerContextBuilder
from taskgrove.agent.surfaces.a2a.envelope import (
    EnvelopeError,
    calls_of,
    check_request,
    envelope_error_body,
    error_body,
    parse,
    wire_of,
)
from taskgrove.agent.surfaces.a2a.handler import TaskgroveRequestHandler, build_surface
from taskgrove.agent.surfaces.a2a.methods import AgentMethods
from taskgrove.agent.surfaces.a2a.params_check import check_params, check_version
from taskgrove.agent.surfaces.a2a.push import PushConfigError
from taskgrove.agent.surfaces.a2a.extras import explicitly_blocking, push_extras
from taskgrove.agent.surfaces.a2a.relay import Relay, as_json
from taskgrove.agent.surfaces.a2a.rest import Endpoint, rest_routes
from taskgrove.agent.foundations.auth import AuthError
from taskgrove.agent.surfaces.edge import UNSUPPORTED_MEDIA_TYPE, call_context, content_type_problem, unauthorized
from taskgrove.agent.foundations.errors import INVALID_PARAMS, INVALID_REQUEST, RpcError
from taskgrove.agent.services.idempotent import HEADER as IDEMPOTENCY_HEADER
from taskgrove.agent.foundations.calls import CallContext, Handler
from taskgrove.agent.surfaces.jsonrpc import JsonReply, batch_too_long, call_one, dispatch
from taskgrove.storage.outage import watching

CONTENT_TYPE_NOT_SUPPORTED = JSON_RPC_ERROR_CODE_MAP[ContentTypeNotSupportedError]  # -32005

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

SDK_METHODS = frozenset(JsonRpcDispatcher.METHOD_TO_MODEL) | frozenset(JSONRPC03Adapter.METHOD_TO_MODEL)
# Non-streaming sends, which honour an Idempotency-Key header like tasks.create (agent/services/idempotent.py);
# a streaming send with one is planned once instead (agent/surfaces/a2a/message_tree.py _plan_once).
SEND_METHODS = frozenset({"message/send", "SendMessage"})


def sdk_endpoints(services: "A2AServices", card: dict[str, Any]) -> tuple[TaskgroveRequestHandler,
                                                                       list[tuple[str, set[str], Endpoint]]]:
    """The SDK's request handler, and the endpoints of POST `/` and the `/a2a` routes as (path,
    methods, endpoint): agent.surfaces.a2a.front registers the routes and calls this on the first request
    to one of them (or at start when gRPC, which serves the same handler, is on)."""
    surface = build_surface(services, ParseDict(card, AgentCard()))
    context_builder = CallerContextBuilder()
    sdk_endpoint = create_jsonrpc_routes(
        surface.handler, "/", context_builder=context_builder, enable_v0_3_compat=True,
    )[0].endpoint
    methods = AgentMethods(services, surface.handler, context_builder).table()
    services.shutdown_hooks.append(surface.shutdown)
    rest = [(r.path, r.methods or set(), r.endpoint) for r in rest_routes(services, surface.handler, context_builder)]
    return surface.handler, [("/", {"POST"}, agent_endpoint(services, methods, sdk_endpoint)), *rest]


def agent_endpoint(services: "A2AServices", methods: dict[str, Handler],
                   sdk_endpoint: Endpoint) -> Endpoint:
    relay = Relay(sdk_endpoint)

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        refused = content_type_problem(request.headers)
        if refused is not None:  # our methods: -32600; A2A calls: the A2A code for it (-32005)
            return _refuse_all(body, refused, request, UNSUPPORTED_MEDIA_TYPE,
                               a2a_code=CONTENT_TYPE_NOT_SUPPORTED, ours=methods)
        try:
            ctx = call_context(request, services, "a2a")
        except RpcError as exc:  # an unusable X-LLM-API-KEY header: -32602 to every call, not HTTP 500
            return _refuse_all(body, exc, request)
        if isinstance(ctx, AuthError):
            return unauthorized(ctx)
        if (refusal := services.admission.admit_request(ctx, body)) is not None:
            return quota.refuse_all(body, refusal, request)
        try:
            parsed = parse(body)
        except EnvelopeError as exc:
            return JSONResponse(envelope_error_body(wire_of(None, request.headers), exc))
        payload = parsed.value
        if isinstance(payload, list):
            return await _batch(request, payload, ctx, methods, relay, parsed.suspect)
        try:
            check_request(payload, parsed.suspect)
        except EnvelopeError as exc:
            method = payload.get("method") if isinstance(payload, dict) else None
            return JSONResponse(envelope_error_body(wire_of(method, request.headers), exc))
        if payload["method"] not in SDK_METHODS:
            return await dispatch(body, methods, ctx)
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None and payload["method"] in SEND_METHODS and "id" in payload:
            return await _send_once(services, request, payload, ctx, relay, key)
        response = await _sdk_call(request, payload, ctx, relay)
        if "id" not in payload:  # a notification: executed, never answered (JSON-RPC 2.0)
            await as_json(response, payload["method"], None, wire_of(payload["method"], request.headers))
            return Response(status_code=204)
        return response

    return endpoint


class _RefusedRequest(Exception):
    """The SDK answered an error: not an answer to replay, the key stays free."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer


async def _send_once(services: "A2AServices", request: Request, payload: dict[str, Any], ctx: CallContext,
                     relay: Relay, key: str) -> Response:
    """message/send (SendMessage) with an Idempotency-Key: a resend answers with the first task."""
    method = payload["method"]
    wire = wire_of(method, request.headers)

    async def send(_params: Any, _ctx: CallContext) -> Any:
        answer = await as_json(await _sdk_call(request, payload, ctx, relay), method, payload["id"], wire)
        if "result" not in answer:
            raise _RefusedRequest(answer)
        return answer["result"]

    assert services.idempotency is not None
    try:
        result = await services.idempotency.once(method, send, payload.get("params"), ctx, key)
    except _RefusedRequest as refused:
        return JsonReply(refused.answer)  # a quota refusal keeps its 429
    except RpcError as exc:
        return JSONResponse(error_body(wire, payload["id"], exc.code, exc.message, exc.data))
    return JSONResponse({"jsonrpc": "2.0", "id": payload["id"], "result": result})


def _refuse_all(body: bytes, exc: RpcError, request: Request, status_code: int = 200,
                a2a_code: int | None = None, ours: Collection[str] = ()) -> JSONResponse:
    """`exc` as the answer to every request in `body`, echoing only ids that are valid.
    `a2a_code`: the code instead of exc's for every call that is not one of `ours` (an A2A call,
    or no call that can be read): the A2A TCK (JSONRPC-SSE-002) wants ContentTypeNotSupportedError
    (-32005) for a body not declared as JSON, where our own methods say -32600."""
    calls, batch = calls_of(body, request.headers)
    answers = [error_body(wire, id_, exc.code if a2a_code is None or (isinstance(method, str) and method in ours)
                          else a2a_code, exc.message, exc.data) for wire, id_, method in calls]
    return JSONResponse(answers if batch else answers[0], status_code=status_code)


async def _sdk_call(request: Request, payload: dict[str, Any], ctx: CallContext, relay: Relay) -> Response:
    """One A2A method through the SDK, its params checked first (-32602 in our words)."""
    method = payload["method"]
    wire = wire_of(method, request.headers)
    try:
        check_version(method, payload, request.headers.get("a2a-version"))
        check_params(method, payload)
        extras = push_extras(payload)
    except EnvelopeError as exc:
        return JSONResponse(envelope_error_body(wire, exc))
    except PushConfigError as exc:
        return JSONResponse(error_body(wire, payload.get("id"), INVALID_PARAMS, "Invalid params", str(exc)))
    setattr(request.state, CALL_KEY, ctx)
    setattr(request.state, PUSH_KEY, extras)
    setattr(request.state, BLOCKING_KEY, explicitly_blocking(payload))
    with watching() as outages:  # the SDK hides a driver's error: what the call met (unavailable.py)
        response = await quota.instead_of_sdk(ctx, await relay.call(request, payload), wire, payload.get("id"),
                                              method)
    return unavailable.instead_of_sdk(outages, response, wire, payload.get("id"))


async def _batch(request: Request, payload: list[Any], ctx: CallContext, methods: dict[str, Handler],
                 relay: Relay, suspect: bool) -> Response:
    """A JSON-RPC batch: every method of `/` works inside it, A2A methods included.

    Members run one after the other; a streaming method contributes its first event (a batch
    answer is one JSON array). Notifications (no `id`) run and are left out of the answer.
    """
    if not payload:
        return JSONResponse(error_body(wire_of(None, request.headers), None, INVALID_REQUEST, "Invalid Request",
                                       "an empty batch is not a request"))
    if len(payload) > ctx.limits.max_batch:  # SERVICE_MAX_BATCH, as on /tasks (issue 11, item 7)
        return JSONResponse(error_body(wire_of(None, request.headers), None, INVALID_REQUEST, "Invalid Request",
                                       batch_too_long(ctx.limits, len(payload))))
    answers: list[Any] = []
    for member in payload:
        try:
            check_request(member, suspect)
        except EnvelopeError as exc:
            method = member.get("method") if isinstance(member, dict) else None
            answers.append(envelope_error_body(wire_of(method, request.headers), exc))
            continue
        if member["method"] in SDK_METHODS:
            response = await _sdk_call(request, member, ctx, relay)
            answer: Any = await as_json(response, member["method"], member.get("id"),
                                        wire_of(member["method"], request.headers))
        else:
            answer = await call_one(member, methods, ctx)
            if isinstance(answer, tuple):  # a stream inside a batch: its first result only
                id_, reply = answer
                if reply.close is not None:
                    reply.close()
                answer = {"jsonrpc": "2.0", "id": id_, "result": reply.first}
        if answer is not None and "id" in member:
            answers.append(answer)
    if not answers:
        return Response(status_code=204)
    return JsonReply(answers)  # 429 when every call was refused by a quota

