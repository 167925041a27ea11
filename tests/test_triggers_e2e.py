"""Triggers across real `taskgrove serve` processes (docs/triggers.md): two instances on one PostgreSQL
database start exactly one run per event, and a debounce, a batch, a singleton replace and a
cancel_on each come out the same through a kill -9 and a restart in the middle."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL, postgres_database
from tests.processes import Service, start_together

needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason="needs TASKGROVE_TEST_POSTGRES_URL (set by .ci/run)")
WAIT = 90.0


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        await asyncio.sleep(0.1)


async def ended_runs(service: Service, trigger_id: str, count: int) -> list[dict[str, Any]] | None:
    found = await service.rpc("triggers.runs", {"trigger_id": trigger_id, "limit": 1000})
    return found if len(found) >= count and all(r["final_status"] for r in found) else None


async def gated(service: Service) -> None:
    """A template whose run goes on until the event `finish` lets it end."""
    await service.rpc("tasks.create", [
        {"id": "gated", "name": "gated", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": "gated-gate"}]},
        {"id": "gated-gate", "name": "gate", "parent_id": "gated", "schemas": {"method": "event_wait_executor"},
         "inputs": {"event": "finish", "timeout_seconds": 600}}])


async def parked(service: Service, root: str) -> bool:
    tree = await service.rpc("tasks.tree", {"task_id": root})
    return any(child.get("waiting") for child in tree["children"])


async def roots_of(url: str) -> list[dict[str, Any]]:
    """Every run's root a trigger started, with the events it holds (from the database itself)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT t.id, t.extra, t.inputs, t.status FROM tasks t JOIN trigger_runs r "
                                "ON r.root_task_id = t.id")
    finally:
        await conn.close()
    return [{**dict(r), "extra": json.loads(r["extra"]), "inputs": json.loads(r["inputs"])} for r in rows]


@needs_postgres
async def test_two_instances_start_exactly_one_run_per_event_and_one_per_debounced_key(tmp_path: Path) -> None:
    async with postgres_database() as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "10", "SERVICE_LEASE_SECONDS": "2"}
        a, b = start_together(Service(tmp_path, env, "a"), Service(tmp_path, env, "b"))
        try:
            await a.rpc("tasks.create", [{"id": "tpl", "name": "t", "schemas": {"method": "noop_executor"}}])
            each = await a.rpc("triggers.create", {"task_id": "tpl", "event": "job"})
            calm = await b.rpc("triggers.create", {"task_id": "tpl", "event": "chat", "key": "room",
                                                   "debounce": {"seconds": 1.5}})
            emitted = await asyncio.gather(*(
                (a if n % 2 else b).rpc("events.emit", {"name": "job", "payload": {"n": n}}) for n in range(30)))
            for n in range(20):  # one key, both instances, in order
                await (a if n % 2 else b).rpc("events.emit", {"name": "chat", "payload": {"room": "r1", "n": n}})
            await until(lambda: ended_runs(a, each["id"], 30), "30 runs ended")
            await until(lambda: ended_runs(b, calm["id"], 1), "the debounced run ended")
            await asyncio.sleep(2)  # a duplicate, if any, would start within a look or two
            roots = await roots_of(url)
        finally:
            a.stop()
            b.stop()
    per_event = Counter(e for root in roots if root["extra"]["trigger_id"] == each["id"]
                        for e in root["extra"]["trigger_event_ids"])
    assert per_event == Counter({e["event_id"]: 1 for e in emitted})
    debounced = [root for root in roots if root["extra"]["trigger_id"] == calm["id"]]
    assert len(debounced) == 1 and debounced[0]["inputs"]["event"] == {"room": "r1", "n": 19}
    assert all(root["status"] == "completed" for root in roots)


@needs_postgres
async def test_a_debounce_left_by_an_instance_killed_with_9_is_run_by_the_other(tmp_path: Path) -> None:
    async with postgres_database() as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "10", "SERVICE_LEASE_SECONDS": "2"}
        a, b = start_together(Service(tmp_path, env, "a"), Service(tmp_path, env, "b"))
        try:
            await a.rpc("tasks.create", [{"id": "tpl", "name": "t", "schemas": {"method": "noop_executor"}}])
            trigger = await a.rpc("triggers.create", {"task_id": "tpl", "event": "chat", "key": "room",
                                                      "debounce": {"seconds": 3}})
            for n in range(10):
                await a.rpc("events.emit", {"name": "chat", "payload": {"room": "r1", "n": n}})
            a.kill()
            found = await until(lambda: ended_runs(b, trigger["id"], 1), "the run, started by b")
        finally:
            a.stop()
            b.stop()
    assert len(found) == 1 and found[0]["events"] == 10 and found[0]["final_status"] == "completed"


def sqlite_service(tmp_path: Path) -> Service:
    return Service(tmp_path, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}",
                              "SERVICE_CREATE_WAIT_TIMEOUT": "10"})


async def test_debounce_and_batch_come_out_the_same_through_a_kill_9_and_a_restart(tmp_path: Path) -> None:
    service = sqlite_service(tmp_path).start()
    try:
        await service.rpc("tasks.create", [{"id": "tpl", "name": "t", "schemas": {"method": "noop_executor"}}])
        calm = await service.rpc("triggers.create", {"task_id": "tpl", "event": "chat", "key": "room",
                                                     "debounce": {"seconds": 3}})
        rows = await service.rpc("triggers.create", {"task_id": "tpl", "event": "row",
                                                     "batch": {"size": 10, "seconds": 3}})
        for n in range(50):
            await service.rpc("events.emit", {"name": "chat", "payload": {"room": "r1", "n": n}})
        for n in range(35):
            await service.rpc("events.emit", {"name": "row", "payload": {"n": n}})
        service.kill()  # the debounce's window is open, the last 5 rows wait for their batch
        service.start()
        debounced = await until(lambda: ended_runs(service, calm["id"], 1), "the debounced run")
        batches = await until(lambda: ended_runs(service, rows["id"], 4), "four batches")
        payloads = []
        for run in batches:
            root = await service.task(run["root_task_id"])
            payloads += [p["n"] for p in root["inputs"]["events"]]
        last = (await service.task(debounced[0]["root_task_id"]))["inputs"]["event"]
        await asyncio.sleep(4)  # nothing more comes after the windows
        assert len(await service.rpc("triggers.runs", {"trigger_id": calm["id"]})) == 1
        assert len(await service.rpc("triggers.runs", {"trigger_id": rows["id"]})) == 4
    finally:
        service.stop()
    assert last == {"room": "r1", "n": 49} and debounced[0]["events"] == 50
    assert sorted(run["events"] for run in batches) == [5, 10, 10, 10] and sorted(payloads) == list(range(35))


async def test_replace_and_cancel_on_reach_runs_that_outlived_a_kill_9(tmp_path: Path) -> None:
    service = sqlite_service(tmp_path).start()
    try:
        await gated(service)
        one = await service.rpc("triggers.create", {"task_id": "gated", "event": "req", "key": "user",
                                                    "singleton": "replace"})
        closing = await service.rpc("triggers.create", {"task_id": "gated", "event": "open", "key": "id",
                                                        "cancel_on": "close"})
        await service.rpc("events.emit", {"name": "req", "payload": {"user": "ann", "n": 0}})
        await service.rpc("events.emit", {"name": "open", "payload": {"id": "A"}})
        for trigger in (one, closing):
            started = await until(lambda t=trigger: service.rpc("triggers.runs", {"trigger_id": t["id"]}), "a run")
            await until(lambda r=started[0]["root_task_id"]: parked(service, r), "its gate parked")
        service.kill()
        service.start()
        await service.rpc("events.emit", {"name": "req", "payload": {"user": "ann", "n": 1}})
        await service.rpc("events.emit", {"name": "close", "payload": {"id": "A"}})
        newest = await until(lambda: _second(service, one["id"]), "the replacing run")
        await until(lambda: parked(service, newest["root_task_id"]), "its gate parked")
        await service.rpc("events.emit", {"name": "finish"})
        replaced = await until(lambda: ended_runs(service, one["id"], 2), "both runs of ann ended")
        cancelled = await until(lambda: ended_runs(service, closing["id"], 1), "the cancelled run ended")
    finally:
        service.stop()
    by_status = {run["status"]: run for run in replaced}
    assert set(by_status) == {"completed", "cancelled"}
    assert "Replaced by a newer run" in by_status["cancelled"]["cancel_reason"]
    assert cancelled[0]["status"] == "cancelled" and "Cancelled by event 'close'" in cancelled[0]["cancel_reason"]


async def _second(service: Service, trigger_id: str) -> dict[str, Any] | None:
    found = await service.rpc("triggers.runs", {"trigger_id": trigger_id})
    return found[0] if len(found) >= 2 else None
