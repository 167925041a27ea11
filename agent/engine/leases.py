"""Leases, takeover and recovery: no execution is left for a person to restart.

Every instance renews the leases it holds (its attempts and its executions) every third of
`SERVICE_LEASE_SECONDS`. On PostgreSQL every instance also looks, every POLL_SECONDS, for
leases that ran out: an attempt whose instance stopped renewing is interrupted (it runs again
without using up the task's retries, up to SERVICE_MAX_INTERRUPTIONS times), and an execution whose owner is gone is
taken over (a compare-and-set on its epoch, so exactly one instance wins) and continued from
the database. On SQLite there is one instance, so the same happens once, at start-up, for
everything left running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from taskgrove.agent.foundations import tracing
from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import PROGRESS, TASK_FAILED, EventBus
from taskgrove.agent.engine.follow_final import follow_execution
from taskgrove.agent.engine.live_attempts import LiveAttempt
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.tree_run import INTERRUPTED, RESTART_ERROR, TreeRun
from taskgrove.agent.engine.webhooks import WebhookConfig, deliver_webhooks
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.outage import recognise
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.clock import now_iso

log = logging.getLogger(__name__)
POLL_SECONDS = 1.0


class UnwrittenOutcomes(Protocol):
    """The pass loop's tasks whose outcome waits in memory for the database (engine/passes.py)."""

    unwritten: set[str]


class LeaseRuns(Protocol):
    """What the lease keeper needs of the run keeper (engine/run_keeper.py `RunKeeper`)."""

    @property
    def runs(self) -> Mapping[str, TreeRun]: ...

    @property
    def passes(self) -> UnwrittenOutcomes: ...

    def drop(self, run: TreeRun, why: str) -> None: ...

    def refresh_later(self, tree_id: str) -> None: ...

    async def take_over(self, execution: Mapping[str, Any]) -> None: ...


class LeaseAttempts(Protocol):
    """What the lease keeper needs of the attempts (engine/live_attempts.py `Attempts`)."""

    @property
    def running(self) -> Mapping[str, LiveAttempt]: ...

    def detach(self, task_id: str, *, shutdown: bool = False, settled: bool = False) -> LiveAttempt | None: ...

    async def stop(self, running: LiveAttempt | None) -> dict[str, Any]: ...


class LeaseKeeper:
    """Owned by one Engine, which hands it the parts it works with: the repository, settings and
    identity of the instance, the runs (`drop`, `refresh_later`, `take_over`) and the attempts
    (`detach`, `stop`) through the two Protocols above, and where its events and webhooks go."""

    def __init__(self, *, repo: TaskRepository, settings: Settings, metrics: Metrics, registry: ExecutorRegistry,
                 bus: EventBus, publisher: Publisher, background: Background, run_keeper: LeaseRuns,
                 attempts: LeaseAttempts, instance_id: str, lease_until: Callable[[], str], sqlite: bool) -> None:
        self.repo = repo
        self.executions = ExecutionStore(repo)
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self.bus = bus
        self.publisher = publisher
        self.background = background
        self.run_keeper = run_keeper
        self.attempts = attempts
        self.instance_id = instance_id
        self.lease_until = lease_until
        self.sqlite = sqlite

    async def recover_at_start(self) -> None:
        """SQLite: everything left running belongs to a dead process. PostgreSQL: what expired."""
        await self.sweep(everything=self.sqlite)

    async def loop(self) -> None:
        lease = self.settings.lease_seconds
        renew_every = lease / 3
        last_renewal = time.monotonic()
        poll = POLL_SECONDS if not self.sqlite else renew_every
        while True:
            await asyncio.sleep(min(poll, renew_every))
            try:
                if time.monotonic() - last_renewal >= renew_every - 0.05:
                    await self.renew()
                    last_renewal = time.monotonic()
                # SQLite too: an attempt whose outcome could not be stored (the database went
                # away for longer than the write retries) is left to its lease; it runs again.
                await self.sweep(everything=False)
            except Exception as exc:
                if recognise(exc) is None:  # an outage is logged once by storage/outage.py
                    log.exception("lease upkeep failed")

    async def renew(self) -> None:
        """Extend our leases; a lease we no longer hold means another instance took that work."""
        # Attempts running, and those ended whose outcome waits in memory for the database.
        task_ids = list(set(self.attempts.running) | self.run_keeper.passes.unwritten)
        asked = list(self.run_keeper.runs.values())  # only these were renewed: runs started meanwhile were not
        if not (task_ids or asked):
            return
        tasks, renewed = await self.executions.renew(self.instance_id, task_ids,
                                                     [run.execution_id for run in asked], self.lease_until())
        for run in asked:
            # Lost: still this instance's run, not ending by itself (an execution that ended while
            # we asked is no longer `running`), and its execution not renewed.
            if run.execution_id not in renewed and self.run_keeper.runs.get(run.tree_id) is run \
                    and not run.ending and not run.done.is_set():
                self.run_keeper.drop(run, "its lease was lost (this instance stopped renewing it in time)")
        for tid in set(task_ids) - tasks:
            running = self.attempts.running.get(tid)
            if running is not None and self.run_keeper.runs.get(running.run.tree_id) is running.run:
                self.run_keeper.refresh_later(running.run.tree_id)
        # Members in progress on an instance that is gone: look again once they are settled.
        for run in list(self.run_keeper.runs.values()):
            if run.foreign:
                self.run_keeper.refresh_later(run.tree_id)

    async def sweep(self, *, everything: bool) -> None:
        """Settle attempts whose lease ran out, then take over executions whose owner is gone."""
        stamp = now_iso()
        for row in await self.executions.expired_tasks(None if everything else stamp):
            await self._interrupt(row, stamp, restarted=everything)
        driven = {run.execution_id for run in self.run_keeper.runs.values()}
        taken = await self.executions.take_over(self.instance_id, self.lease_until(), stamp, not everything, driven)
        for execution in taken:
            ours = execution["previous_owner"] == self.instance_id and not everything
            log.warning("continuing the execution of tree %s (previous owner %s)", execution["task_tree_id"],
                        "this instance, which had no run of it: its opening met a database outage" if ours
                        else execution["previous_owner"])
            # Its webhooks: followed here already, or (ours) never asked for by a request that failed.
            for config in () if ours else execution["webhooks"] or ():
                self._deliver(execution["task_tree_id"], config,
                              tracing.execution_header(execution.get("traceparent"), execution["id"]))
            await self.run_keeper.take_over(execution)

    async def _interrupt(self, row: Mapping[str, Any], stamp: str, *, restarted: bool) -> None:
        """Settle an attempt its instance stopped renewing: the platform's fault, not the task's.

        The attempt runs again, with the same attempt number (so its idempotency key is the same)
        and without using up the task's retries, until the task has been cut off more than
        SERVICE_MAX_INTERRUPTIONS times: then it fails, so a task that kills its instance cannot
        loop forever."""
        attempt = max(1, row.get("attempt") or 1)
        interruptions = (row.get("interruptions") or 0) + 1
        limit = self.settings.max_interruptions
        if restarted:
            why = RESTART_ERROR
        else:
            why = INTERRUPTED + (f"instance {row['lease_owner'] or '(unknown)'} stopped renewing its lease at "
                                 f"{_renewed_at(row.get('lease_expires_at'), self.settings.lease_seconds)}")
        values: dict[str, Any] = {"updated_at": stamp, "lease_owner": None, "lease_expires_at": None,
                                  "interruptions": interruptions}
        if interruptions <= limit:
            values.update(status=TaskStatus.PENDING.value, progress=0.0, next_attempt_at=None, attempt=attempt - 1,
                          error=f"{why}; attempt {attempt} runs again (interruption {interruptions} of at most "
                                f"{limit}, SERVICE_MAX_INTERRUPTIONS)")
            message = f"Task '{row['name']}' interrupted, running again: {values['error']}"
            kind, status, outcome = PROGRESS, TaskStatus.PENDING.value, "interrupted"
        else:
            values.update(status=TaskStatus.FAILED.value, completed_at=stamp,
                          error=f"{why}; the task was interrupted {interruptions} times, more than "
                                f"SERVICE_MAX_INTERRUPTIONS ({limit}) allows, so it is not run again")
            message, kind, status, outcome = values["error"], TASK_FAILED, TaskStatus.FAILED.value, "interrupted"
        if not await self.executions.interrupt(row, values):
            return  # settled meanwhile (it ended, or another instance got there first)
        self.metrics.attempt_ended(self.registry.wanted(row), outcome, None)
        if tracing.ENABLED and row.get("execution_id"):
            execution = await self.executions.get(row["execution_id"])
            tracing.interrupted(row, execution.get("traceparent") if execution else None, self.registry.wanted(row),
                                outcome)
        log.warning("task %s: %s", row["id"], values["error"],
                    extra={"task_id": row["id"], "root_task_id": row["task_tree_id"]})
        running = self.attempts.detach(row["id"], settled=True) \
            if row.get("lease_owner") == self.instance_id else None
        if running is not None:
            await self.attempts.stop(running)
        self.publisher.emit({"type": kind, "task_id": row["id"], "root_task_id": row["task_tree_id"], "name": row["name"],
                     "user_id": row["user_id"], "timestamp": stamp, "status": status,
                     "progress": values.get("progress", row.get("progress") or 0.0), "error": values["error"],
                     "next_attempt_at": None, "attempt": attempt, "interruptions": interruptions,
                     "message": message, "status_changed": True})
        if row["task_tree_id"] in self.run_keeper.runs:
            self.run_keeper.refresh_later(row["task_tree_id"])

    def _deliver(self, tree_id: str, config: Mapping[str, Any], traceparent: str | None) -> None:
        """Webhooks of an execution continued here: its remaining events, `final` included."""
        try:
            webhook = WebhookConfig(**config)
        except TypeError:
            log.warning("stored webhook of tree %s is unreadable; skipped", tree_id)
            return
        sub = self.bus.subscribe(lambda e: e["root_task_id"] == tree_id, maxsize=10_000)
        self.background.spawn(deliver_webhooks(follow_execution(self.repo, sub, tree_id), webhook,
                                                      traceparent))


def _renewed_at(expires: str | None, lease_seconds: float) -> str:
    """When the lease was last renewed: its expiry minus one lease."""
    if not expires:
        return "an unknown time"
    try:
        return (datetime.fromisoformat(expires) - timedelta(seconds=lease_seconds)).isoformat(timespec="seconds")
    except ValueError:
        return expires
