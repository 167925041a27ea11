"""An A2A message sent again (its sender was cut off before it saw the answer) joins the tree the
first one created, as a resent tasks.create does (DESIGN.md, Idempotency), instead of refusing the
ids as taken: the resend follows the running execution, or reports the stored outcome of one that
ended or waits for input, and nothing runs twice. A resend that differs in any way is still
refused, naming the id that is taken. A streaming send with an Idempotency-Key is planned once:
its resend joins the tree the first one created or named (a stored tree named by
metadata.task_id is not executed twice).

Found when an `a2a_agent_executor` attempt lost its lease after sending and before it had stored
the remote task id: its next attempt sent the message again, the remote taskgrove refused it, and
a platform fault failed the user's task (issue 25's promise). tests/test_executor_a2a.py drives
the same through the executor and two processes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from tests.conftest import Client
from tests.test_a2a_artifacts import sse
from tests.test_a2a_input_required import PROMPT, approval_tree
from tests.test_a2a_wire import post, send_body, summary, tree


def outcome(task: dict[str, Any]) -> dict[str, Any]:
    (artifact,) = [a for a in task["artifacts"] if a["name"] == "task_results"]
    return artifact["parts"][0]["data"]


async def attempts(client: Client, task_id: str) -> list[dict[str, Any]]:
    return await client.result("tasks.attempts", {"task_id": task_id})


async def test_a_tree_resent_while_it_runs_follows_that_execution(client: Client) -> None:
    tasks = tree(seconds=1.0)
    root_id, sleeper = tasks[0]["id"], tasks[2]["id"]
    first = (await post(client, send_body(tasks, configuration={"blocking": False})))["result"]
    assert first["status"]["state"] == "working"
    started = await client.wait_status(sleeper, ("in_progress",))

    again = await post(client, send_body(tasks))  # a new messageId, the same tree: blocks to the end
    task = again["result"]
    assert task["id"] != first["id"] and task["contextId"] == root_id
    assert task["status"]["state"] == "completed", task["status"]
    assert summary(task["status"]["message"])["status"] == "completed"
    assert outcome(task)["status"] == "completed" and outcome(task)["task_count"] == 3
    # One execution: the sleeper started once, and was not started again.
    (only,) = await attempts(client, sleeper)
    assert only["started_at"] == started["started_at"]
    assert (await client.result("tasks.get", {"task_id": sleeper}))["started_at"] == started["started_at"]


async def test_a_tree_resent_after_it_ended_reports_its_outcome_and_runs_nothing(client: Client) -> None:
    tasks = tree()
    tasks[2] = {**tasks[2], "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 5},
                "timeout_seconds": 0.1}  # child-b times out: the tree fails
    first = (await post(client, send_body(tasks)))["result"]
    assert first["status"]["state"] == "failed"
    before = {t["id"]: await client.result("tasks.get", {"task_id": t["id"]}) for t in tasks}

    task = (await post(client, send_body(tasks)))["result"]
    assert task["contextId"] == tasks[0]["id"]
    assert task["status"]["state"] == "failed", task["status"]
    assert outcome(task)["status"] == "failed"
    assert {t["id"]: t["status"] for t in outcome(task)["tasks"]} == {
        t["id"]: before[t["id"]]["status"] for t in tasks}
    after = {t["id"]: await client.result("tasks.get", {"task_id": t["id"]}) for t in tasks}
    assert after == before  # nothing re-ran: not the failed task, not its pending dependents

    completed = tree()
    assert (await post(client, send_body(completed)))["result"]["status"]["state"] == "completed"
    task = (await post(client, send_body(completed)))["result"]
    assert task["status"]["state"] == "completed" and outcome(task)["status"] == "completed"
    assert len(await attempts(client, completed[1]["id"])) == 1


async def test_a_resend_that_differs_is_refused_naming_the_taken_id(client: Client) -> None:
    tasks = tree()
    assert (await post(client, send_body(tasks)))["result"]["status"]["state"] == "completed"
    changed = [dict(t) for t in tasks]
    changed[1]["inputs"] = {"n": 99}
    error = (await post(client, send_body(changed)))["error"]
    assert error["code"] == -32602
    assert f"id '{tasks[0]['id']}' already exists" in error["message"], error
    # A tree that reuses one child's id under a new root is refused too, and stores nothing.
    other = tree()
    other[1]["id"] = tasks[1]["id"]
    other[0]["dependencies"][0]["id"] = tasks[1]["id"]
    other[1]["inputs"] = {"n": 1}
    error = (await post(client, send_body(other)))["error"]
    assert error["code"] == -32602 and f"id '{tasks[1]['id']}' already exists" in error["message"], error
    assert await client.result("tasks.get", {"task_id": other[0]["id"]}) is None
    stored = await client.result("tasks.get", {"task_id": tasks[1]["id"]})
    assert stored["inputs"] == {"n": 1} and stored["status"] == "completed"


async def test_a_resend_adds_nothing_so_the_pending_quota_does_not_refuse_it(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_MAX_PENDING_PER_USER": "3"}) as client:
        tasks = tree(seconds=1.0)  # three tasks: the quota is full while it runs
        first = (await post(client, send_body(tasks, configuration={"blocking": False})))["result"]
        assert first["status"]["state"] == "working"
        over = await client.http.post("/", json=send_body(tree()))  # a new tree is over the quota
        assert over.status_code == 429 and "SERVICE_MAX_PENDING_PER_USER" in over.text, over.text
        task = (await post(client, send_body(tasks)))["result"]
        assert task["contextId"] == tasks[0]["id"] and task["status"]["state"] == "completed", task["status"]


async def test_a_tree_resent_while_it_waits_for_input_asks_again(client: Client) -> None:
    tasks = approval_tree()
    first = (await post(client, send_body(tasks)))["result"]
    assert first["status"]["state"] == "input-required"

    task = (await post(client, send_body(tasks)))["result"]
    assert task["id"] != first["id"] and task["contextId"] == tasks[0]["id"]
    assert task["status"]["state"] == "input-required", task["status"]
    texts = [p["text"] for p in task["status"]["message"]["parts"] if p["kind"] == "text"]
    assert any(PROMPT in text for text in texts), task["status"]["message"]
    # The resend's agent task takes the answer like the first one would have.
    answer = {"jsonrpc": "2.0", "id": "req-2", "method": "message/send", "params": {"message": {
        "kind": "message", "role": "user", "messageId": uuid.uuid4().hex, "taskId": task["id"],
        "contextId": task["contextId"], "parts": [{"kind": "data", "data": {"value": {"approved": True}}}]}}}
    done = (await post(client, answer))["result"]
    assert done["status"]["state"] == "completed", done["status"]
    assert (await client.result("tasks.get", {"task_id": tasks[0]["id"]}))["status"] == "completed"


async def test_another_users_copy_of_a_tree_is_refused_not_joined(app_factory: Any) -> None:
    """The owner is part of what must be the same: another user sending the same ids and content
    gets the taken id, not the owner's execution and outcome."""
    from tests.test_auth import SECRET, token

    async with app_factory(env={"SERVICE_JWT_SECRET": SECRET}) as client:
        tasks = tree()
        alice = {"Authorization": f"Bearer {token('alice')}"}
        first = (await post(client, send_body(tasks), alice))["result"]
        assert first["status"]["state"] == "completed"
        error = (await post(client, send_body(tasks), {"Authorization": f"Bearer {token('mallory')}"}))["error"]
        assert error["code"] == -32602 and "already exists" in error["message"], error
        again = (await post(client, send_body(tasks), alice))["result"]  # the owner's resend is joined
        assert again["status"]["state"] == "completed" and again["contextId"] == tasks[0]["id"]


# --- a stream resent with its Idempotency-Key ----------------------------------------------------

async def stream(client: Client, body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The events of a 0.3 message/stream with an Idempotency-Key (the answer, when it is an error)."""
    response = await client.http.post("/", json=body, headers={"Idempotency-Key": key})
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        return [response.json()]
    return [e if "error" in e else e["result"] for e in sse(response.text)]


def final_state(events: list[dict[str, Any]]) -> str:
    (last,) = [e for e in events if e.get("kind") == "status-update" and e.get("final")]
    return str(last["status"]["state"])


async def test_a_stream_resent_with_its_key_joins_the_stored_tree_the_first_one_named(client: Client) -> None:
    """metadata.task_id names a stored tree to execute: a second message would be a second
    execution ("already running" while the first runs). Resent with the first one's
    Idempotency-Key (a2a_agent_executor sends one, stable across an interrupted attempt's
    re-runs), it joins the first one's execution instead, and after the end reports it."""
    sleeper = root_id = f"sleep-{uuid.uuid4().hex[:8]}"  # a one-task tree: the named task itself runs
    tasks = [{"id": root_id, "name": "sleep", "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 1.0}}]
    await client.services.tasks.create_tree_for(tasks, None)  # stored, not executed
    body = send_body(metadata={"task_id": root_id}, method="message/stream")
    first = asyncio.create_task(stream(client, body, "ask:exec-1:1"))
    started = await client.wait_status(sleeper, ("in_progress",))

    again = await stream(client, body, "ask:exec-1:1")
    assert again[0]["kind"] == "task" and again[0]["contextId"] == root_id, again[0]
    assert final_state(again) == "completed"
    events = await first
    assert final_state(events) == "completed" and events[0]["id"] != again[0]["id"]
    late = await stream(client, body, "ask:exec-1:1")  # after the end: its outcome, nothing run again
    assert final_state(late) == "completed"
    (artifact,) = [e for e in late if e.get("kind") == "artifact-update"]
    assert artifact["artifact"]["parts"][0]["data"]["status"] == "completed"
    (only,) = await attempts(client, sleeper)
    assert only["started_at"] == started["started_at"]

    other = send_body(metadata={"task_id": root_id, "stream": True}, method="message/stream")
    (refused,) = await stream(client, other, "ask:exec-1:1")  # the same key, another request
    assert refused["error"]["code"] == -32602 and "different request" in json.dumps(refused["error"]), refused
    anew = await stream(client, body, "ask:exec-2:1")  # a new key is a new request (a completed tree
    assert final_state(anew) == "completed"  # is not run again: only pending and failed tasks are)
    assert anew[0]["id"] not in {events[0]["id"], again[0]["id"], late[0]["id"]}


async def test_a_keyed_stream_of_a_tree_resent_follows_it_and_a_refused_one_frees_its_key(client: Client) -> None:
    """A data part is deduplicated by its content already; with the key, the message itself is:
    the resent stream follows the same tree. A first request refused leaves its key free."""
    tasks = tree()
    body = send_body(tasks, method="message/stream")
    first = await stream(client, body, "k-data")
    again = await stream(client, body, "k-data")
    assert final_state(first) == final_state(again) == "completed"
    assert first[0]["contextId"] == again[0]["contextId"] == tasks[0]["id"]
    bad = send_body([{"id": "x", "name": "x", "dependencies": [{"id": "missing", "required": True}]}],
                    method="message/stream")
    (refused,) = await stream(client, bad, "k-bad")
    assert refused["error"]["code"] == -32602
    fixed = tree()
    events = await stream(client, send_body(fixed, method="message/stream"), "k-bad")  # the key is free again
    assert final_state(events) == "completed" and events[0]["contextId"] == fixed[0]["id"]
