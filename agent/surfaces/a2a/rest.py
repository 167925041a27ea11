"""The A2A 1.0 HTTP+JSON transport, served by the SDK's route factory under `/a2a`.

`create_rest_routes(handler, path_prefix="/a2a")` gives `/a2a/message:send`, `/a2a/message:stream`,
`/a2a/tasks/{id}`, `/a2a/tasks/{id}:cancel`, `/a2a/tasks/{id}/pushNotificationConfigs`, ... backed
by the same request handler as JSON-RPC, so both transports share one implementation. Two things
are changed on the way:

- the factory also mounts `/{tenant}` at the root *without* the prefix; that mount would swallow
  every two-segment path of the service (`/.well-known/agent-card.json` among them), and the
  service has no tenants, so it is left out;
- every route passes the same edge as POST `/`: authentication (401 in the HTTP+JSON error form
  `{"error": {"code", "status", "message"}}` while JWT is on), the body's JSON values checked
  (NaN, Infinity, numbers that overflow, lone surrogates: 400 INVALID_ARGUMENT naming the field),
  and push configs' `headers`/`method` kept as on JSON-RPC. Permissions then apply as on every
  surface: the SDK's stores are scoped by the caller.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from a2a.server.routes import create_rest_routes
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import ContentTypeNotSupportedError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from taskgrove.agent.surfaces.a2a import quota, unavailable
from taskgrove.agent.surfaces.a2a.caller_context import BLOCKING_KEY, CALL_KEY, PUSH_KEY, WIRE_KEY, CallerContextBuilder
from taskgrove.agent.surfaces.a2a.card import REST_PREFIX
from taskgrove.agent.surfaces.a2a.envelope import (
    MAX_DEPTH,
    WIRE_1_0,
    EnvelopeError,
    parse,
)
from taskgrove.agent.surfaces.a2a.extras import explicitly_blocking, push_extras
from taskgrove.agent.surfaces.a2a.handler import TaskgroveRequestHandler
from taskgrove.agent.surfaces.a2a.params_check import nul_in_names
from taskgrove.agent.surfaces.a2a.push import PushConfigError
from taskgrove.agent.surfaces.a2a.wire import restore_ints
from taskgrove.agent.foundations.auth import AuthError
from taskgrove.agent.surfaces.edge import call_context, json_media_type
from taskgrove.agent.foundations.errors import RpcError
from taskgrove.storage import jsonvalues
from taskgrove.storage.outage import watching

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

Endpoint = Callable[[Request], Awaitable[Response]]


def rest_error(http_status: int, status: str, message: str) -> JSONResponse:
    """The HTTP+JSON error body (google.rpc.Status in JSON), as the SDK writes its own errors."""
    return JSONResponse({"error": {"code": http_status, "status": status, "message": message}},
                        status_code=http_status)


def rest_routes(services: "A2AServices", handler: TaskgroveRequestHandler,
                context_builder: CallerContextBuilder) -> list[Route]:
    routes: list[Route] = []
    for route in create_rest_routes(handler, context_builder=context_builder, path_prefix=REST_PREFIX):
        if isinstance(route, Mount) or not isinstance(route, Route):
            continue  # the unprefixed `/{tenant}` mount (see the module docstring)
        routes.append(Route(route.path, _guarded(services, route.endpoint), methods=sorted(route.methods or ())))
    return routes


def _guarded(services: "A2AServices", endpoint: Endpoint) -> Endpoint:
    async def guarded(request: Request) -> Response:
        try:
            ctx = call_context(request, services, "a2a")
        except RpcError as exc:
            return rest_error(400, "INVALID_ARGUMENT", exc.message)
        if isinstance(ctx, AuthError):
            response: Response = rest_error(401, "UNAUTHENTICATED", str(ctx))
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        status = request.query_params.get("status")
        if request.method == "GET" and status is not None and status not in TaskState.keys():
            allowed = ", ".join(n for n in TaskState.keys() if not n.endswith("UNSPECIFIED"))
            return rest_error(400, "INVALID_ARGUMENT", f"status must be one of {allowed}, got {status!r}")
        body = await request.body()
        if (refusal := services.admission.admit_request(ctx, body)) is not None:
            return quota.rest_refusal(refusal)
        if body.strip() and not json_media_type(request.headers.get("content-type")):
            refused = build_rest_error_payload(ContentTypeNotSupportedError(
                message="send the request body as application/json"))
            refused["error"]["code"] = 415  # the HTTP status; the SDK's mapping says 400 for parts
            return JSONResponse(refused, status_code=415)
        payload: Any = None
        if body.strip():
            try:
                parsed = parse(body)
            except EnvelopeError as exc:
                return rest_error(400, "INVALID_ARGUMENT", str(exc.data))
            payload = parsed.value
            found = jsonvalues.problem(payload, "body", MAX_DEPTH)  # one walk: depth and numbers
            if found is not None:
                return rest_error(400, "INVALID_ARGUMENT", found)
        where = nul_in_names({"path": dict(request.path_params), "query": dict(request.query_params.multi_items()),
                              "body": payload}, "request")
        if where is not None:  # the JSON-RPC rule of agent.surfaces.a2a.params_check, for the ids in paths and queries
            return rest_error(400, "INVALID_ARGUMENT", f"{where.removeprefix('request.')} must not contain NUL characters")
        wrapped = {"params": payload} if isinstance(payload, dict) else {}
        try:
            extras = push_extras(wrapped)
        except PushConfigError as exc:
            return rest_error(400, "INVALID_ARGUMENT", str(exc))
        setattr(request.state, CALL_KEY, ctx)
        setattr(request.state, PUSH_KEY, extras)
        setattr(request.state, BLOCKING_KEY, explicitly_blocking(wrapped))
        setattr(request.state, WIRE_KEY, WIRE_1_0)
        with watching() as outages:  # the SDK hides a driver's error: what the call met (unavailable.py)
            response = await endpoint(request)
        return unavailable.instead_of_rest(outages, quota.instead_of_rest(ctx, _clean(response)))

    return guarded


LIBRARY_MARKERS = ("Failed to parse", "validation error", "errors.pydantic.dev", "object is not", "Traceback")


def _clean(response: Response) -> Response:
    """JSON answers as `application/json` (the HTTP+JSON binding, section 11.1, where the SDK writes
    `application/a2a+json`), whole numbers as integers (wire.restore_ints) in answers and streamed
    events; an SDK error whose message is parser text gets a message of ours."""
    if not isinstance(response, JSONResponse):
        iterator = getattr(response, "body_iterator", None)
        if iterator is not None:
            cast(StreamingResponse, response).body_iterator = _int_events(iterator)
        return response
    response.headers["content-type"] = "application/json"
    if response.status_code < 400:
        try:
            return JSONResponse(restore_ints(json.loads(bytes(response.body))), status_code=response.status_code,
                                media_type="application/json")
        except ValueError:
            return response
    try:
        answer = json.loads(bytes(response.body))
    except ValueError:
        return response
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) \
            and any(m in error["message"] for m in LIBRARY_MARKERS):
        error["message"] = ("The request (body or query parameters) does not match the A2A 1.0 message "
                            "for this operation: check field names and types against the specification")
        return JSONResponse(answer, status_code=response.status_code)
    return response


async def _int_events(iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Each Server-Sent Event's JSON data with whole numbers as integers."""
    try:
        async for item in iterator:
            data = getattr(item, "data", None)
            if isinstance(data, str):
                try:
                    item.data = json.dumps(restore_ints(json.loads(data)))
                except ValueError:
                    pass
            yield item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
