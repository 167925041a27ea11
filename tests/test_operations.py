"""/metrics, /healthz and /readyz: what operators and orchestrators read."""

from __future__ import annotations

import re
from typing import Any

from taskgrove.agent.foundations.auth import mint_token
from tests.conftest import Client
from tests.test_engine import FAIL, task


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text, 0 when absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def test_metrics_move_with_the_work(client: Client) -> None:
    before = (await client.http.get("/metrics")).text
    await client.result("tasks.create", [task("root", deps=["ok"]), task("ok", "root"),
                                         task("bad", "root", method=None, **FAIL)])
    response = await client.http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert sample(text, "taskgrove_executions_started_total", executor="noop_executor") == \
        sample(before, "taskgrove_executions_started_total", executor="noop_executor") + 2
    assert sample(text, "taskgrove_executions_finished_total", executor="noop_executor", outcome="completed") >= 2
    assert sample(text, "taskgrove_executions_finished_total", executor="command_executor", outcome="failed") >= 1
    assert sample(text, "taskgrove_tasks", status="completed") == 2
    assert sample(text, "taskgrove_tasks", status="failed") == 1
    assert sample(text, "taskgrove_execution_duration_seconds_count", executor="noop_executor") >= 2
    assert sample(text, "taskgrove_engine_pass_seconds_count") >= 1
    assert sample(text, "taskgrove_http_requests_total", surface="tasks", method="POST", code="200") >= 1
    assert "taskgrove_runnable_queue_depth" in text and "taskgrove_retries_total" in text


async def test_health_and_readiness(client: Client, monkeypatch: Any) -> None:
    from taskgrove.agent.surfaces import operations

    assert (await client.http.get("/healthz")).json() == {"status": "ok"}
    ready = await client.http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"migrations": True, "engine": True, "database": True}}

    async def down(*_a: Any, **_k: Any) -> Any:
        raise OSError("refused")

    monkeypatch.setattr(client.services.repo.connections, "transact", down)
    monkeypatch.setattr(operations, "READY_DB_FRESH_SECONDS", 0.0)
    not_ready = await client.http.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["checks"]["database"] is False and not_ready.json()["checks"]["database_error"] == "unavailable"
    assert (await client.http.get("/healthz")).status_code == 200, "alive, though not ready"


async def test_metrics_follow_jwt_unless_public(app_factory: Any) -> None:
    secret = "operations-test-secret-of-at-least-32-bytes"
    async with app_factory({"SERVICE_JWT_SECRET": secret}) as client:
        assert (await client.http.get("/metrics")).status_code == 401
        assert (await client.http.get("/healthz")).status_code == 200
        assert (await client.http.get("/readyz")).status_code == 200
        token = mint_token(client.services.settings, "ops", [], 60)
        assert (await client.http.get("/metrics", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    async with app_factory({"SERVICE_JWT_SECRET": secret, "SERVICE_METRICS_PUBLIC": "true"}) as client:
        assert (await client.http.get("/metrics")).status_code == 200
    async with app_factory({"SERVICE_ENABLE_METRICS": "false"}) as client:
        assert (await client.http.get("/metrics")).status_code in (404, 405)
