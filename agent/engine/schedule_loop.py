"""The schedule loop (cron): wake at the earliest due slot, claim what is due, start the runs.

Small on purpose. The database decides everything: a slot is claimed by the compare-and-set in
storage/schedule_store.claim_slot (the same transaction inserts the run's copy and its execution), so
any number of instances may run this loop on one database and each slot runs once. The loop
wakes at the earliest `next_run_at`, at least every POLL_SECONDS on PostgreSQL (other instances
create and change schedules), and at once when this instance creates, changes or triggers one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from taskgrove.agent.foundations import tracing
from taskgrove.agent.engine.engine import Engine
from taskgrove.agent.engine.follow_final import follow_execution
from taskgrove.agent.engine.slots import iso, parse_iso, plan
from taskgrove.agent.engine.webhooks import WebhookConfig, deliver_webhooks
from taskgrove.storage.schedule_store import ScheduleStore
from taskgrove.storage.clock import now_iso
from taskgrove.storage.outage import recognise

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # PostgreSQL: how stale this instance's view of other instances' schedules may be
IDLE_SECONDS = 30.0  # SQLite: one instance, which wakes itself on every change; this is a safety net
STOP_SECONDS = 10.0  # how long stop() waits for the pass under way before cancelling it
DUE_BATCH = 100  # slots claimed per pass at most
FAILED_CLAIM_SECONDS = 5.0  # a schedule whose claim raised is left alone this long
MIN_WAIT_SECONDS = 0.05


class ScheduleLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.repo = engine.repo
        self.schedules = ScheduleStore(engine.repo)
        self._wake = asyncio.Event()
        self._job: asyncio.Task[None] | None = None
        self._stopping = False
        self._backoff: dict[str, float] = {}  # schedule id -> monotonic time before which it is not claimed

    def start(self) -> None:
        self._stopping = False
        self._job = asyncio.create_task(self._loop(), name="taskgrove-schedules")

    async def stop(self) -> None:
        """Let the pass under way finish (a claim is one transaction either way), then end.

        A flag, not only a cancel: on Python 3.11 a cancel that arrives just as `wait_for`'s
        event fires is swallowed, and the loop would sleep on."""
        job, self._job = self._job, None
        if job is None:
            return
        self._stopping = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(job), STOP_SECONDS)
        except asyncio.TimeoutError:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)

    def wake(self) -> None:
        """Look again now (a schedule of this instance was created, changed or triggered)."""
        self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                delay = await self.run_due(datetime.now(timezone.utc))
            except Exception as exc:  # a failed pass (the database went away) is retried, never fatal
                if recognise(exc) is None:  # an outage is logged once by storage/outage.py
                    log.exception("schedule pass failed")
                delay = POLL_SECONDS
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def run_due(self, now: datetime) -> float:
        """Claim and start every slot due at `now`; returns the seconds until the next look."""
        due: list[dict[str, Any]] = []
        if not self.engine.stopping:
            due = await self.schedules.due(iso(now), DUE_BATCH)
            clock = time.monotonic()
            for schedule in due:
                if self._stopping:
                    break
                if self._backoff.get(schedule["id"], 0.0) > clock:
                    continue
                try:
                    await self.claim(schedule, now)
                    self._backoff.pop(schedule["id"], None)
                except Exception:  # one schedule must not hold up the others, nor spin the loop
                    log.exception("schedule %s: claiming slot %s failed; trying again in %.0f s", schedule["id"],
                                  schedule["next_run_at"], FAILED_CLAIM_SECONDS)
                    self._backoff[schedule["id"]] = time.monotonic() + FAILED_CLAIM_SECONDS
        if len(due) == DUE_BATCH and not self._backoff:
            return 0.0  # more are due than one pass takes
        earliest = await self.schedules.earliest()
        cap = IDLE_SECONDS if self.engine.sqlite else POLL_SECONDS
        if earliest is None:
            return cap
        wait = (parse_iso(earliest) - datetime.now(timezone.utc)).total_seconds()
        if wait > 0:
            return min(cap, wait)
        # Something is due still: it came due during this pass, or its claim failed just now.
        clock = time.monotonic()
        self._backoff = {sid: until for sid, until in self._backoff.items() if until > clock}
        return min(cap, max(MIN_WAIT_SECONDS, min(self._backoff.values(), default=clock) - clock))

    async def claim(self, schedule: Mapping[str, Any], now: datetime) -> None:
        slot = schedule["next_run_at"]
        runs, following = plan(schedule, parse_iso(slot), now)
        await self.start_run(schedule, slot, None if following is None else iso(following), runs=runs)

    async def start_run(self, schedule: Mapping[str, Any], slot: str | None, next_run_at: str | None, *,
                        runs: bool = True) -> dict[str, Any] | None:
        """Claim `slot` (None: a manual run) and start the run it inserted; None when the claim
        was lost, else the claim (updated schedule, execution, copies)."""
        engine = self.engine
        claimed = await self.schedules.claim_slot(schedule, slot, next_run_at, runs, now_iso(), engine.instance_id,
                                                  engine.lease_until(), tracing.stored_traceparent(None))
        if claimed is None or claimed["execution"] is None:
            if claimed is not None:
                log.info("schedule %s: slot %s consumed without a run", schedule["id"], slot)
            return claimed
        copies = claimed["copies"]
        tree_id = copies[0]["task_tree_id"]
        if schedule["webhook_config"]:  # subscribed before the run starts: no event is missed
            sub = engine.bus.subscribe(lambda e: e["root_task_id"] == tree_id, maxsize=10_000)
            events = follow_execution(engine.repo, sub, tree_id)  # ends with final, even one read from the database
            execution = claimed["execution"]
            engine.background.spawn(deliver_webhooks(events, WebhookConfig(**schedule["webhook_config"]),
                                                     tracing.execution_header(execution.get("traceparent"),
                                                                              execution["id"])))
        call = {"user_id": schedule["user_id"], "llm_api_key": None, "llm_provider": None}
        await engine.run_keeper.run_inserted(claimed["execution"], copies, call)
        log.info("schedule %s: slot %s runs as tree %s", schedule["id"], slot or "(manual)", tree_id)
        return claimed
