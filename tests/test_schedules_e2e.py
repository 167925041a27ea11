"""Schedules across instances: two real `taskgrove serve` processes on one PostgreSQL database run
each slot exactly once (the compare-and-set on `next_run_at`), and every run completes."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL, postgres_database
from tests.processes import Service, start_together

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")

SCHEDULES = 4


async def run_copies(url: str) -> list[dict[str, Any]]:
    """Every run's root (a copy of a template), with its schedule, slot, status and owner instance."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT t.id, t.original_task_id, t.extra, t.status, e.owner FROM tasks t "
            "LEFT JOIN executions e ON e.task_tree_id = t.id WHERE t.original_task_id LIKE 'tpl-%' AND t.parent_id IS NULL")
    finally:
        await conn.close()
    return [{**dict(r), "extra": json.loads(r["extra"])} for r in rows]


@needs_postgres
async def test_two_instances_on_one_postgres_database_run_each_slot_exactly_once(tmp_path: Path) -> None:
    async with postgres_database() as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "10", "SERVICE_LEASE_SECONDS": "2"}
        a, b = start_together(Service(tmp_path, env, "a"), Service(tmp_path, env, "b"))
        try:
            ids = []
            for n in range(SCHEDULES):
                await a.rpc("tasks.create", [{"id": f"tpl-{n}", "name": "template"},
                                             {"id": f"tpl-{n}-step", "name": "step", "parent_id": f"tpl-{n}",
                                              "schemas": {"method": "noop_executor"}}])
                # Created on either instance; both run the same loop on the same rows.
                on = a if n % 2 else b
                ids.append((await on.rpc("schedules.create", {"task_id": f"tpl-{n}", "interval_seconds": 1,
                                                              "overlap": "allow"}))["id"])

            async def slots_done(at_least: int) -> bool:
                found = [await a.rpc("schedules.get", {"schedule_id": sid}) for sid in ids]
                return all(s["runs"] >= at_least for s in found)

            deadline = time.monotonic() + 30
            while not await slots_done(5):
                assert time.monotonic() < deadline, "schedules did not run 5 times each in 30 s"
                await asyncio.sleep(0.2)
            for sid in ids:
                await b.rpc("schedules.update", {"schedule_id": sid, "enabled": False})
            schedules = {sid: await a.rpc("schedules.get", {"schedule_id": sid}) for sid in ids}

            deadline = time.monotonic() + 30
            while True:  # every run completes, whichever instance claimed it
                copies = await run_copies(url)
                if copies and all(c["status"] == "completed" for c in copies):
                    break
                assert time.monotonic() < deadline, Counter(c["status"] for c in copies)
                await asyncio.sleep(0.2)
        finally:
            a.stop()
            b.stop()
        per_slot = Counter((c["extra"]["schedule_id"], c["extra"]["schedule_slot"]) for c in copies)
        assert per_slot and max(per_slot.values()) == 1, [k for k, v in per_slot.items() if v > 1]
        for sid, schedule in schedules.items():
            assert sum(1 for c in copies if c["extra"]["schedule_id"] == sid) == schedule["runs"]
        owners = Counter(c["owner"] for c in copies)
        print(f"{len(copies)} runs, one per slot; runs started per instance: {dict(owners)}")


async def test_a_run_cut_off_by_kill_9_is_continued_after_the_restart_and_no_slot_runs_twice(
        tmp_path: Path) -> None:
    """The claim and the run's copy and execution are one transaction: after kill -9 mid-run, the
    restarted service continues that run (nothing lost) and starts no second run for its slot."""
    service = Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}",
                                 "SERVICE_CREATE_WAIT_TIMEOUT": "10"}).start()
    try:
        await service.rpc("tasks.create", [{"id": "tpl-0", "name": "template", "dependencies": [{"id": "tpl-0-nap"}]},
                                           {"id": "tpl-0-nap", "name": "nap", "parent_id": "tpl-0",
                                            "schemas": {"method": "sleep_executor"}, "inputs": {"seconds": 1.5},
                                            # an interrupted attempt is a failed one: allow the resumed one
                                            "retry": {"max_attempts": 3, "base_seconds": 0.1}}])
        schedule = await service.rpc("schedules.create", {"task_id": "tpl-0", "interval_seconds": 1})
        deadline = time.monotonic() + 30
        while True:  # a run under way
            found = await service.rpc("schedules.get", {"schedule_id": schedule["id"]})
            if found["runs"] and (await service.task(found["last_root_task_id"]))["status"] != "completed":
                break
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.1)
        cut_off = found["last_root_task_id"]
        service.kill()
        service.start()
        await service.wait_status(cut_off, ("completed",))
        await service.rpc("schedules.update", {"schedule_id": schedule["id"], "enabled": False})
        final = await service.rpc("schedules.get", {"schedule_id": schedule["id"]})
        roots = [t for t in await service.rpc("tasks.list", {"limit": 1000})
                 if t["original_task_id"] == "tpl-0"]
        for root in roots:
            await service.wait_status(root["id"], ("completed",))
    finally:
        service.stop()
    slots = Counter(root["schedule_slot"] for root in roots)
    assert len(roots) == final["runs"] and max(slots.values()) == 1, slots
