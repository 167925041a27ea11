"""Retention: deleting whole trees that ended long ago (SERVICE_RETENTION, `tasks.purge`).

A sweep walks the roots of the oldest trees (storage/retention.py `old_roots`) and deletes, in
transactions of BATCH_TREES trees with a pause between them (never a long lock), every tree that
has ended before the cutoff: its tasks through `TaskRepository.delete` (the function tasks.delete
uses), its executions, and the idempotency records older than the cutoff. A schedule's runs beyond
its newest SERVICE_SCHEDULE_KEEP_RUNS are deleted once ended, whatever their age; its template
never is. Nothing running or parked on a wait is touched. Stored events (`events.emit`) older than
the cutoff go too, but those a task parked on an event wait can still count (storage/retention.py
says the rule), and so do the triggers' inbox rows of events handled before the cutoff (a row still
waiting in a debounce, a batch or a queue is kept whatever its age). On PostgreSQL one instance sweeps at a
time (a session advisory lock held for the sweep); another instance's sweep finds it taken and
does nothing. docs/retention.md says it for operators.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params, permission_denied
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.requests import PurgeTasks
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.foundations.settings import Settings
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.retention import RetentionStore
from taskgrove.storage.clock import iso_in, now_iso
from taskgrove.storage.outage import recognise

log = logging.getLogger(__name__)

BATCH_TREES = 50  # trees deleted per transaction
SCAN_ROOTS = 500  # roots read per step of the walk over the oldest trees
BATCH_PAUSE_SECONDS = 0.05  # between two transactions: the engine's writes go first
IDEMPOTENCY_BATCH = 500
EVENTS_BATCH = 500
TRIGGER_EVENTS_BATCH = 500
REMEMBERED_TREES = 10_000  # deleted trees whose late executions the next sweep looks for
MIN_EVERY_SECONDS, MAX_EVERY_SECONDS = 0.5, 300.0  # how often the background loop sweeps


@dataclass(slots=True)
class Swept:
    """What one sweep deleted (tasks.purge answers it; the metrics count every kind of it)."""

    trees: int = 0
    tasks: int = 0
    idempotency_records: int = 0
    events: int = 0
    trigger_events: int = 0  # handled inbox rows of triggers (docs/triggers.md)
    swept: bool = True  # False: another instance was sweeping (PostgreSQL), nothing was done here

    def as_dict(self) -> dict[str, Any]:
        return {"swept": self.swept, "trees": self.trees, "tasks": self.tasks,
                "idempotency_records": self.idempotency_records, "events": self.events,
                "trigger_events": self.trigger_events}


class Retention:
    def __init__(self, repo: TaskRepository, settings: Settings, metrics: Metrics) -> None:
        self.repo = repo
        self.store = RetentionStore(repo)
        self.settings = settings
        self.metrics = metrics
        self._job: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._deleted: list[str] = []  # the trees the last sweep here deleted (the newest REMEMBERED_TREES)

    # --- tasks.purge ----------------------------------------------------------------------

    async def purge(self, request: PurgeTasks, ctx: CallContext) -> dict[str, Any]:
        """tasks.purge (admins): one sweep now, of trees ended more than `older_than` seconds ago
        (default: SERVICE_RETENTION), and the answer says what it deleted."""
        if not ctx.caller.unrestricted:
            raise permission_denied("tasks.purge needs the admin role")
        older_than = request.older_than if request.older_than is not None else self.settings.retention_seconds
        if older_than is None:
            raise invalid_params("older_than is required when SERVICE_RETENTION is off "
                                 "(a duration like 30d, 12h, 90s, or seconds)")
        return {**(await self.sweep(older_than)).as_dict(), "older_than": older_than}

    # --- one sweep ------------------------------------------------------------------------

    async def sweep(self, older_than: float) -> Swept:
        """Delete every tree that ended more than `older_than` seconds ago, a batch at a time."""
        async with self.store.sweep_lock() as taken:
            if not taken:
                return Swept(swept=False)
            swept = Swept()
            await self._late_executions()
            cutoff = iso_in(-older_than)
            await self._sweep_old(cutoff, swept)
            surplus = await self.store.surplus_runs(self.settings.schedule_keep_runs)
            await self._delete_in_batches(surplus, now_iso(), swept)
            before = max(cutoff, iso_in(-self.settings.idempotency_seconds))
            while (n := await self.store.delete_idempotency(before, IDEMPOTENCY_BATCH)) > 0:
                swept.idempotency_records += n
                self.metrics.retention_deleted_records("idempotency_records", n)
                await asyncio.sleep(BATCH_PAUSE_SECONDS)
            await self._sweep_events(cutoff, swept)
            while (n := await self.store.delete_trigger_events(cutoff, TRIGGER_EVENTS_BATCH)) > 0:
                swept.trigger_events += n
                self.metrics.retention_deleted_records("trigger_events", n)
                await asyncio.sleep(BATCH_PAUSE_SECONDS)
        return swept

    async def _late_executions(self) -> None:
        """Executions opened on trees the last sweep deleted, by an execute that had read the tree
        just before (it answered "not found"; its execution row came after the delete)."""
        deleted, self._deleted = self._deleted, []
        for start in range(0, len(deleted), 500):
            await self.store.delete_orphan_executions(deleted[start:start + 500])

    async def _sweep_events(self, cutoff: str, swept: Swept) -> None:
        """The stored events emitted before `cutoff` that no parked wait can count, a batch at a
        time. The parked waits are read once, first: a wait that parks later began after the
        cutoff, so it never counts an event deleted here."""
        floors = await self.store.event_floors()
        after: tuple[str, str] | None = None
        while True:
            deleted, after = await self.store.delete_events(cutoff, floors, after, EVENTS_BATCH)
            swept.events += deleted
            self.metrics.retention_deleted_records("events", deleted)
            if after is None:
                return
            await asyncio.sleep(BATCH_PAUSE_SECONDS)

    async def _sweep_old(self, cutoff: str, swept: Swept) -> None:
        after: tuple[str, str] | None = None
        while roots := await self.store.old_roots(cutoff, after, SCAN_ROOTS):
            after = roots[-1]
            await self._delete_in_batches([root_id for _, root_id in roots], cutoff, swept)
            if len(roots) < SCAN_ROOTS:
                return

    async def _delete_in_batches(self, tree_ids: Sequence[str], cutoff: str, swept: Swept) -> None:
        for start in range(0, len(tree_ids), BATCH_TREES):
            trees, tasks = await self.store.delete_batch(tree_ids[start:start + BATCH_TREES], cutoff)
            swept.trees += len(trees)
            swept.tasks += tasks
            self.metrics.retention_deleted(len(trees), tasks)
            self._deleted = [*self._deleted, *trees][-REMEMBERED_TREES:]
            await asyncio.sleep(BATCH_PAUSE_SECONDS)

    # --- the background loop (started when SERVICE_RETENTION is set) ------------------------

    def start(self) -> None:
        if self.settings.retention_seconds is None or self._job is not None:
            return
        self._stopping.clear()
        self._job = asyncio.create_task(self._loop(self.settings.retention_seconds), name="taskgrove-retention")

    async def stop(self) -> None:
        job, self._job = self._job, None
        if job is None:
            return
        self._stopping.set()
        job.cancel()  # a batch is one transaction: cancelled, it rolls back and deletes nothing
        await asyncio.gather(job, return_exceptions=True)

    async def _loop(self, older_than: float) -> None:
        every = min(MAX_EVERY_SECONDS, max(MIN_EVERY_SECONDS, older_than / 4))
        while not self._stopping.is_set():
            try:
                swept = await self.sweep(older_than)
                if swept.trees:
                    log.info("retention: deleted %d trees (%d tasks)", swept.trees, swept.tasks)
            except Exception as exc:  # a failed sweep (a busy database, a lost connection) is tried again later
                if recognise(exc) is None:  # an outage is logged once by storage/outage.py
                    log.exception("retention sweep failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), every)
            except asyncio.TimeoutError:
                pass
