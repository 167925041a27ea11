"""Reading task logs: `tasks.logs` (a page, or a page then new lines as SSE) and the follow `/ws`
`subscribe_logs` and `taskgrove tasks logs --follow` use (docs/observability.md, "Task logs").

The lines are written by the engine (agent/engine/logbook.py). A follower wakes on the bus's
`task_log` events of its task (this instance's lines) and at least every `POLL_SECONDS` (lines
another instance stored, on PostgreSQL), reads what came after the last `seq` it has, and ends
once the task is finished and nothing more is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from taskgrove.agent.engine.bus import EventBus, BusSubscription
from taskgrove.agent.engine.logbook import TASK_LOG, wire_line
from taskgrove.agent.foundations.errors import permission_denied, task_not_found
from taskgrove.agent.foundations.requests import TaskLogs
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply, typed
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import FINISHED_STATUSES
from taskgrove.storage.clock import now_iso

POLL_SECONDS = 1.0


class LogService:
    def __init__(self, repo: TaskRepository, bus: EventBus) -> None:
        self.repo = repo
        self.bus = bus

    async def logs(self, request: TaskLogs, ctx: CallContext) -> Any:
        """tasks.logs: {task_id, lines, next_after}. Refused: an unknown task (-32602 "Task 'x' not
        found"), a task of another user (-32001). With `follow`, the page then an SSE stream of
        `task_log` events until the task is finished (`stream_end`)."""
        await self.check(request.task_id, ctx)
        if not request.follow:
            return await self.page(request)
        subscription = self.subscribe(request.task_id)
        try:
            first = await self.page(request)
        except BaseException:
            subscription.close()
            raise
        after = first["lines"][-1]["seq"] if first["lines"] else request.after
        events = self._sse(TaskLogs(request.task_id, request.attempt, after, request.limit), subscription)
        return StreamReply(first=first, events=events, close=subscription.close)

    async def check(self, task_id: str, ctx: CallContext) -> None:
        """The task exists and the caller may read it (the rule and words of tasks.tree)."""
        row = await self.repo.get(task_id)
        if row is None:
            raise task_not_found(task_id)
        if not ctx.caller.can_access(row["user_id"]):
            raise permission_denied(f"You may not access task '{task_id}'")

    async def page(self, request: TaskLogs) -> dict[str, Any]:
        """One page. `next_after`: the last line's seq when the page is full (ask again from
        there), else null (everything stored so far was returned)."""
        rows = await self.repo.log_lines(request.task_id, attempt=request.attempt, after=request.after,
                                         limit=request.limit)
        lines = [wire_line(row) for row in rows]
        full = len(lines) == request.limit
        return {"task_id": request.task_id, "lines": lines, "next_after": lines[-1]["seq"] if full else None}

    def subscribe(self, task_id: str) -> BusSubscription:
        """Wake-ups for `task_id`'s new lines; subscribe before the first read, so none is missed."""
        return self.bus.subscribe(lambda e: e["type"] == TASK_LOG and e.get("log_task_id") == task_id,
                                  maxsize=100)

    async def follow(self, request: TaskLogs, subscription: BusSubscription) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of lines after `request.after`, as they are stored, until the task is finished
        and every line it had was given. Closes `subscription` when done."""
        after = request.after
        try:
            while True:
                row = await self.repo.get(request.task_id)
                finished = row is None or row["status"] in FINISHED_STATUSES
                while True:  # everything stored so far, a page at a time
                    page = await self.page(TaskLogs(request.task_id, request.attempt, after, request.limit))
                    if page["lines"]:
                        after = page["lines"][-1]["seq"]
                        yield page["lines"]
                    if page["next_after"] is None:
                        break
                if finished:
                    return
                try:  # asyncio.timeout, not wait_for: a cancel (the client went away) must end the stream
                    async with asyncio.timeout(POLL_SECONDS):
                        await subscription.get()
                except TimeoutError:
                    pass
                while not subscription.queue.empty():  # one read covers every wake-up so far
                    subscription.queue.get_nowait()
        finally:
            subscription.close()

    async def _sse(self, request: TaskLogs, subscription: BusSubscription) -> AsyncIterator[dict[str, Any]]:
        async for lines in self.follow(request, subscription):
            yield {"type": TASK_LOG, "task_id": request.task_id, "lines": lines, "timestamp": now_iso()}
        yield {"type": "stream_end", "task_id": request.task_id, "timestamp": now_iso()}


def log_methods(service: LogService) -> dict[str, Handler]:
    return {"tasks.logs": typed(TaskLogs.from_params, service.logs)}
