"""The pass loop: one loop owns every write of the execution path.

Each pass writes all outcomes and progress the attempts gathered since the last pass, claims the
next runnable tasks (taken in fair order, engine/fair.py) and ends the runs whose last task just
ended, in one transaction; then it publishes the events and starts the claimed attempts
(engine/live_attempts.py). Batching this way keeps a 1000-task tree to a few dozen transactions.

Every claim succeeds only if the database agrees the task may run, and every write for an
attempt is fenced by the token its claim returned (storage/executions.py). What the database
refuses makes the run concerned re-read the database (engine/run_keeper.py).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from taskgrove.agent.engine import history, inline, waits
from taskgrove.agent.engine.live_attempts import Attempts, LiveAttempt
from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import PROGRESS, TASK_COMPLETED, TASK_FAILED
from taskgrove.agent.engine.fair import FairQueue
from taskgrove.agent.engine.limits import TaskLimits, limits_of
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.tree_run import COMPLETED, FAILED, IN_PROGRESS, PENDING, TreeRun
from taskgrove.agent.engine.run_keeper import MAY_USE_LOOP_THREAD, RunKeeper
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage import executions
from taskgrove.storage.connections import is_transient
from taskgrove.storage.outage import recognise
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.clock import now_iso, seconds_until

log = logging.getLogger(__name__)

# A transient database error is retried until it passes; at shutdown, this many times before
# each write is tried on its own. The wait between tries doubles up to the max.
WRITE_ATTEMPTS = 5
WRITE_RETRY_MAX_SECONDS = 2.0
# How long a loop waits before trying again while the database is away (storage/outage.py).
OUTAGE_BACKOFF_SECONDS = 1.0
# How often a task waiting for a concurrency key looks again when no task of the key ends here
# (one may end on another instance, which tells nobody here).
KEY_RECHECK_SECONDS = 0.5

Write = tuple[str, int, dict[str, Any]]  # (task id, lease epoch, values)
Limited = tuple[str, TreeRun, TaskLimits]
_NOBODY: Mapping[Any, int] = {}  # the running counts when one user is queued: the order across users is moot  # a task claimed on its own: (task id, run, its limits)


class _Pass:
    """What one pass decided and what the database answered (one object per pass)."""

    __slots__ = ("stamp", "recorded", "taken", "limited", "ending", "touched", "accepted", "claimed", "ended",
                 "verdicts", "stale", "pure")

    def __init__(self, stamp: str, recorded: list[tuple[LiveAttempt, dict[str, Any]]], taken: list[tuple[str, TreeRun]],
                 limited: list[Limited], ending: list[TreeRun], touched: dict[int, TreeRun]) -> None:
        self.stamp = stamp
        self.recorded = recorded
        self.taken = taken  # claimed in the pass's transaction
        self.limited = limited  # claimed one by one (concurrency key, rate)
        self.ending = ending
        self.touched = touched  # runs to settle afterwards
        self.accepted: set[str] = set()
        self.claimed: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, str | None] = {}
        self.verdicts: list[tuple[str, Any]] = []
        self.stale: dict[str, TreeRun] = {}  # runs to re-read from the database
        self.pure: list[inline.InlineTask] = []  # claimed and completed in the pass's transaction


class PassLoop:
    def __init__(self, repo: TaskRepository, registry: ExecutorRegistry, settings: Settings, metrics: Metrics,
                 instance_id: str, lease_until: Callable[[], str], attempts: Attempts, run_keeper: RunKeeper,
                 publisher: Publisher, background: Background, wake: asyncio.Event) -> None:
        self.repo = repo
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.instance_id = instance_id
        self.lease_until = lease_until
        self.attempts = attempts
        self.running = attempts.running
        self.run_keeper = run_keeper
        self.runs = run_keeper.runs
        self.publisher = publisher
        self.background = background
        self.wake = wake
        self.lock = asyncio.Lock()  # serialises the loop's writes with cancels and rebuilds
        self.stopping = False  # shutting down: nothing new is claimed
        self.ready = FairQueue(settings.user_weights)  # runnable tasks, taken in fair order (engine/fair.py)
        self._due: list[tuple[float, str, str]] = []  # (monotonic time, id, tree_id): retries
        # Runnable tasks held back by their concurrency key or rate (engine/limits.py): due again
        # at a time, or when a task of their key ends here. They hold no slot meanwhile.
        self._deferred: list[tuple[float, str, str]] = []
        self._key_waiters: dict[str, set[tuple[str, str]]] = {}
        self.waiting_for: dict[str, str] = {}  # task id -> why it waits (tasks.get shows it)
        self.capped = 0  # ready tasks held back by SERVICE_EXECUTOR_CONCURRENCY in the last pass
        self.reserved = 0  # slots held for tasks claimed with their tree's insert, until they start
        # Tasks whose attempt ended and whose outcome waits in memory for the database (a write
        # retried through an outage): their leases are still ours to renew (leases.py renew),
        # or the lease keeper would settle them as interrupted and their outcome would be lost.
        self.unwritten: set[str] = set()
        # Deadlines of parked tasks (engine/waits.py): (monotonic time, id, tree_id), and each
        # task's latest, so a rebuild that finds it parked again adds no second timer.
        self._wakes: list[tuple[float, str, str]] = []
        self._wake_times: dict[str, float] = {}
        self.waits: waits.Waits  # set by the Engine once the waits exist (they need this loop)

    # --- the loop -------------------------------------------------------------------------

    async def loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that arrives
            # in the tick its event is set (shutdown wakes the loop, then cancels it), and the
            # loop would run on with shutdown waiting for it.
            # With nothing due (a tree that only runs), no timer: an asyncio.timeout made and
            # left every pass cost about as much as the pass's own bookkeeping.
            due = self._next_due()
            if due is None:
                await self.wake.wait()
            else:
                try:
                    async with asyncio.timeout(due):
                        await self.wake.wait()
                except TimeoutError:
                    pass
            # Let executors that are about to finish do so first: one pass then writes them all.
            await asyncio.sleep(0)
            self.wake.clear()
            self._release_due()
            began = time.perf_counter()
            try:
                await self.run_pass()
                self.metrics.engine_pass(time.perf_counter() - began)
            except Exception as exc:  # never let one bad pass stop the engine
                outage = recognise(exc) is not None  # logged once by storage/outage.py: back off quietly
                if not outage:
                    log.exception("engine pass failed")
                await asyncio.sleep(OUTAGE_BACKOFF_SECONDS if outage else 0.1)
                self.wake.set()

    async def run_pass(self) -> None:
        """One pass: record outcomes, take ready tasks, write everything in one transaction; then
        publish, start what was claimed, end what ended, and queue what became runnable."""
        async with self.lock:
            batch = self._gather()
            await self._write_and_claim(batch)
        self._publish_outcomes(batch)
        # Start every claimed task before the next await, so no cancel can slip in between.
        self._start_claimed(batch)
        self._complete_inline(batch)
        self._start_limited(batch)
        self._end_runs(batch)
        for run in batch.touched.values():
            if run.tree_id not in batch.stale:
                self.settle(run)
        for tree_id in batch.stale:
            self.run_keeper.refresh_later(tree_id)
        if self.attempts.outcomes or self.attempts.progress or (
                len(self.ready) > self.capped and len(self.running) < self.settings.max_concurrency):
            self.wake.set()

    # --- the steps of a pass --------------------------------------------------------------

    def _gather(self) -> _Pass:
        """Outcomes first, in memory: their dependents can then be claimed in this same pass."""
        attempts = self.attempts
        outcomes, attempts.outcomes = attempts.outcomes, []
        recorded = [(running, o) for o in outcomes if (running := self._record(o)) is not None]
        touched = {id(running.run): running.run for running, _ in recorded}
        # What became runnable, looked at once per run: a task waiting for several of the tasks
        # that just ended is checked once, not once per ending (a diamond's layer of 10 ending in
        # one pass: 10 checks of each next task, not 100).
        for run in touched.values():
            self.queue_runnable(run)
        taken, limited = self._split_limited(self._take_ready())
        stamp = now_iso()
        taken, pure = self._split_inline(taken, stamp)
        # Runs whose last task just ended (or ends inline now) end in this same transaction.
        inline_runs = {id(item.run): item.run for item in pure}
        pure_ids = {item.task_id for item in pure}
        ending = [run for run in {**touched, **inline_runs}.values()
                  if inline.over_after(run, pure_ids) and not run.ending and not run.done.is_set()
                  and self.runs.get(run.tree_id) is run]
        for run in ending:
            run.ending = True
        batch = _Pass(stamp, recorded, taken, limited, ending, touched)
        batch.pure = pure
        return batch

    def _split_inline(self, taken: list[tuple[str, TreeRun]], stamp: str,
                      ) -> tuple[list[tuple[str, TreeRun]], list[inline.InlineTask]]:
        """Pure tasks (engine/inline.py) with the outcome they get in the pass's transaction; the rest."""
        durable: list[tuple[str, TreeRun]] = []
        pure: list[inline.InlineTask] = []
        for tid, run in taken:
            item = inline.decide(self.registry, self.settings, self.attempts.services, run, tid, stamp)
            if item is None:
                durable.append((tid, run))
            else:
                pure.append(item)
        return durable, pure

    def _split_limited(self, taken: list[tuple[str, TreeRun]]) -> tuple[list[tuple[str, TreeRun]], list[Limited]]:
        """Tasks with a concurrency key or a rate are claimed one by one; the rest in the pass's
        transaction. Most tasks have neither, so they are told apart without a call per task."""
        limited: list[Limited] = []
        plain: list[tuple[str, TreeRun]] = []
        for tid, run in taken:
            row = run.rows[tid]
            if (row.get("concurrency") or row.get("rate_limit")) and (lim := limits_of(row, self.settings)):
                limited.append((tid, run, lim))
            else:
                plain.append((tid, run))
        return plain, limited

    async def _write_and_claim(self, batch: _Pass) -> None:
        """The pass's transaction, then the limited claims, each in its own."""
        stamp = batch.stamp
        progress, self.attempts.progress = self.attempts.progress, {}
        writes: list[Write] = [(running.task_id, running.epoch, o["values"]) for running, o in batch.recorded]
        writes += [(tid, r.epoch, {"progress": p, "updated_at": stamp})
                   for tid, p in progress.items() if (r := self.running.get(tid)) is not None]
        rows = history.rows_of(batch.recorded)
        rows.update((item.task_id, item.row) for item in batch.pure)
        batch.accepted, batch.claimed, batch.ended = await self._write(
            writes, [tid for tid, _ in batch.taken] + [item.task_id for item in batch.pure], stamp,
            [(run.execution_id, run.version) for run in batch.ending], rows,
            [(item.task_id, item.epoch, item.values) for item in batch.pure])
        batch.verdicts = [await self._claim_limited(tid, lim, stamp) for tid, _, lim in batch.limited]

    def _publish_outcomes(self, batch: _Pass) -> None:
        stale = batch.stale
        for running, outcome in batch.recorded:
            if running.span is not None:  # traces on: reported once the database took it
                self.attempts.end_span(running, outcome, stored=running.task_id in batch.accepted)
            if running.task_id in batch.accepted:
                self._publish_outcome(running, outcome)
                # (a park has no status: the task stays in progress)
                if outcome["values"].get("status", IN_PROGRESS) != running.run.rows[running.task_id]["status"]:
                    stale[running.run.tree_id] = running.run  # stored as a failure after all
            else:  # the database no longer honours this attempt's token
                stale[running.run.tree_id] = running.run

    def _start_claimed(self, batch: _Pass) -> None:
        """Start every task the database granted, before the next await (no cancel slips in
        between); also in a tree found stale in this pass (another task's claim refused after a
        tasks.update): a claimed task nobody starts would sit in_progress until its lease ran out
        (the refresh then finds it ours and running)."""
        stale, claimed, touched, start = batch.stale, batch.claimed, batch.touched, self.attempts.start
        for tid, run in batch.taken:
            touched[id(run)] = run
            if tid in claimed:
                start(tid, run, batch.stamp, claimed[tid])
            elif tid in run.queued:  # the database says not now: look at the tree again
                stale[run.tree_id] = run

    def _complete_inline(self, batch: _Pass) -> None:
        """Pure tasks claimed and completed in the pass's transaction: their attempt begins and
        ends here, as the durable path records and publishes it. One claimed whose outcome write
        was refused (its epoch was not the one predicted) runs as an ordinary attempt."""
        for item in batch.pure:
            tid, run = item.task_id, item.run
            batch.touched[id(run)] = run
            claim = batch.claimed.get(tid)
            if claim is None:
                if tid in run.queued:  # the database says not now: look at the tree again
                    batch.stale[run.tree_id] = run
            elif tid not in batch.accepted:
                self.attempts.start(tid, run, batch.stamp, claim)
            else:
                self.complete_inline(tid, run, batch.stamp, claim, item.values)

    def complete_inline(self, tid: str, run: TreeRun, stamp: str, claim: Mapping[str, Any],
                        values: Mapping[str, Any]) -> None:
        """A pure task whose outcome is stored (by a pass, or by its tree's insert:
        engine/insert_inline.py): its attempt begins and ends in memory, recorded and published
        as the durable path records and publishes an outcome."""
        outcome = {"id": tid, "values": values}
        self.attempts.begin(tid, run, stamp, claim)
        running = self._record(outcome)
        if running is not None:
            self._publish_outcome(running, outcome)

    def _start_limited(self, batch: _Pass) -> None:
        stale = batch.stale
        for (tid, run, lim), (verdict, value) in zip(batch.limited, batch.verdicts):
            batch.touched[id(run)] = run
            if verdict == "claimed" and tid in run.queued:
                self.waiting_for.pop(tid, None)
                self.attempts.start(tid, run, batch.stamp, value)
            elif verdict in ("key", "rate") and tid in run.queued:
                self._defer(tid, run, lim, verdict, value)
            elif tid in run.queued:
                stale[run.tree_id] = run

    def _end_runs(self, batch: _Pass) -> None:
        for run in batch.ending:
            status = batch.ended.get(run.execution_id)
            # Ended in the database, also when the pass found the run stale (a write or claim of
            # it refused): the end is refused while a member may still run (statements.END_EXECUTION),
            # so nothing is left to re-read, and the run reports `final` instead of being dropped.
            if status is not None:
                self.run_keeper.ended(run, status)
                continue
            run.ending = False
            if run.execution_id in batch.ended:  # joined meanwhile, a member may still run, or no longer ours
                batch.stale[run.tree_id] = run

    # --- outcomes -------------------------------------------------------------------------

    def _record(self, outcome: dict[str, Any]) -> LiveAttempt | None:
        """Apply an outcome to the in-memory run; None when it must not be published (cancelled)."""
        tid = outcome["id"]
        running = self.running.pop(tid, None)
        if running is None or running.cancelled:
            return None
        run = running.run
        values = outcome["values"]
        if self._key_waiters:
            self._key_freed(run.rows[tid])
        if self.waiting_for:
            self.waiting_for.pop(tid, None)
        if "wait" in outcome:  # parked: in progress, with no attempt and no slot (engine/waits.py)
            run.rows[tid].update(values)
            run.park(tid)
            return running
        run.rows[tid].update({k: values[k] for k in ("status", "progress", "result", "error", "completed_at",
                                                     "next_attempt_at") if k in values})
        if values["status"] == PENDING:
            run.retry_later(tid)
            self.retry_at(tid, run.tree_id, outcome["delay"])
        else:
            run.finished(tid, values["status"])
        return running  # what became runnable is queued by _gather, once per run

    def _publish_outcome(self, running: LiveAttempt, outcome: dict[str, Any]) -> None:
        tid, run, values = running.task_id, running.run, outcome["values"]
        self.metrics.attempt_ended(running.executor_id, "parked" if "status" not in values else
                                   "retry" if values["status"] == PENDING else values["status"],
                                   time.monotonic() - running.began)
        name = run.rows[tid]["name"]
        publish = self.publisher.publish
        if "wait" in outcome and "status" not in values:
            wait = outcome["wait"]
            publish(run, PROGRESS, tid, status=IN_PROGRESS, progress=run.rows[tid].get("progress") or 0.0,
                    attempt=running.attempt, waiting=waits.public_wait(values["waiting"]),
                    message=f"Task '{name}' waits for {wait['kind']}: {wait['prompt']}")
            if tid in run.parked:
                self.waits.watch(tid, run)
            return
        if not self.publisher.listened:  # nobody to tell: no event built (engine/publish.py)
            return
        if values["status"] == COMPLETED:
            publish(run, TASK_COMPLETED, tid, status=COMPLETED, progress=1.0, attempt=running.attempt,
                    result=values["result"], message=f"Task '{name}' completed")
        elif values["status"] == PENDING:
            publish(run, PROGRESS, tid, status=PENDING, progress=0.0, attempt=running.attempt,
                    error=values["error"], next_attempt_at=values["next_attempt_at"],
                    message=outcome["message"], status_changed=True)
        else:
            publish(run, TASK_FAILED, tid, status=FAILED, progress=values["progress"],
                    attempt=running.attempt, error=values["error"], message=values["error"])

    def settle(self, run: TreeRun) -> None:
        """After a task ended: queue what became runnable, end the run when nothing is left."""
        self.queue_runnable(run)
        if run.parked and run.only_waits():
            run.resting.set()
        if run.is_over() and not run.done.is_set() and not run.ending:
            run.ending = True
            self.background.spawn(self.run_keeper.finish(run))

    # --- the queue of runnable tasks ------------------------------------------------------

    def queue_runnable(self, run: TreeRun) -> None:
        for tid in run.runnable():
            row = run.rows[tid]
            self.ready.push((row["priority"], row["created_at"], tid, run.tree_id), row.get("user_id"))

    def retry_at(self, tid: str, tree_id: str, delay: float) -> None:
        """A task of a run here runs again in `delay` seconds."""
        heapq.heappush(self._due, (time.monotonic() + delay, tid, tree_id))

    def wake_at(self, tid: str, tree_id: str, at: str) -> None:
        """A parked task of a run here reaches its deadline at `at` (a stored time)."""
        when = time.monotonic() + seconds_until(at)
        if self._wake_times.get(tid) != when:
            self._wake_times[tid] = when
            heapq.heappush(self._wakes, (when, tid, tree_id))
            self.wake.set()  # the loop's next wait must count this deadline

    def _next_due(self) -> float | None:
        due = [heap[0][0] for heap in (self._due, self._deferred, self._wakes) if heap]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _release_due(self) -> None:
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, tid, tree_id = heapq.heappop(self._due)
            run = self.runs.get(tree_id)
            if run is not None and tid in run.retrying:
                run.retry_due(tid)
                self.queue_runnable(run)
        while self._deferred and self._deferred[0][0] <= now:
            _, tid, tree_id = heapq.heappop(self._deferred)
            self._requeue(tid, tree_id)
        while self._wakes and self._wakes[0][0] <= now:
            when, tid, tree_id = heapq.heappop(self._wakes)
            if self._wake_times.get(tid) != when:
                continue  # an older timer of the same task
            del self._wake_times[tid]
            run = self.runs.get(tree_id)
            if run is not None and tid in run.parked:
                self.waits.expire(tid, tree_id)

    def _requeue(self, tid: str, tree_id: str) -> None:
        """A deferred task goes back to the fair queue, if its run still waits for it."""
        run = self.runs.get(tree_id)
        if run is not None and tid in run.queued and tid not in self.running:
            row = run.rows[tid]
            self.ready.push((row["priority"], row["created_at"], tid, tree_id), row.get("user_id"))

    def _defer(self, tid: str, run: TreeRun, limits: TaskLimits, verdict: str, value: Any) -> None:
        """The database refused a limited claim for its key or rate: wait without a slot."""
        if verdict == "key":
            self.waiting_for[tid] = f"concurrency key {limits.key} ({value}/{limits.limit})"
            self._key_waiters.setdefault(limits.key or "", set()).add((tid, run.tree_id))
            delay = KEY_RECHECK_SECONDS  # a task of the key may end on another instance
        else:
            self.waiting_for[tid] = f"rate limit {limits.rate_key} (next start at {value})"
            delay = max(0.0, seconds_until(value))
        self.metrics.deferred(verdict)
        heapq.heappush(self._deferred, (time.monotonic() + delay, tid, run.tree_id))

    def _key_freed(self, row: Mapping[str, Any]) -> None:
        """A task of a concurrency key ended here: the tasks waiting for that key try again now."""
        key = row.get("concurrency_key")
        for tid, tree_id in self._key_waiters.pop(key, ()) if key else ():
            self._requeue(tid, tree_id)

    def _take_ready(self) -> list[tuple[str, TreeRun]]:
        """As many runnable tasks as there are free slots, in fair order, within the executors' caps."""
        if self.stopping:
            return []  # shutting down: what has not started is left for the next start
        free = self.settings.max_concurrency - len(self.running) - self.reserved
        ready = self.ready
        if not ready or free <= 0:
            self.capped = 0
            return []
        caps = self.settings.executor_concurrency
        busy = Counter(r.executor_id for r in self.running.values()) if caps else None
        taken: list[tuple[str, TreeRun]] = []
        seen: set[str] = set()  # a rebuilt run may have queued a task twice
        deferred: list[tuple[tuple[int, str, str, str], Any]] = []
        # Tasks running per user, for the order across users; moot with one user queued (no push
        # happens during the pass, so it stays one).
        running = Counter(r.row.get("user_id") for r in self.running.values()) if ready.users > 1 else None
        runs = self.runs
        while ready and len(taken) < free:
            item, user_id = ready.pop(running or _NOBODY)  # type: ignore[misc]  # not None: `ready` is not empty
            _, _, tid, tree_id = item
            run = runs.get(tree_id)
            if run is None or tid not in run.queued or tid in seen:
                continue
            seen.add(tid)
            if busy is not None:
                executor_id = self.registry.wanted(run.rows[tid])
                cap = caps.get(executor_id or "")
                if cap is not None and busy[executor_id] >= cap:
                    deferred.append((item, user_id))  # its executor is at its cap: later, when one ends
                    continue
                busy[executor_id] += 1
            if running is not None:
                running[user_id] += 1
            taken.append((tid, run))
        for item, user_id in deferred:
            self.ready.push(item, user_id)
        self.capped = len(deferred)  # these wait for a task of their executor to end, not for a pass
        return taken

    def reserve_for_insert(self, rows: list[dict[str, Any]]) -> list[str]:
        """Tasks of a tree about to be inserted that this instance's next pass would claim anyway:
        claimed with the insert instead (storage/executions.py claimed_at_insert), which saves
        the tree one transaction and a pass before its first attempt starts. Only slots the
        next pass would have left after taking every task queued now (so fair order takes
        nothing from anyone), only while no executor has a cap, and only tasks a plain claim
        takes (pending, no dependencies, no concurrency key or rate). Their slots are held until
        `release` (the caller: once they started or the insert failed)."""
        if self.stopping or self.settings.executor_concurrency:
            return []
        free = self.settings.max_concurrency - len(self.running) - self.reserved - len(self.ready)
        if free <= 0:
            return []
        plain = [row for row in rows if row["status"] == PENDING and not row.get("dependencies")
                 and not row.get("next_attempt_at") and not row.get("concurrency") and not row.get("rate_limit")
                 and not inline.may_be_pure(self.registry, row)]  # a pass completes those inline
        if len(plain) > free:  # the pass's order within a tree: priority, then creation
            plain.sort(key=lambda row: (row["priority"], row["created_at"]))
        ids = [row["id"] for row in plain[:free]]
        self.reserved += len(ids)
        return ids

    def release(self, ids: list[str]) -> None:
        """Slots held by reserve_for_insert are free again (their tasks started, or were never stored)."""
        self.reserved -= len(ids)

    # --- writing --------------------------------------------------------------------------

    async def _claim_limited(self, tid: str, limits: TaskLimits, stamp: str) -> tuple[str, Any]:
        """One limited claim in its own transaction; a database error leaves it for a later pass."""
        try:  # repo.transact, not a named store operation (issue 44's documented exception): the claim
            # is the pass loop's hot path, where an extra call layer is not taken unmeasured (bench/ab.py)
            return await self.repo.transact(executions.claim_limited, tid, limits.key, limits.limit, limits.rate_key,
                                       limits.interval, self.instance_id, self.lease_until(), stamp,
                                       inline=MAY_USE_LOOP_THREAD)
        except Exception as exc:
            if not is_transient(exc):
                log.exception("limited claim of task %s failed", tid)
            return "refused", None

    async def _write(self, writes: list[Write], claims: list[str], stamp: str, ends: list[tuple[str, str]],
                     rows: dict[str, history.Attempt], later: list[Write] | None = None,
                     ) -> tuple[set[str], dict[str, dict[str, Any]], dict[str, str | None]]:
        """One transaction for a whole pass. A transient error (the database locked, restarting,
        its connection cut) is retried for as long as it lasts: the outcomes of a pass are the
        users' work, and a fault of the platform must not fail it. Only at shutdown, or on an
        error a retry cannot cure, is each write tried on its own, so one unstorable outcome
        fails only its own task."""
        if not (writes or claims or ends):
            return set(), {}, {}
        attempt = 0
        # Only once a write has failed: a write that goes through is not kept waiting.
        waiting: set[str] = set()
        try:
            while True:
                attempt += 1
                try:
                    return await self.repo.write_pass(writes, claims, self.instance_id, self.lease_until(), stamp,
                                                      ends, rows, later or ())
                except Exception as exc:
                    if not is_transient(exc) or (self.stopping and attempt >= WRITE_ATTEMPTS):
                        log.warning("engine write failed (%s); writing its parts one by one", type(exc).__name__,
                                    exc_info=True)
                        break
                    if not waiting:
                        waiting = {tid for tid, _, _ in writes} - self.unwritten
                        self.unwritten |= waiting
                    # An outage is logged once by storage/outage.py; anything else here.
                    if recognise(exc) is None and (attempt <= WRITE_ATTEMPTS or attempt % 30 == 0):
                        log.warning("engine write failed (attempt %d, %s), retrying", attempt, type(exc).__name__)
                    await asyncio.sleep(min(0.05 * 2 ** attempt, WRITE_RETRY_MAX_SECONDS))
        finally:
            self.unwritten -= waiting
        accepted: set[str] = set()
        for tid, epoch, values in writes:
            accepted |= await self._write_alone(tid, epoch, values, stamp, rows.pop(tid, None))
        return accepted, {}, {}  # claims and ends wait for the next pass

    async def _write_alone(self, tid: str, epoch: int, values: dict[str, Any], stamp: str,
                           row: history.Attempt | None) -> set[str]:
        """One write on its own (with its attempt's history `row`, if it ends one); an outcome
        the database refuses becomes that task's failure."""
        try:
            accepted, _, _ = await self.repo.write_pass([(tid, epoch, values)], [], self.instance_id,
                                                        self.lease_until(), stamp, (), row and {tid: row})
            return accepted
        except Exception as exc:
            if "status" not in values and "waiting" not in values:
                return set()  # lost progress is harmless
            if is_transient(exc):  # (at shutdown) not the outcome's fault: it runs again on resume
                log.warning("outcome of task %s not stored (%s); the task runs again when its execution "
                            "resumes", tid, type(exc).__name__, extra={"task_id": tid})
                return set()
            log.warning("outcome of task %s could not be stored: %s", tid, type(exc).__name__,
                        extra={"task_id": tid})
            error = f"The outcome could not be stored in the database ({type(exc).__name__})"
        failed = {"status": FAILED, "result": None, "error": error, "completed_at": stamp, "updated_at": stamp,
                  "next_attempt_at": None, "lease_owner": None, "lease_expires_at": None}
        try:
            accepted, _, _ = await self.repo.write_pass(
                [(tid, epoch, failed)], [], self.instance_id, self.lease_until(), stamp, (),
                row and {tid: history.as_failure(row._replace(ended_at=stamp), error)})
        except Exception:
            log.warning("task %s: not even its failure could be stored; its lease will expire", tid)
            return set()
        values.update(failed)  # what the events and the in-memory run now report
        return accepted
