"""Traces in one process (issue 30, item 1; the two-service test is tests/test_traces_e2e.py).

The caller's `traceparent` is stored with the execution on every surface, a malformed one is
ignored (never an error), and with `OTEL_TRACES_EXPORTER=console` the spans are printed and every
outgoing call of an attempt (rest_executor, webhooks) carries the attempt's or execution's context.
An attempt's `wait_seconds` covers its wait for a slot, gRPC metadata is read like a header, and an
execution resumed after a restart stays in the caller's trace.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import TaskState
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from starlette.applications import Starlette
from starlette.routing import Route

from taskgrove.agent.foundations import tracing
from taskgrove.agent.foundations.settings import Settings, SettingsError
from taskgrove.executors.llm import LLMExecutor
from taskgrove.storage import executions
from tests.conftest import Client
from tests.processes import Service
from tests.servers import Receiver, free_port, receiver, serve
from tests.test_a2a_grpc import data_request
from tests.test_a2a_wire import post, send_body
from tests.test_a2a_wire import tree as a2a_tree  # a root aggregating two children
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


def _at(stamp: str) -> float:
    """A printed span time (ISO 8601, UTC) in seconds."""
    return datetime.fromisoformat(stamp).timestamp()


def _attempts_of_tree(spans: list[dict[str, Any]], root_id: str) -> dict[str, dict[str, Any]]:
    return {s["attributes"]["taskgrove.task_id"]: s for s in _spans_of(spans, "taskgrove attempt")
            if s["attributes"]["taskgrove.root_task_id"] == root_id}


async def test_wait_seconds_covers_the_wait_for_a_slot(app_factory: Any, capsys: Any) -> None:
    """One slot, two independent sleeps: the second one waits for the first's whole run, and its
    `wait_seconds` says so; no attempt waited less than nothing or longer than its execution."""
    nap = {"schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 0.3}, "parent_id": "slot-root"}
    tree = [{"id": "slot-root", "name": "root", "dependencies": [{"id": "slot-a"}, {"id": "slot-b"}]},
            {"id": "slot-a", "name": "a", **nap}, {"id": "slot-b", "name": "b", **nap}]
    async with app_factory(env={"OTEL_TRACES_EXPORTER": "console", "SERVICE_MAX_CONCURRENCY": "1"}) as client:
        assert (await client.result("tasks.create", tree))["status"] == "completed"
        assert await client.runs_ended()
    spans = _printed_spans(capsys.readouterr().out)
    attempts = _attempts_of_tree(spans, "slot-root")
    assert set(attempts) == {"slot-root", "slot-a", "slot-b"}
    [execution] = [s for s in _spans_of(spans, "taskgrove execution")
                   if s["attributes"]["taskgrove.root_task_id"] == "slot-root"]
    for task_id, span in attempts.items():
        waited = span["attributes"]["taskgrove.wait_seconds"]
        assert waited >= 0, task_id
        # Never longer than from the execution's start to the attempt's (1 ms: the printed times' rounding).
        assert waited <= _at(span["start_time"]) - _at(execution["start_time"]) + 1e-3, (task_id, waited)
    first, second = sorted((attempts["slot-a"], attempts["slot-b"]), key=lambda s: _at(s["start_time"]))
    assert _at(second["start_time"]) >= _at(first["end_time"]), "one slot: the second started after the first"
    first_ran = _at(first["end_time"]) - _at(first["start_time"])
    assert first_ran >= 0.3
    assert second["attributes"]["taskgrove.wait_seconds"] >= first_ran - 1e-3, "its wait covers the first's run"
    assert second["attributes"]["taskgrove.wait_seconds"] > first["attributes"]["taskgrove.wait_seconds"]


async def test_a_traceparent_in_grpc_metadata_is_stored_and_a_malformed_one_ignored(
        app_factory: Any, capsys: Any) -> None:
    """The A2A gRPC transport (SERVICE_GRPC_PORT) reads `traceparent` from the call's metadata as
    the other surfaces read the header: the execution's spans are in the caller's trace."""
    port = free_port()
    traced, bad = a2a_tree(), a2a_tree()
    env = {"SERVICE_API_HOST": "127.0.0.1", "SERVICE_GRPC_PORT": str(port), "OTEL_TRACES_EXPORTER": "console"}
    async with app_factory(env=env) as client, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = a2a_pb2_grpc.A2AServiceStub(channel)
        answer = await raw.SendMessage(data_request(traced), metadata=[("traceparent", TRACEPARENT)])
        assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert await _stored(client, traced[0]["id"]) == TRACEPARENT
        answer = await raw.SendMessage(data_request(bad), metadata=[("traceparent", f"00-{TRACE}-nonsense")])
        assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED, "a malformed header is not refused"
        own = await _stored(client, bad[0]["id"])
        assert own is not None and TRACE not in own, "traces on: a trace of its own, rooted at the execution"
        assert own.split("-")[2] == "0" * 16
        assert await client.runs_ended()
    spans = _printed_spans(capsys.readouterr().out)
    for tree, trace_id, parent in ((traced, TRACE, f"0x{CALLER_SPAN}"), (bad, own.split("-")[1], None)):
        root_id = tree[0]["id"]
        attempts = _attempts_of_tree(spans, root_id)
        assert set(attempts) == {t["id"] for t in tree}
        [execution] = [s for s in _spans_of(spans, "taskgrove execution")
                       if s["attributes"]["taskgrove.root_task_id"] == root_id]
        assert execution["parent_id"] == parent
        assert {s["context"]["trace_id"] for s in [execution, *attempts.values()]} == {f"0x{trace_id}"}
        assert {s["parent_id"] for s in attempts.values()} == {execution["context"]["span_id"]}


async def test_an_execution_resumed_after_a_restart_continues_the_callers_trace(
        app_factory: Any, capsys: Any) -> None:
    """The service stops while the attempt runs; started again on the same database it resumes
    the execution by itself, and what it reports is in the trace the caller began."""
    env = {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "OTEL_TRACES_EXPORTER": "console"}
    sleeper = {"id": "cut", "name": "cut", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 1.0}}
    async with app_factory(env=env) as first:
        await first.result("tasks.create", [sleeper], headers={"traceparent": TRACEPARENT})
        await first.wait_status("cut", ("in_progress",))
    before = _printed_spans(capsys.readouterr().out)
    async with app_factory(env=env) as second:  # the same database; nothing is called
        assert (await second.wait_status("cut", ("completed", "failed")))["status"] == "completed"
        assert await second.runs_ended()
    after = _printed_spans(capsys.readouterr().out)

    # The attempt the stop cut off: `stopped` (docs/observability.md), not `cancelled` (no one cancelled it).
    assert [s["attributes"]["taskgrove.outcome"] for s in _spans_of(before, "taskgrove attempt", "cut")] == ["stopped"]
    assert not _spans_of(before, "taskgrove execution"), "the execution had not ended"
    [resumed] = _spans_of(after, "taskgrove attempt", "cut")
    assert resumed["attributes"]["taskgrove.outcome"] == "completed"
    [execution] = _spans_of(after, "taskgrove execution")
    assert execution["parent_id"] == f"0x{CALLER_SPAN}"
    assert execution["attributes"]["taskgrove.outcome"] == "completed"
    assert resumed["parent_id"] == execution["context"]["span_id"]
    assert {s["context"]["trace_id"] for s in before + after} == {f"0x{TRACE}"}, "every span in the caller's trace"


async def test_an_attempt_settled_as_interrupted_is_reported_under_the_id_its_calls_carried(
        app_factory: Any, capsys: Any) -> None:
    """An attempt cut off mid-call (its lease lost: another instance settles it as interrupted)
    is reported by the settler under the span id the call carried, so what the called service
    traces keeps its parent; the attempt's own instance does not report it a second time."""
    import asyncio

    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from taskgrove.storage.clock import now_iso

    seen: list[str] = []
    release = asyncio.Event()

    async def called(request: Request) -> JSONResponse:
        seen.append(request.headers["traceparent"])
        if len(seen) == 1:
            await release.wait()  # the first call hangs until its attempt was settled
        return JSONResponse({"ok": True})

    task_id = f"call-{uuid.uuid4().hex[:8]}"
    env = {"OTEL_TRACES_EXPORTER": "console", "SERVICE_CREATE_WAIT_TIMEOUT": "0"}
    async with serve(Starlette(routes=[Route("/called", called, methods=["GET"])])) as url:
        async with app_factory(env=env) as client:
            await client.result("tasks.create", [{"id": task_id, "name": "call", "schemas": {"method": "rest_executor"},
                                                  "inputs": {"url": f"{url}/called", "retries": 0}}],
                                headers={"traceparent": TRACEPARENT})
            while not seen:
                await asyncio.sleep(0.02)
            row = await client.services.repo.get(task_id)
            assert client.services.engine.leases is not None
            await client.services.engine.leases._interrupt(row, now_iso(), restarted=False)  # what a takeover does
            release.set()
            assert (await client.wait_status(task_id, ("completed", "failed")))["status"] == "completed"
            assert await client.runs_ended()
    spans = _printed_spans(capsys.readouterr().out)
    [cut] = _spans_of(spans, "taskgrove interrupted attempt", task_id)
    [rerun] = _spans_of(spans, "taskgrove attempt", task_id)  # the cut attempt is not reported twice
    assert seen == [_header(cut), _header(rerun)]
    assert cut["attributes"]["taskgrove.outcome"] == "interrupted"
    assert rerun["attributes"]["taskgrove.outcome"] == "completed" and rerun["context"] != cut["context"]
