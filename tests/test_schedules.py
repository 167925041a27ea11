"""Schedules: slot arithmetic (pure functions, fixed datetimes), and schedules.* over /tasks and /
on both backends: runs per interval, overlap, catch-up after a restart, disable, delete, permissions,
bad input. Every wait is a polling loop on a condition with a generous deadline; no timing is asserted
tighter than "about".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import jwt
import pytest

from taskgrove.agent.engine import slots
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.settings import Settings
from tests.conftest import Client, running_app

UTC = timezone.utc
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def cron(expr: str, tz: str = "UTC", **fields: Any) -> dict[str, Any]:
    return {"cron": expr, "timezone": tz, "interval_seconds": None, "start_at": None, "end_at": None,
            "created_at": "2026-01-01T00:00:00.000000+00:00", **fields}


# --- pure: next slot -----------------------------------------------------------------------------

def test_cron_slots_in_a_time_zone_are_stored_in_utc() -> None:
    spec = cron("0 9 * * 1-5", "Europe/Berlin")
    after = datetime(2026, 1, 9, 12, tzinfo=UTC)  # a Friday, past 09:00 Berlin
    slot = slots.next_slot(spec, after)
    assert slot == datetime(2026, 1, 12, 8, tzinfo=UTC)  # Monday 09:00 CET = 08:00 UTC
    assert slots.iso(slot) == "2026-01-12T08:00:00.000000+00:00"
    assert slots.next_slot(spec, slot) == datetime(2026, 1, 13, 8, tzinfo=UTC)  # strictly after
    summer = slots.next_slot(spec, datetime(2026, 7, 1, 12, tzinfo=UTC))
    assert summer == datetime(2026, 7, 2, 7, tzinfo=UTC)  # 09:00 CEST = 07:00 UTC


def test_dst_spring_forward_a_missing_wall_time_runs_once_after_the_gap() -> None:
    # 2026-03-08 02:00 does not exist in New York (02:00 EST -> 03:00 EDT).
    spec = cron("30 2 * * *", "America/New_York")
    day_before = slots.next_slot(spec, datetime(2026, 3, 7, 12, tzinfo=UTC))
    assert day_before == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 03:00 EDT, the first moment after the gap
    after_gap = slots.next_slot(spec, day_before)
    assert after_gap == datetime(2026, 3, 9, 2, 30, tzinfo=NEW_YORK).astimezone(UTC)
    assert after_gap - day_before < timedelta(hours=24)  # one run on the 8th, one on the 9th
    # Berlin, the last Sunday of March: 02:00 -> 03:00.
    berlin = cron("0 2 * * *", "Europe/Berlin")
    slot = slots.next_slot(berlin, datetime(2026, 3, 28, 12, tzinfo=UTC))
    assert slot.astimezone(BERLIN).date().isoformat() == "2026-03-29"
    assert slots.next_slot(berlin, slot) == datetime(2026, 3, 30, 0, tzinfo=UTC)  # 02:00 CEST


def test_dst_fall_back_a_repeated_wall_time_runs_once() -> None:
    # 2026-11-01 01:30 happens twice in New York (EDT, then EST): one run, at the first.
    spec = cron("30 1 * * *", "America/New_York")
    first = slots.next_slot(spec, datetime(2026, 10, 31, 12, tzinfo=UTC))
    assert first == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert slots.next_slot(spec, first) == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)  # next day, 01:30 EST
    # Europe/Berlin, last Sunday of October: 02:30 happens twice.
    berlin = cron("30 2 * * *", "Europe/Berlin")
    first = slots.next_slot(berlin, datetime(2026, 10, 24, 12, tzinfo=UTC))
    assert first == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert slots.next_slot(berlin, first) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)  # 02:30 CET
    # An hourly wildcard follows real time: both 01:00s run (an hour apart, as every hour).
    hourly = cron("0 * * * *", "America/New_York")
    one = slots.next_slot(hourly, datetime(2026, 11, 1, 4, 30, tzinfo=UTC))
    assert one == datetime(2026, 11, 1, 5, 0, tzinfo=UTC)
    assert slots.next_slot(hourly, one) == datetime(2026, 11, 1, 6, 0, tzinfo=UTC)


def test_interval_slots_start_end_and_plan() -> None:
    spec = {"cron": None, "interval_seconds": 60.0, "timezone": "UTC", "start_at": None, "end_at": None,
            "created_at": "2026-01-01T00:00:00.000000+00:00"}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert slots.next_slot(spec, t0) == t0 + timedelta(seconds=60)  # one interval after creation
    assert slots.next_slot(spec, t0 + timedelta(seconds=60)) == t0 + timedelta(seconds=120)
    assert slots.next_slot(spec, t0 + timedelta(seconds=3601.5)) == t0 + timedelta(seconds=3660)
    started = {**spec, "start_at": "2026-02-01T00:00:00.000000+00:00",
               "end_at": "2026-02-01T00:02:00.000000+00:00"}
    assert slots.next_slot(started, t0) == datetime(2026, 2, 1, tzinfo=UTC)  # start_at is the first slot
    assert slots.next_slot(started, datetime(2026, 2, 1, 0, 1, tzinfo=UTC)) == datetime(2026, 2, 1, 0, 2, tzinfo=UTC)
    assert slots.next_slot(started, datetime(2026, 2, 1, 0, 2, tzinfo=UTC)) is None  # past end_at
    # A slot due now runs; a slot missed by an hour runs with catch_up latest, not with none; the
    # next slot is the first after now either way (missed slots collapse into one).
    slot = t0 + timedelta(seconds=60)
    assert slots.plan(spec, slot, slot + timedelta(seconds=0.5)) == (True, slot + timedelta(seconds=60))
    late = slot + timedelta(hours=1, seconds=1)
    assert slots.plan({**spec, "catch_up": "latest"}, slot, late) == (True, t0 + timedelta(seconds=3720))
    assert slots.plan({**spec, "catch_up": "none"}, slot, late) == (False, t0 + timedelta(seconds=3720))


# --- over the wire ---------------------------------------------------------------------------------

async def until(predicate: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def template(client: Client, root: str = "tpl", seconds: float | None = None, **kw: Any) -> str:
    """A stored (not executed) template tree: a root and one child (sleeping `seconds` if given)."""
    child: dict[str, Any] = {"id": f"{root}-child", "name": "child", "parent_id": root}
    if seconds is not None:
        child.update(schemas={"method": "sleep_executor"}, inputs={"seconds": seconds})
    else:
        child.update(schemas={"method": "noop_executor"})
    template = [{"id": root, "name": "template", "dependencies": [{"id": child["id"]}]}, child]
    await client.services.tasks.create_tree(NewTree.from_params(template), kw.get("caller") or _anyone())
    return root


def _anyone() -> Any:
    from taskgrove.agent.foundations.auth import Caller

    return Caller()


async def copies_of(client: Client, template_id: str, **headers: Any) -> list[dict[str, Any]]:
    rows = await client.result("tasks.list", {"limit": 1000}, **headers)
    return [r for r in rows if r["original_task_id"] == template_id]


async def test_an_interval_schedule_runs_about_once_per_interval_each_run_a_copy(
        make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        tpl = await template(client)
        schedule = await client.result("schedules.create", {"task_id": tpl, "interval_seconds": 1})
        assert schedule["runs"] == 0 and schedule["next_run_at"] and schedule["enabled"] is True
        assert schedule["overlap"] == "skip" and schedule["catch_up"] == "latest" and schedule["timezone"] == "UTC"
        await until(lambda: _runs(client, schedule["id"], 1), 20, "the first run")
        began = time.monotonic()
        first = await client.result("schedules.get", {"schedule_id": schedule["id"]})
        await asyncio.sleep(4)
        now = await client.result("schedules.get", {"schedule_id": schedule["id"]})
        elapsed = time.monotonic() - began
        # About one run per second: generous bounds, a loaded machine may be late.
        assert 1 <= now["runs"] - first["runs"] <= elapsed + 2, (now, elapsed)
        await client.result("schedules.update", {"schedule_id": schedule["id"], "enabled": False})
        stopped = await client.result("schedules.get", {"schedule_id": schedule["id"]})
        assert stopped["next_run_at"] is None and stopped["enabled"] is False
        # Each run is a copy of the template, with the slot it ran for on its root.
        copies = await copies_of(client, tpl)
        assert len(copies) == stopped["runs"]
        assert all(c["schedule_id"] == schedule["id"] and c["schedule_slot"] for c in copies)
        assert len({c["schedule_slot"] for c in copies}) == len(copies)
        last = await client.wait_status(stopped["last_root_task_id"], ("completed",))
        assert last["original_task_id"] == tpl
        tree = await client.result("tasks.tree", {"task_id": last["id"]})
        assert [c["original_task_id"] for c in tree["children"]] == [f"{tpl}-child"]
        assert (await client.result("tasks.get", {"task_id": tpl}))["status"] == "pending"  # the template never runs
        # Disabled: no new runs.
        await asyncio.sleep(2.5)
        assert (await client.result("schedules.get", {"schedule_id": schedule["id"]}))["runs"] == stopped["runs"]
        assert len(await copies_of(client, tpl)) == stopped["runs"]


async def _runs(client: Client, schedule_id: str, at_least: int) -> dict[str, Any] | None:
    found = await client.result("schedules.get", {"schedule_id": schedule_id})
    return found if found["runs"] >= at_least else None


async def test_overlap_skip_skips_slots_while_a_run_is_going_allow_does_not(
        make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        tpl = await template(client, seconds=3.5)
        skip = await client.result("schedules.create", {"task_id": tpl, "interval_seconds": 1})
        first = await until(lambda: _runs(client, skip["id"], 1), 20, "the first run")
        # While the first run sleeps, every slot is consumed without a run.
        later = await until(lambda: _skipped(client, skip["id"], 2), 20, "skipped slots")
        running = await client.result("tasks.get", {"task_id": first["last_root_task_id"]})
        if running["status"] not in ("completed", "failed"):
            assert later["runs"] == 1 or later["last_root_task_id"] == first["last_root_task_id"]
        assert later["last_skipped_at"] is not None
        await client.result("schedules.delete", {"schedule_id": skip["id"]})
        await client.wait_status(first["last_root_task_id"], ("completed",))
        # No run of the skipping schedule overlapped another: each started after the previous ended.
        runs = sorted((c for c in await copies_of(client, tpl)), key=lambda c: c["schedule_slot"])
        for before, after in zip(runs, runs[1:]):
            done = await client.wait_status(before["id"], ("completed",))
            start = await client.result("tasks.get", {"task_id": after["id"]})
            assert start["created_at"] >= done["completed_at"], (before, after)
        allow_tpl = await template(client, "tpl2", seconds=3.5)
        allow = await client.result("schedules.create", {"task_id": allow_tpl, "interval_seconds": 1,
                                                         "overlap": "allow"})
        await until(lambda: _runs(client, allow["id"], 3), 20, "three overlapping runs")

        async def two_running() -> bool:
            statuses = [c["status"] for c in await copies_of(client, allow_tpl)]
            return statuses.count("in_progress") + statuses.count("pending") >= 2

        await until(two_running, 20, "two runs at the same time")
        await client.result("schedules.delete", {"schedule_id": allow["id"]})
        assert await client.result("schedules.get", {"schedule_id": allow["id"]}) is None


async def _skipped(client: Client, schedule_id: str, at_least: int) -> dict[str, Any] | None:
    found = await client.result("schedules.get", {"schedule_id": schedule_id})
    return found if found["skipped"] >= at_least else None


@pytest.mark.parametrize("catch_up", ["latest", "none"])
async def test_a_slot_missed_while_stopped_runs_once_with_latest_and_not_with_none(
        make_settings: Callable[..., Settings], catch_up: str) -> None:
    settings = make_settings()
    # The first instance's scheduler is off: however slow this machine, the slot cannot run before
    # the stop. The second one starts after the slot (and the on-time grace) has passed.
    async with running_app(settings.with_(enable_scheduler=False)) as client:
        tpl = await template(client)
        start_at = datetime.now(UTC) + timedelta(seconds=1)
        schedule = await client.result("schedules.create", {
            "task_id": tpl, "interval_seconds": 3600, "start_at": start_at.isoformat(), "catch_up": catch_up})
        assert schedule["next_run_at"] == slots.iso(start_at)
    # Stopped while the slot passes, and then some (more than the on-time grace).
    await asyncio.sleep(max(0.0, (start_at - datetime.now(UTC)).total_seconds()) + slots.ON_TIME_GRACE_SECONDS + 1.5)
    async with running_app(settings) as client:
        moved = await until(lambda: _moved_on(client, schedule["id"], schedule["next_run_at"]), 20,
                            "the missed slot to be dealt with")
        assert moved["next_run_at"] == slots.iso(start_at + timedelta(hours=1))
        copies = await copies_of(client, tpl)
        if catch_up == "latest":
            assert moved["runs"] == 1 and moved["skipped"] == 0 and len(copies) == 1
            assert copies[0]["schedule_slot"] == schedule["next_run_at"]
            await client.wait_status(copies[0]["id"], ("completed",))
        else:
            assert moved["runs"] == 0 and moved["skipped"] == 1 and copies == []


async def _moved_on(client: Client, schedule_id: str, slot: str) -> dict[str, Any] | None:
    found = await client.result("schedules.get", {"schedule_id": schedule_id})
    return found if found["next_run_at"] != slot else None


async def test_trigger_max_runs_delete_and_the_agent_surface(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        tpl = await template(client)
        schedule = await client.result("schedules.create", {"task_id": tpl, "cron": "0 0 1 1 *",
                                                            "timezone": "Europe/Berlin", "max_runs": 2},
                                       path="/")  # the task methods are on / too
        assert schedule["next_run_at"].endswith("T23:00:00.000000+00:00")  # midnight in Berlin, in UTC
        one = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
        assert one["runs"] == 1 and one["root_task_id"] == one["last_root_task_id"]
        assert one["next_run_at"] == schedule["next_run_at"]  # a manual run consumes no slot
        done = await client.wait_status(one["root_task_id"], ("completed",))
        assert done["original_task_id"] == tpl and done["schedule_id"] == schedule["id"]
        two = await client.result("schedules.trigger", {"id": schedule["id"]}, path="/")
        assert two["runs"] == 2 and two["next_run_at"] is None  # max_runs reached: no more slots
        listed = await client.result("schedules.list", {"task_id": tpl})
        assert [s["id"] for s in listed] == [schedule["id"]]
        assert (await client.result("schedules.delete", {"schedule_id": schedule["id"]}))["success"] is True
        assert await client.result("schedules.list", {}) == []
        error = await client.error("schedules.trigger", {"schedule_id": schedule["id"]})
        assert error["code"] == -32602 and "schedule_id" in error["data"]


async def test_a_deleted_schedule_runs_no_more(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings()) as client:
        tpl = await template(client)
        schedule = await client.result("schedules.create", {"task_id": tpl, "interval_seconds": 1})
        await until(lambda: _runs(client, schedule["id"], 1), 20, "the first run")
        await client.result("schedules.delete", {"schedule_id": schedule["id"]})
        count = len(await copies_of(client, tpl))
        await asyncio.sleep(2.5)
        assert len(await copies_of(client, tpl)) == count


SECRET = "s" * 32


def token(user: str, roles: list[str] | None = None) -> dict[str, str]:
    claims: dict[str, Any] = {"user_id": user, "exp": int(time.time()) + 3600}
    if roles:
        claims["roles"] = roles
    return {"Authorization": "Bearer " + jwt.encode(claims, SECRET, algorithm="HS256")}


async def test_permissions_follow_the_templates_owner(make_settings: Callable[..., Settings]) -> None:
    async with running_app(make_settings({"SERVICE_JWT_SECRET": SECRET})) as client:
        alice, bob, admin = token("alice"), token("bob"), token("root", ["admin"])
        await client.result("tasks.create", {"tasks": [{"id": "a-tpl", "name": "t"}]}, headers=alice)
        denied = await client.error("schedules.create", {"task_id": "a-tpl", "interval_seconds": 60}, headers=bob)
        assert denied["code"] == -32001
        mine = await client.result("schedules.create", {"task_id": "a-tpl", "interval_seconds": 60}, headers=alice)
        assert mine["user_id"] == "alice"
        for method in ("schedules.get", "schedules.update", "schedules.delete", "schedules.trigger"):
            error = await client.error(method, {"schedule_id": mine["id"]}, headers=bob)
            assert error["code"] == -32001, (method, error)
        assert await client.result("schedules.list", {}, headers=bob) == []
        assert [s["id"] for s in await client.result("schedules.list", {}, headers=alice)] == [mine["id"]]
        by_admin = await client.result("schedules.create", {"task_id": "a-tpl", "interval_seconds": 60},
                                       headers=admin)
        assert by_admin["user_id"] == "alice"  # a schedule belongs to its template's owner
        updated = await client.result("schedules.update", {"schedule_id": mine["id"], "interval_seconds": 120},
                                      headers=admin)
        assert updated["interval_seconds"] == 120.0


@pytest.mark.parametrize(("params", "field"), [
    ({"task_id": "nope", "interval_seconds": 5}, "task_id"),
    ({"interval_seconds": 5}, "task_id"),
    ({"task_id": "T"}, "cron, interval_seconds"),
    ({"task_id": "T", "cron": "* * * * *", "interval_seconds": 5}, "cron, interval_seconds"),
    ({"task_id": "T", "cron": "61 * * * *"}, "cron"),
    ({"task_id": "T", "cron": "* * * *"}, "cron"),
    ({"task_id": "T", "cron": "0 0 30 2 *"}, "cron"),
    ({"task_id": "T", "cron": 5}, "cron"),
    ({"task_id": "T", "interval_seconds": 0.5}, "interval_seconds"),
    ({"task_id": "T", "interval_seconds": "5"}, "interval_seconds"),
    ({"task_id": "T", "interval_seconds": True}, "interval_seconds"),
    ({"task_id": "T", "interval_seconds": 5, "timezone": "Mars/Olympus"}, "timezone"),
    ({"task_id": "T", "interval_seconds": 5, "timezone": "../../etc/passwd"}, "timezone"),
    ({"task_id": "T", "interval_seconds": 5, "overlap": "sometimes"}, "overlap"),
    ({"task_id": "T", "interval_seconds": 5, "catch_up": "all"}, "catch_up"),
    ({"task_id": "T", "interval_seconds": 5, "enabled": "yes"}, "enabled"),
    ({"task_id": "T", "interval_seconds": 5, "max_runs": 0}, "max_runs"),
    ({"task_id": "T", "interval_seconds": 5, "start_at": "tomorrow"}, "start_at"),
    ({"task_id": "T", "interval_seconds": 5, "start_at": "2027-01-02T00:00:00Z",
      "end_at": "2027-01-01T00:00:00Z"}, "end_at"),
    ({"task_id": "T", "interval_seconds": 5, "webhook_config": {"url": "ftp://x"}}, "webhook_config"),
    ({"task_id": "T", "interval_seconds": 5, "color": "red"}, "color"),
    ({"task_id": "T-child", "interval_seconds": 5}, "task_id"),
])
async def test_bad_input_is_invalid_params_naming_the_field(client: Client, params: dict[str, Any],
                                                            field: str) -> None:
    await template(client, "T")
    error = await client.error("schedules.create", params)
    assert error["code"] == -32602, error
    assert field in error["data"], error


async def test_update_checks_like_create_and_switches_between_cron_and_interval(client: Client) -> None:
    await template(client, "T")
    schedule = await client.result("schedules.create", {"task_id": "T", "interval_seconds": 60})
    error = await client.error("schedules.update", {"schedule_id": schedule["id"], "timezone": "Nowhere/Land"})
    assert error["code"] == -32602 and "timezone" in error["data"]
    error = await client.error("schedules.update", {"schedule_id": schedule["id"], "task_id": "other"})
    assert error["code"] == -32602 and "task_id" in error["data"]
    error = await client.error("schedules.update", {"schedule_id": "nope", "enabled": False})
    assert error["code"] == -32602 and "schedule_id" in error["data"]
    switched = await client.result("schedules.update", {"schedule_id": schedule["id"], "cron": "*/5 * * * *"})
    assert switched["cron"] == "*/5 * * * *" and switched["interval_seconds"] is None
    assert switched["next_run_at"] != schedule["next_run_at"]
    assert await client.result("schedules.get", {"schedule_id": "nope"}) is None


async def test_each_run_posts_its_events_to_the_schedules_webhook(make_settings: Callable[..., Settings]) -> None:
    from tests.servers import receiver

    async with running_app(make_settings()) as client, receiver() as hook:
        tpl = await template(client)
        schedule = await client.result("schedules.create", {
            "task_id": tpl, "cron": "0 0 1 1 *", "webhook_config": {"url": hook.url, "headers": {"X-Secret": "s3"}}})
        assert schedule["webhook_config"]["url"] == hook.url
        assert schedule["webhook_config"]["headers"] == {"X-Secret": "***"}  # not echoed
        run = await client.result("schedules.trigger", {"schedule_id": schedule["id"]})
        root = run["root_task_id"]
        await hook.wait_for(lambda reqs: any(r["json"]["type"] == "final" and r["json"]["root_task_id"] == root
                                             for r in reqs), timeout=20)
        final = next(r for r in hook.requests if r["json"]["type"] == "final")
        assert final["json"]["status"] == "completed" and final["headers"]["x-secret"] == "s3"
        assert {r["json"]["root_task_id"] for r in hook.requests} == {root}
        # The schedule sent back as read (header values masked) keeps the stored secret.
        read = await client.result("schedules.get", {"schedule_id": schedule["id"]})
        await client.result("schedules.update", {"schedule_id": schedule["id"],
                                                 "webhook_config": {**read["webhook_config"], "timeout": 10}})
        again = (await client.result("schedules.trigger", {"schedule_id": schedule["id"]}))["root_task_id"]
        await hook.wait_for(lambda reqs: any(r["json"]["type"] == "final" and r["json"]["root_task_id"] == again
                                             for r in reqs), timeout=20)
        assert all(r["headers"]["x-secret"] == "s3" for r in hook.requests)
