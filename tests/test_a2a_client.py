"""The agent surface driven by the official a2a-sdk client against a real uvicorn server.

Card resolution, blocking and streaming sends (A2A 1.0, and 0.3 through the SDK's compat client),
push notifications to a local receiver, cancel of a running tree, and reading an agent task back
after the server restarted on the same database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_data_part
from a2a.types.a2a_pb2 import (
    AgentCard,
    AuthenticationInfo,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT
from tests.servers import free_port, receiver, serve
from tests.test_a2a_wire import tree


@asynccontextmanager
async def agent_server(settings: Settings) -> AsyncIterator[tuple[str, Starlette]]:
    """The service on a random port, its card url set to the real address."""
    port = free_port()
    app = build_app(settings.with_(public_url=f"http://127.0.0.1:{port}"))
    async with serve(app, port) as url:
        yield url, app


@asynccontextmanager
async def a2a_client(url: str, *, streaming: bool, polling: bool = False,
                     card: AgentCard | None = None) -> AsyncIterator[Client]:
    # HEAVY_WORK_TIMEOUT: a send may plan a tree with the LLM (its first call imports litellm), slow on a busy
    # machine (issue 46, item 6)
    async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        factory = ClientFactory(ClientConfig(streaming=streaming, polling=polling, httpx_client=http))
        client = factory.create(card) if card is not None else await factory.create_from_url(url)
        try:
            yield client
        finally:
            await client.close()


def send_request(tasks: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[new_data_part({"tasks": tasks})])
    if metadata:
        message.metadata.update(metadata)
    return SendMessageRequest(message=message)


def run_summary(task_or_status: Any) -> dict[str, Any]:
    """The data part of a status message, whole numbers back as ints."""
    data = MessageToDict(task_or_status.message.parts[0].data)
    return {k: int(v) if k == "task_count" else v for k, v in data.items()}


async def collect(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [event async for event in client.send_message(request)]


async def wait_until(check: Callable[[], Any], timeout: float = EVENT_WAIT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


# --- discovery --------------------------------------------------------------------------------

async def test_card_resolves_on_both_paths_for_the_official_client(make_settings: Any) -> None:
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        resolver = A2ACardResolver(http, url)
        cards = [await resolver.get_agent_card(),
                 await resolver.get_agent_card(relative_card_path="/.well-known/agent-card")]
    assert cards[0] == cards[1]
    card = cards[0]
    assert card.version == "0.1.0"
    assert {(i.protocol_version, i.url, i.protocol_binding) for i in card.supported_interfaces} == \
        {("1.0", url, "JSONRPC"), ("0.3", url, "JSONRPC"), ("1.0", url + "/a2a", "HTTP+JSON")}
    assert card.capabilities.streaming and card.capabilities.push_notifications
    assert [s.id for s in card.skills] == ["tasks.execute"]


# --- sends ------------------------------------------------------------------------------------

async def test_blocking_send_returns_the_finished_tree(make_settings: Any) -> None:
    tasks = tree()
    root_id = tasks[0]["id"]
    async with agent_server(make_settings()) as (url, _app), a2a_client(url, streaming=False) as client:
        (response,) = await collect(client, send_request(tasks))
    task = response.task
    assert task.context_id == root_id
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert run_summary(task.status) == {"protocol": "a2a", "status": "completed", "progress": 1.0,
                                        "root_task_id": root_id, "task_count": 3}
    assert MessageToDict(task.metadata) == {"protocol": "a2a", "root_task_id": root_id}
    results = MessageToDict(task.artifacts[0].parts[0].data)
    assert {t["name"]: t["status"] for t in results["tasks"]} == \
        {"root": "completed", "child-a": "completed", "child-b": "completed"}


async def test_streaming_send_reports_progress_and_ends_final(make_settings: Any) -> None:
    # Status updates are sent at most every STATUS_INTERVAL (0.1 s), the events between coalesced:
    # the sleep lasts long enough for three updates even when the loop stalls for a few tenths of
    # a second (with 0.3 s, one such stall under load left two; so does 0.3 s with a 0.25 s interval).
    tasks = tree(seconds=1.0)
    async with agent_server(make_settings()) as (url, _app), a2a_client(url, streaming=True) as client:
        events = await collect(client, send_request(tasks))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    updates = [e.status_update for e in events if e.HasField("status_update")]
    working = [u for u in updates if u.status.state == TaskState.TASK_STATE_WORKING]
    assert len(working) >= 3  # task starts, sleep progress, completions
    assert all(run_summary(u.status)["status"] == "in_progress" for u in working)
    assert [run_summary(u.status)["progress"] for u in working] == \
        sorted(run_summary(u.status)["progress"] for u in working)
    assert kinds[-1] == "status_update" and kinds[-2] == "artifact_update"
    assert updates[-1].status.state == TaskState.TASK_STATE_COMPLETED
    assert run_summary(updates[-1].status)["status"] == "completed"


async def test_the_0_3_wire_format_through_the_official_compat_client(make_settings: Any) -> None:
    async with agent_server(make_settings()) as (url, _app), httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
    legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(legacy)  # a card as a 0.3-only agent would show it
    async with agent_server(make_settings()) as (url, _app):
        card.supported_interfaces[0].url = url
        async with a2a_client(url, streaming=False, card=card) as client:
            (blocking,) = await collect(client, send_request(tree()))
        async with a2a_client(url, streaming=True, card=card) as client:
            streamed = await collect(client, send_request(tree(seconds=0.2)))
    assert blocking.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert streamed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert len(streamed) >= 4


# --- push notifications -----------------------------------------------------------------------

async def test_push_notifications_of_a_10_request_are_stream_responses(make_settings: Any) -> None:
    """A 1.0 client's push config gets 1.0 bodies (StreamResponse, ProtoJSON) with its headers and method."""
    tasks = tree(seconds=0.2)
    root_id = tasks[0]["id"]
    async with receiver() as rec, agent_server(make_settings()) as (url, _app):
        request = send_request(tasks, metadata={"push_notification_config": {
            "headers": {"X-Custom": "yes"}, "method": "PUT"}})
        request.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(
            url=f"{rec.url}/a2a/events", token="tok-42",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="cred-7")))
        async with a2a_client(url, streaming=False) as client:
            (response,) = await collect(client, request)
            immediate = response.task
            assert immediate.status.state == TaskState.TASK_STATE_WORKING
            assert run_summary(immediate.status) == {"protocol": "a2a", "status": "in_progress", "progress": 0.0,
                                                     "root_task_id": root_id, "task_count": 3}
            await rec.wait_for(lambda reqs: any(
                r["json"].get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
                for r in reqs))
            stored = await client.get_task(GetTaskRequest(id=immediate.id))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    events = []
    for sent in rec.requests:
        assert sent["method"] == "PUT" and sent["path"] == "/a2a/events"
        assert sent["headers"]["x-custom"] == "yes"
        assert sent["headers"]["authorization"] == "Bearer cred-7"
        assert sent["headers"]["x-a2a-notification-token"] == "tok-42"
        (kind,) = sent["json"].keys()
        assert kind in ("task", "statusUpdate", "artifactUpdate"), sent["json"]
        events.append(ParseDict(sent["json"], StreamResponse()))  # what a 1.0 receiver does
    updates = [e.status_update for e in events if e.HasField("status_update")]
    assert updates[-1].status.state == TaskState.TASK_STATE_COMPLETED
    assert updates[-1].task_id == immediate.id and updates[-1].context_id == root_id
    assert run_summary(updates[-1].status)["status"] == "completed"
    assert events[-1].HasField("status_update"), "the terminal status comes last"
    (artifact,) = [e.artifact_update for e in events if e.HasField("artifact_update")]
    outcome = MessageToDict(artifact.artifact.parts[0].data)
    assert outcome["root_task_id"] == root_id and outcome["status"] == "completed"
    assert {t["id"] for t in outcome["tasks"]} == {t["id"] for t in tasks}


async def test_push_notifications_of_a_03_request_keep_the_spec_shape(make_settings: Any) -> None:
    """A 0.3 client's push config gets SPEC.md's payload: kind, lowercase states, final."""
    tasks = tree(seconds=0.2)
    root_id = tasks[0]["id"]
    async with receiver() as rec, agent_server(make_settings()) as (url, _app):
        body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
            "message": {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex,
                        "parts": [{"kind": "data", "data": {"tasks": tasks}}]},
            "configuration": {"pushNotificationConfig": {"url": f"{rec.url}/hook", "token": "t-3",
                                                         "headers": {"X-Custom": "yes"}}}}}
        async with httpx.AsyncClient(timeout=30) as http:
            answer = (await http.post(url + "/", json=body)).json()["result"]
        assert answer["status"]["state"] == "working"
        await rec.wait_for(lambda reqs: any(r["json"].get("final") for r in reqs))
    payloads = [r["json"] for r in rec.requests]
    assert all(r["headers"]["x-custom"] == "yes" and r["headers"]["x-a2a-notification-token"] == "t-3"
               for r in rec.requests)
    assert [p["final"] for p in payloads] == [False] * (len(payloads) - 1) + [True]
    statuses = [p for p in payloads if p["kind"] == "status-update"]
    assert statuses[0]["status"]["state"] == "working" and statuses[-1]["status"]["state"] == "completed"
    for p in statuses:
        assert p["task_id"] == answer["id"] and p["context_id"] == root_id
        (part,) = p["status"]["message"]["parts"]
        assert part["kind"] == "data" and part["data"]["root_task_id"] == root_id
    (artifact,) = [p for p in payloads if p["kind"] == "artifact-update"]
    assert artifact["artifact"]["parts"][0]["data"]["status"] == "completed"


# --- cancel -----------------------------------------------------------------------------------

async def test_cancel_stops_a_running_tree(make_settings: Any) -> None:
    tasks = tree(seconds=60)
    root_id, sleeper = tasks[0]["id"], tasks[2]["id"]
    async with agent_server(make_settings()) as (url, app), a2a_client(url, streaming=False, polling=True) as client:
        services = app.state.services
        (response,) = await collect(client, send_request(tasks))
        running = response.task
        assert running.status.state == TaskState.TASK_STATE_WORKING

        async def sleeping() -> bool:
            return sleeper in services.engine.running

        await wait_until(sleeping)
        cancelled = await client.cancel_task(CancelTaskRequest(id=running.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        assert run_summary(cancelled.status)["status"] == "cancelled"
        rows = {row["id"]: row for row in await services.repo.tree(root_id)}
        assert {tid: row["status"] for tid, row in rows.items()} == \
            {root_id: "cancelled", tasks[1]["id"]: "completed", sleeper: "cancelled"}
        partial = rows[sleeper]["result"]  # the sleep executor's cancel hook: how far it got
        assert partial["cancelled"] is True and partial["slept"] < 60
        assert not set(rows) & set(services.engine.running)  # the sleep coroutine was stopped
        again = await client.get_task(GetTaskRequest(id=running.id))
    assert again.status.state == TaskState.TASK_STATE_CANCELED


# --- persistence ------------------------------------------------------------------------------

async def test_agent_task_is_read_back_after_a_restart(make_settings: Any) -> None:
    settings = make_settings()
    tasks = tree()
    async with agent_server(settings) as (url, _app), a2a_client(url, streaming=False) as client:
        (response,) = await collect(client, send_request(tasks))
    finished: Task = response.task
    async with agent_server(settings) as (url, _app), a2a_client(url, streaming=False) as client:
        again = await client.get_task(GetTaskRequest(id=finished.id))
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert again.context_id == tasks[0]["id"]
    assert again.artifacts == finished.artifacts
    assert MessageToDict(again.metadata) == MessageToDict(finished.metadata)
