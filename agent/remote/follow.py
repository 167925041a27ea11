"""Following a tree live until it settles: `taskgrove tasks watch` and `taskgrove run --url`.

The watching itself is the client's (`AsyncClient.watch`, client/watch.py): when a tree counts as
settled, reconnecting after a dropped connection, reading the tree again so the end is never
missed. Here: how it is shown, as progress bars and one line per wait for people, or as the /ws
messages and a last summary line for scripts (--json).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from taskgrove.agent.remote.connection import RemoteError

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.client import AsyncClient, TreeWatch, WatchedTask

COLOURS = {"completed": "green", "failed": "red", "cancelled": "yellow", "in_progress": "cyan", "pending": "white"}


async def follow(client: AsyncClient, task_id: str, *, as_json: bool, timeout: float | None) -> int:
    """Follow the tree of `task_id` until it settles; 0 when every task completed, else 1."""
    tree = await client.tree(task_id)
    watch = client.watch(tree)
    outcome: dict[str, Any] = {}
    try:
        async with watch:
            await asyncio.wait_for((_follow_json if as_json else _follow_bars)(watch, outcome), timeout)
    except asyncio.TimeoutError:
        raise RemoteError(f"the tree {tree.id} had not settled after {timeout:g} s", 1) from None
    if not outcome:
        raise RemoteError(f"the service closed the connection before the tree {tree.id} settled", 2)
    if as_json:
        print(json.dumps(outcome), flush=True)
    else:
        from rich.console import Console

        console = Console()
        for task in watch.tasks.values():
            if task.status != "completed" and task.error:
                console.print(f"[red]{_label(task.name)}:[/red] {_escape(task.error)}", markup=True, highlight=False)
        colour = "green" if outcome["status"] == "completed" else "red"
        console.print(f"tree {tree.id}: [{colour}]{outcome['status']}[/]")
    return 0 if outcome["status"] == "completed" else 1


async def _follow_json(watch: TreeWatch[Any], outcome: dict[str, Any]) -> None:
    async for event in watch:
        if event.is_final:
            outcome.update(root_task_id=event.task_id, status=event.data.status.value,
                           statuses={tid: str(status) for tid, status in (event.data.statuses or {}).items()})
            return
        print(json.dumps(event.dump()), flush=True)


async def _follow_bars(watch: TreeWatch[Any], outcome: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    console = Console(file=sys.stdout)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, refresh_per_second=10) as progress:
        bars: dict[str, Any] = {}
        announced: set[tuple[str, str]] = set()
        async for event in watch:
            for tid, task in watch.tasks.items():  # the first event: every task's bar at once
                if tid not in bars:
                    bars[tid] = progress.add_task(_label(task.name), total=1.0, status=_status(task),
                                                  completed=task.progress)  # type: ignore[arg-type]  # a float bar
                    _announce_wait(progress.console, task, announced)
            if event.is_final:
                outcome.update(root_task_id=event.task_id, status=event.data.status.value)
                return
            task = watch.tasks[event.task_id]
            progress.update(bars[event.task_id], completed=task.progress, status=_status(task))
            _announce_wait(progress.console, task, announced)


def _announce_wait(console: Any, task: WatchedTask, announced: set[tuple[str, str]]) -> None:
    """One line above the bars when a task starts waiting: its prompt and how to answer it."""
    from taskgrove.agent.remote.show import waiting_line

    wait = task.waiting
    if wait is None or (task.id, str(wait.since)) in announced:
        return
    announced.add((task.id, str(wait.since)))
    console.print(f"{_label(task.name)} {waiting_line(task.id, wait.dump())}", highlight=False)


def _label(name: str) -> str:
    return _escape(name if len(name) <= 40 else name[:39] + "…")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _status(task: WatchedTask) -> str:
    kind = f" (waits for {task.waiting.kind})" if task.waiting is not None else ""
    return f"[{COLOURS.get(task.status.value, 'white')}]{task.status.value}{kind}[/]"
