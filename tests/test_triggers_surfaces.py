"""Triggers on the other surfaces (docs/triggers.md, "On every surface"): the MCP tools against a real
`taskgrove serve` through the official client, GraphQL through the ASGI app. Each calls the same
TriggerService as JSON-RPC, so the same answers and the same refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskgrove.agent.foundations.settings import Settings
from tests.conftest import running_app
from tests.processes import Service
from tests.test_mcp import _value, session
from tests.test_triggers import until


@pytest.fixture
def service(tmp_path: Path) -> Any:
    svc = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}"}).start()
    yield svc
    svc.stop()


async def test_the_trigger_tools_call_the_trigger_methods(service: Service) -> None:
    await service.rpc("tasks.create", [{"id": "tpl", "name": "t", "schemas": {"method": "noop_executor"}}])
    async with session(service.url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["triggers_create"].input_schema["required"] == ["task_id", "event"]
        created = await client.call_tool("triggers_create", {"task_id": "tpl", "event": "deploy", "key": "service",
                                                             "batch": {"size": 2, "seconds": 600}})
        assert not created.is_error, created
        trigger = _value(created)
        assert trigger["batch"] == {"size": 2, "seconds": 600.0}
        for n in range(2):
            await client.call_tool("events_emit", {"name": "deploy", "payload": {"service": "api", "n": n}})
        runs = await until(lambda: _runs(client, trigger["id"]), "the batch's run")
        assert runs[0]["key"] == "api" and runs[0]["events"] == 2
        listed = _value(await client.call_tool("triggers_list", {}))
        assert [t["id"] for t in listed] == [trigger["id"]]
        updated = _value(await client.call_tool("triggers_update", {"trigger_id": trigger["id"], "enabled": False}))
        assert updated["enabled"] is False
        bad = await client.call_tool("triggers_create", {"task_id": "tpl", "event": "e", "singleton": "always"})
        rpc = await service.call("triggers.create", {"task_id": "tpl", "event": "e", "singleton": "always"})
        assert bad.is_error and _value(bad)["error"] == rpc["error"] and rpc["error"]["code"] == -32602
        assert _value(await client.call_tool("triggers_delete", {"trigger_id": trigger["id"]}))["success"] is True
        assert _value(await client.call_tool("triggers_get", {"trigger_id": trigger["id"]})) is None


async def _runs(client: Any, trigger_id: str) -> list[dict[str, Any]]:
    return _value(await client.call_tool("triggers_runs", {"trigger_id": trigger_id}))


async def test_graphql_creates_reads_updates_and_deletes_triggers(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings({"SERVICE_API_PROTOCOL": "graphql"})) as client:
        async def gql(query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
            response = await client.http.post("/graphql", json={"query": query, "variables": variables or {}})
            assert response.status_code == 200, response.text
            return response.json()

        await client.result("tasks.create", [{"id": "tpl", "name": "t", "schemas": {"method": "noop_executor"}}])
        made = await gql('mutation { createTrigger(taskId: "tpl", event: "msg", key: "room", '
                         'debounce: {seconds: 0.2}) }')
        trigger = made["data"]["createTrigger"]
        assert trigger["debounce"] == {"seconds": 0.2, "max_wait_seconds": None} and trigger["key"] == "room"
        await gql('mutation { emitEvent(name: "msg", payload: {room: "r", n: 1}) }')
        runs = await until(lambda: _gql_runs(gql, trigger["id"]), "the debounced run")
        assert runs[0]["key"] == "r"
        found = await gql("query ($id: String) { trigger(triggerId: $id) triggers(event: \"msg\") }",
                          {"id": trigger["id"]})
        assert found["data"]["trigger"]["runs"] == 1 and [t["id"] for t in found["data"]["triggers"]] == [trigger["id"]]
        changed = await gql("mutation ($id: String) { updateTrigger(triggerId: $id, debounce: null, "
                            "singleton: \"skip\") }", {"id": trigger["id"]})
        assert changed["data"]["updateTrigger"]["debounce"] is None
        assert changed["data"]["updateTrigger"]["singleton"] == "skip" and changed["data"]["updateTrigger"]["key"] == "room"
        refused = await gql('mutation { createTrigger(taskId: "tpl", event: "e", batch: {size: 0}) }')
        assert refused["errors"][0]["extensions"]["code"] == -32602
        assert "batch.size" in refused["errors"][0]["message"]
        gone = await gql("mutation ($id: String) { deleteTrigger(triggerId: $id) }", {"id": trigger["id"]})
        assert gone["data"]["deleteTrigger"] is True


async def _gql_runs(gql: Any, trigger_id: str) -> list[dict[str, Any]] | None:
    answer = await gql("query ($id: String) { triggerRuns(triggerId: $id) }", {"id": trigger_id})
    return answer["data"]["triggerRuns"] or None
