"""Bookkeeping of one tree's execution: which tasks are waiting, runnable, running, finished.

Pure in-memory logic, no I/O: the engine tells a `TreeRun` what the database accepted and asks
it what became runnable. The database stays the truth; this is the index that keeps the
scheduler from querying it for every decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any



def select_for_execution(rows: Mapping[str, Mapping[str, Any]], target_id: str) -> set[str]:
    """Ids that must (re-)run when `target_id` is executed (SPEC.md transition table).

    Root: the whole tree; child: the task plus its transitive dependencies. Only `pending` and
    `failed` tasks run, except that every dependency of a failed task runs again, even when
    completed. Tasks outside the tree (dependencies of copies) never run from here.
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
    chosen = {tid for tid in scope if rows[tid]["status"] in ("pending", "failed")}
    stack = [tid for tid in scope if rows[tid]["status"] == "failed"]
    while stack:
        for dep in deps[stack.pop()]:
            if dep in in_tree and dep not in chosen and rows[dep]["status"] != "in_progress":
                chosen.add(dep)
                stack.append(dep)
    return chosen


@dataclass
class TreeRun:
    tree_id: str
    rows: dict[str, dict[str, Any]]
    # Per-execution context handed to executors (user, LLM key from the request header).
    # Per task: the context of the request that asked for its execution (user, LLM key from the
    # request header). Kept per task so a second request joining the run never changes the key
    # the first request's tasks run with; dropped when the task ends.
    calls: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    waiting: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    blocked: set[str] = field(default_factory=set)
    outcome: dict[str, str] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._dirty: set[str] = set()
        self.refresh(self.rows)

    def refresh(self, rows: dict[str, dict[str, Any]]) -> None:
        """Take fresh rows for the tasks not live in this run (their dependencies may have been
        changed by tasks.update since) and rebuild the dependents index."""
        live = self.waiting | self.queued | self.active
        self.rows.update({tid: row for tid, row in rows.items() if tid not in live})
        self.task_count = sum(1 for row in self.rows.values() if row["task_tree_id"] == self.tree_id)
        self._index()

    def changed_outside(self, tid: str, status: str, result: Any) -> None:
        """A task this run does not execute changed status (by hand, or on another instance)."""
        self.rows[tid].update(status=status, result=result)
        self._dirty.update(self.dependents.get(tid, ()))

    def set_dependencies(self, tid: str, dependencies: list[dict[str, Any]]) -> None:
        """New dependencies of a task that has not started: look at it again."""
        self.rows[tid]["dependencies"] = dependencies
        for group in (self.queued, self.blocked):
            if tid in group:
                group.discard(tid)
                self.waiting.add(tid)
        self._dirty.add(tid)
        self._index()

    def _index(self) -> None:
        self.dependents: dict[str, list[str]] = {}
        for tid, row in self.rows.items():
            for dep in row.get("dependencies") or ():
                self.dependents.setdefault(dep["id"], []).append(tid)

    @property
    def members(self) -> set[str]:
        return self.waiting | self.queued | self.active | self.blocked | set(self.outcome)

    def add(self, ids: Iterable[str]) -> None:
        for tid in ids:
            self.outcome.pop(tid, None)
            self.blocked.discard(tid)
            self.rows[tid]["status"] = "pending"
            self.waiting.add(tid)
            self._dirty.add(tid)
        self.done.clear()

    def _dep_state(self, dep_id: str) -> str:
        """`ok`, `wait` or `blocked` for one dependency edge target."""
        if dep_id in self.waiting or dep_id in self.queued or dep_id in self.active:
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
                self._dirty.update(self.dependents.get(tid, ()))
        return ready

    def unblock(self) -> None:
        """Give blocked tasks another look (a dependency's status was changed by hand)."""
        self.waiting |= self.blocked
        self._dirty |= self.blocked
        self.blocked.clear()

    def _verdict(self, tid: str) -> str:
        waiting = False
        for dep in self.rows[tid].get("dependencies") or ():
            state = self._dep_state(dep["id"])
            if state == "wait":
                waiting = True
            elif dep["required"]:
                if state == "in_progress":
                    waiting = True  # outside this run and still running: wait for its end
                elif state != "completed":
                    return "blocked"
            elif state == "in_progress":
                waiting = True
        return "wait" if waiting else "ready"

    def started(self, tid: str) -> None:
        self.queued.discard(tid)
        self.active.add(tid)
        self.rows[tid]["status"] = "in_progress"

    def finished(self, tid: str, status: str) -> None:
        self.queued.discard(tid)
        self.active.discard(tid)
        self.waiting.discard(tid)
        self.blocked.discard(tid)
        self.outcome[tid] = status
        self.rows[tid]["status"] = status
        self.calls.pop(tid, None)
        self._dirty.update(self.dependents.get(tid, ()))

    def is_over(self) -> bool:
        return not (self.waiting or self.queued or self.active)

    def finish(self) -> str:
        bad = self.blocked or any(s != "completed" for s in self.outcome.values())
        self.done.set()
        return "failed" if bad else "completed"

    @property
    def progress(self) -> float:
        """Share of this execution's tasks that have finished (the sets are disjoint)."""
        total = len(self.waiting) + len(self.queued) + len(self.active) + len(self.blocked) + len(self.outcome)
        return round(len(self.outcome) / total, 4) if total else 1.0
