"""No orphan left waiting: a task parked on a remote agent's question cancels the remote task when
it ends without an answer (docs/agents.md, "Questions that cross the hop").

A task of `a2a_agent_executor` whose remote task asked (`input-required`) is parked: no executor
runs for it, so the executor's own cancel hook cannot reach the remote task. Its checkpoint says
what it waits on (`asking: true`, `remote_task_id`, `agent_url`, executors/a2a_questions.py). When
such a task is cancelled (tasks.cancel, a cancelled tree) or fails (its `answer_timeout_seconds`
passed), this listener, on the instance where that happened, sends tasks/cancel to the remote
agent. It watches the bus for `task_cancelled` and `task_failed` (a watcher, not a subscriber: a plain
run still builds no events nobody subscribed to).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from taskgrove.agent.engine.bus import TASK_CANCELLED, TASK_FAILED, Event, EventBus
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.repository import TaskRepository

log = logging.getLogger(__name__)

ENDED = (TASK_CANCELLED, TASK_FAILED)


def asked_remote(checkpoint: Any) -> tuple[str, str] | None:
    """(agent URL, remote task id) when the checkpoint says the task waits on a remote question."""
    if not isinstance(checkpoint, Mapping) or checkpoint.get("asking") is not True:
        return None
    url, remote = checkpoint.get("agent_url"), checkpoint.get("remote_task_id")
    if isinstance(url, str) and url and isinstance(remote, str) and remote:
        return url, remote
    return None


class RemoteQuestionCancels:
    """Cancels the remote task of a local task that ended while a remote agent's question waited."""

    def __init__(self, repo: TaskRepository, bus: EventBus, settings: Settings) -> None:
        self.repo = repo
        self.bus = bus
        self.settings = settings
        self._unwatch: Callable[[], None] | None = None
        self._jobs: set[asyncio.Task[Any]] = set()
        self.cancelled: list[str] = []  # remote task ids cancelled by this instance (tests, logs)

    def start(self) -> None:
        self._unwatch = self.bus.watch(ENDED, self._ended)

    async def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        for job in list(self._jobs):
            try:
                await asyncio.wait_for(asyncio.shield(job), 5.0)
            except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                job.cancel()

    def _ended(self, event: Event) -> None:
        job = asyncio.create_task(self.settle(str(event.get("task_id"))))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def settle(self, task_id: str) -> bool:
        """If `task_id` ended while parked on a remote question, cancel the remote task. True when
        the remote agent accepted the cancel."""
        from taskgrove.executors.a2a_cancel import cancel_remote_task  # the a2a-sdk loads only when needed

        try:
            row = await self.repo.get(task_id)
            found = asked_remote(row.get("checkpoint")) if row is not None else None
            if row is None or found is None or row.get("status") not in ("cancelled", "failed"):
                return False
            url, remote_id = found
            headers = (row.get("inputs") or {}).get("headers") or {}
            state = await cancel_remote_task(url, remote_id, headers if isinstance(headers, dict) else {},
                                             bool(self.settings.allow_private_urls))
        except Exception as exc:  # noqa: BLE001 - best effort, as the executor's own cancel
            log.warning("could not cancel the remote A2A task of task %s: %s", task_id, exc)
            return False
        log.info("task %s ended while a remote agent's question waited: its task %s is %s", task_id, remote_id,
                 state)
        self.cancelled.append(remote_id)
        return True
