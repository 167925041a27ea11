"""`/ws` `subscribe_logs`: a task's log lines on a WebSocket connection (docs/observability.md).

`{"action": "subscribe_logs", "task_id": "x"}` sends the lines stored so far, then new ones as they
are stored, as `{"type": "task_log", "task_id", "context_id": null, "data": {"lines": [...]}}`
(each line as `tasks.logs` gives it), and `task_log_end` once the task is finished and all its
lines were sent. `unsubscribe_logs` stops it. Each follow is one asyncio task running
`LogService.follow`, the same follow as the SSE of `tasks.logs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from taskgrove.agent.engine.bus import BusSubscription
from taskgrove.agent.foundations.errors import RpcError
from taskgrove.agent.services.log_service import LogService
from taskgrove.agent.foundations.requests import TaskLogs
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.storage.clock import now_iso

Send = Callable[[Mapping[str, Any]], Awaitable[None]]
MAX_LOG_FOLLOWS = 100  # followed tasks per connection


def log_message(task_id: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "task_id": task_id, "context_id": None, "data": data}


class LogFollows:
    """The log follows of one connection, by task id."""

    def __init__(self, service: LogService, ctx: CallContext, send: Send, error: Send) -> None:
        self.service = service
        self.ctx = ctx
        self.send = send  # sends under the connection's lock
        self.error = error
        self.follows: dict[str, asyncio.Task[None]] = {}

    async def subscribe(self, task_id: str) -> None:
        if task_id in self.follows:
            return
        if len(self.follows) >= MAX_LOG_FOLLOWS:
            await self.error({"message": f"Too many log subscriptions on this connection (at most "
                                         f"{MAX_LOG_FOLLOWS}); unsubscribe_logs from some tasks first",
                              "task_id": task_id})
            return
        try:
            request = TaskLogs.of(task_id)
            await self.service.check(request.task_id, self.ctx)
        except RpcError as exc:
            detail = exc.data if isinstance(exc.data, str) else exc.message
            await self.error({"message": detail, "task_id": task_id, "code": exc.code})
            return
        subscription = self.service.subscribe(task_id)  # before the first read: no line missed
        job = asyncio.create_task(self._follow(request, subscription), name=f"ws-logs-{task_id}")
        self.follows[task_id] = job
        job.add_done_callback(lambda _job: self.follows.pop(task_id, None) if self.follows.get(task_id) is _job
                              else None)

    async def unsubscribe(self, task_id: str) -> bool:
        job = self.follows.pop(task_id, None)
        if job is None:
            return False
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        return True

    async def _follow(self, request: TaskLogs, subscription: BusSubscription) -> None:
        async for lines in self.service.follow(request, subscription):
            await self.send(log_message(request.task_id, "task_log", {"lines": lines}))
        await self.send(log_message(request.task_id, "task_log_end", {"timestamp": now_iso()}))

    async def close(self) -> None:
        for task_id in list(self.follows):
            await self.unsubscribe(task_id)
