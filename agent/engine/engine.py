"""The engine: runs the tasks of every execution this instance drives, as the services ask.

`Engine` is the one object the services and surfaces use; it wires four parts that each have one
job:

- the pass loop (engine/passes.py): one loop owns every write of the execution path; each pass
  writes outcomes and progress, claims runnable tasks and ends finished runs in one transaction,
  then publishes the events and starts the claimed attempts;
- attempts (engine/live_attempts.py): one executor run under its timeout, with its checkpoints,
  progress and cancel hook;
- runs (engine/run_keeper.py): the executions this instance drives, in memory, opened, rebuilt from the
  database and ended one at a time;
- leases (engine/leases.py): renewal, takeover and recovery, through the runs' public methods.

The database is the truth (storage/executions.py): an execution request is a row that any
instance can continue; a claim succeeds only if the database agrees the task may run; every write
for an attempt is fenced by the token its claim returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from taskgrove.agent.engine import history
from taskgrove.agent.engine.live_attempts import Attempts
from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import PROGRESS, TASK_CANCELLED, TASK_COMPLETED, TASK_FAILED, EventBus
from taskgrove.agent.engine.leases import LeaseKeeper
from taskgrove.agent.engine.notify import PgNotifier, asyncpg_dsn
from taskgrove.agent.engine.passes import PassLoop
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.retry_policy import RetryPolicy
from taskgrove.agent.engine.tree_run import INTERRUPTED, TreeRun
from taskgrove.agent.engine.run_keeper import AlreadyRunning, NotExecutable, RunKeeper
from taskgrove.agent.engine.waits import AlreadyAnswered, NotWaiting, Waits
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.models import UNFINISHED_STATUSES
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.clock import iso_in, now_iso
from taskgrove.storage.results import Unstorable, storable

__all__ = ["AlreadyAnswered", "AlreadyRunning", "Engine", "NotExecutable", "NotWaiting"]

log = logging.getLogger(__name__)

SHUTDOWN_ERROR = INTERRUPTED + "the service stopped; the task resumes when an instance runs its execution again"
# At shutdown, how long the background jobs (a run's end, a refresh) may take before they are cancelled.
BACKGROUND_GRACE_SECONDS = 5.0

_KIND_OF_STATUS = {TaskStatus.COMPLETED: TASK_COMPLETED, TaskStatus.FAILED: TASK_FAILED,
                   TaskStatus.CANCELLED: TASK_CANCELLED}


class Engine:
    def __init__(
        self,
        repo: TaskRepository,
        registry: ExecutorRegistry,
        settings: Settings,
        bus: EventBus,
        services: Mapping[str, Any] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.repo = repo
        self.metrics = metrics or Metrics()
        self.metrics.know_executors(registry.ids())
        self.registry = registry
        self.settings = settings
        self.bus = bus
        self.services: dict[str, Any] = dict(services or {})
        self.instance_id = uuid.uuid4().hex
        self.default_retry = RetryPolicy.parse(settings.default_retry, RetryPolicy())
        self.background = Background()
        self.publisher = Publisher(bus)
        wake = asyncio.Event()  # the pass loop's: whoever gives it work sets it
        self.attempts = Attempts(repo, registry, settings, self.metrics, self.services, self.instance_id,
                                 self.default_retry, self.publisher, self.background, wake)
        self.run_keeper = RunKeeper(repo, self.instance_id, self.lease_until, self.attempts, self.publisher,
                                    self.background, wake)
        self.passes = PassLoop(repo, registry, settings, self.metrics, self.instance_id, self.lease_until,
                               self.attempts, self.run_keeper, self.publisher, self.background, wake)
        self.run_keeper.passes = self.passes
        self.waits = Waits(repo, self.metrics, self.publisher, self.background, self.run_keeper, self.passes)
        self.run_keeper.waits = self.passes.waits = self.waits
        # The parts' own collections, shared (the services and /metrics read them here).
        self.runs: dict[str, TreeRun] = self.run_keeper.runs
        self.running = self.attempts.running
        self.waiting_for = self.passes.waiting_for
        self._tasks: list[asyncio.Task[None]] = []
        # Set by the lease keeper (engine/leases.py) when the app starts it.
        self.leases: LeaseKeeper | None = None

    @property
    def sqlite(self) -> bool:
        return self.repo.engine.dialect.name == "sqlite"

    @property
    def stopping(self) -> bool:
        return self.passes.stopping

    @property
    def notifier(self) -> PgNotifier | None:
        """PostgreSQL only: carries events and cancels to the other instances (engine/notify.py)."""
        return self.publisher.notifier

    def lease_until(self) -> str:
        return iso_in(self.settings.lease_seconds)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if not self.sqlite:
            self.publisher.notifier = PgNotifier(asyncpg_dsn(self.settings.database_url), self.instance_id,
                                                 self.bus, self.cancelled_elsewhere, self.event_elsewhere)
            await self.publisher.notifier.start()
        self.leases = LeaseKeeper(repo=self.repo, settings=self.settings, metrics=self.metrics, registry=self.registry,
                                  bus=self.bus, publisher=self.publisher, background=self.background,
                                  run_keeper=self.run_keeper, attempts=self.attempts, instance_id=self.instance_id,
                                  lease_until=self.lease_until, sqlite=self.sqlite)
        await self.leases.recover_at_start()
        self._tasks = [
            asyncio.create_task(self.passes.loop(), name="taskgrove-engine"),
            asyncio.create_task(self.leases.loop(), name="taskgrove-leases"),
        ]

    async def stop(self) -> None:
        """Stop claiming; let running tasks finish for up to SERVICE_SHUTDOWN_GRACE_SECONDS; then
        stop the loop and every executor still running (cancel hooks too, so child processes die).

        Attempts cut off are handed back as interrupted, not failed: their executions stay
        `running` with an expired lease, so the next start (SQLite) or another instance
        (PostgreSQL) resumes them.
        """
        self.passes.stopping = True
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        attempts = self.attempts
        while self.running and time.monotonic() < deadline and all(not job.done() for job in self._tasks):
            await asyncio.sleep(0.05)
        while (attempts.outcomes or attempts.progress) and time.monotonic() < deadline + 5 \
                and all(not job.done() for job in self._tasks):
            self.passes.wake.set()  # the loop writes what finished during the grace period
            await asyncio.sleep(0.01)
        async with self.passes.lock:  # and finishes the pass it is in
            pass
        if self.notifier is not None:
            await self.notifier.stop()
        for job in self._tasks:
            job.cancel()
        detached = [attempts.detach(tid, shutdown=True) for tid in list(self.running)]
        await asyncio.gather(*(attempts.stop(running) for running in detached))
        await attempts.logbook.stop()  # the lines of attempts cut off are kept
        try:
            stamp = now_iso()
            await ExecutionStore(self.repo).release(self.instance_id, [r.execution_id for r in self.runs.values()],
                                                    stamp, SHUTDOWN_ERROR, self.settings.max_interruptions)
        except Exception:  # the database may be what is going away
            log.warning("could not hand back running executions at shutdown", exc_info=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.background.finish(BACKGROUND_GRACE_SECONDS)

    # --- cancel and changes from outside --------------------------------------------------

    async def cancel(self, task_id: str, error_message: str | None = None) -> dict[str, Any]:
        """Cancel a pending or running task. Returns `{status, token_usage, result}`.

        `status` is `cancelled`, or the status that made cancelling impossible. The database
        decides first (compare-and-set), then the work is stopped, so a task that starts while
        the cancel waits for the engine's lock is still found and stopped.
        """
        stamp = now_iso()
        async with self.passes.lock:
            error = error_message or "Cancelled by user"
            changed = await self.repo.update(
                task_id,
                {"status": TaskStatus.CANCELLED.value, "error": error, "completed_at": stamp,
                 "updated_at": stamp, "lease_owner": None, "lease_expires_at": None, "next_attempt_at": None,
                 "waiting": None, "wake_at": None, "wait_answers": None},
                only_status=UNFINISHED_STATUSES, history=history.cancelled(self.running.get(task_id), stamp, error),
            )
            running = self.attempts.detach(task_id) if changed else None
        row = await self.repo.get(task_id)
        if not changed or row is None:
            return {"status": row["status"] if row else "not_found", "token_usage": None, "result": None}
        hook = await self.attempts.stop(running)
        if running is not None:
            self.metrics.attempt_ended(running.executor_id, TaskStatus.CANCELLED.value, time.monotonic() - running.began)
        token_usage = hook.get("token_usage") or (
            getattr(running.executor, "token_usage", None) if running is not None else None)
        partial = hook.get("result")
        extra: dict[str, Any] = {}
        if partial is not None:
            try:
                extra["result"] = storable(partial, max_depth=self.settings.max_result_depth,
                                           max_bytes=self.settings.max_result_bytes)
            except Unstorable:
                partial = None
        if token_usage:
            extra["token_failed"] = (row["token_failed"] or 0) + int(token_usage.get("total_tokens") or 0)
        if extra:
            await self.repo.update(task_id, extra, only_status=(TaskStatus.CANCELLED.value,))
            row.update(extra)
        if running is None and self.notifier is not None:
            self.notifier.cancel(task_id)  # it may be running on another instance
        self.run_keeper.forget(task_id, row)
        return {"status": TaskStatus.CANCELLED.value, "token_usage": token_usage, "result": partial}

    async def cancelled_elsewhere(self, task_id: str) -> None:
        """Another instance cancelled `task_id` in the database: stop our work on it, if any."""
        async with self.passes.lock:
            running = self.attempts.detach(task_id)
        if running is None:
            if any(task_id in run.parked for run in self.runs.values()):  # parked: no attempt to stop
                row = await self.repo.get(task_id)
                if row is not None and row["status"] == TaskStatus.CANCELLED:
                    self.run_keeper.forget(task_id, row)
            return
        await self.attempts.stop(running)
        row = await self.repo.get(task_id)
        if row is not None:
            self.run_keeper.forget(task_id, row)

    def status_changed(self, row: Mapping[str, Any], previous: str | None = None) -> None:
        """A status set through tasks.update: it wins over a running executor's late result, is
        published like any other change, and live executions re-read what may run now."""
        tid, status = row["id"], row["status"]
        if status != TaskStatus.IN_PROGRESS and tid in self.running:
            self.attempts.stop_later(tid)
        kind = _KIND_OF_STATUS.get(status, PROGRESS)
        event = {key: row.get(key) for key in ("status", "progress", "result", "error")}
        self.publisher.emit({"type": kind, "task_id": tid, "root_task_id": row["task_tree_id"], "name": row["name"],
                   "user_id": row["user_id"], "timestamp": now_iso(), **event,
                   "message": f"Status set to {status}", "status_changed": True})
        self.run_keeper.refresh_runs_with(tid)

    def task_changed(self, row: Mapping[str, Any]) -> None:
        """A task changed through tasks.update (inputs, retry policy, dependencies...): executions
        counting on it re-read it, so its next attempt runs what is stored now."""
        self.run_keeper.refresh_runs_with(row["id"])

    def event_elsewhere(self, event: Mapping[str, Any]) -> None:
        """An event from another instance (PostgreSQL): a run here that counts on that task, or
        whose tree another instance joined, reads the database again."""
        if event.get("type") == "refresh":
            if event["root_task_id"] in self.runs:
                self.run_keeper.refresh_later(event["root_task_id"])
            return
        tid = event["task_id"]
        for run in list(self.runs.values()):
            if tid in run.rows and tid not in run.active:
                self.run_keeper.refresh_later(run.tree_id)

    def live_state(self, task_id: str) -> dict[str, Any] | None:
        """Status and progress of a task taking part in an execution here, else None.

        Synchronous, so a subscriber that starts matching bus events in the same step gets a
        snapshot with no gap before the events that follow.
        """
        running = self.running.get(task_id)
        if running is not None:
            return {"status": TaskStatus.IN_PROGRESS.value, "progress": float(running.row.get("progress") or 0.0)}
        for run in self.runs.values():
            if task_id in run.waiting or task_id in run.queued or task_id in run.retrying:
                return {"status": TaskStatus.PENDING.value, "progress": 0.0}
            if task_id in run.parked:
                return {"status": TaskStatus.IN_PROGRESS.value, "progress": float(run.rows[task_id].get("progress") or 0.0)}
        return None

    def why_waiting(self, task_id: str) -> str | None:
        """Why a pending task of an execution here has not started: its concurrency key or rate
        (engine/limits.py), or the fair order while every slot is busy; None when it is not
        waiting here (not runnable yet, or driven by another instance)."""
        reason = self.waiting_for.get(task_id)
        if reason is not None:
            return reason
        for run in self.runs.values():
            if task_id in run.queued:
                return "fair share" if len(self.running) >= self.settings.max_concurrency else "a free slot"
        return None

    # --- monitoring -----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The loop and the lease keeper run (for /readyz)."""
        return bool(self._tasks) and all(not job.done() for job in self._tasks)

    @property
    def queue_depth(self) -> int:
        return sum(1 for _, _, tid, tree in self.passes.ready if (run := self.runs.get(tree)) and tid in run.queued)

    def tasks_per_user(self) -> dict[Any, dict[str, int]]:
        """Per user, tasks running here and tasks runnable here but not started (for /metrics)."""
        counts: dict[Any, dict[str, int]] = {}
        for running in self.running.values():
            user = counts.setdefault(running.row.get("user_id"), {"running": 0, "runnable": 0})
            user["running"] += 1
        for run in self.runs.values():
            for tid in run.queued:
                user = counts.setdefault(run.rows[tid].get("user_id"), {"running": 0, "runnable": 0})
                user["runnable"] += 1
        return counts

    def running_rows(self) -> list[dict[str, Any]]:
        rows = [r.row for r in self.running.values()]
        return sorted(rows, key=lambda r: (r.get("started_at") or "", r["id"]), reverse=True)
