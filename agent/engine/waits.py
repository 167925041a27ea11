"""Durable waits: a task that waits for input, an event or a time holds no slot and no memory.

An executor waits through its `ExecutionContext` (executors/base.py: `wait_for_input`,
`wait_for_event`, `sleep`), which raises `Waiting` unless the attempt already holds that wait's
answer. The attempt then ends as *parked* (engine/live_attempts.py builds the outcome, the pass loop
writes it, fenced like every outcome): the task stays `in_progress` with its `waiting` set and no
lease, its run keeps it in `TreeRun.parked`, its dependents wait with it. Ending a wait is one
compare-and-set (storage/wait_store.py): the answer (tasks.respond), the event (events.emit, or the look
into stored events right after parking), or the deadline (the pass loop's timers, `wake_at`)
makes the task `pending` again and the same attempt runs again from the start, its earlier
waits answered from `wait_answers`. The database holds all of it, so any instance resumes it.

`Waits` is the engine's part for this; services call it as `engine.waits` (`answer`, `emit`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import PROGRESS, TASK_FAILED
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.schemas import compiled_schema
from taskgrove.agent.engine.tree_run import TreeRun
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.storage import wait_store as stored
from taskgrove.storage.wait_store import WaitStore
from taskgrove.storage.wait_store import public_wait, read
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import TaskStatus
from taskgrove.storage.clock import iso_in, now_iso, seconds_until

log = logging.getLogger(__name__)

KINDS = ("input", "event", "timer", "agent_input")  # agent_input: a remote agent's question (docs/agents.md)
__all__ = ["AlreadyAnswered", "NotWaiting", "Waits", "public_wait", "read"]


class NotWaiting(Exception):
    """The task waits for nothing (or not for what was asked)."""


class AlreadyAnswered(Exception):
    """Another answer (or a timeout, or a cancel) ended the wait first."""


def stamped(wait: Mapping[str, Any], since: str) -> dict[str, Any]:
    """The wait as stored: when it began and, with a timeout, its deadline."""
    timeout = wait.get("timeout")
    return {**wait, "since": since, "deadline": None if timeout is None else iso_in(timeout)}


def matches(wait: Mapping[str, Any], payload: Any) -> bool:
    """Whether an event's payload has every key of the wait's `match` with the same value."""
    return stored.meets(wait.get("match"), payload)


def _compiled(schema: Mapping[str, Any]) -> Any:
    """The validator of a wait's schema; raises ValueError naming what is wrong with the schema."""
    import jsonschema  # loaded at the first check, as for executors' input schemas

    try:
        return compiled_schema(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as exc:
        raise ValueError(f"the wait's schema is not a valid JSON Schema: {exc.message}") from None


def bad_schema(schema: Mapping[str, Any] | None) -> str | None:
    """Why a wait's schema cannot check answers (checked when the task parks), None if it can."""
    if not schema:
        return None
    try:
        _compiled(schema)
    except ValueError as exc:
        return str(exc)
    return None


def schema_problem(schema: Mapping[str, Any] | None, value: Any) -> str | None:
    """Why `value` does not fit `schema` (a JSON Schema), None when it does."""
    if not schema:
        return None
    import jsonschema

    try:
        validator = _compiled(schema)
    except ValueError as exc:
        return str(exc)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "value"
    return f"value does not match the schema at '{where}': {error.message}"


def timeout_error(wait: Mapping[str, Any]) -> str:
    what = f"event '{wait.get('event')}'" if wait.get("kind") == "event" else "answer"
    return f"No {what} within {wait.get('timeout') or 0:g} s (timeout_seconds); the wait has no default"


class WaitRuns(Protocol):
    """What waits need of the run keeper (engine/run_keeper.py `RunKeeper`, which imports this
    module through the attempts: a Protocol keeps the import one way)."""

    @property
    def runs(self) -> Mapping[str, TreeRun]: ...

    @property
    def lock(self) -> asyncio.Lock: ...

    def refresh_later(self, tree_id: str) -> None: ...


class WaitPasses(Protocol):
    """What waits need of the pass loop (engine/passes.py `PassLoop`, which imports this module)."""

    @property
    def wake(self) -> asyncio.Event: ...

    def settle(self, run: TreeRun) -> None: ...

    def wake_at(self, tid: str, tree_id: str, at: str) -> None: ...


class Waits:
    """Answers, timeouts and events for parked tasks; resumes them on the instance that drives
    their tree (or tells that instance, or leaves them to the takeover when nobody does)."""

    def __init__(self, repo: TaskRepository, metrics: Metrics, publisher: Publisher, background: Background,
                 run_keeper: WaitRuns, passes: WaitPasses) -> None:
        self.repo = repo
        self.store = WaitStore(repo)
        self.metrics = metrics
        self.publisher = publisher
        self.background = background
        self.run_keeper = run_keeper
        self.passes = passes
        # Per parked event wait, the epoch its stored events were looked at under: a rebuild
        # (one per answer that reached another instance) must not look again for every wait.
        self._looked: dict[str, int] = {}

    # --- a task parks ---------------------------------------------------------------------

    def watch(self, tid: str, run: TreeRun) -> None:
        """A task of `run` is parked (just now, or found so by a rebuild): arm its deadline, and
        for an event look once into the stored events (one may have come while it parked)."""
        row = run.rows[tid]
        if row.get("wake_at"):
            self.passes.wake_at(tid, run.tree_id, row["wake_at"])
        epoch = row.get("lease_epoch") or 0
        if self._looked.get(tid) == epoch:
            return
        wait = read(row.get("waiting"))
        if isinstance(wait, dict) and wait.get("kind") == "event":
            self._looked[tid] = epoch
            self.background.spawn(self._look_for_event(tid, row.get("user_id"), epoch, wait))

    async def _look_for_event(self, tid: str, user_id: str | None, epoch: int, wait: Mapping[str, Any]) -> None:
        try:
            found = await self.store.events_since(user_id, wait["event"], wait["since"])
            for event in found:
                if matches(wait, event["payload"]):
                    row = await self.repo.get(tid)
                    if row is not None and row.get("lease_epoch") == epoch:
                        await self.answer(row, event["payload"])
                    return
        except (NotWaiting, AlreadyAnswered):
            return
        except Exception:
            log.warning("could not look for stored events for task %s", tid, exc_info=True)

    # --- answering ------------------------------------------------------------------------

    async def answer(self, row: Mapping[str, Any], value: Any) -> dict[str, Any]:
        """End the wait `row` (as read) holds with `value`, then resume the task. Raises
        NotWaiting, AlreadyAnswered. Returns the values stored."""
        wait = read(row.get("waiting"))
        if not isinstance(wait, dict):
            raise NotWaiting(row["id"])
        answers = read(row.get("wait_answers")) or []
        answers = [*answers[: wait.get("index", len(answers))], value]
        try:
            values = await self.store.answer(row["id"], row.get("lease_epoch") or 0, json.dumps(answers), now_iso())
        except Exception:  # perhaps stored, its commit's answer lost (an outage): its driver reads it again
            self._read_again(row["task_tree_id"])
            raise
        if values is None:
            raise AlreadyAnswered(row["id"])
        self.resume(row, values, f"Task '{row.get('name')}' got its answer; resuming")
        return values

    def resume(self, row: Mapping[str, Any], values: Mapping[str, Any], message: str) -> None:
        """The wait of `row` ended with an answer: the task is pending again. If this instance
        drives its tree, it is queued now; else the driver is told (PostgreSQL), or, when no
        instance drives it any more, the takeover of its execution finds it pending."""
        tid, tree_id = row["id"], row["task_tree_id"]
        self._looked.pop(tid, None)
        run = self.run_keeper.runs.get(tree_id)
        event = {"status": TaskStatus.PENDING.value, "progress": 0.0, "message": message, "status_changed": True,
                 "waiting": None}
        if run is not None and tid in run.parked:
            run.rows[tid].update(values)
            run.unpark(tid)
            self.publisher.publish(run, PROGRESS, tid, **event)
            self.passes.settle(run)
            self.passes.wake.set()
            self._reread_if_busy(tree_id)
            return
        self.publisher.emit({"type": PROGRESS, "task_id": tid, "root_task_id": tree_id, "name": row.get("name"),
                             "user_id": row.get("user_id"), "timestamp": now_iso(), **event})
        if run is not None:  # ours, but our view lags (the park not seen yet): read the database
            self.run_keeper.refresh_later(tree_id)
        elif self.publisher.notifier is not None:
            self.publisher.notifier.refresh(tree_id)

    def _read_again(self, tree_id: str) -> None:
        """The driver of `tree_id` reads it from the database (retried while that is away)."""
        if tree_id in self.run_keeper.runs:
            self.run_keeper.refresh_later(tree_id)
        elif self.publisher.notifier is not None:
            self.publisher.notifier.refresh(tree_id)

    def _reread_if_busy(self, tree_id: str) -> None:
        """A wait of a run here just ended in memory. If a re-read of the run is under way (a
        tasks.update just before), it may have read the task still parked and would put that view
        back, leaving the task with nobody to queue it: read once more after it (the database has
        the wait's end now)."""
        if self.run_keeper.lock.locked():
            self.run_keeper.refresh_later(tree_id)

    # --- deadlines ------------------------------------------------------------------------

    def expire(self, tid: str, tree_id: str) -> None:
        """The deadline of a parked task of a run here passed (the pass loop's timer)."""
        self.background.spawn(self._expire(tid, tree_id))

    async def _expire(self, tid: str, tree_id: str) -> None:
        try:
            row = await self.repo.get(tid)
            if row is None:
                return
            wait = read(row.get("waiting"))
            if not isinstance(wait, dict) or not row.get("wake_at"):
                return
            if seconds_until(row["wake_at"]) > 0:  # not yet (clocks, a changed deadline): look again then
                self.passes.wake_at(tid, tree_id, row["wake_at"])
                return
            if wait.get("kind") == "timer" or "default" in wait:
                await self.answer(row, wait.get("default"))
            else:
                await self._fail(row, timeout_error(wait))
        except (NotWaiting, AlreadyAnswered):
            return
        except Exception:
            log.warning("could not end the wait of task %s at its deadline; retrying", tid, exc_info=True)
            self.passes.wake_at(tid, tree_id, iso_in(1.0))

    async def _fail(self, row: Mapping[str, Any], error: str) -> None:
        stamp = now_iso()
        if not await self.store.fail(row["id"], row.get("lease_epoch") or 0, error, stamp):
            return
        tid, tree_id = row["id"], row["task_tree_id"]
        self._looked.pop(tid, None)
        run = self.run_keeper.runs.get(tree_id)
        if run is None or tid not in run.parked:
            self.publisher.emit({"type": TASK_FAILED, "task_id": tid, "root_task_id": tree_id, "name": row.get("name"),
                                 "user_id": row.get("user_id"), "timestamp": stamp, "status": TaskStatus.FAILED.value,
                                 "error": error, "message": error})
            if run is not None:
                self.run_keeper.refresh_later(tree_id)
            return
        run.rows[tid].update(status=TaskStatus.FAILED.value, error=error, waiting=None, wake_at=None,
                             wait_answers=None, completed_at=stamp)
        run.finished(tid, TaskStatus.FAILED.value)
        self.publisher.publish(run, TASK_FAILED, tid, status=TaskStatus.FAILED.value,
                               progress=run.rows[tid].get("progress") or 0.0, error=error, message=error)
        self.passes.settle(run)
        self.passes.wake.set()
        self._reread_if_busy(tree_id)

    # --- events ---------------------------------------------------------------------------

    async def emit(self, user_id: str | None, name: str, payload: Mapping[str, Any],
                   alongside: Sequence[stored.WithEvent] = ()) -> dict[str, Any]:
        """Store the event, with the statements `alongside` in the same transaction (the trigger
        rows it makes: stored both or neither), then answer every parked wait of `user_id` for
        `name` that began at or before it and whose match it meets. Returns {event_id,
        created_at, resumed, task_ids, alongside: what each statement answered}."""
        stamp = now_iso()
        event_id, done = await self.store.store_event(user_id, name, payload, stamp, alongside)
        resumed = await self.resume_for_event(user_id, name, payload, stamp)
        return {"event_id": event_id, "created_at": stamp, "resumed": len(resumed), "task_ids": resumed,
                "alongside": done}

    async def resume_for_event(self, user_id: str | None, name: str, payload: Mapping[str, Any],
                               stamp: str) -> list[str]:
        """Answer every parked wait of `user_id` for event `name` stored at `stamp` (began at or
        before it, its match met); the ids of the tasks resumed. Also what completes an emit whose
        event was stored but whose request was cut before this (agent/services/wait_service.py)."""
        resumed: list[str] = []
        for row in await self.store.parked_of_user(user_id):
            wait = read(row["waiting"])
            if not isinstance(wait, dict) or wait.get("kind") != "event" or wait.get("event") != name \
                    or (wait.get("since") or "") > stamp or not matches(wait, payload):
                continue
            try:
                await self.answer(row, dict(payload))
                resumed.append(row["id"])
            except (NotWaiting, AlreadyAnswered):
                continue
        return resumed

    # --- monitoring -----------------------------------------------------------------------

    def parked_counts(self) -> dict[str, int]:
        """Tasks parked in the runs this instance drives, by kind of wait (for /metrics)."""
        counts: Counter[str] = Counter()
        for run in list(self.run_keeper.runs.values()):
            for tid in run.parked:
                wait = read(run.rows[tid].get("waiting"))
                counts[wait["kind"] if isinstance(wait, dict) and wait.get("kind") in KINDS else "input"] += 1
        return {kind: counts.get(kind, 0) for kind in KINDS}
