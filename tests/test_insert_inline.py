"""A one-task tree whose task is pure is stored completed by its own insert (agent/engine/insert_inline.py):
its result, attempt 1, its history row, its execution ended, and afterwards the same events and
metrics as a pass's inline completion; a task that is not pure, retries or has a timeout keeps
the pass's path. Both backends (the `client` fixture)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select

from taskgrove.executors.core import NoopExecutor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.models import executions_table as X
from tests.conftest import Client, running_app
from tests.deadlines import EVENT_WAIT
from tests.test_operations import sample
from tests.test_pure_inline import ThirdParty, attempts_started


def inserted_runs(client: Client) -> list[str]:
    """Spy on the pass's path: the trees whose insert left them to a pass (RunKeeper.run_inserted)."""
    keeper = client.services.engine.run_keeper
    trees: list[str] = []
    real = keeper.run_inserted

    async def run_inserted(execution: Any, rows: Any, call: Any) -> Any:
        trees.append(rows[0]["task_tree_id"])
        return await real(execution, rows, call)

    keeper.run_inserted = run_inserted  # type: ignore[method-assign]
    return trees


async def executions_of(client: Client, tree_id: str) -> list[dict[str, Any]]:
    async with client.services.repo.transaction() as conn:
        rows = (await conn.execute(select(X).where(X.c.task_tree_id == tree_id))).mappings().all()
    return [dict(row) for row in rows]


async def test_a_pure_one_task_tree_is_stored_completed_by_its_insert(client: Client) -> None:
    started, passed = attempts_started(client), inserted_runs(client)
    before = (await client.http.get("/metrics")).text
    with client.services.bus.subscribe(lambda e: e.get("root_task_id") == "one") as sub:
        tree = await client.result("tasks.create", [
            {"id": "one", "name": "one", "inputs": {"n": 2}, "schemas": {"method": "noop_executor"}}])
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "final" for e in events):
            events.append(await asyncio.wait_for(sub.get(), EVENT_WAIT))
    assert started == [] and passed == []  # no attempt ran, no pass took the tree
    assert tree["status"] == "completed" and tree["result"] == {"ok": True, "inputs": {"n": 2}}
    stored = await client.result("tasks.get", {"task_id": "one"})
    assert stored["attempt"] == 1 and stored["progress"] == 1.0
    assert stored["started_at"] == stored["completed_at"] and stored["completed_at"]
    history = await client.result("tasks.attempts", {"task_id": "one"})
    assert [(h["attempt"], h["outcome"], h["started_at"], h["ended_at"]) for h in history] == [
        (1, "completed", stored["started_at"], stored["completed_at"])]
    [execution] = await executions_of(client, "one")
    assert (execution["status"], execution["final_status"], execution["ended_at"]) == (
        "ended", "completed", stored["completed_at"])
    assert execution["lease_expires_at"] is None
    assert [e["type"] for e in events] == ["task_start", "progress", "task_completed", "final"]
    assert events[2]["result"] == tree["result"] and events[3]["status"] == "completed"
    after = (await client.http.get("/metrics")).text
    for name, labels in (("taskgrove_executions_started_total", {}),
                         ("taskgrove_executions_finished_total", {"outcome": "completed"})):
        assert sample(after, name, executor="noop_executor", **labels) == \
            sample(before, name, executor="noop_executor", **labels) + 1, name


async def test_a_resent_pure_create_answers_the_stored_tree_once(client: Client) -> None:
    sent = [{"id": "again", "name": "again", "schemas": {"method": "noop_executor"}}]
    first = await client.result("tasks.create", sent)
    second = await client.result("tasks.create", sent)
    assert first == second and second["status"] == "completed"
    assert len(await client.result("tasks.attempts", {"task_id": "again"})) == 1
    assert len(await executions_of(client, "again")) == 1


async def test_a_retrying_or_timed_or_grown_tree_keeps_the_pass_path(client: Client) -> None:
    passed = inserted_runs(client)
    noop = {"method": "noop_executor"}
    for tid, extra in (("retrying", {"retry": {"max_attempts": 2}}), ("timed", {"timeout_seconds": 30})):
        tree = await client.result("tasks.create", [{"id": tid, "name": tid, "schemas": noop, **extra}])
        assert tree["status"] == "completed", tid
    tree = await client.result("tasks.create", [{"id": "two", "name": "two", "schemas": noop},
                                                {"id": "kid", "name": "kid", "parent_id": "two", "schemas": noop}])
    assert tree["status"] == "completed"
    assert passed == ["retrying", "timed", "two"]
    history = await client.result("tasks.attempts", {"task_id": "retrying"})
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "completed")]


async def test_a_one_task_tree_of_an_executor_not_pure_keeps_the_pass_path(make_settings: Any) -> None:
    registry = ExecutorRegistry([NoopExecutor, ThirdParty])
    async with running_app(make_settings(), registry=registry) as client:
        started, passed = attempts_started(client), inserted_runs(client)
        tree = await client.result("tasks.create", [
            {"id": "tp", "name": "tp", "schemas": {"method": "third_party_executor"}}])
        assert tree["status"] == "completed" and tree["result"] == {"ok": True}
        assert started == ["tp"] and passed == ["tp"]
