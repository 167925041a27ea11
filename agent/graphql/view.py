"""`/graphql` over HTTP (POST, and GET for queries and the GraphiQL page) and WebSocket
(`graphql-transport-ws`, and the legacy `graphql-ws`) for subscriptions.

Authentication happens before strawberry sees the request, with the same rules as `/tasks`: the
`Authorization: Bearer` header, else the `Authorization` cookie. While JWT is on, an HTTP request
without a usable token gets HTTP 401 with a GraphQL-shaped error body, and a WebSocket handshake
is refused (HTTP 401). The GraphiQL page itself is static and served without a token; the queries
it sends carry one (its headers editor).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL

from agent.app import call_context
from agent.auth import AuthError
from agent.errors import RpcError
from agent.graphql.errors import error_response, unauthorized_response
from agent.graphql.resolvers import GraphQLContext
from agent.graphql.schema import build_schema
from agent.rpc.jsonrpc import CallContext
from agent.ws import deny_handshake

if TYPE_CHECKING:  # pragma: no cover
    from agent.app import Services

SURFACE = "graphql"
# Close code for a handshake whose headers are malformed (not an authentication problem).
CLOSE_BAD_REQUEST = 4400


class TaskGraphQL(GraphQL):
    """strawberry's ASGI view with our context: the services and the caller of this request."""

    def __init__(self, services: "Services", **kwargs: Any) -> None:
        super().__init__(build_schema(), **kwargs)
        self.services = services

    async def get_context(self, request: Request | WebSocket, response: Any) -> GraphQLContext:
        # GraphQLEndpoint authenticated the request and left its CallContext in the scope's state.
        call: CallContext = request.state.call_context
        return GraphQLContext(services=self.services, call=call, request=request, response=response)


class GraphQLEndpoint:
    """ASGI app for `/graphql`: authenticates, then hands the request to strawberry."""

    def __init__(self, services: "Services") -> None:
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
            if self.view.should_render_graphql_ide(_Adapter(request)):
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
        scope.setdefault("state", {})["call_context"] = call
        await self.view(scope, receive, send)

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


def graphql_routes(services: "Services") -> list[Any]:
    endpoint = GraphQLEndpoint(services)
    return [
        Route("/graphql", endpoint, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", endpoint),
    ]
