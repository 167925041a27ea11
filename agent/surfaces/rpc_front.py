"""POST /tasks and /system answered in front of Starlette's middleware stack (issue 48, item 5).

Every other request goes through the stack as it is built in agent/app.py: Starlette's
ServerErrorMiddleware (the last net: internal_error), HttpMetrics, BodyLimit, then
ExceptionMiddleware and the router. A JSON-RPC call of /tasks or /system went through all of it
too, and each layer wrapped `send` or `receive` in a closure of its own and awaited the next one:
about a fifth of a `system.health` request's own work (bench/README.md). `RpcApp` answers those
calls in one frame that does the same things in the same order:

- counted and timed as HttpMetrics counts every request (its status is the response's);
- the body read within SERVICE_MAX_REQUEST_BYTES and SERVICE_MAX_JSON_DEPTH by BodyLimit's own
  code (BodyLimit.take_body: 413 and -32700 answered there, as before);
- the route's scope keys set as the router sets them (edge.DirectRoutes.direct_route: only a POST
  to exactly that path, no root_path, that the router would send to that route);
- any exception answered by the app's server-error handler (edge.internal_error: -32603, or 503
  for an outage) unless the response had started, then raised for the server to log, as
  ServerErrorMiddleware does.

The endpoint itself (edge._RpcEndpoint.answer: content type, authentication, admission,
dispatch) is unchanged; nothing the guarantees need is skipped, only the layers' wrapping.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.surfaces.bodylimit import BodyLimit
from taskgrove.agent.surfaces.edge import DirectRoutes, internal_error
from taskgrove.agent.surfaces.jsonrpc import JsonReply


class RpcApp(Starlette):
    """The service's Starlette app: JSON-RPC POSTs answered by its RpcFront (`front`, set once
    the routes exist), everything else by Starlette as ever."""

    front: RpcFront | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        front = self.front
        route = None if front is None else front.direct_route(scope)
        if route is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await front.answer(route, scope, receive, send)  # type: ignore[union-attr]  # route implies front


class RpcFront(DirectRoutes):
    """What the middleware stack did for a JSON-RPC POST, in one frame (see the module's doc)."""

    def __init__(self, app: Starlette, routes: Iterable[Route], metrics: Metrics, limit: BodyLimit) -> None:
        super().__init__(app, app.router, routes)
        self.metrics = metrics
        self.limit = limit

    async def answer(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 0  # no response started (HttpMetrics counts such a request as 500)
        try:
            body = await self.limit.take_body(scope, receive, send)
            if not isinstance(body, bytes):  # refused here (413, -32700), or the client left (None)
                status = body or 0
                return
            self.enter(route, scope)
            request = Request(scope, receive, send)
            request._body = body  # noqa: SLF001 - what a later request.body() gives (edge.read_body's way)
            response = await route.app.answer(request, body)  # type: ignore[attr-defined]  # an _RpcEndpoint
            if type(response) is JsonReply:  # a plain answer: its two messages, as Response.__call__ sends them
                status = response.status_code  # started from here on, as the stack's wrappers saw it
                await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
                await send({"type": "http.response.body", "body": response.body})
            else:  # 204, a stream (SSE): the response sends itself
                async def record(message: Message) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    await send(message)

                await response(scope, receive, record)
        except Exception as exc:
            if not status:  # nothing sent yet: the app's last net answers (ServerErrorMiddleware's way)
                await internal_error(Request(scope), exc)(scope, receive, send)
            raise
        finally:
            count, observe = self.metrics.http_series(scope["path"], scope["method"], status or 500)
            count(1)
            observe(time.perf_counter() - started)
