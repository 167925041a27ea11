"""The MCP surface through the official MCP client (ClientSession) against a real `taskgrove serve`:
streamable HTTP at /mcp, and stdio through `taskgrove mcp --url`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT
from tests.processes import BIN, Service

SECRET = "mcp-test-secret-with-enough-bytes-for-hs256"
TOOLS = {"tasks_create", "tasks_get", "tasks_tree", "tasks_list", "tasks_children", "tasks_update",
         "tasks_delete", "tasks_copy", "tasks_clone", "tasks_execute", "tasks_cancel", "tasks_generate",
         "tasks_running", "system_executors", "system_health", "schedules_create", "schedules_get",
         "schedules_list", "schedules_update", "schedules_delete", "schedules_trigger", "tasks_respond",
         "events_emit", "tasks_purge", "agents_add", "agents_get", "agents_list", "agents_refresh", "agents_remove",
         "triggers_create", "triggers_get", "triggers_list", "triggers_update", "triggers_delete", "triggers_runs"}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", **extra}


@pytest.fixture
def service(tmp_path: Path) -> Any:
    svc = Service(tmp_path, _env(tmp_path)).start()
    yield svc
    svc.stop()


@pytest.fixture
def jwt_service(tmp_path: Path) -> Any:
    svc = Service(tmp_path, _env(tmp_path, SERVICE_JWT_SECRET=SECRET)).start()
    yield svc
    svc.stop()


def _token(user: str) -> str:
    return mint_token(Settings.from_env({"SERVICE_JWT_SECRET": SECRET}), user)


@contextlib.asynccontextmanager
async def session(url: str, token: str | None = None, **kw: Any) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write, **kw) as client:
        await client.initialize()
        yield client


def _value(result: Any) -> Any:
    assert result.content and result.content[0].type == "text"
    return json.loads(result.content[0].text)


def _statuses(node: dict[str, Any]) -> dict[str, str]:
    found = {node["id"]: node["status"]}
    for child in node.get("children", []):
        found.update(_statuses(child))
    return found


SMALL_TREE = [
    {"id": "root", "name": "root", "schemas": {"method": "aggregate_results_executor"},
     "dependencies": [{"id": "a"}, {"id": "b"}]},
    {"id": "a", "name": "a", "parent_id": "root", "schemas": {"method": "noop_executor"}, "inputs": {"x": 1}},
    {"id": "b", "name": "b", "parent_id": "root", "schemas": {"method": "noop_executor"},
     "dependencies": [{"id": "a"}]},
]


async def test_mcp_can_be_turned_off(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_ENABLE_MCP": "false"}) as client:
        answer = await client.http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 404


async def test_unknown_task_is_the_json_rpc_error(service: Service) -> None:
    async with session(service.url) as client:
        for tool, method in (("tasks_execute", "tasks.execute"), ("tasks_tree", "tasks.tree"),
                             ("tasks_delete", "tasks.delete")):
            result = await client.call_tool(tool, {"task_id": "nope"})
            rpc = await service.call(method, {"task_id": "nope"})
            assert result.is_error, tool
            assert _value(result)["error"] == rpc["error"]
        assert _value(await client.call_tool("tasks_get", {"task_id": "nope"})) is None
        listed = await client.call_tool("tasks_list", {"limit": 5})
        assert not listed.is_error and _value(listed) == [] and listed.structured_content == {"result": []}


async def test_tools_listed_with_schemas(service: Service) -> None:
    async with session(service.url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    create = tools["tasks_create"]
    assert create.input_schema["required"] == ["tasks"]
    item = create.input_schema["properties"]["tasks"]["items"]
    assert item["required"] == ["name"]
    assert "sleep_executor" in item["properties"]["schemas"]["properties"]["method"]["enum"]
    assert "parent_id" in create.description and "dependencies" in create.description
    assert "noop_executor" in create.description  # the executors of this instance are named
    assert tools["tasks_get"].input_schema["required"] == ["task_id"]
    assert tools["tasks_clone"].input_schema["properties"]["origin_type"]["enum"] == ["copy", "link", "archive", "mixed"]
    assert tools["tasks_cancel"].input_schema["properties"]["task_ids"]["type"] == "array"
    assert tools["tasks_get"].annotations.read_only_hint is True
    assert tools["tasks_delete"].annotations.destructive_hint is True
    assert tools["tasks_purge"].annotations.destructive_hint is True


async def test_schedule_tools_call_the_schedule_methods(service: Service) -> None:
    await service.rpc("tasks.create", SMALL_TREE)
    async with session(service.url) as client:
        created = await client.call_tool("schedules_create", {"task_id": "root", "cron": "0 3 * * *",
                                                              "timezone": "Europe/Berlin"})
        assert not created.is_error, created
        schedule = _value(created)
        assert schedule["task_id"] == "root" and schedule["next_run_at"] and schedule["runs"] == 0
        triggered = _value(await client.call_tool("schedules_trigger", {"schedule_id": schedule["id"]}))
        assert triggered["runs"] == 1
        await service.wait_status(triggered["root_task_id"], ("completed",))
        listed = _value(await client.call_tool("schedules_list", {}))
        assert [s["id"] for s in listed] == [schedule["id"]]
        bad = await client.call_tool("schedules_create", {"task_id": "root", "cron": "every day"})
        rpc = await service.call("schedules.create", {"task_id": "root", "cron": "every day"})
        assert bad.is_error and _value(bad)["error"] == rpc["error"] and rpc["error"]["code"] == -32602
        deleted = _value(await client.call_tool("schedules_delete", {"schedule_id": schedule["id"]}))
        assert deleted["success"] is True
        assert _value(await client.call_tool("schedules_get", {"schedule_id": schedule["id"]})) is None


async def test_create_returns_the_completed_tree_and_errors_are_tool_results(service: Service) -> None:
    async with session(service.url) as client:
        result = await client.call_tool("tasks_create", {"tasks": SMALL_TREE})
        assert not result.is_error, result
        tree = _value(result)
        assert tree["id"] == "root"
        assert _statuses(tree) == {"root": "completed", "a": "completed", "b": "completed"}
        assert result.structured_content["id"] == "root"
        # The same message and data as JSON-RPC.
        cycle = [{"id": "r", "name": "r", "dependencies": [{"id": "s"}]},
                 {"id": "s", "name": "s", "parent_id": "r", "dependencies": [{"id": "r"}]}]
        failed = await client.call_tool("tasks_create", {"tasks": cycle})
        rpc = await service.call("tasks.create", {"tasks": cycle})
        assert failed.is_error
        assert _value(failed)["error"] == rpc["error"]
        health = _value(await client.call_tool("system_health", {}))
        assert health["status"] == "healthy"


async def test_execute_sends_progress_before_its_result(service: Service) -> None:
    await service.rpc("tasks.create", {"tasks": [
        {"id": "top", "name": "top", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": "nap"}],
         "status": "completed"},
        {"id": "nap", "name": "nap", "parent_id": "top", "schemas": {"method": "sleep_executor"},
         "inputs": {"seconds": 1}}]})
    copy = await service.rpc("tasks.copy", {"task_id": "top"})  # stored, pending, not run
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async with session(service.url) as client:
        result = await client.call_tool("tasks_execute", {"task_id": copy["id"]}, progress_callback=on_progress)
    assert not result.is_error, result
    answer = _value(result)
    assert answer["execution"]["status"] == "started"
    assert _statuses(answer["tree"]) == {copy["id"]: "completed", answer["tree"]["children"][0]["id"]: "completed"}
    assert notes, "no progress notification before the result"
    assert notes[-1][0] == 1.0
    values = [value for value, _ in notes]
    assert values == sorted(set(values)), values  # each notification larger than the one before


async def test_jwt_permission_failure_is_an_error_result_and_no_token_is_refused(jwt_service: Service) -> None:
    jwt_service.token = _token("alice")
    await jwt_service.rpc("tasks.create", {"tasks": [{"id": "mine", "name": "mine",
                                                     "schemas": {"method": "noop_executor"}}]})
    async with session(jwt_service.url, _token("bob")) as client:
        result = await client.call_tool("tasks_get", {"task_id": "mine"})
        assert result.is_error
        assert _value(result)["error"]["code"] == -32001
        # An own tree works.
        own = await client.call_tool("tasks_create", {"tasks": [{"id": "bobs", "name": "bobs"}]})
        assert not own.is_error and _value(own)["user_id"] == "bob"
        # Resources apply the same rules: a JSON-RPC error with the same code and data.
        for uri in ("taskgrove://tasks/mine", "taskgrove://trees/mine"):
            with pytest.raises(MCPError) as refused_read:
                await client.read_resource(uri)
            assert refused_read.value.error.code == -32001
            with pytest.raises(MCPError):
                await client.subscribe_resource(uri)
        executed = await client.call_tool("tasks_execute", {"task_id": "mine"})
        assert executed.is_error and _value(executed)["error"]["code"] == -32001
    async with session(jwt_service.url, _token("alice")) as client:
        assert _value(await client.call_tool("tasks_get", {"task_id": "mine"}))["id"] == "mine"
        assert json.loads((await client.read_resource("taskgrove://tasks/mine")).contents[0].text)["id"] == "mine"
    async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        refused = await http.post(f"{jwt_service.url}/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers={"Accept": "application/json, text/event-stream"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == -32001


async def test_tasks_purge_is_for_admins_and_deletes_ended_trees(jwt_service: Service) -> None:
    """The tool calls tasks.purge: its rules and errors, as a tool result."""
    jwt_service.token = _token("alice")
    await jwt_service.rpc("tasks.create", {"tasks": [{"id": "old", "name": "old", "schemas": {"method": "noop_executor"}}]})
    await jwt_service.wait_status("old", ("completed",))
    async with session(jwt_service.url, _token("alice")) as client:
        denied = await client.call_tool("tasks_purge", {"older_than": "1s"})
        assert denied.is_error and _value(denied)["error"]["code"] == -32001
    admin = mint_token(Settings.from_env({"SERVICE_JWT_SECRET": SECRET}), "root", ["admin"])
    async with session(jwt_service.url, admin) as client:
        for bad in ({}, {"older_than": "soon"}, {"older_than": -5}):  # {}: SERVICE_RETENTION is off
            refused = await client.call_tool("tasks_purge", bad)
            assert refused.is_error and _value(refused)["error"]["code"] == -32602, bad
            assert "older_than" in _value(refused)["error"]["data"]
        await asyncio.sleep(0.05)
        purged = await client.call_tool("tasks_purge", {"older_than": 0.01})
        assert not purged.is_error and _value(purged)["trees"] == 1 and _value(purged)["tasks"] == 1
        assert _value(await client.call_tool("tasks_get", {"task_id": "old"})) is None


async def test_resources_read_and_subscription_sees_a_status_change(service: Service) -> None:
    await service.rpc("tasks.create", {"tasks": [
        {"id": "top", "name": "top", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": "nap"}],
         "status": "completed"},
        {"id": "nap", "name": "nap", "parent_id": "top", "schemas": {"method": "sleep_executor"},
         "inputs": {"seconds": 0.2}}]})
    copy = await service.rpc("tasks.copy", {"task_id": "top"})
    updated: list[str] = []
    seen = asyncio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updated.append(str(root.params.uri))
            seen.set()

    async with session(service.url, message_handler=on_message) as client:
        executors = await client.read_resource("taskgrove://executors")
        assert "sleep_executor" in {e["id"] for e in json.loads(executors.contents[0].text)["executors"]}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert templates == {"taskgrove://tasks/{id}", "taskgrove://trees/{id}"}
        uri = f"taskgrove://trees/{copy['id']}"
        before = json.loads((await client.read_resource(uri)).contents[0].text)
        assert before["status"] == "pending"
        await client.subscribe_resource(uri)
        await service.rpc("tasks.execute", {"task_id": copy["id"]})
        await asyncio.wait_for(seen.wait(), EVENT_WAIT)
        assert updated[0] == uri
        await service.wait_status(copy["id"], ("completed",))
        after = json.loads((await client.read_resource(uri)).contents[0].text)
        assert after["status"] == "completed"
        # A status set by hand (another surface, here JSON-RPC) is a change too.
        await service.rpc("tasks.create", {"tasks": [{"id": "solo", "name": "solo", "status": "failed"}]})
        solo = "taskgrove://tasks/solo"
        await client.subscribe_resource(solo)
        seen.clear()
        await service.rpc("tasks.update", {"task_id": "solo", "status": "cancelled"})
        await asyncio.wait_for(seen.wait(), EVENT_WAIT)
        assert updated[-1] == solo
        assert json.loads((await client.read_resource(solo)).contents[0].text)["status"] == "cancelled"


async def test_a_waiting_prompt_is_a_resource_update_and_tasks_respond_answers_it(tmp_path: Path) -> None:
    svc = Service(tmp_path, _env(tmp_path, SERVICE_CREATE_WAIT_TIMEOUT="0")).start()
    try:
        await _answer_a_wait_over_mcp(svc)
    finally:
        svc.stop()


async def _answer_a_wait_over_mcp(service: Service) -> None:
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
    await service.rpc("tasks.create", {"tasks": [
        {"id": "m", "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": "m-approve"}]},
        # the approval starts only once the test has subscribed: m-prep waits for the test's event
        {"id": "m-prep", "name": "prepare", "parent_id": "m", "schemas": {"method": "event_wait_executor"},
         "inputs": {"event": "m-go"}},
        {"id": "m-approve", "name": "approve", "parent_id": "m", "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Approve the refund?", "schema": schema}, "dependencies": [{"id": "m-prep"}]}]})
    updates = asyncio.Queue[str]()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updates.put_nowait(str(root.params.uri))

    uri = "taskgrove://tasks/m-approve"
    async with session(service.url, message_handler=on_message) as client:
        assert json.loads((await client.read_resource(uri)).contents[0].text)["waiting"] is None
        await client.subscribe_resource(uri)
        await service.rpc("events.emit", {"name": "m-go"})
        for _ in range(10):  # its start, then its park: a notice each (or one for both)
            assert await asyncio.wait_for(updates.get(), 10) == uri
            task = json.loads((await client.read_resource(uri)).contents[0].text)
            if task["waiting"]:
                break
        assert task["status"] == "in_progress"
        assert task["waiting"]["kind"] == "input" and task["waiting"]["prompt"] == "Approve the refund?"
        assert task["waiting"]["schema"] == schema
        listed = _value(await client.call_tool("tasks_list", {"waiting": True}))
        assert [t["id"] for t in listed] == ["m-approve"]

        # The errors of tasks.respond, as JSON-RPC answers them.
        for arguments in ({"task_id": "m-approve", "value": {"approved": "yes"}}, {"task_id": "m-approve"},
                          {"task_id": "m-prep", "value": 1}):
            refused = await client.call_tool("tasks_respond", arguments)
            rpc = await service.call("tasks.respond", arguments)
            assert refused.is_error and _value(refused)["error"] == rpc["error"], arguments
            assert rpc["error"]["code"] == -32602
        answered = await client.call_tool("tasks_respond", {"task_id": "m-approve", "value": {"approved": True}})
        assert not answered.is_error, answered
        assert _value(answered)["status"] == "resumed"
        await service.wait_status("m", ("completed",))
        assert _value(await client.call_tool("tasks_get", {"task_id": "m-approve"}))["result"] == {"approved": True}

        # events_emit resumes the waits for that event.
        await service.rpc("tasks.create", {"tasks": [{"id": "ev", "name": "ev", "schemas": {
            "method": "event_wait_executor"}, "inputs": {"event": "deployed", "match": {"service": "api"}}}]})
        for _ in range(500):
            if (await service.rpc("tasks.get", {"task_id": "ev"}))["waiting"]:
                break
            await asyncio.sleep(0.02)
        emitted = _value(await client.call_tool("events_emit", {"name": "deployed", "payload": {"service": "api"}}))
        assert emitted["resumed"] == 1 and emitted["task_ids"] == ["ev"]
        assert (await service.wait_status("ev", ("completed",)))["result"] == {"service": "api"}
        no_name = await client.call_tool("events_emit", {"payload": {}})
        assert no_name.is_error and _value(no_name)["error"]["code"] == -32602


async def test_stdio_proxy_lists_tools_and_calls_one(jwt_service: Service) -> None:
    params = StdioServerParameters(command=str(BIN), args=["mcp", "--url", jwt_service.url,
                                                           "--token", _token("carol")])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        assert tools["tasks_get"].input_schema["required"] == ["task_id"]
        created = await client.call_tool("tasks_create", {"tasks": SMALL_TREE})
        assert not created.is_error, created
        tree = _value(created)
        assert tree["user_id"] == "carol"
        assert set(_statuses(tree).values()) == {"completed"}
        missing = await client.call_tool("tasks_tree", {"task_id": "nope"})
        assert missing.is_error and _value(missing)["error"]["data"] == "Task 'nope' not found"
        tree_uri = "taskgrove://trees/root"
        assert json.loads((await client.read_resource(tree_uri)).contents[0].text)["id"] == "root"
        # Progress notifications of the service reach the stdio client.
        copy = _value(await client.call_tool("tasks_copy", {"task_id": "root"}))
        notes: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(progress)

        ran = await client.call_tool("tasks_execute", {"task_id": copy["id"]}, progress_callback=on_progress)
        assert not ran.is_error, ran
        assert set(_statuses(_value(ran)["tree"]).values()) == {"completed"}
        assert notes and notes[-1] == 1.0
