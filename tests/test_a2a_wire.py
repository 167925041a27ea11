"""POST / and the agent card as raw JSON over HTTP (httpx against the ASGI app).

The 0.3 wire format (`message/send`), our own methods on `/` (`tasks.execute`, `tasks.*`,
`cancel` with every message of SPEC.md), push configs with headers and method, per-user scoping.
The official-client tests against a real server are in test_a2a_client.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT
from tests.servers import receiver

SECRET = "a2a-test-secret-of-at-least-32-bytes!"


def tree(*, seconds: float | None = None) -> list[dict[str, Any]]:
    """A root that aggregates two children's results; ids unique per call."""
    suffix = uuid.uuid4().hex[:8]
    child = {"name": "child-b", "schemas": {"method": "noop_executor"}, "inputs": {"n": 2}}
    if seconds is not None:
        child = {"name": "child-b", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": seconds}}
    return [
        {"id": f"root-{suffix}", "name": "root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"a-{suffix}", "required": True}, {"id": f"b-{suffix}", "required": True}]},
        {"id": f"a-{suffix}", "name": "child-a", "parent_id": f"root-{suffix}",
         "schemas": {"method": "noop_executor"}, "inputs": {"n": 1}},
        {"id": f"b-{suffix}", "parent_id": f"root-{suffix}", **child},
    ]


def send_body(tasks: Any = None, *, metadata: dict[str, Any] | None = None,
              configuration: dict[str, Any] | None = None, method: str = "message/send") -> dict[str, Any]:
    parts = [{"kind": "data", "data": {"tasks": tasks}}] if tasks is not None else \
        [{"kind": "text", "text": "execute the stored tree"}]
    params: dict[str, Any] = {"message": {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                                          "parts": parts}}
    if metadata is not None:
        params["metadata"] = metadata
    if configuration is not None:
        params["configuration"] = configuration
    return {"jsonrpc": "2.0", "id": "req-1", "method": method, "params": params}


async def post(client: Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await client.http.post("/", json=body, headers=headers or {})
    assert response.status_code == 200, response.text
    return response.json()


def summary(message: dict[str, Any]) -> dict[str, Any]:
    assert message["kind"] == "message"
    (part,) = message["parts"]
    assert part["kind"] == "data"
    return part["data"]


# --- agent card -------------------------------------------------------------------------------

async def test_card_served_on_both_paths_with_runtime_url_and_version(app_factory: Any) -> None:
    async with app_factory(public_url="http://agents.example:9000") as client:
        cards = [(await client.http.get(path)).json()
                 for path in ("/.well-known/agent-card", "/.well-known/agent-card.json")]
    assert cards[0] == cards[1]
    card = cards[0]
    assert card["url"] == "http://agents.example:9000"
    assert card["version"] == "0.1.0"
    # camelCase only: the official client refuses a card that also has `push_notifications`
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True}
    interfaces = {(i["protocolBinding"], i["protocolVersion"], i["url"]) for i in card["supportedInterfaces"]}
    assert interfaces == {("JSONRPC", "1.0", "http://agents.example:9000"),
                          ("JSONRPC", "0.3", "http://agents.example:9000"),
                          ("HTTP+JSON", "1.0", "http://agents.example:9000/a2a")}
    (skill,) = card["skills"]
    assert skill["id"] == "tasks.execute" and skill["name"] and skill["description"] and skill["tags"]


async def test_card_is_public_while_agent_calls_need_a_token(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_JWT_SECRET": SECRET}) as client:
        assert (await client.http.get("/.well-known/agent-card")).status_code == 200
        denied = await client.http.post("/", json=send_body(tree()))
    assert denied.status_code == 401
    assert denied.json()["error"]["code"] == -32001


# --- message/send (0.3 wire format) -----------------------------------------------------------

async def test_message_send_runs_the_tree_and_answers_the_agent_surface_task(client: Client) -> None:
    tasks = tree()
    root_id = tasks[0]["id"]
    answer = await post(client, send_body(tasks))
    assert answer["id"] == "req-1"
    task = answer["result"]
    assert task["kind"] == "task"
    assert task["contextId"] == task["context_id"] == root_id
    assert task["id"] != root_id  # the execution instance, not our task
    assert task["status"]["state"] == "completed"
    assert summary(task["status"]["message"]) == {
        "protocol": "a2a", "status": "completed", "progress": 1.0, "root_task_id": root_id, "task_count": 3}
    assert task["metadata"] == {"protocol": "a2a", "root_task_id": root_id}
    (artifact,) = task["artifacts"]
    results = artifact["parts"][0]["data"]
    assert results["status"] == "completed" and results["task_count"] == 3
    by_name = {t["name"]: t for t in results["tasks"]}
    assert by_name["child-a"]["result"] == {"ok": True, "inputs": {"n": 1}}  # 1 stays an integer
    assert by_name["root"]["result"]["count"] == 2
    stored = await client.result("tasks.get", {"task_id": root_id})
    assert stored["status"] == "completed"

    again = await post(client, {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}})
    assert again["result"]["context_id"] == root_id and again["result"]["status"]["state"] == "completed"


async def test_message_send_refuses_a_bad_tree_without_creating_anything(client: Client) -> None:
    tasks = [{"id": "one", "name": "one"}, {"id": "two", "name": "two"}]
    error = (await post(client, send_body(tasks)))["error"]
    assert error["code"] == -32602
    assert "Multiple root tasks found" in error["message"]
    assert await client.result("tasks.get", {"task_id": "one"}) is None

    # A text part without metadata.task_id (and no LLM configured): an unsupported content type,
    # and the answer names what is accepted.
    error = (await post(client, send_body(None)))["error"]
    assert error["code"] == -32005
    assert 'data part {"tasks": [task objects]}' in error["message"]


async def test_message_send_copy_execution_leaves_the_original_unchanged(client: Client) -> None:
    tasks = tree()
    root_id = tasks[0]["id"]
    await post(client, send_body(tasks))
    before = await client.result("tasks.get", {"task_id": root_id})
    copied = (await post(client, send_body(metadata={"task_id": root_id, "copy_execution": True,
                                                       "copy_children": True})))["result"]
    copy_root = copied["context_id"]
    assert copy_root != root_id
    assert copied["status"]["state"] == "completed"
    assert copied["metadata"] == {"protocol": "a2a", "root_task_id": copy_root, "original_task_id": root_id}
    assert summary(copied["status"]["message"])["root_task_id"] == copy_root
    copy_row = await client.result("tasks.get", {"task_id": copy_root})
    assert copy_row["original_task_id"] == root_id and copy_row["status"] == "completed"
    after = await client.result("tasks.get", {"task_id": root_id})
    assert {k: after[k] for k in ("status", "result", "completed_at")} == \
        {k: before[k] for k in ("status", "result", "completed_at")}

    rerun = (await post(client, send_body(metadata={"task_id": root_id})))["result"]
    assert rerun["context_id"] == root_id and rerun["status"]["state"] == "completed"
    assert "original_task_id" not in rerun["metadata"]

    error = (await post(client, send_body(tasks=tree(), metadata={"copy_execution": True})))["error"]
    assert error["code"] == -32602 and "copy_execution needs metadata.task_id" in error["message"]
    error = (await post(client, send_body(metadata={"task_id": "no-such-task"})))["error"]
    assert error["code"] == -32602 and error["message"] == "Task 'no-such-task' not found"


async def test_agent_tasks_are_scoped_to_their_user(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_JWT_SECRET": SECRET}) as client:
        settings = client.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}
        task = (await post(client, send_body(tree()), alice))["result"]
        assert task["metadata"]["user_id"] == "alice"
        get = {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": task["id"]}}
        assert (await post(client, get, alice))["result"]["id"] == task["id"]
        assert (await post(client, get, bob))["error"]["code"] == -32001
        row = await client.result("tasks.get", {"task_id": task["context_id"]}, headers=alice)
        assert row["user_id"] == "alice"


# --- push configs in raw JSON ---------------------------------------------------------------

async def test_raw_push_config_headers_and_method_reach_the_receiver(client: Client) -> None:
    tasks = tree()
    root_id = tasks[0]["id"]
    async with receiver() as rec:
        config = {"url": f"{rec.url}/hooks/a2a", "token": "tok-1",
                  "headers": {"X-Tenant": "acme"}, "method": "PATCH"}
        answer = (await post(client, send_body(tasks, configuration={"pushNotificationConfig": config})))["result"]
        assert answer["status"]["state"] == "working"
        assert summary(answer["status"]["message"]) == {
            "protocol": "a2a", "status": "in_progress", "progress": 0.0, "root_task_id": root_id, "task_count": 3}
        await rec.wait_for(lambda reqs: any(r["json"]["final"] for r in reqs))
    assert {r["method"] for r in rec.requests} == {"PATCH"}
    assert all(r["path"] == "/hooks/a2a" for r in rec.requests)
    assert all(r["headers"]["x-tenant"] == "acme" for r in rec.requests)
    assert all(r["headers"]["x-a2a-notification-token"] == "tok-1" for r in rec.requests)
    last = rec.requests[-1]["json"]
    assert last["task_id"] == answer["id"] and last["context_id"] == root_id
    assert last["status"]["state"] == "completed" and last["final"] is True
    assert summary(last["status"]["message"])["status"] == "completed"
    assert all(r["json"]["final"] is False for r in rec.requests[:-1])


async def test_push_retries_5xx_like_webhooks(client: Client) -> None:
    async with receiver() as rec:
        rec.script = [503]  # the first post fails once, then every post is accepted
        config = {"url": f"{rec.url}/hooks/a2a"}
        await post(client, send_body(tree(), configuration={"pushNotificationConfig": config}))
        await rec.wait_for(lambda reqs: any(r["json"]["final"] for r in reqs))
    first, second = rec.requests[0], rec.requests[1]
    assert first["json"] == second["json"], "the failed notification is sent again"
    assert second["at"] - first["at"] >= 0.9, "after the 1 s backoff"
    assert rec.requests[-1]["json"]["final"] is True


async def test_push_url_is_checked_against_ssrf(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_ALLOW_PRIVATE_URLS": "false"}) as client:
        config = {"url": "http://127.0.0.1:9/hook"}
        error = (await post(client, send_body(tree(), configuration={"pushNotificationConfig": config})))["error"]
        assert error["code"] == -32602
        assert "push notification url refused" in error["message"] and "loopback" in error["message"]
        bad_method = {"url": "https://example.com/hook", "method": "DELETE"}
        error = (await post(client, send_body(tree(), configuration={"pushNotificationConfig": bad_method})))["error"]
        assert error["code"] == -32602 and "method must be one of POST, PUT, PATCH" in error["message"]


# --- our methods on / -------------------------------------------------------------------------

async def test_tasks_execute_on_root_with_tasks_is_an_agent_execution(client: Client) -> None:
    tasks = tree()
    result = await client.result("tasks.execute", {"tasks": tasks}, path="/")
    assert result["kind"] == "task" and result["context_id"] == tasks[0]["id"]
    assert result["status"]["state"] == "completed"
    assert summary(result["status"]["message"])["protocol"] == "a2a"

    legacy = await client.result("execute_task_tree", {"tasks": tree()}, path="/")
    assert legacy["kind"] == "task" and legacy["status"]["state"] == "completed"


async def test_tasks_execute_on_root_streams_with_metadata_stream(client: Client) -> None:
    tasks = tree(seconds=0.2)
    body = {"jsonrpc": "2.0", "id": 5, "method": "tasks.execute", "params": {"tasks": tasks},
            "metadata": {"stream": True}}
    response = await client.http.post("/", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    first, updates = events[0], events[1:]
    assert first["id"] == 5 and first["result"]["kind"] == "task"
    assert first["result"]["status"]["state"] == "working"
    statuses = [e for e in updates if e["kind"] == "status-update"]
    assert len(statuses) >= 2
    assert all(e["context_id"] == tasks[0]["id"] and e["task_id"] == first["result"]["id"] for e in statuses)
    assert [e["final"] for e in statuses] == [False] * (len(statuses) - 1) + [True]
    assert statuses[-1]["status"]["state"] == "completed"
    assert any(e["kind"] == "artifact-update" for e in updates)


async def test_tasks_execute_on_root_with_push_config_answers_at_once(client: Client) -> None:
    tasks = tree(seconds=0.2)
    async with receiver() as rec:
        body = {"jsonrpc": "2.0", "id": 6, "method": "tasks.execute", "params": {"tasks": tasks},
                "configuration": {"push_notification_config": {"url": f"{rec.url}/cb", "headers": {"X-Key": "k"}}}}
        result = (await post(client, body))["result"]
        assert result["status"]["state"] == "working"
        assert summary(result["status"]["message"]) == {
            "protocol": "a2a", "status": "in_progress", "progress": 0.0, "root_task_id": tasks[0]["id"],
            "task_count": 3}
        await rec.wait_for(lambda reqs: any(r["json"]["final"] for r in reqs))
    assert all(r["method"] == "POST" and r["headers"]["x-key"] == "k" for r in rec.requests)
    assert rec.requests[-1]["json"]["status"]["state"] == "completed"


async def test_tasks_execute_on_root_with_task_id_answers_like_tasks(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        first = await client.result("tasks.create", {"tasks": tree(seconds=0.05)})
        await client.wait_status(first["id"], ("completed",))
        second = await client.result("tasks.create", {"tasks": tree()})
        await client.wait_status(second["id"], ("completed",))
        on_root = await client.result("tasks.execute", {"task_id": first["id"], "copy_execution": True}, path="/")
        on_tasks = await client.result("tasks.execute", {"task_id": second["id"], "copy_execution": True})
    assert on_root["protocol"] == "a2a" and on_tasks["protocol"] == "jsonrpc"
    assert set(on_root) == set(on_tasks)
    assert on_root["success"] is True and on_root["status"] == "started"
    assert on_root["original_task_id"] == first["id"]


async def test_other_task_methods_on_root_match_tasks(client: Client) -> None:
    tasks = tree()
    await post(client, send_body(tasks))
    root_id = tasks[0]["id"]
    for method, params in (("tasks.get", {"task_id": root_id}), ("tasks.tree", {"task_id": root_id}),
                           ("tasks.children", {"parent_id": root_id}), ("tasks.running.count", {})):
        assert await client.result(method, params, path="/") == await client.result(method, params)
    error = await client.error("tasks.nope", {}, path="/")
    assert error["code"] == -32601 and "tasks.nope" in error["data"]


# --- cancel -----------------------------------------------------------------------------------

def cancel_body(**fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "cancel", "params": {}, **fields}


def cancel_data(answer: dict[str, Any], state: str) -> dict[str, Any]:
    event = answer["result"]
    assert event["kind"] == "status-update" and event["final"] is True
    assert event["status"]["state"] == state
    data = summary(event["status"]["message"])
    assert data["protocol"] == "a2a" and data["timestamp"]
    return data


async def test_cancel_method_cancels_and_reports_every_refusal(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        tasks = tree(seconds=60)
        root_id, sleeper = tasks[0]["id"], tasks[2]["id"]
        await client.result("tasks.create", {"tasks": tasks})
        await client.wait_status(sleeper, ("in_progress",))

        # task_id wins over context_id and metadata (resolution order of SPEC.md)
        answer = await post(client, cancel_body(task_id=sleeper, context_id="ignored",
                                                metadata={"task_id": "ignored", "error_message": "stop now"}))
        data = cancel_data(answer, "canceled")
        assert data["status"] == "cancelled" and data["message"] == f"Task {sleeper} cancelled"
        assert answer["result"]["task_id"] == sleeper and answer["result"]["context_id"] == root_id
        stored = await client.result("tasks.get", {"task_id": sleeper})
        assert stored["status"] == "cancelled" and stored["error"] == "stop now"
        assert sleeper not in client.services.engine.running

        data = cancel_data(await post(client, cancel_body(metadata={"context_id": sleeper})), "failed")
        assert data["message"] == f"Task {sleeper} is already cancelled, cannot cancel"

        done = tree()
        await client.result("tasks.create", {"tasks": done})
        finished = await client.wait_status(done[1]["id"], ("completed",))
        data = cancel_data(await post(client, cancel_body(context_id=finished["id"])), "failed")
        assert data["message"] == f"Task {finished['id']} is already completed, cannot cancel"

        data = cancel_data(await post(client, cancel_body(metadata={"task_id": "missing-task"})), "failed")
        assert data["message"] == "Task missing-task not found" and data["error"] == "not_found"

        answer = await post(client, cancel_body())
        data = cancel_data(answer, "failed")
        assert data["message"] == "Task ID not found in context" and data["status"] == "failed"
        assert answer["result"]["task_id"] is None


async def test_agent_tasks_survive_in_the_database_between_apps(make_settings: Any) -> None:
    settings: Settings = make_settings()
    async with running_app(settings) as client:
        task = (await post(client, send_body(tree())))["result"]
    async with running_app(settings) as client:
        again = await post(client, {"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": {"id": task["id"]}})
    assert again["result"]["status"] == task["status"]
    assert again["result"]["artifacts"] == task["artifacts"]


async def test_an_agent_task_cut_off_by_shutdown_ends_with_its_resumed_tree(make_settings: Any) -> None:
    """The tree is a durable execution: after a restart it resumes by itself, and the agent task
    that followed it, read afterwards, reports the tree's stored outcome (not a stale `working`,
    not a made-up failure)."""
    from taskgrove.agent.surfaces.a2a import executor

    settings: Settings = make_settings()
    async with running_app(settings) as client:
        tasks = tree(seconds=1.0)
        body = send_body(tasks, configuration={"blocking": False})  # answered at once, runs on
        task = (await post(client, body))["result"]
        assert task["status"]["state"] == "working"
        await client.wait_status(tasks[2]["id"], ("in_progress",))
    async with running_app(settings) as client:
        await client.wait_status(tasks[0]["id"], ("completed",))  # resumed with no call
        executor.SETTLE_AFTER, saved = executor.timedelta(0), executor.SETTLE_AFTER
        try:  # the root's outcome is written a moment before its execution ends: read until settled
            deadline = asyncio.get_running_loop().time() + EVENT_WAIT
            while True:
                again = (await post(client, {"jsonrpc": "2.0", "id": 9, "method": "tasks/get",
                                             "params": {"id": task["id"]}}))["result"]
                if again["status"]["state"] != "working" or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
        finally:
            executor.SETTLE_AFTER = saved
        sleeper = await client.result("tasks.get", {"task_id": tasks[2]["id"]})
    assert sleeper["status"] == "completed"
    assert again["status"]["state"] == "completed"
    data = summary(again["status"]["message"])
    assert data["status"] == "completed" and data["root_task_id"] == tasks[0]["id"] and data["task_count"] == 3
    (artifact,) = [a for a in again["artifacts"] if a["name"] == "task_results"]
    outcome = artifact["parts"][0]["data"]
    assert outcome["status"] == "completed" and {t["status"] for t in outcome["tasks"]} == {"completed"}


async def test_push_config_set_on_a_running_task_gets_the_rest(client: Client) -> None:
    tasks = tree(seconds=1.0)
    async with receiver() as rec:
        task = (await post(client, send_body(tasks, configuration={"blocking": False})))["result"]
        config = {"url": f"{rec.url}/late", "headers": {"X-Late": "1"}, "method": "PUT"}
        answer = await post(client, {"jsonrpc": "2.0", "id": 4, "method": "tasks/pushNotificationConfig/set",
                                     "params": {"taskId": task["id"], "pushNotificationConfig": config}})
        assert answer["result"]["pushNotificationConfig"]["url"] == config["url"]
        await rec.wait_for(lambda reqs: any(r["json"]["final"] for r in reqs))
    assert all(r["method"] == "PUT" and r["headers"]["x-late"] == "1" for r in rec.requests)
    states = [r["json"]["status"]["state"] for r in rec.requests if r["json"]["kind"] == "status-update"]
    assert states[-1] == "completed" and "working" in states  # progress after the config was set
    # the outcome artifact is pushed too, before the final status
    kinds = [r["json"]["kind"] for r in rec.requests]
    assert "artifact-update" in kinds and kinds.index("artifact-update") < len(kinds) - 1


async def test_message_send_with_an_idempotency_key_answers_a_resend_with_the_first_task(client: Client) -> None:
    """A client cut off before the answer sends again: one tree, one agent task, the same answer."""
    body = send_body(tree())
    headers = {"Idempotency-Key": "send-7"}
    first = await post(client, body, headers=headers)
    again = await post(client, body, headers=headers)  # the same message, sent again
    assert "result" in first and again["result"]["id"] == first["result"]["id"]
    assert len([t for t in await client.result("tasks.list", {}) if t["parent_id"] is None]) == 1
    other = await post(client, send_body(tree()), headers=headers)
    assert other["error"]["code"] == -32602 and "different request" in other["error"]["data"]
