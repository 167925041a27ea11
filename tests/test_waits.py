"""Durable waits (issue 29, docs/waits.md) through the ASGI app, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Client

APPROVAL_SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}


def approval_tree(root: str, **extra_inputs: Any) -> list[dict[str, Any]]:
    """prepare -> approve (waits for input) -> ship, all under a root that aggregates them."""
    return [
        {"id": root, "name": "refund", "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"{root}-ship", "required": True}]},
        {"id": f"{root}-prep", "name": "prepare", "parent_id": root, "schemas": {"method": "noop_executor"}},
        {"id": f"{root}-approve", "name": "approve", "parent_id": root,
         "schemas": {"method": "human_input_executor"},
         "inputs": {"prompt": "Approve the refund?", "schema": APPROVAL_SCHEMA, **extra_inputs},
         "dependencies": [{"id": f"{root}-prep", "required": True}]},
        {"id": f"{root}-ship", "name": "ship", "parent_id": root, "schemas": {"method": "aggregate_results_executor"},
         "dependencies": [{"id": f"{root}-approve", "required": True}]},
    ]


async def start(client: Client, tasks: list[dict[str, Any]]) -> None:
    await client.result("tasks.create", tasks)  # answers once the tree waits or ends? no: it returns the tree


async def parked(client: Client, task_id: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        task = await client.result("tasks.get", {"task_id": task_id})
        if task and task.get("waiting"):
            return task
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} never waited: {task}"
        await asyncio.sleep(0.02)


async def test_approval_in_the_middle_waits_then_completes(client: Client) -> None:
    execution = asyncio.create_task(client.result("tasks.create", approval_tree("r1")))
    task = await parked(client, "r1-approve")
    assert task["status"] == "in_progress"
    wait = task["waiting"]
    assert wait["kind"] == "input" and wait["prompt"] == "Approve the refund?"
    assert wait["schema"] == APPROVAL_SCHEMA and wait["since"] and wait["deadline"] is None
    assert (await client.result("tasks.get", {"task_id": "r1-ship"}))["status"] == "pending"
    assert not execution.done()
    assert "r1-approve" not in client.services.engine.running  # no slot held
    listed = await client.result("tasks.list", {"waiting": True})
    assert [t["id"] for t in listed] == ["r1-approve"]
    answer = await client.result("tasks.respond", {"task_id": "r1-approve", "value": {"approved": True}})
    assert answer["status"] == "resumed"
    await asyncio.wait_for(execution, 10)
    done = await client.wait_status("r1", ("completed", "failed"))
    assert done["status"] == "completed"
    approve = await client.result("tasks.get", {"task_id": "r1-approve"})
    assert approve["result"] == {"approved": True} and approve["waiting"] is None and approve["attempt"] == 1
    ship = await client.result("tasks.get", {"task_id": "r1-ship"})
    assert ship["result"]["results"]["r1-approve"] == {"approved": True}
    again = await client.error("tasks.respond", {"task_id": "r1-approve", "value": {"approved": False}})
    assert again["code"] == -32602 and "not waiting for input" in again["message"]
