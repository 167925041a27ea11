"""GraphQL /graphql against a real uvicorn server: httpx for queries and mutations, the
`websockets` library speaking graphql-transport-ws for the subscription."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import EVENT_WAIT
from tests.test_waits import APPROVAL_SCHEMA, approval_tree
from tests.test_ws import SECRET, Live, gate, live_server, recv, send, sleep

GRAPHQL = {"SERVICE_API_PROTOCOL": "graphql"}
TASK_FIELDS = "id name status priority progress result error createdAt updatedAt parentId description"


@pytest.fixture
def live(make_settings: Callable[..., Any]) -> Callable[..., Any]:
    """A server with the GraphQL surface on, on every storage backend."""

    def start(env: dict[str, str] | None = None) -> Any:
        return live_server(make_settings({**GRAPHQL, "SERVICE_CREATE_WAIT_TIMEOUT": "0", **(env or {})}))

    return start


@pytest.fixture
def live_sqlite(tmp_path: Any) -> Callable[..., Any]:
    """The same on SQLite only, for tests of the surface itself (schema, switches)."""

    def start(env: dict[str, str] | None = None) -> Any:
        return live_server(Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'live.db'}",
                                              **GRAPHQL, "SERVICE_CREATE_WAIT_TIMEOUT": "0", **(env or {})}))

    return start


async def gql(server: Live, query: str, variables: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await server.http.post("/graphql", json={"query": query, "variables": variables or {}},
                                      headers=headers or {})
    assert response.status_code == 200, response.text
    return response.json()


async def data(server: Live, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    answer = await gql(server, query, variables, **kw)
    assert "errors" not in answer, answer
    return answer["data"]


async def error(server: Live, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    answer = await gql(server, query, variables, **kw)
    assert answer.get("errors"), answer
    return answer["errors"][0]


CREATE = f"""mutation($input: CreateTaskInput) {{ createTask(taskInput: $input) {{ {TASK_FIELDS} }} }}"""
GET = f"""query($id: String) {{ task(taskId: $id) {{ {TASK_FIELDS} children {{ id name }} }} }}"""


async def wait_graphql_status(server: Live, task_id: str, status: str) -> dict[str, Any]:
    """Poll the task query (only for tests that are not about the subscription)."""
    task = await server.wait_status(task_id, (status.lower(),))
    assert task["status"] == status.lower()
    return (await data(server, GET, {"id": task_id}))["task"]


# --- schema -----------------------------------------------------------------------------------


async def test_introspection_shows_the_spec_types(live_sqlite: Callable[..., Any]) -> None:
    ref = "kind name ofType { kind name ofType { kind name ofType { kind name } } }"
    query = f"""{{ __schema {{
        queryType {{ name }} mutationType {{ name }} subscriptionType {{ name }}
        types {{ name kind enumValues {{ name }}
                fields {{ name args {{ name type {{ {ref} }} }} type {{ {ref} }} }}
                inputFields {{ name type {{ {ref} }} }} }} }} }}"""
    async with live_sqlite() as server:
        schema = (await data(server, query))["__schema"]
    types = {t["name"]: t for t in schema["types"]}

    def shape(t: dict[str, Any]) -> str:
        if t["kind"] == "NON_NULL":
            return shape(t["ofType"]) + "!"
        if t["kind"] == "LIST":
            return "[" + shape(t["ofType"]) + "]"
        return t["name"]

    task_type = {f["name"]: shape(f["type"]) for f in types["TaskType"]["fields"]}
    assert task_type == {
        "id": "String!", "name": "String!", "status": "TaskStatusEnum!", "priority": "Int!",
        "progress": "Float!", "result": "String", "error": "String", "createdAt": "DateTime",
        "updatedAt": "DateTime", "parentId": "String", "description": "String", "children": "[TaskType!]",
        "waiting": "WaitingType",
    }
    assert {f["name"]: shape(f["type"]) for f in types["WaitingType"]["fields"]} == {
        "kind": "String!", "prompt": "String", "schema": "JSON", "since": "DateTime", "deadline": "DateTime",
        "event": "String", "match": "JSON", "agent": "WaitingAgentType"}
    assert [v["name"] for v in types["TaskStatusEnum"]["enumValues"]] == [
        "PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED"]
    assert {f["name"]: shape(f["type"]) for f in types["CreateTaskInput"]["inputFields"]} == {
        "name": "String!", "description": "String", "executor": "String", "priority": "Int",
        "inputs": "JSON", "parentId": "String"}
    assert {f["name"]: shape(f["type"]) for f in types["UpdateTaskInput"]["inputFields"]} == {
        "name": "String", "description": "String", "status": "TaskStatusEnum", "inputs": "JSON"}

    def operations(type_name: str) -> dict[str, tuple[dict[str, str], str]]:
        # the triggers' fields (graphql/trigger_fields.py) are tests/test_triggers_surfaces.py's
        return {f["name"]: ({a["name"]: shape(a["type"]) for a in f["args"]}, shape(f["type"]))
                for f in types[type_name]["fields"] if "rigger" not in f["name"]}

    assert (schema["queryType"]["name"], schema["mutationType"]["name"],
            schema["subscriptionType"]["name"]) == ("Query", "Mutation", "Subscription")
    assert operations("Query") == {
        "task": ({"taskId": "String"}, "TaskType"),
        "tasks": ({"status": "TaskStatusEnum", "limit": "Int", "offset": "Int"}, "[TaskType]"),
        "taskChildren": ({"parentId": "String"}, "[TaskType]"),
        "agents": ({"skill": "String", "tag": "String", "health": "AgentHealthEnum", "limit": "Int",
                    "cursor": "String"}, "AgentPage"),  # the directory of agents (tests/test_graphql_agents.py)
        "agent": ({"name": "String", "agentId": "String"}, "AgentType"),
    }
    assert operations("Mutation") == {
        "createTask": ({"taskInput": "CreateTaskInput"}, "TaskType"),
        "updateTask": ({"taskId": "String", "taskInput": "UpdateTaskInput"}, "TaskType"),
        "cancelTask": ({"taskId": "String"}, "Boolean"),
        "deleteTask": ({"taskId": "String"}, "Boolean"),
        "respondToTask": ({"taskId": "String", "value": "JSON"}, "TaskType"),
        "emitEvent": ({"name": "String", "payload": "JSON", "userId": "String"}, "Int"),
        "purgeTasks": ({"olderThan": "String"}, "PurgeResult"),
        "addAgent": ({"agentInput": "AddAgentInput"}, "AgentType"),
        "refreshAgent": ({"name": "String", "accept": "Boolean"}, "AgentType"),
        "removeAgent": ({"name": "String"}, "Boolean"),
    }
    assert operations("Subscription") == {"taskStatusChanged": ({"taskId": "String"}, "TaskType")}


# --- queries and mutations --------------------------------------------------------------------


async def test_create_executes_and_every_query_reads_it(live: Callable[..., Any]) -> None:
    async with live() as server:
        created = (await data(server, CREATE, {"input": {
            "name": "parent", "description": "the root", "executor": "noop_executor", "priority": 0,
            "inputs": {"n": 1, "tags": ["a"]}}}))["createTask"]
        assert created["name"] == "parent" and created["priority"] == 0 and created["description"] == "the root"
        assert created["parentId"] is None and created["createdAt"]
        assert created["status"] in ("PENDING", "IN_PROGRESS", "COMPLETED")  # returned at once
        parent = await wait_graphql_status(server, created["id"], "COMPLETED")
        assert json.loads(parent["result"]) == {"ok": True, "inputs": {"n": 1, "tags": ["a"]}}
        assert parent["progress"] == 1.0 and parent["error"] is None and parent["children"] == []

        # createTask under an existing task: added to its tree and executed
        child = (await data(server, CREATE, {"input": {"name": "child", "executor": "noop_executor",
                                                       "parentId": created["id"]}}))["createTask"]
        assert child["parentId"] == created["id"] and child["priority"] == 1  # the tasks.create default
        await wait_graphql_status(server, child["id"], "COMPLETED")
        tree = await server.rpc("tasks.tree", {"task_id": child["id"]})
        assert tree["id"] == created["id"] and [c["id"] for c in tree["children"]] == [child["id"]]

        got = (await data(server, GET, {"id": created["id"]}))["task"]
        assert got["children"] == [{"id": child["id"], "name": "child"}]
        children = (await data(server, 'query($p: String) { taskChildren(parentId: $p) { id parentId } }',
                               {"p": created["id"]}))["taskChildren"]
        assert children == [{"id": child["id"], "parentId": created["id"]}]
        assert (await data(server, GET, {"id": "missing"}))["task"] is None

        # tasks: newest first, limit/offset, status filter
        third = (await data(server, CREATE, {"input": {"name": "third"}}))["createTask"]
        await wait_graphql_status(server, third["id"], "COMPLETED")
        listed = (await data(server, "{ tasks { id } }"))["tasks"]
        assert [t["id"] for t in listed] == [third["id"], child["id"], created["id"]]
        page = (await data(server, "{ tasks(limit: 1, offset: 1) { id } }"))["tasks"]
        assert [t["id"] for t in page] == [child["id"]]
        assert (await data(server, "{ tasks(status: FAILED) { id } }"))["tasks"] == []
        done = (await data(server, "{ tasks(status: COMPLETED, limit: 10) { id status } }"))["tasks"]
        assert {t["status"] for t in done} == {"COMPLETED"} and len(done) == 3


async def test_update_delete_and_cancel(live: Callable[..., Any]) -> None:
    update = f"""mutation($id: String, $input: UpdateTaskInput) {{
        updateTask(taskId: $id, taskInput: $input) {{ {TASK_FIELDS} }} }}"""
    async with live() as server:
        task = (await data(server, CREATE, {"input": {"name": "t", "executor": "noop_executor"}}))["createTask"]
        await wait_graphql_status(server, task["id"], "COMPLETED")
        updated = (await data(server, update, {"id": task["id"], "input": {
            "name": "renamed", "description": "now described", "inputs": {"k": "v"}, "status": "PENDING"}}))["updateTask"]
        assert (updated["name"], updated["description"], updated["status"]) == ("renamed", "now described", "PENDING")
        stored = await server.rpc("tasks.get", {"task_id": task["id"]})
        assert stored["inputs"] == {"k": "v"} and stored["status"] == "pending"

        # same rules as tasks.update: all problems in one message
        bad = await error(server, update, {"id": task["id"], "input": {"name": "", "inputs": None}})
        assert bad["extensions"]["code"] == -32602 and bad["message"].startswith("Update failed:")
        assert "'name'" in bad["message"] and "'inputs'" in bad["message"]
        missing = await error(server, update, {"id": "nope", "input": {"name": "x"}})
        assert missing["message"] == "Task 'nope' not found" and missing["extensions"]["code"] == -32602

        delete = 'mutation($id: String) { deleteTask(taskId: $id) }'
        assert (await data(server, delete, {"id": task["id"]}))["deleteTask"] is True
        assert await server.rpc("tasks.get", {"task_id": task["id"]}) is None

        done = (await data(server, CREATE, {"input": {"name": "done"}}))["createTask"]
        await wait_graphql_status(server, done["id"], "COMPLETED")
        blocked = await error(server, delete, {"id": done["id"]})
        assert blocked["extensions"] == {"code": -32602, "codeName": "INVALID_PARAMS"}
        assert "Cannot delete task" in blocked["message"]

        cancel = 'mutation($id: String) { cancelTask(taskId: $id) }'
        slow = (await data(server, CREATE, {"input": {"name": "slow", "executor": "sleep_executor",
                                                      "inputs": {"seconds": 30}}}))["createTask"]
        await server.wait_status(slow["id"], ("in_progress",))
        assert (await data(server, cancel, {"id": slow["id"]}))["cancelTask"] is True
        assert (await data(server, GET, {"id": slow["id"]}))["task"]["status"] == "CANCELLED"
        assert (await data(server, cancel, {"id": slow["id"]}))["cancelTask"] is False  # already finished
        gone = await error(server, cancel, {"id": "nope"})
        assert gone["extensions"]["code"] == -32602 and "not found" in gone["message"]


async def test_errors_carry_json_rpc_codes(live_sqlite: Callable[..., Any]) -> None:
    async with live_sqlite() as server:
        unknown = await error(server, CREATE, {"input": {"name": "x", "executor": "no_such_executor"}})
        assert unknown["extensions"]["code"] == -32602 and "no_such_executor" in unknown["message"]
        assert unknown["path"] == ["createTask"]
        no_id = await error(server, "{ task { id } }")
        assert no_id["message"] == "taskId is required" and no_id["extensions"]["code"] == -32602
        no_input = await error(server, "mutation { createTask { id } }")
        assert no_input["message"] == "taskInput is required"
        priority = await error(server, CREATE, {"input": {"name": "x", "priority": 9}})
        assert priority["extensions"]["code"] == -32602 and "priority" in priority["message"]
        limit = await error(server, "{ tasks(limit: 0) { id } }")
        assert limit["extensions"]["code"] == -32602 and "limit" in limit["message"]
        syntax = await error(server, "{ task(taskId: ")
        assert syntax["extensions"]["code"] == -32600
        field = await error(server, "{ task(taskId: \"x\") { nope } }")
        assert field["extensions"]["code"] == -32600 and "nope" in field["message"]
        # An unknown fragment is the client's mistake, with its place (was "Internal error").
        fragment = await error(server, "query { tasks { ...F } }")
        assert fragment["extensions"]["code"] == -32600 and fragment["message"] == "Unknown fragment 'F'."
        assert fragment["locations"] == [{"line": 1, "column": 20}]  # at the name F
        empty = await error(server, "mutation { }")
        assert empty["extensions"]["code"] == -32600 and "Syntax Error" in empty["message"], empty
        assert empty["locations"] == [{"line": 1, "column": 10}]  # the opening brace
        # the X-LLM-API-KEY header is read as on /tasks; a malformed one is refused up front
        response = await server.http.post("/graphql", json={"query": "{ tasks { id } }"},
                                          headers={"X-LLM-API-KEY": "openai:"})
        assert response.status_code == 400
        assert response.json()["errors"][0]["extensions"]["code"] == -32602


async def test_permissions_and_authentication(live: Callable[..., Any]) -> None:
    async with live({"SERVICE_JWT_SECRET": SECRET}) as server:
        settings = server.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}
        admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'])}"}

        response = await server.http.post("/graphql", json={"query": "{ tasks { id } }"})
        assert response.status_code == 401
        body = response.json()
        assert body["data"] is None and body["errors"][0]["extensions"]["code"] == -32001
        response = await server.http.post("/graphql", json={"query": "{ tasks { id } }"},
                                          headers={"Authorization": "Bearer forged"})
        assert response.status_code == 401

        task = (await data(server, CREATE, {"input": {"name": "hers"}}, headers=alice))["createTask"]
        await server.wait_status(task["id"], ("completed",), alice)
        denied = await error(server, GET, {"id": task["id"]}, headers=bob)
        assert denied["extensions"] == {"code": -32001, "codeName": "PERMISSION_DENIED"}
        assert (await data(server, "{ tasks { id } }", headers=bob))["tasks"] == []
        assert [t["id"] for t in (await data(server, "{ tasks { id } }", headers=alice))["tasks"]] == [task["id"]]
        under = await error(server, CREATE, {"input": {"name": "intruder", "parentId": task["id"]}}, headers=bob)
        assert under["extensions"]["code"] == -32001
        # an admin may add under anyone's task; the new task belongs to the tree's owner
        child = (await data(server, CREATE, {"input": {"name": "helper", "parentId": task["id"]}},
                            headers=admin))["createTask"]
        assert (await server.rpc("tasks.get", {"task_id": child["id"]}, admin))["user_id"] == "alice"

        # the subscription handshake takes the same token
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(f"ws://127.0.0.1:{server.port}/graphql",
                                          subprotocols=["graphql-transport-ws"]):
                pass
        assert refused.value.response.status_code == 401
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/graphql", subprotocols=["graphql-transport-ws"],
                                      additional_headers=bob) as ws:
            await send(ws, {"type": "connection_init", "payload": {}})
            assert (await recv(ws))["type"] == "connection_ack"
            await send(ws, {"id": "1", "type": "subscribe", "payload": {
                "query": SUBSCRIBE, "variables": {"id": task["id"]}}})
            answer = await recv(ws)
            assert answer["payload"]["errors"][0]["extensions"]["code"] == -32001


# --- durable waits (docs/waits.md) -----------------------------------------------------------

WAITING = "waiting { kind prompt schema since deadline event match }"
RESPOND = f"mutation($id: String, $value: JSON) {{ respondToTask(taskId: $id, value: $value) {{ id status {WAITING} }} }}"
EMIT = "mutation($name: String, $payload: JSON) { emitEvent(name: $name, payload: $payload) }"


async def parked(server: Live, task_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll tasks.get until the task waits (it parks just after it starts)."""
    deadline = asyncio.get_running_loop().time() + EVENT_WAIT
    while not (task := await server.rpc("tasks.get", {"task_id": task_id}, headers)).get("waiting"):
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} never waited: {task}"
        await asyncio.sleep(0.02)
    return task


async def test_respond_to_task_and_emit_event(live: Callable[..., Any]) -> None:
    async with live() as server:
        await server.rpc("tasks.create", {"tasks": approval_tree("g")})
        await parked(server, "g-approve")
        task = (await data(server, f'query($id: String) {{ task(taskId: $id) {{ status {WAITING} }} }}',
                           {"id": "g-approve"}))["task"]
        wait = task["waiting"]
        assert task["status"] == "IN_PROGRESS" and wait["kind"] == "input"
        assert wait["prompt"] == "Approve the refund?" and wait["schema"] == APPROVAL_SCHEMA
        assert wait["since"] and wait["deadline"] is None and wait["event"] is None
        listed = (await data(server, f"{{ tasks {{ id {WAITING} }} }}"))["tasks"]
        assert [t["id"] for t in listed if t["waiting"]] == ["g-approve"]

        # the errors of tasks.respond, with their codes
        bad = await error(server, RESPOND, {"id": "g-approve", "value": {"approved": "yes"}})
        assert bad["extensions"]["code"] == -32602 and "approved" in bad["message"], bad
        no_value = await error(server, RESPOND, {"id": "g-approve"})
        assert no_value["extensions"]["code"] == -32602 and "value is required" in no_value["message"]
        no_id = await error(server, RESPOND, {"value": 1})
        assert no_id["message"] == "taskId is required"
        missing = await error(server, RESPOND, {"id": "nope", "value": 1})
        assert missing["extensions"]["code"] == -32602 and "not found" in missing["message"]
        not_waiting = await error(server, RESPOND, {"id": "g-prep", "value": 1})
        assert not_waiting["message"] == "task g-prep is not waiting for input"

        answered = (await data(server, RESPOND, {"id": "g-approve", "value": {"approved": True}}))["respondToTask"]
        assert answered["id"] == "g-approve" and answered["waiting"] is None
        assert answered["status"] in ("PENDING", "IN_PROGRESS", "COMPLETED")
        assert (await server.wait_status("g", ("completed", "failed")))["status"] == "completed"
        again = await error(server, RESPOND, {"id": "g-approve", "value": {"approved": False}})
        assert again["extensions"]["code"] == -32602 and "not waiting for input" in again["message"]

        # events: a wait on an event shows it; emitEvent answers how many waits it resumed
        await server.rpc("tasks.create", {"tasks": [{"id": "e", "name": "e", "schemas": {"method": "event_wait_executor"},
                                                     "inputs": {"event": "deployed", "match": {"service": "api"}}}]})
        await parked(server, "e")
        event_wait = (await data(server, f'{{ task(taskId: "e") {{ {WAITING} }} }}'))["task"]["waiting"]
        assert (event_wait["kind"], event_wait["event"], event_wait["match"]) == ("event", "deployed", {"service": "api"})
        assert (await data(server, EMIT, {"name": "deployed", "payload": {"service": "web"}}))["emitEvent"] == 0
        assert (await data(server, EMIT, {"name": "deployed", "payload": {"service": "api"}}))["emitEvent"] == 1
        done = await server.wait_status("e", ("completed", "failed"))
        assert done["result"] == {"service": "api"}
        no_name = await error(server, EMIT, {"payload": {}})
        assert no_name["message"] == "name is required" and no_name["extensions"]["code"] == -32602
        not_object = await error(server, EMIT, {"name": "x", "payload": [1]})
        assert not_object["extensions"]["code"] == -32602


async def test_only_the_owner_or_an_admin_answers(live: Callable[..., Any]) -> None:
    async with live({"SERVICE_JWT_SECRET": SECRET}) as server:
        settings = server.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}
        await server.rpc("tasks.create", {"tasks": approval_tree("p")}, alice)
        await parked(server, "p-approve", alice)
        denied = await error(server, RESPOND, {"id": "p-approve", "value": {"approved": True}}, headers=bob)
        assert denied["extensions"] == {"code": -32001, "codeName": "PERMISSION_DENIED"}
        other = await error(server, "mutation { emitEvent(name: \"x\", userId: \"alice\") }", headers=bob)
        assert other["extensions"]["code"] == -32001
        answered = await data(server, RESPOND, {"id": "p-approve", "value": {"approved": True}}, headers=alice)
        assert answered["respondToTask"]["waiting"] is None


PURGE = ("mutation($olderThan: String) { purgeTasks(olderThan: $olderThan) "
         "{ swept trees tasks idempotencyRecords events olderThan } }")


async def test_purge_tasks_is_for_admins_and_deletes_ended_trees(live: Callable[..., Any]) -> None:
    """purgeTasks is tasks.purge: the same service function, its rules and its errors."""
    async with live({"SERVICE_JWT_SECRET": SECRET}) as server:
        settings = server.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'])}"}
        task = (await data(server, CREATE, {"input": {"name": "old"}}, headers=alice))["createTask"]
        await server.wait_status(task["id"], ("completed",), alice)
        denied = await error(server, PURGE, {"olderThan": "1s"}, headers=alice)
        assert denied["extensions"] == {"code": -32001, "codeName": "PERMISSION_DENIED"}
        assert denied["message"] == "tasks.purge needs the admin role"
        for bad in (None, "soon", "-1d", "0"):  # None: SERVICE_RETENTION is off, so olderThan is needed
            refused = await error(server, PURGE, {"olderThan": bad}, headers=admin)
            assert refused["extensions"]["code"] == -32602 and "older_than" in refused["message"], bad
        assert await server.rpc("tasks.get", {"task_id": task["id"]}, admin) is not None
        kept = (await data(server, PURGE, {"olderThan": "30d"}, headers=admin))["purgeTasks"]
        assert kept == {"swept": True, "trees": 0, "tasks": 0, "idempotencyRecords": 0, "events": 0,
                        "olderThan": 30 * 86_400.0}
        await asyncio.sleep(0.05)
        purged = (await data(server, PURGE, {"olderThan": "0.01"}, headers=admin))["purgeTasks"]
        assert purged["trees"] == 1 and purged["tasks"] == 1 and purged["olderThan"] == 0.01
        assert await server.rpc("tasks.get", {"task_id": task["id"]}, admin) is None


# --- the subscription -------------------------------------------------------------------------

SUBSCRIBE = "subscription($id: String) { taskStatusChanged(taskId: $id) { id status progress result error } }"


async def subscribe(server: Live, task_id: str,
                    on_first: Callable[[], Awaitable[Any]] | None = None) -> list[dict[str, Any]]:
    """Every message of one taskStatusChanged subscription up to and including `complete`;
    `on_first` is awaited once the first message (the task's state now) has arrived."""
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/graphql",
                                  subprotocols=["graphql-transport-ws"]) as ws:
        assert ws.subprotocol == "graphql-transport-ws"
        await send(ws, {"type": "connection_init", "payload": {}})
        assert (await recv(ws))["type"] == "connection_ack"
        await send(ws, {"id": "s1", "type": "subscribe", "payload": {"query": SUBSCRIBE, "variables": {"id": task_id}}})
        messages = []
        while True:
            message = await recv(ws)
            assert message["id"] == "s1"
            messages.append(message)
            if message["type"] in ("complete", "error"):
                return messages
            if on_first is not None and len(messages) == 1:
                await on_first()


async def test_subscription_follows_an_executing_task_to_completion(live: Callable[..., Any]) -> None:
    async with live() as server:
        # a gate keeps "work" pending while the subscription opens; it opens once the subscription
        # has the task's state (a timed gate could open first on a loaded machine)
        await server.rpc("tasks.create", {"tasks": [
            {"id": "root", "name": "root"}, gate("graphql-gate", "root"),
            sleep("work", 0.2, id_="work", parent="root", deps=("gate",))]})
        messages = await subscribe(server, "work",
                                   on_first=lambda: server.rpc("events.emit", {"name": "graphql-gate"}))
    assert [m["type"] for m in messages] == ["next", "next", "next", "complete"]
    states = [m["payload"]["data"]["taskStatusChanged"] for m in messages[:-1]]
    assert [s["status"] for s in states] == ["PENDING", "IN_PROGRESS", "COMPLETED"]
    assert all(s["id"] == "work" for s in states)
    assert states[-1]["progress"] == 1.0 and json.loads(states[-1]["result"]) == {"slept": 0.2}


async def test_subscription_after_create_task_and_at_cancel(live: Callable[..., Any]) -> None:
    async with live() as server:
        quick = (await data(server, CREATE, {"input": {"name": "q", "executor": "sleep_executor",
                                                       "inputs": {"seconds": 0.2}}}))["createTask"]
        messages = await subscribe(server, quick["id"])
        statuses = [m["payload"]["data"]["taskStatusChanged"]["status"] for m in messages[:-1]]
        assert statuses[-1] == "COMPLETED" and messages[-1]["type"] == "complete"
        assert statuses == sorted(statuses, key=["PENDING", "IN_PROGRESS", "COMPLETED"].index)

        # a finished task: its state at once, then complete
        again = await subscribe(server, quick["id"])
        assert [m["type"] for m in again] == ["next", "complete"]
        assert again[0]["payload"]["data"]["taskStatusChanged"]["status"] == "COMPLETED"

        slow = (await data(server, CREATE, {"input": {"name": "slow", "executor": "sleep_executor",
                                                      "inputs": {"seconds": 30}}}))["createTask"]
        await server.wait_status(slow["id"], ("in_progress",))

        async def cancel_soon() -> None:
            await asyncio.sleep(0.2)
            await data(server, 'mutation($id: String) { cancelTask(taskId: $id) }', {"id": slow["id"]})

        canceller = asyncio.create_task(cancel_soon())
        messages = await subscribe(server, slow["id"])
        await canceller
        states = [m["payload"]["data"]["taskStatusChanged"] for m in messages[:-1]]
        assert [s["status"] for s in states] == ["IN_PROGRESS", "CANCELLED"]
        assert states[-1]["error"] == "Cancelled by user" and messages[-1]["type"] == "complete"


async def test_subscription_to_a_missing_task_is_an_error(live: Callable[..., Any]) -> None:
    async with live() as server:
        messages = await subscribe(server, "ghost")
    first = messages[0]
    errors = first["payload"] if first["type"] == "error" else first["payload"]["errors"]
    assert errors[0]["message"] == "Task 'ghost' not found"
    assert errors[0]["extensions"]["code"] == -32602


# --- switches ---------------------------------------------------------------------------------


async def test_graphiql_follows_enable_docs(live_sqlite: Callable[..., Any]) -> None:
    browser = {"Accept": "text/html,application/xhtml+xml"}
    async with live_sqlite({"SERVICE_ENABLE_DOCS": "true", "SERVICE_JWT_SECRET": SECRET}) as server:
        page = await server.http.get("/graphql", headers=browser)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "graphiql" in page.text.lower()
    async with live_sqlite({"SERVICE_ENABLE_DOCS": "false"}) as server:
        page = await server.http.get("/graphql", headers=browser)
        assert page.status_code == 404 and "graphiql" not in page.text.lower()
        # the API itself stays on
        assert (await data(server, "{ tasks { id } }"))["tasks"] == []


async def test_graphql_absent_under_the_a2a_protocol(live_sqlite: Callable[..., Any]) -> None:
    async with live_sqlite({"SERVICE_API_PROTOCOL": "a2a"}) as server:
        response = await server.http.post("/graphql", json={"query": "{ tasks { id } }"})
        assert response.status_code in (404, 405)
        assert "data" not in response.text
        page = await server.http.get("/graphql", headers={"Accept": "text/html"})
        assert page.status_code in (404, 405)
        # /ws does not depend on the protocol switch
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            await send(ws, {"action": "ping"})
            assert (await recv(ws))["type"] == "pong"


def test_default_start_up_does_not_import_strawberry(tmp_path: Any) -> None:
    code = (
        "import sys\n"
        "from taskgrove.agent.app import build_app\n"
        "from taskgrove.agent.foundations.settings import Settings\n"
        f"build_app(Settings.from_env({{'SERVICE_DATABASE_URL': 'sqlite:///{tmp_path}/x.db'}}))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('strawberry', 'taskgrove.agent.surfaces.graphql'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


async def test_a_status_set_by_hand_reaches_the_subscriber(live: Callable[..., Any]) -> None:
    """Issue 14: updateTask to IN_PROGRESS, then FAILED: the subscriber sees both, not only the last."""
    async with live() as server:
        task = (await data(server, CREATE, {"input": {"name": "by hand"}}))["createTask"]
        await server.wait_status(task["id"], ("completed",))  # a grouping task: it completes at once
        update = 'mutation($id: String, $input: UpdateTaskInput) { updateTask(taskId: $id, taskInput: $input) { status } }'
        await data(server, update, {"id": task["id"], "input": {"status": "PENDING"}})

        async def set_by_hand() -> None:
            await data(server, update, {"id": task["id"], "input": {"status": "IN_PROGRESS"}})
            await asyncio.sleep(0.1)
            await data(server, update, {"id": task["id"], "input": {"status": "FAILED"}})

        hand: list[asyncio.Task[None]] = []

        async def once_subscribed() -> None:  # not after a fixed 0.3 s, which a loaded machine can overrun
            hand.append(asyncio.create_task(set_by_hand()))

        messages = await subscribe(server, task["id"], on_first=once_subscribed)
        await hand[0]
    statuses = [m["payload"]["data"]["taskStatusChanged"]["status"] for m in messages[:-1]]
    assert statuses == ["PENDING", "IN_PROGRESS", "FAILED"] and messages[-1]["type"] == "complete"
