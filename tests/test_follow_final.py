"""Issue 25, item 3: every stream and webhook of `tasks.execute` ends with one `final`, also when the
call joins an execution already running (on this instance or another), and that `final` carries the
outcome stored in the database (`executions.final_status`)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import pytest

from taskgrove.agent.foundations.auth import ANONYMOUS
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage import executions
from tests.conftest import POSTGRES_URL, Client, postgres_database, running_app
from tests.servers import receiver
from tests.test_engine import FAIL, task

STREAM = {"jsonrpc": "2.0", "id": 1, "method": "tasks.execute"}


def tree(root: str, fails: bool) -> list[dict[str, Any]]:
    """A root waiting on `x` (sleeps 0.3 s); when `fails`, also on a task that fails after `x`."""
    rows = [task(root, deps=[f"{root}-x"] + ([f"{root}-bad"] if fails else []), method=None),
            task(f"{root}-x", root, method="sleep_executor", inputs={"seconds": 0.3})]
    if fails:
        rows.append(task(f"{root}-bad", root, deps=[f"{root}-x"], method=None, **FAIL))
    return rows


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


async def stored_status(client: Client, root: str) -> str:
    execution = await client.services.engine.repo.transact(executions.latest_execution, root)
    assert execution is not None and execution["status"] != "running"
    return str(execution["final_status"])


def assert_ends_with_one_final(events: list[dict[str, Any]], status: str) -> dict[str, Any]:
    kinds = [e.get("type") for e in events[1:]]
    assert kinds[-2:] == ["final", "stream_end"], kinds
    assert kinds.count("final") == 1, kinds
    final = events[-2]
    assert final["final"] is True and final["status"] == status and final["result"]["status"] == status
    return final


@pytest.mark.parametrize("fails", [False, True])
async def test_a_joining_stream_ends_with_the_stored_final(client: Client, fails: bool) -> None:
    await client.services.tasks.create_tree(NewTree.from_params(tree("root", fails)), ANONYMOUS)
    started = await client.result("tasks.execute", {"task_id": "root"})
    assert started["status"] == "started"
    response = await client.http.post("/tasks", json={**STREAM, "params": {"task_id": "root", "use_streaming": True}})
    events = sse(response.text)
    assert events[0]["result"]["status"] == "already_running" and events[0]["result"]["streaming"] is True
    status = await stored_status(client, "root")
    assert status == ("failed" if fails else "completed")
    final = assert_ends_with_one_final(events, status)
    assert final["result"]["root_task_id"] == "root"
    assert client.services.bus.subscriber_count == 0, "nothing left behind"


async def test_a_joining_webhook_receives_the_stored_final(client: Client) -> None:
    await client.services.tasks.create_tree(NewTree.from_params(tree("root", False)), ANONYMOUS)
    await client.result("tasks.execute", {"task_id": "root"})
    async with receiver() as rec:
        answer = await client.result("tasks.execute", {"task_id": "root", "webhook_config": {"url": rec.url + "/h"}})
        assert answer["status"] == "already_running" and answer["webhook_url"] == rec.url + "/h"
        await rec.wait_for(lambda reqs: any(r["json"]["type"] == "final" for r in reqs))
    finals = [r["json"] for r in rec.requests if r["json"]["type"] == "final"]
    assert len(finals) == 1 and rec.requests[-1]["json"]["final"] is True
    assert finals[0]["status"] == await stored_status(client, "root") == "completed"


two_instances = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL")


@two_instances
async def test_streams_on_b_for_trees_a_runs_end_with_the_stored_final() -> None:
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
        a = await stack.enter_async_context(running_app(settings))
        b = await stack.enter_async_context(running_app(settings))
        for n in range(4):
            root = f"r{n}"
            await a.services.tasks.create_tree(NewTree.from_params(tree(root, fails=n % 2 == 1)), ANONYMOUS)
            assert (await a.result("tasks.execute", {"task_id": root}))["status"] == "started"
            response = await b.http.post("/tasks", json={**STREAM, "params": {"task_id": root, "use_streaming": True}})
            events = sse(response.text)
            assert events[0]["result"]["status"] == "already_running"
            status = await stored_status(b, root)
            assert status == ("failed" if n % 2 else "completed")
            assert_ends_with_one_final(events, status)
            assert not b.services.engine.runs, "A drove the tree; B only followed it"


@two_instances
async def test_a_webhook_joining_on_b_receives_the_stored_final() -> None:
    async with postgres_database() as url, AsyncExitStack() as stack, receiver() as rec:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                      "SERVICE_ALLOW_PRIVATE_URLS": "true"})
        a = await stack.enter_async_context(running_app(settings))
        b = await stack.enter_async_context(running_app(settings))
        await a.services.tasks.create_tree(NewTree.from_params(tree("root", True)), ANONYMOUS)
        await a.result("tasks.execute", {"task_id": "root"})
        answer = await b.result("tasks.execute", {"task_id": "root", "webhook_config": {"url": rec.url + "/h"}})
        assert answer["status"] == "already_running"
        await rec.wait_for(lambda reqs: any(r["json"]["type"] == "final" for r in reqs))
        finals = [r["json"] for r in rec.requests if r["json"]["type"] == "final"]
        assert len(finals) == 1 and finals[0]["status"] == await stored_status(b, "root") == "failed"


@two_instances
async def test_a_stream_on_b_ends_with_final_when_b_takes_over_from_a_stopped_owner() -> None:
    """The owner stops mid-tree: the stream on B neither hangs nor closes silently; B continues the
    execution and its stream ends with the stored outcome."""
    import asyncio

    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                      "SERVICE_LEASE_SECONDS": "1", "SERVICE_SHUTDOWN_GRACE_SECONDS": "0"})
        b = await stack.enter_async_context(running_app(settings))
        async with running_app(settings) as a:
            await a.services.tasks.create_tree(NewTree.from_params([
                task("root", deps=["y"], method=None),
                task("x", "root", method="sleep_executor", inputs={"seconds": 0.5}),
                task("y", "root", deps=["x"], method="sleep_executor", inputs={"seconds": 0.3}),
            ]), ANONYMOUS)
            await a.result("tasks.execute", {"task_id": "root"})
            stream = asyncio.create_task(
                b.http.post("/tasks", json={**STREAM, "params": {"task_id": "root", "use_streaming": True}}))
            await a.wait_status("x", ("in_progress",))
            while not b.services.bus.subscriber_count:  # B's execute has subscribed: it is joining
                await asyncio.sleep(0.01)
        events = sse((await stream).text)  # A has stopped; B takes the tree over
        assert events[0]["result"]["status"] == "already_running"
        status = await stored_status(b, "root")
        assert status == "completed"
        assert_ends_with_one_final(events, status)


@two_instances
async def test_a_stream_on_b_that_never_hears_the_owners_final_reads_it_from_the_database() -> None:
    """A NOTIFY can be lost (B's listening connection was down): B's stream still ends, with the
    final stored by A. B's bus here drops every `final` coming from A."""
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
        a = await stack.enter_async_context(running_app(settings))
        b = await stack.enter_async_context(running_app(settings))
        publish = b.services.bus.publish
        b.services.bus.publish = lambda e: None if e["type"] == "final" else publish(e)  # type: ignore[method-assign]
        await a.services.tasks.create_tree(NewTree.from_params(tree("root", fails=True)), ANONYMOUS)
        await a.result("tasks.execute", {"task_id": "root"})
        response = await b.http.post("/tasks", json={**STREAM, "params": {"task_id": "root", "use_streaming": True}})
        events = sse(response.text)
        assert events[0]["result"]["status"] == "already_running"
        assert_ends_with_one_final(events, await stored_status(b, "root"))
        assert events[-2]["status"] == "failed"


async def test_a_graphql_subscription_whose_terminal_event_is_lost_ends_with_the_stored_status(
        make_settings: Any) -> None:
    """taskStatusChanged ends even when the task's last event never reaches this instance (as a
    lost NOTIFY would): it reads the stored task. This server's bus drops `task_completed`."""
    from tests.test_graphql import GRAPHQL, subscribe
    from tests.test_ws import live_server

    settings = make_settings({**GRAPHQL, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    async with live_server(settings) as server:
        bus = server.services.bus
        publish = bus.publish
        bus.publish = lambda e: None if e["type"] == "task_completed" else publish(e)
        await server.services.tasks.create_tree(NewTree.from_params(tree("root", False)), ANONYMOUS)
        await server.rpc("tasks.execute", {"task_id": "root"})
        messages = await subscribe(server, "root-x")
    assert messages[-1]["type"] == "complete"
    states = [m["payload"]["data"]["taskStatusChanged"]["status"] for m in messages[:-1]]
    assert states[-1] == "COMPLETED"


async def test_an_a2a_message_send_whose_final_is_lost_ends_with_the_stored_outcome(client: Client) -> None:
    """The A2A agent task follows its tree like every stream: if the `final` event never reaches it
    (as a lost NOTIFY), the stored execution gives the outcome. This app's bus drops `final`."""
    from tests.test_a2a_wire import post, send_body, summary
    from tests.test_a2a_wire import tree as a2a_tree

    bus = client.services.bus
    publish = bus.publish
    bus.publish = lambda e: None if e["type"] == "final" else publish(e)
    tasks = a2a_tree(seconds=0.2)
    answer = await post(client, send_body(tasks))
    task = answer["result"]
    assert task["status"]["state"] == "completed"
    assert summary(task["status"]["message"])["status"] == await stored_status(client, tasks[0]["id"]) == "completed"
