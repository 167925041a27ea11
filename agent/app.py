"""build_app(settings) -> Starlette: creates every object once and wires the routes.

Wiring only, and imported by nobody but the entry points (cli, bench, tests): the objects live in
agent/services/container.py (Services), the shared HTTP edge in agent/surfaces/edge.py, the surfaces in rpc/, a2a/,
graphql/ and ws.py.

Nothing is global: a test builds as many apps as it likes, each with its own database, engine
and bus. Start-up (migrations, crash recovery, the engine loop) runs in the app's lifespan.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from taskgrove.agent.surfaces.a2a.front import LazySurface, a2a_routes
from taskgrove.agent.surfaces.bodylimit import BodyLimit
from taskgrove.agent.services.container import Services
from taskgrove.agent.surfaces.edge import DATABASE_ERRORS, database_error, internal_error, rpc_endpoint
from taskgrove.agent.foundations.metrics import HttpMetrics
from taskgrove.agent.surfaces.operations import operations_routes
from taskgrove.agent.surfaces.rpc_front import RpcApp, RpcFront
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.foundations import tracing
from taskgrove.agent.surfaces.ws import ws_route
from taskgrove.executors.registry import ExecutorRegistry


def build_app(settings: Settings, *, registry: ExecutorRegistry | None = None) -> Starlette:
    services = Services.build(settings, registry)
    mcp = None
    if settings.enable_mcp:
        from taskgrove.agent.surfaces.mcp import McpRoute  # the mcp SDK itself loads on the first /mcp request

        mcp = McpRoute(services)

    agent = LazySurface(services)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        tracing.setup(settings)
        await services.start()
        try:
            async with mcp.run() if mcp else contextlib.nullcontext(), agent.grpc_transport():
                yield
        finally:
            await services.stop()
            tracing.shutdown()  # after the engine stopped: its last spans are flushed too

    rpc_routes = [Route("/tasks", rpc_endpoint(services, services.task_methods, "jsonrpc"), methods=["POST"])]
    if settings.enable_system_routes:
        rpc_routes.append(Route("/system", rpc_endpoint(services, services.system_methods, "jsonrpc"), methods=["POST"]))
    routes: list[Any] = [*rpc_routes]
    routes.append(ws_route(services))
    if settings.api_protocol == "graphql":
        from taskgrove.agent.surfaces.graphql import graphql_routes  # lazy: strawberry loads only when enabled

        routes.extend(graphql_routes(services))
    if mcp:
        routes.append(mcp.route())
    if settings.enable_ui:
        from taskgrove.agent.surfaces.ui import ui_routes  # static files only: no data without a JSON-RPC call

        routes.extend(ui_routes())
    routes.extend(operations_routes(services))
    routes.extend(a2a_routes(agent))
    handlers: dict[Any, Any] = {Exception: internal_error, **{kind: database_error for kind in DATABASE_ERRORS}}
    app = RpcApp(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    # In front of every route, ours and the A2A SDK's: body size and JSON depth.
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes, max_depth=settings.max_json_depth)
    # Outermost: every request counted and timed, refused ones included.
    app.add_middleware(HttpMetrics, metrics=services.metrics)
    # POST /tasks and /system: the same steps in one frame, in front of the stack (surfaces/rpc_front.py).
    app.front = RpcFront(app, rpc_routes, services.metrics,
                         BodyLimit(app, max_bytes=settings.max_request_bytes, max_depth=settings.max_json_depth))
    app.state.services = services
    return app


