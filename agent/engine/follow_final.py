"""Follow one execution to its end: the one rule behind every stream and webhook's `final`.

SPEC.md: `final` is always sent last. The owner's `final` event reaches followers on its own
instance through the bus, and on other instances through LISTEN/NOTIFY; but a follower may start
after it was sent, NOTIFY may be lost, or the owner may die and another instance take over. So a
follower does not count on seeing the event: whenever it has heard nothing for a while it looks
at the database, which is the truth, and once the stored execution has ended it produces `final`
from the stored outcome (`executions.final_status` and the tree's stored progress).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any
import asyncio

from taskgrove.agent.engine.bus import FINAL
from taskgrove.agent.engine.bus import BusSubscription
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import FINISHED_STATUSES, TaskStatus
from taskgrove.storage.clock import now_iso

# How long a follower waits for an event before it asks the database whether the execution ended.
CHECK_EVERY = 1.0


async def follow_execution(repo: TaskRepository, subscription: BusSubscription, tree_id: str,
                           check_every: float = CHECK_EVERY) -> AsyncGenerator[dict[str, Any], None]:
    """The engine events of the tree's execution, ending with exactly one `final`.

    `subscription` must match the tree's events and be open before the execution is started or
    joined, so nothing is missed. The events seen are yielded as they come; when the stored
    execution has ended and its own `final` has not arrived, a `final` read from the database
    is yielded instead. Closes the subscription.
    """
    try:
        while True:
            try:  # asyncio.timeout, not wait_for: a cancel (the client went away) must end the stream
                async with asyncio.timeout(check_every):
                    event = await subscription.get()
            except TimeoutError:
                if await ExecutionStore(repo).running(tree_id) is None:
                    yield await stored_final(repo, tree_id)
                    return
                continue
            yield event
            if event["type"] == FINAL:
                return
    finally:
        subscription.close()


async def stored_final(repo: TaskRepository, tree_id: str) -> dict[str, Any]:
    """A `final` engine event for the tree's latest execution, as the database has it."""
    execution = await ExecutionStore(repo).latest(tree_id)
    rows = await repo.tree(tree_id)
    return final_event(tree_id, execution, rows)


def final_event(tree_id: str, execution: Mapping[str, Any] | None,
                rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `final` event of a stored execution: its final status and its members' progress."""
    status = _stored_status(tree_id, execution, rows)
    members = [r for r in rows if execution is not None and r.get("execution_id") == execution["id"]] or rows
    done = sum(1 for r in members if r["status"] in FINISHED_STATUSES)
    progress = 1.0 if status == TaskStatus.COMPLETED or not members else round(done / len(members), 4)
    return {"type": FINAL, "task_id": tree_id, "root_task_id": tree_id, "name": None, "user_id": None,
            "status": status, "progress": progress, "tree_progress": progress, "task_count": len(rows),
            "final": True, "message": f"Execution {status}", "timestamp": now_iso()}


def _stored_status(tree_id: str, execution: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> str:
    """The execution's stored final status; a tree never executed reports its root's status."""
    if execution is not None and execution.get("final_status"):
        return str(execution["final_status"])
    root = next((r for r in rows if r["id"] == tree_id), None)
    return str(root["status"]) if root is not None else TaskStatus.FAILED.value
