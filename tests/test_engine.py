"""Execution engine through HTTP: order, priority, concurrency, failure, re-execution, cancel."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tests.conftest import Client
from tests.deadlines import EVENT_WAIT


def task(tid: str, parent: str | None = None, deps: list[Any] | None = None, method: str | None = "noop_executor",
         **extra: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"id": tid, "name": tid, **extra}
    if parent:
        t["parent_id"] = parent
    if deps:
        t["dependencies"] = [d if isinstance(d, dict) else {"id": d} for d in deps]
    if method and "schemas" not in extra:
        t["schemas"] = {"method": method}
    return t


def flatten(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {node["id"]: node}
    for child in node["children"]:
        out.update(flatten(child))
    return out


FAIL = {"schemas": {"method": "command_executor"}, "inputs": {"command": "false"}}  # refused: no allow-list


async def test_chain_runs_in_dependency_order(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("c", deps=["b"]), task("a", "c"), task("b", "c", deps=["a"]),
    ])
    tasks = flatten(tree)
    assert {t["status"] for t in tasks.values()} == {"completed"}
    assert tasks["a"]["completed_at"] <= tasks["b"]["started_at"]
    assert tasks["b"]["completed_at"] <= tasks["c"]["started_at"]
    assert all(t["progress"] == 1.0 for t in tasks.values())


async def test_diamond_and_fan_out(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("top", deps=["left", "right"], method="aggregate_results_executor"),
        task("base", "top"), task("left", "top", deps=["base"]), task("right", "top", deps=["base"]),
    ])
    tasks = flatten(tree)
    assert tasks["top"]["status"] == "completed"
    for side in ("left", "right"):
        assert tasks["base"]["completed_at"] <= tasks[side]["started_at"]
        assert tasks[side]["completed_at"] <= tasks["top"]["started_at"]
    # aggregate_results_executor sees dependency results keyed by id; its own inputs untouched
    assert set(tasks["top"]["result"]["results"]) == {"left", "right"}
    assert tasks["top"]["result"]["count"] == 2
    assert tasks["top"]["inputs"] == {}


async def test_priority_orders_runnable_tasks(app_factory: Any) -> None:
    async with app_factory({"SERVICE_MAX_CONCURRENCY": "1"}) as client:
        tree = await client.result("tasks.create", [
            task("root", method=None),
            task("low", "root", priority=3), task("urgent", "root", priority=0),
            task("normal", "root", priority=2), task("high", "root", priority=1),
        ])
    tasks = flatten(tree)
    order = sorted(("low", "urgent", "normal", "high"), key=lambda t: tasks[t]["started_at"])
    assert order == ["urgent", "high", "normal", "low"]


async def test_independent_tasks_run_concurrently(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("root", method=None),
        task("s1", "root", method="sleep_executor", inputs={"seconds": 0.3}),
        task("s2", "root", method="sleep_executor", inputs={"seconds": 0.3}),
    ])
    tasks = flatten(tree)
    assert tasks["s1"]["started_at"] < tasks["s2"]["completed_at"]
    assert tasks["s2"]["started_at"] < tasks["s1"]["completed_at"]


async def test_failure_stops_dependents(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("root", method=None),
        task("bad", "root", method=None, **FAIL),
        task("after", "root", deps=["bad"]),
        task("after2", "root", deps=["after"]),
        task("free", "root"),
    ])
    tasks = flatten(tree)
    assert tasks["bad"]["status"] == "failed"
    assert "SERVICE_COMMAND_ALLOWLIST" in tasks["bad"]["error"]
    assert tasks["after"]["status"] == "pending" and tasks["after2"]["status"] == "pending"
    assert tasks["free"]["status"] == "completed"


async def test_optional_dependency_does_not_block(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("root", deps=[{"id": "bad", "required": False}, "ok"], method="aggregate_results_executor"),
        task("bad", "root", method=None, **FAIL),
        task("ok", "root"),
    ])
    tasks = flatten(tree)
    assert tasks["bad"]["status"] == "failed"
    assert tasks["root"]["status"] == "completed"
    assert list(tasks["root"]["result"]["results"]) == ["ok"]


async def test_reexecuting_failed_task_reruns_its_dependencies(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("root", method=None),
        task("dep", "root"),
        task("bad", "root", deps=["dep"], method=None, **FAIL),
        task("unrelated", "root"),
    ])
    before = flatten(tree)
    assert before["bad"]["status"] == "failed"
    # make it succeed this time
    await client.result("tasks.update", {"task_id": "bad", "schemas": {"method": "noop_executor"}})
    answer = await client.result("tasks.execute", {"task_id": "bad"})
    assert answer["success"] is True and answer["status"] == "started" and answer["protocol"] == "jsonrpc"
    bad = await client.wait_status("bad", ("completed",))
    dep = await client.result("tasks.get", {"task_id": "dep"})
    unrelated = await client.result("tasks.get", {"task_id": "unrelated"})
    assert dep["started_at"] > before["dep"]["started_at"], "completed dependency of a failed task re-runs"
    assert unrelated["started_at"] == before["unrelated"]["started_at"], "completed tasks not needed are skipped"
    assert bad["error"] is None


async def test_execute_child_runs_only_it_and_its_dependencies(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        # a pending tree: a failing gate keeps everything below from running
        tree = [
            task("r2", deps=["gate"]),
            task("gate", "r2", method=None, **FAIL),
            task("x", "r2", deps=["y"]),
            task("y", "r2", deps=["gate"]),
            task("z", "r2", deps=["gate"]),
        ]
        await client.result("tasks.create", tree)
        await client.wait_status("gate", ("failed",))
        for tid in ("y", "z"):
            await client.result("tasks.update", {"task_id": tid, "dependencies": []})
        await client.result("tasks.execute", {"task_id": "x"})
        await client.wait_status("x", ("completed",))
        y = await client.result("tasks.get", {"task_id": "y"})
        z = await client.result("tasks.get", {"task_id": "z"})
        assert y["status"] == "completed"
        assert z["status"] == "pending"


async def test_already_running_answer(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        tree = await client.result("tasks.create", [task("slow", method="sleep_executor", inputs={"seconds": 5})])
        assert tree["status"] in ("pending", "in_progress")
        await client.wait_status("slow", ("in_progress",))
        answer = await client.result("tasks.execute", {"task_id": "slow"})
        assert answer["success"] is False and answer["status"] == "already_running"
        # running.list shows this instance's in-memory attempts (SPEC.md); on PostgreSQL a read can
        # see the committed claim a moment before the engine has taken in its answer.
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT
        while not (listed := await client.result("tasks.running.list", {})) \
                and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert [t["id"] for t in listed] == ["slow"]
        assert (await client.result("tasks.running.count", {}))["count"] == 1
        assert (await client.result("tasks.running.count", {"user_id": "nobody"})) == {"count": 0, "user_id": "nobody"}
        statuses = await client.result("tasks.running.status", {"task_ids": ["slow", "ghost"]})
        assert statuses[0]["status"] == "in_progress" and statuses[1]["status"] == "not_found"
        cancelled = await client.result("tasks.cancel", {"task_ids": ["slow"]})
        assert cancelled[0]["status"] == "cancelled"


async def test_cancel_pending_and_finished(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [
            task("root", method="sleep_executor", inputs={"seconds": 5}),
            task("waiter", "root", deps=["root"]),
        ])
        await client.wait_status("root", ("in_progress",))
        [pending] = await client.result("tasks.cancel", {"task_ids": ["waiter"], "error_message": "not needed"})
        assert pending["status"] == "cancelled" and pending["force"] is False
        waiter = await client.result("tasks.get", {"task_id": "waiter"})
        assert waiter["status"] == "cancelled" and waiter["error"] == "not needed"
        [again] = await client.result("tasks.cancel", {"task_ids": ["waiter"]})
        assert again["status"] == "failed"
        assert again["message"] == "Task waiter is already cancelled, cannot cancel"
        [missing] = await client.result("tasks.running.cancel", {"task_ids": ["nope"]})
        assert missing["status"] == "error" and "not found" in missing["message"]
        await client.result("tasks.cancel", {"task_ids": ["root"], "force": True})
        done = await client.result("tasks.create", [task("done")])
        await client.wait_status("done", ("completed",))
        [finished] = await client.result("tasks.cancel", {"task_ids": [done["id"]]})
        assert finished["message"] == f"Task {done['id']} is already completed, cannot cancel"


async def test_cancel_running_command_kills_process(app_factory: Any, tmp_path: Any) -> None:
    marker = tmp_path / "late"
    script = f"sleep 30; touch {marker}"
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh"}) as client:
        await client.result("tasks.create", [
            task("cmd", method="command_executor", inputs={"command": ["sh", "-c", script]}),
        ])
        await client.wait_status("cmd", ("in_progress",))
        await asyncio.sleep(0.2)  # let the process start
        pids = _pids_running(script)
        assert pids, "the command should be running"
        [answer] = await client.result("tasks.cancel", {"task_ids": ["cmd"]})
        assert answer["status"] == "cancelled"
        for _ in range(50):
            if not _pids_running(script):
                break
            await asyncio.sleep(0.05)
        assert not _pids_running(script), "the child process is killed"
        cmd = await client.result("tasks.get", {"task_id": "cmd"})
        assert cmd["status"] == "cancelled" and cmd["result"] is None
        assert not marker.exists()
        assert await client.result("tasks.running.list", {}) == []


def _pids_running(needle: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found.append(int(pid))
    return found


async def test_input_schema_validation_fails_task(client: Client) -> None:
    tree = await client.result("tasks.create", [
        task("v", inputs={"n": "x"}, schemas={"method": "noop_executor", "input_schema": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}),
    ])
    assert tree["status"] == "failed"
    assert tree["error"].startswith("Input validation failed at 'n'")


async def test_service_extensions_restrict_executors(app_factory: Any) -> None:
    async with app_factory({"SERVICE_EXTENSIONS": "core"}) as client:
        info = await client.result("system.executors", {}, path="/system")
        assert info["restricted"] is True
        assert {e["extension"] for e in info["executors"]} == {"core"}
        assert "command_executor" not in info["allowed_ids"]
        error = await client.error("tasks.create", [task("c", method="command_executor")])
        assert error["code"] == -32602 and "command_executor" in error["message"]


async def test_unknown_executor_rejected_at_create(client: Client) -> None:
    error = await client.error("tasks.create", [task("x", method="no_such_executor")])
    assert error["code"] == -32602
    assert "no_such_executor" in error["message"]
    assert await client.result("tasks.list", {}) == []


async def test_system_health_and_examples(client: Client) -> None:
    health = await client.result("system.health", None, path="/system")
    assert health["status"] == "healthy" and health["running_tasks_count"] == 0 and health["version"]
    status = await client.result("examples.status", {}, path="/system")
    assert status["initialized"] is False and status["available"] is True
    first = await client.result("examples.init", {}, path="/system")
    assert first["created_count"] > 0
    again = await client.result("examples.init", {}, path="/system")
    assert again["created_count"] == 0
    forced = await client.result("examples.init", {"force": True}, path="/system")
    assert forced["created_count"] == first["created_count"]
    assert (await client.result("examples.status", {}, path="/system"))["initialized"] is True


async def _crash_leftover(client: Client, task_id: str) -> None:
    """Make the database look as a kill -9 leaves it: the attempt in progress, the execution running,
    both owned by an instance that no longer exists."""
    from taskgrove.storage import executions

    await client.services.repo.update(task_id, {"status": "in_progress", "lease_owner": "dead-instance",
                                                "lease_expires_at": None, "attempt": 1, "error": None})

    def own(c: Any) -> None:
        c.execute(executions.update(executions.X).values(owner="dead-instance", lease_expires_at=None,
                                                         status="running", final_status=None, ended_at=None))

    await client.services.repo.transact(own)


@pytest.mark.parametrize("attempts", [1, 2])
async def test_restart_runs_an_interrupted_attempt_again_without_using_up_its_retries(
        make_settings: Any, attempts: int) -> None:
    """A crash is the platform's fault: the cut-off attempt runs again with the same number, the
    default policy (one attempt) included, and the tree finishes with no call."""
    from tests.conftest import running_app

    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    async with running_app(settings) as client:
        await client.result("tasks.create", [task("root", deps=["long"]), task(
            "long", "root", method="sleep_executor", inputs={"seconds": 0.2},
            retry={"max_attempts": attempts, "base_seconds": 0})])
        await client.wait_status("root", ("completed",))
        await _crash_leftover(client, "long")
        await client.services.repo.update("root", {"status": "pending", "completed_at": None})
    async with running_app(settings) as client:  # nothing is called: the execution resumes by itself
        long = await client.wait_status("long", ("completed",))
        assert long["attempt"] == 1, "the interrupted attempt ran again under its own number"
        assert long["interruptions"] == 1 and long["error"] is None
        await client.wait_status("root", ("completed",))


async def test_a_task_interrupted_too_often_fails_naming_the_setting(make_settings: Any) -> None:
    """SERVICE_MAX_INTERRUPTIONS bounds the re-runs: a task that keeps killing its instance must not
    loop forever. Past the bound it fails, and the error says which setting to raise."""
    from tests.conftest import running_app

    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_INTERRUPTIONS": "1"})
    async with running_app(settings) as client:
        await client.result("tasks.create", [task("root", deps=["long"]), task(
            "long", "root", method="sleep_executor", inputs={"seconds": 0.1})])
        await client.wait_status("root", ("completed",))
        await _crash_leftover(client, "long")
        await client.services.repo.update("long", {"interruptions": 1})  # cut off once already
        await client.services.repo.update("root", {"status": "pending", "completed_at": None})
    async with running_app(settings) as client:
        long = await client.wait_status("long", ("failed",))
        # SQLite: the one instance restarted; PostgreSQL: the dead instance's lease ran out
        assert long["error"].startswith(("Interrupted: the service restarted",
                                         "Interrupted: instance dead-instance stopped renewing its lease"))
        assert "interrupted 2 times, more than SERVICE_MAX_INTERRUPTIONS (1) allows" in long["error"]
        assert long["interruptions"] == 2 and long["attempt"] == 1


async def test_status_set_by_update_is_published(client: Client) -> None:
    await client.result("tasks.create", [task("t")])
    with client.services.bus.subscribe(lambda e: e["task_id"] == "t") as sub:
        await client.result("tasks.update", {"task_id": "t", "status": "failed", "error": "set by hand"})
        event = await asyncio.wait_for(sub.get(), EVENT_WAIT)
    assert event["type"] == "task_failed" and event["status"] == "failed" and event["error"] == "set by hand"
    assert event["root_task_id"] == "t"


async def test_execute_with_copy_execution_leaves_the_original_unchanged(client: Client) -> None:
    original = await client.result("tasks.create", [
        task("orig", deps=["kid"], method="aggregate_results_executor"), task("kid", "orig"),
    ])
    answer = await client.result("tasks.execute", {"task_id": "orig", "copy_execution": True, "copy_children": True})
    assert answer["success"] is True and answer["original_task_id"] == "orig"
    assert answer["task_id"] == answer["root_task_id"] != "orig"
    copy = await client.wait_status(answer["task_id"], ("completed",))
    assert copy["original_task_id"] == "orig" and copy["started_at"] > original["completed_at"]
    tree = flatten(await client.result("tasks.tree", {"task_id": answer["task_id"]}))
    assert len(tree) == 2 and {t["status"] for t in tree.values()} == {"completed"}
    again = await client.result("tasks.get", {"task_id": "orig"})
    assert again["started_at"] == original["started_at"] and again["has_copy"] is True


async def test_concurrent_executes_of_one_tree_make_one_run(app_factory: Any) -> None:
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        await client.result("tasks.create", [
            task("root", deps=["gate"]), task("gate", "root", method=None, **FAIL),
            task("a", "root", deps=["gate"], method="sleep_executor", inputs={"seconds": 0.2}),
            task("b", "root", deps=["a"]),
        ])
        await client.wait_status("gate", ("failed",))
        await client.result("tasks.update", {"task_id": "root", "dependencies": []})
        await client.result("tasks.update", {"task_id": "gate", "schemas": {"method": "noop_executor"}})
        bodies = [{"jsonrpc": "2.0", "id": n, "method": "tasks.execute", "params": {"task_id": "root"}}
                  for n in range(3)]
        responses = await asyncio.gather(*(client.http.post("/tasks", json=body) for body in bodies))
        answers = [r.json()["result"] for r in responses]
        assert sorted(a["status"] for a in answers) == ["already_running", "already_running", "started"]
        assert len(client.services.engine.runs) == 1
        for tid in ("root", "gate", "a", "b"):
            await client.wait_status(tid, ("completed",))
        assert await client.runs_ended()


async def test_stopping_the_service_kills_running_commands(make_settings: Any, tmp_path: Any) -> None:
    from tests.conftest import running_app

    # Unique to this test: the processes are found by their command line, and the other backend's
    # run of this test may be running the same command on the other xdist worker.
    script = f"sleep 31; echo never {tmp_path}"
    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh"})
    async with running_app(settings) as client:
        await client.result("tasks.create", [task("cmd", method="command_executor",
                                                   inputs={"command": ["sh", "-c", script]})])
        await client.wait_status("cmd", ("in_progress",))
        for _ in range(50):
            if _pids_running(script):
                break
            await asyncio.sleep(0.05)
        assert _pids_running(script)
    assert not _pids_running(script), "no child process outlives the service"
    async with running_app(settings) as client:  # a clean stop hands the attempt back: it resumes
        cmd = await client.wait_status("cmd", ("in_progress",))
        assert cmd["attempt"] == 1, "the attempt cut off by a clean stop does not count"
        [cancelled] = await client.result("tasks.cancel", {"task_ids": ["cmd"]})
        assert cancelled["status"] == "cancelled"
    assert not _pids_running(script)


@pytest.mark.parametrize("limit,expected", [("3", "pending"), ("0", "failed")])
async def test_a_stop_past_its_grace_interrupts_the_attempts_still_running(
        make_settings: Any, limit: str, expected: str) -> None:
    """A shutdown past its grace cuts attempts off like a crash: handed back with their attempt
    number and one more interruption, or failed once SERVICE_MAX_INTERRUPTIONS is used up."""
    from tests.conftest import running_app

    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_INTERRUPTIONS": limit})
    async with running_app(settings) as client:
        await client.result("tasks.create", [task("nap", method="sleep_executor", inputs={"seconds": 30})])
        await client.wait_status("nap", ("in_progress",))
    row = await _stored(settings.database_url, "nap")  # as the stop left it: no instance runs now
    assert row["status"] == expected and row["interruptions"] == 1, row
    assert row["attempt"] == (0 if expected == "pending" else 1), "a handed-back attempt keeps its number"
    assert row["error"].startswith("Interrupted: the service stopped")
    if expected == "failed":
        assert "SERVICE_MAX_INTERRUPTIONS (0)" in row["error"]


async def _stored(database_url: str, task_id: str) -> dict[str, Any]:
    """A task row read straight from the database, with no service running."""
    from sqlalchemy import select

    from taskgrove.storage import db
    from taskgrove.storage.models import tasks_table

    engine = db.create_engine(database_url)
    try:
        async with engine.connect() as conn:
            return dict((await conn.execute(select(tasks_table).where(tasks_table.c.id == task_id))).one()._mapping)
    finally:
        await engine.dispose()


async def test_re_executing_after_an_interruption_runs_only_what_is_unfinished(make_settings: Any) -> None:
    """SPEC.md re-runs the completed dependencies of a failed task; not when the failure was an
    interruption (a crash, here one past SERVICE_MAX_INTERRUPTIONS): those results are still
    valid, and recovery is not re-execution."""
    from tests.conftest import running_app

    settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_INTERRUPTIONS": "0"})
    async with running_app(settings) as client:
        await client.result("tasks.create", [task("root", deps=["long"]), task("dep", "root"),
                                             task("long", "root", deps=["dep"], method="sleep_executor",
                                                  inputs={"seconds": 0.1})])
        await client.wait_status("root", ("completed",))
        dep_before = await client.result("tasks.get", {"task_id": "dep"})
        await _crash_leftover(client, "long")
        await client.services.repo.update("root", {"status": "pending", "completed_at": None})
    async with running_app(settings) as client:
        long = await client.wait_status("long", ("failed",))
        assert long["error"].startswith("Interrupted:")
        await client.result("tasks.execute", {"task_id": "root"})
        await client.wait_status("root", ("completed",))
        assert (await client.result("tasks.get", {"task_id": "dep"}))["started_at"] == dep_before["started_at"]
        long = await client.result("tasks.get", {"task_id": "long"})
        assert long["status"] == "completed" and long["interruptions"] == 0, "a new execution starts afresh"


async def test_health_reports_a_database_that_stops_answering(client: Client, monkeypatch: Any) -> None:
    """Under load health costs no query (a commit in the last seconds proves the database
    answers); once nothing has answered lately, it asks, and says so when the database does not."""
    from taskgrove.agent.services import system_service as system

    healthy = await client.result("system.health", path="/system")
    assert healthy["status"] == "healthy"
    repo = client.services.repo

    async def down(*_args: Any, **_kw: Any) -> Any:
        raise OSError("connection refused")

    monkeypatch.setattr(repo.connections, "transact", down)
    if repo.connections.reader is not None:  # SQLite: health's own read on the loop's thread fails too
        monkeypatch.setattr(repo.connections.reader, "_connection", down)
    monkeypatch.setattr(system, "HEALTH_FRESH_SECONDS", 0.0)
    sick = await client.result("system.health", path="/system")
    assert sick["status"] == "unhealthy" and sick["message"] == "Database unreachable: OSError"


async def test_an_executor_sees_its_task_as_the_wire_shows_it_at_start(make_settings: Any) -> None:
    """`context.task` (built lazily by the engine) is the task as tasks.get shows it when the
    attempt starts: custom fields merged in, status in_progress; later progress does not change it."""
    from taskgrove.agent.foundations.settings import Settings
    from taskgrove.executors.base import ExecutionContext, Executor
    from taskgrove.executors.registry import ExecutorRegistry
    from tests.conftest import running_app

    class TaskProbe(Executor):
        id = "task_probe_executor"
        name = "Task probe"
        extension = "test"
        description = "Returns what its context says of its task."

        async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
            await context.report_progress(0.5)
            return {"task": dict(context.task), "keys": len(context.task), "name": context.task["name"]}

    settings: Settings = make_settings()
    async with running_app(settings, registry=ExecutorRegistry([TaskProbe])) as client:
        tree = await client.result("tasks.create", {"tasks": [
            {"id": "probe", "name": "probe", "inputs": {"a": 1}, "custom": "kept",
             "schemas": {"method": "task_probe_executor"}}]})
    seen = tree["result"]
    assert seen["name"] == "probe" and seen["keys"] == len(seen["task"])
    assert seen["task"]["custom"] == "kept" and seen["task"]["inputs"] == {"a": 1}
    assert seen["task"]["status"] == "in_progress" and seen["task"]["progress"] == 0.0
    assert set(seen["task"]) >= {"id", "name", "status", "inputs", "params", "schemas", "dependencies"}


async def test_an_executor_that_checkpoints_meets_its_cancel_hook_before_any_refusal(make_settings: Any) -> None:
    """A cancel decides in the database first, then calls the executor's cancel hook, then cancels
    its coroutine. A checkpoint written in between is refused; the executor must not see that
    refusal before its hook (an A2A executor that ended on it closed its client, and its hook then
    could not cancel the remote task: test_executor_a2a's cancel test, failing under load). Each
    probe checkpoints without pause, so its writes keep landing between the cancel's two steps."""
    from taskgrove.agent.foundations.settings import Settings
    from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
    from taskgrove.executors.registry import ExecutorRegistry
    from tests.conftest import running_app

    seen: dict[str, list[str]] = {}

    class CheckpointProbe(Executor):
        id = "checkpoint_probe_executor"
        name = "Checkpoint probe"
        extension = "test"
        description = "Checkpoints without pause until it is stopped; records what it meets."

        async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
            self.trail = seen.setdefault(context.task_id, [])
            await context.checkpoint({"n": 0})
            self.trail.append("running")
            n = 0
            try:
                while True:
                    n += 1
                    await context.checkpoint({"n": n})
            except ExecutorError as exc:
                self.trail.append(f"refused: {exc}")
                raise
            except asyncio.CancelledError:
                self.trail.append("cancelled")
                raise

        async def cancel(self) -> dict[str, Any] | None:
            self.trail.append("hook")
            return None

    ids = [f"probe-{i}" for i in range(8)]
    settings: Settings = make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0"})
    async with running_app(settings, registry=ExecutorRegistry([CheckpointProbe])) as client:
        for tid in ids:  # one tree each
            await client.result("tasks.create", [{"id": tid, "name": tid,
                                                  "schemas": {"method": "checkpoint_probe_executor"}}])
        for tid in ids:
            await client.wait_status(tid, ("in_progress",))
            while not seen.get(tid):  # its first checkpoint is stored
                await asyncio.sleep(0.01)
        for tid in ids:
            [answer] = await client.result("tasks.cancel", {"task_ids": [tid]})
            assert answer["status"] == "cancelled", answer
        for tid in ids:
            while "cancelled" not in seen[tid] and not any(t.startswith("refused") for t in seen[tid]):
                await asyncio.sleep(0.01)
    assert {tid: seen[tid] for tid in ids} == {tid: ["running", "hook", "cancelled"] for tid in ids}


def nap(tid: str, seconds: float, parent: str | None = None, deps: list[Any] | None = None) -> dict[str, Any]:
    return task(tid, parent, deps, method="sleep_executor", inputs={"seconds": seconds})


async def test_a_create_claims_its_first_tasks_with_its_insert(app_factory: Any) -> None:
    """With a slot free, the tasks a tree may start at once are claimed in the create's own
    transaction: the create's answer (at once here) shows them in progress, claimed as a pass
    claims (attempt 1, this instance's lease), and each runs once."""
    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0"}) as client:
        tree = flatten(await client.result("tasks.create", [
            task("root", deps=["first", "then"], method=None), nap("first", 0.5, "root"),
            nap("then", 0.0, "root", deps=["first"])]))
        assert tree["first"]["status"] == "in_progress" and tree["first"]["attempt"] == 1, tree["first"]
        assert tree["first"]["started_at"] >= tree["first"]["created_at"]
        assert tree["then"]["status"] == "pending" and tree["root"]["status"] == "pending"
        done = await client.wait_status("root", ("completed",))
        attempts = await client.result("tasks.attempts", {"task_id": "first"})
    assert done["status"] == "completed"
    assert [a["attempt"] for a in attempts] == [1], attempts


async def test_tasks_claimed_with_their_insert_keep_within_the_slots(app_factory: Any) -> None:
    """Creates arriving together each claim at most the slots still free (held until their
    tasks start); the rest wait pending for a pass, as before."""
    from tests.test_limits import most_at_once

    async with app_factory({"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_MAX_CONCURRENCY": "2"}) as client:
        answers = await asyncio.gather(*(client.result("tasks.create", [nap(f"s{i}", 0.5)]) for i in range(6)))
        assert sorted(a["status"] for a in answers) == ["in_progress"] * 2 + ["pending"] * 4, answers
        rows = [await client.wait_status(f"s{i}", ("completed",)) for i in range(6)]
    assert most_at_once(rows) == 2


async def test_a_create_claims_only_the_slots_no_queued_task_would_take(app_factory: Any) -> None:
    """PassLoop.reserve_for_insert, the rule itself: of the free slots, those the tasks queued now
    would take are left to them (fair order); only plain tasks (no dependencies, key or rate) are
    taken; held slots count until released; nothing while an executor has a cap; nothing pure (a
    pass completes it inline, agent/engine/inline.py)."""
    durable = {"schemas": {"method": "sleep_executor"}}
    new = [{"id": f"n{i}", "status": "pending", "priority": 1, "created_at": f"2026-01-01T00:00:0{i}", **durable}
           for i in range(3)]
    new += [{"id": "dep", "status": "pending", "priority": 0, "created_at": "2026-01-01", "dependencies": [{"id": "n0"}],
             **durable},
            {"id": "keyed", "status": "pending", "priority": 0, "created_at": "2026-01-01", "concurrency": {"key": "k"},
             **durable}]
    async with app_factory({"SERVICE_MAX_CONCURRENCY": "3"}) as client:
        passes = client.services.engine.passes
        passes.ready.push((1, "2026-01-01", "queued", "no-such-tree"), None)  # one task waits for a slot
        assert passes.reserve_for_insert(new) == ["n0", "n1"]
        assert passes.reserve_for_insert(new) == []  # every free slot is held or promised
        passes.release(["n0", "n1"])
        assert passes.reserve_for_insert([{**new[2], "priority": 0}, *new[:2]]) == ["n2", "n0"]
        passes.release(["n2", "n0"])
        assert passes.reserve_for_insert([{**new[0], "schemas": {"method": "noop_executor"}}]) == []
    async with app_factory({"SERVICE_EXECUTOR_CONCURRENCY": "noop_executor=1"}) as client:
        assert client.services.engine.passes.reserve_for_insert(new) == []


async def test_the_engine_loop_ends_when_cancelled_just_as_it_is_woken(app_factory: Any) -> None:
    """Shutdown cancels the pass loop, often just after waking it. On Python 3.11 a cancel that
    arrives in the same tick as the event `asyncio.wait_for` waits on is swallowed: the loop ran
    on and shutdown waited for it forever (a test's app took 300 s to stop)."""
    async with app_factory({}) as client:
        passes = client.services.engine.passes
        passes.retry_at("nobody", "no-tree", 3600)  # the loop's wait now has a timeout
        passes.wake.set()
        await asyncio.sleep(0.05)  # one pass, then the loop waits again
        loop = next(job for job in asyncio.all_tasks() if job.get_name() == "taskgrove-engine")
        passes.wake.set()
        loop.cancel()
        done, _ = await asyncio.wait([loop], timeout=2)
        assert done, "the engine loop went on after its cancel"
