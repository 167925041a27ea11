"""Durable waits through real `taskgrove serve` processes (issue 29): a wait survives kill -9, an
answer sent to another instance resumes the tree exactly once, and an event emitted while the
instance that drives the tree is down (or restarting) is delivered, once.

Side effects are counted from a file (as in tests/test_durability_e2e.py): the work before the wait
runs once, the work after it runs once after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import postgres_database
from tests.processes import Service
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


async def parked(service: Service, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
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
        await service.wait_status("R", ("completed",), timeout=20)
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
        await service.wait_status("R", ("completed",), timeout=20)
        await _delivered_once(service, marker)
        rows = {r["id"]: r for r in sqlite_rows(db)}
        assert rows["gate"]["attempt"] == 1 and rows["gate"]["interruptions"] == 0


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
        a = Service(tmp_path, env, "a").start()
        b = Service(tmp_path, env, "b").start()
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
        took = await wait_until(lambda: _completed(b), 15, "the tree to end after the answer")
        assert took < 10
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
