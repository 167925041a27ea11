"""Traces in one process (issue 30, item 1; the two-service test is tests/test_traces_e2e.py).

The caller's `traceparent` is stored with the execution on every surface, a malformed one is
ignored (never an error), and with `OTEL_TRACES_EXPORTER=console` the spans are printed and every
outgoing call of an attempt (rest_executor, webhooks) carries the attempt's or execution's context.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from starlette.applications import Starlette
from starlette.routing import Route

from taskgrove.agent import tracing
from taskgrove.agent.settings import Settings, SettingsError
from taskgrove.executors.llm import LLMExecutor
from taskgrove.storage import executions
from tests.conftest import Client
from tests.processes import Service
from tests.servers import Receiver, receiver, serve
from tests.test_a2a_wire import post, send_body
from tests.test_llm_executors import make_context

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER_SPAN}-01"
MALFORMED = ["", "00-xyz", f"00-{TRACE}-{CALLER_SPAN}", f"00-{'0' * 32}-{CALLER_SPAN}-01",
             f"00-{TRACE}-{'0' * 16}-01", f"ff-{TRACE}-{CALLER_SPAN}-01", f"00-{TRACE}-{CALLER_SPAN}-01-extra",
             "x" * 600]


def test_parse_traceparent_keeps_valid_headers_and_drops_malformed_ones() -> None:
    assert tracing.parse_traceparent(TRACEPARENT) == TRACEPARENT
    assert tracing.parse_traceparent(TRACEPARENT.upper()) == TRACEPARENT
    # A later version may add fields: its first four are read (W3C, "versioning").
    assert tracing.parse_traceparent(f"01-{TRACE}-{CALLER_SPAN}-00-more") == f"00-{TRACE}-{CALLER_SPAN}-00"
    for bad in MALFORMED:
        assert tracing.parse_traceparent(bad) is None, bad


def test_otel_traces_exporter_is_read_once_and_checked() -> None:
    assert Settings.from_env({}).traces_exporter == ()  # off by default
    assert Settings.from_env({"OTEL_TRACES_EXPORTER": "none"}).traces_exporter == ()
    assert Settings.from_env({"OTEL_TRACES_EXPORTER": "OTLP, console"}).traces_exporter == ("otlp", "console")
    with pytest.raises(SettingsError, match="OTEL_TRACES_EXPORTER"):
        Settings.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(SettingsError, match="http/protobuf"):
        Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert Settings.from_env({"OTEL_SERVICE_NAME": "svc"}).traces_service_name == "svc"


async def _stored(client: Client, tree_id: str) -> str | None:
    execution = await client.services.repo.transact(executions.latest_execution, tree_id)
    return execution["traceparent"]


def _tree(prefix: str) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{uuid.uuid4().hex[:8]}", "name": "one", "schemas": {"method": "noop_executor"}}]


async def test_the_callers_traceparent_is_stored_and_a_malformed_one_ignored(client: Client) -> None:
    """Traces off: the header is still stored (an instance with traces on continues the trace)."""
    tree = _tree("create")
    await client.result("tasks.create", tree, headers={"traceparent": TRACEPARENT})
    assert await _stored(client, tree[0]["id"]) == TRACEPARENT
    for bad in MALFORMED:
        tree = _tree("bad")
        created = await client.result("tasks.create", tree, headers={"traceparent": bad})
        assert created["status"] == "completed"
        assert await _stored(client, tree[0]["id"]) is None  # traces off, nothing to continue

    tree = _tree("execute")
    await client.result("tasks.create", tree)
    await client.result("tasks.update", {"task_id": tree[0]["id"], "status": "pending"})
    await client.result("tasks.execute", {"task_id": tree[0]["id"]}, headers={"traceparent": TRACEPARENT})
    await client.wait_status(tree[0]["id"], ("completed",))
    assert await _stored(client, tree[0]["id"]) == TRACEPARENT


async def test_an_a2a_message_stores_the_callers_traceparent(client: Client) -> None:
    tree = _tree("a2a")
    answer = await post(client, send_body(tree), headers={"traceparent": TRACEPARENT})
    assert answer["result"]["status"]["state"] == "completed", answer
    assert await _stored(client, tree[0]["id"]) == TRACEPARENT
    tree = _tree("a2a-bad")
    answer = await post(client, send_body(tree), headers={"traceparent": "00-nonsense"})
    assert answer["result"]["status"]["state"] == "completed", answer
    assert await _stored(client, tree[0]["id"]) is None


def _printed_spans(text: str) -> list[dict[str, Any]]:
    """The spans ConsoleSpanExporter printed (one JSON object each, back to back)."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, start)
        spans.append(span)
    return spans


def _spans_of(spans: list[dict[str, Any]], name: str, task_id: str | None = None) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name
            and (task_id is None or s["attributes"].get("taskgrove.task_id") == task_id)]


def _header(span: dict[str, Any]) -> str:
    return f"00-{span['context']['trace_id'][2:]}-{span['context']['span_id'][2:]}-01"


async def test_console_spans_and_outgoing_calls_carry_the_trace(app_factory: Any, capsys: Any) -> None:
    sink = Receiver()
    hooks = Starlette(routes=[Route("/{path:path}", sink.handle, methods=["GET", "POST"])])
    flaky, call = f"flaky-{uuid.uuid4().hex[:8]}", f"call-{uuid.uuid4().hex[:8]}"
    other_trace = uuid.uuid4().hex
    async with serve(hooks) as url:
        async with app_factory(env={"OTEL_TRACES_EXPORTER": "console"}) as client:
            assert tracing.ENABLED
            sink.script = [500]  # the flaky task's first request fails, its retry succeeds
            created = await client.result("tasks.create", [
                {"id": flaky, "name": "flaky", "schemas": {"method": "rest_executor"},
                 "inputs": {"url": f"{url}/flaky", "retries": 0},
                 "retry": {"max_attempts": 2, "base_seconds": 0.05, "jitter": False}}],
                headers={"traceparent": TRACEPARENT})
            assert created["status"] == "completed", created
            # Without a caller's context: a trace of its own, rooted at the execution's span.
            await client.result("tasks.create", [{"id": call, "name": "call", "schemas": {"method": "rest_executor"},
                                                  "inputs": {"url": f"{url}/called"}}])
            # Executed again with a webhook, in another caller's trace.
            await client.result("tasks.update", {"task_id": call, "status": "pending"})
            await client.result("tasks.execute", {"task_id": call, "webhook_config": {"url": f"{url}/hook"}},
                                headers={"traceparent": f"00-{other_trace}-{CALLER_SPAN}-01"})
            await sink.wait_for(lambda rs: any(r["path"] == "/hook" and r["json"]["type"] == "final" for r in rs))
            assert await client.runs_ended()
        assert not tracing.ENABLED  # the app's stop flushed and shut the exporter down
    spans = _printed_spans(capsys.readouterr().out)

    attempts = _spans_of(spans, "taskgrove attempt", flaky)
    assert [s["attributes"]["taskgrove.outcome"] for s in attempts] == ["retrying", "completed"]
    assert [s["attributes"]["taskgrove.attempt"] for s in attempts] == [1, 2]
    assert {s["attributes"]["taskgrove.executor"] for s in attempts} == {"rest_executor"}
    assert {s["context"]["trace_id"] for s in attempts} == {f"0x{TRACE}"}, "the caller's trace"
    [execution] = [s for s in _spans_of(spans, "taskgrove execution") if s["context"]["trace_id"] == f"0x{TRACE}"]
    assert execution["parent_id"] == f"0x{CALLER_SPAN}"
    assert execution["attributes"]["taskgrove.outcome"] == "completed"
    assert {s["parent_id"] for s in attempts} == {execution["context"]["span_id"]}
    [wait] = _spans_of(spans, "taskgrove retry wait", flaky)
    assert wait["parent_id"] == execution["context"]["span_id"]
    assert wait["attributes"]["taskgrove.retry_delay_seconds"] == pytest.approx(0.05)
    # rest_executor sends each attempt's own context.
    assert [r["headers"]["traceparent"] for r in sink.requests if r["path"] == "/flaky"] == \
        [_header(s) for s in attempts]

    first, again = _spans_of(spans, "taskgrove attempt", call)
    [root] = [s for s in _spans_of(spans, "taskgrove execution") if s["context"]["trace_id"] == first["context"]["trace_id"]]
    assert root["parent_id"] is None and first["parent_id"] == root["context"]["span_id"]
    assert first["context"]["trace_id"] not in (f"0x{TRACE}", f"0x{other_trace}")
    assert again["context"]["trace_id"] == f"0x{other_trace}"
    assert [r["headers"]["traceparent"] for r in sink.requests if r["path"] == "/called"] == \
        [_header(first), _header(again)]
    # The webhook's posts carry the execution span's context.
    [third] = [s for s in _spans_of(spans, "taskgrove execution") if s["context"]["trace_id"] == f"0x{other_trace}"]
    assert {r["headers"].get("traceparent") for r in sink.requests if r["path"] == "/hook"} == {_header(third)}
    for span in spans:  # ids, names, numbers and outcomes only: never inputs, URLs or errors
        assert url not in json.dumps(span["attributes"]), span


async def test_push_notifications_carry_the_callers_traceparent(client: Client) -> None:
    async with receiver() as rec:
        config = {"url": f"{rec.url}/hooks/a2a"}
        answer = await post(client, send_body(_tree("push"), configuration={"pushNotificationConfig": config}),
                            headers={"traceparent": TRACEPARENT})
        assert "result" in answer, answer
        await rec.wait_for(lambda reqs: any(r["json"]["final"] for r in reqs))
    assert {r["headers"].get("traceparent") for r in rec.requests} == {TRACEPARENT}


@pytest.mark.parametrize("header, stored", [(TRACEPARENT, TRACEPARENT), ("00-bad", None)])
async def test_a_graphql_create_stores_the_callers_traceparent(app_factory: Any, header: str,
                                                             stored: str | None) -> None:
    async with app_factory(env={"SERVICE_API_PROTOCOL": "graphql"}) as client:
        response = await client.http.post("/graphql", headers={"traceparent": header}, json={
            "query": "mutation($input: CreateTaskInput) { createTask(taskInput: $input) { id } }",
            "variables": {"input": {"name": "traced", "executor": "noop_executor"}}})
        assert response.status_code == 200 and "errors" not in response.json(), response.text
        task_id = response.json()["data"]["createTask"]["id"]
        await client.wait_status(task_id, ("completed",))
        assert await _stored(client, task_id) == stored


async def test_an_mcp_tool_call_stores_the_callers_traceparent(tmp_path: Path) -> None:
    """A real service (the MCP session manager runs in its lifespan), its database read afterwards."""
    service = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}"}).start()
    try:
        async with create_mcp_http_client(headers={"traceparent": TRACEPARENT}) as http, \
                streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            created = await session.call_tool("tasks_create", {"tasks": [{"id": "by-mcp", "name": "by mcp"}]})
            assert not created.is_error, created
    finally:
        service.stop()
    with sqlite3.connect(tmp_path / "tg.db") as db:
        assert db.execute("SELECT traceparent FROM executions WHERE task_id = 'by-mcp'").fetchall() == [(TRACEPARENT,)]


@pytest.mark.parametrize("stream", [True, False])
async def test_llm_calls_carry_the_attempts_traceparent(fake_llm: Any, stream: bool) -> None:
    context = dataclasses.replace(make_context(fake_llm), traceparent=TRACEPARENT)
    await LLMExecutor().execute({"prompt": "say hi", "stream": stream}, context)
    assert fake_llm.requests[-1]["traceparent"] == TRACEPARENT
    await LLMExecutor().execute({"prompt": "say hi", "stream": stream}, make_context(fake_llm))
    assert fake_llm.requests[-1]["traceparent"] is None  # traces off: nothing sent
