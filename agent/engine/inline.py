"""Pure tasks completed inline: in the pass's transaction that claims them, with no attempt run.

A task is pure when it is a grouping task (no executor asked for) or its executor class declares
`pure = True` itself (executors/base.py; `noop_executor` and `aggregate_results_executor` do, a
subclass does not inherit it): its result follows from its inputs and its dependencies' results,
without awaiting anything and without side effects. The pass that takes such a task computes its
outcome before writing, then claims it and writes that outcome, fenced by the epoch the claim
gives, in the same transaction (storage: TaskRepository.write_pass's `later` writes). No lease
is held across an await, no attempt coroutine runs, and nothing is published before the commit.

What the database refuses keeps the durable path: a claim refused leaves the task to the run's
refresh as any claim does; a claim granted whose outcome write is refused (the epoch predicted
from memory was not the one the claim gave) starts an ordinary attempt with that claim.

Anything this module cannot decide at once goes the durable path too: an executor that awaits,
raises, declares an input schema of its own (or the task does), a result that cannot be stored,
traces on (an attempt is a span).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from taskgrove.agent.engine import history
from taskgrove.agent.engine.tree_run import COMPLETED, TreeRun
from taskgrove.agent.foundations import tracing
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.storage.attempts import Attempt
from taskgrove.storage.results import Unstorable, storable
from taskgrove.storage.task_view import PublicView

_ANY_OBJECT = {"type": "object"}  # a schema every task's inputs (an object) meet
_UNDECIDED = object()
_NOT_INLINE = object()  # _inline_class: the task takes the durable path


class InlineTask(NamedTuple):
    """A pure task's outcome, decided before the pass claims it; `epoch` and `attempt` are what
    its claim will give if the database holds what this run holds."""

    task_id: str
    run: TreeRun
    values: dict[str, Any]
    epoch: int
    attempt: int
    row: Attempt  # its history row


def declares_pure(cls: type[Executor]) -> bool:
    """True when the class itself says it is pure (an inherited flag does not count)."""
    return cls.__dict__.get("pure") is True


def may_be_pure(registry: ExecutorRegistry, row: Mapping[str, Any]) -> bool:
    """Whether `decide` may complete this task inline (what it checks before running anything):
    such tasks are left to a pass, not claimed with their tree's insert (PassLoop.reserve_for_insert)."""
    return _inline_class(registry, row) is not _NOT_INLINE


def _inline_class(registry: ExecutorRegistry, row: Mapping[str, Any]) -> Any:
    """The executor class of a task `decide` may complete (None: a grouping task), else
    _NOT_INLINE: the checks of may_be_pure, with the class they resolved (resolved once)."""
    if tracing.ENABLED:
        return _NOT_INLINE
    schemas = row.get("schemas") or {}
    cls = registry.resolve(row)
    if cls is None:
        return None if not schemas and not (row.get("params") or {}).get("executor_id") else _NOT_INLINE
    if declares_pure(cls) and not schemas.get("input_schema") and cls.input_schema in (None, _ANY_OBJECT):
        return cls
    return _NOT_INLINE


def decide(registry: ExecutorRegistry, settings: Settings, services: Mapping[str, Any], run: TreeRun, tid: str,
           stamp: str) -> InlineTask | None:
    """The inline outcome of task `tid`, or None: it takes the durable path."""
    row = run.rows[tid]
    cls = _inline_class(registry, row)
    if cls is _NOT_INLINE:
        return None  # (an executor that is not here: the attempt fails the task with its message)
    result: Any = None  # a grouping task completes at once
    if cls is not None:
        result = _run_at_once(cls, row, run, settings, services, tid)
        if result is _UNDECIDED:
            return None
        try:
            result = storable(result, max_depth=settings.max_result_depth, max_bytes=settings.max_result_bytes)
        except Unstorable:
            return None  # the attempt stores the failure with its message
    values: dict[str, Any] = {"status": COMPLETED, "progress": 1.0, "result": result, "error": None,
                              "completed_at": stamp, "updated_at": stamp, "lease_owner": None,
                              "lease_expires_at": None}
    if row.get("wait_answers") is not None:
        values["wait_answers"] = None
    attempt = (row.get("attempt") or 0) + 1
    queued_at = history.queued_since(run, tid)
    return InlineTask(tid, run, values, (row.get("lease_epoch") or 0) + 1, attempt,
                      Attempt(tid, attempt, queued_at, stamp, stamp, COMPLETED, None))


def _run_at_once(cls: type[Executor], row: Mapping[str, Any], run: TreeRun, settings: Settings,
                 services: Mapping[str, Any], tid: str) -> Any:
    """The executor's result if its coroutine returns without suspending, else _UNDECIDED."""
    dep_results = {dep["id"]: run.rows[dep["id"]].get("result") for dep in row.get("dependencies") or ()
                   if dep["id"] in run.rows and run.rows[dep["id"]]["status"] == COMPLETED}
    context = ExecutionContext(task_id=tid, task=PublicView(row), settings=settings, dependency_results=dep_results,
                               user_id=row.get("user_id"), services=services, attempt=(row.get("attempt") or 0) + 1,
                               execution_id=row.get("execution_id"))
    coro = cls(params=row.get("params") or {}).execute(dict(row.get("inputs") or {}), context)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    except Exception:  # its failure, message and retries are the durable path's
        return _UNDECIDED
    coro.close()  # it awaits something: not pure after all
    return _UNDECIDED


def over_after(run: TreeRun, completed: set[str]) -> bool:
    """TreeRun.is_over once the queued tasks in `completed` have completed (inline, in the pass
    that ends the run): its execution ends in the same transaction, as after any last outcome."""
    if not completed:
        return run.is_over()
    return not (run.waiting or (run.queued - completed) or run.active or run.retrying or run.foreign or run.parked)
