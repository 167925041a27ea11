"""A one-task tree whose task is pure, completed in its own insert (issue 48, item 1).

engine/inline.py completes a pure task in the pass that claims it: for a one-task tree that is
still the insert's transaction, then the pass's (claim, outcome, end of the execution), then
the answer's read. Here the outcome is decided before the insert instead, by the same
`inline.decide`, and the tree is inserted already completed: the task with its result, its
first attempt and the claim's epoch, its history row, its execution ended (storage/tree_insert.py
`done`), in the insert's one statement or transaction. A create is then the insert and the
answer's read: on PostgreSQL two round trips and one commit instead of three and two.

Nothing is published before that commit; afterwards the attempt begins and ends in memory as the
pass's inline completion does it (PassLoop.complete_inline), and the run ends as a pass ends it
(RunKeeper.ended): the same events, metrics and history. Anything else keeps the pass's path: a tree of several tasks, a
task with dependencies, a retry policy, a timeout, a concurrency key or a rate, one scheduled for
later, an executor that is not pure (or not decided at once), or no slot free for it now
(the slots a pass would have left: PassLoop.reserve_for_insert's rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Sized

from taskgrove.agent.engine import inline
from taskgrove.agent.engine.live_attempts import Attempts
from taskgrove.agent.engine.tree_run import PENDING, TreeRun
from taskgrove.storage import tree_insert


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


def decide(passes: InlineHooks, attempts: Attempts, rows: list[dict[str, Any]], stamp: str,
           ) -> inline.InlineTask | None:
    """The outcome of a one-task tree's pure task, decided now at `stamp`; None: the usual path."""
    if len(rows) != 1 or not _plain(rows[0]) or not _slot_free(passes, attempts):
        return None
    row = dict(rows[0])
    run = TreeRun(tree_id=row["task_tree_id"], rows={row["id"]: row})
    return inline.decide(attempts.registry, attempts.settings, attempts.services, run, row["id"], stamp)


def _plain(row: Mapping[str, Any]) -> bool:
    """A pending task that a pass would take at once and that nothing but its executor decides."""
    return (row["status"] == PENDING and not row.get("dependencies") and not row.get("next_attempt_at")
            and (row.get("retry") or {}).get("max_attempts", 1) <= 1 and not row.get("timeout_seconds")
            and not row.get("concurrency") and not row.get("rate_limit") and row.get("waiting") is None
            and not row.get("budget"))


def _slot_free(passes: InlineHooks, attempts: Attempts) -> bool:
    """Whether the next pass would take the task at once: not shutting down, no executor capped,
    a slot left after everything queued now (fair order takes nothing from anyone)."""
    settings = attempts.settings
    return not passes.stopping and not settings.executor_concurrency and \
        settings.max_concurrency - len(attempts.running) - passes.reserved - len(passes.ready) > 0


def done(item: inline.InlineTask) -> dict[str, tree_insert.Done]:
    """What the insert stores completed (tree_insert.insert_tree's `done`)."""
    return {item.task_id: tree_insert.Done(item.values, item.row)}


def completed(passes: InlineHooks, item: inline.InlineTask, execution: Mapping[str, Any],
              call: Mapping[str, Any]) -> TreeRun:
    """After the insert's commit: the run of the tree in memory, its attempt begun and ended, as a
    pass's inline completion leaves them (PassLoop.complete_inline); the caller ends the run."""
    tid, run = item.task_id, item.run
    run.rows[tid]["execution_id"] = execution["id"]
    run.execution_id, run.version = execution["id"], execution["updated_at"]
    run.traceparent, run.began = execution.get("traceparent"), execution["created_at"]
    run.calls[tid] = dict(call)
    run.add([tid])
    run.take([tid])
    claim = {"lease_epoch": item.epoch, "attempt": item.attempt, "checkpoint": run.rows[tid].get("checkpoint")}
    passes.complete_inline(tid, run, item.values["completed_at"], claim, item.values)
    return run
