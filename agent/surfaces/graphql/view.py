"""`/graphql` over HTTP (POST, and GET for queries and the GraphiQL page) and WebSocket
(`graphql-transport-ws`, and the legacy `graphql-ws`) for subscriptions.

Authentication happens before strawberry sees the request, with the same rules as `/tasks`: the
`Authorization: Bearer` header, else the `Authorization` cookie. While JWT is on, an HTTP request
without a usable token gets HTTP 401 with a GraphQL-shaped error body, and a WebSocket handshake
is refused (HTTP 401). The GraphiQL page itself is static and served without a token; the queries
it sends carry one (its headers editor).

Over the request rate (agent/services/admission.py) an HTTP request gets HTTP 429 with `Retry-After` and
a GraphQL-shaped error (code -32029); an operation that did nothing because of the pending-task
quota is answered 429 as well (create_response). One that did nothing because the database is
unavailable (agent/foundations/errors.py DatabaseUnavailable) is HTTP 503 with Retry-After and
`extensions.code` -32050; a subscription's socket stays open.

Input rules (issue 18): the request is parsed and checked by agent/surfaces/graphql/request.py before
strawberry sees it (JSON errors with our codes, never a plain-text 400 or a 500); WebSocket
messages by agent/surfaces/graphql/wsprotocol.py; replies are encoded off the event loop by
storage.jsonvalues, so a large answer does not hold up other requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL

from taskgrove.agent.surfaces.edge import call_context
from taskgrove.agent.foundations.auth import AuthError
from taskgrove.agent.surfaces.bodylimit import replaying
from taskgrove.agent.foundations.errors import INTERNAL_ERROR, RpcError, database_unavailable
from taskgrove.agent.surfaces.graphql import request as checks
from taskgrove.agent.surfaces.graphql.graphql_errors import (
    INTERNAL_MESSAGE,
    error_response,
    outage_response,
    quota_response,
    refusal,
    unauthorized_response,
)
from taskgrove.agent.surfaces.graphql.resolvers import GraphQLContext
from taskgrove.agent.surfaces.graphql.schema import build_schema
from taskgrove.agent.surfaces.graphql.wsprotocol import StrictLegacyWS, StrictTransportWS
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.surfaces.ws import deny_handshake
from taskgrove.storage import jsonvalues

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.graphql.graphql_needs import GraphQLServices

SURFACE = "graphql"
# Close code for a handshake whose headers are malformed (not an authentication problem).
CLOSE_BAD_REQUEST = 4400


class _Encoded(dict[str, Any]):
    """A result already encoded (off the event loop); `encode_json` hands back its text."""

    def __init__(self, text: str, refused: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.text = text
        # set: (status, Retry-After) of an operation refused by a quota (429) or because the
        # database is unavailable (503), answered so by create_response
        self.refused = refused


class TaskGraphQL(GraphQL[GraphQLContext, None]):
    """strawberry's ASGI view with our context (the services and the caller of this request),
    our JSON parser and encoder, and the strict WebSocket protocol handlers."""

    graphql_transport_ws_handler_class = StrictTransportWS
    graphql_ws_handler_class = StrictLegacyWS

    def __init__(self, services: "GraphQLServices", **kwargs: Any) -> None:
        super().__init__(build_schema(services.settings), **kwargs)
        self.services = services
        self.max_json_depth = services.settings.max_json_depth
        self.max_message_bytes = services.settings.max_request_bytes

    def decode_json(self, data: str | bytes) -> object:
        """WebSocket messages (HTTP bodies were checked by GraphQLEndpoint already): the one
        parser; a refusal becomes strawberry's "not JSON" path, which closes with 4400."""
        if len(data) > self.max_message_bytes:
            raise json.JSONDecodeError(f"message larger than {self.max_message_bytes} bytes", "", 0)
        try:
            return jsonvalues.loads(data, self.max_json_depth, what="message").value
        except jsonvalues.JsonTextError as exc:
            raise json.JSONDecodeError(str(exc), "", 0) from None

    def encode_json(self, data: object) -> str:
        return data.text if isinstance(data, _Encoded) else jsonvalues.dumps(data)

    async def process_result(self, request: Any, result: Any) -> Any:
        """Encoded in a worker thread: serialising a large answer must not stall other requests."""
        data = await super().process_result(request, result)
        return _Encoded(await asyncio.to_thread(jsonvalues.dumps, data), refusal(result))

    def create_response(self, response_data: Any, sub_response: Any) -> Response:
        response = super().create_response(response_data, sub_response)
        refused = getattr(response_data, "refused", None)
        if refused is not None:
            response.status_code = refused[0]
            response.headers["Retry-After"] = str(refused[1])
        return response

    async def get_context(self, request: Request | WebSocket, response: Any) -> GraphQLContext:
        # GraphQLEndpoint authenticated the request and left its CallContext in the scope's state.
        call: CallContext = request.state.call_context
        return GraphQLContext(services=self.services, call=call, request=request, response=response)


class GraphQLEndpoint:
    """ASGI app for `/graphql`: authenticates, then hands the request to strawberry."""

    def __init__(self, services: "GraphQLServices") -> None:
        self.services = services
        self.view = TaskGraphQL(services, graphql_ide="graphiql" if services.settings.enable_docs else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            websocket = WebSocket(scope, receive, send)
            try:
                call = call_context(websocket, self.services, SURFACE)  # type: ignore[arg-type]
            except RpcError as exc:  # a malformed X-LLM-API-KEY header
                await websocket.close(code=CLOSE_BAD_REQUEST, reason=str(exc.data)[:120])
                return
            if isinstance(call, AuthError):
                await deny_handshake(websocket, call)
                return
            call = replace(call, request=None)
        else:
            request = Request(scope, receive)
            if self.view.should_render_graphql_ide(_Adapter(request)):  # type: ignore[arg-type]  # reads .method, .headers
                await self._playground()(scope, receive, send)
                return
            try:
                call = call_context(request, self.services, SURFACE)
            except RpcError as exc:
                await error_response(exc, status_code=400)(scope, receive, send)
                return
            if isinstance(call, AuthError):
                await unauthorized_response(str(call))(scope, receive, send)
                return
            try:
                receive = await self._checked(request)
            except RpcError as exc:
                await error_response(exc, status_code=400)(scope, receive, send)
                return
            body = await request.body() if request.method == "POST" else None  # read by _checked already
            if (refusal := self.services.admission.admit_request(call, body)) is not None:
                await quota_response(refusal)(scope, receive, send)
                return
        scope.setdefault("state", {})["call_context"] = call
        await self._guarded(scope, receive, send)

    async def _checked(self, request: Request) -> Receive:
        """Check the request (agent/surfaces/graphql/request.py); the receive that replays its body."""
        depth = self.services.settings.max_json_depth
        if request.method == "GET":
            checks.parse_query_params(request.query_params, depth)
            return request.receive
        content_type = request.headers.get("content-type", "")
        if "application/json" not in content_type:
            raise checks.refused(-32600, "Send the GraphQL request as JSON (Content-Type: application/json)")
        body = await request.body()
        checks.parse_body(body, depth)
        return replaying(body, request.receive)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """strawberry's view; anything it raises before answering becomes a GraphQL-shaped
        -32603 (logged), never an HTTP 500 or a dropped connection."""
        started = False

        async def tracking(message: Any) -> None:
            nonlocal started
            if message["type"] in ("http.response.start", "websocket.accept", "websocket.close"):
                started = True
            await send(message)

        try:
            await self.view(scope, receive, tracking)
        except Exception as exc:
            outage = database_unavailable(exc)
            if outage is None:
                log.exception("GraphQL request failed")
            if started:
                return
            if outage is not None and scope["type"] == "http":
                await outage_response(outage)(scope, receive, send)
                return
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011, "reason": "internal error"})
                return
            await error_response(RpcError(INTERNAL_ERROR, INTERNAL_MESSAGE, INTERNAL_MESSAGE), 200)(
                scope, receive, send)

    def _playground(self) -> Response:
        """The GraphiQL page (static, no data: served without a token), or 404 with docs off."""
        if self.view.graphql_ide is None:
            return PlainTextResponse("Not Found: the GraphQL playground is off (SERVICE_ENABLE_DOCS=false)",
                                     status_code=404)
        return HTMLResponse(self.view.graphql_ide_html)


class _Adapter:
    """The three attributes strawberry's `should_render_graphql_ide` reads."""

    def __init__(self, request: Request) -> None:
        self.method = request.method
        self.query_params = request.query_params
        self.headers = request.headers


def graphql_routes(services: "GraphQLServices") -> list[Any]:
    endpoint = GraphQLEndpoint(services)
    return [
        Route("/graphql", endpoint, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", endpoint),
    ]
