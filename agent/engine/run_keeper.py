"""Runs: the executions this instance drives, in memory, and how they are opened, rebuilt and ended.

The database is the truth (storage/executions.py): an execution request is a row that any
instance can continue. The in-memory `TreeRun`s (engine/tree_run.py) are an index of it, rebuilt from
the database whenever it may be stale (a join, a takeover, a write that was refused). Opening,
joining, rebuilding and ending happen one at a time (`RunKeeper.lock`), so two starts never both
create a run. The lease keeper (engine/leases.py) uses the public methods here: `drop`,
`refresh_later`, `take_over`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from taskgrove.agent.foundations import tracing
from taskgrove.agent.engine.live_attempts import Attempts
from taskgrove.agent.engine import insert_inline
from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import FINAL, TASK_CANCELLED
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.tree_run import TreeRun, select_for_execution
from taskgrove.agent.engine.waits import Waits
from taskgrove.storage import executions, tree_insert
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.connections import is_transient
from taskgrove.storage.outage import recognise
from taskgrove.storage.repository import SMALL_PASS, TaskRepository
from taskgrove.storage.status import FINISHED_STATUSES, TaskStatus
from taskgrove.storage.clock import now_iso, seconds_until

log = logging.getLogger(__name__)

# `TaskRepository.transact(..., inline=...)`: a transaction of a few rows, which may run on the event
# loop's thread. The keyword is storage's; these say which value means what here.
# The four `repo.transact` calls left here (opening or joining a run, its re-read, its end) are
# documented exceptions to issue 44's named operations: they are the hot path of every execution,
# and an ExecutionStore method would add a call layer there that bench/ab.py has not measured.
MAY_USE_LOOP_THREAD = True
# A refresh the database could not answer tries again after this long, doubling up to the max.
REFRESH_RETRY_SECONDS = 0.2
REFRESH_RETRY_MAX_SECONDS = 5.0


def may_use_loop_thread(rows: int) -> bool:
    """Whether a transaction touching `rows` tasks may run on the event loop's thread."""
    return rows <= SMALL_PASS


class AlreadyRunning(Exception):
    pass


class NotExecutable(Exception):
    pass


class PassHooks(insert_inline.InlineHooks, Protocol):
    """What the run keeper needs of the pass loop (engine/passes.py, which imports this module)."""

    lock: asyncio.Lock
    unwritten: set[str]  # tasks whose outcome waits in memory for the database (leases.py renews them)

    def retry_at(self, tid: str, tree_id: str, delay: float) -> None: ...

    def settle(self, run: TreeRun) -> None: ...

    def reserve_for_insert(self, rows: list[dict[str, Any]]) -> list[str]: ...

    def release(self, ids: list[str]) -> None: ...


class RemoteRun(TreeRun):
    """The handle of an execution another instance drives (wait() follows it through events)."""

    def __init__(self, tree_id: str) -> None:
        super().__init__(tree_id=tree_id, rows={})


class RunKeeper:
    def __init__(self, repo: TaskRepository, instance_id: str, lease_until: Callable[[], str], attempts: Attempts,
                 publisher: Publisher, background: Background, wake: asyncio.Event) -> None:
        self.repo = repo
        self.executions = ExecutionStore(repo)
        self.instance_id = instance_id
        self.lease_until = lease_until
        self.attempts = attempts
        self.publisher = publisher
        self.background = background
        self.wake = wake
        self.runs: dict[str, TreeRun] = {}  # tree id -> the run of its execution this instance drives
        self.lock = asyncio.Lock()  # executions open, join, rebuild and end one at a time
        self.passes: PassHooks  # set by the Engine once the pass loop exists
        self.waits: Waits  # set by the Engine once the waits exist (they need these runs)

    # --- opening --------------------------------------------------------------------------

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
        if target["status"] == TaskStatus.IN_PROGRESS:  # here or on another instance
            raise AlreadyRunning(task_id)
        async with self.lock:  # one start at a time: two must not both create a run
            return await self._open_or_join(task_id, target["task_tree_id"], fresh_rows, dict(call or {}), webhook)

    async def _open_or_join(self, task_id: str, tree_id: str, fresh_rows: list[dict[str, Any]] | None,
                            call: dict[str, Any], webhook: Mapping[str, Any] | None) -> TreeRun:
        rows = {row["id"]: dict(row) for row in fresh_rows or await self.repo.tree(tree_id)}
        execution = await self.repo.transact(executions.running_execution, tree_id, inline=MAY_USE_LOOP_THREAD)
        if execution is not None and self._orphaned(execution):  # ours, no run here: run it first
            await self.rebuild(execution, adopt=True)
        live_ids = self._live_ids(rows, execution)
        if task_id in live_ids:
            raise AlreadyRunning(task_id)
        chosen = select_for_execution(rows, task_id) - live_ids - {
            tid for tid, row in rows.items() if row["status"] == TaskStatus.IN_PROGRESS}
        if execution is not None and not chosen:  # everything it needs is already under way
            raise AlreadyRunning(task_id)
        stamp = now_iso()
        execution, joined = await self.repo.transact(self._open, tree_id, task_id, call, webhook,
                                                {tid: rows[tid]["status"] for tid in chosen}, stamp,
                                                inline=may_use_loop_thread(len(chosen)))
        if chosen and not joined and self.runs.get(tree_id) is not None:
            raise AlreadyRunning(task_id)  # all it asked for moved on meanwhile (started, or just ended)
        if execution["owner"] != self.instance_id:
            # Another live instance drives this tree: it runs what we just marked.
            if self.publisher.notifier is not None:
                self.publisher.notifier.refresh(tree_id)
            return RemoteRun(tree_id)
        return await self.rebuild(execution, calls=dict.fromkeys(chosen, call))

    def _live_ids(self, rows: Mapping[str, Mapping[str, Any]], execution: Mapping[str, Any] | None) -> set[str]:
        """Tasks a running execution of the tree will still run (pending members, waiting retries)."""
        if execution is None:
            return set()
        run = self.runs.get(execution["task_tree_id"])
        if run is not None and run.execution_id == execution["id"]:
            return run.live
        return {tid for tid, row in rows.items()
                if row.get("execution_id") == execution["id"] and row["status"] == TaskStatus.PENDING}

    def _open(self, c: Any, tree_id: str, task_id: str, call: Mapping[str, Any], webhook: Mapping[str, Any] | None,
              chosen: Mapping[str, str], stamp: str) -> tuple[dict[str, Any], int]:
        """One transaction: open or join the tree's execution and make the chosen tasks its members."""
        execution = executions.open_execution(c, tree_id, task_id, call.get("user_id"), self.instance_id,
                                              self.lease_until(), stamp, webhook,
                                              tracing.stored_traceparent(call.get("traceparent")))
        joined = 0
        if chosen:
            joined = executions.join(c, execution["id"], chosen, stamp)
            execution["updated_at"] = stamp
        return execution, joined

    async def create_and_execute(self, rows: list[dict[str, Any]], call: Mapping[str, Any],
                                 quota: tree_insert.Quota | None = None) -> TreeRun:
        """Store a new tree and its execution in one transaction, then run it; the tasks it may
        start at once are claimed in that transaction too (PassLoop.reserve_for_insert).

        A create cut off by a crash therefore leaves either nothing or a tree whose execution the
        next instance continues. Raises IntegrityError when an id is taken, OverQuota when the
        owner's `quota` has no room (nothing stored either way). A tree whose every task is pure
        is stored completed instead, its execution ended (engine/insert_inline.py): the run
        returned is then an insert_inline.CompletedRun, with the rows as stored.
        """
        stamp = now_iso()
        pure = insert_inline.decide(self.passes, self.attempts, rows, stamp)
        if pure is not None:
            return await self._insert_completed(pure, rows, call, quota)
        # Its first runnable tasks are claimed with the insert when a slot is free for them anyway.
        claims = self.passes.reserve_for_insert(rows)
        try:
            # A new tree cannot be any run's yet: the insert needs no lock, so creates run side by side.
            execution = await self.repo.insert_tree(rows, call.get("user_id"), self.instance_id, self.lease_until(),
                                                    stamp, quota, tracing.stored_traceparent(call.get("traceparent")),
                                                    set(claims), inline=may_use_loop_thread(len(rows)))
            return await self.run_inserted(execution, rows, call)
        finally:
            self.passes.release(claims)  # started by now (rebuild), or never stored

    async def _insert_completed(self, pure: insert_inline.PureTree, rows: list[dict[str, Any]],
                                call: Mapping[str, Any], quota: tree_insert.Quota | None) -> TreeRun:
        """create_and_execute of a tree stored completed (at the stamp its outcomes were decided
        at): once its insert committed, its attempts and its run end in memory as the passes'
        would (nothing is published before the commit)."""
        execution = await self.repo.insert_tree(rows, call.get("user_id"), self.instance_id, self.lease_until(),
                                                pure.stamp, quota, tracing.stored_traceparent(call.get("traceparent")),
                                                (), inline=may_use_loop_thread(len(rows)),
                                                done=insert_inline.done(pure))
        run = insert_inline.completed(self.passes, pure, execution, call)
        self.ended(run, execution["final_status"])
        return run

    async def run_inserted(self, execution: Mapping[str, Any], rows: list[dict[str, Any]],
                           call: Mapping[str, Any]) -> TreeRun:
        """Run a tree its caller inserted together with its execution (tree_insert.insert_tree),
        owned by this instance: a create, a schedule's run."""
        calls = dict.fromkeys((r["id"] for r in rows), dict(call))
        async with self.lock:
            if rows[0]["task_tree_id"] in self.runs:  # someone executed it already: read what is stored
                return await self.rebuild(execution, calls=calls)
            fresh = [{**row, "execution_id": execution["id"]} if row["status"] == TaskStatus.PENDING else row
                     for row in rows]
            return await self.rebuild(execution, calls=calls, fresh_rows=fresh)

    # --- rebuilding from the database -----------------------------------------------------

    async def rebuild(self, execution: Mapping[str, Any], *, calls: Mapping[str, Mapping[str, Any]] | None = None,
                      fresh_rows: list[dict[str, Any]] | None = None, adopt: bool = False) -> TreeRun:
        """The run of `execution` as the database has it now (caller holds `lock`).

        Used to start, join, take over and resynchronise alike. Attempts running in this process
        under a token the database still honours stay active; every other in-progress member
        is someone else's (about to be settled by the lease keeper) and is waited for.
        `adopt`: an execution of ours that had no run here (see `_orphaned`): the tasks claimed
        with its insert and never started are started now, with the tokens the insert stored.
        """
        async with self.passes.lock:  # no pass may claim or settle an attempt between our read and our view
            return await self._read_run(execution, calls, fresh_rows, execution.get("claimed") or {}, adopt)

    async def _read_run(self, execution: Mapping[str, Any], calls: Mapping[str, Mapping[str, Any]] | None,
                        fresh_rows: list[dict[str, Any]] | None, claimed: Mapping[str, Mapping[str, Any]],
                        adopt: bool = False) -> TreeRun:
        """`claimed`: tokens of the tasks claimed with the tree's insert (tree_insert.insert_tree),
        started here (`fresh_rows` still show them pending, as a pass's claim finds them)."""
        tree_id = execution["task_tree_id"]
        rows = {row["id"]: dict(row) for row in fresh_rows or await self.repo.tree(tree_id)}
        if adopt and not claimed:
            claimed = self._never_started(execution, rows)
        outside = {d["id"] for row in rows.values() for d in row["dependencies"]} - set(rows)
        if outside:
            rows.update(await self.repo.get_many(outside))
        old = self.runs.get(tree_id)
        run = TreeRun(tree_id=tree_id, rows=rows, execution_id=execution["id"], version=execution["updated_at"],
                      traceparent=execution.get("traceparent"), began=execution["created_at"])
        if old is not None:
            run.calls.update(old.calls)
            run.done = old.done
            run.resting = old.resting
            run.resting.clear()  # set again below if the database says so
        run.calls.update(calls or {})
        waiting: list[str] = []
        parked: list[str] = []
        running_here = self.attempts.running
        for tid, row in rows.items():
            if row.get("execution_id") != execution["id"]:
                continue
            status = row["status"]
            if status == TaskStatus.PENDING:
                delay = seconds_until(row.get("next_attempt_at"))
                if delay > 0:
                    run.retrying.add(tid)
                    self.passes.retry_at(tid, tree_id, delay)
                else:
                    waiting.append(tid)
            elif status == TaskStatus.IN_PROGRESS and row.get("waiting") is not None:
                run.parked.add(tid)  # on a durable wait: no attempt anywhere (engine/waits.py)
                parked.append(tid)
            elif status == TaskStatus.IN_PROGRESS:
                running = running_here.get(tid)
                if running is not None and row.get("lease_owner") == self.instance_id \
                        and row.get("lease_epoch") == running.epoch:
                    run.active.add(tid)
                    running.run = run
                elif tid in claimed and running is None and row.get("lease_owner") == self.instance_id \
                        and row.get("lease_epoch") == claimed[tid]["lease_epoch"]:
                    waiting.append(tid)  # claimed with its insert, read back before it started
                else:
                    run.foreign.add(tid)
            else:
                run.outcome[tid] = status
        # Attempts of ours the database no longer honours (a cancel, a takeover) stop here. One
        # not finished there was settled as interrupted by another instance, which reports it.
        for tid, running in list(running_here.items()):
            if running.run.tree_id == tree_id and tid not in run.active:
                self.attempts.stop_later(tid, settled=rows.get(tid, {}).get("status") not in FINISHED_STATUSES)
        run.add(waiting)
        self.runs[tree_id] = run
        if claimed:  # before anything can queue them: started as a pass starts what it claimed
            for tid in run.take(claimed):
                self.attempts.start(tid, run, execution["created_at"], claimed[tid])
        for tid in parked:
            self.waits.watch(tid, run)
        self.passes.settle(run)
        self.wake.set()
        return run

    def _never_started(self, execution: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The tokens of tasks claimed for this instance with the tree's insert (in progress since
        the execution's creation, first attempt, leased to us) whose attempt never started here:
        the insert committed but its answer was lost, so nobody started them."""
        running, unwritten = self.attempts.running, self.passes.unwritten
        return {tid: tree_insert.token_of(row) for tid, row in rows.items()
                if row["status"] == TaskStatus.IN_PROGRESS and row.get("waiting") is None
                and row.get("execution_id") == execution["id"] and row.get("lease_owner") == self.instance_id
                and row.get("started_at") == execution["created_at"] and row.get("attempt") == 1
                and tid not in running and tid not in unwritten}

    def _orphaned(self, execution: Mapping[str, Any]) -> bool:
        """Whether `execution` is running, ours, and has no run here (sure only under `lock`).

        Every way of making an execution ours builds its run under `lock` right after its write,
        except one: a tree's insert (create_and_execute) whose commit's answer was lost (the
        database went away at COMMIT). The create then failed, the tree and its execution are
        stored, leased to this instance, and nobody would run them: whoever finds one adopts it."""
        return execution["status"] == "running" and execution["owner"] == self.instance_id \
            and execution["task_tree_id"] not in self.runs

    async def take_over(self, execution: Mapping[str, Any]) -> None:
        """Drive an execution this instance just took over (or recovered at start, or found as
        its own with no run: `_orphaned`) from the database."""
        async with self.lock:
            await self.rebuild(execution, adopt=True)

    async def refresh(self, tree_id: str) -> None:
        """Re-read a run of ours from the database (a join by another instance, a change by hand,
        a pass whose writes or claims the database did not take). Retried while the database is
        unreachable: a refresh that is given up leaves tasks of the run that nobody queues again."""
        delay = REFRESH_RETRY_SECONDS
        while True:
            try:
                return await self._refresh_once(tree_id)
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("re-reading the run of tree %s failed", tree_id)
                    return
                if recognise(exc) is None:  # an outage is logged once by storage/outage.py
                    log.warning("re-reading the run of tree %s failed (%s); again in %.1f s", tree_id,
                                type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REFRESH_RETRY_MAX_SECONDS)

    async def _refresh_once(self, tree_id: str) -> None:
        async with self.lock:
            run = self.runs.get(tree_id)
            if run is None:
                return
            execution = await self.repo.transact(executions.get_execution, run.execution_id)
            if execution is None or execution["status"] != "running" or execution["owner"] != self.instance_id:
                self.drop(run, "its execution is no longer ours")
                return
            await self.rebuild(execution)

    def refresh_later(self, tree_id: str) -> None:
        self.background.spawn(self.refresh(tree_id))

    def refresh_runs_with(self, tid: str) -> None:
        """Every run counting on task `tid` re-reads the database."""
        for run in list(self.runs.values()):
            if tid in run.rows:
                self.refresh_later(run.tree_id)

    def drop(self, run: TreeRun, why: str) -> None:
        """Forget a run whose execution another instance now drives: schedule nothing from it."""
        log.warning("dropping the run of tree %s: %s", run.tree_id, why)
        if self.runs.get(run.tree_id) is run:
            del self.runs[run.tree_id]
        for tid, running in list(self.attempts.running.items()):
            if running.run is run:  # its new owner settles them as interrupted
                self.attempts.stop_later(tid, settled=True)
        run.done.set()
        run.resting.set()

    def forget(self, task_id: str, row: Mapping[str, Any]) -> None:
        """A task stopped from outside the engine (cancel) leaves every execution counting on it."""
        for run in list(self.runs.values()):
            if task_id in run.rows:
                run.rows[task_id].update(status=row["status"], error=row["error"])
                if task_id in run.members:
                    run.finished(task_id, row["status"])
                    self.publisher.publish(run, TASK_CANCELLED, task_id, status=row["status"],
                                           progress=row["progress"], error=row["error"], message=row["error"])
                self.passes.settle(run)
        self.wake.set()

    # --- ending ---------------------------------------------------------------------------

    async def finish(self, run: TreeRun) -> None:
        """End the execution in the database outside a pass, then report the tree's stored state
        as `final` (a run whose last task ended with no pass to carry its end)."""
        async with self.lock:
            if self.runs.get(run.tree_id) is not run or not run.is_over():
                run.ending = False
                return
            try:
                status = await self.repo.transact(executions.end_execution, run.execution_id, self.instance_id,
                                             run.version, now_iso(), inline=MAY_USE_LOOP_THREAD)
            except Exception:
                log.warning("could not end the execution of tree %s; retrying", run.tree_id, exc_info=True)
                run.ending = False
                await asyncio.sleep(0.5)
                self.passes.settle(run)
                return
            if status is None:  # joined, a member may still run, or not ours: read the database again
                run.ending = False
                self.refresh_later(run.tree_id)
                return
            self.ended(run, status)

    def ended(self, run: TreeRun, status: str) -> None:
        """The execution ended in the database with `status`: forget the run, report `final`."""
        if self.runs.get(run.tree_id) is run:
            del self.runs[run.tree_id]
        run.done.set()
        run.resting.set()
        if tracing.ENABLED:
            tracing.end_execution(run.execution_id, run.traceparent, run.tree_id, run.began, status)
        progress = 1.0 if status == TaskStatus.COMPLETED else run.progress
        self.publisher.publish(run, FINAL, run.tree_id, status=status, progress=progress, final=True,
                               message=f"Execution {status}")

    # --- following ------------------------------------------------------------------------

    async def following(self, tree_id: str) -> TreeRun | None:
        """A handle to wait on the tree's running execution, here or on another instance; None
        when no execution of it is running."""
        run = self.runs.get(tree_id)
        if run is not None:
            return run
        execution = await self.executions.running(tree_id)
        if execution is None:
            return None
        if self._orphaned(execution):  # e.g. a resent create whose first insert lost its answer
            async with self.lock:
                execution = await self.executions.running(tree_id)  # as it is now that no one else opens it
                if execution is not None and self._orphaned(execution):
                    log.warning("running the execution of tree %s: stored for this instance, but its "
                                "opening met a database outage and nothing here ran it", tree_id)
                    return await self.rebuild(execution, adopt=True)
                if execution is None:
                    return None
            run = self.runs.get(tree_id)
            if run is not None:
                return run
        return RemoteRun(tree_id)

    async def wait(self, run: TreeRun, timeout: float | None, until_waiting: bool = False) -> bool:
        """Whether the execution of `run` ended within `timeout` seconds; `until_waiting`: or
        came to rest on waits (engine/waits.py: parked tasks, nothing else able to move)."""
        if isinstance(run, RemoteRun):
            return await self._wait_remote(run, timeout)
        try:
            await asyncio.wait_for(asyncio.shield((run.resting if until_waiting else run.done).wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _wait_remote(self, run: RemoteRun, timeout: float | None) -> bool:
        """Wait for an execution another instance drives: its `final` event, or its stored end."""
        sub = self.publisher.bus.subscribe(lambda e: e["type"] == FINAL and e["root_task_id"] == run.tree_id,
                                           maxsize=4)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if await self.executions.running(run.tree_id) is None:
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
