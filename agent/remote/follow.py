"""Following a tree live over /ws until it settles: `taskgrove tasks watch` and `taskgrove run --url`.

When is a tree done? A failed task's dependents stay `pending` for good (DESIGN.md), so "every task
terminal" may never come. The tree is settled when nothing is `in_progress` and no `pending` task
can still run (its required dependencies completed, its optional ones terminal), or when its root
was cancelled and nothing is `in_progress` (a person stopped the tree). A finished root alone is
not enough: a root that depends on none of its children may finish first. Checked only once every
task's snapshot has arrived, so the decision is never taken on a state older than the subscription.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

from taskgrove.agent.remote.client import Remote, RemoteError
from taskgrove.storage.status import FINISHED_STATUSES, TaskStatus

TERMINAL = frozenset(FINISHED_STATUSES)
COLOURS: dict[str, str] = {TaskStatus.COMPLETED: "green", TaskStatus.FAILED: "red", TaskStatus.CANCELLED: "yellow",
           TaskStatus.IN_PROGRESS: "cyan", TaskStatus.PENDING: "white"}


class TreeState:
    """Status and progress of every task of one tree, fed by /ws messages."""

    def __init__(self, tree: Mapping[str, Any]) -> None:
        self.root_id: str = tree["id"]
        self.tasks: dict[str, dict[str, Any]] = {}
        stack = [tree]
        while stack:  # iterative: a tree may be as deep as it is large
            node = stack.pop()
            self.tasks[node["id"]] = {"name": node["name"], "status": node["status"],
                                      "progress": node.get("progress") or 0.0,
                                      "dependencies": node.get("dependencies") or [], "error": node.get("error"),
                                      "waiting": node.get("waiting")}
            stack.extend(reversed(node.get("children") or []))
        self.unseen = set(self.tasks)

    def apply(self, message: Mapping[str, Any]) -> str | None:
        """Take one /ws message in; the id of the task it changed, if any."""
        task_id = message.get("task_id")
        task = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            return None
        self.unseen.discard(task_id)
        data = message.get("data") or {}
        if message.get("type") == "error" or "status" not in data:
            return None
        task["status"] = data["status"]
        if "waiting" in data:  # it parked (its wait) or resumed (null)
            task["waiting"] = data["waiting"]
        elif task["status"] != TaskStatus.IN_PROGRESS:
            task["waiting"] = None
        if isinstance(data.get("progress"), (int, float)):
            task["progress"] = float(data["progress"])
        if task["status"] == TaskStatus.COMPLETED:
            task["progress"] = 1.0
        if data.get("error"):
            task["error"] = data["error"]
        return task_id

    def settled(self) -> bool:
        if self.unseen:
            return False
        if any(t["status"] == TaskStatus.IN_PROGRESS for t in self.tasks.values()):
            return False
        if self.tasks[self.root_id]["status"] == TaskStatus.CANCELLED:
            return True
        return not any(self._runnable(t) for t in self.tasks.values())

    def _runnable(self, task: Mapping[str, Any]) -> bool:
        if task["status"] != TaskStatus.PENDING:
            return False
        for dep in task["dependencies"]:
            target = self.tasks.get(dep.get("id"))
            if target is None:
                continue  # outside this tree: the service decides
            wanted = (TaskStatus.COMPLETED,) if dep.get("required", True) else TERMINAL
            if target["status"] not in wanted:
                return False
        return True

    def succeeded(self) -> bool:
        return all(t["status"] == TaskStatus.COMPLETED for t in self.tasks.values())

    def summary(self) -> dict[str, Any]:
        return {"root_task_id": self.root_id, "status": TaskStatus.COMPLETED.value if self.succeeded()
                else TaskStatus.FAILED.value,
                "statuses": {tid: t["status"] for tid, t in self.tasks.items()}}


async def follow(remote: Remote, task_id: str, *, as_json: bool, timeout: float | None) -> int:
    """Follow the tree of `task_id` until it settles; 0 when every task completed, else 1."""
    tree = await remote.call("tasks.tree", {"task_id": task_id})
    state = TreeState(tree)
    try:
        if as_json:
            await asyncio.wait_for(_follow_json(remote, state), timeout)
        else:
            await asyncio.wait_for(_follow_bars(remote, state), timeout)
    except asyncio.TimeoutError:
        raise RemoteError(f"the tree {state.root_id} had not settled after {timeout:g} s", 1) from None
    if not state.settled():
        raise RemoteError(f"the service closed the connection before the tree {state.root_id} settled", 2)
    summary = state.summary()
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        from rich.console import Console

        console = Console()
        for task in state.tasks.values():
            if task["status"] != TaskStatus.COMPLETED and task["error"]:
                console.print(f"[red]{task['name']}:[/red] {task['error']}", markup=True, highlight=False)
        colour = "green" if summary["status"] == TaskStatus.COMPLETED else "red"
        console.print(f"tree {state.root_id}: [{colour}]{summary['status']}[/]")
    return 0 if summary["status"] == TaskStatus.COMPLETED else 1


async def _follow_json(remote: Remote, state: TreeState) -> None:
    async for message in remote.events(list(state.tasks)):
        if state.apply(message) is not None:
            print(json.dumps(message), flush=True)
        if state.settled():
            return


async def _follow_bars(remote: Remote, state: TreeState) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    console = Console(file=sys.stdout)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, refresh_per_second=10) as progress:
        bars = {tid: progress.add_task(_label(t["name"]), total=1.0, completed=t["progress"],
                                       status=_status(t["status"], t["waiting"])) for tid, t in state.tasks.items()}
        announced: set[tuple[str, str]] = set()
        for tid in state.tasks:
            _announce_wait(progress.console, state, tid, announced)
        async for message in remote.events(list(state.tasks)):
            changed = state.apply(message)
            if changed is not None:
                task = state.tasks[changed]
                progress.update(bars[changed], completed=task["progress"], status=_status(task["status"], task["waiting"]))
                _announce_wait(progress.console, state, changed, announced)
            if state.settled():
                return


def _announce_wait(console: Any, state: TreeState, task_id: str, announced: set[tuple[str, str]]) -> None:
    """One line above the bars when a task starts waiting: its prompt and how to answer it."""
    from taskgrove.agent.remote.show import waiting_line

    task = state.tasks[task_id]
    wait = task["waiting"]
    if not isinstance(wait, Mapping) or (task_id, str(wait.get("since"))) in announced:
        return
    announced.add((task_id, str(wait.get("since"))))
    console.print(f"{_label(task['name'])} {waiting_line(task_id, wait)}", highlight=False)


def _label(name: str) -> str:
    from rich.markup import escape

    return escape(name if len(name) <= 40 else name[:39] + "…")


def _status(status: str, waiting: Any = None) -> str:
    kind = f" (waits for {waiting.get('kind')})" if isinstance(waiting, Mapping) else ""
    return f"[{COLOURS.get(status, 'white')}]{status}{kind}[/]"
