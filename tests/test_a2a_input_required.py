"""Durable waits through A2A (docs/waits.md, "A2A"): a tree with `human_input_executor` in the
middle makes its agent task `input-required`; a follow-up message on the agent task answers it.

Driven by the official a2a-sdk client (1.0 wire) against the service on uvicorn, plus the 0.3 wire
as raw JSON-RPC, push notifications to a local receiver, and one real `taskgrove serve` process.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from a2a.client import Client
import pytest
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, ParseDict

from taskgrove.agent.surfaces.a2a import executor
from tests.deadlines import EVENT_WAIT
from tests.processes import Service
from tests.servers import receiver
from tests.test_a2a_client import a2a_client, agent_server, collect, send_request, wait_until
from tests.test_auth import token

APPROVAL = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
PROMPT = "Refund 1250 EUR to ACME?"
INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED


def approval_tree(schema: Any = APPROVAL) -> list[dict[str, Any]]:
    """prepare -> approve (waits for input) -> pay; the root aggregates pay. Ids unique per call."""
    s = uuid.uuid4().hex[:8]
    inputs: dict[str, Any] = {"prompt": PROMPT}
    if schema is not None:
        inputs["schema"] = schema
    return [
        {"id": f"refund-{s}", "name": "Refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"pay-{s}", "required": True}]},
        {"id": f"prepare-{s}", "name": "Prepare", "parent_id": f"refund-{s}", "schemas": {"method": "noop_executor"}},
        {"id": f"approve-{s}", "name": "Approve", "parent_id": f"refund-{s}",
         "schemas": {"method": "human_input_executor"}, "inputs": inputs,
         "dependencies": [{"id": f"prepare-{s}", "required": True}]},
        {"id": f"pay-{s}", "name": "Pay", "parent_id": f"refund-{s}", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"approve-{s}", "required": True}]},
    ]


def follow_up(task: Task, *parts: Part) -> SendMessageRequest:
    """A message on the agent task (taskId and contextId set, as A2A does for input-required)."""
    return SendMessageRequest(message=Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, task_id=task.id,
                                              context_id=task.context_id, parts=list(parts)))


async def send(client: Client, request: SendMessageRequest) -> Task:
    """The agent task a blocking send answers with."""
    (response,) = await collect(client, request)
    return response.task


def wait_data(task: Task) -> dict[str, Any]:
    """The status message's data part (run summary and the wait), and its text part as `text`."""
    parts = task.status.message.parts
    (data,) = [MessageToDict(p.data) for p in parts if p.HasField("data")]
    (text,) = [p.text for p in parts if p.WhichOneof("content") == "text"]
    return {**data, "text": text}


def outcome(task: Task) -> dict[str, Any]:
    (artifact,) = [a for a in task.artifacts if a.name == "task_results"]
    return MessageToDict(artifact.parts[0].data)


# --- message/send -------------------------------------------------------------------------------

async def test_send_answers_input_required_and_a_follow_up_completes_the_tree(make_settings: Any) -> None:
    tasks = approval_tree()
    root, approve = tasks[0]["id"], tasks[2]["id"]
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False) as client:
        waiting = await send(client, send_request(tasks))
        assert waiting.status.state == INPUT_REQUIRED
        assert waiting.context_id == root
        data = wait_data(waiting)
        assert data["text"] == PROMPT
        assert data["prompt"] == PROMPT and data["schema"] == APPROVAL and data["task_id"] == approve
        assert data["root_task_id"] == root and data["status"] == "in_progress" and "value" in data["next"]
        assert "problem" not in data
        row = await app.state.services.repo.get(approve)
        assert row["status"] == "in_progress" and row["waiting"] is not None
        read = await client.get_task(GetTaskRequest(id=waiting.id))
        assert read.status.state == INPUT_REQUIRED  # also on read: the state is stored

        answer = follow_up(waiting, new_data_part({"value": {"approved": True}}))
        done = await send(client, answer)
        assert done.id == waiting.id
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        results = outcome(done)
        assert results["status"] == "completed"
        assert {t["id"]: t["result"] for t in results["tasks"]}[approve] == {"approved": True}
        stored = await client.get_task(GetTaskRequest(id=waiting.id))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer.message.message_id in [m.message_id for m in stored.history]


async def test_a_wrong_value_keeps_input_required_and_says_why(make_settings: Any) -> None:
    tasks = approval_tree()
    approve = tasks[2]["id"]
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False) as client:
        waiting = await send(client, send_request(tasks))
        wrong = await send(client, follow_up(waiting, new_data_part({"value": {"approved": "yes"}})))
        assert wrong.status.state == INPUT_REQUIRED
        data = wait_data(wrong)
        assert "approved" in data["problem"] and data["task_id"] == approve
        assert data["text"].startswith("Not accepted: ") and data["text"].endswith(PROMPT)
        text = await send(client, follow_up(waiting, new_text_part("yes")))  # the schema wants an object
        assert text.status.state == INPUT_REQUIRED
        assert 'data part {"value": ...}' in wait_data(text)["problem"]
        row = await app.state.services.repo.get(approve)
        assert row["waiting"] is not None, "a refused answer leaves the wait as it was"

        done = await send(client, follow_up(waiting, new_data_part({"value": {"approved": False}})))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert {t["id"]: t["result"] for t in outcome(done)["tasks"]}[approve] == {"approved": False}


async def test_text_answers_a_wait_without_a_schema(make_settings: Any) -> None:
    tasks = approval_tree(schema=None)
    approve = tasks[2]["id"]
    async with agent_server(make_settings()) as (url, _app), a2a_client(url, streaming=False) as client:
        asked = await send(client, send_request(tasks))
        data = wait_data(asked)
        assert data["schema"] is None and "or text" in data["next"]
        done = await send(client, follow_up(asked, new_text_part("ship it")))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert {t["id"]: t["result"] for t in outcome(done)["tasks"]}[approve] == "ship it"


async def test_only_the_owner_answers(make_settings: Any) -> None:
    secret = "a2a-wait-secret-" + "x" * 16
    tasks = approval_tree()
    async with agent_server(make_settings({"SERVICE_JWT_SECRET": secret})) as (url, app):
        async def send(user: str, body: dict[str, Any]) -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=30) as http:
                response = await http.post(url + "/", json=body,
                                           headers={"Authorization": f"Bearer {token(user, secret=secret)}"})
            return response.json()

        first = await send("alice", {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
            "parts": [{"kind": "data", "data": {"tasks": tasks}}]}}})
        agent_task = first["result"]
        assert agent_task["status"]["state"] == "input-required"
        answer = {"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": uuid.uuid4().hex, "taskId": agent_task["id"],
            "contextId": agent_task["contextId"], "parts": [{"kind": "data", "data": {"value": {"approved": True}}}]}}}
        refused = await send("mallory", answer)
        assert refused["error"]["code"] == -32001, refused
        assert (await app.state.services.repo.get(tasks[2]["id"]))["waiting"] is not None
        done = await send("alice", answer)
    assert done["result"]["status"]["state"] == "completed", done


async def test_two_waits_at_once_are_answered_one_after_the_other(make_settings: Any) -> None:
    """Two tasks wait in parallel: the oldest is shown; `task_id` beside `value` picks the other;
    after one answer the agent task shows the one still waiting."""
    s = uuid.uuid4().hex[:8]
    ask = {"schemas": {"method": "human_input_executor"}, "inputs": {"prompt": "Which colour?"}}
    tasks = [{"id": f"r-{s}", "name": "root", "schemas": {"method": "aggregate_results_executor"},
              "dependencies": [{"id": f"a-{s}", "required": True}, {"id": f"b-{s}", "required": True}]},
             {"id": f"a-{s}", "name": "a", "parent_id": f"r-{s}", **ask},
             {"id": f"b-{s}", "name": "b", "parent_id": f"r-{s}", **ask}]
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False) as client:
        asked = await send(client, send_request(tasks))
        repo = app.state.services.repo

        async def both_wait() -> bool:
            return all([(await repo.get(t["id"]))["waiting"] is not None for t in tasks[1:]])

        await wait_until(both_wait)
        shown = wait_data(asked)["task_id"]
        other = next(t["id"] for t in tasks[1:] if t["id"] != shown)
        one = await send(client, follow_up(asked, new_data_part({"value": "red", "task_id": other})))
        assert one.status.state == INPUT_REQUIRED
        assert wait_data(one)["task_id"] == shown and "problem" not in wait_data(one)
        done = await send(client, follow_up(one, new_text_part("blue")))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    results = {t["id"]: t["result"] for t in outcome(done)["tasks"]}
    assert results[other] == "red" and results[shown] == "blue"


async def test_an_answer_never_reaches_a_question_not_shown(make_settings: Any) -> None:
    """The wait shown timed out (its default taken) and a later one asks: an answer without
    task_id is not given to the later one; the agent task shows it instead."""
    tasks = approval_tree()
    first, second = tasks[2], dict(tasks[3])
    first["inputs"] = {**first["inputs"], "timeout_seconds": 0.5, "default": {"approved": True}}
    second.update(schemas={"method": "human_input_executor"}, inputs={"prompt": "Send the receipt?"})
    tasks[3] = second
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False) as client:
        asked = await send(client, send_request(tasks))
        assert wait_data(asked)["task_id"] == first["id"]
        repo = app.state.services.repo

        async def second_waits() -> bool:
            return (await repo.get(second["id"]))["waiting"] is not None

        await wait_until(second_waits)
        moved = await send(client, follow_up(asked, new_data_part({"value": {"approved": False}})))
        data = wait_data(moved)
        assert moved.status.state == INPUT_REQUIRED
        assert data["task_id"] == second["id"] and data["prompt"] == "Send the receipt?"
        assert f"task {first['id']} no longer waits" in data["problem"]
        assert (await repo.get(first["id"]))["result"] == {"approved": True}  # its default, untouched
        done = await send(client, follow_up(moved, new_text_part("yes")))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert {t["id"]: t["result"] for t in outcome(done)["tasks"]}[second["id"]] == "yes"


async def test_cancel_ends_the_wait(make_settings: Any) -> None:
    tasks = approval_tree()
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False) as client:
        asked = await send(client, send_request(tasks))
        cancelled = await client.cancel_task(CancelTaskRequest(id=asked.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        row = await app.state.services.repo.get(tasks[2]["id"])
    assert row["status"] == "cancelled" and row["waiting"] is None


async def test_a_wait_answered_elsewhere_settles_the_agent_task(make_settings: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """tasks.respond answers the wait instead of a follow-up: the agent task, read once the tree
    has ended, shows the outcome."""
    monkeypatch.setattr(executor, "SETTLE_AFTER", timedelta(0))
    tasks = approval_tree()
    async with agent_server(make_settings()) as (url, _app), a2a_client(url, streaming=False) as client:
        asked = await send(client, send_request(tasks))
        async with httpx.AsyncClient(timeout=30) as http:
            answer = (await http.post(url + "/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.respond",
                                                            "params": {"task_id": tasks[2]["id"],
                                                                       "value": {"approved": True}}})).json()
        assert answer["result"]["status"] == "resumed", answer

        async def settled() -> bool:
            task = await client.get_task(GetTaskRequest(id=asked.id))
            return task.status.state == TaskState.TASK_STATE_COMPLETED

        await wait_until(settled)


# --- streams and push -----------------------------------------------------------------------------

async def test_streams_show_input_required_then_completed(make_settings: Any) -> None:
    tasks = approval_tree()
    async with agent_server(make_settings()) as (url, _app), a2a_client(url, streaming=True) as client:
        first = await collect(client, send_request(tasks))
        assert first[0].task.status.state == TaskState.TASK_STATE_WORKING
        last = first[-1].status_update
        assert last.status.state == INPUT_REQUIRED
        assert MessageToDict(last.status.message.parts[0].data)["prompt"] == PROMPT
        waiting = await client.get_task(GetTaskRequest(id=first[0].task.id))

        watched: list[StreamResponse] = []

        async def watch() -> None:  # tasks/resubscribe (1.0 SubscribeToTask) of the waiting task
            async for event in client.subscribe(SubscribeToTaskRequest(id=waiting.id)):
                watched.append(event)

        watcher = asyncio.create_task(watch())

        async def subscribed() -> bool:  # the subscription's first event: the task as it is
            return bool(watched)

        await wait_until(subscribed)  # not a fixed 0.3 s, which a loaded machine can overrun
        second = await collect(client, follow_up(waiting, new_data_part({"value": {"approved": True}})))
        await asyncio.wait_for(watcher, EVENT_WAIT)
    states = [e.status_update.status.state for e in second if e.HasField("status_update")]
    assert states[0] == TaskState.TASK_STATE_WORKING and states[-1] == TaskState.TASK_STATE_COMPLETED
    assert any(e.HasField("artifact_update") and e.artifact_update.artifact.name == "task_results" for e in second)
    assert watched[0].task.status.state == INPUT_REQUIRED  # a subscription starts with the task as it is
    watched_states = [e.status_update.status.state for e in watched if e.HasField("status_update")]
    assert watched_states[-1] == TaskState.TASK_STATE_COMPLETED
    assert TaskState.TASK_STATE_WORKING in watched_states


async def test_push_notifications_show_input_required_on_both_wires(make_settings: Any) -> None:
    async with receiver() as rec, agent_server(make_settings()) as (url, _app):
        # 1.0: StreamResponse bodies.
        tasks = approval_tree()
        request = send_request(tasks)
        request.configuration.task_push_notification_config.CopyFrom(
            TaskPushNotificationConfig(url=f"{rec.url}/v1"))
        async with a2a_client(url, streaming=False) as client:
            asked = await send(client, request)
            agent_id = asked.id

            def states(path: str) -> list[str]:
                return [r["json"].get("statusUpdate", {}).get("status", {}).get("state")
                        for r in rec.requests if r["path"] == path]

            async def input_required() -> bool:
                return "TASK_STATE_INPUT_REQUIRED" in states("/v1")

            await wait_until(input_required)
            waiting = await client.get_task(GetTaskRequest(id=agent_id))
            assert waiting.status.state == INPUT_REQUIRED
            (ask,) = [ParseDict(r["json"], StreamResponse()) for r in rec.requests if r["path"] == "/v1"
                      and r["json"].get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_INPUT_REQUIRED"]
            assert MessageToDict(ask.status_update.status.message.parts[0].data)["task_id"] == tasks[2]["id"]
            await collect(client, follow_up(waiting, new_data_part({"value": {"approved": True}})))

            async def completed() -> bool:
                return "TASK_STATE_COMPLETED" in states("/v1")

            await wait_until(completed)
        # 0.3: SPEC.md's payload (lowercase states, final).
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
            "message": {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                        "parts": [{"kind": "data", "data": {"tasks": approval_tree()}}]},
            "configuration": {"pushNotificationConfig": {"url": f"{rec.url}/v03"}}}}
        async with httpx.AsyncClient(timeout=30) as http:
            task = (await http.post(url + "/", json=body)).json()["result"]

            def old(state: str) -> list[dict[str, Any]]:
                return [r["json"] for r in rec.requests if r["path"] == "/v03"
                        and r["json"].get("status", {}).get("state") == state]

            async def asked_old() -> bool:
                return bool(old("input-required"))

            await wait_until(asked_old)
            (payload,) = old("input-required")
            assert payload["final"] is False
            assert payload["status"]["message"]["parts"][0]["data"]["prompt"] == PROMPT
            answer = {"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"message": {
                "kind": "message", "role": "user", "messageId": uuid.uuid4().hex, "taskId": task["id"],
                "contextId": task["contextId"], "parts": [{"kind": "data", "data": {"value": {"approved": True}}}]}}}
            done = (await http.post(url + "/", json=answer)).json()

            async def completed_old() -> bool:
                return bool(old("completed"))

            await wait_until(completed_old)
    assert done["result"]["status"]["state"] in ("working", "completed")
    assert old("completed")[0]["final"] is True


# --- a real process ---------------------------------------------------------------------------------

async def test_end_to_end_through_a_real_service(tmp_path: Path) -> None:
    service = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}"}).start()
    try:
        tasks = approval_tree()
        async with a2a_client(service.url, streaming=False) as client:
            asked = await send(client, send_request(tasks))
            assert asked.status.state == INPUT_REQUIRED
            assert wait_data(asked)["task_id"] == tasks[2]["id"]
            listed = await service.rpc("tasks.list", {"waiting": True})
            assert [t["id"] for t in listed] == [tasks[2]["id"]]
            done = await send(client, follow_up(asked, new_data_part({"value": {"approved": True}})))
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert (await service.task(tasks[0]["id"]))["status"] == "completed"
    finally:
        service.stop()


async def test_kill_9_while_waiting_then_the_answer_completes(tmp_path: Path) -> None:
    """The wait and the agent task are stored: after kill -9 and a restart on the same database,
    the follow-up answers and the tree completes (the agent task is found in the store, the
    execution is resumed by the new process)."""
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}"}
    tasks = approval_tree()
    service = Service(tmp_path, env).start()
    try:
        async with a2a_client(service.url, streaming=False) as client:
            asked = await send(client, send_request(tasks))
        assert asked.status.state == INPUT_REQUIRED
    finally:
        service.kill()
    again = Service(tmp_path, env, "again")
    again.port, again.url = service.port, service.url  # the card's address stays the same
    again.env["SERVICE_API_PORT"] = str(service.port)
    again.start()
    try:
        async with a2a_client(again.url, streaming=True) as client:
            events = await collect(client, follow_up(asked, new_data_part({"value": {"approved": True}})))
        states = [e.status_update.status.state for e in events if e.HasField("status_update")]
        assert states[-1] == TaskState.TASK_STATE_COMPLETED, states
        assert (await again.task(tasks[0]["id"]))["status"] == "completed"
    finally:
        again.stop()


async def test_the_0_3_stream_shows_input_required_and_the_follow_up_streams_to_completed(client: Any) -> None:
    """message/stream in the 0.3 form (SPEC.md's lowercase states) through the ASGI app."""
    tasks = approval_tree(schema={"type": "string"})

    async def stream(message: dict[str, Any]) -> list[dict[str, Any]]:
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": {
            "kind": "message", "role": "user", "messageId": uuid.uuid4().hex, **message}}}
        response = await client.http.post("/", json=body)
        assert response.headers["content-type"].startswith("text/event-stream"), response.text
        return [json.loads(line[len("data: "):])["result"] for line in response.text.splitlines()
                if line.startswith("data: ")]

    first = await stream({"parts": [{"kind": "data", "data": {"tasks": tasks}}]})
    agent_task, last = first[0], first[-1]
    assert last["kind"] == "status-update" and last["status"]["state"] == "input-required"
    parts = last["status"]["message"]["parts"]
    assert parts[0]["data"]["prompt"] == PROMPT and parts[0]["data"]["schema"] == {"type": "string"}
    assert parts[1] == {"kind": "text", "text": PROMPT}
    second = await stream({"taskId": agent_task["id"], "contextId": agent_task["contextId"],
                           "parts": [{"kind": "text", "text": "approved"}]})
    states = [e["status"]["state"] for e in second if e["kind"] == "status-update"]
    assert states[0] == "working" and states[-1] == "completed"
    assert second[-1]["final"] is True
