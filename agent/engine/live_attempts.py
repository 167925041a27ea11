"""Attempts: running one task's executor once, under its timeout, with its checkpoints and progress.

An attempt starts when a pass claimed its task (engine/passes.py) and ends by handing its
outcome back to the pass loop (`Attempts.outcomes`), which writes it. It writes nothing on the
execution path itself except its checkpoints, each fenced by the token its claim returned. A
cancel, a takeover or a status set by hand detaches the attempt: its late outcome is then
discarded, and its executor is stopped through the executor's cancel hook.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskgrove.agent.foundations import tracing
from taskgrove.agent.engine import history, waits
from taskgrove.agent.engine.background import Background
from taskgrove.agent.engine.bus import PROGRESS, TASK_START
from taskgrove.agent.engine.logbook import AttemptLog, Logbook
from taskgrove.agent.engine.publish import Publisher
from taskgrove.agent.engine.retry_policy import RetryPolicy, stored_policy
from taskgrove.agent.engine.schemas import compiled_schema
from taskgrove.agent.engine.tree_run import COMPLETED, FAILED, IN_PROGRESS, PENDING, TreeRun
from taskgrove.agent.foundations.logconfig import current_task
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError, Waiting
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.llm import usage as llm_usage
from taskgrove.storage.execution_store import ExecutionStore
from taskgrove.storage.repository import TaskRepository
from taskgrove.storage.status import FINISHED_STATUSES
from taskgrove.storage.clock import iso_in, now_iso
from taskgrove.storage.task_view import PublicView
from taskgrove.storage.results import Unstorable, storable, storable_async

log = logging.getLogger(__name__)

CANCEL_HOOK_TIMEOUT = 5.0
# How long an attempt whose fenced write was refused waits to be stopped (_until_stopped):
# a cancel's hook gets CANCEL_HOOK_TIMEOUT before the coroutine is cancelled.
STOP_WAIT = CANCEL_HOOK_TIMEOUT + 5.0
MAX_ERROR_CHARS = 10_000


@dataclass
class LiveAttempt:
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
    stopped: bool = False  # detached by the service's stop, not a cancel: its span says `stopped`
    # Settled as interrupted (its lease was lost): the settling instance reports its span.
    settled: bool = False
    began: float = 0.0  # monotonic, for the duration metric
    log: AttemptLog | None = None  # its task log (engine/logbook.py); None when logs are off
    span: Any = None  # its trace span while traces are on (agent/foundations/tracing.py)
    queued_at: str | None = None  # when it became runnable (engine/history.py)

    @property
    def row(self) -> dict[str, Any]:
        return self.run.rows[self.task_id]


def _error_text(text: str) -> str:
    """An error message safe to store on every backend: bounded, valid Unicode, no NUL (which a
    PostgreSQL text column cannot hold: the task would fail with "could not be stored" instead)."""
    text = text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "... (truncated)"
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def _tokens(executor: Executor | None) -> int:
    usage = getattr(executor, "token_usage", None) or {}
    return int(usage.get("total_tokens") or 0)


_ANY_OBJECT = {"type": "object"}  # an executor's schema that every task's inputs (an object) meet


@functools.lru_cache(maxsize=256)
def _class_validator(cls: type[Executor]) -> Any:
    """An executor's declared input schema, found by its class: not encoded again for every task."""
    return compiled_schema(json.dumps(cls.input_schema, sort_keys=True))


def _validate_inputs(inputs: dict[str, Any], schema: dict[str, Any],
                     declared_by: type[Executor] | None = None) -> None:
    """`declared_by`: the executor class whose own `input_schema` this is."""
    import jsonschema  # loaded by compiled_schema on first use

    try:
        validator = (_class_validator(declared_by)  # type: ignore[arg-type]  # mypy: type[...] is not Hashable
                     if declared_by is not None else compiled_schema(json.dumps(schema, sort_keys=True)))
    except jsonschema.SchemaError as exc:
        raise ExecutorError(f"schemas.input_schema is not a valid JSON Schema: {exc.message}",
                            retryable=False) from None
    error = jsonschema.exceptions.best_match(validator.iter_errors(inputs))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "inputs"
        raise ExecutorError(f"Input validation failed at '{where}': {error.message}", retryable=False)


def _add_unstored_usage(running: LiveAttempt, values: dict[str, Any]) -> None:
    """Costs (docs/costs.md): add to the task's usage what the attempt's LLM calls used that no
    meter stored as they ended (`Executor.llm_usage`; None for the service's own LLM clients,
    whose every call is already added to the stored sum), whether the attempt ends or parks."""
    spent = getattr(running.executor, "llm_usage", None)
    if spent:
        row = running.row
        values["usage"] = row["usage"] = llm_usage.add(row.get("usage"), spent)


def _failure(row: Mapping[str, Any], error: str) -> dict[str, Any]:
    return {"status": FAILED, "progress": row.get("progress") or 0.0, "result": None, "error": _error_text(error)}


class Attempts:
    """The attempts running in this process (`running`, by task id) and what they produced that
    the pass loop has not written yet (`outcomes`, `progress`); `wake` tells the loop."""

    def __init__(self, repo: TaskRepository, registry: ExecutorRegistry, settings: Settings, metrics: Metrics,
                 services: dict[str, Any], instance_id: str, default_retry: RetryPolicy, publisher: Publisher,
                 background: Background, wake: asyncio.Event) -> None:
        self.repo = repo
        self.executions = ExecutionStore(repo)
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.services = services  # the same dict as Engine.services: the container fills it in later
        self.instance_id = instance_id
        self.default_retry = default_retry
        self.publisher = publisher
        self.background = background
        self.wake = wake
        self.running: dict[str, LiveAttempt] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.progress: dict[str, float] = {}
        self.logbook = Logbook(repo, publisher.bus, settings.max_log_bytes)

    def start(self, tid: str, run: TreeRun, stamp: str, claim: Mapping[str, Any]) -> None:
        """Start the attempt a pass just claimed: publish its start, then run its executor."""
        running = self.begin(tid, run, stamp, claim)
        running.job = asyncio.create_task(self._run_executor(running), name=f"task-{tid}")

    def begin(self, tid: str, run: TreeRun, stamp: str, claim: Mapping[str, Any]) -> LiveAttempt:
        """The start of an attempt without its executor: the run, the row, metrics, the start's
        events. `start` then runs the executor; a pure task completed inline (engine/inline.py)
        gets its outcome from the pass at once."""
        run.started(tid)
        row = run.rows[tid]
        queued_at = history.queued_since(run, tid)  # before the row changes
        self.metrics.queue_waited(history.queue_seconds(queued_at, stamp))
        row.update(started_at=stamp, completed_at=None, progress=0.0, result=None, error=None,
                   attempt=claim["attempt"], lease_owner=self.instance_id, lease_epoch=claim["lease_epoch"])
        running = LiveAttempt(task_id=tid, run=run, epoch=claim["lease_epoch"], attempt=claim["attempt"],
                          checkpoint=claim["checkpoint"], executor_id=self.registry.wanted(row),
                          began=time.monotonic(), queued_at=queued_at)
        self.running[tid] = running
        if tracing.ENABLED:
            running.span = tracing.start_attempt(row, run.execution_id, run.traceparent, running.executor_id,
                                                 tracing.ready_since(row, run.rows, run.began))
        self.metrics.attempt_started(running.executor_id)
        if self.publisher.listened:
            self._publish_start(run, tid, row["name"], claim["attempt"])
        return running

    def _publish_start(self, run: TreeRun, tid: str, name: str, attempt: int) -> None:
        started = f"Task '{name}' started" + (f" (attempt {attempt})" if attempt > 1 else "")
        publish = self.publisher.publish
        publish(run, TASK_START, tid, status=IN_PROGRESS, progress=0.0, attempt=attempt, message=started)
        # SPEC.md: the move to in_progress is shown by a progress event too (SSE `progress`, /ws
        # `task_progress`), whatever the executor reports afterwards.
        publish(run, PROGRESS, tid, status=IN_PROGRESS, progress=0.0, attempt=attempt, message=started,
                status_changed=True)

    async def _run_executor(self, running: LiveAttempt) -> None:
        """The attempt's whole life: its executor under the timeout, its log lines stored, then its
        outcome to the pass loop (so the lines are readable once the outcome is)."""
        current_task.set((running.task_id, running.run.tree_id))  # this asyncio task's own log context
        running.log = self.logbook.open(running.task_id, running.attempt, running.row.get("inputs") or {},
                                        running.run.calls.get(running.task_id, {}).get("llm_api_key"))
        try:
            outcome = await self._attempt(running)
        except BaseException:
            self.logbook.close_later(running.log)
            self._hand_in(running, None)
            raise
        if self.logbook.end(running.log):
            await self.logbook.flush()
        self._hand_in(running, None if running.cancelled else outcome)

    def _hand_in(self, running: LiveAttempt, outcome: dict[str, Any] | None) -> None:
        """Give the pass loop the attempt's outcome (None: the attempt was detached, its outcome
        is discarded, and its span ends now). An outcome's span ends once the pass stored it."""
        if outcome is None:
            self.end_span(running, None)
        else:
            self.outcomes.append(outcome)
            self.wake.set()

    def end_span(self, running: LiveAttempt, outcome: dict[str, Any] | None, *, stored: bool = True) -> None:
        """End the attempt's span (traces on), once: with its outcome when the database took it.
        An attempt whose outcome was refused (`stored` False), or that was settled as
        interrupted, is reported by the instance that settled it, under the same id
        (tracing.attempt_span_id): its span is dropped here, not reported twice."""
        span, running.span = running.span, None
        if span is not None and stored and not running.settled:
            tracing.end_attempt(span, outcome, running.cancelled and not running.stopped)

    async def _attempt(self, running: LiveAttempt) -> dict[str, Any] | None:
        """Its executor under the timeout, then its outcome (completed, failed, or pending again
        with a retry delay, or parked); None when the attempt was cancelled."""
        row = running.row
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
                await self.call_cancel_hook(running)
                raise ExecutorError(f"Timed out after {timeout:g}s (timeout_seconds)") from None
            result = await storable_async(result, max_depth=self.settings.max_result_depth,
                                          max_bytes=self.settings.max_result_bytes)
            values: dict[str, Any] = {"status": COMPLETED, "progress": 1.0, "result": result, "error": None}
        except asyncio.CancelledError:
            if running.cancelled:
                return None
            raise
        except Waiting as waiting:  # the attempt parks (engine/waits.py); its answer resumes it
            return None if running.cancelled else self._parked(running, waiting.wait)
        except Unstorable as exc:
            retryable = False
            values = _failure(row, f"The result cannot be stored: {exc}")
        except ExecutorError as exc:
            retryable = exc.retryable
            values = _failure(row, str(exc))
        except Exception as exc:
            log.exception("executor of task %s raised", running.task_id)
            values = _failure(row, f"{type(exc).__name__}: {exc}")
        return None if running.cancelled else self._outcome(running, policy, values, retryable)

    def _parked(self, running: LiveAttempt, wait: dict[str, Any]) -> dict[str, Any]:
        """What the pass loop writes for an attempt that parks on `wait`: the task stays in
        progress, with the wait and its deadline, and without a lease (no instance holds it).
        A wait that cannot be stored (its schema, prompt or default) fails the task instead."""
        row, stamp = running.row, now_iso()
        try:
            problem = waits.bad_schema(wait.get("schema"))
            if problem is not None:
                raise ExecutorError(problem, retryable=False)
            wait = storable(waits.stamped(wait, stamp), max_depth=self.settings.max_result_depth,
                            max_bytes=self.settings.max_result_bytes, what="wait")
        except Unstorable as exc:
            values = _failure(row, f"The wait cannot be stored: {exc}")
            return self._outcome(running, stored_policy(row, self.default_retry), values, False)
        except ExecutorError as exc:
            return self._outcome(running, stored_policy(row, self.default_retry), _failure(row, str(exc)), False)
        values = {"waiting": json.dumps(wait), "wake_at": wait["deadline"], "lease_owner": None,
                  "lease_expires_at": None, "updated_at": stamp}
        _add_unstored_usage(running, values)
        return {"id": running.task_id, "values": values, "wait": wait}

    def _outcome(self, running: LiveAttempt, policy: RetryPolicy, values: dict[str, Any],
                 retryable: bool) -> dict[str, Any]:
        """What the pass loop writes for this attempt: its values, and a retry delay when it runs again."""
        row = running.row
        tokens = _tokens(running.executor)
        ok = values["status"] == COMPLETED
        stamp = now_iso()
        if row.get("wait_answers") is not None:  # the next attempt waits afresh
            values["wait_answers"] = None
        values.update(updated_at=stamp, lease_owner=None, lease_expires_at=None,
                      token_success=(row.get("token_success") or 0) + (tokens if ok else 0),
                      token_failed=(row.get("token_failed") or 0) + (0 if ok else tokens))
        _add_unstored_usage(running, values)
        outcome: dict[str, Any] = {"id": running.task_id, "values": values}
        if not ok and retryable and running.attempt < policy.max_attempts:
            delay = policy.delay(running.attempt)
            values.update(status=PENDING, next_attempt_at=iso_in(delay), progress=0.0)
            outcome.update(delay=delay, message=(
                f"attempt {running.attempt} of {policy.max_attempts} failed: {values['error']}; "
                f"next attempt at {values['next_attempt_at']}"))
        else:
            values["completed_at"] = stamp
        return outcome

    async def _call_executor(self, running: LiveAttempt, policy: RetryPolicy) -> Any:
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
        elif cls.input_schema and cls.input_schema != _ANY_OBJECT:  # inputs is an object: nothing to check
            _validate_inputs(inputs, cls.input_schema, declared_by=cls)
        executor = cls(params=row.get("params") or {})
        running.executor = executor
        dep_results = {
            dep["id"]: run.rows[dep["id"]].get("result")
            for dep in row.get("dependencies") or ()
            if dep["id"] in run.rows and run.rows[dep["id"]]["status"] == COMPLETED
        }

        async def report(progress: float, message: str | None) -> None:
            if running.cancelled:
                return
            row["progress"] = progress
            self.progress[running.task_id] = progress
            self.publisher.publish(run, PROGRESS, running.task_id, status=IN_PROGRESS, progress=progress,
                                   message=message or f"Task '{row['name']}' at {progress:.0%}")
            self.wake.set()

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
            lease_epoch=running.epoch,
            execution_id=row.get("execution_id"),
            last_checkpoint=running.checkpoint,
            wait_answers=waits.read(row.get("wait_answers")) or [],
            traceparent=None if running.span is None else tracing.header_of(running.span),
            _progress=report,
            _checkpoint=checkpoint,
            _log=running.log.add if running.log is not None else None,
        )
        return await executor.execute(inputs, context)

    async def _store_checkpoint(self, running: LiveAttempt, data: Any) -> None:
        try:
            value = storable(data, max_depth=self.settings.max_result_depth,
                             max_bytes=self.settings.max_checkpoint_bytes, what="checkpoint")
        except Unstorable as exc:
            raise ExecutorError(f"The checkpoint cannot be stored: {exc}", retryable=False) from None
        written = await self.executions.fenced_writes([(running.task_id, running.epoch,
                                                         {"checkpoint": value, "updated_at": now_iso()})],
                                                       self.instance_id)
        if not written:
            await self._until_stopped(running)
            raise ExecutorError("This attempt no longer holds its task (cancelled, or taken over)")
        running.checkpoint = value

    async def _until_stopped(self, running: LiveAttempt) -> None:
        """A fenced write of the attempt was refused: the task was cancelled (or its status set
        by hand), or another instance took it over. A cancel decides in the database first and
        stops the work after (cancel hook, then the coroutine), so when the task is found finished
        the executor waits here, up to STOP_WAIT, for that stop instead of failing first: an
        executor that ended on the refusal (closing its client, say) would meet its cancel hook
        with nothing left to cancel, and the remote work it started would go on. A takeover
        stops nothing here: the refusal is raised at once, as for any stale attempt."""
        row = await self.repo.get(running.task_id)
        if row is not None and row["status"] in FINISHED_STATUSES:
            await asyncio.sleep(STOP_WAIT)

    # --- stopping attempts from outside ----------------------------------------------------

    def detach(self, task_id: str, *, shutdown: bool = False, settled: bool = False) -> LiveAttempt | None:
        """Take a running task out of the engine's hands: its late outcome is discarded.
        `shutdown`: the service stops (the attempt is handed back, to run again), not a cancel;
        `settled`: it was settled as interrupted (its lease lost), which reports its span."""
        running = self.running.pop(task_id, None)
        if running is not None:
            running.cancelled = True
            running.stopped = shutdown
            running.settled = settled
            if running.job is not None and running.job.done():  # its outcome, handed in, will be discarded
                self.end_span(running, None)
        return running

    async def stop(self, running: LiveAttempt | None) -> dict[str, Any]:
        """Stop detached work: the executor's cancel hook first, then its coroutine."""
        if running is None:
            return {}
        hook = await self.call_cancel_hook(running)
        if running.job is not None:
            running.job.cancel()
        return hook

    def stop_later(self, task_id: str, *, settled: bool = False) -> None:
        """Detach the attempt now and stop it in the background (no caller waits for its hook).
        `settled`: another instance settled it as interrupted (see detach)."""
        self.background.spawn(self.stop(self.detach(task_id, settled=settled)))

    async def call_cancel_hook(self, running: LiveAttempt) -> dict[str, Any]:
        if running.executor is None:
            return {}
        try:
            return await asyncio.wait_for(running.executor.cancel(), CANCEL_HOOK_TIMEOUT) or {}
        except Exception as exc:  # a broken cancel hook must not stop the cancel
            log.warning("cancel hook of task %s failed: %s", running.task_id, exc)
            return {}
