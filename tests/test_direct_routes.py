"""edge.DirectRoutes: POST /tasks and /system skip Starlette's ExceptionMiddleware and router;
every other request to those paths is answered by the router exactly as before."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from taskgrove.agent.surfaces.edge import DirectRoutes

HEALTH = {"jsonrpc": "2.0", "id": 1, "method": "system.health"}


async def test_other_methods_and_paths_still_take_the_router(client: Any) -> None:
    for path in ("/tasks", "/system"):
        refused = await client.http.get(path)
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        assert (await client.http.post(path, json=HEALTH)).json()["id"] == 1
    slashed = await client.http.post("/system/", json=HEALTH, follow_redirects=False)
    assert slashed.status_code == 307 and slashed.headers["location"].endswith("/system")


async def test_the_scope_is_what_the_router_would_have_set() -> None:
    seen: dict[str, Any] = {}

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)
        await PlainTextResponse("ok")(scope, receive, send)

    class Endpoint:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await endpoint(scope, receive, send)

    direct = Route("/rpc", Endpoint(), methods=["POST"])
    app = Starlette(routes=[direct])
    app.add_middleware(DirectRoutes, router=app.router, routes=[direct])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.post("/rpc", content=b"{}")).text == "ok"
        assert seen["route"] is direct and seen["router"] is app.router and seen["path_params"] == {}
        assert seen["endpoint"] is direct.endpoint and "starlette.exception_handlers" not in seen
        seen.clear()
        assert (await http.get("/rpc")).status_code == 405 and not seen


def test_a_route_the_router_would_not_choose_is_left_to_it() -> None:
    async def first(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("first")

    shadowed = Route("/rpc", PlainTextResponse("second"), methods=["POST"])
    router_app = Starlette(routes=[Route("/rpc", first, methods=["POST"]), shadowed,
                                   Route("/p/{name}", PlainTextResponse("p"), methods=["POST"])])
    direct = DirectRoutes(router_app, router_app.router, [shadowed, router_app.routes[2]])
    assert direct.routes == {}
