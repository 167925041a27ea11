"""build_app(settings) -> Starlette: creates every object once and wires the routes.

Nothing is global: a test builds as many apps as it likes, each with its own database, engine
and bus. Start-up (migrations, crash recovery, the engine loop) runs in the app's lifespan.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.a2a.routes import a2a_routes
from agent.auth import AuthError, authenticate, check_settings
from agent.engine.bus import EventBus
from agent.engine.engine import Engine
from agent.errors import INVALID_PARAMS, PERMISSION_DENIED, RpcError
from agent.generate import GenerateService
from agent.keys import KeyConfigService
from agent.rpc.jsonrpc import CallContext, Handler, dispatch
from agent.rpc.tasks import task_methods
from agent.service import TaskService
from agent.settings import Settings
from agent.system import SystemService
from agent.ws import ws_route
from executors.database import dispose_engines
from executors.registry import ExecutorRegistry
from llm.client import parse_key_header
from storage.db import create_batch_engine, create_engine, migrate
from storage.keys import KeyStore
from storage.repository import TaskRepository

log = logging.getLogger(__name__)

# Methods anyone may call while JWT is on (SPEC.md, Authentication).
PUBLIC_METHODS = frozenset({"system.health", "system.executors"})


@dataclass
class Services:
    """The objects one running service is made of, handed to every surface."""

    settings: Settings
    repo: TaskRepository
    bus: EventBus
    registry: ExecutorRegistry
    engine: Engine
    tasks: TaskService
    system: SystemService
    task_methods: dict[str, Handler] = field(default_factory=dict)
    system_methods: dict[str, Handler] = field(default_factory=dict)
    keys: KeyConfigService | None = None
    # Awaited first on shutdown, by surfaces that own background work (the A2A handler, push sender).
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @classmethod
    def build(cls, settings: Settings, registry: ExecutorRegistry | None = None) -> "Services":
        check_settings(settings)
        repo = TaskRepository(create_engine(settings.database_url), create_batch_engine(settings.database_url))
        bus = EventBus()
        registry = registry or ExecutorRegistry.discover(settings.extensions)
        engine = Engine(repo, registry, settings, bus)
        tasks = TaskService(repo, engine, registry, bus, settings)
        system = SystemService(repo, engine, registry, tasks)
        engine.services["tasks"] = tasks
        engine.services["registry"] = registry  # generate_executor offers the app's executors
        keys = KeyConfigService(KeyStore(repo.engine, settings.secret_key))
        engine.services["llm_key_lookup"] = keys.lookup  # stored per-user keys for the LLM client
        services = cls(settings, repo, bus, registry, engine, tasks, system, keys=keys)
        services.task_methods = task_methods(tasks)
        services.task_methods["tasks.generate"] = GenerateService(tasks, registry, settings, engine.services).generate
        services.system_methods = {
            "system.health": system.health,
            "system.executors": system.executors,
            "examples.init": system.examples_init,
            "examples.status": system.examples_status,
            **keys.methods(),
        }
        return services

    async def start(self) -> None:
        await migrate(self.repo.engine)
        await self.engine.start()

    async def stop(self) -> None:
        for hook in self.shutdown_hooks:
            await hook()
        await self.engine.stop()
        await dispose_engines()  # database_executor's connection pools
        await self.repo.close()


def call_context(request: Request, services: Services, surface: str) -> CallContext | AuthError:
    """Who is calling and with which LLM key; an AuthError is returned, not raised, so public
    methods can still be answered. A malformed X-LLM-API-KEY header raises RpcError (-32602)."""
    try:
        caller = authenticate(request.headers, request.cookies, services.settings)
    except AuthError as exc:
        return exc
    provider, key = _llm_key(request.headers)
    return CallContext(caller=caller, surface=surface, llm_api_key=key, llm_provider=provider, request=request)


def _llm_key(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    raw = headers.get("x-llm-api-key")
    if raw is None:
        return None, None
    try:
        return parse_key_header(raw)
    except ValueError as exc:  # the message describes the format, never the value
        raise RpcError(INVALID_PARAMS, str(exc), str(exc)) from None


def _error_reply(body: bytes, exc: RpcError) -> JSONResponse:
    """`exc` as the JSON-RPC answer to every call in `body` (HTTP 200, ids echoed when readable)."""
    import json

    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    calls = payload if isinstance(payload, list) and payload else [payload]
    answers = [{"jsonrpc": "2.0", "id": c.get("id") if isinstance(c, dict) else None, "error": exc.to_dict()}
               for c in calls]
    return JSONResponse(answers if isinstance(payload, list) and payload else answers[0])


def unauthorized(exc: AuthError) -> JSONResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": PERMISSION_DENIED, "message": str(exc),
                                                   "data": str(exc)}}
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def _only_public(body: bytes, methods: Mapping[str, Handler]) -> bool:
    import json

    try:
        payload = json.loads(body)
    except ValueError:
        return False
    calls = payload if isinstance(payload, list) else [payload]
    return all(isinstance(c, dict) and c.get("method") in PUBLIC_METHODS for c in calls)


def rpc_endpoint(services: Services, methods: Mapping[str, Handler], surface: str):  # type: ignore[no-untyped-def]
    async def endpoint(request: Request) -> Response:
        body = await request.body()
        try:
            ctx = call_context(request, services, surface)
        except RpcError as exc:
            return _error_reply(body, exc)
        if isinstance(ctx, AuthError):
            if not _only_public(body, methods):
                return unauthorized(ctx)
            ctx = CallContext(surface=surface, request=request)
        return await dispatch(body, methods, ctx)

    return endpoint


def build_app(settings: Settings, *, registry: ExecutorRegistry | None = None) -> Starlette:
    services = Services.build(settings, registry)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.stop()

    routes: list[Any] = [
        Route("/tasks", rpc_endpoint(services, services.task_methods, "jsonrpc"), methods=["POST"]),
    ]
    if settings.enable_system_routes:
        routes.append(Route("/system", rpc_endpoint(services, services.system_methods, "jsonrpc"), methods=["POST"]))
    routes.append(ws_route(services))
    if settings.api_protocol == "graphql":
        from agent.graphql import graphql_routes  # lazy: strawberry loads only when enabled

        routes.extend(graphql_routes(services))
    routes.extend(a2a_routes(services))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.services = services
    return app


