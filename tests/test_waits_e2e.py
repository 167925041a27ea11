"""Durable waits through real `taskgrove serve` processes (issue 29): a wait survives kill -9, an
answer sent to another instance resumes the tree exactly once, an event emitted while the
instance that drives the tree is down (or restarting) is delivered, once, a durable timer wakes at
its stored time after kill -9, and 1,000 waiting tasks hold no slot while another tree runs.

Side effects are counted from a file (as in tests/test_durability_e2e.py): the work before the wait
runs once, the work after it runs once after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import postgres_database
from tests.deadlines import EVENT_WAIT, HEAVY_WORK_TIMEOUT
from tests.processes import Service, start_together
from tests.test_durability_e2e import command_task, needs_postgres, pg_rows, side_effects, sqlite_rows, wait_until


def gated_tree(marker: Path, gate_id: str, executor: str, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """prep (a command) -> `gate_id` (a wait: `executor` with `inputs`) -> ship (a command), under
    a root R."""
    root = {"id": "R", "name": "R", "schemas": {"method": "noop_executor"}, "dependencies": [{"id": "ship"}]}
    gate = {"id": gate_id, "name": gate_id, "parent_id": "R", "schemas": {"method": executor},
            "inputs": inputs, "dependencies": [{"id": "prep"}]}
    return [root, command_task("prep", "R", marker, 0.0), gate,
            command_task("ship", "R", marker, 0.0, deps=[gate_id])]


def approval_tree(marker: Path) -> list[dict[str, Any]]:
    """The gate `approve` waits for a yes or no."""
    return gated_tree(marker, "approve", "human_input_executor", {"prompt": "Ship it?", "schema": {"type": "boolean"}})


DEPLOYED = {"service": "api", "version": "1.4.2"}


def deploy_tree(marker: Path) -> list[dict[str, Any]]:
    """The gate `gate` waits for the `deployed` event of the `api` service."""
    return gated_tree(marker, "gate", "event_wait_executor", {"event": "deployed", "match": {"service": "api"}})


async def parked(service: Service, task_id: str, timeout: float = EVENT_WAIT) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task = await service.task(task_id)
        if task and task.get("waiting"):
            return task
        assert time.monotonic() < deadline, f"{task_id} never waited: {task}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def restarted_while_waiting(tmp_path: Path, tree: list[dict[str, Any]], task_id: str
                                  ) -> AsyncIterator[tuple[Service, Path]]:
    """One instance on SQLite runs `tree` until `task_id` waits, is killed -9 (the wait stays
    stored: the task is in_progress) and started again; yields it and its database file."""
    db = tmp_path / "tg.db"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{db}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_COMMAND_ALLOWLIST": "sh"}
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", tree)
        await parked(service, task_id)
        service.kill()
        assert {r["id"]: r["status"] for r in sqlite_rows(db)}[task_id] == "in_progress"
        service.start()
        yield service, db
    finally:
        service.stop()


async def test_kill_9_while_waiting_then_restart_and_answer(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    async with restarted_while_waiting(tmp_path, approval_tree(marker), "approve") as (service, db):
        task = await parked(service, "approve")  # still waiting: not taken for an interrupted attempt
        assert task["interruptions"] == 0 and task["waiting"]["prompt"] == "Ship it?"
        assert (await service.rpc("tasks.respond", {"task_id": "approve", "value": True}))["status"] == "resumed"
        await service.wait_status("R", ("completed",))
        rows = {r["id"]: r for r in sqlite_rows(db)}
        assert rows["approve"]["attempt"] == 1 and rows["approve"]["interruptions"] == 0
        assert (await service.task("approve"))["result"] is True
        assert side_effects(marker) == {"prep": 1, "ship": 1}


async def test_kill_9_while_waiting_for_an_event_then_restart_and_emit(tmp_path: Path) -> None:
    """SQLite (one instance): kill -9 while a task waits for an event; the event is emitted as soon
    as the restarted instance answers (its recovery of the tree may not have run yet), and the tree
    completes with the payload as the gate's result, once."""
    marker = tmp_path / "ran.txt"
    async with restarted_while_waiting(tmp_path, deploy_tree(marker), "gate") as (service, db):
        emitted = await service.rpc("events.emit", {"name": "deployed", "payload": DEPLOYED})
        assert emitted["resumed"] == 1 and emitted["task_ids"] == ["gate"]
        await service.wait_status("R", ("completed",))
        await _delivered_once(service, marker)
        rows = {r["id"]: r for r in sqlite_rows(db)}
        assert rows["gate"]["attempt"] == 1 and rows["gate"]["interruptions"] == 0


async def test_a_durable_timer_survives_kill_9_and_wakes_at_its_stored_time(tmp_path: Path) -> None:
    """SQLite: a sleep_executor task long enough to park (SERVICE_PARK_SLEEP_SECONDS lowered to 1)
    is a durable timer; kill -9 while it waits, a new process on the same file: the task completes
    at or after the wake time the first process stored, as the same attempt resumed (docs/waits.md:
    same attempt number, no retry used up), not as a sleep started again from zero (which would
    park a second time, with a later deadline)."""
    db = tmp_path / "tg.db"
    env = {"SERVICE_DATABASE_URL": f"sqlite:///{db}", "SERVICE_CREATE_WAIT_TIMEOUT": "0",
           "SERVICE_PARK_SLEEP_SECONDS": "1"}
    nap = 3
    service = Service(tmp_path, env).start()
    try:
        await service.rpc("tasks.create", [{"id": "nap", "name": "nap", "schemas": {"method": "sleep_executor"},
                                            "inputs": {"seconds": nap}}])
        wait = (await parked(service, "nap"))["waiting"]
        assert wait["kind"] == "timer" and wait["deadline"]
        service.kill()
        stored = _stored_wait(db, "nap")  # what the killed process left in the file
        assert stored["status"] == "in_progress" and stored["waiting"]
        deadline = _moment(stored["wake_at"])
        assert deadline == _moment(wait["deadline"]) and deadline >= _moment(wait["since"])
        service.start()
        done = await service.wait_status("nap", ("completed", "failed"))
        assert done["status"] == "completed" and done["result"] == {"slept": nap} and done["waiting"] is None
        assert done["attempt"] == 1 and done["interruptions"] == 0
        assert _moment(done["completed_at"]) >= deadline
        attempts = await service.rpc("tasks.attempts", {"task_id": "nap"})
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "waiting"), (1, "completed")], attempts
        assert _moment(attempts[1]["started_at"]) >= deadline  # woke at the stored time, not before
    finally:
        service.stop()


def _stored_wait(db: Path, task_id: str) -> dict[str, Any]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT status, waiting, wake_at FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return dict(row)


def _moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


async def _delivered_once(service: Service, marker: Path) -> None:
    """The gate's result is the event's payload, the work around it ran once, and the same event
    again resumes nothing."""
    gate = await service.task("gate")
    assert gate["status"] == "completed" and gate["result"] == DEPLOYED and gate["waiting"] is None
    assert side_effects(marker) == {"prep": 1, "ship": 1}
    again = await service.rpc("events.emit", {"name": "deployed", "payload": DEPLOYED})
    assert again["resumed"] == 0
    assert (await service.task("gate"))["result"] == DEPLOYED


@contextlib.asynccontextmanager
async def two_instances(tmp_path: Path, lease_seconds: str) -> AsyncIterator[tuple[str, Service, Service]]:
    """Instances A and B on a fresh PostgreSQL database (its url too), stopped afterwards."""
    async with postgres_database() as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0", "SERVICE_COMMAND_ALLOWLIST": "sh",
               "SERVICE_LEASE_SECONDS": lease_seconds}
        a, b = start_together(Service(tmp_path, env, "a"), Service(tmp_path, env, "b"))
        try:
            yield url, a, b
        finally:
            a.stop()
            b.stop()


@needs_postgres
async def test_an_answer_sent_to_b_resumes_the_tree_a_drives_once(tmp_path: Path) -> None:
    """A drives the tree; the answer reaches B, which tells A (NOTIFY). The lease is long (60 s), so
    a quick end proves that no takeover was needed; side effects prove nothing ran twice."""
    marker = tmp_path / "ran.txt"
    async with two_instances(tmp_path, "60") as (url, a, b):
        await a.rpc("tasks.create", approval_tree(marker))
        await parked(b, "approve")  # read on B: the database is the truth
        answers = await asyncio.gather(b.call("tasks.respond", {"task_id": "approve", "value": True}),
                                       a.call("tasks.respond", {"task_id": "approve", "value": False}))
        assert sum("result" in answer for answer in answers) == 1, answers
        winner = "result" in answers[0]  # B's answer was True, A's False
        # within 15 s, far below the 60 s lease: the answer resumed A's run, no takeover did
        await wait_until(lambda: _completed(b), 15, "the tree to end after the answer")
        rows = {r["id"]: r for r in await pg_rows(url)}
        assert rows["approve"]["result"] is winner and rows["approve"]["attempt"] == 1
        assert side_effects(marker) == {"prep": 1, "ship": 1}
        assert "continuing the execution" not in b.log() + a.log()


@needs_postgres
async def test_kill_9_of_the_driver_while_waiting_b_takes_over_and_the_answer_resumes(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    async with two_instances(tmp_path, "2") as (_, a, b):
        await a.rpc("tasks.create", approval_tree(marker))
        await parked(a, "approve")
        a.kill()
        await wait_until(lambda: _log_has(b, "continuing the execution"), 20, "B to take the tree over")
        task = await parked(b, "approve")
        assert task["status"] == "in_progress" and task["interruptions"] == 0
        await b.rpc("tasks.respond", {"task_id": "approve", "value": True})
        await wait_until(lambda: _completed(b), 20, "the tree to end")
        assert side_effects(marker) == {"prep": 1, "ship": 1}


@needs_postgres
@pytest.mark.parametrize("a_restarts", [True, False], ids=["a-restarts", "b-takes-over"])
async def test_an_event_emitted_to_b_while_the_driver_is_down_is_delivered_once(tmp_path: Path,
                                                                                 a_restarts: bool) -> None:
    """A drives a tree whose gate waits for an event; A is killed -9; the event is emitted to B while
    A is down (it ends the wait in the database: nobody drives the tree then). Then either A restarts
    (whichever instance continues the tree: A's restart or B's takeover) or A stays down (B takes the
    tree over); the tree completes with the payload as the gate's result, and nothing runs twice."""
    marker = tmp_path / "ran.txt"
    async with two_instances(tmp_path, "2") as (url, a, b):
        await a.rpc("tasks.create", deploy_tree(marker))
        await parked(a, "gate")
        a.kill()
        emitted = await b.rpc("events.emit", {"name": "deployed", "payload": DEPLOYED})
        assert emitted["resumed"] == 1 and emitted["task_ids"] == ["gate"]
        assert (await b.task("gate"))["waiting"] is None  # the wait ended in the database, on B
        if a_restarts:
            a.start()
        await wait_until(lambda: _completed(b), 30, "the tree to end after the event")
        await _delivered_once(b, marker)
        rows = {r["id"]: r for r in await pg_rows(url)}
        assert rows["gate"]["attempt"] == 1 and rows["gate"]["result"] == DEPLOYED
        assert "continuing the execution" in (a.log() + b.log() if a_restarts else b.log())


async def _completed(service: Service) -> bool:
    return (await service.task("R"))["status"] == "completed"


async def _log_has(service: Service, text: str) -> bool:
    return text in service.log()


# --- 1,000 waits hold no slot --------------------------------------------------------------------

SLOTS = 4


@contextlib.asynccontextmanager
async def fresh_database(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """The url of an empty database: a SQLite file in `tmp_path`, or a PostgreSQL database of its own."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'tg.db'}"
        return
    async with postgres_database() as url:
        yield url


def thousand_waits(half: int) -> list[dict[str, Any]]:
    """One tree: a root over `half` tasks waiting for input and `half` waiting for the `deployed`
    event of the batch `many` (as tests/test_waits.py's in-process test)."""
    count = 2 * half
    tree = [{"id": "many", "name": "many", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": f"w{n}"} for n in range(count)]}]
    tree += [{"id": f"w{n}", "name": f"w{n}", "parent_id": "many", "schemas": {"method": "human_input_executor"},
              "inputs": {"prompt": f"answer w{n}"}} for n in range(half)]
    tree += [{"id": f"w{n}", "name": f"w{n}", "parent_id": "many", "schemas": {"method": "event_wait_executor"},
              "inputs": {"event": "deployed", "match": {"batch": "many"}}} for n in range(half, count)]
    return tree


def busy_tree(size: int, seconds: float) -> list[dict[str, Any]]:
    """A root over `size` independent sleeps, each holding a slot for `seconds` (the services here
    sleep in process below SERVICE_PARK_SLEEP_SECONDS: tests/processes.py)."""
    tree = [{"id": "busy", "name": "busy", "schemas": {"method": "aggregate_results_executor"},
             "dependencies": [{"id": f"b{n}"} for n in range(size)]}]
    tree += [{"id": f"b{n}", "name": f"b{n}", "parent_id": "busy", "schemas": {"method": "sleep_executor"},
              "inputs": {"seconds": seconds}} for n in range(size)]
    return tree


def most_at_once(attempts: list[dict[str, Any]]) -> int:
    """The largest number of these attempts running at one moment, from their stored start and end
    (one that ends at the moment another starts does not overlap it)."""
    starts = [(_moment(a["started_at"]), 1) for a in attempts]
    edges = sorted(starts + [(_moment(a["ended_at"]), -1) for a in attempts])  # at one moment, ends first
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=needs_postgres)])
async def test_a_thousand_waits_hold_no_slot_while_another_tree_runs_at_full_speed(tmp_path: Path,
                                                                                   kind: str) -> None:
    """1,000 tasks wait at once (500 for input, 500 for an event) in a `taskgrove serve` with
    SERVICE_MAX_CONCURRENCY 4. Another tree of 24 sleeps of 0.3 s (each holds its slot) then runs:
    its own attempt records show 4 of its tasks running at one moment, so the waits took none of
    the slots ("full speed", shown without timing), and it completes while all 1,000 still wait.
    Then the answers (tasks.respond for each input, one events.emit) end all 1,000."""
    half, busy_size = 500, 24
    count = 2 * half
    async with fresh_database(kind, tmp_path) as url:
        env = {"SERVICE_DATABASE_URL": url, "SERVICE_CREATE_WAIT_TIMEOUT": "0",
               "SERVICE_MAX_CONCURRENCY": str(SLOTS), "SERVICE_RATE_LIMIT_PER_USER": "0"}
        service = Service(tmp_path, env).start()
        try:
            await service.rpc("tasks.create", thousand_waits(half))
            await wait_until(lambda: _waiting_are(service, count), 60, "the 1,000 tasks to wait")
            assert (await service.rpc("tasks.running.count", {}))["count"] == 0
            await service.rpc("tasks.create", busy_tree(busy_size, 0.3))
            await wait_until(lambda: _ended(service, "busy"), 30, "the busy tree to end")
            assert (await service.task("busy"))["status"] == "completed"
            attempts = await service.rpc("tasks.attempts", {"task_id": "busy", "tree": True})
            sleeps = [a for a in attempts if a["task_id"] != "busy"]
            assert sorted(a["task_id"] for a in sleeps) == sorted(f"b{n}" for n in range(busy_size))
            assert {a["outcome"] for a in sleeps} == {"completed"}
            assert most_at_once(sleeps) == SLOTS, "the waits took slots from the busy tree"
            # all 1,000 still wait, holding nothing
            assert await _waiting_are(service, count)
            assert (await service.rpc("tasks.running.count", {}))["count"] == 0
            metrics = httpx.get(f"{service.url}/metrics", timeout=HEAVY_WORK_TIMEOUT).text
            assert f'taskgrove_parked_tasks{{kind="input"}} {half}.0' in metrics
            assert f'taskgrove_parked_tasks{{kind="event"}} {half}.0' in metrics
            for first in range(0, half, 50):
                answers = await asyncio.gather(*(service.rpc("tasks.respond", {"task_id": f"w{n}", "value": n})
                                                 for n in range(first, first + 50)))
                assert all(answer["status"] == "resumed" for answer in answers)
            emitted = await service.rpc("events.emit", {"name": "deployed", "payload": {"batch": "many"}})
            assert emitted["resumed"] == half
            done = await service.wait_status("many", ("completed", "failed"), timeout=60)
            assert done["status"] == "completed" and done["result"]["count"] == count
            assert await _waiting_are(service, 0)
            assert (await service.task("w7"))["result"] == 7
            assert (await service.task(f"w{count - 1}"))["result"] == {"batch": "many"}
        finally:
            service.stop()


async def _waiting_are(service: Service, count: int) -> bool:
    """Whether tasks.list with `waiting: true` shows exactly `count` tasks (1,000 at most)."""
    return len(await service.rpc("tasks.list", {"waiting": True, "limit": 1000})) == count


async def _ended(service: Service, task_id: str) -> bool:
    return (await service.task(task_id))["status"] in ("completed", "failed")
