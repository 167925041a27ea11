"""The shared HTTP edge of every surface: who is calling, and the JSON-RPC answers given before
a method runs (a body declared as something other than JSON, a malformed request header, 401, 429
over the request rate of agent/services/admission.py).

`call_context` turns a request into a CallContext (authentication through agent.foundations.auth, the LLM key
header); `rpc_endpoint` is the POST endpoint of a JSON-RPC method table (/tasks, /system).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from sqlalchemy.exc import DBAPIError
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Match, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from taskgrove.agent.foundations.auth import AuthError, authenticate
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.admission import Admission
from taskgrove.agent.foundations.errors import (INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PERMISSION_DENIED,
                                               DatabaseUnavailable, RpcError, database_unavailable)
from taskgrove.agent.foundations import tracing
from taskgrove.agent.foundations.calls import CallContext, Handler, Limits
from taskgrove.agent.surfaces.jsonrpc import JsonReply, dispatch, reply_id
from taskgrove.storage import jsonvalues
from taskgrove.storage.outage import DatabaseOutage
from taskgrove.llm.client import parse_key_header


class EdgeServices(Protocol):
    """What the edge reads of the services (agent/services/container.py `Services` has it): every
    surface passes its own services, which have at least this."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def admission(self) -> Admission: ...


# The drivers' error classes that may say "the database is unavailable" (storage/outage.py reads
# which do): routed requests get their 503 from database_error without a traceback in the log.
DATABASE_ERRORS: tuple[type[Exception], ...] = (DatabaseUnavailable, DatabaseOutage, DBAPIError, sqlite3.Error,
                                                ConnectionError)
# Methods anyone may call while JWT is on (SPEC.md, Authentication).
PUBLIC_METHODS = frozenset({"system.health", "system.executors"})
JSON_MEDIA_TYPES = ("application/json", "application/json-rpc", "application/jsonrequest")
UNSUPPORTED_MEDIA_TYPE = 415


def json_media_type(declared: str | None) -> bool:
    """A Content-Type that says JSON; a missing one counts as JSON (clients that send raw bytes,
    such as httpx's `content=`, omit it), an empty or any other one does not. Exactly
    `application/json`, what nearly every client sends, is one comparison."""
    if declared is None or declared == "application/json":
        return True
    media = declared.split(";", 1)[0].strip().lower()
    return media in JSON_MEDIA_TYPES or media.endswith("+json")


def content_type_problem(headers: Mapping[str, str]) -> RpcError | None:
    """-32600 naming the accepted type when the body is declared as something other than JSON.

    The JSON-RPC surfaces (`/`, `/tasks`, `/system`) answer it with HTTP 415, each in its own
    form, echoing the ids of the calls when the body parses anyway (a client that only forgot the
    header can see which request was refused).
    """
    declared = headers.get("content-type")
    if json_media_type(declared):
        return None
    media = (declared or "").split(";", 1)[0].strip().lower() or "(empty)"
    shown = media if len(media) <= 100 else media[:97] + "..."
    detail = f"Content-Type {shown} is not supported; send the JSON-RPC request as application/json"
    return RpcError(INVALID_REQUEST, detail, detail)


# What one JSON-RPC call is told when it has been answered: Metrics.rpc_call (CallContext.observe).
Observe = Callable[[str, str, float], None]
# The cookies handed to authentication while JWT is off: it never reads them then (agent.foundations.auth.authenticate).
_NO_COOKIES: Mapping[str, str] = MappingProxyType({})


def call_context(request: Request, services: EdgeServices, surface: str,
                 headers: Mapping[str, str] | None = None, *, jwt_enabled: bool | None = None,
                 envelope: Limits | None = None, observe: Observe | None = None) -> CallContext | AuthError:
    """Who is calling and with which LLM key; an AuthError is returned, not raised, so public
    methods can still be answered. A malformed X-LLM-API-KEY header raises RpcError (-32602).
    `headers`: the request's, when the caller has them already (request_headers); `jwt_enabled`,
    `envelope`, `observe`: what the settings and metrics give, when the caller made them once
    already (_RpcEndpoint does, per app, instead of per request)."""
    if headers is None:
        headers = request_headers(request.scope)
    if jwt_enabled is None:
        jwt_enabled = services.settings.jwt_enabled
    return header_context(headers, request_cookies(request, jwt_enabled), services, surface, request,
                          envelope=envelope, observe=observe)


def request_cookies(request: HTTPConnection, jwt_enabled: bool) -> Mapping[str, str]:
    """The cookies authentication is given: none while JWT is off, since agent.foundations.auth.authenticate
    answers ANONYMOUS then without looking at them (a _Cookies a request is not worth building)."""
    return _Cookies(request) if jwt_enabled else _NO_COOKIES


def header_context(headers: Mapping[str, str], cookies: Mapping[str, str], services: EdgeServices, surface: str,
                   request: Request | None = None, *, envelope: Limits | None = None,
                   observe: Observe | None = None) -> CallContext | AuthError:
    """call_context from headers alone (lower-case names): what gRPC metadata carries, too. A
    malformed `traceparent` is dropped (the execution starts a trace of its own), never refused.
    `envelope` and `observe`: limits(services) and services.metrics.rpc_call, unless given."""
    try:
        caller = authenticate(headers, cookies, services.settings)
    except AuthError as exc:
        return exc
    provider, key = _llm_key(headers)
    traceparent = headers.get("traceparent")
    return CallContext(caller=caller, surface=surface, llm_api_key=key, llm_provider=provider, request=request,
                       limits=limits(services) if envelope is None else envelope,
                       observe=services.metrics.rpc_call if observe is None else observe,
                       traceparent=None if traceparent is None else tracing.parse_traceparent(traceparent))


class _Headers(Mapping[str, str]):
    """A request's headers by lower-case name, in one dict: of a repeated header the first, as
    Starlette's Headers answers. Why not those: the edge reads three or four headers on every
    call (Content-Type, traceparent, X-LLM-API-KEY, Authorization), and Starlette's Headers scans
    its list for each, through Mapping.get and a lower-casing of the name."""

    __slots__ = ("_values",)

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self._values = dict(reversed(list(raw)))  # reversed: the first of repeated names wins

    def get(self, name: str, default: Any = None) -> Any:
        value = self._values.get(name.encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name.decode("latin-1") for name in self._values)

    def __len__(self) -> int:
        return len(self._values)


def request_headers(scope: Scope) -> Mapping[str, str]:
    """The headers of an HTTP request or WebSocket (ASGI names are lower-case), for call_context
    and content_type_problem (look them up by lower-case name)."""
    return _Headers(scope["headers"])


class _Cookies(Mapping[str, str]):
    """The request's cookies, parsed only if authentication looks at them (JWT on)."""

    __slots__ = ("_connection",)

    def __init__(self, connection: HTTPConnection) -> None:
        self._connection = connection

    def __getitem__(self, name: str) -> str:
        return self._connection.cookies[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._connection.cookies)

    def __len__(self) -> int:
        return len(self._connection.cookies)


def _llm_key(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    raw = headers.get("x-llm-api-key")
    if raw is None:
        return None, None
    try:
        return parse_key_header(raw)
    except ValueError as exc:  # the message describes the format, never the value
        raise RpcError(INVALID_PARAMS, str(exc), str(exc)) from None


def _payload(body: bytes) -> Any:
    """The decoded body, None when it is not JSON: parsed by the same function as dispatch, so
    a NaN id or a deep body is never a reason to fail here (agent.surfaces.bodylimit applied
    SERVICE_MAX_JSON_DEPTH before; here only the gate's ceiling)."""
    try:
        return jsonvalues.loads(body, jsonvalues.STORED_MAX_DEPTH).value
    except jsonvalues.JsonTextError:
        return None


def error_reply(body: bytes, exc: RpcError, status_code: int = 200) -> Response:
    """`exc` as the JSON-RPC answer to every call in `body` (ids echoed when valid)."""
    payload = _payload(body)
    if isinstance(payload, list) and payload:
        return JsonReply([{"jsonrpc": "2.0", "id": reply_id(c), "error": exc.to_dict()} for c in payload],
                         status_code=status_code)
    return JsonReply({"jsonrpc": "2.0", "id": reply_id(payload), "error": exc.to_dict()}, status_code=status_code)


def outage_reply(path: str, exc: DatabaseUnavailable) -> Response:
    """The database is unavailable (agent/foundations/errors.py DatabaseUnavailable): HTTP 503 with
    Retry-After, in the shape of the surface at `path` (GraphQL's errors, else JSON-RPC's)."""
    if path.startswith("/graphql"):
        body: Any = {"data": None, "errors": [{"message": exc.message, "extensions": {
            "code": exc.code, "codeName": "DATABASE_UNAVAILABLE", "reason": exc.reason,
            "retryAfter": exc.retry_after}}]}
    else:
        body = {"jsonrpc": "2.0", "id": None, "error": exc.to_dict()}
    return JsonReply(body, status_code=503, headers=exc.headers)


def database_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler for the drivers' error classes on routed requests: an outage is
    answered by outage_reply without a traceback; anything else goes on to internal_error."""
    outage = database_unavailable(exc)
    if outage is None:
        raise exc
    return outage_reply(request.url.path, outage)


def internal_error(request: Request, exc: Exception) -> Response:
    """The last net under every HTTP route (Starlette's server-error handler): an exception no
    surface caught is answered -32603 in the surface's shape, HTTP 200, never a plain-text 500
    (or, when it is the database going away, outage_reply's 503); Starlette still re-raises it,
    so the server logs the traceback."""
    outage = database_unavailable(exc)
    if outage is not None:
        return outage_reply(request.url.path, outage)
    detail = "The request failed on the server; see the service log"
    if request.url.path.startswith("/graphql"):
        return JsonReply({"data": None, "errors": [{"message": detail, "extensions": {
            "code": INTERNAL_ERROR, "codeName": "INTERNAL_ERROR"}}]})
    return JsonReply({"jsonrpc": "2.0", "id": None,
                      "error": {"code": INTERNAL_ERROR, "message": "Internal error", "data": detail}})


def unauthorized(exc: AuthError) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": PERMISSION_DENIED, "message": str(exc),
                                                   "data": str(exc)}}
    return JsonReply(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def _only_public(body: bytes) -> bool:
    payload = _payload(body)
    calls = payload if isinstance(payload, list) else [payload]
    return all(isinstance(c, dict) and c.get("method") in PUBLIC_METHODS for c in calls)


def limits(services: EdgeServices) -> Limits:
    """The envelope's limits from the settings (SERVICE_MAX_BATCH, SERVICE_MAX_JSON_DEPTH)."""
    settings = services.settings
    return _limits(settings.max_batch, settings.max_json_depth)


@functools.lru_cache(maxsize=16)
def _limits(max_batch: int, max_json_depth: int) -> Limits:
    return Limits(max_batch=max_batch, max_json_depth=max_json_depth)  # frozen: one per pair


class _RpcEndpoint:
    """The POST endpoint of a JSON-RPC method table as a plain ASGI app.

    Why not a Starlette endpoint function: Starlette wraps those in two more layers per request
    (request_response and a per-route exception wrapper) that matter at thousands of requests a
    second (bench/README.md). The exception handlers are the app's own either way: nothing here
    raises HTTPException, and every other exception reaches the app's server-error handler as before.
    """

    def __init__(self, services: EdgeServices, methods: Mapping[str, Handler], surface: str) -> None:
        self.services = services
        self.methods = methods
        self.surface = surface
        # Made once here, not per request: the settings are frozen and Metrics lives as long as the app.
        self.envelope = limits(services)
        self.observe: Observe = services.metrics.rpc_call
        self.jwt_enabled = services.settings.jwt_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        response = await self.answer(request, await read_body(request))
        await response(scope, receive, send)

    async def answer(self, request: Request, body: bytes) -> Response:
        """The response to the request whose whole `body` was read (read_body, or RpcFront)."""
        services, surface = self.services, self.surface
        headers = request_headers(request.scope)
        refused = content_type_problem(headers)
        if refused is not None:
            return error_reply(body, refused, UNSUPPORTED_MEDIA_TYPE)
        try:
            ctx = call_context(request, services, surface, headers, jwt_enabled=self.jwt_enabled,
                               envelope=self.envelope, observe=self.observe)
        except RpcError as exc:
            return error_reply(body, exc)
        if isinstance(ctx, AuthError):
            if not _only_public(body):
                return unauthorized(ctx)
            ctx = CallContext(surface=surface, request=request, limits=self.envelope, observe=self.observe)
        elif (refusal := services.admission.admit_request(ctx, body)) is not None:
            return error_reply(body, refusal)  # every call refused: HTTP 429 (JsonReply)
        return await dispatch(body, self.methods, ctx)


async def read_body(request: Request) -> bytes:
    """The request's whole body, as `await request.body()` gives it and kept on the request so
    that a later request.body() gives it again. Read here from the ASGI messages: Starlette's
    body() reads through an async generator under an async context manager, a third of the cost
    of a small request's edge (agent.surfaces.bodylimit has read the body already: one message)."""
    receive = request.receive
    message = await receive()
    chunks: list[bytes] = []
    while True:
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()  # what request.body() raises
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
        message = await receive()
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    request._body = body  # noqa: SLF001 - where Starlette's body() keeps it
    return body


def rpc_endpoint(services: EdgeServices, methods: Mapping[str, Handler], surface: str) -> ASGIApp:
    """The POST endpoint of `methods` (a Route takes it as an ASGI app: see _RpcEndpoint)."""
    return _RpcEndpoint(services, methods, surface)


class DirectRoutes:
    """ASGI middleware, innermost of the app's own: a POST to exactly the path of one of `routes`
    goes straight to that route's app, as the router would send it, with the scope keys the router
    and route would set (`router`, `route`, `endpoint`, `path_params`); anything else goes on to
    Starlette's ExceptionMiddleware and router unchanged.

    Why: those two built a Request, wrapped the app and each send in closures and matched the path
    against the routes one by one, on every call of /tasks and /system, for nothing: a JSON-RPC
    endpoint (_RpcEndpoint) raises no HTTPException, the only thing ExceptionMiddleware answers,
    and every other exception still reaches the app's server-error handler (internal_error) as it
    did. A request with a root_path (a proxy's prefix) takes the router's way, which strips it.
    """

    def __init__(self, app: ASGIApp, router: Router, routes: Iterable[Route]) -> None:
        self.app = app
        self.router = router
        self.routes = {route.path: route for route in routes
                       if not route.param_convertors and _routed_first(router, route)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.direct_route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        self.enter(route, scope)
        await route.app(scope, receive, send)

    def direct_route(self, scope: Scope) -> Route | None:
        """The route a request goes straight to, or None: the router's way."""
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST" or scope.get("root_path"):
            return None
        return route

    def enter(self, route: Route, scope: Scope) -> None:
        """The scope keys the router and the route would have set."""
        if "router" not in scope:
            scope["router"] = self.router
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = dict(scope.get("path_params", {}))  # what Route.matches hands on


def _routed_first(router: Router, route: Route) -> bool:
    """Whether the router sends a POST to exactly route.path to `route` (the first route matching
    it fully) and the route takes POST: only then may DirectRoutes take the router's place."""
    probe = {"type": "http", "path": route.path, "root_path": "", "method": "POST"}
    for candidate in router.routes:
        match, _ = candidate.matches(probe)
        if match is Match.FULL:  # the router's choice; a partial match only counts when none is full
            return candidate is route
    return False
