"""The scheduler: claims runnable tasks, runs their executors, writes outcomes, publishes events.

One loop (`_loop`) owns every write of the execution path. Each pass ("tick") writes all
outcomes and progress gathered since the last pass and claims the next runnable tasks, in one
transaction, then publishes the events and starts the claimed executors. Batching this way keeps
a 1000-task tree to a few dozen transactions.

The database is the truth (storage/executions.py): an execution request is a row that any
instance can continue; a claim succeeds only if the database agrees the task may run; every write
for an attempt is fenced by the token its claim returned. The in-memory `TreeRun`s are an index,
rebuilt from the database whenever it may be stale (a join, a takeover, a write that was refused).
Leases, takeover and recovery live in engine/leases.py.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError

from taskgrove.agent.engine import bus as ev
from taskgrove.agent.engine.bus import EventBus
from taskgrove.agent.engine.fair import FairQueue
from taskgrove.agent.engine.limits import Limits, limits_of
from taskgrove.agent.engine.notify import PgNotifier, asyncpg_dsn
from taskgrove.agent.engine.leases import LeaseKeeper
from taskgrove.agent.engine.retry import RetryPolicy, iso_in, seconds_until, stored_policy
from taskgrove.agent.engine.run import INTERRUPTED, TreeRun, select_for_execution
from taskgrove.agent.logs import current_task
from taskgrove.agent.metrics import Metrics
from taskgrove.agent.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage import executions as xs
from taskgrove.storage.repository import SMALL_PASS, TaskRepository
from taskgrove.storage.trees import PublicView, now_iso
from taskgrove.storage.values import Unstorable, storable, storable_async

log = logging.getLogger(__name__)

CANCEL_HOOK_TIMEOUT = 5.0
SHUTDOWN_ERROR = INTERRUPTED + "the service stopped; the task resumes when an instance runs its execution again"
WRITE_ATTEMPTS = 5  # a transient database error is retried this often before the tasks concerned fail
MAX_ERROR_CHARS = 10_000
# How often a task waiting for a concurrency key looks again when no task of the key ends here
# (one may end on another instance, which tells nobody here).
KEY_RECHECK_SECONDS = 0.5

_KIND_OF_STATUS = {"completed": ev.TASK_COMPLETED, "failed": ev.TASK_FAILED, "cancelled": ev.TASK_CANCELLED}


class AlreadyRunning(Exception):
    pass


class NotExecutable(Exception):
    pass


@dataclass
class Running:
    """An attempt whose executor coroutine runs in this process, with the token its claim holds."""

    task_id: str
    run: TreeRun
    epoch: int = 0
    attempt: int = 1
    checkpoint: Any = None
    executor_id: str | None = None
    executor: Executor | None = None
    job: asyncio.Task[None] | None = None
    cancelled: bool = False
    began: float = 0.0  # monotonic, for the duration metric

    @property
    def row(self) -> dict[str, Any]:
        return self.run.rows[self.task_id]


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying a write for: a busy/locked database or a lost connection."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, OSError, TimeoutError))


def _error_text(text: str) -> str:
    """An error message safe to store on every backend: bounded, valid Unicode, no NUL (which a
    PostgreSQL text column cannot hold: the task would fail with "could not be stored" instead)."""
    text = text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "... (truncated)"
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def _tokens(executor: Executor | None) -> int:
    usage = getattr(executor, "token_usage", None) or {}
    return int(usage.get("total_tokens") or 0)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """Checking a schema costs far more than using it: compile each distinct schema once."""
    import jsonschema  # here, not at start-up: ~40 ms and 2.6 MB that only running tasks need

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@functools.lru_cache(maxsize=256)
def _class_validator(cls: type[Executor]) -> Any:
    """An executor's declared input schema, found by its class: not encoded again for every task."""
    return _validator(json.dumps(cls.input_schema, sort_keys=True))


def _validate_inputs(inputs: dict[str, Any], schema: dict[str, Any],
                     declared_by: type[Executor] | None = None) -> None:
    """`declared_by`: the executor class whose own `input_schema` this is."""
    import jsonschema  # loaded by _validator on first use

    try:
        validator = _class_validator(declared_by) if declared_by is not None \
            else _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as exc:
        raise ExecutorError(f"schemas.input_schema is not a valid JSON Schema: {exc.message}",
                            retryable=False) from None
    error = jsonschema.exceptions.best_match(validator.iter_errors(inputs))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "inputs"
        raise ExecutorError(f"Input validation failed at '{where}': {error.message}", retryable=False)


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
        self.runs: dict[str, TreeRun] = {}
        self.running: dict[str, Running] = {}
        self._ready = FairQueue(settings.user_weights)  # runnable tasks, taken in fair order (engine/fair.py)
        self._due: list[tuple[float, str, str]] = []  # (monotonic time, id, tree_id): retries
        # Runnable tasks held back by their concurrency key or rate (engine/limits.py): due again
        # at a time, or when a task of their key ends here. They hold no slot meanwhile.
        self._deferred: list[tuple[float, str, str]] = []
        self._key_waiters: dict[str, set[tuple[str, str]]] = {}
        self.waiting_for: dict[str, str] = {}  # task id -> why it waits (tasks.get shows it)
        self._capped = 0  # ready tasks held back by SERVICE_EXECUTOR_CONCURRENCY in the last pass
        self._outcomes: list[dict[str, Any]] = []
        self._progress: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # serialises the loop's writes with cancels
        self._execute_lock = asyncio.Lock()  # executions open, join, rebuild and end one at a time
        self._background: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        # PostgreSQL only: carries events and cancels to the other instances (engine/notify.py).
        self.notifier: PgNotifier | None = None
        # Set by the lease keeper (engine/leases.py) when the app starts it.
        self.leases: LeaseKeeper | None = None

    @property
    def sqlite(self) -> bool:
        return self.repo.engine.dialect.name == "sqlite"

    def lease_until(self) -> str:
        return iso_in(self.settings.lease_seconds)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if not self.sqlite:
            self.notifier = PgNotifier(asyncpg_dsn(self.settings.database_url), self.instance_id, self.bus,
                                       self.cancelled_elsewhere, self.event_elsewhere)
            await self.notifier.start()
        self.leases = LeaseKeeper(self)
        await self.leases.recover_at_start()
        self._tasks = [
            asyncio.create_task(self._loop(), name="taskgrove-engine"),
            asyncio.create_task(self.leases.loop(), name="taskgrove-leases"),
        ]

    async def stop(self) -> None:
        """Stop claiming; let running tasks finish for up to SERVICE_SHUTDOWN_GRACE_SECONDS; then
        stop the loop and every executor still running (cancel hooks too, so child processes die).

        Attempts cut off are handed back as interrupted, not failed: their executions stay
        `running` with an expired lease, so the next start (SQLite) or another instance
        (PostgreSQL) resumes them.
        """
        self.stopping = True
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        while self.running and time.monotonic() < deadline and all(not job.done() for job in self._tasks):
            await asyncio.sleep(0.05)
        while (self._outcomes or self._progress) and time.monotonic() < deadline + 5 \
                and all(not job.done() for job in self._tasks):
            self._wake.set()  # the loop writes what finished during the grace period
            await asyncio.sleep(0.01)
        async with self._lock:  # and finishes the pass it is in
            pass
        if self.notifier is not None:
            await self.notifier.stop()
        for job in self._tasks:
            job.cancel()
        detached = [self._detach(tid) for tid in list(self.running)]
        await asyncio.gather(*(self._stop(running) for running in detached))
        try:
            stamp = now_iso()
            await self.repo.run(xs.release, self.instance_id, [r.execution_id for r in self.runs.values()],
                                stamp, SHUTDOWN_ERROR, self.settings.max_interruptions)
        except Exception:  # the database may be what is going away
            log.warning("could not hand back running executions at shutdown", exc_info=True)
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)

    # --- starting executions --------------------------------------------------------------

    async def execute(self, task_id: str, call: Mapping[str, Any] | None = None,
                      fresh_rows: list[dict[str, Any]] | None = None,
                      webhook: Mapping[str, Any] | None = None) -> TreeRun:
        """Start (or join) the execution of `task_id`; returns the tree's run right away.

        The request is recorded first (an executions row, with its webhook), so that it is
        carried out even if this instance dies. `fresh_rows`: the rows of a tree just inserted
        by the caller, to skip reading them back.
        """
        target = next((r for r in fresh_rows if r["id"] == task_id), None) if fresh_rows else None
        target = target or await self.repo.get(task_id)
        if target is None:
            raise KeyError(task_id)
        if target["origin_type"] == "archive":
            raise NotExecutable(f"Task '{task_id}' is an archive (read-only) and cannot be executed")
        if target["status"] == "in_progress":  # here or on another instance
            raise AlreadyRunning(task_id)
        async with self._execute_lock:  # one start at a time: two must not both create a run
            return await self._start(task_id, target["task_tree_id"], fresh_rows, dict(call or {}), webhook)

    async def _start(self, task_id: str, tree_id: str, fresh_rows: list[dict[str, Any]] | None,
                     call: dict[str, Any], webhook: Mapping[str, Any] | None) -> TreeRun:
        rows = {row["id"]: dict(row) for row in fresh_rows or await self.repo.tree(tree_id)}
        execution = await self.repo.run(xs.running_execution, tree_id, small=True)
        live_ids = self._live_ids(rows, execution)
        if task_id in live_ids:
            raise AlreadyRunning(task_id)
        chosen = select_for_execution(rows, task_id) - live_ids - {
            tid for tid, row in rows.items() if row["status"] == "in_progress"}
        if execution is not None and not chosen:  # everything it needs is already under way
            raise AlreadyRunning(task_id)
        stamp = now_iso()
        execution, joined = await self.repo.run(self._open, tree_id, task_id, call.get("user_id"), webhook,
                                                {tid: rows[tid]["status"] for tid in chosen}, stamp,
                                                small=len(chosen) <= SMALL_PASS)
        if chosen and not joined and self.runs.get(tree_id) is not None:
            raise AlreadyRunning(task_id)  # all it asked for moved on meanwhile (started, or just ended)
        if execution["owner"] != self.instance_id:
            # Another live instance drives this tree: it runs what we just marked.
            if self.notifier is not None:
                self.notifier.refresh(tree_id)
            return _RemoteRun(tree_id)
        run = await self._rebuild(execution, calls=dict.fromkeys(chosen, call))
        return run

    def _live_ids(self, rows: Mapping[str, Mapping[str, Any]], execution: Mapping[str, Any] | None) -> set[str]:
        """Tasks a running execution of the tree will still run (pending members, waiting retries)."""
        if execution is None:
            return set()
        run = self.runs.get(execution["task_tree_id"])
        if run is not None and run.execution_id == execution["id"]:
            return run.live
        return {tid for tid, row in rows.items()
                if row.get("execution_id") == execution["id"] and row["status"] == "pending"}

    def _open(self, c: Any, tree_id: str, task_id: str, user_id: str | None, webhook: Mapping[str, Any] | None,
              chosen: Mapping[str, str], stamp: str) -> tuple[dict[str, Any], int]:
        """One transaction: open or join the tree's execution and make the chosen tasks its members."""
        execution = xs.open_execution(c, tree_id, task_id, user_id, self.instance_id, self.lease_until(), stamp,
                                      webhook)
        joined = 0
        if chosen:
            joined = xs.join(c, execution["id"], chosen, stamp)
            execution["updated_at"] = stamp
        return execution, joined

    async def create_and_execute(self, rows: list[dict[str, Any]], call: Mapping[str, Any]) -> TreeRun:
        """Store a new tree and its execution in one transaction, then run it.

        A create cut off by a crash therefore leaves either nothing or a tree whose execution the
        next instance continues. Raises IntegrityError when an id is taken (nothing stored).
        """
        stamp = now_iso()
        # A new tree cannot be any run's yet: the insert needs no lock, so creates run side by side.
        execution = await self.repo.run(xs.insert_tree, rows, call.get("user_id"), self.instance_id,
                                        self.lease_until(), stamp, small=len(rows) <= SMALL_PASS)
        return await self.run_inserted(execution, rows, call)

    async def run_inserted(self, execution: Mapping[str, Any], rows: list[dict[str, Any]],
                           call: Mapping[str, Any]) -> TreeRun:
        """Run a tree its caller inserted together with its execution (xs.insert_tree), owned by
        this instance: a create, a schedule's run."""
        calls = dict.fromkeys((r["id"] for r in rows), dict(call))
        async with self._execute_lock:
            if rows[0]["task_tree_id"] in self.runs:  # someone executed it already: read what is stored
                return await self._rebuild(execution, calls=calls)
            fresh = [{**row, "execution_id": execution["id"]} if row["status"] == "pending" else row for row in rows]
            return await self._rebuild(execution, calls=calls, fresh_rows=fresh)

    async def _rebuild(self, execution: Mapping[str, Any], *, calls: Mapping[str, Mapping[str, Any]] | None = None,
                       fresh_rows: list[dict[str, Any]] | None = None) -> TreeRun:
        """The run of `execution` as the database has it now (caller holds `_execute_lock`).

        Used to start, join, take over and resynchronise alike. Attempts running in this process
        under a token the database still honours stay active; every other in-progress member
        is someone else's (about to be settled by the lease keeper) and is waited for.
        """
        async with self._lock:  # no pass may claim or settle an attempt between our read and our view
            return await self._rebuild_locked(execution, calls, fresh_rows)

    async def _rebuild_locked(self, execution: Mapping[str, Any], calls: Mapping[str, Mapping[str, Any]] | None,
                              fresh_rows: list[dict[str, Any]] | None) -> TreeRun:
        tree_id = execution["task_tree_id"]
        rows = {row["id"]: dict(row) for row in fresh_rows or await self.repo.tree(tree_id)}
        outside = {d["id"] for row in rows.values() for d in row["dependencies"]} - set(rows)
        if outside:
            rows.update(await self.repo.get_many(outside))
        old = self.runs.get(tree_id)
        run = TreeRun(tree_id=tree_id, rows=rows, execution_id=execution["id"], version=execution["updated_at"])
        if old is not None:
            run.calls.update(old.calls)
            run.done = old.done
        run.calls.update(calls or {})
        waiting: list[str] = []
        for tid, row in rows.items():
            if row.get("execution_id") != execution["id"]:
                continue
            status = row["status"]
            if status == "pending":
                delay = seconds_until(row.get("next_attempt_at"))
                if delay > 0:
                    run.retrying.add(tid)
                    heapq.heappush(self._due, (time.monotonic() + delay, tid, tree_id))
                else:
                    waiting.append(tid)
            elif status == "in_progress":
                running = self.running.get(tid)
                if running is not None and row.get("lease_owner") == self.instance_id \
                        and row.get("lease_epoch") == running.epoch:
                    run.active.add(tid)
                    running.run = run
                else:
                    run.foreign.add(tid)
            else:
                run.outcome[tid] = status
        # Attempts of ours the database no longer honours (a cancel, a takeover) stop here.
        for tid, running in list(self.running.items()):
            if running.run.tree_id == tree_id and tid not in run.active:
                self._spawn(self._stop(self._detach(tid)))
        run.add(waiting)
        self.runs[tree_id] = run
        self._settle(run)
        self._wake.set()
        return run

    async def refresh(self, tree_id: str) -> None:
        """Re-read a run of ours from the database (a join by another instance, a change by hand)."""
        async with self._execute_lock:
            run = self.runs.get(tree_id)
            if run is None:
                return
            execution = await self.repo.run(xs.get_execution, run.execution_id)
            if execution is None or execution["status"] != "running" or execution["owner"] != self.instance_id:
                self._drop(run, "its execution is no longer ours")
                return
            await self._rebuild(execution)

    def _drop(self, run: TreeRun, why: str) -> None:
        """Forget a run whose execution another instance now drives: schedule nothing from it."""
        log.warning("dropping the run of tree %s: %s", run.tree_id, why)
        if self.runs.get(run.tree_id) is run:
            del self.runs[run.tree_id]
        for tid, running in list(self.running.items()):
            if running.run is run:
                self._spawn(self._stop(self._detach(tid)))
        run.done.set()

    async def following(self, tree_id: str) -> TreeRun | None:
        """A handle to wait on the tree's running execution, here or on another instance; None
        when no execution of it is running."""
        run = self.runs.get(tree_id)
        if run is not None:
            return run
        if await self.repo.run(xs.running_execution, tree_id) is not None:
            return _RemoteRun(tree_id)
        return None

    async def wait(self, run: TreeRun, timeout: float | None) -> bool:
        if isinstance(run, _RemoteRun):
            return await self._wait_remote(run, timeout)
        try:
            await asyncio.wait_for(asyncio.shield(run.done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _wait_remote(self, run: "_RemoteRun", timeout: float | None) -> bool:
        """Wait for an execution another instance drives: its `final` event, or its stored end."""
        sub = self.bus.subscribe(lambda e: e["type"] == ev.FINAL and e["root_task_id"] == run.tree_id, maxsize=4)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if await self.repo.run(xs.running_execution, run.tree_id) is None:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                try:
                    await asyncio.wait_for(sub.get(), min(1.0, left) if left is not None else 1.0)
                    return True
                except asyncio.TimeoutError:
                    continue
        finally:
            sub.close()

    def _schedule(self, run: TreeRun) -> None:
        for tid in run.runnable():
            row = run.rows[tid]
            self._ready.push((row["priority"], row["created_at"], tid, run.tree_id), row.get("user_id"))

    # --- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._next_due())
            except asyncio.TimeoutError:
                pass
            # Let executors that are about to finish do so first: one pass then writes them all.
            await asyncio.sleep(0)
            self._wake.clear()
            self._release_due()
            began = time.perf_counter()
            try:
                await self._tick()
                self.metrics.engine_pass(time.perf_counter() - began)
            except Exception:  # never let one bad pass stop the engine
                log.exception("engine pass failed")
                await asyncio.sleep(0.1)
                self._wake.set()

    def _next_due(self) -> float | None:
        due = [heap[0][0] for heap in (self._due, self._deferred) if heap]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _release_due(self) -> None:
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, tid, tree_id = heapq.heappop(self._due)
            run = self.runs.get(tree_id)
            if run is not None and tid in run.retrying:
                run.retry_due(tid)
                self._schedule(run)
        while self._deferred and self._deferred[0][0] <= now:
            _, tid, tree_id = heapq.heappop(self._deferred)
            self._requeue(tid, tree_id)

    def _requeue(self, tid: str, tree_id: str) -> None:
        """A deferred task goes back to the fair queue, if its run still waits for it."""
        run = self.runs.get(tree_id)
        if run is not None and tid in run.queued and tid not in self.running:
            row = run.rows[tid]
            self._ready.push((row["priority"], row["created_at"], tid, tree_id), row.get("user_id"))

    def _defer(self, tid: str, run: TreeRun, limits: Limits, verdict: str, value: Any) -> None:
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
        if self.stopping:
            return []  # shutting down: what has not started is left for the next start
        free = self.settings.max_concurrency - len(self.running)
        caps = self.settings.executor_concurrency
        busy = Counter(r.executor_id for r in self.running.values()) if caps else Counter()
        taken: list[tuple[str, TreeRun]] = []
        seen: set[str] = set()  # a rebuilt run may have queued a task twice
        deferred: list[tuple[tuple[int, str, str, str], Any]] = []
        # Tasks running per user, for the order across users; moot with one user queued (no push
        # happens during the pass, so it stays one).
        running = Counter(r.row.get("user_id") for r in self.running.values()) if self._ready.users > 1 else Counter()
        while self._ready and len(taken) < free:
            item, user_id = self._ready.pop(running)
            _, _, tid, tree_id = item
            run = self.runs.get(tree_id)
            if run is None or tid not in run.queued or tid in seen:
                continue
            seen.add(tid)
            if caps:
                executor_id = self.registry.wanted(run.rows[tid])
                cap = caps.get(executor_id or "")
                if cap is not None and busy[executor_id] >= cap:
                    deferred.append((item, user_id))  # its executor is at its cap: later, when one ends
                    continue
                busy[executor_id] += 1
            running[user_id] += 1
            taken.append((tid, run))
        for item, user_id in deferred:
            self._ready.push(item, user_id)
        self._capped = len(deferred)  # these wait for a task of their executor to end, not for a pass
        return taken

    async def _tick(self) -> None:
        async with self._lock:
            outcomes, self._outcomes = self._outcomes, []
            progress, self._progress = self._progress, {}
            # Outcomes first, in memory: their dependents can then be claimed in this same pass.
            recorded = [(running, o) for o in outcomes if (running := self._record(o)) is not None]
            taken = self._take_ready()
            limited = [(tid, run, lim) for tid, run in taken if (lim := limits_of(run.rows[tid], self.settings))]
            if limited:
                special = {tid for tid, _, _ in limited}
                taken = [(tid, run) for tid, run in taken if tid not in special]
            # Runs whose last task just ended end in this same transaction.
            ending = [run for run in {id(r.run): r.run for r, _ in recorded}.values()
                      if run.is_over() and not run.ending and not run.done.is_set()
                      and self.runs.get(run.tree_id) is run]
            for run in ending:
                run.ending = True
            stamp = now_iso()
            writes = [(running.task_id, running.epoch, o["values"]) for running, o in recorded]
            writes += [(tid, r.epoch, {"progress": p, "updated_at": stamp})
                       for tid, p in progress.items() if (r := self.running.get(tid)) is not None]
            accepted, claimed, ended = await self._write(writes, [tid for tid, _ in taken], stamp,
                                                         [(run.execution_id, run.version) for run in ending])
            verdicts = [await self._claim_limited(tid, lim, stamp) for tid, _, lim in limited]
        stale: dict[str, TreeRun] = {}
        touched = {id(running.run): running.run for running, _ in recorded}
        for running, outcome in recorded:
            if running.task_id in accepted:
                self._publish_outcome(running, outcome)
                if outcome["values"]["status"] != running.run.rows[running.task_id]["status"]:
                    stale[running.run.tree_id] = running.run  # stored as a failure after all
            else:  # the database no longer honours this attempt's token
                stale[running.run.tree_id] = running.run
        # Start every claimed task before the next await, so no cancel can slip in between; also
        # in a tree found stale in this pass (another task's claim refused after a tasks.update):
        # the database gave this claim its lease, and a claimed task nobody starts would sit
        # in_progress until that lease ran out (the refresh below then finds it ours and running).
        for tid, run in taken:
            touched[id(run)] = run
            if tid in claimed:
                self._start_task(tid, run, stamp, claimed[tid])
            elif tid in run.queued:  # the database says not now: look at the tree again
                stale[run.tree_id] = run
        for (tid, run, lim), (verdict, value) in zip(limited, verdicts):
            touched[id(run)] = run
            if verdict == "claimed" and tid in run.queued:
                self.waiting_for.pop(tid, None)
                self._start_task(tid, run, stamp, value)
            elif verdict in ("key", "rate") and tid in run.queued:
                self._defer(tid, run, lim, verdict, value)
            elif tid in run.queued:
                stale[run.tree_id] = run
        for run in ending:
            status = ended.get(run.execution_id)
            if status is not None and run.tree_id not in stale:
                self._ended(run, status)
                continue
            run.ending = False
            if run.execution_id in ended:  # joined meanwhile, or no longer ours
                stale[run.tree_id] = run
        for run in touched.values():
            if run.tree_id not in stale:
                self._settle(run)
        for tree_id in stale:
            self._spawn(self.refresh(tree_id))
        if self._outcomes or self._progress or (
                len(self._ready) > self._capped and len(self.running) < self.settings.max_concurrency):
            self._wake.set()

    async def _claim_limited(self, tid: str, limits: Limits, stamp: str) -> tuple[str, Any]:
        """One limited claim in its own transaction; a database error leaves it for a later pass."""
        try:
            return await self.repo.run(xs.claim_limited, tid, limits.key, limits.limit, limits.rate_key,
                                       limits.interval, self.instance_id, self.lease_until(), stamp, small=True)
        except Exception as exc:
            if not is_transient(exc):
                log.exception("limited claim of task %s failed", tid)
            return "refused", None

    async def _write(self, writes: list[tuple[str, int, Mapping[str, Any]]], claims: list[str], stamp: str,
                     ends: list[tuple[str, str]]) -> tuple[set[str], dict[str, dict[str, Any]], dict[str, str | None]]:
        """One transaction for a whole pass. Transient errors are retried a few times; after that
        each write is tried on its own, so one unstorable outcome fails only its own task."""
        if not (writes or claims or ends):
            return set(), {}, {}
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return await self.repo.write_pass(writes, claims, self.instance_id, self.lease_until(), stamp, ends)
            except Exception as exc:
                if not is_transient(exc) or attempt == WRITE_ATTEMPTS:
                    log.warning("engine write failed (%s); writing its parts one by one", type(exc).__name__,
                                exc_info=True)
                    break
                log.warning("engine write failed (attempt %d of %d, %s), retrying", attempt, WRITE_ATTEMPTS,
                            type(exc).__name__)
                await asyncio.sleep(0.05 * 2 ** attempt)
        accepted: set[str] = set()
        for tid, epoch, values in writes:
            accepted |= await self._write_alone(tid, epoch, values, stamp)
        return accepted, {}, {}  # claims and ends wait for the next pass

    async def _write_alone(self, tid: str, epoch: int, values: dict[str, Any], stamp: str) -> set[str]:
        """One write on its own; an outcome the database refuses becomes that task's failure."""
        try:
            accepted, _, _ = await self.repo.write_pass([(tid, epoch, values)], [], self.instance_id,
                                                        self.lease_until(), stamp)
            return accepted
        except Exception as exc:
            if "status" not in values:
                return set()  # lost progress is harmless
            log.warning("outcome of task %s could not be stored: %s", tid, type(exc).__name__,
                        extra={"task_id": tid})
            error = f"The outcome could not be stored in the database ({type(exc).__name__})"
        failed = {"status": "failed", "result": None, "error": error, "completed_at": stamp, "updated_at": stamp,
                  "next_attempt_at": None, "lease_owner": None, "lease_expires_at": None}
        try:
            accepted, _, _ = await self.repo.write_pass([(tid, epoch, failed)], [], self.instance_id,
                                                        self.lease_until(), stamp)
        except Exception:
            log.warning("task %s: not even its failure could be stored; its lease will expire", tid)
            return set()
        values.update(failed)  # what the events and the in-memory run now report
        return accepted

    def _start_task(self, tid: str, run: TreeRun, stamp: str, claim: Mapping[str, Any]) -> None:
        run.started(tid)
        row = run.rows[tid]
        row.update(started_at=stamp, completed_at=None, progress=0.0, result=None, error=None,
                   attempt=claim["attempt"], lease_owner=self.instance_id, lease_epoch=claim["lease_epoch"])
        running = Running(task_id=tid, run=run, epoch=claim["lease_epoch"], attempt=claim["attempt"],
                          checkpoint=claim["checkpoint"], executor_id=self.registry.wanted(row),
                          began=time.monotonic())
        self.running[tid] = running
        self.metrics.attempt_started(running.executor_id)
        started = f"Task '{row['name']}' started" + (f" (attempt {claim['attempt']})" if claim["attempt"] > 1 else "")
        self._publish(run, ev.TASK_START, tid, status="in_progress", progress=0.0, attempt=claim["attempt"],
                      message=started)
        # SPEC.md: the move to in_progress is shown by a progress event too (SSE `progress`, /ws
        # `task_progress`), whatever the executor reports afterwards.
        self._publish(run, ev.PROGRESS, tid, status="in_progress", progress=0.0, attempt=claim["attempt"],
                      message=started, status_changed=True)
        running.job = asyncio.create_task(self._execute(running), name=f"task-{tid}")

    def _record(self, outcome: dict[str, Any]) -> Running | None:
        """Apply an outcome to the in-memory run; None when it must not be published (cancelled)."""
        tid = outcome["id"]
        running = self.running.pop(tid, None)
        if running is None or running.cancelled:
            return None
        run = running.run
        values = outcome["values"]
        self._key_freed(run.rows[tid])
        self.waiting_for.pop(tid, None)
        run.rows[tid].update({k: values[k] for k in ("status", "progress", "result", "error", "completed_at",
                                                     "next_attempt_at") if k in values})
        if values["status"] == "pending":
            run.retry_later(tid)
            heapq.heappush(self._due, (time.monotonic() + outcome["delay"], tid, run.tree_id))
        else:
            run.finished(tid, values["status"])
        self._schedule(run)
        return running

    def _publish_outcome(self, running: Running, outcome: dict[str, Any]) -> None:
        tid, run, values = running.task_id, running.run, outcome["values"]
        self.metrics.attempt_ended(running.executor_id, "retry" if values["status"] == "pending" else values["status"],
                                   time.monotonic() - running.began)
        name = run.rows[tid]["name"]
        if values["status"] == "completed":
            self._publish(run, ev.TASK_COMPLETED, tid, status="completed", progress=1.0, attempt=running.attempt,
                          result=values["result"], message=f"Task '{name}' completed")
        elif values["status"] == "pending":
            self._publish(run, ev.PROGRESS, tid, status="pending", progress=0.0, attempt=running.attempt,
                          error=values["error"], next_attempt_at=values["next_attempt_at"],
                          message=outcome["message"], status_changed=True)
        else:
            self._publish(run, ev.TASK_FAILED, tid, status="failed", progress=values["progress"],
                          attempt=running.attempt, error=values["error"], message=values["error"])

    def _settle(self, run: TreeRun) -> None:
        """After a task ended: queue what became runnable, end the run when nothing is left."""
        self._schedule(run)
        if run.is_over() and not run.done.is_set() and not run.ending:
            run.ending = True
            self._spawn(self._finish_run(run))

    async def _finish_run(self, run: TreeRun) -> None:
        """End the execution in the database, then report the tree's stored state as `final`."""
        async with self._execute_lock:
            if self.runs.get(run.tree_id) is not run or not run.is_over():
                run.ending = False
                return
            try:
                status = await self.repo.run(xs.end_execution, run.execution_id, self.instance_id, run.version,
                                             now_iso(), small=True)
            except Exception:
                log.warning("could not end the execution of tree %s; retrying", run.tree_id, exc_info=True)
                run.ending = False
                await asyncio.sleep(0.5)
                self._settle(run)
                return
            if status is None:  # joined meanwhile, or no longer ours: look at the database again
                run.ending = False
                self._spawn(self.refresh(run.tree_id))
                return
            self._ended(run, status)

    def _ended(self, run: TreeRun, status: str) -> None:
        """The execution ended in the database with `status`: forget the run, report `final`."""
        if self.runs.get(run.tree_id) is run:
            del self.runs[run.tree_id]
        run.done.set()
        progress = 1.0 if status == "completed" else run.progress
        self._publish(run, ev.FINAL, run.tree_id, status=status, progress=progress, final=True,
                      message=f"Execution {status}")

    def _publish(self, run: TreeRun, kind: str, tid: str, **data: Any) -> None:
        row = run.rows.get(tid, {})
        event = {
            "type": kind,
            "task_id": tid,
            "root_task_id": run.tree_id,
            "name": row.get("name"),
            "user_id": row.get("user_id"),
            "tree_progress": run.progress,
            "task_count": run.task_count,
            "timestamp": now_iso(),
            **data,
        }
        self.emit(event)

    def emit(self, event: dict[str, Any]) -> None:
        self.bus.publish(event)
        if self.notifier is not None:
            self.notifier.event(event)

    # --- running one attempt --------------------------------------------------------------

    async def _execute(self, running: Running) -> None:
        row = running.row
        current_task.set((running.task_id, running.run.tree_id))  # this asyncio task's own log context
        policy = stored_policy(row, self.default_retry)
        retryable = True
        try:
            timeout = row.get("timeout_seconds") or self.settings.default_timeout_seconds
            try:
                if timeout is None:  # no timer to arm and disarm for every attempt
                    result = await self._call_executor(running, policy)
                else:
                    async with asyncio.timeout(timeout):
                        result = await self._call_executor(running, policy)
            except TimeoutError:
                await self._stop_hook(running)
                raise ExecutorError(f"Timed out after {timeout:g}s (timeout_seconds)") from None
            result = await storable_async(result, max_depth=self.settings.max_result_depth,
                                          max_bytes=self.settings.max_result_bytes)
            values: dict[str, Any] = {"status": "completed", "progress": 1.0, "result": result, "error": None}
        except asyncio.CancelledError:
            if running.cancelled:
                return
            raise
        except Unstorable as exc:
            retryable = False
            values = self._failure(row, f"The result cannot be stored: {exc}")
        except ExecutorError as exc:
            retryable = exc.retryable
            values = self._failure(row, str(exc))
        except Exception as exc:
            log.exception("executor of task %s raised", running.task_id)
            values = self._failure(row, f"{type(exc).__name__}: {exc}")
        if running.cancelled:
            return
        tokens = _tokens(running.executor)
        ok = values["status"] == "completed"
        stamp = now_iso()
        values.update(updated_at=stamp, lease_owner=None, lease_expires_at=None,
                      token_success=(row.get("token_success") or 0) + (tokens if ok else 0),
                      token_failed=(row.get("token_failed") or 0) + (0 if ok else tokens))
        outcome: dict[str, Any] = {"id": running.task_id, "values": values}
        if not ok and retryable and running.attempt < policy.max_attempts:
            delay = policy.delay(running.attempt)
            values.update(status="pending", next_attempt_at=iso_in(delay), progress=0.0)
            outcome.update(delay=delay, message=(
                f"attempt {running.attempt} of {policy.max_attempts} failed: {values['error']}; "
                f"next attempt at {values['next_attempt_at']}"))
        else:
            values["completed_at"] = stamp
        self._outcomes.append(outcome)
        self._wake.set()

    @staticmethod
    def _failure(row: Mapping[str, Any], error: str) -> dict[str, Any]:
        return {"status": "failed", "progress": row.get("progress") or 0.0, "result": None, "error": _error_text(error)}

    async def _call_executor(self, running: Running, policy: RetryPolicy) -> Any:
        row, run = running.row, running.run
        cls = self.registry.resolve(row)
        if cls is None:
            if not row.get("schemas") and not (row.get("params") or {}).get("executor_id"):
                return None  # a grouping task: nothing to do, it completes at once
            wanted = self.registry.wanted(row)
            raise ExecutorError(
                f"No executor '{wanted}' is available (available: {', '.join(self.registry.ids()) or 'none'})",
                retryable=False,
            )
        inputs = dict(row.get("inputs") or {})
        own_schema = (row.get("schemas") or {}).get("input_schema")
        if own_schema:
            _validate_inputs(inputs, own_schema)
        elif cls.input_schema:
            _validate_inputs(inputs, cls.input_schema, declared_by=cls)
        executor = cls(params=row.get("params") or {})
        running.executor = executor
        dep_results = {
            dep["id"]: run.rows[dep["id"]].get("result")
            for dep in row.get("dependencies") or ()
            if dep["id"] in run.rows and run.rows[dep["id"]]["status"] == "completed"
        }

        async def report(progress: float, message: str | None) -> None:
            if running.cancelled:
                return
            row["progress"] = progress
            self._progress[running.task_id] = progress
            self._publish(run, ev.PROGRESS, running.task_id, status="in_progress", progress=progress,
                          message=message or f"Task '{row['name']}' at {progress:.0%}")
            self._wake.set()

        async def checkpoint(data: Any) -> None:
            await self._store_checkpoint(running, data)

        call = run.calls.get(running.task_id, {})
        context = ExecutionContext(
            task_id=running.task_id,
            task=PublicView(row),
            settings=self.settings,
            dependency_results=dep_results,
            user_id=row.get("user_id"),
            llm_api_key=call.get("llm_api_key"),
            llm_provider=call.get("llm_provider"),
            services=self.services,
            attempt=running.attempt,
            max_attempts=policy.max_attempts,
            interruptions=row.get("interruptions") or 0,
            last_checkpoint=running.checkpoint,
            _progress=report,
            _checkpoint=checkpoint,
        )
        return await executor.execute(inputs, context)

    async def _store_checkpoint(self, running: Running, data: Any) -> None:
        try:
            value = storable(data, max_depth=self.settings.max_result_depth,
                             max_bytes=self.settings.max_checkpoint_bytes, what="checkpoint")
        except Unstorable as exc:
            raise ExecutorError(f"The checkpoint cannot be stored: {exc}", retryable=False) from None
        written = await self.repo.run(xs.fenced_writes, [(running.task_id, running.epoch,
                                                          {"checkpoint": value, "updated_at": now_iso()})],
                                      self.instance_id)
        if not written:
            raise ExecutorError("This attempt no longer holds its task (cancelled, or taken over)")
        running.checkpoint = value

    # --- cancel ---------------------------------------------------------------------------

    async def cancel(self, task_id: str, error_message: str | None = None) -> dict[str, Any]:
        """Cancel a pending or running task. Returns `{status, token_usage, result}`.

        `status` is `cancelled`, or the status that made cancelling impossible. The database
        decides first (compare-and-set), then the work is stopped, so a task that starts while
        the cancel waits for the engine's lock is still found and stopped.
        """
        stamp = now_iso()
        async with self._lock:
            changed = await self.repo.update(
                task_id,
                {"status": "cancelled", "error": error_message or "Cancelled by user", "completed_at": stamp,
                 "updated_at": stamp, "lease_owner": None, "lease_expires_at": None, "next_attempt_at": None},
                only_status=("pending", "in_progress"),
            )
            running = self._detach(task_id) if changed else None
        row = await self.repo.get(task_id)
        if not changed or row is None:
            return {"status": row["status"] if row else "not_found", "token_usage": None, "result": None}
        hook = await self._stop(running)
        if running is not None:
            self.metrics.attempt_ended(running.executor_id, "cancelled", time.monotonic() - running.began)
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
            await self.repo.update(task_id, extra, only_status=("cancelled",))
            row.update(extra)
        if running is None and self.notifier is not None:
            self.notifier.cancel(task_id)  # it may be running on another instance
        self._forget(task_id, row)
        return {"status": "cancelled", "token_usage": token_usage, "result": partial}

    async def cancelled_elsewhere(self, task_id: str) -> None:
        """Another instance cancelled `task_id` in the database: stop our work on it, if any."""
        async with self._lock:
            running = self._detach(task_id)
        if running is None:
            return
        await self._stop(running)
        row = await self.repo.get(task_id)
        if row is not None:
            self._forget(task_id, row)

    def _detach(self, task_id: str) -> Running | None:
        """Take a running task out of the engine's hands: its late outcome is discarded."""
        running = self.running.pop(task_id, None)
        if running is not None:
            running.cancelled = True
        return running

    async def _stop_hook(self, running: Running) -> dict[str, Any]:
        if running.executor is None:
            return {}
        try:
            return await asyncio.wait_for(running.executor.cancel(), CANCEL_HOOK_TIMEOUT) or {}
        except Exception as exc:  # a broken cancel hook must not stop the cancel
            log.warning("cancel hook of task %s failed: %s", running.task_id, exc)
            return {}

    async def _stop(self, running: Running | None) -> dict[str, Any]:
        """Stop detached work: the executor's cancel hook first, then its coroutine."""
        if running is None:
            return {}
        hook = await self._stop_hook(running)
        if running.job is not None:
            running.job.cancel()
        return hook

    def _forget(self, task_id: str, row: Mapping[str, Any]) -> None:
        """A task stopped from outside the engine (cancel) leaves every execution counting on it."""
        for run in list(self.runs.values()):
            if task_id in run.rows:
                run.rows[task_id].update(status=row["status"], error=row["error"])
                if task_id in run.members:
                    run.finished(task_id, row["status"])
                    self._publish(run, ev.TASK_CANCELLED, task_id, status=row["status"],
                                  progress=row["progress"], error=row["error"], message=row["error"])
                self._settle(run)
        self._wake.set()

    def status_changed(self, row: Mapping[str, Any], previous: str | None = None) -> None:
        """A status set through tasks.update: it wins over a running executor's late result, is
        published like any other change, and live executions re-read what may run now."""
        tid, status = row["id"], row["status"]
        if status != "in_progress" and tid in self.running:
            self._spawn(self._stop(self._detach(tid)))
        kind = _KIND_OF_STATUS.get(status, ev.PROGRESS)
        event = {key: row.get(key) for key in ("status", "progress", "result", "error")}
        self.emit({"type": kind, "task_id": tid, "root_task_id": row["task_tree_id"], "name": row["name"],
                   "user_id": row["user_id"], "timestamp": now_iso(), **event,
                   "message": f"Status set to {status}", "status_changed": True})
        self._refresh_runs_with(tid)

    def task_changed(self, row: Mapping[str, Any]) -> None:
        """A task changed through tasks.update (inputs, retry policy, dependencies...): executions
        counting on it re-read it, so its next attempt runs what is stored now."""
        self._refresh_runs_with(row["id"])

    def _refresh_runs_with(self, tid: str) -> None:
        for run in list(self.runs.values()):
            if tid in run.rows:
                self._spawn(self.refresh(run.tree_id))

    def event_elsewhere(self, event: Mapping[str, Any]) -> None:
        """An event from another instance (PostgreSQL): a run here that counts on that task, or
        whose tree another instance joined, reads the database again."""
        if event.get("type") == "refresh":
            if event["root_task_id"] in self.runs:
                self._spawn(self.refresh(event["root_task_id"]))
            return
        tid = event["task_id"]
        for run in list(self.runs.values()):
            if tid in run.rows and tid not in run.active:
                self._spawn(self.refresh(run.tree_id))

    def _spawn(self, coro: Any) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    def live_state(self, task_id: str) -> dict[str, Any] | None:
        """Status and progress of a task taking part in an execution here, else None.

        Synchronous, so a subscriber that starts matching bus events in the same step gets a
        snapshot with no gap before the events that follow.
        """
        running = self.running.get(task_id)
        if running is not None:
            return {"status": "in_progress", "progress": float(running.row.get("progress") or 0.0)}
        for run in self.runs.values():
            if task_id in run.waiting or task_id in run.queued or task_id in run.retrying:
                return {"status": "pending", "progress": 0.0}
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
        return sum(1 for _, _, tid, tree in self._ready if (run := self.runs.get(tree)) and tid in run.queued)

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


class _RemoteRun(TreeRun):
    """The handle of an execution another instance drives (wait() follows it through events)."""

    def __init__(self, tree_id: str) -> None:
        super().__init__(tree_id=tree_id, rows={})
