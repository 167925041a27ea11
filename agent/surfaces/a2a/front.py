"""The agent surface's routes as the app registers them; the SDK behind them is built on first use.

The agent card is plain JSON (agent.surfaces.a2a.card) and is served from the start. Everything else of the
surface (POST `/`, the HTTP+JSON routes under `/a2a`) goes through the a2a-sdk's request handler,
whose import (the SDK's server, protobuf, pydantic: ~20 MB and ~0.3 s) is left to the first request
that reaches one of these routes: then agent.surfaces.a2a.routes builds the handler and the real endpoints
once, and every later request goes straight to them. A service that is only asked for its card,
`/tasks` or the dashboard never loads the SDK.

The routes themselves (paths and methods) exist from the start, so routing, 404 and 405 answers
are the same before and after the build. REST_ROUTES lists the SDK's HTTP+JSON routes;
tests/test_a2a_card.py checks it against the SDK's own route factory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskgrove.agent.surfaces.a2a.card import REST_PREFIX, build_card, card_routes

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.handler import TaskgroveRequestHandler
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

Endpoint = Callable[[Request], Awaitable[Response]]
AGENT_PATH = "/"
# (path, methods) of `create_rest_routes(handler, path_prefix=REST_PREFIX)`, in its order, without
# the unprefixed `/{tenant}` mount (agent/surfaces/a2a/rest.py says why).
REST_ROUTES: tuple[tuple[str, tuple[str, ...]], ...] = tuple((REST_PREFIX + path, methods) for path, methods in (
    ("/message:send", ("POST",)),
    ("/message:stream", ("POST",)),
    ("/tasks/{id}:cancel", ("POST",)),
    ("/tasks/{id}:subscribe", ("GET", "HEAD")),
    ("/tasks/{id}:subscribe", ("POST",)),
    ("/tasks/{id}", ("GET", "HEAD")),
    ("/tasks/{id}/pushNotificationConfigs/{push_id}", ("GET", "HEAD")),
    ("/tasks/{id}/pushNotificationConfigs/{push_id}", ("DELETE",)),
    ("/tasks/{id}/pushNotificationConfigs", ("POST",)),
    ("/tasks/{id}/pushNotificationConfigs", ("GET", "HEAD")),
    ("/tasks", ("GET", "HEAD")),
    ("/extendedAgentCard", ("GET", "HEAD")),
))
RouteKey = tuple[str, frozenset[str]]


def route_key(path: str, methods: Any) -> RouteKey:
    return path, frozenset(methods or ())


def signed(card: dict[str, Any], settings: Any) -> dict[str, Any]:
    """The card with our signature when SERVICE_CARD_SIGNING_KEY is set (executors/card_trust.py);
    a key that cannot sign stops the start with its reason."""
    if not settings.card_signing_key:
        return card
    from taskgrove.executors.card_trust import sign_card

    try:
        return sign_card(card, settings.card_signing_key, settings.card_signing_kid)
    except ValueError as exc:
        raise RuntimeError(f"SERVICE_CARD_SIGNING_KEY: {exc}") from None


class LazySurface:
    """The SDK-backed endpoints, built by the first request that needs one of them (or, with gRPC
    on, at start: the gRPC transport serves the same request handler)."""

    def __init__(self, services: "A2AServices") -> None:
        self._services = services
        self.card = signed(build_card(services.settings), services.settings)
        self.handler: TaskgroveRequestHandler | None = None  # the SDK's request handler, once built
        self._endpoints: dict[RouteKey, Endpoint] | None = None

    def build(self) -> dict[RouteKey, Endpoint]:
        """Builds the handler and the endpoints once: no await before the assignment, so
        concurrent first requests build once."""
        if self._endpoints is None:
            from taskgrove.agent.surfaces.a2a.routes import sdk_endpoints  # the a2a-sdk loads here (module docstring)

            self.handler, built = sdk_endpoints(self._services, self.card)
            self._endpoints = {route_key(path, methods): real for path, methods, real in built}
        return self._endpoints

    def endpoint(self, key: RouteKey) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            return await self.build()[key](request)

        return endpoint

    def grpc_transport(self) -> AbstractAsyncContextManager[None]:
        """The gRPC transport while the app runs: SERVICE_GRPC_PORT set, else nothing."""
        if self._services.settings.grpc_port is None:
            return contextlib.nullcontext()
        from taskgrove.agent.surfaces.a2a.grpc_server import serving  # grpcio loads only when gRPC is on

        self.build()
        assert self.handler is not None  # set by build()
        return serving(self._services, self.handler)


def a2a_routes(surface: LazySurface) -> list[Route]:
    agent = Route(AGENT_PATH, surface.endpoint(route_key(AGENT_PATH, ("POST",))), methods=["POST"])
    rest = [Route(path, surface.endpoint(route_key(path, methods)), methods=list(methods))
            for path, methods in REST_ROUTES]
    return [agent, *card_routes(surface.card), *rest]
