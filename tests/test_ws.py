"""WebSocket /ws against a real uvicorn server, with the `websockets` client library.

`live_server` (also used by test_graphql.py) runs the app in-process on 127.0.0.1 with a random
port; trees are created over real HTTP on `/tasks`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from websockets.exceptions import InvalidStatus

from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.surfaces.ws import BUFFER_EVENTS
from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT

SECRET = "test-secret-for-live-channels-0123456789"


@dataclass
class Live:
    """A running server: its address, the app's services and an HTTP client."""

    port: int
    http: httpx.AsyncClient
    services: Any

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def rpc(self, method: str, params: Any, headers: dict[str, str] | None = None) -> Any:
        response = await self.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                        "params": params}, headers=headers or {})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert "error" not in answer, answer
        return answer["result"]

    async def wait_status(self, task_id: str, statuses: tuple[str, ...], headers: dict[str, str] | None = None,
                          timeout: float = EVENT_WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            task = await self.rpc("tasks.get", {"task_id": task_id}, headers)
            if task and task["status"] in statuses:
                return task
            assert time.monotonic() < deadline, f"task {task_id} stuck in {task and task['status']}"
            await asyncio.sleep(0.02)


@asynccontextmanager
async def live_server(settings: Settings) -> AsyncIterator[Live]:
    app = build_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    deadline = time.monotonic() + EVENT_WAIT
    while not server.started:
        assert not serving.done(), "uvicorn stopped during start-up"
        assert time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=HEAVY_WORK_TIMEOUT) as http:
            yield Live(port, http, app.state.services)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, EVENT_WAIT)


@pytest.fixture
def live(make_settings: Callable[..., Settings]) -> Callable[..., Any]:
    """`async with live(env={...}) as server:` — tasks.create answers at once unless told otherwise.
    Runs on every storage backend (see conftest)."""

    def start(env: dict[str, str] | None = None) -> Any:
        return live_server(make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", **(env or {})}))

    return start


@pytest.fixture
def live_sqlite(tmp_path: Any) -> Callable[..., Any]:
    """Like `live`, on SQLite only: for protocol tests that storage cannot affect."""

    def start(env: dict[str, str] | None = None) -> Any:
        return live_server(Settings.from_env({"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'live.db'}",
                                              "SERVICE_CREATE_WAIT_TIMEOUT": "0", **(env or {})}))

    return start


def sleep(name: str, seconds: float, *, id_: str | None = None, parent: str | None = None,
          deps: tuple[str, ...] = ()) -> dict[str, Any]:
    task: dict[str, Any] = {"name": name, "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": seconds},
                            "dependencies": [{"id": d, "required": True} for d in deps]}
    if id_:
        task["id"] = id_
    if parent:
        task["parent_id"] = parent
    return task


def gate(event: str, parent: str) -> dict[str, Any]:
    """Task `gate` under `parent`: waits for `event` (events.emit), so a test opens it once its
    subscriptions are in place, not after a time a loaded machine can overrun."""
    return {"id": "gate", "name": "gate", "parent_id": parent, "schemas": {"method": "event_wait_executor"},
            "inputs": {"event": event}}


async def recv(ws: Any, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def send(ws: Any, message: Any) -> None:
    await ws.send(message if isinstance(message, str) else json.dumps(message))


# --- the event sequence -----------------------------------------------------------------------


async def test_two_subscriptions_receive_each_tasks_sequence(live: Callable[..., Any]) -> None:
    """A gate keeps A and B pending while we subscribe; B depends on A, so B starts after A ends.
    The gate opens once both subscriptions have their snapshot: a timed gate (it was a 0.3 s
    sleep) could open first on a loaded machine, and A's snapshot then show it in progress."""
    async with live() as server:
        tree = [
            {"id": "root", "name": "root"},
            gate("ws-sequence-gate", "root"),
            sleep("a", 0.3, id_="a", parent="root", deps=("gate",)),
            sleep("b", 0.2, id_="b", parent="root", deps=("a",)),
        ]
        await server.rpc("tasks.create", {"tasks": tree})
        seen: list[dict[str, Any]] = []
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            for tid in ("a", "b"):
                await send(ws, {"action": "subscribe", "task_id": tid})
                seen.append(await recv(ws))  # its snapshot (checked below)
            await server.rpc("events.emit", {"name": "ws-sequence-gate"})
            finished: set[str] = set()
            while finished != {"a", "b"}:
                message = await recv(ws)
                seen.append(message)
                if message["type"] in ("task_completed", "task_failed"):
                    finished.add(message["task_id"])

    for tid in ("a", "b"):
        mine = [m for m in seen if m["task_id"] == tid]
        assert all(m["context_id"] == "root" for m in mine)
        types = [m["type"] for m in mine]
        # snapshot (pending), started, some progress, completed
        assert types[0] == "task_status" and mine[0]["data"] == {**mine[0]["data"], "status": "pending",
                                                                   "progress": 0.0, "snapshot": True}
        assert types[1] == "task_status" and mine[1]["data"]["status"] == "in_progress"
        assert set(types[2:-1]) == {"task_progress"} and len(types) >= 4
        progress = [m["data"]["progress"] for m in mine[2:-1]]
        assert progress[0] == 0 and mine[2]["data"]["status"] == "in_progress", "the start, as progress"
        progress = progress[1:]
        assert progress == sorted(progress) and all(0 < p <= 1 for p in progress)
        assert all(m["data"]["status"] == "in_progress" for m in mine[2:-1])
        assert types[-1] == "task_completed"
        assert mine[-1]["data"]["status"] == "completed" and mine[-1]["data"]["progress"] == 1.0
        assert mine[-1]["data"]["result"]["slept"] == pytest.approx({"a": 0.3, "b": 0.2}[tid])
    # dependency order, seen live on the one socket
    a_done = next(i for i, m in enumerate(seen) if m["task_id"] == "a" and m["type"] == "task_completed")
    b_start = next(i for i, m in enumerate(seen) if m["task_id"] == "b" and m["data"]["status"] == "in_progress")
    assert a_done < b_start


async def test_failed_and_cancelled_tasks_are_reported_as_task_failed(live: Callable[..., Any]) -> None:
    async with live() as server:
        # The gate opens once both subscriptions have their snapshot (a timed gate could open
        # first on a loaded machine, and bad's failure then arrive before long's snapshot).
        tree = [{"id": "r", "name": "root"}, gate("ws-gate", "r"),
                {**sleep("bad", -1, id_="bad", parent="r", deps=("gate",))},
                sleep("long", 30, id_="long", parent="r", deps=("gate",))]
        await server.rpc("tasks.create", {"tasks": tree})
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            for tid in ("bad", "long"):
                await send(ws, {"action": "subscribe", "task_id": tid})
                assert (await recv(ws))["data"]["snapshot"] is True
            await server.rpc("events.emit", {"name": "ws-gate"})
            message = await recv(ws)
            while not (message["task_id"] == "bad" and message["type"] == "task_failed"):
                message = await recv(ws)
            assert message["data"]["status"] == "failed"
            assert "Input validation failed" in message["data"]["error"]
            message = await recv(ws)
            while not (message["task_id"] == "long" and message["data"]["status"] == "in_progress"):
                message = await recv(ws)
            await server.rpc("tasks.cancel", {"task_ids": ["long"]})
            message = await recv(ws)
            while message["type"] != "task_failed":
                message = await recv(ws)
            assert message["task_id"] == "long"
            assert message["data"]["status"] == "cancelled"


# --- current state at once --------------------------------------------------------------------


async def test_subscribing_to_a_finished_task_answers_its_state_at_once(live: Callable[..., Any]) -> None:
    async with live() as server:
        await server.rpc("tasks.create", {"tasks": [{"id": "ok", "name": "ok", "schemas": {"method": "noop_executor"},
                                                     "inputs": {"x": 1}}]})
        await server.rpc("tasks.create", {"tasks": [sleep("bad", -1, id_="bad")]})
        await server.wait_status("ok", ("completed",))
        await server.wait_status("bad", ("failed",))
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            await send(ws, {"action": "subscribe", "task_id": "ok"})
            done = await recv(ws)
            assert done["type"] == "task_completed" and done["task_id"] == "ok" and done["context_id"] == "ok"
            assert done["data"]["status"] == "completed" and done["data"]["progress"] == 1.0
            assert done["data"]["result"] == {"ok": True, "inputs": {"x": 1}}
            await send(ws, {"action": "subscribe", "task_id": "bad"})
            failed = await recv(ws)
            assert failed["type"] == "task_failed" and failed["data"]["status"] == "failed"
            assert failed["data"]["error"]


async def test_subscribing_to_a_running_task_starts_with_in_progress(live: Callable[..., Any]) -> None:
    async with live() as server:
        await server.rpc("tasks.create", {"tasks": [sleep("slow", 0.6, id_="slow")]})
        await server.wait_status("slow", ("in_progress",))
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            await send(ws, {"action": "subscribe", "task_id": "slow"})
            first = await recv(ws)
            assert first["type"] == "task_status" and first["data"]["status"] == "in_progress"
            message = await recv(ws)
            while message["type"] == "task_progress":
                assert message["data"]["progress"] >= first["data"]["progress"]
                message = await recv(ws)
            assert message["type"] == "task_completed"


# --- protocol hygiene -------------------------------------------------------------------------


BAD_MESSAGES = [
    ("this is not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"action": "dance", "task_id": "x"}), "Unknown action 'dance'"),
    (json.dumps({"task_id": "x"}), "Unknown action None"),
    (json.dumps({"action": "subscribe"}), "'subscribe' needs a 'task_id'"),
    (json.dumps({"action": "unsubscribe", "task_id": ""}), "'unsubscribe' needs a 'task_id'"),
    (json.dumps({"action": "subscribe", "task_id": 7}), "'subscribe' needs a 'task_id'"),
]


async def test_bad_messages_get_an_error_and_the_connection_stays_usable(live_sqlite: Callable[..., Any]) -> None:
    async with live_sqlite() as server, websockets.connect(f"{server.ws_url}/ws") as ws:
        for bad, phrase in BAD_MESSAGES:
            await send(ws, bad)
            error = await recv(ws)
            assert error["type"] == "error" and phrase in error["message"], (bad, error)
            await send(ws, {"action": "ping"})
            assert (await recv(ws))["type"] == "pong"


async def test_ping_pong_binary_frames_and_unknown_tasks(live_sqlite: Callable[..., Any]) -> None:
    async with live_sqlite() as server, websockets.connect(f"{server.ws_url}/ws") as ws:
        await send(ws, {"action": "ping", "task_id": "whatever"})
        pong = await recv(ws)
        assert pong["type"] == "pong" and pong["task_id"] == "whatever" and pong["data"]["timestamp"]
        await ws.send(json.dumps({"action": "ping"}).encode())  # a binary frame holding JSON
        assert (await recv(ws))["type"] == "pong"
        await send(ws, {"action": "subscribe", "task_id": "ghost"})
        error = await recv(ws)
        assert error["type"] == "error" and error["task_id"] == "ghost"
        assert error["message"] == "Task 'ghost' not found" and error["data"]["code"] == -32602
        await send(ws, {"action": "unsubscribe", "task_id": "ghost"})
        error = await recv(ws)
        assert error["type"] == "error" and "Not subscribed" in error["message"]


async def test_unsubscribe_stops_the_events(live: Callable[..., Any]) -> None:
    async with live() as server:
        await server.rpc("tasks.create", {"tasks": [sleep("slow", 0.4, id_="slow")]})
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            await send(ws, {"action": "subscribe", "task_id": "slow"})
            assert (await recv(ws))["data"]["snapshot"] is True
            await send(ws, {"action": "unsubscribe", "task_id": "slow"})
            await send(ws, {"action": "ping"})
            message = await recv(ws)
            while message["type"] != "pong":  # events sent before the unsubscribe took effect
                assert message["task_id"] == "slow"
                message = await recv(ws)
            await server.wait_status("slow", ("completed",))
            await send(ws, {"action": "ping"})
            assert (await recv(ws))["type"] == "pong"  # nothing about "slow" came in between


async def test_one_bounded_bus_subscription_per_connection(live_sqlite: Callable[..., Any]) -> None:
    """A client that reads nothing costs one bounded queue; publishing never waits for it."""
    async with live_sqlite() as server:
        bus = server.services.bus
        await server.rpc("tasks.create", {"tasks": [{"id": "t", "name": "t"}]})
        await server.wait_status("t", ("completed",))
        baseline = bus.subscriber_count
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            await send(ws, {"action": "subscribe", "task_id": "t"})
            assert (await recv(ws))["type"] == "task_completed"
            assert bus.subscriber_count == baseline + 1
            started = time.monotonic()
            for i in range(20_000):
                bus.publish({"type": "progress", "task_id": "t", "root_task_id": "t", "status": "in_progress",
                             "progress": i / 20_000, "timestamp": "now"})
            assert time.monotonic() - started < 2.0
            sizes = [sub.queue.qsize() for sub in bus._subscribers]
            assert max(sizes) <= BUFFER_EVENTS
            # the client catches up on what is left, then the socket still answers
            await send(ws, {"action": "ping"})
            received = 0
            while (await recv(ws))["type"] != "pong":
                received += 1
            assert received <= BUFFER_EVENTS + 1
        deadline = time.monotonic() + EVENT_WAIT
        while bus.subscriber_count != baseline:
            assert time.monotonic() < deadline, "the connection's bus subscription leaked"
            await asyncio.sleep(0.02)


# --- authentication and permissions ---------------------------------------------------------


async def test_jwt_handshake_and_permissions(live: Callable[..., Any]) -> None:
    async with live({"SERVICE_JWT_SECRET": SECRET}) as server:
        settings = server.services.settings
        alice = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        bob = {"Authorization": f"Bearer {mint_token(settings, 'bob')}"}
        await server.rpc("tasks.create", {"tasks": [{"id": "mine", "name": "mine"}]}, alice)
        await server.wait_status("mine", ("completed",), alice)

        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            with pytest.raises(InvalidStatus) as refused:
                async with websockets.connect(f"{server.ws_url}/ws", additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401
            body = json.loads(refused.value.response.body)
            assert body["error"]["code"] == -32001

        async with websockets.connect(f"{server.ws_url}/ws", additional_headers=bob) as ws:
            await send(ws, {"action": "subscribe", "task_id": "mine"})
            error = await recv(ws)
            assert error["type"] == "error" and error["data"]["code"] == -32001
            await send(ws, {"action": "ping"})
            assert (await recv(ws))["type"] == "pong"
        async with websockets.connect(f"{server.ws_url}/ws", additional_headers=alice) as ws:
            await send(ws, {"action": "subscribe", "task_id": "mine"})
            assert (await recv(ws))["type"] == "task_completed"


async def test_a_run_of_two_system_info_tasks_shows_task_progress(live: Callable[..., Any]) -> None:
    """Issue 14: executors that report no progress of their own still send `task_progress` at start."""
    from taskgrove.agent.foundations.auth import ANONYMOUS

    async with live() as server:
        await server.services.tasks.create_tree(NewTree.from_params([
            {"id": "root", "name": "root", "dependencies": [{"id": "i1"}, {"id": "i2"}]},
            {"id": "i1", "name": "i1", "parent_id": "root", "schemas": {"method": "system_info_executor"},
             "inputs": {"resource": "cpu"}},
            {"id": "i2", "name": "i2", "parent_id": "root", "schemas": {"method": "system_info_executor"},
             "inputs": {"resource": "memory"}}]), ANONYMOUS)
        async with websockets.connect(f"{server.ws_url}/ws") as ws:
            for tid in ("i1", "i2"):
                await ws.send(json.dumps({"action": "subscribe", "task_id": tid}))
            seen: list[dict[str, Any]] = []
            for _ in range(2):
                seen.append(await recv(ws))  # the two snapshots
            await server.rpc("tasks.execute", {"task_id": "root"})
            while sum(m["type"] == "task_completed" for m in seen) < 2:
                seen.append(await recv(ws))
    for tid in ("i1", "i2"):
        kinds = [m["type"] for m in seen if m["task_id"] == tid]
        assert "task_progress" in kinds, kinds
        assert kinds.index("task_progress") < kinds.index("task_completed")
