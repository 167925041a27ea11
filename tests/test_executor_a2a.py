"""a2a_agent_executor driving a second taskgrove *process* over A2A with the official client.

The remote agent is a real `taskgrove serve` on a free port with its own SQLite file; the local
service is the in-process app (`app_factory`). A tree in the local service runs a tree in the
remote one and gets its results; cancelling the local task cancels the remote tree; the SSRF
guard, remote failures, timeouts, bearer headers and non-blocking sends are covered too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import EVENT_WAIT
from tests.processes import Service
from tests.servers import free_port


# One worker runs this module (make test's --dist loadgroup): its module-scoped services are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_executor_a2a")

JWT_SECRET = "a2a-executor-test-secret-of-forty-bytes!!"


Remote = Service  # a `taskgrove serve` process the local service talks A2A to


def _start_remote(tmp: Path, extra_env: dict[str, str] | None = None) -> Remote:
    return Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}", **(extra_env or {})},
                   "remote").start()


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    service = _start_remote(tmp_path_factory.mktemp("remote"))
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def jwt_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    service = _start_remote(tmp_path_factory.mktemp("jwt-remote"), {"SERVICE_JWT_SECRET": JWT_SECRET})
    service.token = mint_token(Settings.from_env({"SERVICE_JWT_SECRET": JWT_SECRET}), "alice", [], 3600)
    try:
        yield service
    finally:
        service.stop()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def remote_tree(seconds: float = 0.3) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """root (aggregate) <- two noops and a sleep, as the data part's `tasks`."""
    ids = {"root": _id("r-root"), "a": _id("r-a"), "b": _id("r-b"), "sleep": _id("r-sleep")}
    tasks = [
        {"id": ids["root"], "name": "remote root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": ids["a"], "required": True}, {"id": ids["b"], "required": True},
                          {"id": ids["sleep"], "required": True}]},
        {"id": ids["a"], "name": "remote a", "parent_id": ids["root"], "schemas": {"method": "noop_executor"},
         "inputs": {"word": "alpha"}},
        {"id": ids["b"], "name": "remote b", "parent_id": ids["root"], "schemas": {"method": "noop_executor"},
         "inputs": {"word": "beta", "n": 2}},
        {"id": ids["sleep"], "name": "remote sleep", "parent_id": ids["root"],
         "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": seconds}},
    ]
    return tasks, ids


def a2a_task(task_id: str, inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "name": "ask the remote agent", "schemas": {"method": "a2a_agent_executor"},
            "inputs": inputs, **extra}


def progress_events(client: Any, task_id: str) -> Any:
    return client.services.bus.subscribe(lambda e: e["task_id"] == task_id and e["type"] == "progress")


# --- a tree here runs a tree there --------------------------------------------------------------

@pytest.mark.parametrize("mode", ["streaming", "polling"])
async def test_local_tree_runs_a_remote_tree_and_gets_its_results(
        remote: Remote, app_factory: Any, mode: str) -> None:
    tasks, ids = remote_tree()
    local_root, local_a2a = _id("root"), _id("ask")
    # The card URL form in one mode, the base URL in the other.
    agent_url = remote.url if mode == "streaming" else f"{remote.url}/.well-known/agent-card.json"
    # Polling reads the stored remote task: taskgrove records intermediate states there only
    # when the message asks for every event (metadata.stream).
    extra = {} if mode == "streaming" else {"metadata": {"stream": True}}
    async with app_factory() as client:
        with progress_events(client, local_a2a) as progress:
            tree = await client.result("tasks.create", [
                {"id": local_root, "name": "orchestrate", "schemas": {"method": "aggregate_results_executor"},
                 "dependencies": [{"id": local_a2a, "required": True}]},
                a2a_task(local_a2a, {"agent_url": agent_url, "data": {"tasks": tasks},
                                     "streaming": mode == "streaming", "poll_interval": 0.1, **extra},
                         parent_id=local_root),
            ])
            relayed = []
            while not progress.queue.empty():
                relayed.append(progress.queue.get_nowait())
        assert tree["status"] == "completed", tree
        (child,) = tree["children"]
        assert child["status"] == "completed" and child["progress"] == 1.0
        result = child["result"]
        assert tree["result"] == {"results": {local_a2a: result}, "count": 1}

    assert result["state"] == "completed"
    assert result["agent_name"] and result["agent_url"] == agent_url
    assert result["remote_context_id"] == ids["root"]  # a taskgrove agent's context id is the tree root
    assert result["remote_task_id"] and result["remote_task_id"] != ids["root"]
    assert result["status_data"] == {"protocol": "a2a", "status": "completed", "progress": 1.0,
                                     "root_task_id": ids["root"], "task_count": 4}
    (artifact,) = result["artifacts"]
    assert artifact["name"] == "task_results"
    (part,) = artifact["parts"]
    assert part["kind"] == "data"
    summary = part["data"]
    assert summary["status"] == "completed" and summary["task_count"] == 4  # ints, not 4.0
    by_id = {t["id"]: t for t in summary["tasks"]}
    assert {tid: t["status"] for tid, t in by_id.items()} == {tid: "completed" for tid in ids.values()}
    assert by_id[ids["b"]]["result"] == {"ok": True, "inputs": {"word": "beta", "n": 2}}
    assert by_id[ids["sleep"]]["result"] == {"slept": 0.3}
    remote_results = by_id[ids["root"]]["result"]
    assert remote_results["count"] == 3
    assert remote_results["results"][ids["a"]] == {"ok": True, "inputs": {"word": "alpha"}}

    # The remote service really ran it: its own /tasks shows the same tree, finished.
    stored = await remote.task(ids["root"])
    assert stored["status"] == "completed" and stored["result"] == remote_results

    # The remote progress was relayed as this task's progress, rising to the end.
    values = [e["progress"] for e in relayed]
    assert len(values) >= 2, relayed
    assert values == sorted(values) and values[-1] == 1.0
    assert 0.0 < max(v for v in values if v < 1.0) < 1.0  # an intermediate value, not only start/end
    assert relayed[0]["message"].endswith("started") and relayed[0]["progress"] == 0.0  # our own start
    assert all(e["message"].startswith("remote agent:") for e in relayed[1:])


async def test_refused_message_and_unreachable_agent_fail_the_task(remote: Remote, app_factory: Any) -> None:
    """The remote's JSON-RPC error (here: a cycle in the tree) becomes this task's error."""
    a, b = _id("a"), _id("b")
    cyclic = [{"id": a, "name": "a", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": b}]},
              {"id": b, "name": "b", "parent_id": a, "schemas": {"method": "noop_executor"},
               "dependencies": [{"id": a}]}]
    async with app_factory() as client:
        tree = await client.result("tasks.create", [
            a2a_task(_id("bad"), {"agent_url": remote.url, "data": {"tasks": cyclic}})])
        dead = await client.result("tasks.create", [
            a2a_task(_id("dead"), {"agent_url": f"http://127.0.0.1:{free_port()}", "message": "hello"})])
    assert tree["status"] == "failed"
    assert tree["error"].startswith(f"A2A error sending the message to {remote.url}: ")
    assert "ircular" in tree["error"], tree["error"]
    assert await remote.task(a) is None  # nothing was created there
    assert dead["status"] == "failed"
    assert dead["error"].startswith("A2A error fetching the agent card of http://127.0.0.1:")


# --- cancel propagates --------------------------------------------------------------------------

@pytest.mark.parametrize("streaming", [True, False])
async def test_cancelling_the_local_task_cancels_the_remote_tree(
        remote: Remote, app_factory: Any, streaming: bool) -> None:
    tasks, ids = remote_tree(seconds=60)
    local = _id("ask")
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        started = time.monotonic()
        await client.result("tasks.create", [a2a_task(local, {
            "agent_url": remote.url, "data": {"tasks": tasks}, "streaming": streaming, "poll_interval": 0.1})])
        await remote.wait_status(ids["sleep"], ("in_progress",))
        await client.wait_status(local, ("in_progress",))

        (answer,) = await client.result("tasks.cancel", {"task_ids": [local]})
        assert answer["status"] == "cancelled", answer
        partial = answer["result"]
        assert partial["cancelled"] is True
        assert partial["state"] == "canceled"  # the remote agent confirmed the cancel
        assert partial["remote_context_id"] == ids["root"] and partial["remote_task_id"]

        row = await client.wait_status(local, ("cancelled",))
        assert row["result"] == partial
        assert local not in client.services.engine.running  # the executor's coroutine is gone
        await asyncio.sleep(0.3)
        assert (await client.result("tasks.get", {"task_id": local}))["status"] == "cancelled"  # no late overwrite

    # The remote tree ends cancelled: the running sleep and the root that waited for it.
    sleeper = await remote.wait_status(ids["sleep"], ("cancelled", "completed", "failed"))
    root = await remote.wait_status(ids["root"], ("cancelled", "completed", "failed"))
    assert sleeper["status"] == "cancelled" and root["status"] == "cancelled"
    assert sleeper["result"]["cancelled"] is True and sleeper["result"]["slept"] < 60
    assert (await remote.task(ids["a"]))["status"] == "completed"
    assert time.monotonic() - started < 20


async def test_stopping_the_local_service_cancels_the_remote_tree(remote: Remote, app_factory: Any) -> None:
    """A shutdown cancels the executor's coroutine without cancel(): the remote task is not orphaned."""
    tasks, ids = remote_tree(seconds=60)
    local = _id("ask")
    async with app_factory(env={"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [a2a_task(local, {"agent_url": remote.url, "data": {"tasks": tasks}})])
        await remote.wait_status(ids["sleep"], ("in_progress",))
    assert (await remote.wait_status(ids["sleep"], ("cancelled", "completed", "failed")))["status"] == "cancelled"


async def test_timeout_cancels_the_remote_task(remote: Remote, app_factory: Any) -> None:
    tasks, ids = remote_tree(seconds=60)
    async with app_factory() as client:
        tree = await client.result("tasks.create", [
            a2a_task(_id("slow"), {"agent_url": remote.url, "data": {"tasks": tasks}, "timeout": 1.5})])
    assert tree["status"] == "failed"
    assert "did not finish within 1.5s; its task" in tree["error"] and "was cancelled" in tree["error"]
    assert (await remote.wait_status(ids["sleep"], ("cancelled",)))["status"] == "cancelled"


# --- refusals and failures ----------------------------------------------------------------------

async def test_private_agent_url_is_refused_without_the_override(remote: Remote, app_factory: Any) -> None:
    tasks, ids = remote_tree()
    async with app_factory(env={"SERVICE_ALLOW_PRIVATE_URLS": "false"}) as client:
        tree = await client.result("tasks.create", [
            a2a_task(_id("ssrf"), {"agent_url": remote.url, "data": {"tasks": tasks}})])
        scheme = await client.result("tasks.create", [
            a2a_task(_id("file"), {"agent_url": "file:///etc/passwd", "message": "hi"})])
    assert tree["status"] == "failed"
    assert "refusing to connect to 127.0.0.1: loopback address" in tree["error"]
    assert "SERVICE_ALLOW_PRIVATE_URLS=true" in tree["error"]
    assert await remote.task(ids["root"]) is None  # no request reached the remote agent
    assert scheme["status"] == "failed" and "scheme 'file' is not allowed" in scheme["error"]


async def test_remote_failure_fails_the_local_task_with_the_remote_message(remote: Remote, app_factory: Any) -> None:
    r_root, r_cmd = _id("r-root"), _id("r-cmd")
    failing = [
        {"id": r_root, "name": "remote root", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": r_cmd, "required": True}]},
        {"id": r_cmd, "name": "list files", "parent_id": r_root, "schemas": {"method": "command_executor"},
         "inputs": {"command": "ls"}},
    ]
    root, ask = _id("root"), _id("ask")
    async with app_factory() as client:
        tree = await client.result("tasks.create", [
            {"id": root, "name": "after", "schemas": {"method": "noop_executor"},
             "dependencies": [{"id": ask, "required": True}]},
            a2a_task(ask, {"agent_url": remote.url, "data": {"tasks": failing}}, parent_id=root),
        ])
    (child,) = tree["children"]
    assert child["status"] == "failed"
    assert child["error"].startswith("remote A2A task ") and " ended failed: list files: " in child["error"]
    assert "command_executor is disabled" in child["error"] and "SERVICE_COMMAND_ALLOWLIST" in child["error"]
    assert tree["status"] == "pending"  # a failed task's dependents do not run
    assert (await remote.task(r_cmd))["status"] == "failed"


# --- headers and non-blocking sends -------------------------------------------------------------

async def test_headers_carry_the_remote_agents_credentials(jwt_remote: Remote, app_factory: Any) -> None:
    tasks, ids = remote_tree(seconds=0)
    async with app_factory() as client:
        refused = await client.result("tasks.create", [
            a2a_task(_id("anon"), {"agent_url": jwt_remote.url, "data": {"tasks": remote_tree()[0]}})])
        allowed = await client.result("tasks.create", [a2a_task(_id("alice"), {
            "agent_url": jwt_remote.url, "data": {"tasks": tasks},
            "headers": {"Authorization": f"Bearer {jwt_remote.token}"}})])
    assert refused["status"] == "failed"
    assert refused["error"] == (f"A2A error sending the message to {jwt_remote.url}: HTTP Error 401: "
                                f"Client error '401 Unauthorized' for url '{jwt_remote.url}'")
    assert allowed["status"] == "completed", allowed
    assert allowed["result"]["state"] == "completed"
    assert "Bearer" not in str(allowed["result"])  # credentials are not echoed into the result
    stored = await jwt_remote.task(ids["root"])
    assert stored["status"] == "completed" and stored["user_id"] == "alice"


async def test_non_blocking_send_returns_once_the_remote_accepted(remote: Remote, app_factory: Any) -> None:
    tasks, ids = remote_tree(seconds=1.0)
    async with app_factory() as client:
        tree = await client.result("tasks.create", [a2a_task(_id("fire"), {
            "agent_url": remote.url, "data": {"tasks": tasks}, "blocking": False})])
    assert tree["status"] == "completed", tree
    result = tree["result"]
    assert result["state"] == "working" and result["artifacts"] == []
    assert result["remote_context_id"] == ids["root"] and result["remote_task_id"]
    assert result["status_data"]["status"] == "in_progress"
    # The remote tree goes on by itself.
    assert (await remote.wait_status(ids["root"], ("completed",)))["status"] == "completed"


def test_the_message_id_is_the_same_for_each_re_run_of_an_interrupted_attempt_only() -> None:
    from taskgrove.executors.a2a_remote import message_id
    from taskgrove.executors.base import ExecutionContext

    def ctx(**kw: Any) -> ExecutionContext:
        return ExecutionContext(task_id="ask", task={}, settings=Settings.from_env({}), **kw)

    cut_off = message_id(ctx(execution_id="e1", attempt=1))
    assert message_id(ctx(execution_id="e1", attempt=1, interruptions=1)) == cut_off  # its re-run
    assert message_id(ctx(execution_id="e1", attempt=2)) != cut_off  # a retry: a new request
    assert message_id(ctx(execution_id="e2", attempt=1)) != cut_off  # executed again by a person
    assert len(cut_off) == 32 and int(cut_off, 16) >= 0


async def test_a_message_sent_again_by_a_later_attempt_joins_the_remote_tree(remote: Remote, app_factory: Any) -> None:
    """An attempt cut off after it sent the message and before it stored the remote task id (a
    lost lease) leaves its next attempt nothing to reattach to: it sends the same tree again. The
    remote taskgrove joins the tree the first send created instead of refusing its ids, so the
    platform's fault fails nothing. Local tasks sending the same tree stand for the attempts: one
    sends while the remote tree runs, one after it ended; the remote tree runs once."""
    tasks, ids = remote_tree(seconds=1.0)
    inputs = {"agent_url": remote.url, "data": {"tasks": tasks}}
    first, second, third = _id("ask"), _id("ask"), _id("ask")
    async with app_factory() as client:
        sending = asyncio.create_task(client.result("tasks.create", [a2a_task(first, inputs)]))
        started = await remote.wait_status(ids["sleep"], ("in_progress",))
        again = await client.result("tasks.create", [a2a_task(second, inputs)])
        done = await sending
        late = await client.result("tasks.create", [a2a_task(third, inputs)])
        keys = {tid: f"{tid}:{(await client.services.repo.get(tid))['execution_id']}:1"
                for tid in (first, second, third)}
    results = [task["result"] for task in (done, again, late)]
    assert [task["status"] for task in (done, again, late)] == ["completed"] * 3, [again["error"], late["error"]]
    assert {r["state"] for r in results} == {"completed"}
    assert {r["remote_context_id"] for r in results} == {ids["root"]}
    assert len({r["remote_task_id"] for r in results}) == 3  # three agent tasks, one tree
    outcomes = [r["artifacts"][0]["parts"][0]["data"] for r in results]
    assert all(o["status"] == "completed" and o["result"] == outcomes[0]["result"] for o in outcomes)
    sleeper = await remote.task(ids["sleep"])
    assert sleeper["status"] == "completed" and sleeper["started_at"] == started["started_at"]
    assert len(await remote.rpc("tasks.attempts", {"task_id": ids["sleep"]})) == 1
    # Each attempt sent its idempotency key, and the remote kept it: the re-run of an interrupted
    # attempt, which sends the same key and message id, gets what the first send started.
    with sqlite3.connect(remote.workdir / "remote.db") as conn:
        stored = {key for (key,) in conn.execute("SELECT key FROM idempotency_keys")}
    assert set(keys.values()) <= stored, (keys, stored)


async def test_after_a_crash_the_next_attempt_reattaches_to_the_remote_task(remote: Remote, tmp_path: Path) -> None:
    """kill -9 of the local service while the remote agent works: the resumed attempt follows the
    remote task its predecessor sent (stored as a checkpoint) instead of sending the work again."""

    tasks, ids = remote_tree(seconds=2.5)
    db = tmp_path / "local.db"
    local = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{db}", "SERVICE_CREATE_WAIT_TIMEOUT": "0"},
                    "local").start()
    ask = _id("ask")
    try:
        # The default retry policy (one attempt): a crash uses none up.
        await local.rpc("tasks.create", [a2a_task(ask, {"agent_url": remote.url, "data": {"tasks": tasks}})])
        await remote.wait_status(ids["sleep"], ("in_progress",))

        def checkpoint() -> str | None:
            with sqlite3.connect(db) as conn:
                (raw,) = conn.execute("SELECT checkpoint FROM tasks WHERE id = ?", (ask,)).fetchone()
            return json.loads(raw)["remote_task_id"] if raw and raw != "null" else None

        deadline = time.monotonic() + EVENT_WAIT
        while checkpoint() is None:
            assert time.monotonic() < deadline, "the remote task id was never checkpointed"
            await asyncio.sleep(0.05)
        remote_task_id = checkpoint()
        local.kill()
        local.start()
        done = await local.wait_status(ask, ("completed", "failed"))
        assert done["status"] == "completed", done["error"]
        # The cut-off attempt ran again under its own number, and followed the remote task it had sent.
        assert done["attempt"] == 1 and done["interruptions"] == 1
        assert done["result"]["remote_task_id"] == remote_task_id
        assert (await remote.task(ids["root"]))["status"] == "completed"
        # Sent once: a second send of the same ids would have been refused by the remote service.
        assert done["result"]["state"] == "completed"
    finally:
        local.stop()
