"""The engine under awkward timing: cancels, updates and executions racing the engine loop.

Some tests widen a real but short window by slowing one repository call down; the behaviour
checked is what any timing must give.
"""

from __future__ import annotations

import asyncio
from typing import Any

from taskgrove.agent.foundations.auth import ANONYMOUS
from taskgrove.agent.foundations.requests import NewTree
from tests.conftest import Client
from tests.deadlines import EVENT_WAIT
from tests.test_engine import FAIL, task


async def store(client: Client, *tasks: dict[str, Any]) -> None:
    """Create a tree without executing it."""
    await client.services.tasks.create_tree(NewTree.from_params(list(tasks)), ANONYMOUS)


def drain(sub: Any) -> list[str]:
    kinds = []
    while not sub.queue.empty():
        kinds.append(sub.queue.get_nowait()["type"])
    return kinds


async def test_cancel_while_the_task_is_being_claimed_stops_it(client: Client) -> None:
    engine = client.services.engine
    await store(client, task("r", method=None), task("b", "r", method="sleep_executor", inputs={"seconds": 0.6}))
    real = engine.repo.write_pass

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.2)
        return await real(*args)

    engine.repo.write_pass = slow  # type: ignore[method-assign]
    with client.services.bus.subscribe(lambda e: e["task_id"] == "b") as sub:
        await engine.run_keeper.execute("r")
        await asyncio.sleep(0.05)  # the loop is inside the write that claims b
        assert (await engine.cancel("b"))["status"] == "cancelled"
        assert "b" not in engine.running
        await asyncio.sleep(0.8)
        kinds = drain(sub)
    assert kinds[-1] == "task_cancelled" and "task_completed" not in kinds
    assert (await engine.repo.get("b"))["status"] == "cancelled"


async def test_new_dependencies_of_a_waiting_task_apply_to_the_live_execution(client: Client) -> None:
    await store(client, task("r", method=None), task("a", "r", method="sleep_executor", inputs={"seconds": 0.3}),
                task("b", "r", deps=["a"]), task("c", "r", method="sleep_executor", inputs={"seconds": 0.8}))
    await client.result("tasks.execute", {"task_id": "r"})
    await asyncio.sleep(0.1)
    await client.result("tasks.update", {"task_id": "b", "dependencies": [{"id": "a"}, {"id": "c"}]})
    b = await client.wait_status("b", ("completed",))
    c = await client.result("tasks.get", {"task_id": "c"})
    assert b["started_at"] >= c["completed_at"]


async def test_status_set_on_a_running_task_wins_over_its_result(client: Client) -> None:
    # The sleep outlasts the update by far, even on a loaded machine; afterwards the test waits
    # past the moment the sleep would have ended, so a late result would have been seen.
    await store(client, task("r", method=None), task("a", "r", method="sleep_executor", inputs={"seconds": 2.0}),
                task("b", "r", deps=["a"]))
    with client.services.bus.subscribe(lambda e: e["task_id"] == "a") as sub:
        await client.result("tasks.execute", {"task_id": "r"})
        await client.wait_status("a", ("in_progress",))
        await client.result("tasks.update", {"task_id": "a", "status": "cancelled"})
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while "a" in client.services.engine.running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(2.2)
        kinds = drain(sub)
    assert "task_completed" not in kinds
    assert (await client.result("tasks.get", {"task_id": "a"}))["status"] == "cancelled"
    assert (await client.result("tasks.get", {"task_id": "b"}))["status"] == "pending"
    assert "a" not in client.services.engine.running


async def test_streaming_call_inside_a_batch_leaves_no_subscription(client: Client) -> None:
    await store(client, task("r"))
    body = [{"jsonrpc": "2.0", "id": 1, "method": "tasks.execute", "params": {"task_id": "r", "use_streaming": True}}]
    answer = (await client.http.post("/tasks", json=body)).json()
    assert answer[0]["result"]["status"] == "started"
    assert client.services.bus.subscriber_count == 0


def fail_outcome_writes(engine: Any, error: Exception) -> dict[str, int]:
    """Make the engine's writes that store an outcome raise `error` while `left` (of the returned
    counters) is above 0; `seen` counts the failures."""
    real = engine.repo.write_pass
    failures = {"left": 0, "seen": 0}

    async def failing(writes: Any, *rest: Any) -> Any:
        if failures["left"] and any("status" in values for _, _, values in writes):
            failures["left"] -= 1
            failures["seen"] += 1
            raise error
        return await real(writes, *rest)

    engine.repo.write_pass = failing
    return failures


async def test_a_transient_database_error_is_retried(client: Client) -> None:
    from sqlalchemy.exc import OperationalError

    engine = client.services.engine
    await store(client, task("r", method=None), task("a", "r", method="sleep_executor", inputs={"seconds": 0.2}),
                task("b", "r", deps=["a"]))
    failures = fail_outcome_writes(engine, OperationalError("UPDATE tasks", {}, Exception("database is locked")))
    run = await engine.run_keeper.execute("r")
    await asyncio.sleep(0.1)
    failures["left"] = 3  # the same pass goes through once the database answers
    assert await engine.run_keeper.wait(run, 10)
    assert failures["seen"] == 3
    assert {t: (await engine.repo.get(t))["status"] for t in "rab"} == dict.fromkeys("rab", "completed")


async def test_a_database_away_for_longer_than_the_old_bound_fails_no_task(client: Client, monkeypatch: Any) -> None:
    """A fault of the platform never fails a user's task: a write that keeps failing transiently
    (here 12 times, the old bound was 5) is retried until the database answers again, and every
    outcome of the pass is then stored as it was."""
    from sqlalchemy.exc import OperationalError

    from taskgrove.agent.engine import passes

    monkeypatch.setattr(passes, "WRITE_RETRY_MAX_SECONDS", 0.02)
    engine = client.services.engine
    await store(client, task("r", method=None), task("a", "r", method="sleep_executor", inputs={"seconds": 0.2}),
                task("b", "r", method="sleep_executor", inputs={"seconds": 0.2}), task("c", "r", deps=["a", "b"]))
    failures = fail_outcome_writes(engine, OperationalError("UPDATE tasks", {}, ConnectionResetError("connection lost")))
    run = await engine.run_keeper.execute("r")
    await asyncio.sleep(0.1)
    failures["left"] = 12
    assert await engine.run_keeper.wait(run, 20)
    assert failures["seen"] == 12
    rows = {t: await engine.repo.get(t) for t in "rabc"}
    assert {t: row["status"] for t, row in rows.items()} == dict.fromkeys("rabc", "completed")
    assert all(row["attempt"] == 1 for t, row in rows.items() if t != "r"), rows


async def test_a_write_the_database_refuses_fails_only_its_own_task(client: Client) -> None:
    """A pass whose write keeps failing is split up: the task whose outcome cannot be stored fails
    with the database's error, the other outcomes of the pass are stored, the engine goes on."""
    engine = client.services.engine
    await store(client, task("r", method=None), task("bad", "r", method="sleep_executor", inputs={"seconds": 0.2}),
                task("good", "r", method="sleep_executor", inputs={"seconds": 0.2}), task("after", "r", deps=["good"]))
    real = engine.repo.write_pass

    async def refuses(writes: Any, *rest: Any) -> Any:
        if any(tid == "bad" and values.get("status") == "completed" for tid, _, values in writes):
            raise RuntimeError("value refused by the database")
        return await real(writes, *rest)

    engine.repo.write_pass = refuses  # type: ignore[method-assign]
    run = await engine.run_keeper.execute("r")
    assert await engine.run_keeper.wait(run, 10)
    rows = {t: await engine.repo.get(t) for t in ("bad", "good", "after")}
    assert rows["bad"]["status"] == "failed" and "could not be stored" in rows["bad"]["error"]
    assert rows["good"]["status"] == rows["after"]["status"] == "completed"


async def test_execution_started_from_rows_read_before_a_task_finished_still_ends(client: Client) -> None:
    engine = client.services.engine
    await store(client, task("r", method=None), task("a", "r", method="sleep_executor", inputs={"seconds": 0.3}),
                task("b", "r", deps=["a"]))
    await engine.run_keeper.execute("a")
    await asyncio.sleep(0.1)
    real = engine.repo.tree

    async def slow_tree(*args: Any, **kw: Any) -> Any:
        rows = await real(*args, **kw)
        await asyncio.sleep(0.5)  # "a" finishes meanwhile
        return rows

    engine.repo.tree = slow_tree  # type: ignore[method-assign]
    run = await engine.run_keeper.execute("r")
    engine.repo.tree = real  # type: ignore[method-assign]
    assert await engine.run_keeper.wait(run, 5)
    assert (await engine.repo.get("b"))["status"] == "completed"


async def test_cancelling_a_blocked_task_counts_it_once(client: Client) -> None:
    engine = client.services.engine
    await store(client, task("r", method=None), task("f", "r", method=None, **FAIL), task("d", "r", deps=["f"]),
                task("s", "r", method="sleep_executor", inputs={"seconds": 0.5}))
    run = await engine.run_keeper.execute("r")
    await client.wait_status("f", ("failed",))
    assert run.blocked == {"d"}
    await engine.cancel("d")
    assert run.blocked == set() and run.outcome["d"] == "cancelled"
    assert run.progress == 0.75  # r, f, d of r, f, d, s
    await engine.run_keeper.wait(run, 5)


async def test_tasks_cannot_be_created_in_progress(client: Client) -> None:
    error = await client.error("tasks.create", [task("x", status="in_progress")])
    assert error["code"] == -32602 and "in_progress" in error["message"]
    await client.result("tasks.create", [task("y")])
    error = await client.error("tasks.clone", {"task_id": "y", "reset_fields": {"status": "in_progress"}})
    assert error["code"] == -32602 and "in_progress" in error["message"]


async def test_an_archive_preview_can_be_stored_without_running(client: Client) -> None:
    await client.result("tasks.create", [task("src")])
    preview = await client.result("tasks.clone", {"task_id": "src", "origin_type": "archive", "save": False})
    stored = await client.result("tasks.create", preview["tasks"])
    assert stored["origin_type"] == "archive" and stored["status"] == "completed"


async def test_delete_sees_dependents_with_non_ascii_ids(client: Client) -> None:
    await store(client, task("R", method=None), task("é", "R"), task("X_%!", "R", deps=["é"]))
    error = await client.error("tasks.delete", {"task_id": "é"})
    assert "1 tasks depend on this task: [X_%!]" in error["message"]


async def test_a_tree_started_while_leases_are_renewed_is_not_dropped(client: Client) -> None:
    """The lease keeper renews the executions it listed before its database call; a run that
    started during that call was not listed, so it must not be taken for one whose lease was lost
    (it was: its executor was stopped and its tasks stayed in_progress, found by bench/trees.lua)."""
    from taskgrove.storage import executions

    engine = client.services.engine
    gate = asyncio.Event()
    real = engine.repo.transact

    async def held(fn: Any, *args: Any, **options: Any) -> Any:
        if fn is executions.renew:
            await gate.wait()
        return await real(fn, *args, **options)

    engine.repo.transact = held  # type: ignore[method-assign]
    await store(client, task("a", method="sleep_executor", inputs={"seconds": 1}))
    await client.result("tasks.execute", {"task_id": "a"})
    await client.wait_status("a", ("in_progress",))
    renewal = asyncio.create_task(engine.leases.renew())
    await asyncio.sleep(0.05)  # the renewal has listed run a and waits in its database call
    await store(client, task("b", method="sleep_executor", inputs={"seconds": 0.5}))
    await client.result("tasks.execute", {"task_id": "b"})
    await client.wait_status("b", ("in_progress",))
    gate.set()
    await renewal
    assert (await client.wait_status("b", ("completed",)))["status"] == "completed"
    assert (await client.wait_status("a", ("completed",)))["status"] == "completed"


async def test_an_archive_without_ids_is_stored_once_and_answered(client: Client) -> None:
    """An archive root without an id gets one generated id: the answer is the tree stored with it."""
    stored = await client.result("tasks.create", [{"name": "archived root", "origin_type": "archive",
                                                    "status": "completed"}])
    assert stored["name"] == "archived root" and stored["origin_type"] == "archive"
    assert (await client.result("tasks.get", {"task_id": stored["id"]}))["id"] == stored["id"]
    listed = await client.result("tasks.list", {"root_only": True})
    assert [t["id"] for t in listed if t["name"] == "archived root"] == [stored["id"]]
