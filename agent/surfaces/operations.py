"""What operators and orchestrators call: /metrics, /healthz and /readyz.

`/healthz` says the process answers (liveness). `/readyz` says this instance can do its job: the
database answers, the schema is migrated, the engine's loop and lease keeper run; 503 with the
failing checks otherwise (readiness). Both are public and cheap: no table is scanned, and the
database check reuses an answer of the last second when no operation has failed since; otherwise
one probe bounded to a second, shared by concurrent callers and reused for half a second
(storage/outage.py DatabaseHealth.check): a read while the database is up or unreachable, a write
that stores nothing while it is full or read-only. A database outage is a 503 naming its reason
(`checks.database_error`: unavailable, full, read_only) with Retry-After. `/metrics` is the
Prometheus text of agent/foundations/metrics.py; with JWT on it needs a token unless SERVICE_METRICS_PUBLIC.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskgrove.agent.foundations.auth import AuthError, authenticate
from taskgrove.agent.engine.engine import Engine
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.repository import TaskRepository
from taskgrove.agent.surfaces.edge import unauthorized
from taskgrove.agent.foundations.metrics import CONTENT_TYPE
from taskgrove.storage.outage import DatabaseOutage


class OperationsServices(Protocol):
    """What /healthz, /readyz and /metrics read of the services (agent/services/container.py)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def repo(self) -> TaskRepository: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def migrated(self) -> bool: ...


READY_DB_FRESH_SECONDS = 1.0


async def database_outage(services: OperationsServices) -> DatabaseOutage | None:
    """The database's outage as readiness and /metrics see it, None when it is up."""
    repo = services.repo
    return await repo.connections.health.check(READY_DB_FRESH_SECONDS, repo.probe_read, repo.probe_write)


def database_metrics(services: OperationsServices, outage: DatabaseOutage | None) -> str:
    """taskgrove_database_up and the outages counted since the start, by reason (Prometheus text)."""
    health = services.repo.connections.health
    lines = ["# HELP taskgrove_database_up 1 when the database answers and accepts writes, 0 during an outage",
             "# TYPE taskgrove_database_up gauge", f"taskgrove_database_up {0 if outage else 1}",
             "# HELP taskgrove_database_outages_total Outages of the database since the start, by reason",
             "# TYPE taskgrove_database_outages_total counter"]
    lines.extend(f'taskgrove_database_outages_total{{reason="{reason}"}} {count}'
                 for reason, count in health.outages.items())
    return "\n".join(lines) + "\n"


def operations_routes(services: OperationsServices) -> list[Route]:
    last_counts: dict[str, int] = {}  # /metrics' task counts, kept through an outage
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        checks: dict[str, Any] = {"migrations": services.migrated, "engine": services.engine.alive}
        outage = await database_outage(services)  # never raises: a failed probe is an outage
        checks["database"] = outage is None
        headers = None
        if outage is not None:
            checks["database_error"] = outage.reason
            headers = {"Retry-After": str(outage.retry_after)}
        ready = all(checks[name] for name in ("database", "migrations", "engine"))
        return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                            status_code=200 if ready else 503, headers=headers)

    async def metrics(request: Request) -> Response:
        settings = services.settings
        if settings.jwt_enabled and not settings.metrics_public:
            try:
                authenticate(request.headers, request.cookies, settings)
            except AuthError as exc:
                return unauthorized(exc)
        engine = services.engine
        outage = await database_outage(services)
        # While the database is away the task counts cannot be read: the last ones stand, and the
        # rest is still worth a scrape.
        if outage is None or not last_counts:
            try:
                last_counts.update(await services.repo.count_by_status())
            except Exception as exc:
                if services.repo.connections.health.failed(exc) is None:
                    raise
        body = services.metrics.render(last_counts, engine.queue_depth, len(engine.running),
                                       engine.tasks_per_user(), engine.waits.parked_counts())
        return Response(body + database_metrics(services, outage).encode(), media_type=CONTENT_TYPE)

    routes = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
    if services.settings.enable_metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return routes
