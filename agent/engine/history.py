"""The attempt history as the engine sees it: when an attempt became runnable, and the row that
records how it ended (storage/attempts.py stores it, in the pass's transaction).

Kept out of the pass loop and the attempts so that their hooks stay one line each: `queued_since`
when an attempt starts (also the queue wait metric), `ended` when the pass writes its outcome.
Both work on what the engine already holds in memory: no read, no write of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from taskgrove.agent.engine.tree_run import PENDING, TreeRun
from taskgrove.storage import attempts as A
from taskgrove.storage.attempts import Attempt


class AttemptFacts(Protocol):
    """What this module reads of an attempt (engine/live_attempts.py `LiveAttempt`, which imports this
    module: a Protocol keeps the import one way)."""

    task_id: str
    attempt: int
    queued_at: str | None

    @property
    def row(self) -> dict[str, Any]: ...


def queued_since(run: TreeRun, tid: str) -> str | None:
    """When the task became runnable: the latest of its last change (created, joined to an
    execution, its wait answered), its retry's due time and its dependencies' ends. Read before
    the start changes the row."""
    row = run.rows[tid]
    since = row.get("updated_at") or row.get("created_at")
    due = row.get("next_attempt_at")
    if due and (since is None or due > since):
        since = due
    rows = run.rows
    for dep in row.get("dependencies") or ():
        ended = (rows.get(dep["id"]) or {}).get("completed_at")
        if ended and (since is None or ended > since):
            since = ended
    return since


def queue_seconds(queued_at: str | None, started_at: str) -> float | None:
    """Seconds from runnable to started (the queue wait histogram)."""
    return A.seconds_between(queued_at, started_at)


def ended(running: AttemptFacts, outcome: Mapping[str, Any]) -> Attempt:
    """The history row of an attempt whose outcome the pass writes now."""
    values = outcome["values"]
    status = values.get("status")
    if status is None:  # parked on a wait: the task stays in progress
        kind = A.WAITING
    else:
        kind = A.RETRY if status == PENDING else status
    return Attempt(running.task_id, running.attempt, running.queued_at, running.row.get("started_at"),
                   values.get("completed_at") or values.get("updated_at"), kind,
                   values.get("error") if kind in (A.FAILED, A.RETRY) else None)


def rows_of(recorded: Iterable[tuple[AttemptFacts, Mapping[str, Any]]]) -> dict[str, Attempt]:
    """By task id, the history rows of a pass's recorded outcomes."""
    return {running.task_id: ended(running, outcome) for running, outcome in recorded}


def cancelled(running: AttemptFacts | None, stamp: str, error: str) -> Attempt | None:
    """The history row of an attempt running here that a cancel ends (None: none runs here)."""
    if running is None:
        return None
    return Attempt(running.task_id, running.attempt, running.queued_at, running.row.get("started_at"), stamp,
                   A.CANCELLED, error)


def as_failure(row: Attempt, error: str) -> Attempt:
    """The row of an attempt whose outcome could not be stored, so that it failed instead."""
    return row._replace(outcome=A.FAILED, error=error)
