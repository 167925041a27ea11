"""The `/system` operations: health, executor catalogue and the example trees.

Only examples.init has parameters (`InitExamples`, agent/foundations/requests_services.py); the others take
none, and their table entries ignore whatever params a request carries, as they always did.
"""

from __future__ import annotations

from typing import Any

from taskgrove.agent import __version__
from taskgrove.agent.engine.engine import Engine
from taskgrove.agent.services.examples import EXAMPLE_PRODUCT, example_trees
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.requests_services import InitExamples
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.services.task_service import TaskService
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import now_iso


# A transaction committed this recently proves the database answers: health needs no query of its own.
HEALTH_FRESH_SECONDS = 2.0


class SystemService:
    def __init__(self, repo: TaskRepository, engine: Engine, registry: ExecutorRegistry, tasks: TaskService) -> None:
        self.repo = repo
        self.engine = engine
        self.registry = registry
        self.tasks = tasks

    async def health(self, _ctx: CallContext) -> dict[str, Any]:
        try:
            await self.repo.ping(fresh_within=HEALTH_FRESH_SECONDS)
            status, message = "healthy", "Service is running"
        except Exception as exc:  # report, don't fail: health must always answer
            status, message = "unhealthy", f"Database unreachable: {type(exc).__name__}"
        return {
            "status": status,
            "message": message,
            "version": __version__,
            "timestamp": now_iso(),
            "running_tasks_count": len(self.engine.running),
        }

    async def executors(self, _ctx: CallContext) -> dict[str, Any]:
        descriptors = self.registry.descriptors()
        answer: dict[str, Any] = {
            "executors": descriptors,
            "count": len(descriptors),
            "restricted": self.registry.restricted,
        }
        if self.registry.restricted:
            answer["allowed_ids"] = self.registry.ids()
        return answer

    async def examples_status(self, _ctx: CallContext) -> dict[str, Any]:
        count = await self._example_count()
        return {
            "initialized": count > 0,
            "available": True,
            "message": f"{count} example tasks stored" if count else "Examples not initialized; call examples.init",
        }

    async def examples_init(self, request: InitExamples, ctx: CallContext) -> dict[str, Any]:
        if await self._example_count() and not request.force:
            return {"success": True, "created_count": 0, "message": "Examples already initialized (use force to add again)"}
        created = 0
        for tree in example_trees(self.registry.ids()):
            rows = await self.tasks.create_tree(NewTree.from_params(tree, self.tasks.settings.max_tree_tasks), ctx.caller)
            created += len(rows)
        return {"success": True, "created_count": created, "message": f"Created {created} example tasks"}

    async def _example_count(self) -> int:
        return await self.repo.count(product_id=EXAMPLE_PRODUCT)


