"""Retention (agent/services/retention_service.py, docs/retention.md): whole trees that ended long ago are deleted,
with their executions and idempotency records; nothing running, waiting, pending or a schedule's
template is touched. Through the real surfaces (JSON-RPC tasks.purge, /metrics, the background
sweeper of SERVICE_RETENTION), on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from sqlalchemy import func, select

from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.errors import INVALID_PARAMS, PERMISSION_DENIED, RpcError
from taskgrove.agent.foundations.requests import PurgeTasks
from taskgrove.agent.foundations.settings import Settings, SettingsError, parse_duration
from taskgrove.storage.models import events_table, executions_table, idempotency_table, tasks_table
from tests.conftest import Client, running_app


def noop_tree(root: str, size: int = 3) -> list[dict[str, Any]]:
    return [{"id": root, "name": root},
            *({"id": f"{root}-{i}", "name": "step", "parent_id": root, "schemas": {"method": "noop_executor"}}
              for i in range(size - 1))]


async def count(client: Client, table: Any, *where: Any) -> int:
    query = select(func.count()).select_from(table).where(*where)
    return await client.services.repo.transact(lambda c: int(c.execute(query).scalar_one()))


async def tree_ids(client: Client) -> set[str]:
    query = select(tasks_table.c.task_tree_id).distinct()
    return await client.services.repo.transact(lambda c: {row[0] for row in c.execute(query)})


async def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := await check()):
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)
    return found


async def test_purge_deletes_ended_trees_and_nothing_else(make_settings: Callable[..., Settings]) -> None:
    env = {"SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_SCHEDULE_KEEP_RUNS": "2"}
    async with running_app(make_settings(env)) as client:
        for root in ("done-1", "done-2"):
            await client.result("tasks.create", noop_tree(root), headers={"Idempotency-Key": f"key-{root}"})
            await client.wait_status(root, ("completed",))
        await client.result("tasks.create", {"tasks": [{"id": "bad", "name": "bad"},
                                                       {"id": "bad-1", "name": "x", "parent_id": "bad",
                                                        "schemas": {"method": "sleep_executor"},
                                                        "inputs": {"seconds": "not a number"}}]})
        await client.wait_status("bad-1", ("failed",))
        # A root waiting on a failed required dependency stays pending; its execution ended: the
        # tree is over all the same (without this, no failed tree would ever be swept).
        await client.result("tasks.create", [
            {"id": "blocked", "name": "blocked", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": "blocked-1", "required": True}]},
            {"id": "blocked-1", "name": "x", "parent_id": "blocked", "schemas": {"method": "sleep_executor"},
             "inputs": {"seconds": "not a number"}}])
        await client.wait_status("blocked-1", ("failed",))
        await until(lambda: _execution_ended(client, "blocked"), 10, "the blocked tree's execution to end")
        assert (await client.result("tasks.get", {"task_id": "blocked"}))["status"] == "pending"
        # A tree running during the sweep (one task done, one sleeping), one parked on a wait for
        # input, one stored and never executed (pending), a schedule's template (completed).
        await client.result("tasks.create", [
            {"id": "busy", "name": "busy"},
            {"id": "busy-done", "name": "quick", "parent_id": "busy", "schemas": {"method": "noop_executor"}},
            {"id": "busy-sleep", "name": "slow", "parent_id": "busy", "schemas": {"method": "sleep_executor"},
             "inputs": {"seconds": 3600}}])
        await client.wait_status("busy-sleep", ("in_progress",))
        await client.wait_status("busy-done", ("completed",))
        await client.result("tasks.create", [
            {"id": "asks", "name": "asks", "schemas": {"method": "human_input_executor"},
             "inputs": {"prompt": "Go?"}}])
        await until(lambda: _waiting(client, "asks"), 10, "the wait")
        await client.result("tasks.copy", {"task_id": "done-1"})  # a stored copy, pending, never executed
        await client.result("tasks.create", noop_tree("tpl", 2))
        await client.wait_status("tpl", ("completed",))
        schedule = await client.result("schedules.create", {"task_id": "tpl", "cron": "0 0 1 1 *"})
        runs = []
        for _ in range(4):
            run = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
            await client.wait_status(run["root_task_id"], ("completed",))
            runs.append(run["root_task_id"])
        before = await tree_ids(client)

        # Retention of 30 days: nothing is old enough; only the schedule's runs beyond the newest 2 go.
        answer = await client.result("tasks.purge", {"older_than": "30d"})
        assert answer == {"swept": True, "trees": 2, "tasks": 4, "idempotency_records": 0, "events": 0,
                          "trigger_events": 0, "older_than": 30 * 86_400.0}
        assert await tree_ids(client) == before - set(runs[:2])

        await asyncio.sleep(0.05)  # everything that ended, ended more than 0.01 s ago
        keys = await count(client, idempotency_table)
        assert keys == 2
        answer = await client.result("tasks.purge", {"older_than": 0.01})
        ended = {"done-1", "done-2", "bad", "blocked", *runs[2:]}
        assert answer["trees"] == len(ended) and answer["idempotency_records"] == 2
        assert answer["tasks"] == 3 + 3 + 2 + 2 + 2 * 2
        left = await tree_ids(client)
        assert left & ended == set()
        copy = [t for t in left if t not in {"busy", "asks", "tpl"}]
        assert len(copy) == 1 and left == {"busy", "asks", "tpl", *copy}
        assert await client.result("tasks.get", {"task_id": "done-1"}) is None
        assert (await client.result("tasks.get", {"task_id": "busy-done"}))["status"] == "completed"
        assert (await client.result("tasks.get", {"task_id": "busy-sleep"}))["status"] == "in_progress"
        assert (await client.result("tasks.get", {"task_id": "asks"}))["waiting"]["prompt"] == "Go?"
        # The deleted trees' executions are gone; those of the trees still there are kept.
        assert await count(client, executions_table, executions_table.c.task_tree_id.in_(ended)) == 0
        assert await count(client, executions_table, executions_table.c.task_tree_id.in_(["busy", "asks", "tpl"])) == 3
        assert await count(client, idempotency_table) == 0
        # The schedule still runs from its template.
        run = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
        await client.wait_status(run["root_task_id"], ("completed",))

        metrics = (await client.http.get("/metrics")).text
        assert f'taskgrove_retention_deleted_total{{kind="trees"}} {float(2 + len(ended))}' in metrics
        assert f'taskgrove_retention_deleted_total{{kind="tasks"}} {float(4 + answer["tasks"])}' in metrics
        assert 'taskgrove_retention_deleted_total{kind="idempotency_records"} 2.0' in metrics

        # A sweep again finds nothing more to delete.
        again = await client.result("tasks.purge", {"older_than": "1s"})
        assert again["trees"] == 0 and again["tasks"] == 0
        await client.result("tasks.cancel", {"task_ids": ["busy-sleep", "asks"]})


async def test_purge_deletes_old_events_no_parked_wait_can_count(make_settings: Callable[..., Settings]) -> None:
    """An event counts for a parked wait of its user and name that began at or before it: those are
    kept however old; every other event older than the retention goes."""
    async with running_app(make_settings({"SERVICE_CREATE_WAIT_TIMEOUT": "0"})) as client:
        before = await emit(client, "deployed", {"service": "api"})  # before the wait began: never counted
        await client.result("tasks.create", [{"id": "gate", "name": "gate", "schemas": {"method": "event_wait_executor"},
                                              "inputs": {"event": "deployed", "match": {"service": "api"}}}])
        await until(lambda: _waiting(client, "gate"), 10, "the event wait")
        unmatched = await emit(client, "deployed", {"service": "web"})  # after: the wait may count it
        others = [await emit(client, "built", {}), await emit(client, "deployed", {"service": "api"}, "alice")]
        await asyncio.sleep(0.05)
        assert (await client.result("tasks.purge", {"older_than": "1h"}))["events"] == 0  # none old enough
        answer = await client.result("tasks.purge", {"older_than": 0.01})
        assert answer["events"] == 3 and answer["trees"] == 0
        assert await event_ids(client) == {unmatched}
        assert before not in await event_ids(client) and not set(others) & await event_ids(client)

        # The wait still works; once it has ended, nothing needs its events any more.
        assert (await emit_answer(client, "deployed", {"service": "api"}))["task_ids"] == ["gate"]
        await client.wait_status("gate", ("completed",))
        await asyncio.sleep(0.05)
        answer = await client.result("tasks.purge", {"older_than": 0.01})
        assert answer["events"] == 2 and answer["trees"] == 1
        assert await event_ids(client) == set()
        metrics = (await client.http.get("/metrics")).text
        assert 'taskgrove_retention_deleted_total{kind="events"} 5.0' in metrics


async def emit(client: Client, name: str, payload: dict[str, Any], user_id: str | None = None) -> str:
    return str((await emit_answer(client, name, payload, user_id))["event_id"])


async def emit_answer(client: Client, name: str, payload: dict[str, Any], user_id: str | None = None) -> Any:
    return await client.result("events.emit", {"name": name, "payload": payload,
                                               **({"user_id": user_id} if user_id else {})})


async def event_ids(client: Client) -> set[str]:
    query = select(events_table.c.id)
    return await client.services.repo.transact(lambda c: {row[0] for row in c.execute(query)})


async def _waiting(client: Client, task_id: str) -> bool:
    task = await client.result("tasks.get", {"task_id": task_id})
    return bool(task and task.get("waiting"))


async def test_the_sweeper_of_service_retention_deletes_in_the_background(
        make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings({"SERVICE_RETENTION": "1"})) as client:
        await client.result("tasks.create", noop_tree("old"))
        await emit(client, "deployed", {})
        await client.wait_status("old", ("completed",))
        await until(lambda: _gone(client, "old"), 15, "the sweeper deleting the ended tree")
        await until(lambda: _no_events(client), 15, "the sweeper deleting the old event")
        metrics = (await client.http.get("/metrics")).text
        assert 'taskgrove_retention_deleted_total{kind="tasks"} 3.0' in metrics
        assert 'taskgrove_retention_deleted_total{kind="events"} 1.0' in metrics


async def _no_events(client: Client) -> bool:
    return not await event_ids(client)


async def _gone(client: Client, task_id: str) -> bool:
    return await client.result("tasks.get", {"task_id": task_id}) is None


async def test_purge_is_for_admins_and_needs_a_duration(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings({"SERVICE_JWT_SECRET": "s" * 32})
    async with running_app(settings) as client:
        user = {"Authorization": f"Bearer {mint_token(settings, 'alice')}"}
        admin = {"Authorization": f"Bearer {mint_token(settings, 'root', ['admin'])}"}
        assert (await client.error("tasks.purge", {"older_than": "1d"}, headers=user))["code"] == PERMISSION_DENIED
        error = await client.error("tasks.purge", {}, headers=admin)  # SERVICE_RETENTION is off
        assert error["code"] == INVALID_PARAMS and "older_than" in error["data"]
        for bad in ("soon", "-1d", "0", [1], True, "1e400s", "nan"):
            error = await client.error("tasks.purge", {"older_than": bad}, headers=admin)
            assert error["code"] == INVALID_PARAMS and "older_than" in error["data"], bad
        assert (await client.result("tasks.purge", {"older_than": 7200}, headers=admin))["older_than"] == 7200.0


def test_service_retention_reads_durations_and_names_itself_when_wrong() -> None:
    assert Settings.from_env({}).retention_seconds is None
    assert Settings.from_env({"SERVICE_RETENTION": "30d"}).retention_seconds == 30 * 86_400
    assert Settings.from_env({"SERVICE_RETENTION": "12h"}).retention_seconds == 12 * 3600
    assert Settings.from_env({"SERVICE_RETENTION": "90"}).retention_seconds == 90
    assert Settings.from_env({"SERVICE_RETENTION": "off"}).retention_seconds is None
    with pytest.raises(SettingsError, match="SERVICE_RETENTION"):
        Settings.from_env({"SERVICE_RETENTION": "a month"})
    with pytest.raises(SettingsError, match="SERVICE_SCHEDULE_KEEP_RUNS"):
        Settings.from_env({"SERVICE_SCHEDULE_KEEP_RUNS": "0"})


@hsettings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.booleans(), st.none(),
                 st.lists(st.integers(), max_size=2)))
def test_older_than_is_a_positive_duration_or_a_clear_error(raw: Any) -> None:
    """Any value: a PurgeTasks with seconds above 0, or -32602 naming older_than; never another error."""
    try:
        request = PurgeTasks.from_params({"older_than": raw})
    except RpcError as exc:
        assert exc.code == INVALID_PARAMS and "older_than" in str(exc.data)
        return
    if raw is None:
        assert request.older_than is None
    else:
        assert request.older_than is not None and 0 < request.older_than
        assert request.older_than == parse_duration(str(raw))


@given(st.integers(min_value=1, max_value=36_500), st.sampled_from(["s", "m", "h", "d", ""]))
def test_a_duration_means_its_number_of_units(number: int, unit: str) -> None:
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "": 1}[unit]
    assert parse_duration(f"{number}{unit}") == number * seconds


async def test_one_sweeper_at_a_time(backend: str, db_url: str,
                                                  make_settings: Callable[..., Settings]) -> None:
    """While another instance holds the sweeper's lock, a sweep here deletes nothing and says so.
    SQLite has no such lock (one writer): two sweeps at once delete each tree once."""
    async with running_app(make_settings()) as client:
        await client.result("tasks.create", noop_tree("old"))
        await asyncio.sleep(0.05)
        if backend != "postgres":
            both = await asyncio.gather(*(client.result("tasks.purge", {"older_than": 0.01}) for _ in range(2)))
            assert sorted(answer["trees"] for answer in both) == [0, 1]
            assert sorted(answer["tasks"] for answer in both) == [0, 3]
            return
        import asyncpg

        other = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock(74252)") is True
            answer = await client.result("tasks.purge", {"older_than": 0.01})
            assert answer["swept"] is False and answer["trees"] == 0
            assert await client.result("tasks.get", {"task_id": "old"}) is not None
        finally:
            await other.close()  # the other instance goes: its lock with it
        answer = await client.result("tasks.purge", {"older_than": 0.01})
        assert answer["swept"] is True and answer["trees"] == 1


async def _execution_ended(client: Client, tree_id: str) -> bool:
    query = select(func.count()).select_from(executions_table).where(
        executions_table.c.task_tree_id == tree_id, executions_table.c.status != "running")
    return bool(await client.services.repo.transact(lambda c: int(c.execute(query).scalar_one())))
