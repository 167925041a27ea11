"""`ExecutionStore`: the executions' and leases' named operations (issue 44: storage offers named
operations; nothing above it hands functions to `transact`).

Each method is one transaction of its own running the statement function of storage/executions.py
of the same name, with the same arguments as before: what the engine's lease keeper, run re-reads,
shutdown and checkpoints, `follow_execution` and the A2A surface call. The pass loop's own
transaction (`TaskRepository.write_pass`) is not here. A module of its own because
storage/repository.py imports storage/executions.py, so the latter cannot import the repository.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from taskgrove.storage import executions
from taskgrove.storage.executions import Row, Write
from taskgrove.storage.repository import TaskRepository


class ExecutionStore:
    def __init__(self, repo: TaskRepository) -> None:
        self._repo = repo  # `repo.transact` looked up per call: tests hold a renewal there

    async def running(self, tree_id: str) -> Row | None:
        """The tree's running execution, or None."""
        return await self._repo.transact(executions.running_execution, tree_id)

    async def latest(self, tree_id: str) -> Row | None:
        """The tree's newest execution, running or ended, or None."""
        return await self._repo.transact(executions.latest_execution, tree_id)

    async def get(self, execution_id: str) -> Row | None:
        return await self._repo.transact(executions.get_execution, execution_id)

    async def renew(self, owner: str, task_ids: Sequence[str], execution_ids: Sequence[str],
                    until: str) -> tuple[set[str], set[str]]:
        return await self._repo.transact(executions.renew, owner, task_ids, execution_ids, until)

    async def expired_tasks(self, now: str | None) -> list[Row]:
        return await self._repo.transact(executions.expired_tasks, now)

    async def take_over(self, owner: str, until: str, stamp: str, only_expired: bool,
                        driven: Collection[str] = ()) -> list[Row]:
        return await self._repo.transact(executions.take_over, owner, until, stamp, only_expired, driven)

    async def interrupt(self, row: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
        return await self._repo.transact(executions.interrupt, row, values)

    async def release(self, owner: str, execution_ids: Sequence[str], stamp: str, error: str,
                      max_interruptions: int) -> list[str]:
        return await self._repo.transact(executions.release, owner, execution_ids, stamp, error, max_interruptions)

    async def fenced_writes(self, writes: Sequence[Write], owner: str) -> set[str]:
        return await self._repo.transact(executions.fenced_writes, writes, owner)
