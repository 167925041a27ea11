"""A tree whose every task is pure, completed in its own insert (issue 48).

engine/inline.py completes a pure task in the pass that claims it: for a tree of pure tasks that
is still the insert's transaction, then one pass (claims, outcomes) per layer of dependencies,
then the end of the execution and the answer's read. Here the whole run is played in memory
before the insert instead: a TreeRun of all the rows, its runnable tasks taken layer by layer
as the passes would take them (TreeRun.runnable, then the fair queue's order within a tree:
priority, creation, id), each decided by the same `inline.decide` (an aggregate's dependency
results come from the tasks decided before it, in the run's rows), until the run is over. The
tree is then inserted already completed: every task with its result, its first attempt and the
claim's epoch, its history row, its execution ended (storage/tree_insert.py `done`), in the
insert's one statement (PostgreSQL) or transaction (SQLite). A create is then that one
statement, and its answer is built from the rows as stored (`stored_rows`), with no read back.

All or nothing: a tree with one task that is not plain (a retry policy, a timeout, a
concurrency key or a rate, a budget, one scheduled for later, a dependency outside the tree) or
not pure (or not decided at once: an executor that awaits or raises, a result that cannot be
stored) takes the pass's path whole, as does a tree larger than MAX_TASKS or one for which no
slot is free now (the slots a pass would have left: PassLoop.reserve_for_insert's rule; the
tasks run one after another here, never more than one at a time).

Each task starts and completes at one stamp, one microsecond after the task played before it,
the first no earlier than now or any task's creation: a dependent starts after its dependency
completed, the stored start times show the order the tasks ran in (priority within a layer, as
the passes take them), and each history row's queued_at <= started_at = ended_at; the execution
begins at the first stamp and ends at the last. Nothing is published before the commit; afterwards each
attempt begins and ends in memory as a pass's inline completion does it
(PassLoop.complete_inline), in the order the run was played (task_start, progress,
task_completed of each task in dependency order), and the run ends as a pass ends it
(RunKeeper.ended: `final`): the same events, metrics and history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, Sized

from taskgrove.agent.engine import inline
from taskgrove.agent.engine.live_attempts import Attempts
from taskgrove.agent.engine.tree_run import COMPLETED, PENDING, TreeRun
from taskgrove.storage import tree_insert

# The largest tree played in memory before its insert. Deciding a pure task costs what a pass
# spends on it (30-50 us a task on a loaded 2-core machine: 30-50 ms for 1,000 tasks, 60-105 ms
# for 2,000), but here all of them run in one go on the event loop's thread, before anything
# else gets a turn: beyond this, the passes' batches (SERVICE_MAX_CONCURRENCY tasks a pass,
# other requests served between them) take the tree instead. The benchmark's shapes are 1,000.
MAX_TASKS = 1_000

# What _record (engine/passes.py) copies from an outcome into the run's row.
_RECORDED = ("status", "progress", "result", "error", "completed_at", "next_attempt_at")


class InlineHooks(Protocol):
    """What this module needs of the pass loop (engine/passes.py)."""

    @property
    def stopping(self) -> bool: ...

    @property
    def reserved(self) -> int: ...

    @property
    def ready(self) -> Sized: ...

    def complete_inline(self, tid: str, run: TreeRun, stamp: str, claim: Mapping[str, Any],
                        values: Mapping[str, Any]) -> None: ...


@dataclass(eq=False)
class CompletedRun(TreeRun):
    """The run of a tree stored completed by its insert; `stored`: its full rows as the insert
    stored them (storage's row shape, tree_insert.new_tree), which answer the create."""

    stored: list[dict[str, Any]] = field(default_factory=list, repr=False)


class PureTree(NamedTuple):
    """A tree decided before its insert: its run, the outcomes in the order the passes would
    have completed them, and the stamp the first of them starts at (the execution's start)."""

    run: CompletedRun
    order: list[inline.InlineTask]
    stamp: str


def decide(passes: InlineHooks, attempts: Attempts, rows: Sequence[Mapping[str, Any]], stamp: str,
           ) -> PureTree | None:
    """The outcomes of a tree whose every task is pure, decided now: the first at `stamp` (or at
    the latest creation of its tasks if that is later), each next one a microsecond later;
    None: the usual path, for the whole tree."""
    if not rows or len(rows) > MAX_TASKS or not _slot_free(passes, attempts):
        return None
    ids = {row["id"] for row in rows}
    registry = attempts.registry
    # The cheap checks of every task first: a tree that is not pure costs no executor's call.
    if not all(_plain(row, ids) and inline.may_be_pure(registry, row) for row in rows):
        return None
    stamp = max(stamp, max(row["created_at"] for row in rows))
    begins = datetime.fromisoformat(stamp)
    run = CompletedRun(tree_id=rows[0]["task_tree_id"], rows={row["id"]: dict(row) for row in rows})
    run.add(list(run.rows))  # every task a member, waiting, as a rebuild adds them
    order: list[inline.InlineTask] = []
    while ready := run.runnable():
        if len(ready) > 1:  # a pass takes a tree's runnable tasks by priority, then creation
            ready.sort(key=lambda tid: (run.rows[tid]["priority"], run.rows[tid]["created_at"], tid))
        for tid in ready:
            at = (begins + timedelta(microseconds=len(order))).isoformat(timespec="microseconds") if order else stamp
            item = inline.decide(registry, attempts.settings, attempts.services, run, tid, at)
            if item is None:
                return None
            _record(run, tid, item.values)
            order.append(item)
    if len(order) != len(rows):  # (every outcome is a completion: only a cycle could stop it)
        return None
    return PureTree(run, order, stamp)


def _plain(row: Mapping[str, Any], ids: set[str]) -> bool:
    """A pending task that a pass would take as soon as its dependencies (tasks of its own tree)
    completed, and that nothing but its executor decides."""
    return (row["status"] == PENDING and not row.get("next_attempt_at")
            and (row.get("retry") or {}).get("max_attempts", 1) <= 1 and not row.get("timeout_seconds")
            and not row.get("concurrency") and not row.get("rate_limit") and row.get("waiting") is None
            and not row.get("budget") and all(dep["id"] in ids for dep in row.get("dependencies") or ()))


def _slot_free(passes: InlineHooks, attempts: Attempts) -> bool:
    """Whether the next pass would take a task at once: not shutting down, no executor capped,
    a slot left after everything queued now (fair order takes nothing from anyone)."""
    settings = attempts.settings
    return not passes.stopping and not settings.executor_concurrency and \
        settings.max_concurrency - len(attempts.running) - passes.reserved - len(passes.ready) > 0


def _record(run: TreeRun, tid: str, values: Mapping[str, Any]) -> None:
    """Task `tid` completed in the played run, as PassLoop._record leaves a completion: its
    dependents may run next, with its result."""
    run.rows[tid].update({key: values[key] for key in _RECORDED if key in values})
    run.finished(tid, COMPLETED)


def done(pure: PureTree) -> dict[str, tree_insert.Done]:
    """What the insert stores completed (tree_insert.insert_tree's `done`)."""
    return {item.task_id: tree_insert.Done(item.values, item.row) for item in pure.order}


def completed(passes: InlineHooks, pure: PureTree, execution: Mapping[str, Any],
              call: Mapping[str, Any]) -> CompletedRun:
    """After the insert's commit: the run of the tree in memory, every attempt begun and ended
    in the order played, as a pass's inline completion leaves them (PassLoop.complete_inline);
    the caller ends the run. `execution`: what the insert returned (with the rows it stored)."""
    run = pure.run
    run.execution_id, run.version = execution["id"], execution["updated_at"]
    run.traceparent, run.began = execution.get("traceparent"), execution["created_at"]
    run.stored = execution["stored"]
    for row in run.rows.values():
        row["execution_id"] = execution["id"]
    run.calls.update(dict.fromkeys(run.rows, dict(call)))  # as RunKeeper.run_inserted gives them
    run.add(list(run.rows))  # members again, waiting: each event's tree_progress counts as a pass's does
    for item in pure.order:
        tid = item.task_id
        run.take([tid])
        claim = {"lease_epoch": item.epoch, "attempt": item.attempt, "checkpoint": run.rows[tid].get("checkpoint")}
        passes.complete_inline(tid, run, item.values["completed_at"], claim, item.values)
    return run


def stored_rows(run: Any) -> list[dict[str, Any]] | None:
    """The rows a create's insert stored, when it stored its tree completed (a CompletedRun):
    the create's answer (nothing changed them in between that the create did not); else None."""
    return run.stored if isinstance(run, CompletedRun) and run.stored else None
