"""The trigger loop: start the runs that events of triggers call for, when their policy says so.

The sibling of engine/schedule_loop.py, and as small. `events.emit` leaves inbox rows
(storage/trigger_store.take_in_event, in the event's transaction) and wakes this loop; every
instance runs it on the same rows. A look reads the (trigger, key) groups with waiting events; a group that is due (its debounce
quiet, its batch full or old enough, at once without either) is decided and carried out in one
transaction (trigger_store.take_group, with agent/engine/trigger_policy.decide), whose
compare-and-set on the rows makes each event go into one run across instances. Cancelling (a
`cancel_on` event, a singleton `replace`) goes through the engine's cancel first and is recorded
after, so a crash in between cancels again (a no-op) rather than forgets. The loop wakes at the
earliest due group, at least every POLL_SECONDS on PostgreSQL (others' events) and while a queue
waits for a run to end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any

from taskgrove.agent.engine.engine import Engine
from taskgrove.agent.engine.trigger_policy import decide, due_at
from taskgrove.agent.foundations import tracing
from taskgrove.agent.foundations.trigger_metrics import TriggerMetrics
from taskgrove.storage.clock import now_iso
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.trigger_store import Plan, TakenElsewhere, TriggerStore
from taskgrove.storage.outage import recognise

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # PostgreSQL: how stale this instance's view of other instances' events may be
HOLD_SECONDS = 0.5  # a queue behind a running run looks again this often
IDLE_SECONDS = 30.0  # SQLite: one instance, woken by its own emits; a safety net
STOP_SECONDS = 10.0
GROUPS = 500  # groups read per look
FAILED_SECONDS = 5.0  # a group whose handling raised is left alone this long
REPLACE_ROUNDS = 3  # a replace cancels, then starts; a run started meanwhile elsewhere means another round
LIVE = (TaskStatus.IN_PROGRESS.value, TaskStatus.PENDING.value)  # running work first
CANCEL_PASSES = 3  # a cancelled task can make a pending one runnable for a moment; look again


class TriggerLoop:
    def __init__(self, engine: Engine, metrics: TriggerMetrics) -> None:
        self.engine = engine
        self.repo = engine.repo
        self.triggers = TriggerStore(engine.repo)
        self.metrics = metrics
        self._wake = asyncio.Event()
        self._job: asyncio.Task[None] | None = None
        self._stopping = False
        self._backoff: dict[tuple[str, str], float] = {}

    def start(self) -> None:
        self._stopping = False
        self._job = asyncio.create_task(self._loop(), name="taskgrove-triggers")

    async def stop(self) -> None:
        """Let the look under way finish (each decision is one transaction), then end."""
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
        """Look again now (an event was taken in, a trigger changed)."""
        self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                delay = await self.run_due()
            except Exception as exc:  # a failed look (the database went away) is retried, never fatal
                if recognise(exc) is None:  # an outage is logged once by storage/outage.py
                    log.exception("trigger look failed")
                delay = POLL_SECONDS
            if delay <= 0:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def run_due(self) -> float:
        """Handle every due group; the seconds until the next look (0: look again at once)."""
        cap = IDLE_SECONDS if self.engine.sqlite else POLL_SECONDS
        if self.engine.stopping:
            return cap
        groups = await self.triggers.pending_groups(GROUPS)
        wait, acted, clock = cap, False, time.monotonic()
        for group in groups:
            if self._stopping:
                break
            where = (group["trigger_id"], group["group_key"])
            if self._backoff.get(where, 0.0) > clock:
                wait = min(wait, self._backoff[where] - clock)
                continue
            try:
                if group["cancels"]:
                    await self._cancel_on(group["trigger"], group["group_key"])
                    acted = True
                    continue
                trigger = group["trigger"]
                due = due_at(trigger, group["count"], group["first_at"], group["last_at"])
                ahead = (due - datetime.now(timezone.utc)).total_seconds()
                if ahead > 0:
                    wait = min(wait, ahead)
                    continue
                plan = await self.take(group["trigger_id"], group["group_key"])
                if plan.action in ("start", "skip"):
                    acted = True
                elif plan.action == "hold":
                    wait = min(wait, HOLD_SECONDS)
                elif plan.due_at is not None:
                    wait = min(wait, max(0.0, (datetime.fromisoformat(plan.due_at)
                                               - datetime.now(timezone.utc)).total_seconds()))
                self._backoff.pop(where, None)
            except TakenElsewhere:
                acted = True  # another instance took some of its events: look again
            except Exception:  # one trigger must not hold up the others, nor spin the loop
                log.exception("trigger %s, key %r: handling its events failed; trying again in %.0f s", *where,
                              FAILED_SECONDS)
                self._backoff[where] = time.monotonic() + FAILED_SECONDS
                wait = min(wait, FAILED_SECONDS)
        return 0.0 if acted or len(groups) == GROUPS else max(0.01, wait)

    async def take(self, trigger_id: str, key: str) -> Plan:
        """Decide for one group now and carry the decision out (a replace cancels, then decides again)."""
        engine = self.engine
        plan = Plan("wait", [])
        for _ in range(REPLACE_ROUNDS):
            now = datetime.now(timezone.utc)
            answer = await self.triggers.take_group(
                trigger_id, key, lambda trigger, rows, running: decide(trigger, rows, running, now),
                now_iso(), engine.instance_id, engine.lease_until(), tracing.stored_traceparent(None))
            plan, trigger = answer["plan"], answer["trigger"]
            if plan.action == "replace":
                newest = plan.taken[-1]["event_id"] if plan.taken else "?"
                reason = (f"Replaced by a newer run: trigger {trigger_id} took event {newest} for key {key!r} "
                          f"(singleton: replace)")
                await self._cancel_runs(plan.running, reason)
                counted = await self.triggers.record_cancels(trigger_id, list(plan.running), reason)
                self.metrics.cancelled.inc(counted)
                continue
            if plan.action == "skip":
                self.metrics.counted("skipped", len(plan.taken))
            if plan.action == "start" and answer["execution"] is not None:
                self._count_start(trigger, plan)
                copies = answer["copies"]
                call = {"user_id": trigger["user_id"], "llm_api_key": None, "llm_provider": None}
                await engine.run_keeper.run_inserted(answer["execution"], copies, call)
                log.info("trigger %s, key %r: %d event(s) run as tree %s", trigger_id, key, len(plan.taken),
                         copies[0]["id"])
            return plan
        return plan

    def _count_start(self, trigger: dict[str, Any], plan: Plan) -> None:
        self.metrics.runs.inc()
        if trigger.get("batch"):
            self.metrics.counted("batched", len(plan.taken))
        else:
            self.metrics.counted("debounced", len(plan.taken) - 1)

    async def _cancel_on(self, trigger: dict[str, Any], key: str) -> None:
        """Carry out the waiting cancel_on events of a key: cancel the runs started before each."""
        for cancel in await self.triggers.waiting_cancels(trigger["id"], key):
            roots = await self.triggers.running_roots(trigger["id"], key, cancel["created_at"])
            reason = (f"Cancelled by event '{trigger['cancel_on']}' ({cancel['event_id']}) for key {key!r} "
                      f"(trigger {trigger['id']}, cancel_on)")
            await self._cancel_runs(roots, reason)
            settled = await self.triggers.settle_cancel(cancel, roots, reason, now_iso())
            if settled is not None:
                self.metrics.cancelled.inc(settled["cancelled"])
                self.metrics.counted("skipped", settled["dropped"])

    async def _cancel_runs(self, roots: Any, reason: str) -> None:
        """Cancel every live task of each run, with `reason` as their error (as tasks.cancel would)."""
        for root in roots:
            rows = await self.repo.tree(root)
            for _ in range(CANCEL_PASSES):
                live = [r for status in LIVE for r in rows if r["status"] == status]
                if not live:
                    break
                for row in live:
                    await self.engine.cancel(row["id"], reason)
                rows = await self.repo.tree(root)
