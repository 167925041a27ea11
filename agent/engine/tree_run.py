"""Bookkeeping of one tree's execution: which tasks are waiting, runnable, running, finished.

Pure in-memory logic, no I/O: the engine tells a `TreeRun` what the database accepted and asks
it what became runnable. The database stays the truth (every claim re-checks it, see
storage/executions.py); this is the index that keeps the engine from querying it for every
decision, and it is rebuilt from the database whenever the two may have drifted apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from taskgrove.storage.status import TaskStatus

# TaskStatus's values bound once as plain text, for the engine's per-task code (this module,
# passes.py, attempts.py, history.py): `TaskStatus.PENDING` there looks the member up each time
# (about 60 ns), a module constant does not; and a row or event holds the plain text. Not a
# second list: everywhere else writes TaskStatus itself (docs/ARCHITECTURE.md).
PENDING, IN_PROGRESS, COMPLETED, FAILED = (TaskStatus.PENDING.value, TaskStatus.IN_PROGRESS.value,
                                           TaskStatus.COMPLETED.value, TaskStatus.FAILED.value)



def select_for_execution(rows: Mapping[str, Mapping[str, Any]], target_id: str) -> set[str]:
    """Ids that must (re-)run when `target_id` is executed (SPEC.md transition table).

    Root: the whole tree; child: the task plus its transitive dependencies. Only `pending` and
    `failed` tasks run, except that every dependency of a failed task runs again, even when
    completed. Tasks outside the tree (dependencies of copies) never run from here. A task that
    failed because its attempt was interrupted (a crash, a lost lease) pulls in nothing: recovery
    is not re-execution, and its completed dependencies are still valid.
    """
    target = rows[target_id]
    deps = {tid: [d["id"] for d in row.get("dependencies") or () if d["id"] in rows]
            for tid, row in rows.items()}
    in_tree = {tid for tid, row in rows.items() if row["task_tree_id"] == target["task_tree_id"]}
    if target["parent_id"] is None:
        scope = set(in_tree)
    else:
        scope = {target_id}
        stack = [target_id]
        while stack:
            for dep in deps[stack.pop()]:
                if dep not in scope and dep in in_tree:
                    scope.add(dep)
                    stack.append(dep)
    chosen = {tid for tid in scope if rows[tid]["status"] in (PENDING, FAILED)}
    stack = [tid for tid in scope if rows[tid]["status"] == FAILED and not was_interrupted(rows[tid])]
    while stack:
        for dep in deps[stack.pop()]:
            if dep in in_tree and dep not in chosen and rows[dep]["status"] != IN_PROGRESS:
                chosen.add(dep)
                stack.append(dep)
    return chosen


INTERRUPTED = "Interrupted: "  # how the error of an attempt cut off by a crash or lost lease begins
RESTART_ERROR = INTERRUPTED + "the service restarted while this task was running"


def was_interrupted(row: Mapping[str, Any]) -> bool:
    return (row.get("error") or "").startswith(INTERRUPTED)


@dataclass
class TreeRun:
    tree_id: str
    rows: dict[str, dict[str, Any]]
    # The executions row this run drives, and its updated_at when last read: ending the execution
    # is a compare-and-set on it, so a request that joined meanwhile is never lost.
    execution_id: str = ""
    version: str = ""
    # The execution's stored trace context and start (agent/foundations/tracing.py: its spans are made from them).
    traceparent: str | None = None
    began: str = ""
    # Per task: the context of the request that asked for its execution (user, LLM key from the
    # request header). Kept per task so a second request joining the run never changes the key
    # the first request's tasks run with; dropped when the task ends.
    calls: dict[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    waiting: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    blocked: set[str] = field(default_factory=set)
    # Waiting for their next attempt (a stored time), or in progress on no instance of ours (their
    # interrupted attempt is about to be settled): both keep the run alive.
    retrying: set[str] = field(default_factory=set)
    foreign: set[str] = field(default_factory=set)
    # Parked on a durable wait (engine/waits.py): in progress in the database, but with no
    # attempt and no slot anywhere; not runnable, not over, and their dependents wait with them.
    parked: set[str] = field(default_factory=set)
    outcome: dict[str, str] = field(default_factory=dict)
    ending: bool = False  # the engine is ending its execution in the database
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the run ended (with `done`), or while nothing of it can move until a wait is
    # answered (engine/waits.py): tasks.create answers then.
    resting: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._dirty: set[str] = set()
        # Per task, how many of its dependencies (in order) are known to let it run; and the tasks
        # whose every dependency must be looked at again, because one of them failed or was
        # blocked. Only such an ending can block a task, so otherwise a check may stop at the
        # first dependency it still waits for: a task with n dependencies costs O(n) checks in
        # all, not n per ending (a diamond's layers of 10: 10 checks a task, not 100).
        self._settled: dict[str, int] = {}
        self._rescan: set[str] = set()
        self.task_count = sum(1 for row in self.rows.values() if row["task_tree_id"] == self.tree_id)
        self._index()

    def _index(self) -> None:
        self.dependents: dict[str, list[str]] = {}
        for tid, row in self.rows.items():
            for dep in row.get("dependencies") or ():
                self.dependents.setdefault(dep["id"], []).append(tid)

    @property
    def live(self) -> set[str]:
        """Tasks this run still has to see through."""
        return self.waiting | self.queued | self.active | self.retrying | self.foreign | self.parked

    @property
    def members(self) -> set[str]:
        return self.live | self.blocked | set(self.outcome)

    def add(self, ids: Iterable[str]) -> None:
        self._settled.clear()  # a dependency that had ended may run again
        for tid in ids:
            self.outcome.pop(tid, None)
            self.blocked.discard(tid)
            self.rows[tid]["status"] = PENDING
            self.waiting.add(tid)
            self._dirty.add(tid)
        self.done.clear()
        self.resting.clear()

    def _dep_state(self, dep_id: str) -> str:
        """The status of a dependency that ended in this run, `wait` while it is still live here,
        `blocked`, or the stored status of a task outside the run (`missing` if unknown). A
        task that ended here is in `outcome` and in none of the live sets nor `blocked` (see
        finished and add), so that is looked at first: most dependencies checked have ended."""
        ended = self.outcome.get(dep_id)
        if ended is not None:
            return ended
        if dep_id in self.waiting or dep_id in self.queued or dep_id in self.active or dep_id in self.retrying \
                or dep_id in self.foreign or dep_id in self.parked:
            return "wait"
        if dep_id in self.blocked:
            return "blocked"
        row = self.rows.get(dep_id)
        return row["status"] if row is not None else "missing"

    def runnable(self) -> list[str]:
        """Move waiting tasks whose dependencies are satisfied to `queued`; block hopeless ones.

        Only tasks marked dirty (just added, or a dependency just ended) are looked at, so a
        1000-task chain costs 1000 checks, not half a million.
        """
        ready: list[str] = []
        while self._dirty:
            tid = self._dirty.pop()
            if tid not in self.waiting:
                continue
            verdict = self._verdict(tid)
            if verdict == "ready":
                self.waiting.discard(tid)
                self.queued.add(tid)
                ready.append(tid)
            elif verdict == "blocked":
                self.waiting.discard(tid)
                self.blocked.add(tid)
                self._ended_badly(tid)
        return ready

    def _verdict(self, tid: str) -> str:
        deps = self.rows[tid].get("dependencies") or ()
        full = tid in self._rescan or tid not in self._settled
        self._rescan.discard(tid)
        first_wait = None
        for index in range(0 if full else self._settled[tid], len(deps)):
            dep = deps[index]
            state = self._dep_state(dep["id"])
            # in_progress: outside this run and still running, so wait for its end
            if state == "wait" or state == IN_PROGRESS:
                if first_wait is None:
                    first_wait = index
                if not full:
                    break  # nothing failed since the last full check: nothing further can block
            # A dependency blocked here never ends in this run, so even an optional one holds its
            # dependent back for good (it must have ended; the claim refuses while it is pending).
            elif state != COMPLETED and (dep["required"] or state == "blocked"):
                return "blocked"
        self._settled[tid] = len(deps) if first_wait is None else first_wait
        return "ready" if first_wait is None else "wait"

    def _ended_badly(self, tid: str) -> None:
        """`tid` failed or was blocked: its dependents are checked again, every dependency."""
        dependents = self.dependents.get(tid, ())
        self._dirty.update(dependents)
        self._rescan.update(dependents)

    def take(self, ids: Iterable[str]) -> list[str]:
        """Of `ids`, the tasks that wait here, queued now to start at once: they were claimed
        outside a pass (with their tree's insert)."""
        taken = [tid for tid in ids if tid in self.waiting]
        for tid in taken:
            self.waiting.discard(tid)
            self.queued.add(tid)
        return taken

    def started(self, tid: str) -> None:
        self.queued.discard(tid)
        self.active.add(tid)
        self.rows[tid]["status"] = IN_PROGRESS

    def retry_later(self, tid: str) -> None:
        """An attempt failed and another is due later: the task waits, the run goes on."""
        self.active.discard(tid)
        self.retrying.add(tid)
        self.rows[tid]["status"] = PENDING

    def park(self, tid: str) -> None:
        """The attempt of `tid` ended on a wait: it stays in progress without running."""
        self.active.discard(tid)
        self.parked.add(tid)

    def unpark(self, tid: str) -> bool:
        """The wait of `tid` was answered: it is pending again, to be claimed (the same attempt)."""
        if tid not in self.parked:
            return False
        self.parked.discard(tid)
        self.resting.clear()
        self.rows[tid]["status"] = PENDING
        self.waiting.add(tid)
        self._dirty.add(tid)
        return True

    def retry_due(self, tid: str) -> None:
        if tid in self.retrying:
            self.retrying.discard(tid)
            self.waiting.add(tid)
            self._dirty.add(tid)

    def finished(self, tid: str, status: str) -> None:
        self.queued.discard(tid)
        self.active.discard(tid)
        self.waiting.discard(tid)
        self.blocked.discard(tid)
        self.retrying.discard(tid)
        self.foreign.discard(tid)
        self.parked.discard(tid)
        self.outcome[tid] = status
        self.rows[tid]["status"] = status
        self.calls.pop(tid, None)
        if status == COMPLETED:
            self._dirty.update(self.dependents.get(tid, ()))
        else:
            self._ended_badly(tid)

    def only_waits(self) -> bool:
        """Tasks are parked and nothing else can move until one is answered (call after runnable())."""
        return bool(self.parked) and not (self.queued or self.active or self.retrying or self.foreign)

    def is_over(self) -> bool:
        return not (self.waiting or self.queued or self.active or self.retrying or self.foreign or self.parked)

    @property
    def progress(self) -> float:
        """Share of this execution's tasks that have finished (the sets are disjoint)."""
        live = len(self.waiting) + len(self.queued) + len(self.active) + len(self.retrying) + len(self.foreign) \
            + len(self.parked)
        total = live + len(self.blocked) + len(self.outcome)
        return round(len(self.outcome) / total, 4) if total else 1.0
