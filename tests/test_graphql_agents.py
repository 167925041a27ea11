"""GraphQL for the directory of agents (issue 45): the `agents` and `agent` queries and the
addAgent, refreshAgent, removeAgent mutations against a real uvicorn server, with the rules and
answers of `agents.*` on /tasks; and an agent's question (a wait of kind agent_input) shown on a
task's `waiting.agent` and answered with respondToTask.

The agent is a second `taskgrove serve` (tests/processes.py), as in tests/test_agent_directory.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskgrove.agent.foundations.auth import mint_token
from tests.test_graphql import data, error, live  # noqa: F401  (live: the fixture)
from tests.test_waits import APPROVAL_SCHEMA
from tests.processes import Service
from tests.test_ws import SECRET

pytestmark = pytest.mark.xdist_group("test_graphql_agents")

SECRET_KEY = "graphql-agents-test-secret-of-forty-bytes!"
AGENT = """agentId name cardUrl shared userId tags cardName description version protocolVersion
           skills { id name description tags examples inputModes outputModes } interfaces fetchedAt refreshError
           changed hasCredentials concurrency concurrencyKey breaker breakerUntil createdAt updatedAt
           health { state calls successes failures consecutiveFailures p50Ms p95Ms lastError lastCallAt
                    lastSuccessAt recent { at ok ms error } }"""
ADD = f"mutation($input: AddAgentInput) {{ addAgent(agentInput: $input) {{ {AGENT} }} }}"
GET = f"query($name: String) {{ agent(name: $name) {{ {AGENT} }} }}"
LIST = """query($skill: String, $tag: String, $health: AgentHealthEnum, $limit: Int, $cursor: String) {
    agents(skill: $skill, tag: $tag, health: $health, limit: $limit, cursor: $cursor) {
        agents { name tags health { state } } nextCursor } }"""
REFRESH = f"mutation($name: String, $accept: Boolean) {{ refreshAgent(name: $name, accept: $accept) {{ {AGENT} }} }}"
REMOVE = "mutation($name: String) { removeAgent(name: $name) }"


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("remote")
    service = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}"}, "remote").start()
    try:
        yield service
    finally:
        service.stop()


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


async def test_the_directory_through_graphql_answers_as_agents_methods_do(live: Callable[..., Any], remote: Service) -> None:
    async with live({"SERVICE_SECRET_KEY": SECRET_KEY}) as server:
        added = (await data(server, ADD, {"input": {"cardUrl": remote.url, "tags": ["self", "tests"],
                                                    "headers": {"X-Api-Key": "very-secret-value"}}}))["addAgent"]
        assert added["name"] == "taskgrove" and added["hasCredentials"] is True and added["shared"] is False
        assert "tasks.execute" in {s["id"] for s in added["skills"]} and added["interfaces"]
        assert added["health"]["state"] == "UNKNOWN" and added["health"]["recent"] == []
        assert added["concurrencyKey"] == "agent:taskgrove" and added["breaker"] == "closed"
        second = (await data(server, ADD, {"input": {"cardUrl": f"{remote.url}/.well-known/agent-card.json",
                                                     "name": "second", "credential": "token-123"}}))["addAgent"]
        assert second["name"] == "second" and second["hasCredentials"] is True

        # the same answer as agents.get, field by field
        got = (await data(server, GET, {"name": "taskgrove"}))["agent"]
        wire = await server.rpc("agents.get", {"name": "taskgrove"})
        for key in ("agent_id", "name", "card_url", "tags", "card_name", "version", "concurrency", "has_credentials"):
            assert got[camel(key)] == wire[key], key
        assert [s["id"] for s in got["skills"]] == [s["id"] for s in wire["skills"]]
        assert got["interfaces"] == wire["interfaces"]
        assert (await data(server, GET, {"name": "nobody"}))["agent"] is None

        # filters and cursor paging, as agents.list
        page = (await data(server, LIST, {"skill": "workflow"}))["agents"]
        assert [a["name"] for a in page["agents"]] == ["taskgrove", "second"] and page["nextCursor"] is None
        assert [a["name"] for a in (await data(server, LIST, {"tag": "self"}))["agents"]["agents"]] == ["taskgrove"]
        assert (await data(server, LIST, {"skill": "no-such-skill"}))["agents"]["agents"] == []
        unknown = (await data(server, LIST, {"health": "UNKNOWN"}))["agents"]["agents"]
        assert {a["health"]["state"] for a in unknown} == {"UNKNOWN"} and len(unknown) == 2
        assert (await data(server, LIST, {"health": "OPEN"}))["agents"]["agents"] == []
        first = (await data(server, LIST, {"limit": 1}))["agents"]
        assert [a["name"] for a in first["agents"]] == ["taskgrove"] and first["nextCursor"]
        rest = (await data(server, LIST, {"limit": 1, "cursor": first["nextCursor"]}))["agents"]
        assert [a["name"] for a in rest["agents"]] == ["second"] and rest["nextCursor"] is None

        refreshed = (await data(server, REFRESH, {"name": "taskgrove"}))["refreshAgent"]
        assert refreshed["fetchedAt"] >= added["fetchedAt"] and refreshed["changed"] is None

        # the credentials never come back, and no field could hold them
        assert not any(secret in json.dumps([added, second, got, refreshed])
                       for secret in ("very-secret-value", "token-123"))
        fields = (await data(server, '{ __type(name: "AgentType") { fields { name } } }'))["__type"]["fields"]
        assert {"credentials", "headers", "credential"}.isdisjoint(f["name"] for f in fields)

        # the errors of agents.*, with their codes
        taken = await error(server, ADD, {"input": {"cardUrl": remote.url}})
        assert taken["extensions"]["code"] == -32602 and "taskgrove" in taken["message"]
        bad_url = await error(server, ADD, {"input": {"cardUrl": "http://127.0.0.1:9/nothing-here"}})
        assert bad_url["extensions"]["code"] == -32602 and "card_url" in bad_url["message"]
        bad_name = await error(server, ADD, {"input": {"cardUrl": remote.url, "name": "no spaces"}})
        assert bad_name["extensions"]["code"] == -32602 and "name must be a directory name" in bad_name["message"]
        no_input = await error(server, "mutation { addAgent { name } }")
        assert no_input["message"] == "agentInput is required"
        no_name = await error(server, "mutation { removeAgent }")
        assert no_name["extensions"]["code"] == -32602 and "name" in no_name["message"]
        missing = await error(server, REFRESH, {"name": "nobody"})
        assert missing["extensions"]["code"] == -32602 and "no agent 'nobody'" in missing["message"]
        too_many = await error(server, LIST, {"limit": 501})
        assert too_many["extensions"]["code"] == -32602 and "limit" in too_many["message"]

        assert (await data(server, REMOVE, {"name": "second"}))["removeAgent"] is True
        assert (await data(server, GET, {"name": "second"}))["agent"] is None
        assert (await server.rpc("agents.list", {}))["agents"][0]["name"] == "taskgrove"


async def test_own_agents_plus_shared_ones_and_only_admins_change_shared(live: Callable[..., Any], remote: Service) -> None:
    async with live({"SERVICE_JWT_SECRET": SECRET}) as server:
        settings = server.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}
        admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'])}"}
        url = remote.url

        refused = await error(server, ADD, {"input": {"cardUrl": url, "shared": True}}, headers=alice)
        assert refused["extensions"] == {"code": -32001, "codeName": "PERMISSION_DENIED"}
        mine = (await data(server, ADD, {"input": {"cardUrl": url, "name": "alices"}}, headers=alice))["addAgent"]
        assert mine["userId"] == "alice" and mine["shared"] is False
        everyones = (await data(server, ADD, {"input": {"cardUrl": url, "name": "everyones", "shared": True}},
                                headers=admin))["addAgent"]
        assert everyones["shared"] is True and everyones["userId"] is None

        assert [a["name"] for a in (await data(server, LIST, headers=bob))["agents"]["agents"]] == ["everyones"]
        seen = (await data(server, LIST, headers=alice))["agents"]["agents"]
        assert sorted(a["name"] for a in seen) == ["alices", "everyones"]
        assert (await error(server, GET, {"name": "alices"}, headers=bob))["extensions"]["code"] == -32001
        assert (await error(server, REMOVE, {"name": "everyones"}, headers=alice))["extensions"]["code"] == -32001
        assert (await error(server, REFRESH, {"name": "everyones"}, headers=alice))["extensions"]["code"] == -32001
        assert (await error(server, REMOVE, {"name": "alices"}, headers=bob))["extensions"]["code"] == -32001
        assert (await data(server, GET, {"name": "everyones"}, headers=bob))["agent"]["name"] == "everyones"
        assert (await data(server, REMOVE, {"name": "alices"}, headers=alice))["removeAgent"] is True
        assert (await data(server, REMOVE, {"name": "everyones"}, headers=admin))["removeAgent"] is True
        response = await server.http.post("/graphql", json={"query": "{ agents { nextCursor } }"})
        assert response.status_code == 401  # no token: as every GraphQL request


WAITING = ("waiting { kind prompt schema since deadline "
           "agent { name url remoteTaskId remoteContextId state askedBy } }")
RESPOND = "mutation($id: String, $value: JSON) { respondToTask(taskId: $id, value: $value) { id waiting { kind } } }"


async def test_an_agents_question_shows_its_agent_and_is_answered(live: Callable[..., Any], remote: Service) -> None:
    async with live() as server:
        await data(server, ADD, {"input": {"cardUrl": remote.url, "name": "payments"}})
        suffix = uuid.uuid4().hex[:8]
        ask, approve = f"ask-{suffix}", f"approve-{suffix}"
        remote_tree = [
            {"id": f"refund-{suffix}", "name": "refund", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": approve, "required": True}]},
            {"id": approve, "name": "approve", "parent_id": f"refund-{suffix}",
             "schemas": {"method": "human_input_executor"},
             "inputs": {"prompt": "Approve the refund?", "schema": APPROVAL_SCHEMA}}]
        await server.rpc("tasks.create", {"tasks": [
            {"id": ask, "name": "ask payments", "schemas": {"method": "a2a_agent_executor"},
             "inputs": {"agent": "payments", "streaming": False, "poll_interval": 0.1,
                        "data": {"tasks": remote_tree}}}]})
        query = f'query($id: String) {{ task(taskId: $id) {{ status error {WAITING} }} }}'
        deadline = asyncio.get_running_loop().time() + 60
        while not ((task := (await data(server, query, {"id": ask}))["task"])["waiting"] or {}).get("kind") == "agent_input":
            assert task["status"] != "FAILED", task
            assert asyncio.get_running_loop().time() < deadline, f"{ask} never asked: {task}"
            await asyncio.sleep(0.1)
        wait = task["waiting"]
        assert task["status"] == "IN_PROGRESS" and wait["prompt"] == "Approve the refund?"
        assert wait["schema"] == APPROVAL_SCHEMA
        agent = wait["agent"]
        assert agent["name"] == "payments" and agent["state"] == "input-required" and agent["remoteTaskId"]
        assert agent["url"].startswith(remote.url)
        metrics = (await server.http.get("/metrics")).text  # an agent's question is a kind of its own
        assert 'taskgrove_parked_tasks{kind="agent_input"} 1.0' in metrics

        answered = (await data(server, RESPOND, {"id": ask, "value": {"approved": True}}))["respondToTask"]
        assert answered["waiting"] is None
        done = await server.wait_status(ask, ("completed", "failed"), timeout=60)
        assert done["status"] == "completed", done
        assert done["result"]["delegated"]["agent"] == "payments"
