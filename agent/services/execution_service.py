"""Running trees: `tasks.execute`, cancelling, the running lists, and the attempts of a task.

Apart from TaskService (agent/services/task_service.py: storing and reading trees) because it is
the one service that talks to the engine about live work: starting an execution (and following it
with a stream or a webhook), cancelling it, and reading what runs on this instance.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from taskgrove.agent.engine.bus import EventBus
from taskgrove.agent.engine.engine import AlreadyRunning, Engine, NotExecutable
from taskgrove.agent.engine.follow_final import follow_execution
from taskgrove.agent.engine.stream import sse_events
from taskgrove.agent.engine.webhooks import WebhookConfig, deliver_webhooks
from taskgrove.agent.foundations import tracing
from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.calls import CallContext, Handler, StreamReply, typed
from taskgrove.agent.foundations.errors import invalid_params, permission_denied, task_not_found
from taskgrove.agent.foundations.requests import CancelTasks, CountRunning, ExecuteTask, ListRunning, RunningStatus, TaskAttempts
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.task_service import TaskService
from taskgrove.storage import attempts
from taskgrove.storage.models import UNFINISHED_STATUSES, TaskStatus
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.task_view import public


class ExecutionService:
    """The operations on live work; `trees` reads and copies the trees it starts."""

    def __init__(self, repo: TaskRepository, engine: Engine, bus: EventBus, settings: Settings,
                 trees: TaskService) -> None:
        self.repo = repo
        self.engine = engine
        self.bus = bus
        self.settings = settings
        self.trees = trees
        self._background: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Any) -> None:
        job = asyncio.create_task(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    # --- execution ------------------------------------------------------------------------

    async def execute(self, request: ExecuteTask, ctx: CallContext) -> Any:
        task_id, streaming = request.task_id, request.streaming
        webhook = await WebhookConfig.parse(request.webhook_config, self.settings) \
            if request.webhook_config is not None else None
        await self.trees.task_for(task_id, ctx.caller)
        answer: dict[str, Any] = {"protocol": ctx.surface}
        if request.copy_execution:
            copies = await self.trees.copy_tree(task_id, request.copy_children, ctx.caller)
            copy_of = {c["original_task_id"]: c["id"] for c in copies}
            answer["original_task_id"] = task_id
            task_id = copy_of[task_id]
        row = await self.repo.get(task_id)
        if row is None:  # deleted meanwhile
            raise task_not_found(task_id)
        tree_id = row["task_tree_id"]
        # Subscribe before starting, so not even an instant `final` is missed.
        subs = [self.bus.subscribe(lambda e: e["root_task_id"] == tree_id, maxsize=10_000)
                for wanted in (streaming, webhook is not None) if wanted]
        try:
            run = await self.engine.run_keeper.execute(task_id, ctx.execution_call(), webhook=dataclasses.asdict(webhook) if webhook else None)
        except AlreadyRunning:
            # Joined a running execution (here or elsewhere): streams and webhooks follow it to its end.
            answer = {"success": False, **answer, "root_task_id": tree_id, "task_id": task_id,
                      "status": "already_running", "message": f"Task '{task_id}' is already running"}
            return self._followed(answer, subs, tree_id, streaming, webhook)
        except BaseException as exc:
            for sub in subs:
                sub.close()
            if isinstance(exc, NotExecutable):
                raise invalid_params(str(exc)) from None
            if isinstance(exc, KeyError):
                raise task_not_found(task_id) from None
            raise
        if await self.repo.get(task_id) is None:  # deleted (tasks.delete, retention) as it was opened: it ran nothing
            for sub in subs:
                sub.close()
            raise task_not_found(task_id)
        answer = {"success": True, **answer, "root_task_id": tree_id, "task_id": task_id, "status": "started",
                  "message": f"Execution of task '{task_id}' started"}
        # The execution span's context for the webhook's posts (traces on; a remote run: the caller's).
        trace = tracing.execution_header(run.traceparent, run.execution_id) \
            if tracing.ENABLED and run.execution_id else ctx.traceparent
        return self._followed(answer, subs, tree_id, streaming, webhook, trace)

    def _followed(self, answer: dict[str, Any], subs: list[Any], tree_id: str, streaming: bool,
                  webhook: WebhookConfig | None, traceparent: str | None = None) -> Any:
        """The execute reply; its stream and webhook follow the execution to `final` (one each)."""
        if streaming or webhook:
            answer["streaming"] = True
        if webhook:
            answer["webhook_url"] = webhook.url
            self._spawn(deliver_webhooks(follow_execution(self.repo, subs[-1], tree_id), webhook, traceparent))
        if streaming:
            return StreamReply(first=answer, events=sse_events(follow_execution(self.repo, subs[0], tree_id), tree_id),
                               close=subs[0].close)
        return answer

    async def running_list(self, request: ListRunning, ctx: CallContext) -> list[dict[str, Any]]:
        user_id = request.user_id
        rows = [public(r) for r in self.engine.running_rows()
                if (user_id is None or r["user_id"] == user_id) and ctx.caller.can_access(r["user_id"])]
        return rows[:request.limit]

    async def running_status(self, request: RunningStatus, ctx: CallContext) -> list[dict[str, Any]]:
        ids = request.task_ids
        found = await self.repo.get_many(ids)
        answer: list[dict[str, Any]] = []
        for tid in ids:
            row = found.get(tid)
            if row is None:
                answer.append({"task_id": tid, "context_id": tid, "status": "not_found"})
            elif not ctx.caller.can_access(row["user_id"]):
                answer.append({"task_id": tid, "context_id": tid, "status": "permission_denied"})
            else:
                answer.append({
                    "task_id": tid, "context_id": tid, "status": row["status"], "progress": row["progress"],
                    "name": row["name"], "error": row["error"], "is_running": tid in self.engine.running,
                    "started_at": row["started_at"], "updated_at": row["updated_at"],
                })
        return answer

    async def running_count(self, request: CountRunning, ctx: CallContext) -> dict[str, Any]:
        user_id = request.user_id
        if user_id is not None and ctx.caller.authenticated and not ctx.caller.unrestricted \
                and user_id != ctx.caller.user_id:
            raise permission_denied("Counting another user's running tasks needs the admin role")
        target = user_id
        if target is None and ctx.caller.authenticated and not ctx.caller.unrestricted:
            target = ctx.caller.user_id
        count = sum(1 for r in self.engine.running_rows() if target is None or r["user_id"] == target)
        answer: dict[str, Any] = {"count": count}
        if user_id is not None:
            answer["user_id"] = user_id
        return answer

    async def cancel(self, request: CancelTasks, ctx: CallContext) -> list[dict[str, Any]]:
        return [await self.cancel_one(tid, ctx.caller, force=request.force, error_message=request.error_message)
                for tid in request.task_ids]

    async def cancel_one(self, task_id: str, caller: Caller, *, force: bool = False,
                         error_message: str | None = None) -> dict[str, Any]:
        answer: dict[str, Any] = {"task_id": task_id, "force": force, "token_usage": None, "result": None}
        row = await self.repo.get(task_id)
        if row is None:
            return {**answer, "status": "error", "message": f"Task {task_id} not found", "error": "not_found"}
        if not caller.can_access(row["user_id"]):
            return {**answer, "status": "failed", "message": f"Permission denied for task {task_id}",
                    "error": "permission_denied"}
        if row["status"] not in UNFINISHED_STATUSES:
            return {**answer, "status": "failed",
                    "message": f"Task {task_id} is already {row['status']}, cannot cancel"}
        outcome = await self.engine.cancel(task_id, error_message)
        if outcome["status"] != TaskStatus.CANCELLED:
            return {**answer, "status": "failed",
                    "message": f"Task {task_id} is already {outcome['status']}, cannot cancel"}
        return {**answer, "status": "cancelled", "message": f"Task {task_id} cancelled",
                "token_usage": outcome["token_usage"], "result": outcome["result"]}

    async def attempts(self, request: TaskAttempts, ctx: CallContext) -> list[dict[str, Any]]:
        """The attempt history (storage/attempts.py) of one task, or of every task of its tree,
        oldest first per task; an attempt in progress last, as `running`."""
        row = await self.trees.task_for(request.task_id, ctx.caller)
        rows = await self.repo.tree(row["task_tree_id"]) if request.tree else [row]
        found = await self.repo.attempts([r["id"] for r in rows])
        return [shown for r in rows for shown in attempts.with_current(found[r["id"]], r)]


def execution_methods(service: ExecutionService) -> dict[str, Handler]:
    return {
        "tasks.attempts": typed(TaskAttempts.from_params, service.attempts),
        "tasks.execute": typed(ExecuteTask.from_params, service.execute),
        "execute_task_tree": typed(ExecuteTask.from_params, service.execute),
        "tasks.running.list": typed(ListRunning.from_params, service.running_list),
        "tasks.running.status": typed(RunningStatus.from_params, service.running_status),
        "tasks.running.count": typed(CountRunning.from_params, service.running_count),
        "tasks.cancel": typed(CancelTasks.from_params, service.cancel),
        "tasks.running.cancel": typed(CancelTasks.from_params, service.cancel),
    }
