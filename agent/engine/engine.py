"""The scheduler: claims runnable tasks, runs their executors, writes outcomes, publishes events.

One loop (`_loop`) owns every write of the execution path. Each pass ("tick") writes all
outcomes and progress gathered since the last pass and claims the next runnable tasks, in one
transaction, then publishes the events and starts the claimed executors. Batching this way keeps
a 1000-task tree to a few dozen transactions. Claims and outcomes are compare-and-set
statements, so a task never runs twice and a cancel is never undone by a late result.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import jsonschema

from agent.engine import bus as ev
from agent.engine.bus import EventBus
from agent.engine.notify import PgNotifier, asyncpg_dsn
from agent.engine.run import TreeRun, select_for_execution
from agent.settings import Settings
from executors.base import ExecutionContext, Executor, ExecutorError
from executors.registry import ExecutorRegistry
from storage.repository import TaskRepository
from storage.trees import now_iso, public

log = logging.getLogger(__name__)

LEASE_SECONDS = 60.0
HEARTBEAT_SECONDS = 15.0
CANCEL_HOOK_TIMEOUT = 5.0
RESTART_ERROR = "The service restarted while this task was running; execute it again to retry"


_KIND_OF_STATUS = {"completed": ev.TASK_COMPLETED, "failed": ev.TASK_FAILED, "cancelled": ev.TASK_CANCELLED}


class AlreadyRunning(Exception):
    pass


class NotExecutable(Exception):
    pass


@dataclass
class Running:
    """A task whose executor coroutine runs in this process."""

    task_id: str
    run: TreeRun
    executor: Executor | None = None
    job: asyncio.Task[None] | None = None
    cancelled: bool = False

    @property
    def row(self) -> dict[str, Any]:
        return self.run.rows[self.task_id]


def _lease_until() -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=LEASE_SECONDS)).isoformat(timespec="microseconds")


def _json_safe(value: Any) -> Any:
    """Executors may return anything; the result column stores JSON."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))


def _tokens(executor: Executor | None) -> int:
    usage = getattr(executor, "token_usage", None) or {}
    return int(usage.get("total_tokens") or 0)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """Checking a schema costs far more than using it: compile each distinct schema once."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _validate_inputs(inputs: dict[str, Any], schema: dict[str, Any]) -> None:
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as exc:
        raise ExecutorError(f"schemas.input_schema is not a valid JSON Schema: {exc.message}") from None
    error = jsonschema.exceptions.best_match(validator.iter_errors(inputs))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "inputs"
        raise ExecutorError(f"Input validation failed at '{where}': {error.message}")


class Engine:
    def __init__(
        self,
        repo: TaskRepository,
        registry: ExecutorRegistry,
        settings: Settings,
        bus: EventBus,
        services: Mapping[str, Any] | None = None,
    ) -> None:
        self.repo = repo
        self.registry = registry
        self.settings = settings
        self.bus = bus
        self.services: dict[str, Any] = dict(services or {})
        self.instance_id = uuid.uuid4().hex
        self.runs: dict[str, TreeRun] = {}
        self.running: dict[str, Running] = {}
        self._ready: list[tuple[int, str, str, str]] = []  # (priority, created_at, id, tree_id)
        self._outcomes: list[dict[str, Any]] = []
        self._progress: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # serialises the loop's writes with cancels
        self._execute_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # PostgreSQL only: carries events and cancels to the other instances (engine/notify.py).
        self.notifier: PgNotifier | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.recover()
        if self.repo.engine.dialect.name == "postgresql":
            self.notifier = PgNotifier(asyncpg_dsn(self.settings.database_url), self.instance_id, self.bus,
                                       self.cancelled_elsewhere, self.ended_elsewhere)
            await self.notifier.start()
        self._tasks = [
            asyncio.create_task(self._loop(), name="taskgrove-engine"),
            asyncio.create_task(self._heartbeat(), name="taskgrove-leases"),
        ]

    async def stop(self) -> None:
        """Stop the loop and every running executor (cancel hooks too, so child processes die);
        tasks cut off are marked failed, ready to be executed again."""
        if self.notifier is not None:
            await self.notifier.stop()
        for job in self._tasks:
            job.cancel()
        detached = [self._detach(tid) for tid in list(self.running)]
        await asyncio.gather(*(self._stop(running) for running in detached))
        await self._fail_in_progress([running.task_id for running in detached if running is not None])
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)

    async def recover(self) -> int:
        """Fail tasks left `in_progress` by a dead instance so they can be executed again.

        On SQLite there is one instance by design, so everything in progress is stale at start-up.
        On PostgreSQL only tasks whose lease has expired are, since other instances may be alive.
        """
        stale = await self.repo.stale_in_progress(
            None if self.repo.engine.dialect.name == "sqlite" else now_iso()
        )
        await self._fail_in_progress(stale)
        if stale:
            log.warning("marked %d task(s) left in progress as failed", len(stale))
        return len(stale)

    async def _fail_in_progress(self, ids: list[str]) -> None:
        if ids:
            stamp = now_iso()
            await self.repo.update_many(
                ids,
                {"status": "failed", "error": RESTART_ERROR, "completed_at": stamp, "updated_at": stamp,
                 "lease_owner": None, "lease_expires_at": None},
                only_status=("in_progress",),
            )

    # --- starting executions --------------------------------------------------------------

    async def execute(self, task_id: str, call: Mapping[str, Any] | None = None,
                      fresh_rows: list[dict[str, Any]] | None = None) -> TreeRun:
        """Start (or join) the execution of `task_id`; returns the tree's run right away.

        `fresh_rows`: the rows of a tree just inserted by the caller, to skip reading them back.
        """
        target = next((r for r in fresh_rows if r["id"] == task_id), None) if fresh_rows else None
        target = target or await self.repo.get(task_id)
        if target is None:
            raise KeyError(task_id)
        if target["origin_type"] == "archive":
            raise NotExecutable(f"Task '{task_id}' is an archive (read-only) and cannot be executed")
        if target["status"] == "in_progress":  # here (also caught by _start) or on another instance
            raise AlreadyRunning(task_id)
        tree_id = target["task_tree_id"]
        async with self._execute_lock:  # one start at a time: two must not both create a run
            return await self._start(task_id, tree_id, fresh_rows, dict(call or {}))

    async def _start(self, task_id: str, tree_id: str, fresh_rows: list[dict[str, Any]] | None,
                     call: dict[str, Any]) -> TreeRun:
        run = self.runs.get(tree_id)
        if run is not None and task_id in run.waiting | run.queued | run.active:
            raise AlreadyRunning(task_id)
        rows = {row["id"]: dict(row) for row in fresh_rows or await self.repo.tree(tree_id)}
        outside = {d["id"] for row in rows.values() for d in row["dependencies"]} - set(rows)
        if outside:
            rows.update(await self.repo.get_many(outside))
        run = self.runs.get(tree_id)  # it may have ended meanwhile
        live = (run.waiting | run.queued | run.active) if run is not None else set()
        # A task read as in progress that no longer runs here may have ended while we read.
        stale = [tid for tid, row in rows.items()
                 if row["status"] == "in_progress" and tid not in self.running and tid not in live]
        if stale:
            rows.update(await self.repo.get_many(stale))
            run = self.runs.get(tree_id)
            live = (run.waiting | run.queued | run.active) if run is not None else set()
        if run is not None:  # the live execution knows its tasks better than rows read before
            for tid in (live | set(run.outcome)) & set(rows):
                rows[tid] = run.rows[tid]
        chosen = select_for_execution(rows, task_id) - live
        if run is not None and not chosen:  # everything it needs is already under way
            raise AlreadyRunning(task_id)
        reset = sorted(tid for tid in chosen if rows[tid]["status"] != "pending")
        if reset:
            stamp = now_iso()
            await self.repo.update_many(
                reset,
                {"status": "pending", "progress": 0.0, "result": None, "error": None,
                 "started_at": None, "completed_at": None, "updated_at": stamp},
                only_status=("pending", "failed", "completed", "cancelled"),
            )
        # From here on no await: the run found now is the one the chosen tasks join.
        run = self.runs.get(tree_id)
        if run is None:
            run = self.runs[tree_id] = TreeRun(tree_id=tree_id, rows=rows)
        else:
            chosen -= run.waiting | run.queued | run.active
            run.refresh(rows)
        run.add(chosen)
        run.calls.update(dict.fromkeys(chosen, call))
        self._settle(run)
        self._wake.set()
        return run

    async def wait(self, run: TreeRun, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(run.done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def _schedule(self, run: TreeRun) -> None:
        for tid in run.runnable():
            row = run.rows[tid]
            heapq.heappush(self._ready, (row["priority"], row["created_at"], tid, run.tree_id))

    # --- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            # Let executors that are about to finish do so first: one pass then writes them all.
            await asyncio.sleep(0)
            self._wake.clear()
            try:
                await self._tick()
            except Exception:  # never let one bad pass stop the engine
                log.exception("engine pass failed")
                await asyncio.sleep(0.1)
                self._wake.set()

    def _take_ready(self) -> list[tuple[str, TreeRun]]:
        free = self.settings.max_concurrency - len(self.running)
        taken: list[tuple[str, TreeRun]] = []
        while self._ready and len(taken) < free:
            _, _, tid, tree_id = heapq.heappop(self._ready)
            run = self.runs.get(tree_id)
            if run is not None and tid in run.queued:
                taken.append((tid, run))
        return taken

    async def _tick(self) -> None:
        async with self._lock:
            outcomes, self._outcomes = self._outcomes, []
            progress, self._progress = self._progress, {}
            # Outcomes first, in memory: their dependents can then be claimed in this same pass.
            ended = [(run, o) for o in outcomes if (run := self._record(o)) is not None]
            taken = self._take_ready()
            stamp = now_iso()
            claimed = await self._write(outcomes, progress, [tid for tid, _ in taken], stamp)
        touched = {id(run): run for run, _ in ended}
        for run, outcome in ended:
            self._publish_outcome(run, outcome)
        # Start every claimed task before the next await, so no cancel can slip in between.
        for tid, run in taken:
            touched[id(run)] = run
            if tid in claimed:
                self._start_task(tid, run, stamp)
        for tid, run in taken:
            if tid not in claimed:  # someone else moved it (a cancel, another instance)
                row = await self.repo.get(tid)
                if tid in run.queued:
                    run.finished(tid, row["status"] if row else "cancelled")
        for run in touched.values():
            self._settle(run)
        if self._outcomes or self._progress or (self._ready and len(self.running) < self.settings.max_concurrency):
            self._wake.set()

    async def _write(self, outcomes: list[dict[str, Any]], progress: dict[str, float], claims: list[str],
                     stamp: str) -> set[str]:
        """One transaction for a whole pass; retried, since losing it would strand tasks."""
        if not (outcomes or progress or claims):
            return set()
        progress_rows = [{"id": tid, "progress": p, "updated_at": stamp} for tid, p in progress.items()]
        claim_values = {"status": "in_progress", "progress": 0.0, "started_at": stamp, "completed_at": None,
                        "result": None, "error": None, "updated_at": stamp,
                        "lease_owner": self.instance_id, "lease_expires_at": _lease_until()}
        attempt = 0
        while True:  # giving up would strand the tasks of this pass: wait for the database
            try:
                return await self.repo.write_batch(outcomes, progress_rows, claims, claim_values)
            except Exception:
                attempt += 1
                log.warning("engine write failed (attempt %d), retrying", attempt, exc_info=attempt == 1)
                await asyncio.sleep(min(5.0, 0.05 * 2 ** attempt))

    def _start_task(self, tid: str, run: TreeRun, stamp: str) -> None:
        run.started(tid)
        row = run.rows[tid]
        row.update(started_at=stamp, completed_at=None, progress=0.0, result=None, error=None)
        running = Running(task_id=tid, run=run)
        self.running[tid] = running
        self._publish(run, ev.TASK_START, tid, status="in_progress", progress=0.0,
                      message=f"Task '{row['name']}' started")
        running.job = asyncio.create_task(self._execute(running), name=f"task-{tid}")

    def _record(self, outcome: dict[str, Any]) -> TreeRun | None:
        """Apply an outcome to the in-memory run; None when it must not be published (cancelled)."""
        tid = outcome["id"]
        running = self.running.pop(tid, None)
        if running is None or running.cancelled:
            return None
        run = running.run
        run.rows[tid].update({k: outcome[k] for k in ("status", "progress", "result", "error", "completed_at")})
        run.finished(tid, outcome["status"])
        self._schedule(run)
        return run

    def _publish_outcome(self, run: TreeRun, outcome: dict[str, Any]) -> None:
        tid = outcome["id"]
        if outcome["status"] == "completed":
            self._publish(run, ev.TASK_COMPLETED, tid, status="completed", progress=1.0,
                          result=outcome["result"], message=f"Task '{run.rows[tid]['name']}' completed")
        else:
            self._publish(run, ev.TASK_FAILED, tid, status="failed", progress=outcome["progress"],
                          error=outcome["error"], message=outcome["error"])

    def _settle(self, run: TreeRun) -> None:
        """After a task ended: queue what became runnable, end the run when nothing is left."""
        self._schedule(run)
        if run.is_over() and not run.done.is_set():
            self._finish_run(run)

    def _finish_run(self, run: TreeRun) -> None:
        status = run.finish()
        if self.runs.get(run.tree_id) is run:
            del self.runs[run.tree_id]
        self._publish(run, ev.FINAL, run.tree_id, status=status, progress=1.0 if status == "completed" else run.progress,
                      final=True, message=f"Execution {status}")

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
        self._emit(event)

    def _emit(self, event: dict[str, Any]) -> None:
        self.bus.publish(event)
        if self.notifier is not None:
            self.notifier.event(event)

    # --- running one task -----------------------------------------------------------------

    async def _execute(self, running: Running) -> None:
        row = running.row
        try:
            result = await self._call_executor(running)
            outcome = {"status": "completed", "progress": 1.0, "result": _json_safe(result), "error": None}
        except asyncio.CancelledError:
            if running.cancelled:
                return
            raise
        except ExecutorError as exc:
            outcome = {"status": "failed", "progress": row.get("progress") or 0.0, "result": None, "error": str(exc)}
        except Exception as exc:
            log.exception("executor of task %s raised", running.task_id)
            outcome = {"status": "failed", "progress": row.get("progress") or 0.0, "result": None,
                       "error": f"{type(exc).__name__}: {exc}"}
        if running.cancelled:
            return
        tokens = _tokens(running.executor)
        ok = outcome["status"] == "completed"
        stamp = now_iso()
        self._outcomes.append({
            "id": running.task_id, **outcome, "completed_at": stamp, "updated_at": stamp,
            "token_success": (row.get("token_success") or 0) + (tokens if ok else 0),
            "token_failed": (row.get("token_failed") or 0) + (0 if ok else tokens),
            "lease_owner": None, "lease_expires_at": None,
        })
        self._wake.set()

    async def _call_executor(self, running: Running) -> Any:
        row, run = running.row, running.run
        cls = self.registry.resolve(row)
        if cls is None:
            if not row.get("schemas") and not (row.get("params") or {}).get("executor_id"):
                return None  # a grouping task: nothing to do, it completes at once
            wanted = self.registry.wanted(row)
            raise ExecutorError(
                f"No executor '{wanted}' is available (available: {', '.join(self.registry.ids()) or 'none'})"
            )
        inputs = dict(row.get("inputs") or {})
        schema = (row.get("schemas") or {}).get("input_schema") or cls.input_schema
        if schema:
            _validate_inputs(inputs, schema)
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

        call = run.calls.get(running.task_id, {})
        context = ExecutionContext(
            task_id=running.task_id,
            task=public(row),
            settings=self.settings,
            dependency_results=dep_results,
            user_id=row.get("user_id"),
            llm_api_key=call.get("llm_api_key"),
            llm_provider=call.get("llm_provider"),
            services=self.services,
            _progress=report,
        )
        return await executor.execute(inputs, context)

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
                 "updated_at": stamp, "lease_owner": None, "lease_expires_at": None},
                only_status=("pending", "in_progress"),
            )
            running = self._detach(task_id) if changed else None
        row = await self.repo.get(task_id)
        if not changed or row is None:
            return {"status": row["status"] if row else "not_found", "token_usage": None, "result": None}
        hook = await self._stop(running)
        token_usage = hook.get("token_usage") or (
            getattr(running.executor, "token_usage", None) if running is not None else None)
        partial = hook.get("result")
        extra: dict[str, Any] = {}
        if partial is not None:
            extra["result"] = _json_safe(partial)
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

    async def _stop(self, running: Running | None) -> dict[str, Any]:
        """Stop detached work: the executor's cancel hook first, then its coroutine."""
        hook: dict[str, Any] = {}
        if running is None:
            return hook
        if running.executor is not None:
            try:
                hook = await asyncio.wait_for(running.executor.cancel(), CANCEL_HOOK_TIMEOUT) or {}
            except Exception as exc:  # a broken cancel hook must not stop the cancel
                log.warning("cancel hook of task %s failed: %s", running.task_id, exc)
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

    def status_changed(self, row: Mapping[str, Any]) -> None:
        """A status set through tasks.update: it wins over a running executor's late result, is
        published like any other change, and live executions re-evaluate what may run now."""
        tid, status = row["id"], row["status"]
        if status != "in_progress" and tid in self.running:
            self._spawn(self._stop(self._detach(tid)))
        kind = _KIND_OF_STATUS.get(status, ev.PROGRESS)
        event = {key: row.get(key) for key in ("status", "progress", "result", "error")}
        published = False
        for run in list(self.runs.values()):
            if tid not in run.rows:
                continue
            run.changed_outside(tid, status, row.get("result"))
            if tid in run.active and status != "in_progress":
                run.finished(tid, status)
            if not published:
                self._publish(run, kind, tid, **event, message=f"Status set to {status}")
                published = True
            if status == "completed":
                run.unblock()
            self._settle(run)
        if not published:
            self._emit({"type": kind, "task_id": tid, "root_task_id": row["task_tree_id"],
                        "name": row["name"], "user_id": row["user_id"], "timestamp": now_iso(),
                        **event, "message": f"Status set to {status}"})
        self._wake.set()

    def ended_elsewhere(self, event: Mapping[str, Any]) -> None:
        """A task ended on another instance (PostgreSQL): executions here waiting on it go on."""
        tid = event["task_id"]
        if event["type"] in (ev.TASK_COMPLETED, ev.TASK_FAILED, ev.TASK_CANCELLED) and any(
                tid in run.rows and tid not in run.waiting | run.queued | run.active for run in self.runs.values()):
            self._spawn(self._reload(tid))

    async def _reload(self, tid: str) -> None:
        row = await self.repo.get(tid)  # events may leave large results out; the row has them
        if row is None:
            return
        for run in list(self.runs.values()):
            if tid in run.rows and tid not in run.waiting | run.queued | run.active:
                run.changed_outside(tid, row["status"], row["result"])
                self._settle(run)
        self._wake.set()

    def dependencies_changed(self, row: Mapping[str, Any]) -> None:
        """New dependencies of a pending task (tasks.update) apply to a live execution at once."""
        for run in list(self.runs.values()):
            if row["id"] in run.rows:
                run.set_dependencies(row["id"], row["dependencies"])
                self._settle(run)
        self._wake.set()

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
            if task_id in run.waiting or task_id in run.queued:
                return {"status": "pending", "progress": 0.0}
        return None

    # --- leases ---------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                if self.running:
                    await self.repo.update_many(
                        list(self.running), {"lease_expires_at": _lease_until()}, only_status=("in_progress",)
                    )
                if self.repo.engine.dialect.name != "sqlite":
                    await self.recover()
            except Exception:
                log.exception("lease heartbeat failed")

    # --- monitoring -----------------------------------------------------------------------

    def running_rows(self) -> list[dict[str, Any]]:
        rows = [r.row for r in self.running.values()]
        return sorted(rows, key=lambda r: (r.get("started_at") or "", r["id"]), reverse=True)
