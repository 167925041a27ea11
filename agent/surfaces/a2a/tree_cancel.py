"""Stopping an agent task's tree: cancel it (A2A tasks/cancel), or discard it (a plan replaced).

Both the executor's `cancel` and the follow-up that replaces or refines a plan waiting for its
approval stop every pending and running task of the tree through the engine, so the work really
stops; a discarded tree is then deleted whole, so that the new one can take its root id (the
agent task's context id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taskgrove.storage.status import TaskStatus

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

CANCEL_REASON = "Cancelled through the agent protocol (tasks/cancel)"
DISCARD_REASON = "The plan was replaced before it was approved"
LIVE_STATUSES = (TaskStatus.IN_PROGRESS.value, TaskStatus.PENDING.value)  # in this order: stop running work first
CANCEL_PASSES = 3  # a cancelled task can make a pending one runnable for a moment; look again
DISCARD_WAIT = 10.0  # seconds for the cancelled tree's execution to end before its rows go


async def cancel_tree(services: "A2AServices", root: str, reason: str = CANCEL_REASON) -> tuple[int, list[dict[str, Any]]]:
    """Cancel every live task of tree `root`: (how many were cancelled, the tree's rows after)."""
    repo, engine = services.repo, services.engine
    cancelled = 0
    rows = await repo.tree(root)
    for _ in range(CANCEL_PASSES):
        live = [r for status in LIVE_STATUSES for r in rows if r["status"] == status]
        if not live:
            break
        for row in live:
            outcome = await engine.cancel(row["id"], reason)
            cancelled += outcome["status"] == TaskStatus.CANCELLED
        rows = await repo.tree(root)
    return cancelled, rows


async def discard_tree(services: "A2AServices", root: str) -> None:
    """Cancel tree `root`, let its execution end (a new tree under the same root must not join
    it), then delete every row of it."""
    await cancel_tree(services, root, DISCARD_REASON)
    run = await services.engine.run_keeper.following(root)
    if run is not None:
        await services.engine.run_keeper.wait(run, DISCARD_WAIT)
    async with services.repo.transaction() as conn:
        rows = await services.repo.tree(root)  # children an executor added count too
        await services.repo.delete([r["id"] for r in rows], conn)
