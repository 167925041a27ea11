"""agent/surfaces/rpc_front.py answers POST /tasks and /system in front of Starlette's middleware
stack: every answer, and every count in /metrics, must be what the stack gives the same request
(the app with its front taken off goes through ServerErrorMiddleware, HttpMetrics, BodyLimit,
ExceptionMiddleware and the router, as every other route does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.settings import Settings

HEALTH = {"jsonrpc": "2.0", "id": 7, "method": "system.health"}
# (path, body, headers): each a way a request is answered before, by or after the endpoint.
REQUESTS: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "a call": ("/system", json.dumps(HEALTH).encode(), {}),
    "a batch": ("/tasks", json.dumps([{**HEALTH, "method": "tasks.get", "params": {"task_id": "none"}},
                                      {**HEALTH, "id": 8, "method": "no.such"}]).encode(), {}),
    "a notification": ("/system", json.dumps({"jsonrpc": "2.0", "method": "system.health"}).encode(), {}),
    "not JSON": ("/tasks", b"{nope", {}),
    "too large": ("/tasks", b'{"x": "' + b"y" * 5000 + b'"}', {}),  # SERVICE_MAX_REQUEST_BYTES 1024 below
    "too deep": ("/tasks", b"[" * 40 + b"]" * 40, {}),  # SERVICE_MAX_JSON_DEPTH 16 below
    "not declared JSON": ("/system", json.dumps(HEALTH).encode(), {"content-type": "text/plain"}),
}


def _requests_counted(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("taskgrove_http_requests_total{")}


async def _answers(settings: Settings, front: bool, names: list[str],
                   break_admission: bool = False) -> tuple[list[Any], dict[str, float]]:
    app = build_app(settings)
    if not front:
        app.front = None
    async with app.router.lifespan_context(app):
        if break_admission:
            def broken(*_: Any, **__: Any) -> None:
                raise RuntimeError("admission broke")

            app.state.services.admission.admit_request = broken
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            answers = []
            for name in names:
                path, body, headers = REQUESTS[name]
                response = await http.post(path, content=body, headers={"content-type": "application/json",
                                                                        **headers})
                shown = response.json() if response.content else None
                if isinstance(shown, dict) and isinstance(shown.get("result"), dict):
                    shown["result"].pop("timestamp", None)  # the one value that differs
                answers.append((name, response.status_code, response.headers.get("content-type"),
                                response.headers.get("content-length"), response.headers.get("connection"), shown))
            metrics = (await http.get("/metrics")).text
    return answers, _requests_counted(metrics)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_front_answers_and_counts_as_the_stack_does(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings({"SERVICE_MAX_REQUEST_BYTES": "1024", "SERVICE_MAX_JSON_DEPTH": "16"})
    names = list(REQUESTS)
    through_front = await _answers(settings, True, names)
    through_stack = await _answers(settings, False, names)
    assert through_front == through_stack
    answers, counted = through_front
    statuses = {name: status for name, status, *_ in answers}
    assert statuses == {"a call": 200, "a batch": 200, "a notification": 204, "not JSON": 200, "too large": 413,
                        "too deep": 200, "not declared JSON": 415}
    assert counted['taskgrove_http_requests_total{code="413",method="POST",surface="tasks"}'] == 1


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_an_exception_past_the_endpoint_meets_the_apps_last_net_either_way(
        make_settings: Callable[..., Settings]) -> None:
    """An exception no surface caught: -32603 from internal_error (HTTP 200, no traceback in the
    answer), counted as a 500 by the request metrics, as ServerErrorMiddleware and HttpMetrics did."""
    settings = make_settings()
    through_front = await _answers(settings, True, ["a call"], break_admission=True)
    through_stack = await _answers(settings, False, ["a call"], break_admission=True)
    assert through_front == through_stack
    (_, status, _, _, _, shown), = through_front[0]
    assert status == 200 and shown["error"]["code"] == -32603 and "admission" not in json.dumps(shown)
    assert any(re.search(r'code="500".*surface="system"', key) for key in through_front[1])


def test_uvicorns_access_lines_are_built_only_when_they_are_logged() -> None:
    """agent/foundations/logconfig.py: uvicorn builds a request's access line whenever its access
    logger has a handler anywhere; above INFO it has none (the line would be dropped anyway),
    at INFO it reaches the root handler, as every other line."""
    import logging

    from taskgrove.agent.foundations.logconfig import configure

    root, access = logging.getLogger(), logging.getLogger("uvicorn.access")
    saved = root.handlers[:], root.level, access.propagate
    try:
        configure("text", "WARNING")
        assert not access.hasHandlers()
        configure("text", "INFO")
        assert access.hasHandlers() and access.propagate  # its level is uvicorn's to set (to the same level)
    finally:
        root.handlers[:], access.propagate = saved[0], saved[2]
        root.setLevel(saved[1])
