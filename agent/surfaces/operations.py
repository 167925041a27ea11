"""What operators and orchestrators call: /metrics, /healthz and /readyz.

`/healthz` says the process answers (liveness). `/readyz` says this instance can do its job: the
database answers, the schema is migrated, the engine's loop and lease keeper run; 503 with the
failing checks otherwise (readiness). Both are public and cheap: no table is scanned, and the
database check reuses a commit of the last two seconds when there is one. `/metrics` is the
Prometheus text of agent/foundations/metrics.py; with JWT on it needs a token unless SERVICE_METRICS_PUBLIC.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskgrove.agent.foundations.auth import AuthError, authenticate
from taskgrove.agent.services.container import Services
from taskgrove.agent.surfaces.edge import unauthorized
from taskgrove.agent.foundations.metrics import CONTENT_TYPE

READY_DB_FRESH_SECONDS = 2.0


def operations_routes(services: Services) -> list[Route]:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        checks: dict[str, Any] = {"migrations": services.migrated, "engine": services.engine.alive}
        try:
            await services.repo.ping(fresh_within=READY_DB_FRESH_SECONDS)
            checks["database"] = True
        except Exception as exc:  # report it; readiness must always answer
            checks["database"] = False
            checks["database_error"] = type(exc).__name__
        ready = all(checks[name] for name in ("database", "migrations", "engine"))
        return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                            status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        settings = services.settings
        if settings.jwt_enabled and not settings.metrics_public:
            try:
                authenticate(request.headers, request.cookies, settings)
            except AuthError as exc:
                return unauthorized(exc)
        engine = services.engine
        body = services.metrics.render(await services.repo.count_by_status(), engine.queue_depth, len(engine.running),
                                      engine.tasks_per_user(), engine.parked_counts())
        return Response(body, media_type=CONTENT_TYPE)

    routes = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
    if services.settings.enable_metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return routes
