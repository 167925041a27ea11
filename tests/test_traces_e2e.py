"""Traces across real services (issue 30, item 1): a client's `traceparent` makes one trace of
everything that follows, across two services, a kill -9 and a takeover.

Service A runs on two instances over one PostgreSQL database; its tree calls service B through
a2a_agent_executor, then works in a command that A1 is killed in the middle of; A2 takes the
execution over. Every service exports to a small OTLP/HTTP receiver in the test (POST
/v1/traces, protobuf bodies decoded with opentelemetry-proto). The trace must hold every span,
each parented on a span of the trace or on the client's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import postgres_database
from tests.deadlines import EVENT_WAIT
from tests.processes import Service, start_together
from tests.servers import serve
from tests.test_durability_e2e import command_task, needs_postgres

CLIENT_TRACE = uuid.uuid4().hex
CLIENT_SPAN = uuid.uuid4().hex[:16]
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


@dataclass
class OtlpReceiver:
    """What an OpenTelemetry collector would receive over OTLP/HTTP."""

    spans: list[Span] = field(default_factory=list)

    async def handle(self, request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        for resource_spans in message.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    self.spans.append(Span(service, span.name, span.trace_id.hex(), span.span_id.hex(),
                                           span.parent_span_id.hex(), attributes))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    def find(self, service: str, name: str, **attributes: Any) -> list[Span]:
        return [s for s in self.spans if s.service == service and s.name == name
                and all(s.attributes.get(k) == v for k, v in attributes.items())]

    async def wait_for(self, what: str, predicate: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"never received {what}: {self.spans}"
            await asyncio.sleep(0.05)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, OtlpReceiver]]:
    receiver = OtlpReceiver()
    app = Starlette(routes=[Route("/v1/traces", receiver.handle, methods=["POST"])])
    async with serve(app) as url:
        yield f"{url}/v1/traces", receiver


def traced(endpoint: str, name: str) -> dict[str, str]:
    """The standard variables that turn traces on, exported quickly (200 ms batches)."""
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": name, "OTEL_BSP_SCHEDULE_DELAY": "200"}


def the_tree(agent_url: str, marker: Path) -> list[dict[str, Any]]:
    """root <- ask (B over A2A: a noop tree there) <- work (a command A1 is killed in)."""
    remote = [{"id": f"b-{uuid.uuid4().hex[:8]}", "name": "remote noop", "schemas": {"method": "noop_executor"}}]
    return [
        {"id": "root", "name": "root", "dependencies": [{"id": "work"}]},
        {"id": "ask", "name": "ask", "parent_id": "root", "schemas": {"method": "a2a_agent_executor"},
         "inputs": {"agent_url": agent_url, "data": {"tasks": remote}, "poll_interval": 0.1}},
        command_task("work", "root", marker, 4, deps=["ask"]),
    ]


async def in_progress_on(service: Service, task_id: str, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task = await service.task(task_id)
        if task and task["status"] == "in_progress":
            return task
        if time.monotonic() >= deadline:
            tree = {t: await service.task(t) for t in ("root", "ask", "work")}
            raise AssertionError(f"{task_id} never started: " + repr({t: (r or {}).get("status") for t, r in tree.items()})
                                 + f" ask: {tree['ask']}\n--- log:\n" + service.log()[-6000:])
        await asyncio.sleep(0.05)


@needs_postgres
async def test_one_trace_across_two_services_a_kill_9_and_a_takeover(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    async with otlp_receiver() as (endpoint, receiver), postgres_database() as url:
        b = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'b.db'}",
                               **traced(endpoint, "B")}, "b")
        shared = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_LEASE_SECONDS": "2",
                  "SERVICE_COMMAND_ALLOWLIST": "sh", **traced(endpoint, "A")}
        a1, a2 = Service(tmp_path, shared, "a1"), Service(tmp_path, shared, "a2")
        start_together(b, a1, a2)
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                answer = (await http.post(f"{a1.url}/tasks", headers={"traceparent": TRACEPARENT}, json={
                    "jsonrpc": "2.0", "id": 1, "method": "tasks.create",
                    "params": the_tree(b.url, marker)})).json()
            assert "error" not in answer, answer
            await in_progress_on(a1, "work")
            # The attempts A1 finished are exported before it dies (its batches leave every 200 ms).
            await receiver.wait_for("A1's attempt of ask", lambda: receiver.find("A", "taskgrove attempt",
                                                                                  **{"taskgrove.task_id": "ask"}))
            a1.kill()
            await receiver.wait_for("A's execution span (from A2)", lambda: receiver.find("A", "taskgrove execution"))
            await receiver.wait_for("B's spans", lambda: receiver.find("B", "taskgrove execution")
                                    and receiver.find("B", "taskgrove attempt"))
        finally:
            for service in (a1, a2, b):
                service.stop()
    spans = receiver.spans
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}, "every span of both services in the client's trace"
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans), "no span reported twice"
    for span in spans:
        assert span.parent_id in ids or span.parent_id == CLIENT_SPAN, f"orphan span {span}"

    [execution_a] = receiver.find("A", "taskgrove execution")
    assert execution_a.parent_id == CLIENT_SPAN and execution_a.attributes["taskgrove.outcome"] == "completed"
    assert execution_a.attributes["taskgrove.root_task_id"] == "root"
    a_attempts = receiver.find("A", "taskgrove attempt")
    assert {s.parent_id for s in a_attempts} == {execution_a.span_id}
    assert {s.attributes["taskgrove.task_id"] for s in a_attempts} >= {"ask", "work", "root"}

    # The attempt A1 was killed in: reported by A2, which settled it, then run again there.
    [cut] = receiver.find("A", "taskgrove interrupted attempt", **{"taskgrove.task_id": "work"})
    assert cut.parent_id == execution_a.span_id and cut.attributes["taskgrove.outcome"] == "interrupted"
    [rerun] = receiver.find("A", "taskgrove attempt", **{"taskgrove.task_id": "work"})
    assert rerun.attributes["taskgrove.outcome"] == "completed"
    assert rerun.attributes["taskgrove.executor"] == "command_executor"
    assert rerun.attributes["taskgrove.attempt"] == 1

    # B's execution is a child of A's attempt that called it, B's attempts children of it. Under
    # load A1 may lose ask's lease after it called B: its re-run sends the same request, which
    # joins B's execution, and the cut-off attempt is reported (by the instance that settled it)
    # under the id its call carried.
    [ask] = receiver.find("A", "taskgrove attempt", **{"taskgrove.task_id": "ask"})
    assert ask.attributes["taskgrove.executor"] == "a2a_agent_executor"
    [execution_b] = receiver.find("B", "taskgrove execution")
    cut_asks = receiver.find("A", "taskgrove interrupted attempt", **{"taskgrove.task_id": "ask"})
    assert execution_b.parent_id in {ask.span_id, *(s.span_id for s in cut_asks)}
    b_attempts = receiver.find("B", "taskgrove attempt")
    assert b_attempts and {s.parent_id for s in b_attempts} == {execution_b.span_id}
