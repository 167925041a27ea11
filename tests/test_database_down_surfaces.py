"""Every surface while the database is gone (issue 46, item 2): its own form of one retryable
error, never its internal error, and the same calls work again once the database is back.

A real uvicorn server in this process (HTTP, WebSocket and the gRPC port), its database cut at
the connection layer (tests/db_faults.py: every statement fails with the driver's "unable to open
database file"), then each surface asked what a client would ask: JSON-RPC on /tasks and `/`,
GraphQL, MCP, WebSocket, HTTP+JSON /a2a and gRPC.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import grpc
import grpc.aio
import pytest
import websockets
from a2a.helpers.proto_helpers import new_data_part
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Role, SendMessageRequest
from google.rpc import error_details_pb2, status_pb2

from taskgrove.agent.foundations.errors import DATABASE_UNAVAILABLE
from taskgrove.agent.foundations.settings import Settings
from tests.db_faults import database_cut
from tests.servers import free_port
from tests.test_a2a_wire import send_body
from tests.test_engine import task
from tests.test_ws import Live, live_server

MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def assert_503(response: Any) -> Any:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    return response.json()


def assert_rpc_outage(error: dict[str, Any]) -> None:
    assert error["code"] == DATABASE_UNAVAILABLE, error
    assert error["data"]["reason"] == "unavailable" and error["data"]["retry_after"] >= 1, error


async def rpc(server: Live, path: str, method: str, params: Any) -> Any:
    return await server.http.post(path, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params})


async def graphql(server: Live, query: str) -> Any:
    return await server.http.post("/graphql", json={"query": query})


def sse_answer(response: Any) -> dict[str, Any]:
    """The JSON-RPC answer of an MCP POST (an SSE stream or plain JSON)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:"):
            return json.loads(line[5:])
    raise AssertionError(response.text)


async def mcp_session(server: Live) -> dict[str, str]:
    init = await server.http.post("/mcp", headers=MCP_HEADERS, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert init.status_code == 200, init.text
    headers = {**MCP_HEADERS, "mcp-session-id": init.headers["mcp-session-id"]}
    if "mcp-protocol-version" in init.headers:
        headers["mcp-protocol-version"] = init.headers["mcp-protocol-version"]
    await server.http.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers


async def mcp_tool(server: Live, headers: dict[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    response = await server.http.post("/mcp", headers=headers, json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    assert response.status_code == 200, response.text
    return sse_answer(response)["result"]


def grpc_outage(caught: grpc.aio.AioRpcError) -> tuple[str, int]:
    """(ErrorInfo reason's metadata reason, RetryInfo seconds) of an UNAVAILABLE status."""
    assert caught.code() == grpc.StatusCode.UNAVAILABLE, (caught.code(), caught.details())
    raw = dict(caught.trailing_metadata() or ()).get("grpc-status-details-bin")
    status = status_pb2.Status.FromString(raw)
    reason, delay = "", 0
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.reason == "DATABASE_UNAVAILABLE"
            reason = info.metadata["reason"]
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delay = retry.retry_delay.seconds
    return reason, delay


async def test_every_surface_answers_its_own_retryable_error_while_the_database_is_gone(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    grpc_port = free_port()
    settings = Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'down.db'}",
                                  "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_RATE_LIMIT_PER_USER": "0",
                                  "SERVICE_API_HOST": "127.0.0.1", "SERVICE_GRPC_PORT": str(grpc_port),
                                  "SERVICE_API_PROTOCOL": "graphql"})
    caplog.set_level(logging.INFO)
    with database_cut(monkeypatch) as cut:
        async with live_server(settings) as server, grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            await server.rpc("tasks.create", [task("before")])
            await server.wait_status("before", ("completed",))
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            mcp = await mcp_session(server)
            socket = await websockets.connect(f"{server.ws_url}/ws")
            sent = await server.http.post("/", json=send_body([task(f"a2a-{uuid.uuid4().hex[:6]}")]))
            agent_task = sent.json()["result"]["id"]

            cut.down()
            # /tasks and /system: JSON-RPC -32050, HTTP 503
            assert_rpc_outage(assert_503(await rpc(server, "/tasks", "tasks.get", {"task_id": "before"}))["error"])
            assert_rpc_outage(assert_503(await rpc(server, "/tasks", "tasks.create", [task("during")]))["error"])
            ready = await server.http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["database_error"] == "unavailable"

            # GraphQL: extensions.code, HTTP 503
            for query in ('{ task(taskId: "before") { id status } }',
                          'mutation { createTask(taskInput: {name: "during", executor: "noop_executor"}) { id } }'):
                answer = assert_503(await graphql(server, query))
                (error,) = answer["errors"]
                assert error["extensions"]["code"] == DATABASE_UNAVAILABLE, answer
                assert error["extensions"]["codeName"] == "DATABASE_UNAVAILABLE"
                assert error["extensions"]["reason"] == "unavailable" and error["extensions"]["retryAfter"] >= 1

            # MCP: a tool result with isError and the JSON-RPC error
            for name, arguments in (("tasks_get", {"task_id": "before"}), ("tasks_create", {"tasks": [task("m")]})):
                result = await mcp_tool(server, mcp, name, arguments)
                assert result["isError"] is True, result
                assert_rpc_outage(result["structuredContent"]["error"])

            # WebSocket: an error frame; the socket stays open
            await socket.send(json.dumps({"action": "subscribe", "task_id": "before"}))
            frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
            assert frame["type"] == "error" and frame["data"]["code"] == DATABASE_UNAVAILABLE, frame
            assert frame["data"]["reason"] == "unavailable" and frame["data"]["retry_after"] >= 1

            # A2A on `/`: our methods and the SDK's, JSON-RPC -32050, HTTP 503
            assert_rpc_outage(assert_503(await rpc(server, "/", "tasks.get", {"task_id": "before"}))["error"])
            for body in (send_body([task(f"a2a-{uuid.uuid4().hex[:6]}")]),
                         {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": agent_task}}):
                assert_rpc_outage(assert_503(await server.http.post("/", json=body))["error"])

            # HTTP+JSON /a2a: google.rpc.Status UNAVAILABLE, HTTP 503
            message = {"message": {"role": "ROLE_USER", "messageId": uuid.uuid4().hex,
                                   "parts": [{"data": {"tasks": [task(f"r-{uuid.uuid4().hex[:6]}")]}}]}}
            version = {"A2A-Version": "1.0"}
            for response in (await server.http.get(f"/a2a/tasks/{agent_task}", headers=version),
                             await server.http.post("/a2a/message:send", json=message, headers=version)):
                error = assert_503(response)["error"]
                assert error["status"] == "UNAVAILABLE" and error["code"] == 503, error
                assert any(d.get("reason") == "DATABASE_UNAVAILABLE" for d in error["details"]), error

            # gRPC: UNAVAILABLE with ErrorInfo and RetryInfo
            grpc_message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex,
                                   parts=[new_data_part({"tasks": [task(f"g-{uuid.uuid4().hex[:6]}")]})])
            for call in (stub.GetTask(GetTaskRequest(id=agent_task)),
                         stub.SendMessage(SendMessageRequest(message=grpc_message))):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                reason, delay = grpc_outage(caught.value)
                assert reason == "unavailable" and delay >= 1

            cut.up()
            deadline = asyncio.get_running_loop().time() + 60
            while (await server.http.get("/readyz")).status_code != 200:
                assert asyncio.get_running_loop().time() < deadline, "never ready again"
                await asyncio.sleep(0.1)
            # The same calls work again, on the same connections.
            assert (await server.rpc("tasks.get", {"task_id": "before"}))["status"] == "completed"
            answer = (await graphql(server, '{ task(taskId: "before") { id status } }')).json()
            assert answer["data"]["task"]["status"] == "COMPLETED", answer
            assert (await mcp_tool(server, mcp, "tasks_get", {"task_id": "before"})).get("isError") is not True
            await socket.send(json.dumps({"action": "subscribe", "task_id": "before"}))
            frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
            assert frame["type"] == "task_completed", frame
            await socket.close()
            assert (await stub.GetTask(GetTaskRequest(id=agent_task))).id == agent_task
            assert (await server.http.get(f"/a2a/tasks/{agent_task}", headers={"A2A-Version": "1.0"})).status_code == 200
    surface_tracebacks = [r.getMessage() for r in caplog.records if r.exc_info
                          and (r.name.startswith("taskgrove.agent.surfaces") or r.name.startswith("a2a"))]
    assert not surface_tracebacks, surface_tracebacks
