"""Several instances on one PostgreSQL database: no task runs twice, cancels and events cross."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import pytest

from taskgrove.agent.foundations.auth import ANONYMOUS
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.core import SleepExecutor
from taskgrove.executors.registry import ExecutorRegistry
from tests.conftest import POSTGRES_URL, postgres_database, running_app
from tests.deadlines import EVENT_WAIT
from tests.processes import IN_PROCESS_SLEEPS

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")

RUNS: Counter[str] = Counter()


class CountingExecutor(Executor):
    id = "counting_executor"
    name = "Counting"
    extension = "test"

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        RUNS[context.task_id] += 1
        await asyncio.sleep(0.001)
        return {"ran": True}


def registry() -> ExecutorRegistry:
    return ExecutorRegistry([CountingExecutor, SleepExecutor])


async def test_two_instances_never_run_a_task_twice() -> None:
    RUNS.clear()
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
        a = await stack.enter_async_context(running_app(settings, registry=registry()))
        b = await stack.enter_async_context(running_app(settings, registry=registry()))
        tasks = [{"id": "root", "name": "root", "schemas": {"method": "counting_executor"}}]
        tasks += [{"id": f"t{i}", "name": f"t{i}", "parent_id": "root", "schemas": {"method": "counting_executor"},
                   "dependencies": [{"id": f"t{i - 1}"}] if i % 3 else []} for i in range(150)]
        # stored through A without running...
        await a.services.tasks.create_tree(NewTree.from_params(tasks), ANONYMOUS)
        # ...then executed by both instances at once
        await asyncio.gather(a.result("tasks.execute", {"task_id": "root"}),
                             b.result("tasks.execute", {"task_id": "root"}))
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            tree = await a.result("tasks.tree", {"task_id": "root"})
            statuses = Counter(_statuses(tree))
            if statuses == Counter({"completed": 151}) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert statuses == Counter({"completed": 151})
        assert set(RUNS.values()) == {1}, "every task ran exactly once"
        assert len(RUNS) == 151


def _statuses(node: dict[str, Any]) -> list[str]:
    return [node["status"]] + [s for child in node["children"] for s in _statuses(child)]


async def test_cancel_and_events_cross_instances() -> None:
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                      "SERVICE_PARK_SLEEP_SECONDS": IN_PROCESS_SLEEPS})
        a = await stack.enter_async_context(running_app(settings, registry=registry()))
        b = await stack.enter_async_context(running_app(settings, registry=registry()))
        seen_on_b = b.services.bus.subscribe(lambda e: e["task_id"] == "long")
        await a.result("tasks.create", [{"id": "long", "name": "long", "schemas": {"method": "sleep_executor"},
                                         "inputs": {"seconds": 60}}])
        await a.wait_status("long", ("in_progress",))
        assert "long" in a.services.engine.running
        [answer] = await b.result("tasks.cancel", {"task_ids": ["long"]})
        assert answer["status"] == "cancelled"
        for _ in range(200):
            if "long" not in a.services.engine.running:
                break
            await asyncio.sleep(0.02)
        assert "long" not in a.services.engine.running, "the work on instance A stopped"
        assert (await a.result("tasks.get", {"task_id": "long"}))["status"] == "cancelled"
        kinds: list[str] = []
        while not kinds or kinds[-1] != "final":
            event = await asyncio.wait_for(seen_on_b.get(), EVENT_WAIT)
            assert event.get("remote") is True, "B only learns of A's work through PostgreSQL"
            kinds.append(event["type"])
        assert kinds[0] == "task_start" and kinds[-2:] == ["task_cancelled", "final"]


async def test_an_instance_hears_the_others_from_its_first_request_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone instance sends nothing (no peer listens); a new instance's `hello` makes it send
    again. That hello is said before the new instance's start returns, not queued for its
    sender: with a sender that starts a second late (a loaded machine), B still sees the start of
    a task A runs right after B started (before, the hello came late and B missed it: the flake
    of test_cancel_and_events_cross_instances, once in a looped full suite)."""
    from taskgrove.agent.engine import notify

    send = notify.PgNotifier._send
    late = {"b": False}

    async def late_send(self: notify.PgNotifier) -> None:
        if late["b"]:
            await asyncio.sleep(1.0)
        await send(self)

    monkeypatch.setattr(notify.PgNotifier, "_send", late_send)
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
                                      "SERVICE_PARK_SLEEP_SECONDS": IN_PROCESS_SLEEPS})
        a = await stack.enter_async_context(running_app(settings, registry=registry()))
        for _ in range(300):  # A counts its peers: none, so it stops sending
            if a.services.engine.notifier.peers is False:
                break
            await asyncio.sleep(0.02)
        assert a.services.engine.notifier.peers is False
        late["b"] = True
        b = await stack.enter_async_context(running_app(settings, registry=registry()))
        seen_on_b = b.services.bus.subscribe(lambda e: e["task_id"] == "first")
        await a.result("tasks.create", [{"id": "first", "name": "first", "schemas": {"method": "sleep_executor"},
                                         "inputs": {"seconds": 60}}])
        assert (await asyncio.wait_for(seen_on_b.get(), 5))["type"] == "task_start"
        await a.result("tasks.cancel", {"task_ids": ["first"]})


async def test_an_execution_waits_for_a_dependency_running_on_another_instance() -> None:
    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
        a = await stack.enter_async_context(running_app(settings, registry=registry()))
        b = await stack.enter_async_context(running_app(settings, registry=registry()))
        await a.services.tasks.create_tree(NewTree.from_params([
            {"id": "root", "name": "root"},
            {"id": "dep", "name": "dep", "parent_id": "root", "schemas": {"method": "sleep_executor"},
             "inputs": {"seconds": 0.5}},
            {"id": "after", "name": "after", "parent_id": "root", "schemas": {"method": "counting_executor"},
             "dependencies": [{"id": "dep"}]},
        ]), ANONYMOUS)
        await a.result("tasks.execute", {"task_id": "dep"})
        await a.wait_status("dep", ("in_progress",))
        await b.result("tasks.execute", {"task_id": "after"})  # waits for A's work, does not redo it
        after = await b.wait_status("after", ("completed",))
        dep = await b.result("tasks.get", {"task_id": "dep"})
        assert dep["status"] == "completed" and after["started_at"] >= dep["completed_at"]
        assert await b.runs_ended(), "B drives no execution"


async def test_a_stream_watched_on_another_instance_reports_the_stored_final_status() -> None:
    """B joins the execution A drives: B's SSE stream follows A's events and ends with the tree's
    stored status; A's tasks.create answers with the finished tree."""
    import json

    async with postgres_database() as url, AsyncExitStack() as stack:
        settings = Settings.from_env({"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0"})
        a = await stack.enter_async_context(running_app(settings, registry=registry()))
        b = await stack.enter_async_context(running_app(settings, registry=registry()))
        for n in range(3):
            root = f"root{n}"
            await a.services.tasks.create_tree(NewTree.from_params([
                {"id": root, "name": "root", "dependencies": [{"id": f"{root}-x"}, {"id": f"{root}-y"}]},
                {"id": f"{root}-x", "name": "x", "parent_id": root, "schemas": {"method": "sleep_executor"},
                 "inputs": {"seconds": 0.4}},
                {"id": f"{root}-y", "name": "y", "parent_id": root, "schemas": {"method": "counting_executor"}},
            ]), ANONYMOUS)
            await a.result("tasks.execute", {"task_id": f"{root}-x"})  # A drives the tree's execution
            body = {"jsonrpc": "2.0", "id": 1, "method": "tasks.execute",
                    "params": {"task_id": root, "use_streaming": True}}
            response = await b.http.post("/tasks", json=body)  # B joins it: y and the root
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
            assert events[0]["result"]["status"] == "started"
            final = next(e for e in events if e.get("type") == "final")
            stored = await b.result("tasks.get", {"task_id": root})
            assert stored["status"] == "completed"
            assert final["status"] == "completed" and final["result"]["status"] == "completed"
            assert not b.services.engine.runs, "B drove nothing: A ran every task"
